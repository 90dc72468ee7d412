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
    (fake / "x.py").write_text("import tuner\nfrom tiledattention.core._lookup import pick\n"
                               "from tiledattention.core import _family\nimport optuna\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for top in ("tiledattention", "search_spaces", "tuner"):
        (tmp_path / top).mkdir()
    found = _violations()
    # tuner: upward; tiledattention.core._lookup and tiledattention.core._family: upward and private
    # each; optuna: the tuner's
    assert len(found) == 6, found


def test_shipped_table_rows_match_the_current_kernel_template():
    """A kernel change must re-stamp (`tiledtune restamp --from REV --file ...`) or re-tune the
    shipped rows; otherwise the lookup would silently ignore them."""
    table = shipped_table("sm_90")
    rows = list(table)
    counts = {name: sum(r.family == name for r in rows)
              for name in ("forward", "decode", "backward")}
    assert counts == {"forward": 78, "decode": 70, "backward": 29}
    stale = [r.describe_key() for r in rows
             if r.provenance.template_hash != tiledattention.get_family(r.family)
             .template_identity()]
    assert stale == []


def test_a_comment_in_the_kernel_file_changes_no_template_identity(tmp_path, monkeypatch):
    import importlib.util

    from tiledattention.core._identity import module_identity, source_identity

    names = FORWARD.template_modules
    texts = [Path(importlib.util.find_spec(n).origin).read_text() for n in names]
    before = source_identity(zip(names, texts))
    assert before == FORWARD.template_identity() == module_identity(*names)
    commented = [texts[0].replace("\n", "\n# a comment\n", 5) + "\n# end\n", *texts[1:]]
    assert source_identity(zip(names, commented)) == before
    changed = [texts[0].replace("(q_tile % 2) == 1", "(q_tile % 2) == 0"), *texts[1:]]
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


#: what code raises when it has no class of its own (an import hook's ModuleNotFoundError,
#: which the import protocol asks for, is not among them)
_BUILTIN_ERRORS = {"ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError",
                   "LookupError", "OSError", "Exception", "AssertionError",
                   "NotImplementedError"}
#: the modules that define the hierarchy (and so name builtin errors as second bases)
_HIERARCHY = {"db/_errors.py", "tiledattention/errors.py", "tuner/errors.py"}
#: not checked: shipped Alembic revisions are frozen history (0003's downgrade raises
#: NotImplementedError, as Alembic's own irreversible revisions do)
_EXEMPT = ("db/migrations/versions/",)


def _error_rule_violations(tops=("tiledattention", "search_spaces", "tuner", "db")) -> list[str]:
    """``file:line: what`` for each raise of a builtin error class by name, and each exception
    class outside the hierarchy modules that derives from a builtin error directly."""
    bad = []
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where.startswith(_EXEMPT):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    named = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                    if isinstance(named, ast.Name) and named.id in _BUILTIN_ERRORS:
                        bad.append(f"{where}:{node.lineno}: raise {named.id}")
                elif isinstance(node, ast.ClassDef) and where not in _HIERARCHY \
                        and top in ("tuner", "db"):
                    builtin = [b.id for b in node.bases
                               if isinstance(b, ast.Name) and b.id in _BUILTIN_ERRORS]
                    if builtin:
                        bad.append(f"{where}:{node.lineno}: class {node.name}({builtin[0]})")
    return bad


def test_the_packages_raise_only_the_package_errors():
    """Every error tiledattention, search_spaces, tuner and db raise on purpose is a
    TiledAttentionError (and a TypeError / ValueError where it is about an argument), so one
    except catches ours; exception classes live in the hierarchy modules."""
    assert _error_rule_violations() == []


def test_one_hierarchy_spans_db_runtime_and_tuner():
    import db
    import tiledattention.errors as errors
    import tuner.errors as tuner_errors

    # db is the bottom layer, so the root is defined there; tiledattention is its public home
    assert errors.TiledAttentionError is db.TiledAttentionError
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.TiledAttentionError)
    for name in db.__all__:
        value = getattr(db, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, errors.TiledAttentionError), name
    for name in tuner_errors.__all__:
        value = getattr(tuner_errors, name)
        if name == "USER_ERRORS":
            assert all(issubclass(c, errors.TiledAttentionError) for c in value)
        else:
            assert issubclass(value, tuner_errors.TunerError), name


def test_the_error_rule_catches_a_builtin_raise_and_an_ad_hoc_class(tmp_path, monkeypatch):
    (tmp_path / "tuner" / "search").mkdir(parents=True)
    (tmp_path / "tuner" / "search" / "_x.py").write_text(
        "class Odd(RuntimeError):\n    pass\n\n\ndef f():\n    raise ValueError('x')\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _error_rule_violations(("tuner",)) == [
        "tuner/search/_x.py:1: class Odd(RuntimeError)",
        "tuner/search/_x.py:6: raise ValueError"]


