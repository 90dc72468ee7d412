"""The kernel that builds a skewed ragged batch's work table (``_work_table``)."""

from __future__ import annotations

import cuda.tile as ct

from ..kernel_core.ranges import sequence_length

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def fill_work_table(Ranges, Work, TILE: ConstInt, CHUNK: ConstInt, KEYS: ConstBool):
    """CTA ``i < N`` writes sequence ``i``'s ``TILE``-row query tiles (``KEYS``: its
    ``TILE``-key tiles) into ``Work`` (int32 ``[2, items]``: row 0 the sequence, row 1 the
    tile), after the tiles of every sequence that precedes it: more work (query count x key
    count, as float32), or as much and a lower index. A sequence's tiles come heaviest first
    under a causal mask: its last query tile first, its first key tile first. CTA ``N`` writes
    -1 (no sequence) into row 0 of the items past the last tile. ``Ranges``: the int32
    ``[4, N]`` query starts, query ends, key starts, key ends."""
    axis = 0
    if KEYS:
        axis = 2
    n = Ranges.shape[1]
    me = ct.bid(0)
    mine = min(me, n - 1)
    q_len = sequence_length(Ranges, mine, 0)
    k_len = sequence_length(Ranges, mine, 2)
    own_len = sequence_length(Ranges, mine, axis)
    weight = ct.astype(q_len, ct.float32) * ct.astype(k_len, ct.float32)
    lanes = ct.arange(CHUNK, dtype=ct.int32)
    start = ct.zeros((), dtype=ct.int32)  # the tiles of the sequences before this one
    total = ct.zeros((), dtype=ct.int32)  # the tiles of all sequences
    for c in range(ct.cdiv(n, CHUNK)):
        def row(r):
            """Row ``r`` of the ranges of sequences ``c * CHUNK ..`` (zeros past the last)."""
            return ct.load(Ranges, index=(r, c), shape=(1, CHUNK),
                           padding_mode=ct.PaddingMode.ZERO).reshape((CHUNK,))  # [CHUNK]
        lengths = row(axis + 1) - row(axis)
        tiles = (lengths + (TILE - 1)) // TILE
        work = ct.astype(row(1) - row(0), ct.float32) * ct.astype(row(3) - row(2), ct.float32)
        before = (work > weight) | ((work == weight) & (c * CHUNK + lanes < me))
        start += ct.sum(ct.where(before, tiles, 0))
        total += ct.sum(tiles)
    if me < n:
        count = (own_len + (TILE - 1)) // TILE
        for c in range(ct.cdiv(count, CHUNK)):
            local = c * CHUNK + lanes
            keep = local < count
            tile = count - 1 - local
            if KEYS:
                tile = local
            ct.scatter(Work, (0, start + local), ct.full((CHUNK,), me, dtype=ct.int32),
                       mask=keep)
            ct.scatter(Work, (1, start + local), tile, mask=keep)
    else:
        for c in range(ct.cdiv(Work.shape[1] - total, CHUNK)):
            ct.scatter(Work, (0, total + c * CHUNK + lanes),
                       ct.full((CHUNK,), -1, dtype=ct.int32))
