"""From a (Problem, BackwardSchedule) pair to the launches of the backward kernels.

``launches`` builds what a call needs besides the arrays (hinted kernel objects, grids, constant
arguments) once per plan; ``launch`` enqueues them on one stream:

- by default, the dQ kernel (it writes the row sums ``delta`` the dK/dV kernel reads), then
  the dK/dV kernel;
- with ``dq_atomic``, ``attention_bwd_prep`` (``delta``, a zeroed float32 dQ accumulator), the
  dK/dV kernel (which also adds into the accumulator), and ``attention_bwd_sum`` (dQ =
  scale x accumulator, cast);
- with ``dkdv_splits > 1`` the dK/dV kernel writes float32 partials and ``attention_bwd_sum``
  adds them into dK and into dV.

``scratch_shapes`` gives the float32 buffers the last two need (the caller allocates them).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from .._lazy import lazy_module
from .._signature import KernelParameters
from .._problem import Problem, padded_head_dim, row_stat_shape
from ._schedule import SPLITS, BackwardSchedule

ct = lazy_module("cuda.tile", globals(), "ct")
_kernels = lazy_module(f"{__package__}._kernel", globals(), "_kernels")

__all__ = ["DQ_PARAMETERS", "DKDV_PARAMETERS", "PREP_PARAMETERS", "SUM_PARAMETERS",
           "dq_constants", "dkdv_constants", "prep_constants", "sum_constants", "dq_kernel",
           "dkdv_kernel", "helper_kernel", "Launches", "launches", "launch", "row_stat_shape",
           "normalise", "scratch_shapes", "SUM_TILE"]

_MODULE = f"{__package__}._kernel"
DQ_PARAMETERS = KernelParameters(
    (_MODULE, "attention_bwd_dq"),
    ("Q", "K", "V", "Out", "dO", "Lse", "Delta", "dQ", "qk_scale", "heads_q", "group"))
DKDV_PARAMETERS = KernelParameters(
    (_MODULE, "attention_bwd_dkdv"),
    ("Q", "K", "V", "dO", "Lse", "Delta", "dK", "dV", "dQacc", "qk_scale", "heads_kv",
     "group"))
PREP_PARAMETERS = KernelParameters((_MODULE, "attention_bwd_prep"),
                                   ("Out", "dO", "Delta", "dQacc", "heads_q"))
SUM_PARAMETERS = KernelParameters((_MODULE, "attention_bwd_sum"), ("Parts", "Grad", "factor"))

#: rows per CTA of the prep and sum kernels (memory-bound: one [64, D] float32 tile a step)
SUM_TILE = 64


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def normalise(problem: Problem, schedule: BackwardSchedule) -> BackwardSchedule:
    """``schedule`` with tiles no larger than the problem needs (a query tile past the next
    power of two of ``S_q``, a key tile past ``S_k``'s, computes only padding), no more dK/dV
    splits than a key tile has (query head, query tile) pairs, and, with ``dq_atomic``, the
    unused dQ kernel's fields at their defaults. Idempotent."""
    q_cap = max(16, 1 << (problem.seqlen_q - 1).bit_length())
    k_cap = max(16, 1 << (problem.seqlen_k - 1).bit_length())
    changes: dict[str, Any] = {
        name: cap for name, cap in (("dkdv_tile_m", q_cap), ("dq_tile_m", q_cap),
                                    ("dkdv_tile_n", k_cap), ("dq_tile_n", k_cap))
        if getattr(schedule, name) > cap}
    tile_m = min(schedule.dkdv_tile_m, q_cap)
    pairs = problem.group_size * math.ceil(problem.seqlen_q / tile_m)
    splits = min(schedule.dkdv_splits, _pow2_floor(pairs), SPLITS[-1])
    if splits != schedule.dkdv_splits:
        changes["dkdv_splits"] = splits
    if schedule.dq_atomic:
        base = BackwardSchedule()
        changes.update({name: getattr(base, name) for name in DQ_FIELDS
                        if getattr(schedule, name) != getattr(base, name)})
    return schedule.replace(**changes) if changes else schedule


#: the fields only the dQ kernel reads (unused with ``dq_atomic``)
DQ_FIELDS = ("dq_tile_m", "dq_tile_n", "dq_occupancy", "dq_worker_warps", "kv_latency")


def dq_constants(problem: Problem, schedule: BackwardSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_dq`` by name."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dq_tile_m, "TILE_N": s.dq_tile_n,
            "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "KV_LATENCY": s.kv_latency or 0}


def dkdv_constants(problem: Problem, schedule: BackwardSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_dkdv`` by name."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dkdv_tile_m, "TILE_N": s.dkdv_tile_n,
            "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "Q_LATENCY": s.q_latency or 0,
            "SPLITS": s.dkdv_splits, "DQ_ATOMIC": s.dq_atomic}


def prep_constants(problem: Problem) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_prep`` by name."""
    return {"TILE_M": SUM_TILE, "TILE_D": padded_head_dim(problem.head_dim)}


def sum_constants(problem: Problem, parts: int) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_sum`` adding ``parts`` partials."""
    return {"PARTS": parts, "TILE": SUM_TILE, "TILE_D": padded_head_dim(problem.head_dim)}


@functools.lru_cache(maxsize=None)
def _hinted(kernel: ct.kernel, occupancy: int, num_worker_warps: int | None) -> ct.kernel:
    """Cached: each kernel object owns a JIT cache, so a new one per launch would recompile."""
    return kernel.replace_hints(occupancy=occupancy, num_worker_warps=num_worker_warps)


def dq_kernel(schedule: BackwardSchedule) -> ct.kernel:
    return _hinted(_kernels.attention_bwd_dq, schedule.dq_occupancy, schedule.dq_worker_warps)


def dkdv_kernel(schedule: BackwardSchedule) -> ct.kernel:
    return _hinted(_kernels.attention_bwd_dkdv, schedule.dkdv_occupancy, schedule.dkdv_worker_warps)


def helper_kernel(name: str) -> ct.kernel:
    """``attention_bwd_prep`` or ``attention_bwd_sum`` (memory-bound: the compiler's hints)."""
    return getattr(_kernels, f"attention_bwd_{name}")


def scratch_shapes(problem: Problem, schedule: BackwardSchedule) -> dict[str, tuple[int, ...]]:
    """The float32 buffers ``launch`` needs besides the gradients, by name: ``"dq_acc"``
    (``[B, H_q, S_q, D]``) with ``dq_atomic``; ``"dk_parts"`` and ``"dv_parts"``
    (``[splits * B, H_kv, S_k, D]``) with ``dkdv_splits > 1``."""
    s = normalise(problem, schedule)
    p = problem
    shapes: dict[str, tuple[int, ...]] = {}
    if s.dq_atomic:
        shapes["dq_acc"] = (p.batch, p.heads_q, p.seqlen_q, p.head_dim)
    if s.dkdv_splits > 1:
        parts = (s.dkdv_splits * p.batch, p.heads_kv, p.seqlen_k, p.head_dim)
        shapes.update(dk_parts=parts, dv_parts=parts)
    return shapes


class Launches(NamedTuple):
    """What one backward call launches, less the arrays: built once per plan."""

    schedule: BackwardSchedule  # normalised
    dq_grid: tuple[int, int, int]  # the dQ kernel's, or the prep kernel's with dq_atomic
    dkdv_grid: tuple[int, int, int]
    dq_sum_grid: tuple[int, int, int]  # the sum kernel's over dQ / over dK and dV
    kv_sum_grid: tuple[int, int, int]
    dq: Any  # the dQ kernel, or the prep kernel with dq_atomic
    dkdv: Any
    dq_scalars: tuple  # the dQ (prep) kernel's arguments after the arrays
    dkdv_scalars: tuple  # the arguments after dQacc: qk_scale, heads_kv, group, the constants
    dq_sum_scalars: tuple  # the sum kernel's arguments after the arrays, for dQ
    kv_sum_scalars: tuple  # for dK and dV
    scale: float
    stat_shape: tuple[int, int, int]


def launches(problem: Problem, schedule: BackwardSchedule, scale: float) -> Launches:
    """The kernel objects, grids and constants of ``normalise(problem, schedule)``."""
    s = normalise(problem, schedule)
    p = problem
    q_rows = (math.ceil(p.seqlen_q / SUM_TILE), p.batch * p.heads_q, 1)
    if s.dq_atomic:
        dq_grid, dq = q_rows, helper_kernel("prep")
        dq_scalars = PREP_PARAMETERS.ordered(
            {"Out": None, "dO": None, "Delta": None, "dQacc": None, "heads_q": p.heads_q},
            prep_constants(p))[4:]
    else:
        dq_grid, dq = (math.ceil(p.seqlen_q / s.dq_tile_m), p.batch * p.heads_q, 1), dq_kernel(s)
        dq_scalars = DQ_PARAMETERS.ordered(
            {"Q": None, "K": None, "V": None, "Out": None, "dO": None, "Lse": None,
             "Delta": None, "dQ": None, "qk_scale": scale, "heads_q": p.heads_q,
             "group": p.group_size}, dq_constants(p, s))[8:]
    no_arrays = {"Parts": None, "Grad": None}
    return Launches(
        schedule=s,
        dq_grid=dq_grid,
        dkdv_grid=(math.ceil(p.seqlen_k / s.dkdv_tile_n), p.batch * p.heads_kv, s.dkdv_splits),
        dq_sum_grid=q_rows,
        kv_sum_grid=(math.ceil(p.seqlen_k / SUM_TILE), p.batch * p.heads_kv, 1),
        dq=dq, dkdv=dkdv_kernel(s), dq_scalars=dq_scalars,
        dkdv_scalars=DKDV_PARAMETERS.ordered(
            {"Q": None, "K": None, "V": None, "dO": None, "Lse": None, "Delta": None,
             "dK": None, "dV": None, "dQacc": None, "qk_scale": scale,
             "heads_kv": p.heads_kv, "group": p.group_size}, dkdv_constants(p, s))[9:],
        dq_sum_scalars=SUM_PARAMETERS.ordered({**no_arrays, "factor": float(scale)},
                                              sum_constants(p, 1))[2:],
        kv_sum_scalars=SUM_PARAMETERS.ordered({**no_arrays, "factor": 1.0},
                                              sum_constants(p, s.dkdv_splits))[2:],
        scale=float(scale), stat_shape=row_stat_shape(p))


def launch(stream: Any, plan: Launches, q: Any, k: Any, v: Any, out: Any, grad_out: Any,
           lse: Any, delta: Any, dq: Any, dk: Any, dv: Any,
           scratch: dict[str, Any] | None = None) -> None:
    """Enqueue the plan's kernels on ``stream``. ``lse`` and ``delta`` are ``[B, H_q, S_q]``
    float32 views (``delta`` is written here); ``dq, dk, dv`` are preallocated like ``q, k,
    v``; ``scratch`` holds float32 buffers of :func:`scratch_shapes` by name."""
    s = plan.schedule
    scratch = scratch or {}
    sum_kernel = helper_kernel("sum")
    if s.dq_atomic:
        dq_acc = scratch["dq_acc"]
        ct.launch(stream, plan.dq_grid, plan.dq, (out, grad_out, delta, dq_acc, *plan.dq_scalars))
    else:
        dq_acc = dq  # not read: the kernel's DQ_ATOMIC is off
        ct.launch(stream, plan.dq_grid, plan.dq,
                  (q, k, v, out, grad_out, lse, delta, dq, *plan.dq_scalars))
    dk_out, dv_out = ((scratch["dk_parts"], scratch["dv_parts"]) if s.dkdv_splits > 1
                      else (dk, dv))
    ct.launch(stream, plan.dkdv_grid, plan.dkdv,
              (q, k, v, grad_out, lse, delta, dk_out, dv_out, dq_acc, *plan.dkdv_scalars))
    if s.dq_atomic:
        ct.launch(stream, plan.dq_sum_grid, sum_kernel, (dq_acc, dq, *plan.dq_sum_scalars))
    if s.dkdv_splits > 1:
        for parts, grad in ((dk_out, dk), (dv_out, dv)):
            ct.launch(stream, plan.kv_sum_grid, sum_kernel, (parts, grad, *plan.kv_sum_scalars))