def test_shipped_schedules_are_normalised():
    """Stored schedules carry no flag that cannot change their kernel (the tuner stores them
    normalised; the shipped table was normalised when it was re-stamped)."""
    for row in shipped_table("sm_90"):
        family = tiledattention.get_family(row.family)
        assert family.normalise(row.problem, row.schedule) == row.schedule, row.describe_key()


#: tiledattention's own layers, one folder each: ``core/`` (the attention problem, the family
#: interface and registry, compiling, the lookup, the runtime's memory) with ``kernel_core/``
#: (what every family's kernels share), ``kernels/<family>/`` (the kernel families),
#: ``entry_points/`` (the calls served through the registry), the package facade
#: (``tiledattention/__init__.py``: the public names, re-exported, with ``errors`` and
#: ``tooling`` beside it) and ``integrations/`` built on the facade. A module imports its own
#: layer or lower ones, so nothing below the integrations imports the facade (``import
#: tiledattention``, ``from tiledattention import sdpa``, ``from .. import runtime``), and a
#: family never imports another family. The families are the registry's (each family's package
#: is the folder its class lives in), so a fourth family is checked without an edit here.
FAMILIES = tuple(sorted({type(f).__module__.split(".")[2] for f in tiledattention.families()
                         if type(f).__module__.startswith("tiledattention.kernels.")}))
LAYER = {"core": 0, "family": 1, "entry": 2, "facade": 3, "integrations": 4}
#: the folder of each layer below the facade
FOLDERS = {"core": "core", "kernel_core": "core", "kernels": "family",
           "entry_points": "entry", "integrations": "integrations"}
#: the modules at the top level beside the facade, which any layer may import: the error
#: hierarchy (errors raised everywhere) and the tools' plumbing
TOP_LEVEL = {"errors": "core", "tooling": "facade"}


def _layer(parts: tuple[str, ...]) -> tuple[str, str]:
    """(layer, family name or "") of the module ``tiledattention.<parts>`` (``()``: the
    package itself, the facade)."""
    if not parts or parts == ("__init__",):
        return "facade", ""
    if parts[0] == "kernels":
        return "family", parts[1] if len(parts) > 1 else ""
    if parts[0] in FOLDERS:
        return FOLDERS[parts[0]], ""
    return TOP_LEVEL.get(parts[0], "facade"), ""


def _targets(root: Path, module: str, names: tuple[str, ...]) -> list[list[str]]:
    """The modules an import of ``names`` from ``module`` (absolute) reaches inside the package,
    as parts after ``tiledattention`` (``[]``: the facade)."""
    parts = module.split(".")[1:]
    if parts[-1:] == ["__init__"]:
        parts = parts[:-1]
    if names and not parts:  # from tiledattention import x: the module x, or a facade name
        package = root / "tiledattention"
        return [[n] if (package / f"{n}.py").exists() or (package / n).is_dir() else []
                for n in names]
    return [parts]


def _layer_violations(root: Path) -> list[str]:
    bad = []
    for path in sorted((root / "tiledattention").rglob("*.py")):
        parts = path.relative_to(root / "tiledattention").with_suffix("").parts
        layer, family = _layer(parts)
        for line, module, names in _imports(path) if root == ROOT else _imports_at(root, path):
            if not module or module.split(".")[0] != "tiledattention":
                continue
            for target in _targets(root, module, names):
                t_layer, t_family = _layer(tuple(target))
                where = f"{path.relative_to(root)}:{line}"
                if LAYER[t_layer] > LAYER[layer]:
                    what = ".".join(target) or "the package facade"
                    bad.append(f"{where}: {layer} imports {t_layer} ({what})")
                if layer == t_layer == "family" and t_family != family:
                    bad.append(f"{where}: family {family} imports family {t_family}")
    return bad


