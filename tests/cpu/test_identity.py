"""Template identity: comments, docstrings and formatting do not count; code, names and order do."""

from __future__ import annotations

import ast
import importlib
import io
import re
import textwrap
import tokenize
from pathlib import Path

import pytest

from tiledattention.core._identity import module_identity, source_identity

# Read by path rather than through find_spec, which would import the package to find the module.
KERNEL_PATH = Path(__file__).parents[2] / "tiledattention/kernels/forward/_kernel.py"
KERNEL_MODULE = "tiledattention.kernels.forward._kernel"


@pytest.fixture(scope="module")
def kernel() -> str:
    return KERNEL_PATH.read_text(encoding="utf-8")


def identity(text: str, name: str = KERNEL_MODULE) -> str:
    return source_identity([(name, text)])


# -- text edits by token position, so they hold however the kernel file changes --------------------
def _tokens(text: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(text).readline))


def _insert(text: str, edits: list[tuple[tuple[int, int], str]]) -> str:
    """``text`` with each ``((row, col), string)`` inserted; rows count from 1, as tokenize's."""
    starts = [0]
    for line in io.StringIO(text).readlines():
        starts.append(starts[-1] + len(line))
    for (row, col), string in sorted(edits, reverse=True):
        offset = starts[row - 1] + col
        text = text[:offset] + string + text[offset:]
    return text


def _replace_token(text: str, token: tokenize.TokenInfo, new: str) -> str:
    (row, col), (end_row, end_col) = token.start, token.end
    assert row == end_row
    lines = io.StringIO(text).readlines()
    lines[row - 1] = lines[row - 1][:col] + new + lines[row - 1][end_col:]
    return "".join(lines)


def add_comments(text: str) -> str:
    """A trailing comment on every logical line and a comment line before each of them."""
    edits = []
    for tok in _tokens(text):
        if tok.type == tokenize.NEWLINE:
            edits.append((tok.start, "  # a trailing comment, 'quoted' and \"double-quoted\""))
            edits.append((tok.end, "# a comment line\n"))
    return "# a comment before everything\n" + _insert(text, edits)


def add_blank_lines(text: str) -> str:
    """An empty line after every logical line (inside function bodies too)."""
    return _insert(text, [(tok.end, "\n") for tok in _tokens(text) if tok.type == tokenize.NEWLINE])


def rewrap_arguments(text: str) -> str:
    """Break the line after every comma inside brackets: each call's arguments, one per line."""
    edits, depth, fstring = [], 0, 0
    for tok in _tokens(text):
        name = tokenize.tok_name[tok.type]
        fstring += {"FSTRING_START": 1, "FSTRING_END": -1}.get(name, 0)  # Python >= 3.12
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.OP and tok.string == "," and depth and not fstring:
            edits.append((tok.end, "\n" + " " * 16))
    return _insert(text, edits)


def _docstring_nodes(text: str) -> list[tuple[ast.AST, ast.Expr]]:
    """(owner, docstring statement) for every docstring in ``text``."""
    nodes = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if ast.get_docstring(node, clean=False) is not None:
                nodes.append((node, node.body[0]))
    return nodes


def _replace_spans(text: str, spans: list[tuple[ast.AST, str]]) -> str:
    lines = io.StringIO(text).readlines()
    for node, new in sorted(spans, key=lambda s: (s[0].lineno, s[0].col_offset), reverse=True):
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
        lines[node.lineno - 1:node.end_lineno] = [
            first[:node.col_offset] + new + last[node.end_col_offset:]]
    return "".join(lines)


def change_docstrings(text: str) -> str:
    spans = [(doc, '"""Quite another docstring,\n    over two lines."""')
             for _, doc in _docstring_nodes(text)]
    return _replace_spans(text, spans)


def remove_docstrings(text: str) -> str:
    """Docstrings removed where something else is left in the body (an empty body won't parse)."""
    spans = [(doc, "") for owner, doc in _docstring_nodes(text) if len(owner.body) > 1]
    return _replace_spans(text, spans)


