"""The flat paged decode's launches (``DecodeSchedule.flat``, ``_flat_kernel``): one wave of
split CTAs sharing the batch's (row, key tile) items evenly, and a merge of the rows their
shares cut.

Its scratch is one float32 buffer per call, ``[slots * TILE_M + B + 1]`` after the
``[slots, TILE_M, TILE_D]`` partial outputs (``slots`` = rows + CTAs): the rows' log-sum-exps,
then the int32 item offsets ``Cu`` the split kernel writes for the merge (the same bytes), so
the decode plan's two kept scratch buffers serve it as they serve the split kernel's partials;
:func:`flat_scratch` cuts the three arrays the kernels take from them once, where the buffers
are made (four view ops a call cost the warm call about 4 µs of host time).
:func:`flat_walk` is the kernels' arithmetic in Python, which the CPU tests check the even
shares and the slots against.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, NamedTuple

from ...core import _aot
from ...core._lazy import lazy_module

ct = lazy_module("cuda.tile", globals(), "ct")

__all__ = ["FlatLaunches", "flat_launches", "launch_flat", "flat_scratch", "flat_scratch_shapes",
           "flat_walk",
           "MERGE_CHUNK_D", "MERGE_UNROLL", "B_PAD_LEAST",
           "ONE_LOOP_DTYPE", "ONE_LOOP_MAX_HEAD_DIM", "one_loop"]

#: The least width of the item offsets' tile: tileiras 13.4 gives the sm_90 split kernel 64-80
#: bytes of stack at D 96-128 with a tile of 16 or fewer (1.13 million local-memory spill
#: requests in one B12 call under Nsight Compute), none from 32 (``paged_flat_stack.py``).
B_PAD_LEAST = 32
#: A 16-bit cache's dtype and the largest (padded) head dim whose split kernel walks a
#: segment's key tiles in one loop that masks each (``ONE_LOOP``), not an unmasked loop and a
#: masked one: tileiras 13.4 gives the sm_90 bf16 kernel at D 64 with two loops 96-344 bytes
#: of stack and with one loop none at loads two steps ahead (at D 32: 40 bytes, against
#: 248-624 with two loops or four ahead), while the fp16 kernel keeps 48 with two loops and
#: 448-912 with one (``docs/records/probes/paged_flat_oneloop.py``).
ONE_LOOP_DTYPE = "bf16"
ONE_LOOP_MAX_HEAD_DIM = 64
#: Head-dim columns per merge CTA, and partials merged per step (as ``decode_combine``'s).
MERGE_CHUNK_D = 32
MERGE_UNROLL = 4


class FlatLaunches(NamedTuple):
    """What a flat call launches, less the arrays: built once per plan."""

    ctas: int  # the split kernel's grid: the device's SMs x the schedule's occupancy
    rows: int  # the layout's rows (entries x view heads x query tiles)
    rows_per_entry: int
    tile_m: int
    tile_n: int
    tile_d: int
    b_pad: int  # a power of two past the batch, at least B_PAD_LEAST: the item offsets' tile
    split: Any  # the hinted flat_split kernel
    split_constants: tuple
    merge_constants: tuple
    merge_grid: tuple[int, int, int]
    kv_div: int

    @property
    def slots(self) -> int:
        """The partials' slots: a cut row's partial goes to slot row + CTA (``flat_walk``)."""
        return self.rows + self.ctas

    @property
    def batch(self) -> int:
        return self.rows // self.rows_per_entry


def _kernels():
    from . import _flat_kernel

    return _flat_kernel


@functools.lru_cache(maxsize=64)
def _hinted_split(occupancy: int, num_worker_warps: int | None) -> Any:
    return _kernels().flat_split.replace_hints(occupancy=occupancy,
                                               num_worker_warps=num_worker_warps)


def one_loop(dtype: str, tile_d: int) -> bool:
    """Whether the split kernel of a ``dtype`` cache at the padded head dim ``tile_d`` walks
    its key tiles in one loop (:data:`ONE_LOOP_DTYPE`)."""
    return dtype == ONE_LOOP_DTYPE and tile_d <= ONE_LOOP_MAX_HEAD_DIM


def flat_launches(batch: int, tiles: Any, schedule: Any, tile_d: int, page_rows: int,
                  page_size: int, causal: bool, sms: int, dtype: str) -> FlatLaunches:
    """The flat launches of a layout ``tiles`` (``_launch.Layout``) of ``batch`` entries of a
    ``dtype`` cache in pages of ``page_size`` keys (``page_rows`` a load) with
    ``schedule``'s tiles, loads and occupancy, over ``sms`` SMs."""
    chunk = min(tile_d, MERGE_CHUNK_D)
    b_pad = max(B_PAD_LEAST, 1 << batch.bit_length())
    return FlatLaunches(
        ctas=sms * schedule.occupancy, rows=tiles.rows, rows_per_entry=tiles.rows // batch,
        tile_m=tiles.tile_m, tile_n=schedule.tile_n, tile_d=tile_d,
        b_pad=b_pad,
        split=_hinted_split(schedule.occupancy, schedule.num_worker_warps),
        split_constants=(tiles.tile_g, tiles.tile_s, schedule.tile_n, tile_d, page_rows,
                         page_size, schedule.k_latency or 0, schedule.v_latency or 0, b_pad, causal,
                         one_loop(dtype, tile_d)),
        merge_constants=(tiles.tile_g, tiles.tile_s, chunk, MERGE_UNROLL),
        merge_grid=(tiles.rows, tile_d // chunk, 1), kv_div=tiles.kv_div)


def flat_scratch_shapes(flat: FlatLaunches) -> tuple[tuple, tuple]:
    """The float32 scratch of a flat call: the partial outputs, and the log-sum-exps with the
    int32 offsets after them."""
    return (flat.slots, flat.tile_m, flat.tile_d), (flat.slots * flat.tile_m + flat.batch + 1,)


def flat_scratch(flat: FlatLaunches, opart: Any, tail: Any) -> tuple[Any, Any, Any]:
    """The kernels' scratch arrays in the two float32 torch buffers of
    :func:`flat_scratch_shapes`: the partial outputs ``opart``, the rows' log-sum-exps
    ``[slots, TILE_M]`` and the int32 item offsets ``[B + 1]`` after them in ``tail``."""
    import torch

    rows = flat.slots * flat.tile_m
    lse = tail[:rows].view(flat.slots, flat.tile_m)
    return opart, lse, tail[rows:rows + flat.batch + 1].view(torch.int32)


def launch_flat(stream: Any, flat: FlatLaunches, q5: Any, out5: Any, k: Any, v: Any,
                scratch: tuple[Any, Any, Any], scale: float, lens: Any, pages: Any) -> None:
    """Enqueue the split and merge kernels on ``stream``: ``q5``, ``out5`` the
    ``[B, H', G', S_q, D]`` views, ``k``, ``v`` the page pools, ``scratch`` the arrays of
    :func:`flat_scratch`, ``lens`` the int32 ``[B]`` key counts, ``pages`` the int32 block
    table."""
    opart, lse, cu = scratch
    _aot.launch(stream, (flat.ctas, 1, 1), flat.split,
                (q5, out5, k, v, opart, lse, cu, lens, pages, scale, flat.kv_div,
                 *flat.split_constants))
    _aot.launch(stream, flat.merge_grid, _kernels().flat_merge,
                (opart, lse, out5, cu, flat.ctas, *flat.merge_constants))


def flat_walk(flat: FlatLaunches, lengths: list[int], keys_cap: int
              ) -> tuple[list[list[tuple[int, int, int, bool]]], list[int]]:
    """The kernels' walk in Python for entries of ``lengths`` keys: per CTA its segments
    ``(row, first key tile, stop key tile, whole)`` (``whole``: the CTA writes the row's output,
    else its partial goes to slot ``row + cta``), and per row the slots the merge reads (empty
    where one CTA wrote it)."""
    per_entry = flat.rows_per_entry
    tiles = [-(-min(n, keys_cap) // flat.tile_n) for n in lengths]
    cu = [0, *itertools.accumulate(t * per_entry for t in tiles)]
    total = cu[-1]
    per = -(-total // flat.ctas)

    def row_span(row: int) -> tuple[int, int]:
        entry = row // per_entry
        return cu[entry] + row % per_entry * tiles[entry], tiles[entry]

    def row_of(item: int) -> int:
        entry = max(b for b in range(len(lengths)) if cu[b] <= item)
        return entry * per_entry + (item - cu[entry]) // max(tiles[entry], 1)

    walks = []
    for cta in range(flat.ctas):
        lo = min(cta * per, total)
        hi = min(lo + per, total)
        segments = []
        if lo < hi:
            for row in range(row_of(lo), row_of(hi - 1) + 1):
                start, count = row_span(row)
                segments.append((row, max(lo, start) - start, min(hi, start + count) - start,
                                 lo <= start and start + count <= hi))
        walks.append(segments)
    merged = []
    for row in range(len(lengths) * per_entry):
        start, count = row_span(row)
        first = start // max(per, 1)
        cut = count and (start + count - 1) // max(per, 1) > first
        merged.append([row + first + u for u in range((start + count - 1) // per - first + 1)]
                      if cut else [])
    return walks, merged
