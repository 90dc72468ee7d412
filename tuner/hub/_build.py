"""Lay tiledattention out as a Hugging Face Kernel Hub kernel repository.

What the Hub asks of a kernel (``docs/source/kernel-requirements.md`` of huggingface/kernels,
and what ``kernels`` 0.17 checks when it loads one):

* the repository holds ``build/<variant>/``; a pure Python kernel ships the one variant
  ``torch-universal``, which every system accepts;
* the variant directory is the kernel's Python package (``__init__.py``) with a
  ``metadata.json`` (name, id, version, license, python-depends, backend); for ``kernels``
  before 0.11 it also holds a package named after the kernel that re-exports it;
* the package is imported under a name unique to the build (the metadata id), never under its
  own name, so every import of its own modules must be relative, and it may import only the
  standard library, torch and itself; ``python-depends`` may list only the Hub's curated
  packages, which cuda-tile and CuPy are not: they are imported at call time, with an error
  naming the install command when missing;
* torch ops are registered in a namespace unique to the build (here: the build id).

The kernel vendors the runtime: ``tiledattention`` (less ``integrations``, which adapts it to
transformers and torch's SDPA dispatch) and ``db`` (less the Alembic migrations, which only a
writer runs) are copied under ``_vendor/``, with the shipped cubin bundles where
``tiledtune aot --into-package`` built them (a vendored kernel keeps its project name, so they
serve it as they serve the wheel's). Their absolute imports of each other are rewritten
as relative ones, in place, leaving every other byte of a file as it was (so the template
identities, hashes over the kernel files' code, come out as in the project and the shipped
table's rows stay current). Three things are named by string rather than imported, and are
patched, each at one known place that must match exactly: the shipped table's package
(``resources.files``), the template modules' lookup in ``_identity`` and the torch op
namespace. A build whose sources no longer match a patch fails and says which, rather than
shipping a kernel that would quietly read another installation's files.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..errors import HubBuildError
from . import _template

__all__ = ["HubBuild", "HubBuildError", "VARIANT", "VENDORED", "absolute_project_imports",
           "build_hub_kernel", "kernel_id_for"]

#: The build variant of a pure Python kernel.
VARIANT = "torch-universal"
#: The project's packages that the kernel vendors (and whose absolute imports it must not hold).
VENDORED = ("tiledattention", "db")
#: Packages of the project that the kernel must never import.
PROJECT_PACKAGES = VENDORED + ("tuner", "search_spaces")
#: Parts of the vendored packages that the kernel leaves out (relative to the package).
LEFT_OUT = {"tiledattention": ("integrations",), "db": ("migrations",)}
#: Calls that take a module name as a string: one naming a vendored package is a build error
#: unless a patch below rewrote it.
_NAME_TAKING_CALLS = {"find_spec", "import_module", "files", "__import__", "import_file"}


@dataclass(frozen=True, kw_only=True)
class HubBuild:
    """What :func:`build_hub_kernel` wrote."""

    root: Path          # the repository directory (holds README.md and build/)
    variant_dir: Path   # root / "build" / VARIANT: the kernel package
    name: str
    kernel_id: str      # the metadata id: the module name and the torch op namespace
    version: int
    files: int          # files under variant_dir


@dataclass(frozen=True)
class _Patch:
    path: str            # relative to the vendored tiledattention package
    old: str
    new: str
    every: bool = False  # rewrite every occurrence (at least one), not exactly one


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise HubBuildError(f"cannot find the {name!r} package to vendor; install tiledattention "
                            "(pip install -e .) first")
    return Path(list(spec.submodule_search_locations)[0])


def _sources() -> dict[str, dict[Path, bytes]]:
    """package -> {path relative to the package: bytes} of every file the kernel vendors."""
    found: dict[str, dict[Path, bytes]] = {}
    for package in VENDORED:
        base = _package_dir(package)
        files = {}
        for path in sorted(base.rglob("*")):
            relative = path.relative_to(base)
            if not path.is_file() or "__pycache__" in relative.parts \
                    or path.suffix in (".pyc", ".pyo") or relative.parts[0] in LEFT_OUT[package]:
                continue
            if path.suffix not in (".py", ".json") and not (  # and the shipped cubins
                    relative.parts[0] == "pretuned" and path.name.startswith("cubins-")
                    and path.suffix == ".zip"):
                continue
            files[relative] = path.read_bytes()
        found[package] = files
    return found


def kernel_id_for(name: str, sources: dict[str, dict[Path, bytes]] | None = None) -> str:
    """``_<name>_universal_<7 hex digits>``: the digits hash the vendored sources and the
    builder's templates, so two builds of the same code share an id and any change makes a new
    one (kernel-builder's ids are ``_<name>_<backend>_<git sha>``)."""
    sources = _sources() if sources is None else sources
    digest = hashlib.sha256()
    for package in VENDORED:
        for relative, data in sorted(sources[package].items()):
            for part in (f"{package}/{relative.as_posix()}".encode(), data):
                digest.update(b"%d:" % len(part))
                digest.update(part)
    for text in (_template.ENTRY, _template.LOADER, _template.COMPAT, _template.ERRORS_SHIM,
                 _template.IDENTITY_HELPER, _template.VENDOR_INIT):
        digest.update(text.template.encode())
    return f"_{name.replace('-', '_')}_universal_{digest.hexdigest()[:7]}"


# -- rewriting ---------------------------------------------------------------------------------
def _relative_import(node: ast.Import | ast.ImportFrom, depth: int, where: str) -> str | None:
    """The relative form of an absolute import of a vendored package, or ``None`` when
    ``node`` imports no vendored package. ``depth``: how many packages the module sits below
    ``_vendor`` (1 for ``tiledattention/errors.py``, 2 for ``tiledattention/core/_lookup.py``; -1
    for a module of the kernel's top level, beside ``_vendor``)."""
    # "." is the module's own package; depth + 1 dots reach _vendor
    up = "._vendor." if depth < 0 else "." * (depth + 1)
    if isinstance(node, ast.ImportFrom):
        if node.level or (node.module or "").split(".")[0] not in VENDORED:
            return None
        names = ", ".join(ast.unparse(alias) for alias in node.names)
        return f"from {up}{node.module} import {names}"
    tops = [alias.name.split(".")[0] in VENDORED for alias in node.names]
    if not any(tops):
        return None
    if not all(tops) or len(node.names) != 1:
        raise HubBuildError(f"{where}:{node.lineno}: cannot make `{ast.unparse(node)}` relative "
                            "(import the project's packages one per statement)")
    alias = node.names[0]
    head, _, tail = alias.name.rpartition(".")
    if not head:  # import tiledattention [as x]
        return (f"from {up.rstrip('.') if depth < 0 else up} import {alias.name}"
                + (f" as {alias.asname}" if alias.asname else ""))
    if alias.asname is None:  # import db.x binds `db`: no relative form binds the same name
        raise HubBuildError(f"{where}:{node.lineno}: cannot make `{ast.unparse(node)}` relative; "
                            f"write `from {head} import {tail}`")
    return f"from {up}{head} import {tail} as {alias.asname}"


def _line_offsets(text: str) -> list[int]:
    """Where each line starts in ``text``, lines ending as Python's tokenizer ends them (not at
    a form feed, as ``str.splitlines`` would)."""
    return [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]


def make_imports_relative(text: str, depth: int, where: str) -> str:
    """``text`` with each absolute import of a vendored package replaced by its relative form,
    in place; every other character is kept."""
    tree = ast.parse(text, filename=where)
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            new = _relative_import(node, depth, where)
            if new is not None:
                edits.append((node, new))
    if not edits:
        return text
    offsets = _line_offsets(text)
    # ast columns count UTF-8 bytes; the import lines are ASCII, checked below
    out = text
    for node, new in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        start = offsets[node.lineno - 1] + node.col_offset
        end = offsets[node.end_lineno - 1] + node.end_col_offset
        old = out[start:end]
        if not old.isascii() or ast.unparse(ast.parse(old).body[0]) != ast.unparse(node):
            raise HubBuildError(f"{where}:{node.lineno}: cannot locate the import to rewrite")
        out = out[:start] + new + out[end:]
    return out


def _patches(kernel_id: str) -> list[_Patch]:
    """The string-named references to the project's packages, each rewritten at its one place."""
    return [
        # the shipped table: the vendored package's pretuned/ directory (core's parent), not
        # an installed tiledattention's
        _Patch("core/_lookup.py", 'resources.files("tiledattention")',
               'resources.files(__package__.rpartition(".")[0])'),
        # template modules: hashed under their project names, read from this build's files
        _Patch("core/_identity.py", "importlib.util.find_spec(module_name)",
               "importlib.util.find_spec(_vendored_name(module_name))"),
        # torch ops: in the build's own namespace
        _Patch("entry_points/_autograd.py", '"tiledattention::', f'"{kernel_id}::', every=True),
        _Patch("entry_points/_autograd.py", "torch.ops.tiledattention.",
               f"torch.ops.{kernel_id}.", every=True),
        _Patch("entry_points/_varlen.py", '"tiledattention::', f'"{kernel_id}::', every=True),
        _Patch("entry_points/_paged.py", '"tiledattention::', f'"{kernel_id}::', every=True),
        _Patch("entry_points/_paged_mixed.py", '"tiledattention::', f'"{kernel_id}::',
               every=True),
    ]


def _apply(text: str, patch: _Patch) -> str:
    count = text.count(patch.old)
    if count == 0 or (count > 1 and not patch.every):
        raise HubBuildError(
            f"tiledattention/{patch.path}: expected {'a' if patch.every else 'exactly one'} "
            f"`{patch.old}` to rewrite for the Hub build, found {count}; update "
            "tuner/hub/_build.py to the runtime's code")
    return text.replace(patch.old, patch.new)


def _check_no_name_lookup(text: str, where: str) -> None:
    """Refuse a call that names a vendored package in a string (``find_spec("db")``,
    ``resources.files("tiledattention")``): in the kernel it would find another installation's
    files, or none. Likewise a torch op of the project's namespace (``"tiledattention::op"``,
    ``torch.ops.tiledattention``), which would clash with an installed tiledattention's."""
    for node in ast.walk(ast.parse(text, filename=where)):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and node.value.startswith("tiledattention::")) \
                or (isinstance(node, ast.Attribute) and node.attr == "tiledattention"
                    and ast.unparse(node.value) == "torch.ops"):
            raise HubBuildError(f"{where}:{node.lineno}: `{ast.unparse(node)}` is a torch op of "
                                "the project's namespace; the Hub build must rename it")
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0]
        if called in _NAME_TAKING_CALLS and isinstance(first, ast.Constant) \
                and isinstance(first.value, str) \
                and first.value.split(".")[0] in PROJECT_PACKAGES:
            raise HubBuildError(f"{where}:{node.lineno}: `{ast.unparse(node)}` names the "
                                "project's package in a string; the Hub build cannot vendor it")