# -- (1) what does not count -----------------------------------------------------------------------
NO_CHANGE = {
    "comments": add_comments,
    "blank-lines": add_blank_lines,
    "rewrapped-arguments": rewrap_arguments,
    "changed-docstrings": change_docstrings,
    "removed-docstrings": remove_docstrings,
    "unparsed": lambda text: ast.unparse(ast.parse(text)),  # every line reformatted, no comments
    "all-at-once": lambda text: rewrap_arguments(add_blank_lines(add_comments(
        change_docstrings(text)))),
}


@pytest.mark.parametrize("edit", NO_CHANGE.values(), ids=NO_CHANGE.keys())
def test_kernel_identity_ignores_comments_formatting_and_docstrings(kernel, edit):
    edited = edit(kernel)
    assert edited != kernel  # the edit did something ...
    ast.parse(edited)  # ... and left valid Python
    assert identity(edited) == identity(kernel)


def test_the_edits_reach_the_kernel(kernel):
    """The kernel has what the edits above change, so the test above is not vacuous."""
    owners = [owner for owner, _ in _docstring_nodes(kernel)]
    assert any(isinstance(owner, ast.Module) for owner in owners)
    assert any(isinstance(owner, ast.FunctionDef) for owner in owners)
    assert remove_docstrings(kernel).count('"""') < kernel.count('"""')
    assert rewrap_arguments(kernel).count("\n") > kernel.count("\n") + 20


def test_docstrings_of_classes_and_async_functions_do_not_count():
    plain = "class A:\n    x = 1\nasync def f():\n    return 1\n"
    documented = ('"""Module."""\nclass A:\n    """Class."""\n    x = 1\n'
                  'async def f():\n    """Coroutine."""\n    return 1\n')
    assert identity(documented) == identity(plain)


# -- (2) what counts -------------------------------------------------------------------------------
KERNEL_LIKE = textwrap.dedent('''\
    """A small kernel in the shape of the real one."""
    import cuda.tile as ct

    ConstInt = ct.Constant[int]


    @ct.kernel
    def scale(X, Y, TILE: ConstInt, factor: float = 0.5):
        """Y = X * factor, one tile per block."""
        bid = ct.bid(0)
        x = ct.load(X, index=(bid,), shape=(TILE,), padding_mode="zero")
        ct.store(Y, index=(bid,), tile=x * factor + 1)
    ''')

def swap(old: str, new: str):
    def edit(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new)
    return edit


CODE_CHANGES = {
    "constant": swap("factor: float = 0.5", "factor: float = 0.25"),
    "int-to-float": swap("+ 1)", "+ 1.0)"),
    "int-to-bool": swap("+ 1)", "+ True)"),
    "string-constant": swap('padding_mode="zero"', 'padding_mode="nan"'),
    "operator": swap("x * factor", "x / factor"),
    "local-name": lambda text: re.sub(r"\bbid\b(?!\()", "blk", text),  # every use, not ct.bid
    "attribute": swap("ct.bid(0)", "ct.block_id(0)"),
    "keyword": swap("padding_mode=", "padding="),
    "annotation-changed": swap("TILE: ConstInt", "TILE: int"),
    "annotation-removed": swap("factor: float", "factor"),
    "decorator": swap("@ct.kernel\n", ""),
    "import": swap("import cuda.tile as ct", "import cuda.tile as ct, math"),
    "string-statement-after-the-first": swap("    bid = ct.bid(0)\n",
                                             "    bid = ct.bid(0)\n    'x'\n"),
}


@pytest.mark.parametrize("edit", CODE_CHANGES.values(), ids=CODE_CHANGES.keys())
def test_code_changes_change_the_identity(edit):
    edited = edit(KERNEL_LIKE)
    assert edited != KERNEL_LIKE
    assert identity(edited) != identity(KERNEL_LIKE)


def test_code_changes_in_the_real_kernel_change_the_identity(kernel):
    tokens = _tokens(kernel)
    number = next(tok for tok in tokens if tok.type == tokenize.NUMBER)
    plus = next(tok for tok in tokens if tok.type == tokenize.OP and tok.string == "+")
    def_name = next(b for a, b in zip(tokens, tokens[1:]) if a.string == "def")
    changed = {
        "number": _replace_token(kernel, number, repr(ast.literal_eval(number.string) + 1)),
        "operator": _replace_token(kernel, plus, "-"),
        "function-name": _replace_token(kernel, def_name, def_name.string + "_renamed"),
    }
    for what, text in changed.items():
        assert identity(text) != identity(kernel), what


