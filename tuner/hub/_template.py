"""The files of a Hub kernel that are not copies of the runtime: its entry package, the lazy
loader, the compatibility package for older ``kernels`` releases, the vendored packages' shims
and the repository card. ``string.Template`` texts (``$name``); :mod:`._build` fills them in."""

from __future__ import annotations

from string import Template

__all__ = ["ENTRY", "LOADER", "COMPAT", "VENDOR_INIT", "ERRORS_SHIM", "IDENTITY_HELPER", "CARD"]

#: ``build/torch-universal/__init__.py``: imports only the standard library and its own modules.
ENTRY = Template('''\
"""tiledattention on the Hugging Face Kernel Hub: cuTile attention kernels whose schedules are
tuned per GPU.

    import kernels
    attn = kernels.get_kernel("<org>/$name", version=$version)   # or get_local_kernel(path)
    out = attn.sdpa(q, k, v, causal=True)                       # bf16/fp16 CUDA [B, H, S, D]

Importing this package loads neither cuda.tile nor CuPy nor the shipped schedule table: the
first call does. cuda.tile is required (``pip install "cuda-tile[tileiras]"``; without it a call
raises :class:`MissingDependencyError` saying so), CuPy only for CuPy arrays. Schedules come from
the tiledattention user database (``$$TILEDATTN_DB`` or ``~/.cache/tiledattention/
schedules.sqlite``, read when SQLAlchemy is installed), then the shipped table, then the
per-architecture default.

Built by ``tiledtune hub-build`` from tiledattention $project_version (build $kernel_id).
"""

from __future__ import annotations

from typing import Any

from ._load import MissingDependencyError, check_arrays, runtime
from .errors import (  # the runtime's exception hierarchy
$error_imports)

__all__ = [
    "sdpa",
    "explain",
    "MissingDependencyError",
$error_names]
__version__ = "$project_version"


def sdpa(q: Any, k: Any, v: Any, causal: bool | str = False, scale: float | None = None) -> Any:
    """Scaled dot-product attention forward, ``[B, H, S, D]`` in and out: equals
    ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True)``.

    q: ``[B, H_q, S_q, D]``; k, v: ``[B, H_kv, S_k, D]`` with ``H_q % H_kv == 0``; bf16 or fp16
    CUDA tensors (or CuPy arrays), last dim contiguous; head dims 32..256 in steps of 8.
    ``causal``: ``False``, ``True`` / ``"top_left"`` (torch's ``is_causal``) or
    ``"bottom_right"``. ``scale`` defaults to ``1/sqrt(D)``. Differentiable on tensors that
    require grad. Bad input raises :class:`InputTypeError` / :class:`InputValueError` naming the
    argument (also without cuda.tile); a missing cuda.tile raises
    :class:`MissingDependencyError`.
    """
    check_arrays(q, k, v)
    return runtime().sdpa(q, k, v, causal, scale)


def explain(q: Any, k: Any, v: Any, causal: bool | str = False) -> Any:
    """The schedule ``sdpa(q, k, v, causal)`` would run, its kernel family and which lookup
    step chose it."""
    check_arrays(q, k, v)
    return runtime().explain(q, k, v, causal)
''')

#: ``build/torch-universal/_load.py``: the runtime, imported on the first call.
LOADER = Template('''\
"""The runtime (``._vendor.tiledattention``) is imported on the first call, not with this
package: it needs cuda.tile, which the Hub cannot install (it is not among the Hub's curated
Python dependencies), so its absence must be a clear error at call time, not a failed load."""

from __future__ import annotations

import importlib
from typing import Any

from .errors import InputTypeError, InputValueError, TiledAttentionError

__all__ = ["MissingDependencyError", "REQUIREMENTS", "check_arrays", "missing_requirements",
           "runtime"]

#: What the runtime imports to run a kernel, and how to install it: cuTile, and NumPy, which the
#: kernel files use for constants (torch does not require it). CuPy is imported only for CuPy
#: arrays, whose callers have it; SQLAlchemy only to read a user database (without it the
#: database is skipped with a warning).
REQUIREMENTS = (("cuda.tile", 'pip install "cuda-tile[tileiras]"'),
                ("numpy", "pip install numpy"))

_runtime: Any = None  # the vendored tiledattention package, once imported


class MissingDependencyError(TiledAttentionError, ImportError):
    """A package the kernels need at run time cannot be imported; the message says which and
    how to install it."""


def check_arrays(q: Any, k: Any, v: Any) -> None:
    """Refuse, in the runtime's words, what no installation could run: torch tensors that are
    not on a CUDA device, and objects that are neither torch tensors nor CuPy arrays. Done
    before the runtime is loaded, so such a call fails alike with or without cuda.tile."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        library = type(x).__module__.split(".")[0]
        if library == "torch":
            if not x.is_cuda:
                raise InputValueError(f"{name} must be a CUDA tensor; got a tensor on {x.device}")
        elif library != "cupy":
            raise InputTypeError(
                f"{name} must be a torch.Tensor or cupy.ndarray; got {type(x).__name__}")


def missing_requirements() -> list[str]:
    """One line per requirement that cannot be imported: what, why, and the install command."""
    missing = []
    for module, install in REQUIREMENTS:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{module} cannot be imported ({exc}); install it with: {install}")
    return missing


def runtime() -> Any:
    """The vendored tiledattention package, imported on first use. Raises
    :class:`MissingDependencyError` when a requirement is missing."""
    global _runtime
    if _runtime is None:
        missing = missing_requirements()
        if missing:
            raise MissingDependencyError(
                "the $name kernels need packages that are not installed here: "
                + "; ".join(missing))
        from ._vendor import tiledattention

        _runtime = tiledattention
    return _runtime
''')

