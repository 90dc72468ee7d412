"""What every family's compile-only build shares: the architectures tileiras knows, and the result
of one build (its cubins, and what each kernel asks of an SM)."""

from __future__ import annotations

import contextlib
import contextvars
import io
import re
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ._cubin import KernelResources, kernel_resources, static_shared_bytes
from ._dtypes import element
from ._bundles import any_length
from ._problem import row_stat_shape
from ..errors import CompileError, InputValueError

__all__ = ["ARCHITECTURES", "SM_COUNTS", "CompileResult", "array_constraint", "check_arch",
           "capturing", "export_cubin", "generation",
           "attention_constraints", "row_stat_constraint"]

#: ``(builds, compile)`` of an active ``capturing()``, or None
_capture: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("capture", default=None)

#: Architectures tileiras accepts (``--gpu-name``; no ``a``/``f`` suffixes), and the GPU
#: generation each belongs to (defaults and search spaces differ by generation).
GENERATIONS = {
    "sm_80": "ampere", "sm_86": "ampere", "sm_87": "ampere", "sm_88": "ampere",
    "sm_89": "ada",
    "sm_90": "hopper",
    "sm_100": "blackwell", "sm_103": "blackwell", "sm_107": "blackwell", "sm_110": "blackwell",
    "sm_120": "blackwell-consumer", "sm_121": "blackwell-consumer",
}
ARCHITECTURES = tuple(GENERATIONS)
#: SMs of one part of each generation (a consumer Blackwell's: the DGX Spark's): what the
#: defaults size their grids for where the device's own count is not known (a compile-only
#: build, ``explain``); on a device the decode and backward defaults count its own.
SM_COUNTS = {"hopper": 132, "blackwell": 148, "blackwell-consumer": 48, "ada": 128,
             "ampere": 108}


def check_arch(arch: object) -> str:
    """``arch`` if tileiras knows it, else :class:`InputValueError` saying what it takes."""
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d{2,3}", arch):
        raise InputValueError(f"arch must look like 'sm_90'; got {arch!r}")
    if arch not in ARCHITECTURES:
        raise InputValueError(f"arch must be one of {', '.join(ARCHITECTURES)}; got {arch!r}")
    return arch


def generation(arch: str) -> str:
    """The GPU generation of ``arch``: ampere, ada, hopper, blackwell, blackwell-consumer."""
    return GENERATIONS[check_arch(arch)]


@dataclass(frozen=True)
class CompileResult:
    arch: str
    cubin_size: int
    seconds: float
    cubin: bytes
    shared_bytes: int | None  # static shared memory of the kernel (None: not in the cubin)
    #: the cubins of the schedule's other kernels (decode: the combine), so comparisons of
    #: compiled code (``tiledtune restamp``) see every kernel a schedule launches
    other_cubins: tuple[bytes, ...] = ()

    @property
    def cubins(self) -> tuple[bytes, ...]:
        """Every kernel's cubin, the main one (``cubin``) first."""
        return (self.cubin, *self.other_cubins)

    def resources(self) -> tuple[KernelResources, ...]:
        """What each kernel asks of an SM (``kernel_resources``), in ``cubins``' order."""
        return tuple(kernel_resources(c) for c in self.cubins)


@contextlib.contextmanager
def capturing(compile: bool = True) -> Iterator[list]:
    """Within it, :func:`export_cubin` (which compiles every array with no assumption on the
    lengths of its dimensions but the head dim and the dims of length 1, :func:`any_length`:
    a shipped cubin serves every sequence length, and every batch of the same batch pattern)
    appends ``(kernel, args, arch, cubin)`` of each build to the list it yields (``tiledtune
    aot``). With ``compile`` False nothing is compiled: each build is recorded
    with an empty cubin (which kernels, with which constants, a schedule launches)."""
    builds: list = []
    token = _capture.set((builds, compile))
    try:
        yield builds
    finally:
        _capture.reset(token)


