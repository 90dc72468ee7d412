"""From a (Problem, DecodeSchedule) pair to the launches of the split and combine kernels.

Nothing here depends on ``S_k`` except the causal offset, a launch-time value: the constants,
the kernel objects and the grid of a schedule serve every cache length, so a decode loop whose
cache grows by one key per call keeps one plan (``_sdpa``). ``normalise`` gives every field that
cannot change the launches for a problem its canonical value.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from .._lazy import lazy_module
from .._signature import KernelParameters
from .._problem import Problem, default_scale, padded_head_dim
from ._schedule import TILES_M, DecodeSchedule

ct = lazy_module("cuda.tile", globals(), "ct")
_kernels = lazy_module(f"{__package__}._kernel", globals(), "_kernels")

__all__ = ["Layout", "layout", "normalise", "split_constants", "combine_constants",
           "split_kernel", "combine_kernel", "SPLIT_PARAMETERS", "COMBINE_PARAMETERS",
           "default_scale", "launch"]

SPLIT_PARAMETERS = KernelParameters(
    (f"{__package__}._kernel", "decode_split"),
    ("Q", "K", "V", "Out", "Opart", "Lse", "qk_scale", "causal_offset", "kv_div"))
COMBINE_PARAMETERS = KernelParameters((f"{__package__}._kernel", "decode_combine"),
                                      ("Opart", "Lse", "Out"))

#: Fewest rows a packed tile has (the matrix-product units work on 16-row tiles at least).
MIN_TILE_ROWS = 16


class Layout(NamedTuple):
    """How a problem's query rows map onto tiles for one schedule."""

    view_heads: int  # heads of the [B, H', G', S_q, D] view of q and out
    view_group: int  # G': query heads per tile group (the GQA group when packed, else 1)
    kv_div: int  # view head // kv_div = K/V head
    tile_g: int  # heads per tile (power of two >= G', padded with zero rows)
    tile_s: int  # query positions per tile
    q_tiles: int  # query tiles per (batch, view head)
    rows: int  # B * H' * q_tiles: the first grid dim

    @property
    def tile_m(self) -> int:
        return self.tile_g * self.tile_s