def _imports_at(root: Path, path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    monkey = sys.modules[__name__]
    saved, monkey.ROOT = monkey.ROOT, root
    try:
        return _imports(path)
    finally:
        monkey.ROOT = saved


def test_families_are_peers_over_one_core():
    assert _layer_violations(ROOT) == []


def test_the_layers_know_every_registered_family():
    assert set(FAMILIES) == {"forward", "decode", "backward"}
    for family in tiledattention.families():
        if not type(family).__module__.startswith("tiledattention."):
            continue  # a test's own family (tests/cpu/toy_family.py), registered on import
        parts = type(family).__module__.split(".")
        assert parts[1] == "kernels" and (ROOT / "tiledattention/kernels" / parts[2]).is_dir()


def test_the_top_level_shows_the_layers():
    """The package's top level is its architecture: a folder per layer, the facade and the
    modules beside it; a new module goes into the folder of its layer."""
    top = {p.name for p in (ROOT / "tiledattention").iterdir() if p.name != "__pycache__"}
    assert top == {"__init__.py", "errors.py", "tooling.py", "core", "kernel_core", "kernels",
                   "entry_points", "integrations", "pretuned"}
    assert {p.name for p in (ROOT / "tiledattention/kernels").iterdir()
            if p.is_dir() and p.name != "__pycache__"} == set(FAMILIES)


def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / "tiledattention" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_layer_checker_catches_a_family_importing_a_sibling_or_a_core_importing_up(tmp_path):
    _plant(tmp_path, {
        "core/_plans.py": "",
        "kernels/decode/_x.py": "from ..forward._launch import grid_for\n"
                                 "from ...core._problem import Problem\n"
                                 "import tiledattention.kernels.forward._plan\n",
        "core/_lookup.py": "from ..entry_points._sdpa import sdpa\n"
                           "from ..kernels.decode import DECODE\n",
        "kernel_core/bounds.py": "from ..kernels import forward\n",
        "entry_points/_sdpa.py": "from ..integrations import attention\n",
        "integrations/__init__.py": ""})
    found = _layer_violations(tmp_path)
    # sibling family twice (relative and absolute); core -> entry; core -> family twice;
    # entry -> up
    assert len(found) == 6, found


def test_the_layer_checker_catches_an_import_of_the_package_facade(tmp_path):
    """``import tiledattention`` inside the package reaches the runtime through the facade (an
    arrow pointing up); so do ``from tiledattention import sdpa`` and ``from .. import
    runtime``. A module's own import (``from ..core import _plans``) and the integrations' use
    of the facade are no such arrow."""
    _plant(tmp_path, {
        "core/_plans.py": "",
        "__init__.py": "from .core import _plans\nfrom .entry_points._paged import paged\n",
        "entry_points/_paged.py": "def f():\n    import tiledattention\n\n\n"
                                  "from .. import runtime\nfrom ..core import _plans\n",
        "kernels/decode/_x.py": "from tiledattention import sdpa\nfrom ...core import _plans\n",
        "integrations/_hf.py": "import tiledattention\n"})
    found = sorted(_layer_violations(tmp_path))
    assert found == [
        "tiledattention/entry_points/_paged.py:2: entry imports facade (the package facade)",
        "tiledattention/entry_points/_paged.py:5: entry imports facade (the package facade)",
        "tiledattention/kernels/decode/_x.py:1: family imports facade (the package facade)"], found


_NAMED_FAMILIES = ("FORWARD", "DECODE", "BACKWARD", "ForwardFamily", "DecodeFamily",
                   "BackwardFamily", "Schedule", "DecodeSchedule", "BackwardSchedule")


def _family_names(path: Path) -> list[str]:
    """Where ``path`` names a family: a registered family's constant or schedule type, or an
    import of a family package."""
    tree = ast.parse(path.read_text())
    found = [f"{node.lineno}: {node.id}" for node in ast.walk(tree)
             if isinstance(node, ast.Name) and node.id in _NAMED_FAMILIES]
    found += [f"{node.lineno}: import {node.module}" for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module
              and set(node.module.split(".")) & set(FAMILIES)]
    found += [f"{node.lineno}: imports {alias.name}" for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) for alias in node.names
              if alias.name in _NAMED_FAMILIES]
    return found


@pytest.mark.parametrize("name", ["tiledattention/entry_points/_sdpa.py",
                                  "tiledattention/entry_points/_training.py",
                                  "tiledattention/core/_dispatch.py",
                                  "tiledattention/entry_points/_autograd.py",
                                  "tuner/commands/explain_cmd.py"])
def test_the_entry_points_name_no_family(name):
    """sdpa, the training path, the dispatcher and explain go through the registry (choose,
    resolve, plan, launch): a fourth family needs no edit of theirs."""
    assert _family_names(ROOT / name) == []


def test_the_family_name_check_catches_a_named_family(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text("from .decode import DECODE\nif family is FORWARD:\n    pass\n")
    assert len(_family_names(planted)) == 3


def test_the_public_surface_is_what_users_call():
    """``tiledattention.__all__`` lists what users call; the tools' plumbing lives in
    ``tiledattention.tooling`` and is no attribute of the package itself."""
    from tiledattention import tooling

    assert all(hasattr(tiledattention, name) for name in tiledattention.__all__)
    assert all(hasattr(tooling, name) for name in tooling.__all__)
    plumbing = set(tooling.__all__)
    assert plumbing.isdisjoint(tiledattention.__all__)
    assert [name for name in plumbing if hasattr(tiledattention, name)] == []
    assert {"sdpa", "sdpa_with_lse", "sdpa_backward", "explain", "Problem", "Family",
            "register_family", "use_database", "TiledAttentionError"} <= set(tiledattention.__all__)
