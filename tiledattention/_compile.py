"""Compile-only builds: a schedule's cubin for any architecture, on a machine without a GPU.

This backs ``tiledtune search --compile-only`` and the CI checks. It compiles the same kernel
object and the same constants the launcher uses, for arrays laid out the way ``sdpa`` passes them
(last dim contiguous, 16-byte aligned rows), via ``cuda.tile.compilation.export_kernel``.
"""

from __future__ import annotations

import io
import re
import struct
import time
from dataclasses import dataclass

import cuda.tile as ct
from cuda.tile import compilation as ctc

from ._launch import constant_args, kernel_for
from ._problem import Problem
from ._schedule import Schedule
from .errors import CompileError

__all__ = ["ARCHITECTURES", "CompileResult", "compile_schedule", "check_arch"]

#: Architectures tileiras accepts (``--gpu-name``); no ``a``/``f`` suffixes.
ARCHITECTURES = ("sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_103",
                 "sm_107", "sm_110", "sm_120", "sm_121")

_CT_DTYPES = {"bf16": ct.bfloat16, "fp16": ct.float16}


def check_arch(arch: object) -> str:
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d{2,3}", arch):
        raise ValueError(f"arch must look like 'sm_90'; got {arch!r}")
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}; got {arch!r}")
    return arch


@dataclass(frozen=True)
class CompileResult:
    arch: str
    cubin_size: int
    seconds: float
    cubin: bytes
    shared_bytes: int | None  # static shared memory of the kernel (None: not in the cubin)


def cubin_shared_bytes(cubin: bytes) -> int | None:
    """Static shared memory of the kernel: the size of the cubin's ``.nv.shared.<kernel>`` ELF
    section. (Register counts and spills need cuobjdump, which the pip toolchain lacks.)"""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        return None
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQII", cubin, shoff + i * shentsize)
                for i in range(shnum)]
    names_at = sections[shstrndx][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return cubin[start:cubin.index(b"\0", start)].decode(errors="replace")

    for sh_name, _, _, _, _, size, _, _ in sections:
        label = name(sh_name)
        if label.startswith(".nv.shared.") and not label.startswith(".nv.shared.reserved"):
            return size
    return None


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
    """Compile ``schedule`` for ``problem`` into a cubin for ``arch``; raise :class:`CompileError`."""
    check_arch(arch)
    p = problem
    q_like = _array(p.dtype, (p.batch, p.heads_q, p.seqlen_q, p.head_dim))
    kv_like = _array(p.dtype, (p.batch, p.heads_kv, p.seqlen_k, p.head_dim))
    signature = ctc.KernelSignature(
        [q_like, kv_like, kv_like, q_like, ctc.ScalarConstraint(ct.float32),
         ctc.ScalarConstraint(ct.int32),
         ctc.ScalarConstraint(ct.int32), *constant_args(problem, schedule)],
        calling_convention=ctc.CallingConvention.cutile_python_v1(),
    )
    buf = io.BytesIO()
    start = time.perf_counter()
    try:
        ctc.export_kernel(kernel_for(schedule), [signature], buf, gpu_code=arch,
                          output_format="cubin")
    except Exception as exc:  # tileiras failures come as several exception types
        message = str(exc).strip().splitlines()
        raise CompileError(
            f"{schedule.describe()} does not compile for {arch}: "
            f"{type(exc).__name__}: {message[-1] if message else ''}"[:2000]
        ) from exc
    cubin = buf.getvalue()
    return CompileResult(arch=arch, cubin_size=len(cubin), seconds=time.perf_counter() - start,
                         cubin=cubin, shared_bytes=cubin_shared_bytes(cubin))
