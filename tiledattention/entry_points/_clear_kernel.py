"""The kernel that clears the rows packed sequences do not cover (``_ragged_fill``)."""

from __future__ import annotations

import cuda.tile as ct

ConstInt = ct.Constant[int]


@ct.kernel
def clear_outside(Out, Ranges, WHICH: ConstInt, TILE_R: ConstInt, TILE_C: ConstInt):
    """``Out`` ``[T, W]``: zeros in rows ``[0, Ranges[WHICH, 0])`` and ``[Ranges[WHICH + 1,
    N - 1], T)``; each CTA walks tiles of those rows only, strided by the grid."""
    rows = Out.shape[0]
    first = min(ct.gather(Ranges, (WHICH, 0)), rows)
    end = min(max(ct.gather(Ranges, (WHICH + 1, Ranges.shape[1] - 1)), first), rows)
    col_tiles = ct.cdiv(Out.shape[1], TILE_C)
    head_tiles = ct.cdiv(first, TILE_R) * col_tiles
    tail_tiles = ct.cdiv(rows - end, TILE_R) * col_tiles
    zeros = ct.full((TILE_R, TILE_C), 0, dtype=Out.dtype)
    for t in range(ct.bid(0), head_tiles + tail_tiles, ct.num_blocks(0)):
        if t < head_tiles:
            region = Out.slice(axis=0, start=0, stop=first)
            ct.store(region, index=(t // col_tiles, t % col_tiles), tile=zeros)
        else:
            u = t - head_tiles
            region = Out.slice(axis=0, start=end, stop=rows)
            ct.store(region, index=(u // col_tiles, u % col_tiles), tile=zeros)