def _error_lists(errors_py: bytes) -> dict[str, str]:
    """The names of the runtime's exception hierarchy (``errors.__all__``, read from the file,
    not imported) as the lines of an import list and of an ``__all__`` list."""
    for node in ast.parse(errors_py).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            names = ast.literal_eval(node.value)
            break
    else:
        raise HubBuildError("tiledattention/errors.py: no __all__ to export")
    return {"error_imports": "".join(f"    {n},\n" for n in names),
            "error_names": "".join(f"    {json.dumps(n)},\n" for n in names)}


def _vendored_files(sources: dict[str, dict[Path, bytes]], kernel_id: str
                    ) -> dict[Path, bytes]:
    """Path under the variant directory -> bytes, for ``_vendor/``."""
    patches = _patches(kernel_id)
    unapplied = {p.path for p in patches}
    out: dict[Path, bytes] = {}
    for package, files in sources.items():
        for relative, data in files.items():
            where = f"{package}/{relative.as_posix()}"
            target = Path("_vendor", package, relative)
            if relative.suffix != ".py":
                out[target] = data
                continue
            # packages between _vendor and the module: tiledattention/x.py and
            # tiledattention/__init__.py: 1; tiledattention/core/y.py: 2;
            # tiledattention/kernels/forward/y.py: 3
            depth = len(relative.parts)
            text = data.decode("utf-8")
            if package == "tiledattention" and relative == Path("errors.py"):
                text = _template.ERRORS_SHIM.substitute(up="." * (depth + 2),
                                                        **_error_lists(data))
            else:
                text = make_imports_relative(text, depth, where)
            if package == "tiledattention":
                for patch in patches:
                    if Path(patch.path) == relative:
                        text = _apply(text, patch)
                        unapplied.discard(patch.path)
                if relative == Path("core/_identity.py"):
                    text += _template.IDENTITY_HELPER.substitute(vendored=repr(VENDORED))
            _check_no_name_lookup(text, where)
            out[target] = text.encode("utf-8")
    if unapplied:
        raise HubBuildError(f"tiledattention/{sorted(unapplied)[0]} is gone; the Hub build "
                            "patches it: update tuner/hub/_build.py to the runtime's code")
    return out