# -- (3) names and order ---------------------------------------------------------------------------
def test_names_and_order_count():
    a, b = "x = 1\n", "y = 2\n"
    base = source_identity([("m.a", a), ("m.b", b)])
    assert source_identity([("m.b", b), ("m.a", a)]) != base  # order
    assert source_identity([("m.a", b), ("m.b", a)]) != base  # which text under which name
    assert source_identity([("m.c", a), ("m.b", b)]) != base  # a name
    assert source_identity([("m.a", a)]) != base  # a module fewer
    assert source_identity([("m.a", a), ("m.b", b)]) == base
    assert source_identity(iter([("m.a", a), ("m.b", b)])) == base  # any iterable, once
    # The parts are length-prefixed: a name cannot run into the next part.
    assert source_identity([("ab", "x = 1\n")]) != source_identity([("a", "x = 1\n")])


def test_identity_is_twelve_hex_digits_and_pinned():
    """Pinned, so a change of the serialisation (or of Python's parser: the value is the same on
    3.10 to 3.13) shows here before it demotes every stored row."""
    text = ('def f(T: "Constant[int]" = 3, *, s="é\\u2028"):\n'
            '    """doc"""\n    return f"{T:>{s}} {s!r}" + "a" "b"\n')
    value = identity(text, name="pinned")
    assert re.fullmatch(r"[0-9a-f]{12}", value)
    assert value == "5780b4e30a5e"


def test_syntax_errors_name_the_source():
    with pytest.raises(SyntaxError) as info:
        source_identity([("ok", "x = 1\n"), ("broken.module", "def f(:\n")])
    assert info.value.filename == "broken.module"


# -- (4) module_identity ---------------------------------------------------------------------------
@pytest.fixture
def probe_modules(tmp_path, monkeypatch):
    """Two throw-away modules on sys.path; module_identity's cache forgotten before and after."""
    (tmp_path / "_identity_probe_a.py").write_text('"""A."""\nA = 1\n', encoding="utf-8")
    (tmp_path / "_identity_probe_b.py").write_text("B = 2  # two\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    module_identity.cache_clear()
    yield tmp_path
    module_identity.cache_clear()


def test_module_identity_is_source_identity_of_the_file(probe_modules):
    a = (probe_modules / "_identity_probe_a.py").read_text(encoding="utf-8")
    b = (probe_modules / "_identity_probe_b.py").read_text(encoding="utf-8")
    assert module_identity("_identity_probe_a") == source_identity([("_identity_probe_a", a)])
    assert (module_identity("_identity_probe_a", "_identity_probe_b")
            == source_identity([("_identity_probe_a", a), ("_identity_probe_b", b)]))
    assert (module_identity("_identity_probe_b", "_identity_probe_a")
            != module_identity("_identity_probe_a", "_identity_probe_b"))


def test_module_identity_of_the_real_kernel(kernel):
    assert module_identity(KERNEL_MODULE) == identity(kernel)


def test_module_identity_is_cached_per_tuple_of_names(probe_modules):
    first = module_identity("_identity_probe_a")
    (probe_modules / "_identity_probe_a.py").write_text("A = 3\n", encoding="utf-8")
    assert module_identity("_identity_probe_a") == first  # cached: the file is not read again
    assert module_identity.cache_info().hits == 1
    module_identity.cache_clear()
    assert module_identity("_identity_probe_a") != first


def test_module_identity_does_not_import_the_module(probe_modules):
    (probe_modules / "_identity_probe_c.py").write_text("raise RuntimeError('imported')\n",
                                                       encoding="utf-8")
    importlib.invalidate_caches()
    assert re.fullmatch(r"[0-9a-f]{12}", module_identity("_identity_probe_c"))


@pytest.mark.parametrize("name, error", [("_identity_probe_missing", ModuleNotFoundError),
                                         ("sys", ValueError)], ids=["missing", "no-source"])
def test_module_identity_errors(probe_modules, name, error):
    with pytest.raises(error, match=name):
        module_identity(name)
