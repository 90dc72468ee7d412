"""From a (Problem, BackwardSchedule) pair to the launches of the backward kernels.

``launches`` builds what a call needs besides the arrays (hinted kernel objects, grids, constant
arguments) once per plan; ``launch`` enqueues them on one stream: the dQ kernel (it writes the
row sums ``delta`` the dK/dV kernel reads), then the dK/dV kernel, and with ``dkdv_splits > 1``
the sum kernel adding the dK/dV kernel's float32 partials (``scratch_shapes``: the caller
allocates them) into dK and into dV. A problem with a window or a softcap runs the ``*_variant``
dQ and dK/dV kernels, which take the variants' launch-time values after the others
(``VARIANT_VALUES``); plain problems, and problems whose only variant is sinks, run the plain
kernels, whose parameters (and machine code) are those of before the variants.
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

__all__ = ["DQ_PARAMETERS", "DKDV_PARAMETERS", "DQ_VARIANT_PARAMETERS",
           "DKDV_VARIANT_PARAMETERS", "SUM_PARAMETERS", "VARIANT_VALUES", "dq_parameters",
           "dkdv_parameters", "dq_constants", "dkdv_constants", "sum_constants", "dq_kernel",
           "dkdv_kernel", "sum_kernel", "Launches", "launches", "launch", "row_stat_shape",
           "normalise", "scratch_shapes", "SUM_TILE", "uses_variant_kernels", "runtime_values",
           "unequal_walks", "dkdv_walk", "dq_walk", "reach"]

_MODULE = f"{__package__}._kernel"
_DQ_RUNTIME = ("Q", "K", "V", "Out", "dO", "Lse", "Delta", "dQ", "qk_scale", "heads_q", "group")
_DKDV_RUNTIME = ("Q", "K", "V", "dO", "Lse", "Delta", "dK", "dV", "qk_scale", "heads_kv",
                 "group")
#: the launch-time values of the variant kernels (a window, a softcap), after the others: the
#: window's sides (-1: unbounded) and the softcap (0: none), passed whether or not used
VARIANT_VALUES = ("window_left", "window_right", "softcap")
DQ_PARAMETERS = KernelParameters((_MODULE, "attention_bwd_dq"), _DQ_RUNTIME)
DKDV_PARAMETERS = KernelParameters((_MODULE, "attention_bwd_dkdv"), _DKDV_RUNTIME)
DQ_VARIANT_PARAMETERS = KernelParameters((_MODULE, "attention_bwd_dq_variant"),
                                         (*_DQ_RUNTIME, *VARIANT_VALUES))
DKDV_VARIANT_PARAMETERS = KernelParameters((_MODULE, "attention_bwd_dkdv_variant"),
                                           (*_DKDV_RUNTIME, *VARIANT_VALUES))
SUM_PARAMETERS = KernelParameters((_MODULE, "attention_bwd_sum"), ("Parts", "Grad"))

#: rows per CTA of the sum kernel (memory-bound: one [64, D] float32 tile a step)
SUM_TILE = 64
#: CUDA's limit on a grid's second dimension, where tile-major grids put the tiles
GRID_Y_LIMIT = 65535


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def uses_variant_kernels(problem: Problem) -> bool:
    """Whether ``problem`` runs the ``*_variant`` kernels: with a window or a softcap. (Sinks
    change no backward kernel: the forward's log-sum-exp holds them.)"""
    return problem.windowed or problem.softcap > 0


def dq_parameters(problem: Problem) -> KernelParameters:
    """The parameters of the dQ kernel ``problem`` runs."""
    return DQ_VARIANT_PARAMETERS if uses_variant_kernels(problem) else DQ_PARAMETERS


def dkdv_parameters(problem: Problem) -> KernelParameters:
    """The parameters of the dK/dV kernel ``problem`` runs."""
    return DKDV_VARIANT_PARAMETERS if uses_variant_kernels(problem) else DKDV_PARAMETERS


def runtime_values(problem: Problem) -> dict[str, Any]:
    """The launch-time values after ``group`` by name: the variant kernels' ``VARIANT_VALUES``,
    none for the plain ones."""
    if not uses_variant_kernels(problem):
        return {}
    return {"window_left": problem.window_left, "window_right": problem.window_right,
            "softcap": float(problem.softcap)}


def _variant_constants(problem: Problem) -> dict[str, Any]:
    """``WINDOW`` and ``SOFTCAP`` for the variant kernels; nothing for the plain ones."""
    if not uses_variant_kernels(problem):
        return {}
    return {"WINDOW": problem.windowed, "SOFTCAP": problem.softcap > 0}


def reach(problem: Problem) -> tuple[int, int]:
    """``(left, right)``: row ``i`` sees keys ``i + off - left .. i + off + right``; an
    unbounded side reaches ``S_q + S_k`` (the kernels' ``window_reach``)."""
    unbounded = problem.seqlen_q + problem.seqlen_k
    left = problem.window_left if problem.window_left >= 0 else unbounded
    right = 0 if problem.causal else (
        problem.window_right if problem.window_right >= 0 else unbounded)
    return left, right


def _longest_walk(span: int, shift: int, tile: int, step: int, steps: int) -> int:
    """The most tiles of ``step`` positions (at most ``steps``) that a band of ``span + tile -
    1`` positions may touch when it starts at ``shift`` plus a multiple of ``tile`` (both tile
    sizes powers of two): its phase within a ``step`` tile is ``shift``'s with ``tile >=
    step``, else any of those a multiple of ``tile`` apart; the worst one is taken."""
    if span >= steps * step:
        return steps
    unit = min(tile, step)
    worst_phase = shift % unit + step - unit
    return min(steps, (worst_phase + span + tile - 2) // step + 1)


def dkdv_walk(problem: Problem, tile_n: int, tile_m: int) -> int:
    """The most query tiles (of ``tile_m`` rows) any key tile (of ``tile_n`` keys) of the
    dK/dV kernel walks: every one without a window, fewer with one (key ``k`` is seen by rows
    ``k - off - right .. k - off + left``)."""
    left, right = reach(problem)
    return _longest_walk(left + right + 1, -problem.causal_offset - right, tile_n, tile_m,
                         math.ceil(problem.seqlen_q / tile_m))


def dq_walk(problem: Problem, tile_m: int, tile_n: int) -> int:
    """The most key tiles (of ``tile_n`` keys) any query tile (of ``tile_m`` rows) of the dQ
    kernel walks: every one without a mask, fewer with a window (row ``i`` sees keys ``i + off
    - left .. i + off + right``)."""
    left, right = reach(problem)
    return _longest_walk(left + right + 1, problem.causal_offset - left, tile_m, tile_n,
                         math.ceil(problem.seqlen_k / tile_n))


def unequal_walks(problem: Problem) -> bool:
    """Whether the walks of the kernels' CTAs differ in length across the sequence (not just
    at its ends), so that the work orders (dQ heavy first, tile-major grids) can matter: with
    the causal mask, or a window bounded on one side only."""
    return problem.causal or (problem.window_left < 0) != (problem.window_right < 0)


def normalise(problem: Problem, schedule: BackwardSchedule) -> BackwardSchedule:
    """``schedule`` with tiles no larger than the problem needs (a query tile past the next
    power of two of ``S_q``, a key tile past ``S_k``'s, computes only padding), no more dK/dV
    splits than a key tile's longest walk has (query head, query tile) pairs (``dkdv_walk``:
    the window shortens it) or than keep the float32 partials indexable with int32, no work
    order (dQ heavy first, tile-major grids) on a problem whose walks are all alike
    (``unequal_walks``), and no tile-major grid with more tiles than a grid's second
    dimension takes. Idempotent."""
    q_cap = max(16, 1 << (problem.seqlen_q - 1).bit_length())
    k_cap = max(16, 1 << (problem.seqlen_k - 1).bit_length())
    changes: dict[str, Any] = {
        name: cap for name, cap in (("dkdv_tile_m", q_cap), ("dq_tile_m", q_cap),
                                    ("dkdv_tile_n", k_cap), ("dq_tile_n", k_cap))
        if getattr(schedule, name) > cap}
    tile_m = min(schedule.dkdv_tile_m, q_cap)
    pairs = problem.group_size * dkdv_walk(problem, min(schedule.dkdv_tile_n, k_cap), tile_m)
    splits = min(schedule.dkdv_splits, _pow2_floor(pairs), SPLITS[-1])
    kv_elements = (problem.batch * problem.heads_kv * problem.seqlen_k
                   * padded_head_dim(problem.head_dim))
    while splits > 1 and splits * kv_elements > INDEX_LIMIT:  # the partials index with int32
        splits //= 2
    if splits != schedule.dkdv_splits:
        changes["dkdv_splits"] = splits
    for name in ("dq_heavy_first", "tile_major"):
        if getattr(schedule, name) and not unequal_walks(problem):
            changes[name] = False
    if schedule.tile_major and max(math.ceil(problem.seqlen_q / min(schedule.dq_tile_m, q_cap)),
                                   math.ceil(problem.seqlen_k / min(schedule.dkdv_tile_n, k_cap))
                                   ) > GRID_Y_LIMIT:
        changes["tile_major"] = False  # the tiles would not fit the grid's second dimension
    return schedule.replace(**changes) if changes else schedule


def dq_constants(problem: Problem, schedule: BackwardSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of the dQ kernel ``problem`` runs by name."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dq_tile_m, "TILE_N": s.dq_tile_n,
            "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "KV_LATENCY": s.kv_latency or 0,
            "HEAVY_FIRST": s.dq_heavy_first, "TILE_MAJOR": s.tile_major,
            **_variant_constants(problem)}


def dkdv_constants(problem: Problem, schedule: BackwardSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of the dK/dV kernel ``problem`` runs by name."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dkdv_tile_m, "TILE_N": s.dkdv_tile_n,
            "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "Q_LATENCY": s.q_latency or 0,
            "SPLITS": s.dkdv_splits, "TILE_MAJOR": s.tile_major,
            **_variant_constants(problem)}


def sum_constants(problem: Problem, parts: int) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_sum`` adding ``parts`` partials."""
    return {"PARTS": parts, "TILE": SUM_TILE, "TILE_D": padded_head_dim(problem.head_dim)}


@functools.lru_cache(maxsize=None)
def _hinted(kernel: ct.kernel, occupancy: int, num_worker_warps: int | None) -> ct.kernel:
    """Cached: each kernel object owns a JIT cache, so a new one per launch would recompile."""
    return kernel.replace_hints(occupancy=occupancy, num_worker_warps=num_worker_warps)


def dq_kernel(schedule: BackwardSchedule, variant: bool = False) -> ct.kernel:
    """The dQ kernel (``variant``: ``attention_bwd_dq_variant``) with the schedule's hints."""
    kernel = _kernels.attention_bwd_dq_variant if variant else _kernels.attention_bwd_dq
    return _hinted(kernel, schedule.dq_occupancy, schedule.dq_worker_warps)


def dkdv_kernel(schedule: BackwardSchedule, variant: bool = False) -> ct.kernel:
    """The dK/dV kernel (``variant``: ``attention_bwd_dkdv_variant``) with the schedule's
    hints."""
    kernel = _kernels.attention_bwd_dkdv_variant if variant else _kernels.attention_bwd_dkdv
    return _hinted(kernel, schedule.dkdv_occupancy, schedule.dkdv_worker_warps)


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
    dq_scalars: tuple  # the arguments after the arrays: qk_scale, heads_q, group, (variant
    # kernels) VARIANT_VALUES, constants
    dkdv_scalars: tuple  # the arguments after the arrays: qk_scale, heads_kv, group, (variant
    # kernels) VARIANT_VALUES, constants
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
    variant = uses_variant_kernels(p)
    return Launches(
        splits=s.dkdv_splits,
        dq_grid=_grid(s.tile_major, math.ceil(p.seqlen_q / s.dq_tile_m), p.batch * p.heads_q, 1),
        dkdv_grid=_grid(s.tile_major, math.ceil(p.seqlen_k / s.dkdv_tile_n),
                        p.batch * p.heads_kv, s.dkdv_splits),
        sum_grid=(math.ceil(p.seqlen_k / SUM_TILE), p.batch * p.heads_kv, 1),
        dq=dq_kernel(s, variant), dkdv=dkdv_kernel(s, variant),
        dq_scalars=dq_parameters(p).ordered(
            {"Q": None, "K": None, "V": None, "Out": None, "dO": None, "Lse": None,
             "Delta": None, "dQ": None, "qk_scale": float(scale), "heads_q": p.heads_q,
             "group": p.group_size, **runtime_values(p)}, dq_constants(p, s))[8:],
        dkdv_scalars=dkdv_parameters(p).ordered(
            {"Q": None, "K": None, "V": None, "dO": None, "Lse": None, "Delta": None,
             "dK": None, "dV": None, "qk_scale": float(scale), "heads_kv": p.heads_kv,
             "group": p.group_size, **runtime_values(p)}, dkdv_constants(p, s))[8:],
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