def absolute_project_imports(root: Path) -> list[str]:
    """``file:line: statement`` of every import in the ``.py`` files under ``root`` whose
    module is one of the project's packages imported absolutely; ``[]`` for a kernel tree."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(n.split(".")[0] in PROJECT_PACKAGES for n in names):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


# -- the tree ----------------------------------------------------------------------------------
def _cuda_archs() -> list[str]:
    """cuTile's architectures as the Hub writes CUDA capabilities (``sm_90`` -> ``9.0``)."""
    from tiledattention import ARCHITECTURES

    return [f"{int(a[3:]) // 10}.{int(a[3:]) % 10}" for a in ARCHITECTURES]


def _project_version() -> str:
    try:
        return metadata.version("tiledattention")
    except metadata.PackageNotFoundError:
        return "unknown"


def _tree(name: str, version: int, kernel_id: str, sources: dict[str, dict[Path, bytes]]
          ) -> dict[Path, bytes]:
    """Path under the variant directory -> bytes, for every file of the kernel package."""
    python_name = name.replace("-", "_")
    values = {"name": name, "python_name": python_name, "version": version,
              "kernel_id": kernel_id, "project_version": _project_version()}
    files = _vendored_files(sources, kernel_id)
    files[Path("_vendor", "__init__.py")] = _template.VENDOR_INIT.substitute(values).encode()
    errors_py = sources["tiledattention"][Path("errors.py")]
    files[Path("__init__.py")] = _template.ENTRY.substitute(values, **_error_lists(errors_py)
                                                            ).encode()
    files[Path("_load.py")] = _template.LOADER.substitute(values).encode()
    # the runtime's hierarchy, whose root comes from db (the vendored copy)
    files[Path("errors.py")] = make_imports_relative(errors_py.decode("utf-8"), -1,
                                                     "tiledattention/errors.py").encode("utf-8")
    files[Path(python_name, "__init__.py")] = _template.COMPAT.substitute(values).encode()
    meta = {"name": name, "id": kernel_id, "version": version, "license": "Apache-2.0",
            "python-depends": [], "backend": {"type": "cuda", "archs": _cuda_archs()}}
    files[Path("metadata.json")] = (json.dumps(meta, indent=2) + "\n").encode()
    return files


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z][-a-z0-9]*[a-z0-9]", name):
        raise HubBuildError(f"the kernel name must match [a-z][-a-z0-9]*[a-z0-9] (the Hub's rule "
                            f"for kernel names); got {name!r}")
    if name.replace("-", "_") in ("_vendor", "_load", "errors"):
        raise HubBuildError(f"the kernel name {name!r} clashes with a module of the kernel")