def array_constraint(dtype: str, shape: Sequence[int], strides: Sequence[int] | None = None) -> Any:
    """An array as ``ct.launch`` sees a tensor of ``shape`` (``strides`` in elements, default
    contiguous) with 16-byte aligned rows: its JIT specialises on 16-byte divisible strides and
    base address, on each dim being a multiple of 16, on a stride of 1 and on a dim of length
    1 (a constant, under the ``cutile_python_v2`` calling convention). Matching that (then
    dropping the length assumptions on both sides, :func:`~._bundles.any_length`) makes the
    cubin's cache key equal to the launch's, so a compile-only build warms cuTile's disk cache
    for the real launch, and a shipped cubin's signature one the launch's implies."""
    import cuda.tile as ct
    from cuda.tile import compilation as ctc

    ndim = len(shape)
    if strides is None:
        strides = [1] * ndim
        for d in range(ndim - 2, -1, -1):
            strides[d] = strides[d + 1] * max(shape[d + 1], 1)
    elems_per_16_bytes = 16 // element(dtype).itemsize
    unit = tuple(1 if st == 1 else None for st in strides)
    return ctc.ArrayConstraint(
        getattr(ct, element(dtype).torch), ndim, index_dtype=ct.int32,
        stride_lower_bound_incl=tuple(None if u else 0 for u in unit),
        alias_groups=(), may_alias_internally=False, stride_constant=unit,
        shape_constant=tuple(1 if n == 1 else None for n in shape),
        stride_divisible_by=tuple(1 if u else elems_per_16_bytes if st % elems_per_16_bytes == 0
                                  else 1 for u, st in zip(unit, strides)),
        shape_divisible_by=tuple(16 if n % 16 == 0 else 1 for n in shape),
        base_addr_divisible_by=16,
    )


def attention_constraints(problem: Any, packed: bool) -> tuple[Any, Any]:
    """``(q_like, kv_like)``: the ``[B, H, S, D]`` arrays of ``problem`` as the launchers pass
    them (contiguous), or with ``packed`` the ``[1, H, tokens, D]`` views of a packed batch's
    ``[tokens, H, D]`` tensors."""
    p = problem
    if packed:
        return tuple(array_constraint(p.dtype, (1, h, p.batch * n, p.head_dim),
                                      (p.batch * n * h * p.head_dim, p.head_dim,
                                       h * p.head_dim, 1))
                     for h, n in ((p.heads_q, p.seqlen_q), (p.heads_kv, p.seqlen_k)))
    return (array_constraint(p.dtype, (p.batch, p.heads_q, p.seqlen_q, p.head_dim)),
            array_constraint(p.dtype, (p.batch, p.heads_kv, p.seqlen_k, p.head_dim)))


def row_stat_constraint(problem: Any, packed: bool) -> Any:
    """The float32 per-row statistic (log-sum-exp, delta) of ``problem`` as the launchers pass
    it: ``[B, H_q, S_q]`` views of row-aligned storage (``row_stat_shape``), or with ``packed``
    a ``[1, H_q, tokens]`` view of a packed batch's."""
    if packed:
        tokens = problem.batch * problem.seqlen_q
        return array_constraint("fp32", (1, problem.heads_q, tokens),
                                (problem.heads_q * tokens, tokens, 1))
    b, h, padded = row_stat_shape(problem)
    return array_constraint("fp32", (b, h, problem.seqlen_q), (h * padded, padded, 1))


def export_cubin(kernel: Any, args: Sequence[Any], arch: str, label: str) -> CompileResult:
    """Compile ``kernel`` for ``arch`` with ``args`` (per parameter, in order: an
    ``ArrayConstraint``, a ``ScalarConstraint`` or a constant's value; its arrays with no
    assumption on their lengths, :func:`~._bundles.any_length`, as a launch compiles them) into
    a cubin; raise :class:`CompileError` naming ``label`` when tileiras refuses."""
    from cuda.tile import compilation as ctc

    check_arch(arch)
    # as every launch's JIT compile is (``_aot.ShippedCompile.compile_length_free``): the same
    # cache key, so a compile-only build warms cuTile's disk cache for the launch
    args = [any_length(arg) for arg in args]
    captured, compiling = _capture.get() or (None, True)
    if captured is not None:
        if not compiling:
            captured.append((kernel, list(args), arch, b""))
            return CompileResult(arch=arch, cubin_size=0, seconds=0.0, cubin=b"",
                                 shared_bytes=None)
    from ._bundles import convention_of, param_specs

    convention = getattr(ctc.CallingConvention, convention_of(param_specs(kernel, args)))
    signature = ctc.KernelSignature(list(args), calling_convention=convention())
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
    if captured is not None:
        captured.append((kernel, list(args), arch, cubin))
    return CompileResult(arch=arch, cubin_size=len(cubin), seconds=time.perf_counter() - start,
                         cubin=cubin, shared_bytes=static_shared_bytes(cubin))
