"""From a (Problem, BackwardSchedule) pair to the launches of the backward kernels.

``launches`` builds what a call needs besides the arrays (hinted kernel objects, grids, constant
arguments) once per plan; ``launch`` enqueues them on one stream: the dQ kernel (it writes the
row sums ``delta`` the dK/dV kernel reads), then the dK/dV kernel, and with ``dkdv_splits > 1``
the sum kernel adding the dK/dV kernel's float32 partials (``scratch_shapes``: the caller
allocates them) into dK and into dV. The dQ and dK/dV kernels take the variants' launch-time
values after the others (``VARIANT_VALUES``, then ``Ranges``), read under the constants
``WINDOW``, ``SOFTCAP`` and ``RAGGED``: a problem with a window, a softcap or a ragged batch
(:func:`has_variants`) passes the three values, a plain problem (or one whose only variant is
sinks) passes :data:`UNUSED` for each, so its parameter space, and its machine code, are those
of the kernels before the variants existed.

With ``dq_mode="atomic"`` (the one-pass backward) no dQ kernel runs: ``attention_bwd_delta``
writes ``delta`` and zeroes a float32 dQ accumulator (``scratch_shapes``' ``"dq_accum"``; the
kernel that reads the rows anyway writes the zeros, one launch fewer than a separate memset),
the dK/dV kernel (``DQ_ATOMIC``) adds every pair's ``dS K`` into it, and
``attention_bwd_dq_scale`` writes ``dQ = scale * dq_accum`` in the input dtype. The dK/dV
kernel's accumulator parameter ``dQacc`` comes after ``Ranges`` and is :data:`UNUSED` in the
other mode, so that mode's machine code is what it was before the one-pass mode existed.

A ragged problem (``Problem.ragged``: sequences of their own lengths) launches with
:func:`launch_ragged`, which takes the call's ``Ranges`` (int32 ``[4, sequences]``: query starts,
query ends, key starts, key ends), the longest sequence's query and key counts and whether the
sequences are packed end to end in one batch entry (the ``PACKED`` constant: a property of the
call's layout, not of the problem). Its schedule runs no work orders (they assume every batch
entry has the whole length); its dK/dV splits share each sequence's key tile walk, their
float32 partials (:func:`ragged_parts_shape`, zeroed by the caller) cut per sequence like dK.
Each kernel walks a work table (``WORK_TABLE``, the table in ``Work``, right after ``Ranges``;
``tiledattention.core._work_table``): a 1-D grid over the tiles the sequences have, heaviest
first, not the grid of the longest sequence's tiles for every sequence (:func:`ragged_grids`,
which ``BACKWARD_TABLE_MIN_IDLE_CTAS`` can still choose).
Every other problem passes ``Ranges`` (and ``Work``) :data:`UNUSED`, an empty tuple, which takes
no bytes of the parameter space, so its machine code is what it was before ``Ranges`` existed (the
forward's convention, ``tiledattention/kernels/forward/_launch.py``); a compile-only build passes a
zero-byte constant instead (``cuda.tile.compilation`` takes no tuple).
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, NamedTuple

from ...core import _aot
from ...core._lazy import lazy_module
from ...core._signature import KernelParameters
from ...core._work_table import CHUNK, CLEAR_TILE_ROWS, GRID_Y_LIMIT, use_work_table, work_items
from ...core._problem import (INDEX_LIMIT, Problem, head_dim_parts, packable,
                              padded_head_dim, row_stat_shape)
from ...errors import KernelArgumentError, UnsupportedProblemError
from ._schedule import SPLITS, BackwardSchedule

ct = lazy_module("cuda.tile", globals(), "ct")

__all__ = ["DQ_PARAMETERS", "DKDV_PARAMETERS", "SUM_PARAMETERS", "VARIANT_VALUES",
           "dq_constants", "dkdv_constants", "sum_constants", "dq_kernel", "dkdv_kernel",
           "sum_kernel", "Launches", "launches", "launch", "row_stat_shape", "normalise",
           "scratch_shapes", "SUM_TILE", "DELTA_TILE", "has_variants", "runtime_values",
           "unequal_walks", "dkdv_walk", "dq_walk", "reach", "kernel_args", "launch_ragged",
           "ragged_grids", "UNUSED", "RANGES", "WORK", "DQ_ACCUM", "DELTA_PARAMETERS",
           "DQ_SCALE_PARAMETERS", "delta_kernel", "dq_scale_kernel", "delta_constants",
           "dq_scale_constants", "argument_tails", "dq_packed_heads", "dq_query_rows",
           "ragged_parts_shape", "PROLOGUE_PARAMETERS", "prologue_constants", "one_pass_grids",
           "prologue_kernel"]



# The kernels, each imported on first use: the kernel module loads cuda.tile, which ``import
# tiledattention`` does not pay for.
def _dq() -> ct.kernel:
    from ._kernel import attention_bwd_dq

    return attention_bwd_dq


def _dkdv() -> ct.kernel:
    from ._kernel import attention_bwd_dkdv

    return attention_bwd_dkdv


def _sum() -> ct.kernel:
    from ._kernel import attention_bwd_sum

    return attention_bwd_sum


def _delta() -> ct.kernel:
    from ._kernel import attention_bwd_delta

    return attention_bwd_delta


def _dq_scale() -> ct.kernel:
    from ._kernel import attention_bwd_dq_scale

    return attention_bwd_dq_scale


def _prologue() -> ct.kernel:
    from ...core._work_kernel import backward_prologue

    return backward_prologue


#: the launch-time values of the dQ and dK/dV kernels after the arrays and ``qk_scale``, the
#: heads and ``group``: the window's sides (-1: unbounded) and the softcap (0: none), read under
#: ``WINDOW`` / ``SOFTCAP``
VARIANT_VALUES = ("window_left", "window_right", "softcap")
#: their last launch-time value: a ragged call's int32 [4, sequences] ranges
#: (:func:`launch_ragged`), else :data:`UNUSED`
RANGES = "Ranges"
#: right after it: a ragged call's int32 [2, items] work table of the kernel's tiles
#: (``WORK_TABLE``), else :data:`UNUSED`
WORK = "Work"
#: what an unread variant value receives (each of them for a problem without variants, and
#: ``Ranges`` outside a ragged call): an empty tuple, which takes no bytes of the parameter
#: space (module docstring)
UNUSED = ()
#: the dK/dV kernel's last launch-time value, right after ``Work``: the one-pass backward's
#: float32 dQ accumulator, else :data:`UNUSED`
DQ_ACCUM = "dQacc"
DQ_PARAMETERS = KernelParameters(_dq, ("Q", "K", "V", "Out", "dO", "Lse", "Delta", "dQ",
                                       "qk_scale", "heads_q", "group", *VARIANT_VALUES, RANGES,
                                       WORK))
DKDV_PARAMETERS = KernelParameters(_dkdv, ("Q", "K", "V", "dO", "Lse", "Delta", "dK", "dV",
                                           "qk_scale", "heads_kv", "group", *VARIANT_VALUES,
                                           RANGES, WORK, DQ_ACCUM))
SUM_PARAMETERS = KernelParameters(_sum, ("Parts", "Grad"))
DELTA_PARAMETERS = KernelParameters(_delta, ("Out", "dO", "Delta", "dQacc"))
DQ_SCALE_PARAMETERS = KernelParameters(_dq_scale, ("dQacc", "dQ", "qk_scale"))
PROLOGUE_PARAMETERS = KernelParameters(_prologue, ("Ranges", "WorkQ", "WorkK", "dQ", "dK", "dV"))

#: rows per CTA of the sum kernel (memory-bound: one [64, D] float32 tile a step) and of the
#: one-pass backward's dQ-scale kernel
SUM_TILE = 64
#: rows per CTA of the one-pass backward's delta kernel (reads O and dO, writes delta and a
#: zeroed float32 dQ accumulator): on an H200 128 rows ran it at a device copy's rate of its
#: bytes, 2.1-2.3x faster than 64 (whatever the occupancy hint) on three shapes, where the
#: dQ-scale and sum kernels ran 1-14% and 13-84% slower at 128
#: (docs/records/probes/delta_kernel.py; docs/records/benchmarks/backward/softcap.md)
DELTA_TILE = 128


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def has_variants(problem: Problem) -> bool:
    """Whether ``problem`` passes the kernels its ``VARIANT_VALUES`` (a window, a softcap or a
    ragged batch); without, each is :data:`UNUSED`. (Sinks change no backward kernel: the
    forward's log-sum-exp holds them.)"""
    return problem.windowed or problem.softcap > 0 or problem.ragged


def runtime_values(problem: Problem) -> dict[str, Any]:
    """The launch-time values after ``group`` by name: ``VARIANT_VALUES``, :data:`UNUSED`
    without variants. (Not ``Ranges``: a ragged call's own, :func:`kernel_args`.)"""
    if not has_variants(problem):
        return dict.fromkeys(VARIANT_VALUES, UNUSED)
    return {"window_left": problem.window_left, "window_right": problem.window_right,
            "softcap": float(problem.softcap)}


def _variant_constants(problem: Problem, packed: bool, work_table: bool) -> dict[str, Any]:
    """``WINDOW``, ``SOFTCAP``, ``RAGGED``, ``PACKED`` (``packed``: a ragged call's sequences
    lie end to end in one batch entry) and ``WORK_TABLE`` (``work_table``: a ragged call's
    kernel walks a work table)."""
    return {"WINDOW": problem.windowed, "SOFTCAP": problem.softcap > 0,
            "RAGGED": problem.ragged, "PACKED": bool(packed) and problem.ragged,
            "WORK_TABLE": bool(work_table) and problem.ragged}


def reach(problem: Problem) -> tuple[int, int]:
    """``(left, right)``: row ``i`` sees keys ``i + off - left .. i + off + right``; an
    unbounded side reaches ``S_q + S_k`` (the dQ and dK/dV kernels' ``_window``)."""
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


def dq_packed_heads(problem: Problem, schedule: BackwardSchedule) -> int:
    """The query heads one dQ kernel tile holds: the group size where ``schedule.dq_pack_gqa``
    runs (:func:`~tiledattention.core._problem.packable` at its ``dq_tile_m``; a one-pass
    schedule's is off, ``normalise``), else 1."""
    return (problem.group_size if schedule.dq_pack_gqa and packable(problem, schedule.dq_tile_m)
            else 1)


def dq_query_rows(problem: Problem, schedule: BackwardSchedule) -> int:
    """The query positions of one dQ kernel tile: ``dq_tile_m``, or ``dq_tile_m / group``
    where the tile holds a whole group's heads (:func:`dq_packed_heads`)."""
    return schedule.dq_tile_m // dq_packed_heads(problem, schedule)


#: the fields of the dQ kernel alone, which the one-pass backward (``dq_mode="atomic"``) does
#: not launch
DQ_FIELDS = ("dq_tile_m", "dq_tile_n", "dq_occupancy", "dq_worker_warps", "kv_latency",
             "dq_heavy_first", "dq_pack_gqa")
_BASE_DQ = {name: getattr(BackwardSchedule(), name) for name in DQ_FIELDS}
#: A one-pass dK/dV kernel walking query tiles of this many rows or more runs one CTA per SM:
#: at 128 rows and two CTAs per SM (D 64, bf16, tileiras 13.4.92, H200) its dK came out wrong
#: (relative L2 7e-3 to 2.2e-2 against the two-kernel dK on three shapes, dQ and dV right),
#: at one CTA per SM, or 64 rows and two CTAs, bit for bit the two-kernel dK
#: (docs/records/benchmarks/backward/onepass.md)
ONE_PASS_WIDE_M = 128
#: A one-pass dK/dV kernel walks query tiles of at least this many rows: with 32-row steps at
#: D 128 its dK came out wrong and different run to run (relative L2 0.13-0.49 against the
#: two-kernel dK on four shapes, dQ and dV right) at 128 keys and one CTA per SM and at 64
#: keys and two CTAs per SM, though right at 64 keys and one CTA; at 64 rows every tested
#: configuration was bit for bit the two-kernel dK (tileiras 13.4.92, H200;
#: docs/records/benchmarks/backward/onepass.md). Not root-caused: a race on the CTA's shared
#: memory, as above, is the likeliest reading.
ONE_PASS_MIN_M = 64


def normalise(problem: Problem, schedule: BackwardSchedule) -> BackwardSchedule:
    """``schedule`` with tiles no larger than the problem needs (a query tile past the next
    power of two of ``S_q``, a key tile past ``S_k``'s, computes only padding), no more dK/dV
    splits than a key tile's longest walk has (query head, query tile) pairs (``dkdv_walk``:
    the window shortens it) or than keep the float32 partials indexable with int32, no work
    order (dQ heavy first, tile-major grids) on a problem whose walks are all alike
    (``unequal_walks``), and no tile-major grid with more tiles than a grid's second
    dimension takes. A ragged problem (``Problem.ragged``) runs no work orders (the heavy
    tiles of each sequence lie at its own end, not the grid's: its work tables order them,
    :func:`launch_ragged`); its splits share each sequence's own walk. With ``dq_mode="atomic"``
    the dQ kernel's fields (``DQ_FIELDS``) take their defaults (no dQ kernel runs) and query
    tiles of at least ``ONE_PASS_MIN_M`` rows (however short ``S_q``), and of
    ``ONE_PASS_WIDE_M`` rows or more one CTA per SM. ``dq_pack_gqa`` holds only where the dQ
    tile packs (:func:`dq_packed_heads`), whose rows may then reach the group size times the
    next power of two of ``S_q`` (a tile's positions are its rows over the group). ``split_d``
    holds only where the head dim has two parts (``head_dim_parts``). Idempotent."""
    q_cap = max(16, 1 << (problem.seqlen_q - 1).bit_length())
    k_cap = max(16, 1 << (problem.seqlen_k - 1).bit_length())
    if schedule.dq_mode == "atomic":
        base = dict(_BASE_DQ, dq_tile_m=min(_BASE_DQ["dq_tile_m"], q_cap),
                    dq_tile_n=min(_BASE_DQ["dq_tile_n"], k_cap))  # as capped below
        canonical = {name: base[name] for name in DQ_FIELDS
                     if getattr(schedule, name) != base[name]}
        if schedule.dkdv_tile_m < ONE_PASS_MIN_M:
            canonical["dkdv_tile_m"] = ONE_PASS_MIN_M
        if min(schedule.dkdv_tile_m, q_cap) >= ONE_PASS_WIDE_M and schedule.dkdv_occupancy > 1:
            canonical["dkdv_occupancy"] = 1
        if canonical:
            schedule = schedule.replace(**canonical)
    m_cap = max(q_cap, ONE_PASS_MIN_M) if schedule.dq_mode == "atomic" else q_cap
    pack = dq_packed_heads(problem, schedule)
    changes: dict[str, Any] = {
        name: cap for name, cap in (("dkdv_tile_m", m_cap), ("dq_tile_m", q_cap * pack),
                                    ("dkdv_tile_n", k_cap), ("dq_tile_n", k_cap))
        if getattr(schedule, name) > cap}
    tile_m = min(schedule.dkdv_tile_m, m_cap)
    pairs = problem.group_size * dkdv_walk(problem, min(schedule.dkdv_tile_n, k_cap), tile_m)
    splits = min(schedule.dkdv_splits, _pow2_floor(pairs), SPLITS[-1])
    kv_elements = (problem.batch * problem.heads_kv * problem.seqlen_k
                   * padded_head_dim(problem.head_dim))
    while splits > 1 and splits * kv_elements > INDEX_LIMIT:  # the partials index with int32
        splits //= 2
    if splits != schedule.dkdv_splits:
        changes["dkdv_splits"] = splits
    if schedule.dq_pack_gqa and pack == 1:
        changes["dq_pack_gqa"] = False  # no group to pack at this tile, or no dQ kernel
    if schedule.split_d and head_dim_parts(problem.head_dim, True)[1] == 0:
        changes["split_d"] = False  # a power of two, or two parts no narrower than one
    for name in ("dq_heavy_first", "tile_major"):
        if getattr(schedule, name) and (problem.ragged or not unequal_walks(problem)):
            changes[name] = False
    if schedule.tile_major and max(math.ceil(problem.seqlen_q
                                             / (min(schedule.dq_tile_m, q_cap * pack) // pack)),
                                   math.ceil(problem.seqlen_k / min(schedule.dkdv_tile_n, k_cap))
                                   ) > GRID_Y_LIMIT:
        changes["tile_major"] = False  # the tiles would not fit the grid's second dimension
    return schedule.replace(**changes) if changes else schedule


def _head_dim_constants(problem: Problem, schedule: BackwardSchedule) -> dict[str, int]:
    """``TILE_D`` and ``TILE_D2`` of the dQ and dK/dV kernels: the head dim padded to a power
    of two, or with ``split_d`` its two parts (``head_dim_parts``)."""
    tile_d, tile_d2 = head_dim_parts(problem.head_dim, schedule.split_d)
    return {"TILE_D": tile_d, "TILE_D2": tile_d2}


def dq_constants(problem: Problem, schedule: BackwardSchedule, *, packed: bool = False,
                 work_table: bool = False) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of the dQ kernel ``problem`` runs by name (``packed``: a
    ragged call's sequences lie end to end, ``PACKED``; ``work_table``: it walks a table of
    query tiles, ``WORK_TABLE``)."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dq_tile_m, "TILE_N": s.dq_tile_n, "PACK": dq_packed_heads(problem, s),
            **_head_dim_constants(problem, s),
            "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "KV_LATENCY": s.kv_latency or 0,
            "HEAVY_FIRST": s.dq_heavy_first, "TILE_MAJOR": s.tile_major,
            **_variant_constants(problem, packed, work_table)}


def dkdv_constants(problem: Problem, schedule: BackwardSchedule, *, packed: bool = False,
                   work_table: bool = False) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of the dK/dV kernel ``problem`` runs by name (``packed``:
    a ragged call's sequences lie end to end, ``PACKED``; ``work_table``: it walks a table of
    key tiles, ``WORK_TABLE``)."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dkdv_tile_m, "TILE_N": s.dkdv_tile_n, **_head_dim_constants(problem, s),
            "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "Q_LATENCY": s.q_latency or 0,
            "SPLITS": s.dkdv_splits, "TILE_MAJOR": s.tile_major,
            **_variant_constants(problem, packed, work_table), "DQ_ATOMIC": s.dq_mode == "atomic"}


def sum_constants(problem: Problem, parts: int) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_sum`` adding ``parts`` partials."""
    return {"PARTS": parts, "TILE": SUM_TILE, "TILE_D": padded_head_dim(problem.head_dim)}


def delta_constants(problem: Problem) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of the one-pass backward's delta kernel."""
    return {"TILE": DELTA_TILE, "TILE_D": padded_head_dim(problem.head_dim)}


def dq_scale_constants(problem: Problem) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of the one-pass backward's dQ-scale kernel."""
    return {"TILE": SUM_TILE, "TILE_D": padded_head_dim(problem.head_dim)}


@functools.lru_cache(maxsize=None)
def _hinted(kernel: ct.kernel, occupancy: int, num_worker_warps: int | None) -> ct.kernel:
    """Cached: each kernel object owns a JIT cache, so a new one per launch would recompile."""
    return kernel.replace_hints(occupancy=occupancy, num_worker_warps=num_worker_warps)


def dq_kernel(schedule: BackwardSchedule) -> ct.kernel:
    """``attention_bwd_dq`` with the schedule's hints."""
    return _hinted(_dq(), schedule.dq_occupancy, schedule.dq_worker_warps)


def dkdv_kernel(schedule: BackwardSchedule) -> ct.kernel:
    """``attention_bwd_dkdv`` with the schedule's hints."""
    return _hinted(_dkdv(), schedule.dkdv_occupancy, schedule.dkdv_worker_warps)


def prologue_constants(problem: Problem, tiles: tuple[int, int], *, query_table: bool,
                       key_table: bool, clear: bool) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of a ragged backward's prologue (``backward_prologue``):
    ``tiles`` (a dQ tile's query positions, ``dkdv_tile_n``), which of the two work tables it
    fills, and whether it clears the gradients' uncovered rows (packed sequences)."""
    return {"TILE_Q": tiles[0], "TILE_K": tiles[1], "CHUNK": CHUNK, "QUERY_TABLE": query_table,
            "KEY_TABLE": key_table, "CLEAR": clear, "TILE_R": CLEAR_TILE_ROWS,
            "TILE_D": padded_head_dim(problem.head_dim)}


@functools.lru_cache(maxsize=256)
def _prologue_tail(problem: Problem, tiles: tuple[int, int], query_table: bool, key_table: bool,
                   clear: bool) -> tuple:
    """:func:`prologue_constants` in the kernel's order (cached: built once per plan and form)."""
    return PROLOGUE_PARAMETERS.constant_values(prologue_constants(
        problem, tiles, query_table=query_table, key_table=key_table, clear=clear))


def prologue_kernel() -> ct.kernel:
    """``backward_prologue`` (the work tables and the clears: the compiler's hints)."""
    return _prologue()


def sum_kernel() -> ct.kernel:
    """``attention_bwd_sum`` (memory-bound: the compiler's hints)."""
    return _sum()


def delta_kernel() -> ct.kernel:
    """``attention_bwd_delta`` (memory-bound: the compiler's hints)."""
    return _delta()


def dq_scale_kernel() -> ct.kernel:
    """``attention_bwd_dq_scale`` (memory-bound: the compiler's hints)."""
    return _dq_scale()


def scratch_shapes(problem: Problem, schedule: BackwardSchedule) -> dict[str, tuple[int, ...]]:
    """The float32 buffers ``launch`` needs besides the gradients, by name: with
    ``dkdv_splits > 1``, ``"dk_parts"`` and ``"dv_parts"`` (``[splits * B, H_kv, S_k, D]``);
    with ``dq_mode="atomic"``, ``"dq_accum"`` (``[B, H_q, S_q, D]``, contiguous: the bulk
    reduce-add needs 16-byte-aligned rows)."""
    s = normalise(problem, schedule)
    found: dict[str, tuple[int, ...]] = {}
    if s.dkdv_splits > 1 and not problem.ragged:  # a ragged call's: ragged_parts_shape
        parts = (s.dkdv_splits * problem.batch, problem.heads_kv, problem.seqlen_k,
                 problem.head_dim)
        found.update(dk_parts=parts, dv_parts=parts)
    if s.dq_mode == "atomic":
        found["dq_accum"] = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
    return found


class Launches(NamedTuple):
    """What one backward call launches, less the arrays: built once per plan."""

    splits: int  # the dK/dV kernel's (normalised)
    dq_grid: tuple[int, int, int]
    dkdv_grid: tuple[int, int, int]
    sum_grid: tuple[int, int, int]  # the partials' sum, over dK and over dV
    dq: Any
    dkdv: Any
    dq_scalars: tuple  # the arguments after the arrays: qk_scale, heads_q, group,
    # VARIANT_VALUES, constants; not Ranges (see ranges_at)
    dkdv_scalars: tuple  # the arguments after the arrays: qk_scale, heads_kv, group,
    # VARIANT_VALUES, constants; not Ranges (see ranges_at)
    sum_scalars: tuple  # the sum kernel's constants
    stat_shape: tuple[int, int, int]
    scratch: dict[str, tuple[int, ...]]  # the float32 buffers launch needs (scratch_shapes)
    problem: Problem
    ranges_at: int  # where the kernels take Ranges (then Work) among dq_scalars and
    # dkdv_scalars (kernel_args puts them there)
    tiles: tuple[int, int]  # a dQ tile's query positions and dkdv_tile_n (ragged_grids)
    dq_heads: int  # the dQ grid's heads per batch entry: query heads, or packed K/V groups
    ragged_scalars: dict  # a ragged problem's: (PACKED, WORK_TABLE) -> (dq_scalars,
    # dkdv_scalars) with those constants; else empty
    one_pass: bool  # dq_mode "atomic": the delta and dQ-scale kernels instead of the dQ kernel
    delta_scalars: tuple  # the delta kernel's constants (its grid: the call's rows)
    dq_scale_scalars: tuple  # the dQ-scale kernel's constants (likewise)
    scale: float


def _grid(tile_major: bool, tiles: int, heads: int, splits: int) -> tuple[int, int, int]:
    """(tiles, heads, splits), or tile-major (heads x splits, tiles, 1) (the kernels' bids)."""
    return (heads * splits, tiles, 1) if tile_major else (tiles, heads, splits)


def _scalars(parameters: KernelParameters, runtime: dict[str, Any],
             constants: dict[str, Any]) -> tuple[tuple, int]:
    """The kernel's arguments after its 8 arrays less ``Ranges`` and ``Work`` (and the dK/dV
    kernel's ``dQacc``), which must follow one another, and where ``Ranges`` goes among them."""
    late = (RANGES, WORK, DQ_ACCUM) if DQ_ACCUM in parameters.names else (RANGES, WORK)
    args = parameters.ordered({**runtime, **dict.fromkeys(late, UNUSED)}, constants)[8:]
    at = parameters.names.index(RANGES) - 8
    if parameters.names[at + 8:at + 8 + len(late)] != late:
        raise KernelArgumentError(f"kernel {parameters.kernel_name} must take {late} one after "
                                  f"the other; got {parameters.names}")
    return args[:at] + args[at + len(late):], at


@functools.lru_cache(maxsize=256)
def launches(problem: Problem, schedule: BackwardSchedule, scale: float) -> Launches:
    """The kernel objects, grids, constants and scratch shapes of ``normalise(problem,
    schedule)``. Cached: a training loop asks for the same few problems every step. A ragged
    problem's grids here are those of its bucket (``problem.batch`` sequences of the longest
    lengths); :func:`launch_ragged` launches the call's own (:func:`ragged_grids`)."""
    s = normalise(problem, schedule)
    p = problem
    dq_runtime = {"Q": None, "K": None, "V": None, "Out": None, "dO": None, "Lse": None,
                  "Delta": None, "dQ": None, "qk_scale": float(scale), "heads_q": p.heads_q,
                  "group": p.group_size, **runtime_values(p)}
    dkdv_runtime = {"Q": None, "K": None, "V": None, "dO": None, "Lse": None, "Delta": None,
                    "dK": None, "dV": None, "qk_scale": float(scale), "heads_kv": p.heads_kv,
                    "group": p.group_size, **runtime_values(p)}
    dq_scalars, ranges_at = _scalars(DQ_PARAMETERS, dq_runtime, dq_constants(p, s))
    dkdv_scalars, dkdv_ranges_at = _scalars(DKDV_PARAMETERS, dkdv_runtime,
                                            dkdv_constants(p, s))
    if ranges_at != dkdv_ranges_at:  # kernel_args places one value for both kernels
        raise KernelArgumentError(f"the dQ and dK/dV kernels take Ranges at different places "
                                  f"({ranges_at}, {dkdv_ranges_at} after the arrays)")
    ragged_scalars = {
        (packed, table): (
            _scalars(DQ_PARAMETERS, dq_runtime,
                     dq_constants(p, s, packed=packed, work_table=table))[0],
            _scalars(DKDV_PARAMETERS, dkdv_runtime,
                     dkdv_constants(p, s, packed=packed, work_table=table))[0])
        for packed in (False, True) for table in (False, True)} if p.ragged else {}
    return Launches(
        splits=s.dkdv_splits,
        dq_grid=_grid(s.tile_major, math.ceil(p.seqlen_q / dq_query_rows(p, s)),
                      p.batch * (p.heads_q // dq_packed_heads(p, s)), 1),
        dkdv_grid=_grid(s.tile_major, math.ceil(p.seqlen_k / s.dkdv_tile_n),
                        p.batch * p.heads_kv, s.dkdv_splits),
        sum_grid=_row_grid(p.seqlen_k, SUM_TILE, p.batch, p.heads_kv),
        dq=dq_kernel(s), dkdv=dkdv_kernel(s),
        dq_scalars=dq_scalars, dkdv_scalars=dkdv_scalars,
        sum_scalars=SUM_PARAMETERS.constant_values(sum_constants(p, s.dkdv_splits)),
        stat_shape=row_stat_shape(p), scratch=scratch_shapes(p, s), problem=p,
        ranges_at=ranges_at, tiles=(dq_query_rows(p, s), s.dkdv_tile_n),
        dq_heads=p.heads_q // dq_packed_heads(p, s), ragged_scalars=ragged_scalars,
        one_pass=s.dq_mode == "atomic",
        delta_scalars=DELTA_PARAMETERS.constant_values(delta_constants(p)),
        dq_scale_scalars=DQ_SCALE_PARAMETERS.constant_values(dq_scale_constants(p)),
        scale=float(scale))


def _counts(sequences: int, longest_q: int, longest_k: int) -> tuple[int, int, int]:
    """A ragged call's counts as ints; :class:`KernelArgumentError` for any that is not an
    int >= 0."""
    counts = []
    for name, value in (("sequences", sequences), ("longest_q", longest_q),
                        ("longest_k", longest_k)):
        try:
            count = operator.index(value)
        except TypeError:
            count = -1
        if isinstance(value, bool) or count < 0:
            raise KernelArgumentError(f"{name} must be an int >= 0; got {value!r}")
        counts.append(count)
    return counts[0], counts[1], counts[2]


def _ragged_grid(tile: int, heads: int, sequences: int, longest: int,
                 splits: int = 1) -> tuple[int, int, int]:
    """One kernel's grid of a ragged call: ``longest``'s tiles for every (sequence x head),
    each tile's ``splits`` CTAs on the third axis."""
    return (max(1, -(-longest // tile)), max(sequences, 1) * heads, splits)


def _ragged_grids(tiles: tuple[int, int], heads_q: int, heads_kv: int, sequences: int,
                  longest_q: int, longest_k: int,
                  splits: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """:func:`ragged_grids` of the normalised ``tiles`` (a dQ tile's query positions,
    dkdv_tile_n) and dK/dV ``splits``."""
    sequences, longest_q, longest_k = _counts(sequences, longest_q, longest_k)
    if max(sequences, 1) * max(heads_q, heads_kv) > GRID_Y_LIMIT:
        raise UnsupportedProblemError(
            f"a ragged batch of {sequences} sequences x {max(heads_q, heads_kv)} heads exceeds "
            f"a grid's second dimension ({GRID_Y_LIMIT} CTAs)")
    return (_ragged_grid(tiles[0], heads_q, sequences, longest_q),
            _ragged_grid(tiles[1], heads_kv, sequences, longest_k, splits))


def ragged_grids(problem: Problem, schedule: BackwardSchedule, sequences: int, longest_q: int,
                 longest_k: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The dQ and dK/dV grids of a ragged call (``problem.ragged``) of ``sequences``
    sequences: the longest sequence's query tiles (``longest_q``: at least every sequence's
    query count) for every (sequence x query head, or packed K/V group), and its key tiles
    (``longest_k``) for every (sequence x K/V head), one tile a CTA (a key tile's dK/dV
    splits on the third axis); a CTA past its own sequence's end does nothing.
    Raises :class:`UnsupportedProblemError` where sequences x heads exceed a grid's second
    dimension (:func:`launch_ragged` then walks work tables)."""
    s = normalise(problem, schedule)
    return _ragged_grids((dq_query_rows(problem, s), s.dkdv_tile_n),
                         problem.heads_q // dq_packed_heads(problem, s), problem.heads_kv,
                         sequences, longest_q, longest_k, s.dkdv_splits)


def _describe_given(value: Any) -> str:
    return "None" if value is None else "an array"


def _check_call(plan: Launches, ranges: Any, *, packed: bool, tables: tuple[bool, bool],
                dq_accum: Any) -> None:
    """:func:`kernel_args`' checks of what a call passes besides the arrays (``tables``:
    whether each kernel is given a work table)."""
    ragged = plan.problem.ragged
    if (dq_accum is not None) != plan.one_pass:
        raise KernelArgumentError(
            f"dq_accum must be given exactly when the plan is one-pass (dq_mode 'atomic'); got "
            f"{_describe_given(dq_accum)} for a plan with one_pass={plan.one_pass}")
    if (ranges is not None) != ragged:
        raise KernelArgumentError(
            f"ranges must be given exactly when the problem is ragged; got "
            f"{_describe_given(ranges)} for {plan.problem.describe()}")
    if not ragged and (packed or any(tables)):
        raise KernelArgumentError(f"packed and work apply to a ragged problem only; got "
                                  f"packed={packed}, work tables {tables} for "
                                  f"{plan.problem.describe()}")
    if ragged:
        shape = tuple(getattr(ranges, "shape", ()))
        if len(shape) != 2 or shape[0] != 4 or "int32" not in str(getattr(ranges, "dtype", "")):
            raise KernelArgumentError(f"ranges must be an int32 [4, sequences] array; got "
                                      f"shape {shape} dtype {getattr(ranges, 'dtype', None)}")


def kernel_args(plan: Launches, q: Any, k: Any, v: Any, out: Any, grad_out: Any, lse: Any,
                delta: Any, dq: Any, dk: Any, dv: Any, ranges: Any = None, *,
                packed: bool = False, dq_accum: Any = None,
                work: tuple[Any, Any] = (None, None)) -> tuple[tuple, tuple]:
    """The positional arguments of the plan's dQ kernel and of its dK/dV kernel, in that order
    (``dk, dv``: what the dK/dV kernel writes, the float32 partials with ``plan.splits > 1``).
    ``dq_accum``: the one-pass backward's float32 dQ accumulator, given exactly when
    ``plan.one_pass`` (the dQ kernel's arguments are then not launched).
    ``ranges``: the int32 ``[4, sequences]`` ranges of a ragged call, given exactly when
    ``plan.problem.ragged``; ``packed`` (ragged only): the arrays are ``[1, H, tokens, D]``
    views of sequences packed end to end; ``work`` (ragged only): the dQ kernel's table of
    query tiles and the dK/dV kernel's of key tiles (``_launch_prologue`` fills them), None for a kernel
    that runs its grid. Raises :class:`KernelArgumentError` otherwise."""
    tables = tuple(w is not None for w in work)
    _check_call(plan, ranges, packed=packed, tables=tables, dq_accum=dq_accum)
    return _arguments(plan, (q, k, v, out, grad_out, lse, delta, dq, dk, dv), ranges,
                      packed=packed, dq_accum=dq_accum, work=work)


def _arguments(plan: Launches, arrays: tuple, ranges: Any, *, packed: bool, dq_accum: Any,
               work: tuple[Any, Any]) -> tuple[tuple, tuple]:
    """:func:`kernel_args` of what :func:`_check_call` has accepted (``arrays``: ``q, k, v,
    out, grad_out, lse, delta, dq, dk, dv``)."""
    q, k, v, out, grad_out, lse, delta, dq, dk, dv = arrays
    tables = tuple(w is not None for w in work)
    dq_scalars, dkdv_scalars = plan.dq_scalars, plan.dkdv_scalars
    if plan.problem.ragged:
        dq_scalars = plan.ragged_scalars[packed, tables[0]][0]
        dkdv_scalars = plan.ragged_scalars[packed, tables[1]][1]
    dq_arrays = (q, k, v, out, grad_out, lse, delta, dq)
    dkdv_arrays = (q, k, v, grad_out, lse, delta, dk, dv)
    at = plan.ranges_at
    value = UNUSED if ranges is None else ranges
    accum = UNUSED if dq_accum is None else dq_accum
    dq_work, dkdv_work = (UNUSED if w is None else w for w in work)
    return ((*dq_arrays, *dq_scalars[:at], value, dq_work, *dq_scalars[at:]),
            (*dkdv_arrays, *dkdv_scalars[:at], value, dkdv_work, accum, *dkdv_scalars[at:]))


def argument_tails(plan: Launches) -> tuple[tuple, tuple]:
    """What follows the 8 arrays in the dQ and the dK/dV kernel's arguments of a dense
    two-kernel call (no ranges, work tables or accumulator: :data:`UNUSED` for each), as
    :func:`kernel_args` places them: built once per plan by a prepared launch."""
    at = plan.ranges_at
    return ((*plan.dq_scalars[:at], UNUSED, UNUSED, *plan.dq_scalars[at:]),
            (*plan.dkdv_scalars[:at], UNUSED, UNUSED, UNUSED, *plan.dkdv_scalars[at:]))


def _row_grid(rows: int, tile: int, entries: int, heads: int) -> tuple[int, int, int]:
    """The grid of a row kernel (the delta, dQ-scale and sum kernels): ``tile`` rows of one
    (entry x head) a CTA."""
    return (max(1, -(-rows // tile)), entries * heads, 1)


def launch(stream: Any, plan: Launches, q: Any, k: Any, v: Any, out: Any, grad_out: Any,
           lse: Any, delta: Any, dq: Any, dk: Any, dv: Any,
           scratch: dict[str, Any] | None = None) -> None:
    """Enqueue the plan's kernels on ``stream``. ``lse`` and ``delta`` are ``[B, H_q, S_q]``
    float32 views (``delta`` is written here); ``dq, dk, dv`` are preallocated like ``q, k,
    v``; ``scratch`` holds the float32 buffers of ``plan.scratch`` by name. A ragged problem's
    plan launches with :func:`launch_ragged` (this raises :class:`KernelArgumentError`).
    One-pass (``plan.one_pass``): the delta kernel, the dK/dV kernel, the dQ-scale kernel."""
    dk_to, dv_to = (dk, dv) if plan.splits == 1 else (scratch["dk_parts"], scratch["dv_parts"])
    accum = scratch["dq_accum"] if plan.one_pass else None
    dq_args, dkdv_args = kernel_args(plan, q, k, v, out, grad_out, lse, delta, dq, dk_to, dv_to,
                                     dq_accum=accum)
    _launch_walks(stream, plan, (plan.dq_grid, plan.dkdv_grid), (dq_args, dkdv_args),
                  (out, grad_out, delta, dq, accum))
    if plan.splits > 1:
        for parts, grad in ((dk_to, dk), (dv_to, dv)):
            _aot.launch(stream, plan.sum_grid, sum_kernel(), (parts, grad, *plan.sum_scalars))


def _launch_walks(stream: Any, plan: Launches, grids: tuple, args: tuple, rows: tuple) -> None:
    """The dQ kernel then the dK/dV kernel (``grids``, ``args``: theirs, in that order), or
    one-pass (``plan.one_pass``) the delta kernel, the dK/dV kernel and the dQ-scale kernel,
    the row kernels over every row of ``rows``: ``(out, grad_out, delta, dq, dq_accum)``, the
    ``[B, H_q, S, D]`` arrays they read and write."""
    out, grad_out, delta, dq, accum = rows
    if plan.one_pass:
        delta_grid, dq_scale_grid = one_pass_grids(out.shape[2], out.shape[0], out.shape[1])
        _aot.launch(stream, delta_grid, delta_kernel(),
                    (out, grad_out, delta, accum, *plan.delta_scalars))
    else:
        _aot.launch(stream, grids[0], plan.dq, args[0])
    _aot.launch(stream, grids[1], plan.dkdv, args[1])
    if plan.one_pass:
        _aot.launch(stream, dq_scale_grid, dq_scale_kernel(),
                    (accum, dq, plan.scale, *plan.dq_scale_scalars))


def one_pass_grids(rows: int, entries: int, heads: int) -> tuple[tuple[int, int, int], ...]:
    """The grids of the one-pass backward's delta and dQ-scale kernels over ``rows`` query
    rows of ``entries`` x ``heads``."""
    return tuple(_row_grid(rows, tile, entries, heads) for tile in (DELTA_TILE, SUM_TILE))


def _launch_prologue(stream: Any, plan: Launches, ranges: Any, tables: list,
                     cleared: tuple | None) -> None:
    """Enqueue a ragged backward's prologue (``backward_prologue``), one launch of ``sequences
    + 1`` x 3 CTAs ahead of the dQ and dK/dV kernels: it fills the work ``tables`` given (the
    dQ kernel's, the dK/dV kernel's; None for a kernel on its grid) and, with ``cleared`` (``dq,
    dk, dv`` of packed sequences), zeros their rows outside every sequence. Nothing where it
    has nothing to do."""
    query_table, key_table = (t is not None for t in tables)
    if not (query_table or key_table or cleared):
        return
    arrays = cleared or (UNUSED, UNUSED, UNUSED)
    args = (ranges, *(UNUSED if t is None else t for t in tables), *arrays,
            *_prologue_tail(plan.problem, plan.tiles, query_table, key_table,
                            cleared is not None))
    _aot.launch(stream, (ranges.shape[1] + 1, 3, 1), prologue_kernel(), args)


def ragged_parts_shape(plan: Launches, k: Any) -> tuple[int, int, int, int] | None:
    """The shape of each float32 partial (of dK and of dV) a ragged launch of ``plan`` with
    dK/dV splits adds up: ``[splits * entries, H_kv, rows, D]`` of ``k``'s view (``[entries,
    H_kv, rows, D]``); None without splits. The caller zeroes them (rows outside every
    sequence are never written, and are summed)."""
    if plan.splits == 1:
        return None
    return (plan.splits * k.shape[0], k.shape[1], k.shape[2], k.shape[3])


def launch_ragged(stream: Any, plan: Launches, q: Any, k: Any, v: Any, out: Any,
                  grad_out: Any, lse: Any, delta: Any, dq: Any, dk: Any, dv: Any, ranges: Any,
                  longest_q: int, longest_k: int, *, packed: bool,
                  dq_accum: Any = None, parts: tuple[Any, Any] | None = None) -> None:
    """Enqueue the backward of a ragged call on ``stream``: ``plan = launches(problem,
    schedule, scale)`` of its ``problem.ragged`` bucket, then the dQ kernel (which writes
    ``delta``) and the dK/dV kernel, over :func:`ragged_grids` (with ``plan.splits > 1`` each
    key tile's walk over (query head, query tile) pairs is shared by that many CTAs, which
    write the zeroed float32 ``parts`` of dK and of dV, shaped
    :func:`ragged_parts_shape`; the sum kernel adds them into ``dk`` and ``dv`` in a fixed
    order, every row: outside the sequences zeros). One-pass
    (``plan.one_pass``): the delta kernel over every row of the arrays, the dK/dV kernel
    adding each sequence's dQ shares into ``dq_accum`` (float32, contiguous, shaped like
    ``q``; given exactly then), and the dQ-scale kernel over every row.

    ``ranges``: int32 ``[4, sequences]`` on the device (rows: query starts, query ends, key
    starts, key ends, positions along the arrays' sequence axis); ``longest_q``,
    ``longest_k``: at least the longest sequence's query and key counts (a smaller value
    leaves the longer sequences' tail rows / keys unwritten).

    ``packed``: the sequences lie end to end in one batch entry: ``q, out, grad_out, dq`` are
    ``[1, H_q, T_q, D]`` and ``k, v, dk, dv`` ``[1, H_kv, T_k, D]`` views of ``[T, H, D]``
    tensors (``x.unsqueeze(0).transpose(1, 2)``), ``lse`` and ``delta`` float32 ``[1, H_q,
    T_q]``. Else a padded batch: ``[B, H, S, D]`` arrays and ``[B, H_q, S_q]`` statistics
    with ``B`` = sequences, sequence ``b`` in entry ``b``. ``lse`` is the ragged forward's;
    ``delta`` is scratch shaped like it (written here). Packed, the rows and keys of ``dq,
    dk, dv`` outside every sequence come out as zeros; in a padded batch they are not written,
    except one-pass dQ's, which come out as zeros (zero-fill ``dq, dk, dv`` first where they
    must read as zeros).

    Each kernel walks a work table of its tiles (one CTA per item x head, the heaviest first),
    unless ``BACKWARD_TABLE_MIN_IDLE_CTAS`` (``use_work_table``) keeps it on its grid. One
    launch ahead of the kernels (:func:`_launch_prologue`) fills both tables and, packed,
    clears the uncovered rows: a launch costs 12-15 µs of an H200 host's time, and a packed
    backward of short sequences is host-bound in a loop."""
    import torch

    _check_call(plan, ranges, packed=packed, tables=(False, False), dq_accum=dq_accum)
    if (parts is not None) != (plan.splits > 1):
        raise KernelArgumentError(
            f"parts must be given exactly when the plan splits its dK/dV walk; got "
            f"{_describe_given(parts)} for a plan with {plan.splits} split(s)")
    sequences, longest_q, longest_k = _counts(int(ranges.shape[1]), longest_q, longest_k)
    # the CTAs of one tile: the dQ grid's heads (query heads or packed groups), and K/V heads
    # x splits
    heads = (plan.dq_heads, plan.problem.heads_kv * plan.splits)
    per_entry = 1 if packed else sequences
    walks = ((longest_q, q.shape[2] * per_entry), (longest_k, k.shape[2] * per_entry))
    work, launched = [None, None], [None, None]
    for kernel, (tile, count, (longest, rows)) in enumerate(zip(plan.tiles, heads, walks)):
        if kernel == 0 and plan.one_pass:
            continue  # no dQ kernel runs
        items = work_items(sequences=sequences, longest=longest, rows=rows, tile=tile)
        if use_work_table(sequences=sequences, longest=longest, items=items, heads=count,
                          tile=tile, backward=True):  # always where the grid would not fit
            work[kernel] = torch.empty((2, items), dtype=torch.int32, device=ranges.device)
            launched[kernel] = (items * count, 1, 1)
        else:  # a (sequence x K/V head)'s splits of a key tile along the third axis
            split = plan.splits if kernel else 1
            launched[kernel] = _ragged_grid(tile, count // split, sequences, longest, split)
    _launch_prologue(stream, plan, ranges, work, (dq, dk, dv) if packed else None)
    dk_to, dv_to = (dk, dv) if parts is None else parts
    dq_args, dkdv_args = _arguments(plan, (q, k, v, out, grad_out, lse, delta, dq, dk_to, dv_to),
                                    ranges, packed=packed, dq_accum=dq_accum, work=tuple(work))
    _launch_walks(stream, plan, launched, (dq_args, dkdv_args),
                  (out, grad_out, delta, dq, dq_accum))
    if parts is not None:
        grid = _row_grid(k.shape[2], SUM_TILE, k.shape[0], k.shape[1])
        for partial, grad in zip(parts, (dk, dv)):
            _aot.launch(stream, grid, sum_kernel(), (partial, grad, *plan.sum_scalars))
