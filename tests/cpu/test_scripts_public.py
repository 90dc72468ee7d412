"""Scripts use the project's public names only (issue 28, item 6).

Every ``scripts/*.py`` is parsed (never imported: scripts need a GPU) and checked for uses of a
private name of the project's packages (``tiledattention``, ``tuner``, ``db``, ``search_spaces``).
A name is private when it starts with ``_`` and is not a dunder (``__version__`` is public).
Flagged:

- ``import P.a._b`` / ``import P._a as m``: a private module path component;
- ``from P._a import x`` / ``from P.a import _x``: a private module or a private imported name;
- ``X._y`` (anywhere in an attribute chain ``X.a._y``) where ``X`` is a name the script bound by
  importing from a project package (``import P``, ``import P.a as X``, ``from P import X``);
- ``getattr(X, "_y")`` on such a name, and ``importlib.import_module("P._a")`` / ``__import__``
  of a private project module given as a literal string.

Not tracked (kept simple): names re-bound by assignment (``m = tiledattention.forward``) and private
attributes of values returned by calls (``runtime()._x``). Each script must also parse, and every
project module and name it imports must import on the CPU (so a rename is noticed without a GPU).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
PACKAGES = {"tiledattention", "tuner", "db", "search_spaces"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _project(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in PACKAGES


def _private_parts(module: str) -> list[str]:
    return [part for part in module.split(".") if _private(part)]


def violations(source: str, filename: str = "<script>") -> list[str]:
    """``line: what`` for every private project name ``source`` uses (see the module docstring)."""
    tree = ast.parse(source, filename)
    bound: set[str] = set()  # names bound to a project module or object by an import
    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _project(alias.name):
                    continue
                if _private_parts(alias.name):
                    bad.append(f"{node.lineno}: import of private module {alias.name}")
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _project(node.module):
            if _private_parts(node.module):
                bad.append(f"{node.lineno}: import from private module {node.module}")
            for alias in node.names:
                if _private(alias.name):
                    bad.append(f"{node.lineno}: import of private name {node.module}.{alias.name}")
                bound.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                bad.append(f"{node.lineno}: private attribute {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            func = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            args = node.args
            literal = [a.value for a in args
                       if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if func == "getattr" and len(args) >= 2 and isinstance(args[0], ast.Name):
                if args[0].id in bound and literal and _private(literal[0]):
                    bad.append(f"{node.lineno}: private attribute "
                               f"getattr({args[0].id}, {literal[0]!r})")
            elif func in {"import_module", "__import__"} and literal:
                if _project(literal[0]) and _private_parts(literal[0]):
                    bad.append(f"{node.lineno}: dynamic import of private module {literal[0]}")
    return sorted(set(bad), key=lambda text: int(text.split(":")[0]))


def _project_imports(source: str) -> list[tuple[str, str | None]]:
    """(module, imported name or ``None``) of every project import in ``source``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if _project(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _project(node.module):
            found += [(node.module, a.name) for a in node.names]
    return found


def _resolves(module: str, name: str | None) -> bool:
    try:
        imported = importlib.import_module(module)
        if name is not None and not hasattr(imported, name):
            importlib.import_module(f"{module}.{name}")  # a submodule not imported yet
    except ImportError:
        return False
    return True


def test_there_are_scripts():
    assert SCRIPTS, "scripts/*.py not found"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_uses_public_names_only(path: Path):
    found = violations(path.read_text(), str(path))
    assert not found, f"{path.relative_to(ROOT)} uses private project names:\n" + "\n".join(found)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_project_imports_resolve(path: Path):
    """Each project module and name a script imports exists (imported on the CPU, the script is
    not run), so a rename is noticed without a GPU."""
    missing = [f"{m}{'' if n is None else ' ' + n}" for m, n in _project_imports(path.read_text())
               if not _resolves(m, n)]
    assert not missing, f"{path.relative_to(ROOT)} imports what is not there: {missing}"


PLANTED = {
    "import tiledattention._sdpa as sdpa_module": "import of private module tiledattention._sdpa",
    "from tiledattention.forward._launch import x": "import from private module",
    "from tuner.measure._timing import _Sampler": "import from private module",
    "from tiledattention import _provenance": "import of private name tiledattention._provenance",
    "import tiledattention\ntiledattention._provenance":
        "private attribute tiledattention._provenance",
    "import tuner.measure\ntuner.measure._timing._Sampler":
        "private attribute tuner.measure._timing",
    "from tiledattention import sdpa as s\ns._forward_key(1)": "private attribute s._forward_key",
    "import tiledattention as t\ngetattr(t, '_sdpa')": "getattr(t, '_sdpa')",
    "import importlib\nimportlib.import_module('db._store')":
        "dynamic import of private module db._store",
}


@pytest.mark.parametrize("source", PLANTED, ids=range(len(PLANTED)))
def test_planted_violation_is_found(source: str):
    found = violations(source)
    assert any(PLANTED[source] in line for line in found), found


@pytest.mark.parametrize(
    "source",
    [
        "import tiledattention\ntiledattention.__version__\ntiledattention.FORWARD.plan",
        "from tiledattention import FORWARD\nFORWARD.plan(1)",
        "import torch\ntorch._C._cuda_getDevice()",  # another library's private names are not ours
        "from tuner.measure import time_interleaved\nx = object()\nx._private",
        "import numpy as np\ngetattr(np, '_x')",
    ],
    ids=["dunder", "public", "other-package", "unbound-name", "other-getattr"],
)
def test_public_use_passes(source: str):
    assert violations(source) == []
