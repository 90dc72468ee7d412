"""The kernel that builds a skewed ragged batch's work table (``_work_table``)."""

from __future__ import annotations

import cuda.tile as ct

from ..kernel_core.ranges import sequence_length

ConstInt = ct.Constant[int]


@ct.kernel
def fill_work_table(Ranges, Work, TILE_M: ConstInt, CHUNK: ConstInt):
    """CTA ``i < N`` writes sequence ``i``'s ``TILE_M``-row query tiles into ``Work`` (int32
    ``[2, items]``: row 0 the sequence, row 1 the tile), last tile first, after the tiles of
    every sequence that precedes it: more work (query count x key count, as float32), or as much
    and a lower index. CTA ``N`` writes -1 (no sequence) into row 0 of the items past the last
    tile. ``Ranges``: the int32 ``[4, N]`` query starts, query ends, key starts, key ends."""
    n = Ranges.shape[1]
    me = ct.bid(0)
    mine = min(me, n - 1)
    q_len = sequence_length(Ranges, mine, 0)
    k_len = sequence_length(Ranges, mine, 2)
    weight = ct.astype(q_len, ct.float32) * ct.astype(k_len, ct.float32)
    lanes = ct.arange(CHUNK, dtype=ct.int32)
    start = ct.zeros((), dtype=ct.int32)  # the tiles of the sequences before this one
    total = ct.zeros((), dtype=ct.int32)  # the tiles of all sequences
    for c in range(ct.cdiv(n, CHUNK)):
        def row(r):
            """Row ``r`` of the ranges of sequences ``c * CHUNK ..`` (zeros past the last)."""
            return ct.load(Ranges, index=(r, c), shape=(1, CHUNK),
                           padding_mode=ct.PaddingMode.ZERO).reshape((CHUNK,))  # [CHUNK]
        lengths = row(1) - row(0)
        tiles = (lengths + (TILE_M - 1)) // TILE_M
        work = ct.astype(lengths, ct.float32) * ct.astype(row(3) - row(2), ct.float32)
        before = (work > weight) | ((work == weight) & (c * CHUNK + lanes < me))
        start += ct.sum(ct.where(before, tiles, 0))
        total += ct.sum(tiles)
    if me < n:
        count = (q_len + (TILE_M - 1)) // TILE_M
        for c in range(ct.cdiv(count, CHUNK)):
            local = c * CHUNK + lanes
            keep = local < count
            ct.scatter(Work, (0, start + local), ct.full((CHUNK,), me, dtype=ct.int32),
                       mask=keep)
            ct.scatter(Work, (1, start + local), count - 1 - local, mask=keep)
    else:
        for c in range(ct.cdiv(Work.shape[1] - total, CHUNK)):
            ct.scatter(Work, (0, total + c * CHUNK + lanes),
                       ct.full((CHUNK,), -1, dtype=ct.int32))