#: ``build/torch-universal/<name>/__init__.py``: kernels releases before 0.11 import the package
#: named after the kernel inside the variant directory; this one loads the variant directory's
#: package (under the build's id, as newer releases do) and re-exports its names.
COMPAT = Template('''\
"""For kernels releases before 0.11, which import ``build/<variant>/$python_name/``: loads the
kernel package of the variant directory (this directory's parent) and re-exports its names."""

import importlib.util
import sys
from pathlib import Path

_KERNEL_ID = "$kernel_id"


def _load_kernel():
    if _KERNEL_ID in sys.modules:
        return sys.modules[_KERNEL_ID]
    path = Path(__file__).resolve().parent.parent / "__init__.py"
    spec = importlib.util.spec_from_file_location(_KERNEL_ID, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_KERNEL_ID] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_KERNEL_ID]
        raise
    return module


_kernel = _load_kernel()
__all__ = list(_kernel.__all__)
globals().update({name: getattr(_kernel, name) for name in __all__})
''')

VENDOR_INIT = Template('''\
"""tiledattention's runtime (``tiledattention``) and schedule store (``db``) $project_version,
copied by ``tiledtune hub-build``: their imports of each other are relative, the exception
hierarchy is the kernel's ``errors`` module, and the torch ops live in the namespace
``$kernel_id`` of this build. Not imported until the first call (see ``.._load``)."""
''')

#: The vendored ``tiledattention/errors.py``: the hierarchy is the kernel's top-level ``errors``
#: (importable before the runtime), so what the runtime raises is what the kernel exports.
ERRORS_SHIM = Template('''\
"""The exception hierarchy, kept in the kernel's top-level ``errors`` module so that it can be
imported (and raised) before the runtime, which needs cuda.tile."""

from ${up}errors import (
$error_imports)

__all__ = [
$error_names]
''')

#: Appended to the vendored ``tiledattention/core/_identity.py``, whose module lookup is
#: redirected through it: the template modules are named
#: ``tiledattention.kernels.forward._kernel`` etc. (and the identity hashes those names, so
#: rows of the shipped table stay current), but the files are
#: this build's copies, not those of a tiledattention that may be installed beside it.
IDENTITY_HELPER = Template('''

def _vendored_name(module_name: str) -> str:
    """(added by tiledtune hub-build) The module of this build that holds ``module_name``:
    names of tiledattention's packages resolve inside the vendored copy."""
    if module_name.partition(".")[0] in $vendored:
        vendor = __package__.rsplit(".", 2)[0]  # <build>._vendor (of ._vendor.tiledattention.core)
        return f"{vendor}.{module_name}"
    return module_name
''')

#: ``README.md`` at the repository root: the Hub's kernel card.
CARD = Template('''\
---
library_name: kernels
license: apache-2.0
tags:
- kernels
- attention
- cutile
---

# $name

tiledattention's cuTile attention kernels (prefill forward, split-KV decode, backward), with
the schedules tuned per GPU that the tiledattention project ships, as a Hub kernel (a pure
Python kernel: one `torch-universal` build variant).

```python
import torch
from kernels import get_kernel

attn = get_kernel("<org>/$name", version=$version, trust_remote_code=True)
q = torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(4, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
out = attn.sdpa(q, k, v, causal=True)   # = F.scaled_dot_product_attention(..., enable_gqa=True)
```

Needs cuda.tile at run time (`pip install "cuda-tile[tileiras]"`; the Hub does not install it:
a call without it raises `MissingDependencyError` naming the command) and an NVIDIA GPU that
cuTile supports (compute capability $archs). Schedules tuned on your own GPU with
`tiledtune search` (the tiledattention project) are used when SQLAlchemy is installed.

Built with `tiledtune hub-build` from tiledattention $project_version; build id `$kernel_id`.
''')
