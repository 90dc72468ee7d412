"""The small kernels around a ragged launch: its work tables (``_work_table``), zeros for the
rows that packed sequences do not cover (``tiledattention.entry_points._ragged_fill``), and the
backward's prologue, which does both for a packed backward in one launch."""

from __future__ import annotations

import cuda.tile as ct

from ..kernel_core.ranges import sequence_length

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def write_work_table(Ranges, Work, me, tile, chunk, keys):
    """CTA ``me < N`` writes sequence ``me``'s ``tile``-row query tiles (``keys``: its
    ``tile``-key tiles) into ``Work`` (int32 ``[2, items]``: row 0 the sequence, row 1 the
    tile), after the tiles of every sequence that precedes it: more work (query count x key
    count, as float32), or as much and a lower index. A sequence's tiles come heaviest first
    under a causal mask: its last query tile first, its first key tile first. CTA ``N`` writes
    -1 (no sequence) into row 0 of the items past the last tile. ``Ranges``: the int32
    ``[4, N]`` query starts, query ends, key starts, key ends; ``chunk`` sequences (and tiles)
    a step."""
    axis = 0
    if keys:
        axis = 2
    n = Ranges.shape[1]
    mine = min(me, n - 1)
    q_len = sequence_length(Ranges, mine, 0)
    k_len = sequence_length(Ranges, mine, 2)
    own_len = sequence_length(Ranges, mine, axis)
    weight = ct.astype(q_len, ct.float32) * ct.astype(k_len, ct.float32)
    lanes = ct.arange(chunk, dtype=ct.int32)
    start = ct.zeros((), dtype=ct.int32)  # the tiles of the sequences before this one
    total = ct.zeros((), dtype=ct.int32)  # the tiles of all sequences
    for c in range(ct.cdiv(n, chunk)):
        def row(r):
            """Row ``r`` of the ranges of sequences ``c * chunk ..`` (zeros past the last)."""
            return ct.load(Ranges, index=(r, c), shape=(1, chunk),
                           padding_mode=ct.PaddingMode.ZERO).reshape((chunk,))  # [chunk]
        lengths = row(axis + 1) - row(axis)
        tiles = (lengths + (tile - 1)) // tile
        work = ct.astype(row(1) - row(0), ct.float32) * ct.astype(row(3) - row(2), ct.float32)
        before = (work > weight) | ((work == weight) & (c * chunk + lanes < me))
        start += ct.sum(ct.where(before, tiles, 0))
        total += ct.sum(tiles)
    if me < n:
        count = (own_len + (tile - 1)) // tile
        for c in range(ct.cdiv(count, chunk)):
            local = c * chunk + lanes
            keep = local < count
            index = count - 1 - local
            if keys:
                index = local
            ct.scatter(Work, (0, start + local), ct.full((chunk,), me, dtype=ct.int32),
                       mask=keep)
            ct.scatter(Work, (1, start + local), index, mask=keep)
    else:
        for c in range(ct.cdiv(Work.shape[1] - total, chunk)):
            ct.scatter(Work, (0, total + c * chunk + lanes),
                       ct.full((chunk,), -1, dtype=ct.int32))


def clear_uncovered(A, Ranges, which, cta, ctas, tile_r, tile_d):
    """Zeros in the rows of ``A`` (``[1, H, T, D]``: packed sequences end to end, ``tile_d`` at
    least ``D``) before the first sequence's start and from the last one's end on, rows
    ``which`` and ``which + 1`` of ``Ranges`` (0: queries, 2: keys); CTA ``cta`` of ``ctas``
    stores every ``ctas``-th tile of ``tile_r`` rows of one head, nothing where the sequences
    cover ``A``."""
    rows = A.shape[2]
    heads = A.shape[1]
    first = min(ct.gather(Ranges, (which, 0)), rows)
    end = min(max(ct.gather(Ranges, (which + 1, Ranges.shape[1] - 1)), first), rows)
    head_tiles = ct.cdiv(first, tile_r) * heads
    tail_tiles = ct.cdiv(rows - end, tile_r) * heads
    zeros = ct.full((1, 1, tile_r, tile_d), 0, dtype=A.dtype)
    for t in range(cta, head_tiles + tail_tiles, ctas):
        if t < head_tiles:
            region = A.slice(axis=2, start=0, stop=first)
            ct.store(region, index=(0, t % heads, t // heads, 0), tile=zeros)
        else:
            u = t - head_tiles
            region = A.slice(axis=2, start=end, stop=rows)
            ct.store(region, index=(0, u % heads, u // heads, 0), tile=zeros)


@ct.kernel
def fill_work_table(Ranges, Work, TILE: ConstInt, CHUNK: ConstInt, KEYS: ConstBool):
    """A ragged launch's work table (:func:`write_work_table`), CTA ``i`` of ``N + 1`` on
    sequence ``i``."""
    write_work_table(Ranges, Work, ct.bid(0), tile=TILE, chunk=CHUNK, keys=KEYS)


@ct.kernel
def clear_outside(Out, Ranges, WHICH: ConstInt, TILE_R: ConstInt, TILE_D: ConstInt):
    """:func:`clear_uncovered` of ``Out``, the grid's CTAs sharing its tiles."""
    clear_uncovered(Out, Ranges, which=WHICH, cta=ct.bid(0), ctas=ct.num_blocks(0),
                    tile_r=TILE_R, tile_d=TILE_D)


@ct.kernel
def backward_prologue(Ranges, WorkQ, WorkK, dQ, dK, dV, TILE_Q: ConstInt, TILE_K: ConstInt,
                      CHUNK: ConstInt, QUERY_TABLE: ConstBool, KEY_TABLE: ConstBool,
                      CLEAR: ConstBool, TILE_R: ConstInt, TILE_D: ConstInt):
    """What a ragged backward needs before its dQ and dK/dV kernels, in one launch of ``N + 1``
    x 3 CTAs: along the grid's second axis, the dQ kernel's table of ``TILE_Q``-row query tiles
    (``QUERY_TABLE``), the dK/dV kernel's of ``TILE_K``-key tiles (``KEY_TABLE``), and
    (``CLEAR``, sequences packed end to end) zeros in the rows of ``dQ``, ``dK`` and ``dV``
    that no sequence covers, which neither kernel writes. A part not asked for does nothing
    (its arrays are not passed)."""
    part = ct.bid(1)
    me = ct.bid(0)
    if part == 0:
        if QUERY_TABLE:
            write_work_table(Ranges, WorkQ, me, tile=TILE_Q, chunk=CHUNK, keys=False)
    elif part == 1:
        if KEY_TABLE:
            write_work_table(Ranges, WorkK, me, tile=TILE_K, chunk=CHUNK, keys=True)
    else:
        if CLEAR:
            ctas = ct.num_blocks(0)
            clear_uncovered(dQ, Ranges, which=0, cta=me, ctas=ctas, tile_r=TILE_R,
                            tile_d=TILE_D)
            clear_uncovered(dK, Ranges, which=2, cta=me, ctas=ctas, tile_r=TILE_R,
                            tile_d=TILE_D)
            clear_uncovered(dV, Ranges, which=2, cta=me, ctas=ctas, tile_r=TILE_R,
                            tile_d=TILE_D)
