"""The shape of the code base: imports run one way (tuner -> search_spaces -> tiledattention ->
db) and cross package borders by public names only; the shipped table matches the kernel
template it claims; the template identity ignores comments."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import tiledattention
from tiledattention import FORWARD, shipped_table

ROOT = Path(__file__).resolve().parents[2]
#: a package may import packages of a lower rank, never of a higher one
RANK = {"db": 0, "tiledattention": 1, "search_spaces": 2, "tuner": 3}
#: third-party packages that belong to the tuner's layer only
TUNER_ONLY = {"optuna", "rich"}


def _imports(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module, imported names) of every import in ``path``."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + "._"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:-node.level]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.append((node.lineno, module, tuple(a.name for a in node.names)))
    return found


def _violations() -> list[str]:
    bad = []
    for top in RANK:
        for path in sorted((ROOT / top).rglob("*.py")):
            where = f"{path.relative_to(ROOT)}"
            for line, module, names in _imports(path):
                target = module.split(".")[0]
                if target in TUNER_ONLY and top != "tuner":
                    bad.append(f"{where}:{line}: {top} imports {target} (tuner only)")
                if target not in RANK or target == top:
                    continue
                if RANK[target] > RANK[top]:
                    bad.append(f"{where}:{line}: upward import of {module} from {top}")
                private = [p for p in module.split(".")[1:] if p.startswith("_")]
                private += [n for n in names if n.startswith("_")]
                if private:
                    bad.append(f"{where}:{line}: private {private} of {target} used by {top}")
    return bad


def test_imports_run_one_way_and_cross_borders_by_public_names():
    assert _violations() == []


def test_the_checker_catches_upward_and_private_imports(tmp_path, monkeypatch):
    fake = tmp_path / "db"
    fake.mkdir()
    (fake / "x.py").write_text("import tuner\nfrom tiledattention._lookup import pick\n"
                               "from tiledattention import _family\nimport optuna\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for top in ("tiledattention", "search_spaces", "tuner"):
        (tmp_path / top).mkdir()
    found = _violations()
    # tuner: upward; tiledattention._lookup and tiledattention._family: upward and private
    # each; optuna: the tuner's
    assert len(found) == 6, found


def test_shipped_table_rows_match_the_current_kernel_template():
    """A kernel change must re-stamp (`tiledtune restamp --from REV --file ...`) or re-tune the
    shipped rows; otherwise the lookup would silently ignore them."""
    table = shipped_table("sm_90")
    rows = list(table)
    counts = {name: sum(r.family == name for r in rows) for name in ("forward", "decode")}
    assert counts == {"forward": 61, "decode": 90}
    stale = [r.describe_key() for r in rows
             if r.provenance.template_hash != tiledattention.get_family(r.family)
             .template_identity()]
    assert stale == []


def test_a_comment_in_the_kernel_file_changes_no_template_identity(tmp_path, monkeypatch):
    import importlib.util

    from tiledattention._identity import module_identity, source_identity

    names = FORWARD.template_modules
    texts = [Path(importlib.util.find_spec(n).origin).read_text() for n in names]
    before = source_identity(zip(names, texts))
    assert before == FORWARD.template_identity() == module_identity(*names)
    commented = [texts[0].replace("\n", "\n# a comment\n", 5) + "\n# end\n", texts[1]]
    assert source_identity(zip(names, commented)) == before
    changed = [texts[0].replace("NEG_BIG = -1.0e30", "NEG_BIG = -1.0e29"), texts[1]]
    assert changed[0] != texts[0]
    assert source_identity(zip(names, changed)) != before


@pytest.mark.parametrize("name", ["tiledattention", "search_spaces", "db"])
def test_runtime_packages_do_not_pull_in_the_tuner(name):
    import subprocess

    code = (f"import sys, {name}; "
            "print(sorted(m for m in ('optuna', 'rich', 'tuner') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == "[]"


_BUILTIN_ERRORS = {"ValueError", "TypeError", "RuntimeError", "KeyError", "OSError",
                   "Exception", "AssertionError", "NotImplementedError"}


def test_runtime_raises_only_the_package_errors():
    """Every error tiledattention and search_spaces raise on purpose is a TiledAttentionError
    (and a TypeError / ValueError where it is about an argument), so one except catches ours."""
    bad = []
    for top in ("tiledattention", "search_spaces"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                        and isinstance(node.exc.func, ast.Name) \
                        and node.exc.func.id in _BUILTIN_ERRORS:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.exc.func.id}")
    assert bad == []
    import tiledattention.errors as errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.TiledAttentionError)


def test_shipped_schedules_are_normalised():
    """Stored schedules carry no flag that cannot change their kernel (the tuner stores them
    normalised; the shipped table was normalised when it was re-stamped)."""
    for row in shipped_table("sm_90"):
        family = tiledattention.get_family(row.family)
        assert family.normalise(row.problem, row.schedule) == row.schedule, row.describe_key()
