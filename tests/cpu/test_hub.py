"""The Hugging Face Kernel Hub build: ``tiledtune hub-build -o DIR`` writes a kernel that
``kernels.get_local_kernel`` loads (no network), whose ``sdpa`` refuses CPU tensors with the
package's own error whether or not cuda.tile is installed, whose runtime is vendored with
relative imports only and keeps the project's template identities, shipped table and (renamed)
torch ops."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import kernels
import pytest
import torch

import tiledattention
from tuner.cli import main
from tuner.hub import HubBuildError, build_hub_kernel

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = {"tiledattention", "db", "tuner", "search_spaces"}
#: what the kernel's own top-level modules may import when it is loaded
ENTRY_FILES = ("__init__.py", "_load.py", "errors.py", "tiledattention/__init__.py")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("hub") / "tiledattention-hub"
    assert main(["hub-build", "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def kernel(built, monkeypatch_module):
    monkeypatch_module.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    return kernels.get_local_kernel(built)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _cpu(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def _imports(path: Path):
    """(node, absolute module names) of every import statement in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield node, [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node, [node.module]


# -- the layout --------------------------------------------------------------------------------
def test_the_repository_has_one_universal_variant_with_its_metadata(built, capsys):
    assert sorted(p.name for p in (built / "build").iterdir()) == ["torch-universal"]
    variant = built / "build" / "torch-universal"
    meta = json.loads((variant / "metadata.json").read_text())
    assert meta["name"] == "tiledattention"
    assert meta["id"].startswith("_tiledattention_universal_")
    assert meta["python-depends"] == []  # cuda-tile is not among the Hub's curated packages
    assert meta["backend"]["type"] == "cuda" and "9.0" in meta["backend"]["archs"]
    assert (variant / "__init__.py").is_file()
    assert (variant / "tiledattention/__init__.py").is_file()  # for kernels < 0.11
    assert (variant / "_vendor/tiledattention/pretuned/sm_90.json").is_file()
    assert not (variant / "_vendor/tiledattention/integrations").exists()
    assert "get_kernel(" in (built / "README.md").read_text()


def test_the_built_tree_has_no_absolute_import_of_the_project(built):
    variant = built / "build" / "torch-universal"
    files = sorted(variant.rglob("*.py"))
    assert len(files) > 40
    bad = [f"{p.relative_to(variant)}:{node.lineno}: {ast.unparse(node)}"
           for p in files for node, names in _imports(p)
           if any(n.split(".")[0] in PROJECT_PACKAGES for n in names)]
    assert bad == []
    relative = sum(isinstance(node, ast.ImportFrom) and node.level > 0
                   for p in files for node in ast.walk(ast.parse(p.read_text())))
    assert relative > 50  # the runtime's imports are there, made relative


def test_loading_the_kernel_imports_only_the_standard_library_and_itself(built):
    """Top-level imports of the modules a load runs: the standard library or the package."""
    variant = built / "build" / "torch-universal"
    for name in ENTRY_FILES:
        tree = ast.parse((variant / name).read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module]
            else:
                continue
            assert all(m.split(".")[0] in sys.stdlib_module_names | {"__future__"}
                       for m in modules), (name, ast.unparse(node))


def test_the_same_sources_build_the_same_id_and_rebuilding_needs_force(built, capsys):
    meta = json.loads((built / "build/torch-universal/metadata.json").read_text())
    assert main(["hub-build", "-o", str(built)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    again = build_hub_kernel(built.parent / "again")
    assert again.kernel_id == meta["id"]
    assert build_hub_kernel(built.parent / "renamed", name="tiled-attn").kernel_id \
        .startswith("_tiled_attn_universal_")


def _project_identities(identities: dict[str, str]) -> bool:
    """The vendored families are the project's (other tests may register more in this
    process) and hash the same code."""
    assert {"forward", "decode", "backward"} <= set(identities)
    return identities == {name: tiledattention.get_family(name).template_identity()
                          for name in identities}


# -- loading and calling -----------------------------------------------------------------------
def test_get_local_kernel_loads_it_and_cpu_tensors_get_the_package_error(kernel):
    assert kernel.__name__.startswith("_tiledattention_universal_")
    q = _cpu(1, 4, 16, 64)
    with pytest.raises(kernel.InputValueError,
                       match="^q must be a CUDA tensor; got a tensor on cpu$") as raised:
        kernel.sdpa(q, q, q, causal=True, scale=0.125)
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, kernel.TiledAttentionError)
    with pytest.raises(kernel.InputTypeError, match="q must be a torch.Tensor or cupy.ndarray"):
        kernel.sdpa([[1.0]], q, q)
    with pytest.raises(kernel.InputValueError, match="q must be a CUDA tensor"):
        kernel.explain(q, q, q)


def test_the_vendored_runtime_raises_the_kernel_errors_and_keeps_the_project_identity(kernel):
    runtime = kernel._load.runtime()  # cuda.tile is installed here (a project dependency)
    assert runtime.__name__ == f"{kernel.__name__}._vendor.tiledattention"
    with pytest.raises(kernel.InputValueError, match="q must be a CUDA tensor"):
        runtime.sdpa(_cpu(1, 4, 16, 64), _cpu(1, 4, 16, 64), _cpu(1, 4, 16, 64))
    assert runtime.InputValueError is kernel.InputValueError
    # identities hash the same code under the same names: the shipped rows stay current
    assert _project_identities({f.name: f.template_identity() for f in runtime.families()})
    ours = sorted(r.describe_key() for r in runtime.shipped_table("sm_90"))
    assert ours == sorted(r.describe_key() for r in tiledattention.shipped_table("sm_90"))
    assert len(ours) > 100


def test_the_torch_ops_live_in_the_build_namespace_beside_the_project_ones(kernel):
    importlib.import_module(f"{kernel.__name__}._vendor.tiledattention.entry_points._autograd")
    importlib.import_module("tiledattention.entry_points._autograd")  # no clash with the project's ops
    assert hasattr(getattr(torch.ops, kernel.__name__), "sdpa_fwd_lse")
    assert hasattr(getattr(torch.ops, kernel.__name__), "sdpa_bwd")
    assert hasattr(torch.ops.tiledattention, "sdpa_fwd_lse")


def test_the_compatibility_package_re_exports_the_kernel(built, kernel):
    """kernels < 0.11 import build/<variant>/<name>/ under a name of their own."""
    path = built / "build/torch-universal/tiledattention/__init__.py"
    spec = importlib.util.spec_from_file_location("old_kernels_loader_name", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.sdpa is kernel.sdpa and module.InputValueError is kernel.InputValueError


_WITHOUT_CUDA_TILE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import huggingface_hub.constants, kernels, torch
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    kernel = kernels.get_local_kernel(Path(sys.argv[1]))
    loaded = sorted(m for m in ("cuda.tile", "cupy", "sqlalchemy",
                                kernel.__name__ + "._vendor.tiledattention") if m in sys.modules)
    sys.modules["cuda.tile"] = None  # as if cuda-tile were not installed
    result = {"loaded_at_import": loaded}
    q = torch.randn(1, 4, 16, 64, dtype=torch.bfloat16)
    try:
        kernel.sdpa(q, q, q)
    except Exception as exc:
        result["cpu"] = [type(exc).__name__, isinstance(exc, ValueError), str(exc)]
    class Array:  # passes the check that needs no runtime, as a CuPy array would
        pass
    Array.__module__ = "cupy._core.core"
    try:
        kernel.sdpa(Array(), Array(), Array())
    except Exception as exc:
        result["missing"] = [type(exc).__name__, isinstance(exc, ImportError),
                             isinstance(exc, kernel.TiledAttentionError), str(exc)]
    print(json.dumps(result))
""")


def test_without_cuda_tile_cpu_tensors_get_the_same_error_and_a_call_names_the_install(built):
    out = subprocess.run([sys.executable, "-c", _WITHOUT_CUDA_TILE, str(built)], cwd=built,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loaded_at_import"] == []  # nothing heavy is imported by a load
    assert result["cpu"] == ["InputValueError", True,
                             "q must be a CUDA tensor; got a tensor on cpu"]
    name, is_import_error, is_ours, message = result["missing"]
    assert (name, is_import_error, is_ours) == ("MissingDependencyError", True, True)
    assert "cuda.tile cannot be imported" in message
    assert 'pip install "cuda-tile[tileiras]"' in message


_WITHOUT_THE_PROJECT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import huggingface_hub.constants, kernels, torch
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    for name in ("tiledattention", "db", "tuner", "search_spaces"):
        sys.modules[name] = None  # as if the project were not installed
    kernel = kernels.get_local_kernel(Path(sys.argv[1]))
    runtime = kernel._load.runtime()
    __import__(runtime.__name__ + ".entry_points._autograd")
    print(json.dumps({
        "identities": {f.name: f.template_identity() for f in runtime.families()},
        "shipped": len(list(runtime.shipped_table("sm_90"))),
        "ops": hasattr(getattr(torch.ops, kernel.__name__), "sdpa_fwd_lse"),
    }))
""")


def test_the_kernel_runs_where_the_project_is_not_installed(built):
    """Every module, the template files and the shipped table come from the built tree: with
    the project's packages unimportable, the runtime loads and agrees with the project."""
    out = subprocess.run([sys.executable, "-c", _WITHOUT_THE_PROJECT, str(built)], cwd=built,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert _project_identities(result["identities"])
    assert result["shipped"] == len(list(tiledattention.shipped_table("sm_90")))
    assert result["ops"] is True


# -- the builder's safety nets -----------------------------------------------------------------
def _sources_with(monkeypatch, package: str, relative: str, edit):
    from tuner.hub import _build

    real = _build._sources()
    real[package][Path(relative)] = edit(real[package][Path(relative)].decode()).encode()
    monkeypatch.setattr(_build, "_sources", lambda: real)


def test_a_patch_that_no_longer_matches_the_runtime_fails_the_build(tmp_path, monkeypatch):
    _sources_with(monkeypatch, "tiledattention", "core/_lookup.py",
                  lambda t: t.replace('resources.files("tiledattention")',
                                      'resources.files("tiledattention" )'))
    with pytest.raises(HubBuildError, match="_lookup.py"):
        build_hub_kernel(tmp_path / "k")
    assert not (tmp_path / "k/build/torch-universal").exists()  # nothing half-written


def test_a_module_named_in_a_string_fails_the_build(tmp_path, monkeypatch):
    _sources_with(monkeypatch, "tiledattention", "core/_device.py",
                  lambda t: t + '\n\ndef _x():\n    return importlib.import_module("db._rows")\n')
    with pytest.raises(HubBuildError, match=r"_device.py:\d+: .*names the project's package"):
        build_hub_kernel(tmp_path / "k")


@pytest.mark.parametrize("source, depth, expected", [
    ("import db\n", 1, "from .. import db\n"),
    ("from db import Provenance\n", 1, "from ..db import Provenance\n"),
    ("from db._schema import (A,\n    B)\n", 2, "from ...db._schema import A, B\n"),
    ("def f():\n    import tiledattention  # note\n    return 1\n", 1,
     "def f():\n    from .. import tiledattention  # note\n    return 1\n"),
    ("import tiledattention.errors as e\n", 1, "from ..tiledattention import errors as e\n"),
    ("import os\nfrom . import x\n", 1, "import os\nfrom . import x\n"),
], ids=["import", "from", "from-multiline", "in-function", "dotted-as", "untouched"])
def test_imports_are_made_relative_in_place(source, depth, expected):
    from tuner.hub._build import make_imports_relative

    assert make_imports_relative(source, depth, "x.py") == expected


@pytest.mark.parametrize("source", ["import db.x\n", "import os, db\n"])
def test_imports_without_a_relative_form_are_refused(source):
    from tuner.hub._build import make_imports_relative

    with pytest.raises(HubBuildError, match="cannot make"):
        make_imports_relative(source, 1, "x.py")


def test_the_kernel_name_follows_the_hub_rule(tmp_path):
    for bad in ("Tiled", "tiled_attention", "-x", "errors"):
        with pytest.raises(HubBuildError):
            build_hub_kernel(tmp_path / bad, name=bad)


def test_shipped_cubins_travel_with_the_kernel_under_their_project_names(monkeypatch, tmp_path):
    """A Hub build vendors ``pretuned/cubins-*.zip`` (and nothing else that is not code or a
    table), and a vendored kernel is named as the project's, so the wheel's bundles serve it."""
    import types

    from tiledattention.core._bundles import kernel_name
    from tuner.hub import _build

    package = tmp_path / "tiledattention"
    (package / "pretuned").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pretuned" / "sm_90.json").write_text("{}")
    (package / "pretuned" / "cubins-sm_90.zip").write_bytes(b"PK")
    (package / "pretuned" / "notes.zip").write_bytes(b"PK")
    monkeypatch.setattr(_build, "_package_dir", lambda name: package)
    files = _build._sources()["tiledattention"]
    assert Path("pretuned", "cubins-sm_90.zip") in files
    assert Path("pretuned", "notes.zip") not in files

    def fake(module):
        fn = types.SimpleNamespace(__module__=module, __qualname__="attention_fwd")
        options = types.SimpleNamespace(num_ctas=1, occupancy=2, opt_level=3, num_worker_warps=None)
        return types.SimpleNamespace(_annotated_function=types.SimpleNamespace(pyfunc=fn),
                                     _compiler_options=options)

    ours = kernel_name(fake("tiledattention.kernels.forward._kernel"))
    vendored = kernel_name(fake("_tiledattention_universal_1a2b3c4._vendor.tiledattention"
                                ".kernels.forward._kernel"))
    assert ours == vendored and ours.startswith("tiledattention.kernels.forward._kernel:")
