"""Work tables for ragged launches whose sequence lengths are skewed.

A ragged launch's plain grid gives every (sequence x head) the longest sequence's tiles; a CTA
past its own sequence's end does nothing, but still costs its launch. With one 5k-token
sequence among 76 short ones (64k tokens, H 32) that is ~80k idle CTAs, 0.8 ms of a 2.8 ms
forward on an H100. A work table lists only the tiles the sequences have, the heaviest
sequences (queries x keys) first and each one's heaviest tile under a causal mask first (its
last query tile, its first key tile), so the long jobs start early; the kernel then runs one
CTA per (item x head) on a 1-D grid (``WORK_TABLE``): the forward and the backward's dQ kernel
over query tiles, the backward's dK/dV kernel over key tiles.

The table is built on the device by one small kernel (``_work_kernel``), from the range table
alone: no host round trip, capturable in a CUDA graph. Its size is a bound the host knows
(:func:`work_items`); items past the last tile name no sequence.
"""

from __future__ import annotations

from typing import Any

from . import _aot
from ._lazy import lazy_module

ct = lazy_module("cuda.tile", globals(), "ct")

__all__ = ["work_items", "use_work_table", "make_work_table", "TABLE_MIN_IDLE_CTAS",
           "BACKWARD_TABLE_MIN_IDLE_CTAS", "GRID_Y_LIMIT", "CHUNK", "CLEAR_TILE_ROWS"]

#: A ragged forward walks a work table when the plain grid would launch at least this many
#: idle CTAs (each costs ~10 ns of a forward on an H100: module docstring).
TABLE_MIN_IDLE_CTAS = 8192
#: The ragged backward's threshold: always. Its grids have no heavy-first order (the heavy
#: tiles of each sequence lie at its own end), so the table's order pays even where few CTAs
#: would idle: on an H200 over 19 packed batches the tables ran 1.10x and 1.25x the grids'
#: speed on geometric mean (up to 2.03x; a 9000-token causal sequence with two short ones
#: 1.21x), 0.98x at worst (GPU time; isolated calls 0.94x at worst, the tables' two launches:
#: docs/records/benchmarks/varlen/issue50/README.md)
BACKWARD_TABLE_MIN_IDLE_CTAS = 0
#: CUDA's limit on a grid's second dimension, where a ragged grid puts sequences x heads: a
#: launch past it walks a table (a 1-D grid holds 2^31 - 1 CTAs)
GRID_Y_LIMIT = 65535
#: the sequences one step of the table kernel compares, and the tiles one step writes
CHUNK = 256
#: rows of one tile of zeros where packed sequences leave rows uncovered (``_work_kernel``'s
#: ``clear_uncovered``)
CLEAR_TILE_ROWS = 16


def work_items(*, sequences: int, longest: int, rows: int, tile: int) -> int:
    """How many tiles a ragged call's sequences can have at most along one axis (queries or
    keys): ``tile``-row tiles of ``sequences`` sequences of at most ``longest`` rows each,
    lying in ``rows`` rows in all without overlapping (the caller's word, as ``longest`` is)."""
    per_sequence = -(-int(longest) // tile)
    partial = (int(rows) + sequences * (tile - 1)) // tile  # each may end inside a tile
    return max(1, min(sequences * per_sequence, partial))


def use_work_table(*, sequences: int, longest: int, items: int, heads: int, tile: int,
                   backward: bool = False) -> bool:
    """Whether a table of ``items`` leaves at least :data:`TABLE_MIN_IDLE_CTAS` (``backward``:
    :data:`BACKWARD_TABLE_MIN_IDLE_CTAS`) of the plain grid's CTAs (the longest sequence's
    tiles for every sequence x head) unlaunched, or the plain grid would not fit
    (:data:`GRID_Y_LIMIT`)."""
    if sequences * heads > GRID_Y_LIMIT:
        return True
    grid = sequences * -(-int(longest) // tile)
    least = BACKWARD_TABLE_MIN_IDLE_CTAS if backward else TABLE_MIN_IDLE_CTAS
    return (grid - items) * heads >= least


def compile_work_table(sequences: int, tile: int, arch: str, *, keys: bool = False) -> None:
    """Compile (only) the work-table kernel for ``sequences`` sequences and ``tile``-row query
    tiles (``keys``: ``tile``-key tiles) on ``arch``: what a ragged launch of such a call may
    run first (``tiledtune aot`` keeps it, under ``capturing``)."""
    from ._compile import array_constraint, export_cubin
    from ._work_kernel import fill_work_table

    export_cubin(fill_work_table, (array_constraint("int32", (4, sequences)),
                                   array_constraint("int32", (2, 2 * sequences)), tile, CHUNK,
                                   bool(keys)),
                 arch, "fill_work_table")


def make_work_table(stream: Any, ranges: Any, tile: int, items: int, *,
                    keys: bool = False) -> Any:
    """The int32 ``[2, items]`` work table of the sequences in ``ranges`` (int32 ``[4, N]``,
    a torch tensor), enqueued on ``stream``: row 0 a sequence (-1 for items past the last
    tile), row 1 one of its ``tile``-row query tiles, or with ``keys`` its ``tile``-key tiles
    (module docstring for the order)."""
    import torch

    from ._work_kernel import fill_work_table  # with cuda.tile, on first use

    table = torch.empty((2, items), dtype=torch.int32, device=ranges.device)
    _aot.launch(stream, (ranges.shape[1] + 1,), fill_work_table,
                (ranges, table, tile, CHUNK, bool(keys)))
    return table