def _pow2_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=4096)
def layout(problem: Problem, schedule: DecodeSchedule) -> Layout:
    """The tiling of ``problem``'s query rows under ``schedule``."""
    group = problem.group_size
    if schedule.pack_heads:
        view_heads, view_group, kv_div = problem.heads_kv, group, 1
    else:
        view_heads, view_group, kv_div = problem.heads_q, 1, group
    tile_g = _pow2_at_least(view_group)
    tile_s = min(_pow2_at_least(problem.seqlen_q), max(1, schedule.tile_m // tile_g))
    if tile_g * tile_s < MIN_TILE_ROWS:
        tile_g = MIN_TILE_ROWS // tile_s
    q_tiles = math.ceil(problem.seqlen_q / tile_s)
    return Layout(view_heads, view_group, kv_div, tile_g, tile_s, q_tiles,
                  problem.batch * view_heads * q_tiles)


def normalise(problem: Problem, schedule: DecodeSchedule) -> DecodeSchedule:
    """``schedule`` with every field that cannot change the launches for ``problem`` at a
    canonical value: ``combine`` with one split, ``pack_heads`` when each K/V head has one query
    head, and ``tile_m`` at the smallest value that gives the same tiling (idempotent;
    ``schedule`` itself when nothing changes)."""
    changes: dict[str, Any] = {}
    canonical = DecodeSchedule()
    if schedule.splits == 1 and schedule.combine != canonical.combine:
        changes["combine"] = canonical.combine
    if problem.group_size == 1 and schedule.pack_heads != canonical.pack_heads:
        changes["pack_heads"] = canonical.pack_heads
    tiles = layout(problem, schedule)
    smallest = next(m for m in TILES_M if layout(problem, schedule.replace(tile_m=m)) == tiles)
    if smallest != schedule.tile_m:
        changes["tile_m"] = smallest
    return schedule.replace(**changes) if changes else schedule


def split_constants(problem: Problem, schedule: DecodeSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``decode_split`` by name."""
    tiles = layout(problem, schedule)
    return {
        "TILE_G": tiles.tile_g, "TILE_S": tiles.tile_s, "TILE_N": schedule.tile_n,
        "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
        "EXP2": schedule.exp2, "K_TRANSPOSED": schedule.k_transposed,
        "K_LATENCY": schedule.k_latency or 0, "V_LATENCY": schedule.v_latency or 0,
        "DIRECT": schedule.splits == 1,
        "PDL": schedule.splits > 1 and schedule.combine == "pdl",
    }


#: Head-dim columns per combine CTA: the combine reads splits x rows x D floats per output
#: row, so it is spread over ``ceil(D / 32)`` CTAs per row instead of one.
COMBINE_CHUNK_D = 32
#: Splits the combine merges per step (their loads issued together). An H100 probe
#: (scripts/decode_parts.py at 7415564) timed the one-split-per-step merge at 10-12 µs for 8-16
#: splits at B = 1, a sixth of a 32k-key call.
COMBINE_UNROLL = 8


def combine_constants(problem: Problem, schedule: DecodeSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``decode_combine`` by name."""
    tiles = layout(problem, schedule)
    return {"TILE_G": tiles.tile_g, "TILE_S": tiles.tile_s,
            "CHUNK_D": min(padded_head_dim(problem.head_dim), COMBINE_CHUNK_D),
            "UNROLL": min(COMBINE_UNROLL, _pow2_at_least(schedule.splits)),
            "PDL": schedule.combine == "pdl"}


@functools.lru_cache(maxsize=None)
def _hinted(kernel: ct.kernel, occupancy: int, num_worker_warps: int | None) -> ct.kernel:
    """Cached: each kernel object owns a JIT cache, so a new one per launch would recompile."""
    return kernel.replace_hints(occupancy=occupancy, num_worker_warps=num_worker_warps)


def split_kernel(schedule: DecodeSchedule) -> ct.kernel:
    return _hinted(_kernels.decode_split, schedule.occupancy, schedule.num_worker_warps)


def combine_kernel(schedule: DecodeSchedule) -> ct.kernel:
    """The combine kernel (no kernel options of its own: it is a short, latency-bound merge)."""
    return _kernels.decode_combine


def grouped_view(x: Any, tiles: Layout) -> Any:
    """``x [B, H, S, D]`` (torch or CuPy) as the ``[B, H', G', S, D]`` view the kernels index:
    no copy, whatever the strides."""
    b, h, s, d = x.shape
    shape = (b, tiles.view_heads, tiles.view_group, s, d)
    if hasattr(x, "unflatten"):  # torch
        return x.unflatten(1, shape[1:3])
    import cupy

    sb, sh, ss, sd = x.strides
    return cupy.lib.stride_tricks.as_strided(
        x, shape, (sb, sh * tiles.view_group, sh, ss, sd))


class Launches(NamedTuple):
    """What one call launches, less the arrays: built once per plan."""

    tiles: Layout
    splits: int
    split_grid: tuple[int, int, int]
    combine_grid: tuple[int, int, int]
    split: Any  # the hinted decode_split kernel
    combine: Any  # decode_combine, or None with one split
    split_constants: tuple
    combine_constants: tuple
    pdl: bool
    scale: float
    tile_d: int


def launches(problem: Problem, schedule: DecodeSchedule, scale: float | None) -> Launches:
    """The kernel objects, grids and constants of ``normalise(problem, schedule)``."""
    schedule = normalise(problem, schedule)
    tiles = layout(problem, schedule)
    split = split_constants(problem, schedule)
    combine = combine_constants(problem, schedule)
    return Launches(
        tiles=tiles, splits=schedule.splits,
        split_grid=(tiles.rows, schedule.splits, 1),
        combine_grid=(tiles.rows, math.ceil(problem.head_dim / combine["CHUNK_D"]), 1),
        split=split_kernel(schedule),
        combine=combine_kernel(schedule) if schedule.splits > 1 else None,
        split_constants=SPLIT_PARAMETERS.constant_values(split),
        combine_constants=COMBINE_PARAMETERS.constant_values(combine),
        pdl=bool(combine["PDL"]), scale=default_scale(problem) if scale is None else float(scale),
        tile_d=padded_head_dim(problem.head_dim))


def launch(stream: Any, plan: Launches, q: Any, k: Any, v: Any, out: Any, offset: int,
           partials: tuple[Any, Any] | None) -> None:
    """Enqueue the split kernel (and the combine) on ``stream``. ``out`` is preallocated like
    ``q``; ``partials`` = (Opart, Lse) float32 buffers of :func:`partial_shapes` (``None`` with
    one split)."""
    q5 = grouped_view(q, plan.tiles)
    out5 = grouped_view(out, plan.tiles)
    opart, lse = partials if partials is not None else (out5, out5)
    ct.launch(stream, plan.split_grid, plan.split,
              (q5, k, v, out5, opart, lse, plan.scale, offset, plan.tiles.kv_div,
               *plan.split_constants))
    if plan.combine is not None:
        ct.launch(stream, plan.combine_grid, plan.combine,
                  (opart, lse, out5, *plan.combine_constants),
                  programmatic_dependent_launch=plan.pdl)


def partial_shapes(plan: Launches) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the float32 (Opart, Lse) buffers a multi-split plan needs."""
    rows, m = plan.tiles.rows, plan.tiles.tile_m
    return (rows, plan.splits, m, plan.tile_d), (rows, plan.splits, m)
