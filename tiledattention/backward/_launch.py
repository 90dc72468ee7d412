"""From a (Problem, BackwardSchedule) pair to the launches of the backward kernels.

``launches`` builds what a call needs besides the arrays (hinted kernel objects, grids, constant
arguments) once per plan; ``launch`` enqueues them on one stream: the dQ kernel (it writes the
row sums ``delta`` the dK/dV kernel reads), then the dK/dV kernel, and with ``dkdv_splits > 1``
the sum kernel adding the dK/dV kernel's float32 partials (``scratch_shapes``: the caller
allocates them) into dK and into dV.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from .._lazy import lazy_module
from .._signature import KernelParameters
from .._problem import INDEX_LIMIT, Problem, padded_head_dim, row_stat_shape
from ._schedule import SPLITS, BackwardSchedule

ct = lazy_module("cuda.tile", globals(), "ct")
_kernels = lazy_module(f"{__package__}._kernel", globals(), "_kernels")

__all__ = ["DQ_PARAMETERS", "DKDV_PARAMETERS", "SUM_PARAMETERS", "dq_constants",
           "dkdv_constants", "sum_constants", "dq_kernel", "dkdv_kernel", "sum_kernel",
           "Launches", "launches", "launch", "row_stat_shape", "normalise", "scratch_shapes",
           "SUM_TILE"]

_MODULE = f"{__package__}._kernel"
DQ_PARAMETERS = KernelParameters(
    (_MODULE, "attention_bwd_dq"),
    ("Q", "K", "V", "Out", "dO", "Lse", "Delta", "dQ", "qk_scale", "heads_q", "group"))
DKDV_PARAMETERS = KernelParameters(
    (_MODULE, "attention_bwd_dkdv"),
    ("Q", "K", "V", "dO", "Lse", "Delta", "dK", "dV", "qk_scale", "heads_kv", "group"))
SUM_PARAMETERS = KernelParameters((_MODULE, "attention_bwd_sum"), ("Parts", "Grad"))

#: rows per CTA of the sum kernel (memory-bound: one [64, D] float32 tile a step)
SUM_TILE = 64
#: CUDA's limit on a grid's second dimension, where tile-major grids put the tiles
GRID_Y_LIMIT = 65535


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def normalise(problem: Problem, schedule: BackwardSchedule) -> BackwardSchedule:
    """``schedule`` with tiles no larger than the problem needs (a query tile past the next
    power of two of ``S_q``, a key tile past ``S_k``'s, computes only padding), no more dK/dV
    splits than a key tile has (query head, query tile) pairs or than keep the float32
    partials indexable with int32, no causal work order (dQ heavy
    first, tile-major grids) on a problem without a causal mask, and no tile-major grid with
    more tiles than a grid's second dimension takes. Idempotent."""
    q_cap = max(16, 1 << (problem.seqlen_q - 1).bit_length())
    k_cap = max(16, 1 << (problem.seqlen_k - 1).bit_length())
    changes: dict[str, Any] = {
        name: cap for name, cap in (("dkdv_tile_m", q_cap), ("dq_tile_m", q_cap),
                                    ("dkdv_tile_n", k_cap), ("dq_tile_n", k_cap))
        if getattr(schedule, name) > cap}
    tile_m = min(schedule.dkdv_tile_m, q_cap)
    pairs = problem.group_size * math.ceil(problem.seqlen_q / tile_m)
    splits = min(schedule.dkdv_splits, _pow2_floor(pairs), SPLITS[-1])
    kv_elements = (problem.batch * problem.heads_kv * problem.seqlen_k
                   * padded_head_dim(problem.head_dim))
    while splits > 1 and splits * kv_elements > INDEX_LIMIT:  # the partials index with int32
        splits //= 2
    if splits != schedule.dkdv_splits:
        changes["dkdv_splits"] = splits
    for name in ("dq_heavy_first", "tile_major"):
        if getattr(schedule, name) and not problem.causal:
            changes[name] = False
    if schedule.tile_major and max(math.ceil(problem.seqlen_q / min(schedule.dq_tile_m, q_cap)),
                                   math.ceil(problem.seqlen_k / min(schedule.dkdv_tile_n, k_cap))
                                   ) > GRID_Y_LIMIT:
        changes["tile_major"] = False  # the tiles would not fit the grid's second dimension
    return schedule.replace(**changes) if changes else schedule


def dq_constants(problem: Problem, schedule: BackwardSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_dq`` by name."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dq_tile_m, "TILE_N": s.dq_tile_n,
            "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "KV_LATENCY": s.kv_latency or 0,
            "HEAVY_FIRST": s.dq_heavy_first, "TILE_MAJOR": s.tile_major}


def dkdv_constants(problem: Problem, schedule: BackwardSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_dkdv`` by name."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dkdv_tile_m, "TILE_N": s.dkdv_tile_n,
            "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "Q_LATENCY": s.q_latency or 0,
            "SPLITS": s.dkdv_splits, "TILE_MAJOR": s.tile_major}


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


def sum_kernel() -> ct.kernel:
    """``attention_bwd_sum`` (memory-bound: the compiler's hints)."""
    return _kernels.attention_bwd_sum


def scratch_shapes(problem: Problem, schedule: BackwardSchedule) -> dict[str, tuple[int, ...]]:
    """The float32 buffers ``launch`` needs besides the gradients, by name: with
    ``dkdv_splits > 1``, ``"dk_parts"`` and ``"dv_parts"`` (``[splits * B, H_kv, S_k, D]``);
    else none."""
    s = normalise(problem, schedule)
    if s.dkdv_splits == 1:
        return {}
    parts = (s.dkdv_splits * problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim)
    return {"dk_parts": parts, "dv_parts": parts}


class Launches(NamedTuple):
    """What one backward call launches, less the arrays: built once per plan."""

    splits: int  # the dK/dV kernel's (normalised)
    dq_grid: tuple[int, int, int]
    dkdv_grid: tuple[int, int, int]
    sum_grid: tuple[int, int, int]  # the partials' sum, over dK and over dV
    dq: Any
    dkdv: Any
    dq_scalars: tuple  # the arguments after the arrays: qk_scale, heads_q, group, constants
    dkdv_scalars: tuple  # the arguments after the arrays: qk_scale, heads_kv, group, constants
    sum_scalars: tuple  # the sum kernel's constants
    stat_shape: tuple[int, int, int]
    scratch: dict[str, tuple[int, ...]]  # the float32 buffers launch needs (scratch_shapes)


def _grid(tile_major: bool, tiles: int, heads: int, splits: int) -> tuple[int, int, int]:
    """(tiles, heads, splits), or tile-major (heads x splits, tiles, 1) (the kernels' bids)."""
    return (heads * splits, tiles, 1) if tile_major else (tiles, heads, splits)


@functools.lru_cache(maxsize=256)
def launches(problem: Problem, schedule: BackwardSchedule, scale: float) -> Launches:
    """The kernel objects, grids, constants and scratch shapes of ``normalise(problem,
    schedule)``. Cached: a training loop asks for the same few problems every step."""
    s = normalise(problem, schedule)
    p = problem
    return Launches(
        splits=s.dkdv_splits,
        dq_grid=_grid(s.tile_major, math.ceil(p.seqlen_q / s.dq_tile_m), p.batch * p.heads_q, 1),
        dkdv_grid=_grid(s.tile_major, math.ceil(p.seqlen_k / s.dkdv_tile_n),
                        p.batch * p.heads_kv, s.dkdv_splits),
        sum_grid=(math.ceil(p.seqlen_k / SUM_TILE), p.batch * p.heads_kv, 1),
        dq=dq_kernel(s), dkdv=dkdv_kernel(s),
        dq_scalars=DQ_PARAMETERS.ordered(
            {"Q": None, "K": None, "V": None, "Out": None, "dO": None, "Lse": None,
             "Delta": None, "dQ": None, "qk_scale": float(scale), "heads_q": p.heads_q,
             "group": p.group_size}, dq_constants(p, s))[8:],
        dkdv_scalars=DKDV_PARAMETERS.ordered(
            {"Q": None, "K": None, "V": None, "dO": None, "Lse": None, "Delta": None,
             "dK": None, "dV": None, "qk_scale": float(scale), "heads_kv": p.heads_kv,
             "group": p.group_size}, dkdv_constants(p, s))[8:],
        sum_scalars=SUM_PARAMETERS.constant_values(sum_constants(p, s.dkdv_splits)),
        stat_shape=row_stat_shape(p), scratch=scratch_shapes(p, s))


def launch(stream: Any, plan: Launches, q: Any, k: Any, v: Any, out: Any, grad_out: Any,
           lse: Any, delta: Any, dq: Any, dk: Any, dv: Any,
           scratch: dict[str, Any] | None = None) -> None:
    """Enqueue the plan's kernels on ``stream``. ``lse`` and ``delta`` are ``[B, H_q, S_q]``
    float32 views (``delta`` is written here); ``dq, dk, dv`` are preallocated like ``q, k,
    v``; ``scratch`` holds the float32 buffers of ``plan.scratch`` by name."""
    ct.launch(stream, plan.dq_grid, plan.dq,
              (q, k, v, out, grad_out, lse, delta, dq, *plan.dq_scalars))
    if plan.splits == 1:
        ct.launch(stream, plan.dkdv_grid, plan.dkdv,
                  (q, k, v, grad_out, lse, delta, dk, dv, *plan.dkdv_scalars))
        return
    dk_parts, dv_parts = scratch["dk_parts"], scratch["dv_parts"]
    ct.launch(stream, plan.dkdv_grid, plan.dkdv,
              (q, k, v, grad_out, lse, delta, dk_parts, dv_parts, *plan.dkdv_scalars))
    for parts, grad in ((dk_parts, dk), (dv_parts, dv)):
        ct.launch(stream, plan.sum_grid, sum_kernel(), (parts, grad, *plan.sum_scalars))
