"""Compile-only builds of the forward kernel: a schedule's cubin for any architecture, on a
machine without a GPU (``tiledtune search --compile-only``, the CI checks). It compiles the same
kernel object and constants the launcher uses, for arrays laid out the way ``sdpa`` passes them
(last dim contiguous, 16-byte aligned rows), via ``cuda.tile.compilation.export_kernel``.
"""

from __future__ import annotations

import io
import time
from typing import Any, Mapping

import cuda.tile as ct
from cuda.tile import compilation as ctc

from .._compile import CompileResult, check_arch, cubin_shared_bytes
from ..errors import CompileError
from ._launch import kernel_constants, kernel_for, ordered_args
from ._problem import Problem
from ._schedule import Schedule

__all__ = ["compile_schedule"]

_CT_DTYPES = {"bf16": ct.bfloat16, "fp16": ct.float16}


def _array(dtype: str, shape: tuple[int, ...]) -> ctc.ArrayConstraint:
    """A contiguous array as ``ct.launch`` sees it: its JIT specialises on 16-byte aligned
    strides and base address and on each dim being a multiple of 16. Matching that makes the
    cubin's cache key equal to the launch's, so a compile-only build warms cuTile's disk cache
    for the real launch."""
    return ctc.ArrayConstraint(
        _CT_DTYPES[dtype], 4, index_dtype=ct.int32, stride_lower_bound_incl=0,
        alias_groups=(), may_alias_internally=False,
        stride_constant=(None, None, None, 1), stride_divisible_by=(8, 8, 8, 1),
        shape_divisible_by=tuple(16 if n % 16 == 0 else 1 for n in shape),
        base_addr_divisible_by=16,
    )


def compile_schedule(problem: Problem, schedule: Schedule, arch: str) -> CompileResult:
    """Compile ``schedule`` for ``problem`` into a cubin for ``arch``; raise :class:`CompileError`.

    The constants are ``kernel_constants(problem, schedule)``, so ``schedule`` and
    ``normalise(problem, schedule)`` give the same cubin."""
    return _export(problem, kernel_for(schedule), kernel_constants(problem, schedule), arch,
                   schedule.describe())


def _export(problem: Problem, kernel: ct.kernel, constants: Mapping[str, Any], arch: str,
            label: str) -> CompileResult:
    """Compile ``kernel`` with these named constants (exactly the kernel's ``ct.Constant``
    parameters) for ``problem``'s arrays into a cubin for ``arch``. ``label`` names the build in
    errors. Tests use it to compile constants that no normalised schedule produces."""
    check_arch(arch)
    p = problem
    q_like = _array(p.dtype, (p.batch, p.heads_q, p.seqlen_q, p.head_dim))
    kv_like = _array(p.dtype, (p.batch, p.heads_kv, p.seqlen_k, p.head_dim))
    runtime = {"Q": q_like, "K": kv_like, "V": kv_like, "Out": q_like,
               "qk_scale": ctc.ScalarConstraint(ct.float32),
               "heads_q": ctc.ScalarConstraint(ct.int32), "group": ctc.ScalarConstraint(ct.int32)}
    signature = ctc.KernelSignature(
        list(ordered_args(runtime, constants)),
        calling_convention=ctc.CallingConvention.cutile_python_v1(),
    )
    buf = io.BytesIO()
    start = time.perf_counter()
    try:
        ctc.export_kernel(kernel, [signature], buf, gpu_code=arch, output_format="cubin")
    except Exception as exc:  # tileiras failures come as several exception types
        message = str(exc).strip().splitlines()
        raise CompileError(
            f"{label} does not compile for {arch}: "
            f"{type(exc).__name__}: {message[-1] if message else ''}"[:2000]
        ) from exc
    cubin = buf.getvalue()
    return CompileResult(arch=arch, cubin_size=len(cubin), seconds=time.perf_counter() - start,
                         cubin=cubin, shared_bytes=cubin_shared_bytes(cubin))
