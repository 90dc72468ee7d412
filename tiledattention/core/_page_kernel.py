"""The copy of the pages a long query run reads (``tiledattention.entry_points._page_copy``):
each sequence's pages, in block-table order, into slots of its own, but only the pages holding
keys the forward's ragged kernel reads (a sequence with no queries there reads none)."""

from __future__ import annotations

import cuda.tile as ct

ConstInt = ct.Constant[int]


@ct.kernel
def copy_read_pages(K, V, Table, Ranges, KOut, VOut, ROWS: ConstInt, HEADS: ConstInt,
                    TILE_D: ConstInt):
    """CTA ``(b, g)`` of a ``[B, G]`` grid copies every ``G``-th page from ``g`` on of
    sequence ``b``'s first ``ceil(keys / page_size)`` pages (``keys``: ``Ranges[3, b] -
    Ranges[2, b]``, none where ``Ranges[0, b] == Ranges[1, b]``), page ``p`` named by
    ``Table[b, p]`` (clamped into the pool), from the pools ``K`` and ``V`` (``[pages,
    page_size, H_kv, D]``) into slot ``b * width + p`` of ``KOut`` and ``VOut`` (``[B * width,
    page_size, H_kv, D]``), in tiles of ``ROWS`` keys x ``HEADS`` heads x ``TILE_D`` columns
    (zero-filled, clipped, past the pool's heads and columns). Slots of pages not read are
    left as they were."""
    seq = ct.bid(0)
    sequences = Ranges.shape[1]
    width = KOut.shape[0] // sequences
    page_size = K.shape[1]
    asked = ct.gather(Ranges, (1, seq)) > ct.gather(Ranges, (0, seq))
    keys = ct.gather(Ranges, (3, seq)) - ct.gather(Ranges, (2, seq))
    pages = 0
    if asked:
        pages = min(ct.cdiv(keys, page_size), width)
    row_tiles = page_size // ROWS
    head_tiles = ct.cdiv(K.shape[2], HEADS)
    last = K.shape[0] - 1
    shape = (1, ROWS, HEADS, TILE_D)
    for p in range(ct.bid(1), pages, ct.num_blocks(1)):
        page = min(max(ct.gather(Table, (seq, p)), 0), last)
        slot = seq * width + p
        for t in range(row_tiles * head_tiles):
            at = (t // head_tiles, t % head_tiles, 0)
            k = ct.load(K, index=(page, *at), shape=shape, padding_mode=ct.PaddingMode.ZERO)
            v = ct.load(V, index=(page, *at), shape=shape, padding_mode=ct.PaddingMode.ZERO)
            ct.store(KOut, index=(slot, *at), tile=k)
            ct.store(VOut, index=(slot, *at), tile=v)