def build_hub_kernel(out: str | os.PathLike, *, name: str = "tiledattention", version: int = 1,
                     replace: bool = False) -> HubBuild:
    """Write the Hub kernel repository for the installed tiledattention to ``out``:
    ``out/README.md`` (the kernel card, rewritten) and ``out/build/torch-universal/`` (the
    package).

    The variant directory is assembled beside its destination and moved into place, so a
    failed build leaves nothing half-written. An existing variant directory is an error unless
    ``replace``; other files under ``out`` are left alone. Raises :class:`HubBuildError`."""
    _check_name(name)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise HubBuildError(f"version must be a positive integer; got {version!r}")
    root = Path(out)
    variant_dir = root / "build" / VARIANT
    if variant_dir.exists() and not replace:
        raise HubBuildError(f"{variant_dir} exists; pass --force to replace it")
    sources = _sources()
    kernel_id = kernel_id_for(name, sources)
    files = _tree(name, version, kernel_id, sources)
    variant_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{VARIANT}-", dir=variant_dir.parent))
    try:
        for relative, data in sorted(files.items()):
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        bad = absolute_project_imports(staging)
        if bad:
            raise HubBuildError("the kernel would import the project's packages absolutely: "
                                + "; ".join(bad))
        if variant_dir.exists():
            shutil.rmtree(variant_dir)
        os.replace(staging, variant_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    card = _template.CARD.substitute(
        name=name, version=version, kernel_id=kernel_id, project_version=_project_version(),
        archs=", ".join(_cuda_archs()))
    (root / "README.md").write_text(card, encoding="utf-8")
    return HubBuild(root=root, variant_dir=variant_dir, name=name, kernel_id=kernel_id,
                    version=version, files=len(files))
