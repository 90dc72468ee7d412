"""The small kernels of the paged routes (``tiledattention.entry_points._page_copy``): the copy
of the pages a long query run reads (each sequence's pages, in block-table order, into slots of
its own, only those holding keys the forward reads), and a mixed step's index tables."""

from __future__ import annotations

import cuda.tile as ct

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def copy_read_pages(K, V, Table, Ranges, KOut, VOut, KFactor, VFactor, ROWS: ConstInt,
                    HEADS: ConstInt, TILE_D: ConstInt, WIDEN: ConstBool, CHUNK: ConstInt):
    """The CTAs of a 1-D grid share out the pages to copy, one at a time: sequence ``b``'s
    first ``ceil(keys / page_size)`` pages (``keys``: ``Ranges[3, b] - Ranges[2, b]``, none
    where ``Ranges[0, b] == Ranges[1, b]``; at most ``width``), in sequence order, page ``i`` of
    all of them to CTA ``i % CTAs``, so a few long sequences among many that copy nothing keep
    every CTA busy. Page ``p`` of ``b``, named by ``Table[b, p]`` (clamped into the pool), goes
    from the pools ``K`` and ``V`` (``[pages, page_size, H_kv, D]``) into slot ``b * width +
    p`` of ``KOut`` and ``VOut`` (``[B * width, page_size, H_kv, D]``), in tiles of ``ROWS``
    keys x ``HEADS`` heads x ``TILE_D`` columns (zero-filled, clipped, past the pool's heads
    and columns). ``WIDEN`` (an FP8 pool): each value times its float32 descale factor
    (``KFactor`` / ``VFactor`` ``[B or 1, H_kv]``: by sequence and K/V head), stored in the
    outputs' dtype. The sequences' counts are read ``CHUNK`` at a time. Slots of pages not
    read are left as they were."""
    me = ct.bid(0)
    ctas = ct.num_blocks(0)
    sequences = Ranges.shape[1]
    width = KOut.shape[0] // sequences
    page_size = K.shape[1]
    row_tiles = page_size // ROWS
    head_tiles = ct.cdiv(K.shape[2], HEADS)
    last = K.shape[0] - 1
    shape = (1, ROWS, HEADS, TILE_D)
    lanes = ct.arange(CHUNK, dtype=ct.int32)
    before = ct.zeros((), dtype=ct.int32)  # the pages of the sequences before this chunk
    for c in range(ct.cdiv(sequences, CHUNK)):
        def row(r):
            """Row ``r`` of the ranges of sequences ``c * CHUNK ..`` (zeros past the last)."""
            return ct.load(Ranges, index=(r, c), shape=(1, CHUNK),
                           padding_mode=ct.PaddingMode.ZERO).reshape((CHUNK,))  # [CHUNK]
        keys = row(3) - row(2)
        pages = ct.where(row(1) > row(0),
                         ct.minimum((keys + (page_size - 1)) // page_size, width), 0)
        ends = ct.cumsum(pages)  # [CHUNK]: each sequence's last page + 1, counted from before
        starts = ends - pages  # [CHUNK]: its first page
        total = ct.sum(pages)
        # this CTA's first page of the chunk: the least i >= before with i % ctas == me
        first = before + (me - before % ctas + ctas) % ctas
        for i in range(first, before + total, ctas):
            lane = ct.sum(ct.where(ends <= i - before, 1, 0))  # the sequence's lane
            seq = c * CHUNK + lane
            p = i - before - ct.sum(ct.where(lanes == lane, starts, 0))
            page = min(max(ct.gather(Table, (seq, p)), 0), last)
            slot = seq * width + p
            for t in range(row_tiles * head_tiles):
                at = (t // head_tiles, t % head_tiles, 0)
                k = ct.load(K, index=(page, *at), shape=shape, padding_mode=ct.PaddingMode.ZERO)
                v = ct.load(V, index=(page, *at), shape=shape, padding_mode=ct.PaddingMode.ZERO)
                if WIDEN:
                    heads = at[1] * HEADS + ct.arange(HEADS, dtype=ct.int32)
                    entry = min(seq, KFactor.shape[0] - 1)
                    kf = ct.gather(KFactor, (entry, heads)).reshape((1, 1, HEADS, 1))
                    vf = ct.gather(VFactor, (entry, heads)).reshape((1, 1, HEADS, 1))
                    k = ct.astype(ct.astype(k, ct.float32) * kf, KOut.dtype)
                    v = ct.astype(ct.astype(v, ct.float32) * vf, VOut.dtype)
                ct.store(KOut, index=(slot, *at), tile=k)
                ct.store(VOut, index=(slot, *at), tile=v)
        before += total


@ct.kernel
def mixed_step_tables(Cu, Used, Ranges, Keys, Rows, tokens, key_stride, key_limit,
                      CHUNK: ConstInt, APART: ConstBool):
    """The index tables of a mixed paged step (sequence ``b``'s queries ``Cu[b]:Cu[b + 1]`` of
    ``tokens`` packed rows over its first ``Used[b]`` keys), ``CHUNK`` sequences a CTA: the
    forward's ``Ranges`` (int32 ``[4, B]``: query starts and ends, key starts ``b *
    key_stride`` and ends, at most ``key_limit`` keys), and with ``APART`` (the sequences of
    one query run as a decode step of every sequence) the forward's queries held to sequences
    of more than one, the decode step's keys (``Keys``, int32 ``[B]``: none but for sequences
    of one query) and the int64 ``Rows`` ``[2, B]``: each sequence's first query row (the
    decode step's query, held below ``tokens``) and where its decode row lands (its row, or
    the spare row ``tokens`` for the others)."""
    seq = ct.bid(0) * CHUNK + ct.arange(CHUNK, dtype=ct.int32)
    sequences = Used.shape[0]
    mine = seq < sequences
    starts = ct.astype(ct.gather(Cu, seq, mask=mine), ct.int32)
    ends = ct.astype(ct.gather(Cu, seq + 1, mask=mine), ct.int32)
    used = ct.gather(Used, seq, mask=mine)
    counts = ends - starts
    longer = ends
    if APART:
        longer = ct.where(counts > 1, ends, starts)
    key_starts = seq * key_stride
    ct.scatter(Ranges, (0, seq), starts, mask=mine)
    ct.scatter(Ranges, (1, seq), longer, mask=mine)
    ct.scatter(Ranges, (2, seq), key_starts, mask=mine)
    ct.scatter(Ranges, (3, seq), key_starts + ct.minimum(used, key_limit), mask=mine)
    if APART:
        one = counts == 1
        ct.scatter(Keys, seq, ct.where(one, used, 0), mask=mine)
        ct.scatter(Rows, (0, seq), ct.astype(ct.minimum(starts, max(tokens - 1, 0)), ct.int64),
                   mask=mine)
        ct.scatter(Rows, (1, seq), ct.astype(ct.where(one, starts, tokens), ct.int64),
                   mask=mine)
