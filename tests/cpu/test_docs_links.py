"""Every path the README and the documents name exists, so moving a document or deleting a script
cannot leave a dead link behind.

The rule, applied to ``README.md`` and every ``docs/**/*.md``:

1. A Markdown link target (``[text](target)``, images too) that is not a URL or an anchor is a
   path relative to the document's folder and must exist.
2. A repository path written in the text (``docs/...``, ``scripts/...``, ``tests/...`` or a
   package folder, in backticks or not) must exist, unless the document says where it went:
   it holds ``<commit>:<path>`` (the ``git show`` form) or ``<path> at <commit>``. Placeholders
   (``NAME``, ``probeN.md``) stand for any name and must match at least one file.
3. Paths after a ``<commit>:`` are history and are not checked.

Code names documents too: every ``docs/...`` path in a tracked ``.py`` file must exist.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_TOP = r"(?:docs|scripts|tests|tiledattention|tuner|db|search_spaces)"
#: a repository path, not preceded by a word, a path or a ``<commit>:``
_PATH = re.compile(rf"(?<![\w/.:$-])({_TOP}/[\w./-]*[\w/])")
_DOCS_PATH = re.compile(r"(?<![\w/.:$-])(docs/[\w./-]*[\w/])")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_COMMIT = r"[0-9a-f]{7,40}"
#: ``NAME`` or a trailing ``N`` (``probeN.md``) in a path: any name
_PLACEHOLDER = re.compile(r"NAME|(?<=[a-z])N(?=[._/])")


def _exists(path: str, root: Path) -> bool:
    if _PLACEHOLDER.search(path):
        return any(root.glob(_PLACEHOLDER.sub("*", path).rstrip("/")))
    return (root / path).exists()


def _accounted_for(path: str, text: str) -> bool:
    """The document names the commit that holds ``path`` (rule 2)."""
    escaped = re.escape(path)
    return bool(re.search(rf"{_COMMIT}:{escaped}(?![\w/])", text)
                or re.search(rf"{escaped}`?\s+at\s+(?:commit\s+)?{_COMMIT}\b", text))


def dead_links(text: str, document: Path, root: Path = ROOT) -> list[str]:
    """One line per path of ``text`` (the document at ``document``) that rules 1-2 refuse."""
    dead = []
    for target in _LINK.findall(text):
        target = target.split("#", 1)[0]
        if not target or re.match(r"[a-z]+:", target):
            continue
        if not (document.parent / target).exists():
            dead.append(f"link {target}")
    for path in dict.fromkeys(_PATH.findall(text)):
        path = path.rstrip(".")
        if not _exists(path, root) and not _accounted_for(path, text):
            dead.append(f"path {path}")
    return dead


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_document_names_exists(document: Path):
    dead = dead_links(document.read_text(encoding="utf-8"), document)
    assert not dead, f"{document.relative_to(ROOT)} names what is not there: {dead}"


#: another project's documents that a docstring cites (huggingface/kernels, tuner/hub/_build.py)
FOREIGN = {"docs/source/kernel-requirements.md"}


def prose(source: str) -> str:
    """The docstrings and comments of a Python source: where code cites documents (a test's
    string literals may name made-up ones)."""
    tree = ast.parse(source)
    texts = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(tree)
             if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    texts += [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT]
    return "\n".join(texts)


def test_every_docs_path_in_the_code_exists():
    sources = [p for top in ("tiledattention", "tuner", "db", "search_spaces", "scripts", "tests")
               for p in (ROOT / top).rglob("*.py")]
    dead = [f"{p.relative_to(ROOT)}: {ref}" for p in sources
            for ref in dict.fromkeys(_DOCS_PATH.findall(prose(p.read_text(encoding="utf-8"))))
            if ref not in FOREIGN and not _exists(ref.rstrip("."), ROOT)]
    assert not dead, "code names documents that are not there:\n" + "\n".join(dead)


def test_prose_is_docstrings_and_comments():
    source = '"""See docs/a.md."""\nX = "docs/b.md"  # docs/c.md\ndef f():\n    """docs/d.md"""\n'
    assert _DOCS_PATH.findall(prose(source)) == ["docs/a.md", "docs/d.md", "docs/c.md"]


def test_a_planted_dead_path_or_link_is_found(tmp_path):
    (tmp_path / "docs" / "records").mkdir(parents=True)
    (tmp_path / "docs" / "records" / "probe1.md").write_text("x")
    (tmp_path / "scripts").mkdir()
    doc = tmp_path / "docs" / "guide.md"
    fine = ("See `docs/records/probe1.md`, [it](records/probe1.md), `docs/records/probeN.md`,\n"
            "`scripts/old.py` (removed; `git show 1234abc:scripts/old.py`), `scripts/older.py`\n"
            "at 89abcde, and `git show c518f0c:docs/benchmarks/summary.md`.\n")
    assert dead_links(fine, doc, tmp_path) == []
    assert dead_links("Moved: `docs/probes/probe1.md`.", doc, tmp_path) == ["path docs/probes/probe1.md"]
    assert dead_links("![plot](probes/a.png)", doc, tmp_path) == ["link probes/a.png"]
    assert dead_links("`scripts/gone.py`", doc, tmp_path) == ["path scripts/gone.py"]
    assert dead_links("`docs/records/candidateN.json`", doc, tmp_path) == \
        ["path docs/records/candidateN.json"]


def test_the_architecture_diagram_is_current():
    """docs/architecture.md's diagram is what scripts/architecture_diagram.py makes of today's
    code (a new family or tuner package shows up on the page)."""
    spec = importlib.util.spec_from_file_location("architecture_diagram",
                                                  ROOT / "scripts" / "architecture_diagram.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert module.rewritten(page) == page, "run: python scripts/architecture_diagram.py"
    assert "forward[" in module.diagram() and "kernel_core" in page


def _local_imports(path: Path) -> list[str]:
    """The modules a script or probe imports at its top level that no installed package
    provides (its own folder's, or ``scripts/``'s, which probes put on their path)."""
    names = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return [n for n in names if not (ROOT / n).is_dir() and importlib.util.find_spec(n) is None]


@pytest.mark.parametrize("folder", ["scripts", "docs/records/probes"])
def test_every_module_a_probe_or_script_imports_is_in_the_tree(folder):
    """A probe or script runs as its record's command says: the modules it imports from
    ``scripts/`` or the probes' folder are there, unless its docstring says how to restore one
    that left the tree to keep it small (``git show REV:.../NAME.py``). A probe whose helper
    left without that note fails here (``compile_ahead.py`` did, 2026-12-04, and with it five
    probes)."""
    missing = []
    for path in sorted((ROOT / folder).glob("*.py")):
        text = path.read_text(encoding="utf-8")
        for name in _local_imports(path):
            restored = re.search(rf"git show \w+\^?:[\w/]+/{name}\.py", text)
            if not restored and not any((ROOT / place / f"{name}.py").is_file()
                                        for place in ("scripts", "docs/records/probes")):
                missing.append(f"{path.relative_to(ROOT)} imports {name}")
    assert missing == []
