"""The flat paged decode (cuTile): one wave of CTAs shares a paged batch's work evenly,
whatever its lengths.

The work is a list of *items*, one per (row, key tile), rows being (batch entry, head of the
view, query tile) in that order, so an entry's rows are adjacent and each has as many items as
the entry has key tiles. Each CTA computes the entries' item offsets from their lengths on the
device itself (``_offsets``: a cumulative sum over a tile of the batch; CTA 0 also writes them
to ``Cu`` for the merge), so no length waits on the host and no kernel runs before the walk.
``flat_split``'s CTA ``c`` of ``C`` walks items ``[c * per, (c + 1) * per)`` with ``per =
ceil(total / C)``: the part of each row that falls in its range, row after row (a *segment*),
folding key tiles into the running softmax as ``decode_split`` does. A row whose items all
fall in the CTA's range is normalised and written by it; a row cut by a range boundary leaves
its segment's normalised partial output and base-2 log-sum-exp in slot ``row + c``, and
``flat_merge`` merges the slots of such rows (``row + c`` is unique: a later CTA never walks an
earlier row, so two segments with the same slot would be the same one). An entry of no keys
has no items: the merge writes its rows as zeros.

So a batch of one long cache and many short ones streams as evenly as one of equal lengths:
the proportional splits of ``decode_split`` give each row the same number of CTAs whatever
its length, and every extra CTA costs an SM slot's start and drain.

Plain paged caches only (16-bit K and V, no window, softcap or sinks): ``_launch.normalise``
turns ``flat`` off elsewhere. Every UPPER_CASE parameter is a compile-time constant.
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from ...kernel_core.numbers import LOG2_E, NEG_BIG
from ...kernel_core.ranges import page_rows
from ...kernel_core.softmax import log_sum_exp, merged_splits, normalised, online_softmax

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

def _offsets(Lens, entries, keys_cap, rows_per_entry, TILE_N, B_PAD):
    """``(starts, items)``, int32 ``[B_PAD]``: entry ``b``'s first item and its item count (its
    rows times its key tiles, its length capped at ``keys_cap``, its block table's keys); past
    the batch, the total and 0."""
    idx = ct.arange(B_PAD, dtype=np.int32)
    lens = ct.minimum(ct.gather(Lens, idx, mask=idx < entries, padding_value=0), keys_cap)
    items = (lens + (TILE_N - 1)) // TILE_N * rows_per_entry
    return ct.cumsum(items, axis=0) - items, items


def _pick(tile, i, B_PAD):
    """``tile[i]`` of a ``[B_PAD]`` tile, ``i`` a scalar."""
    return ct.sum(ct.where(ct.arange(B_PAD, dtype=np.int32) == i, tile, 0))


def _row_of(starts, items, item, rows_per_entry, B_PAD):
    """The row of ``item`` (``0 <= item < total``): its entry is the last whose first item is
    at most ``item`` (an empty entry starts where the next one does; past the batch the starts
    are the total)."""
    entry = ct.sum(ct.where(starts <= item, 1, 0)) - 1
    tiles = max(_pick(items, entry, B_PAD) // rows_per_entry, 1)
    return entry * rows_per_entry + (item - _pick(starts, entry, B_PAD)) // tiles


def _row_items(starts, items, row, rows_per_entry, B_PAD):
    """Row ``row``'s entry and its items ``[lo, lo + tiles)``: ``(entry, lo, tiles)``."""
    entry = row // rows_per_entry
    tiles = _pick(items, entry, B_PAD) // rows_per_entry
    return entry, _pick(starts, entry, B_PAD) + row % rows_per_entry * tiles, tiles


def _row_items_of(Cu, row, rows_per_entry):
    """:func:`_row_items` from the offsets ``flat_split`` wrote (``Cu``: the starts of the
    entries and the total after them)."""
    entry = row // rows_per_entry
    first = ct.gather(Cu, entry)
    tiles = (ct.gather(Cu, entry + 1) - first) // rows_per_entry
    return entry, first + row % rows_per_entry * tiles, tiles


def _fold(q, keys, j, masked, m_i, l_i, acc, scale, TILE_N, TILE_D, PAGE_ROWS, PAGE_SIZE,
          K_LATENCY, V_LATENCY, CAUSAL):
    """Fold key tile ``j`` of an entry into its rows' running ``(m_i, l_i, acc)``. ``keys``:
    the pools, the block table, the entry, its K/V head, its key count and each row's last
    visible key (``[TILE_M, 1]``); ``masked``: the tile reaches past the entry's keys or a
    row's causal bound."""
    K, V, Pages, entry, kv_head, seqlen_k, last_key = keys
    PAD = ct.static_eval(ct.PaddingMode.ZERO)
    k = ct.transpose(page_rows(K, Pages, entry, kv_head, j, 0, TILE_N, PAGE_ROWS, width=TILE_D,
                               latency=K_LATENCY, PAD=PAD, page_size=PAGE_SIZE))  # [TILE_D, TILE_N]
    qk = ct.mma(q, k, ct.full((q.shape[0], TILE_N), 0.0, dtype=np.float32))
    if masked:
        key_ids = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[None, :]
        keep = key_ids < seqlen_k
        if CAUSAL:
            keep = keep & (key_ids <= last_key)
        qk = ct.where(keep, qk, -np.inf)
    p, m_i, l_i, alpha = online_softmax(qk, m_i, l_i, scale, True, prescaled=False)
    v = page_rows(V, Pages, entry, kv_head, j, 0, TILE_N, PAGE_ROWS, width=TILE_D,
                  latency=V_LATENCY, PAD=PAD, page_size=PAGE_SIZE)  # [TILE_N, TILE_D]
    if masked:  # a page's rows past the keys hold anything: 0 * NaN is not 0
        key_rows = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[:, None]
        v = ct.where(key_rows < seqlen_k, v, 0.0)
    return m_i, l_i, ct.mma(p.astype(v.dtype), v, acc * alpha)


@ct.kernel
def flat_split(
    Q, Out,  # [B, H', G', S_q, D] views of q and the output
    K, V,  # [pages, page_size, H_kv, D] page pools
    Opart,  # [rows + CTAs, TILE_M, TILE_D] float32: the cut rows' partial outputs
    Lse,  # [rows + CTAs, TILE_M] float32: their base-2 log-sum-exps
    Cu,  # int32 [B + 1]: the entries' first items and the total, for flat_merge
    Lens,  # int32 [B]: the entries' key counts
    Pages,  # int32 [B, max_pages]: the block table
    qk_scale: float,
    kv_div: int,  # head of Q's view // kv_div = K/V head
    TILE_G: ConstInt,  # query heads per tile
    TILE_S: ConstInt,  # query positions per tile
    TILE_N: ConstInt,  # keys per item
    TILE_D: ConstInt,  # the head dim rounded up to a power of two
    PAGE_ROWS: ConstInt,  # keys per load, dividing the page size and TILE_N
    PAGE_SIZE: ConstInt,  # the pools' keys a page (K.shape[1])
    K_LATENCY: ConstInt,  # 1..10, or 0: the compiler's choice
    V_LATENCY: ConstInt,
    B_PAD: ConstInt,  # a power of two > B
    CAUSAL: ConstBool,  # query position i sees keys up to i + S_k - S_q
    ONE_LOOP: ConstBool,  # walk a segment's key tiles in one loop, each masked
):
    TILE_M = ct.static_eval(TILE_G * TILE_S)
    PAD = ct.static_eval(ct.PaddingMode.ZERO)
    heads = Q.shape[1]
    q_tiles = ct.cdiv(Q.shape[3], TILE_S)
    rows_per_entry = heads * q_tiles
    entries = Q.shape[0]
    keys_cap = Pages.shape[1] * PAGE_SIZE
    starts, items = _offsets(Lens, entries, keys_cap, rows_per_entry, TILE_N, B_PAD)
    total = ct.sum(items)
    cta = ct.bid(0)
    if cta == 0:
        idx = ct.arange(B_PAD, dtype=np.int32)
        ct.scatter(Cu, idx, starts, mask=idx <= entries)
    per = ct.cdiv(total, ct.num_blocks(0))
    lo = min(cta * per, total)  # this CTA's items [lo, hi)
    hi = min(lo + per, total)
    first_row = _row_of(starts, items, max(min(lo, total - 1), 0), rows_per_entry, B_PAD)
    last_row = _row_of(starts, items, max(hi - 1, 0), rows_per_entry, B_PAD)
    segments = max(last_row - first_row + 1, 0)
    if lo >= hi:
        segments = 0
    scale = qk_scale * LOG2_E
    for segment in range(segments):
        row = first_row + segment
        entry, row_lo, tiles = _row_items(starts, items, row, rows_per_entry, B_PAD)
        within = row % rows_per_entry
        head = within // q_tiles
        q_tile = within % q_tiles
        kv_head = head // kv_div
        start = max(lo, row_lo) - row_lo  # this segment's key tiles [start, stop)
        stop = min(hi, row_lo + tiles) - row_lo
        seqlen_k = min(ct.gather(Lens, entry), keys_cap)
        offset = seqlen_k - Q.shape[3]
        first_pos = q_tile * TILE_S
        positions = first_pos + ct.arange(TILE_M, dtype=np.int32)[:, None] % TILE_S
        visible = seqlen_k  # every row of the tile sees the keys before this one
        if CAUSAL:
            visible = min(seqlen_k, max(first_pos + offset + 1, 0))
        unmasked_stop = min(max(visible // TILE_N, start), stop)
        q = ct.load(Q, index=(entry, head, 0, q_tile, 0), shape=(1, 1, TILE_G, TILE_S, TILE_D),
                    padding_mode=PAD).reshape((TILE_M, TILE_D))
        m_i = ct.full((TILE_M, 1), NEG_BIG, dtype=np.float32)
        l_i = ct.full((TILE_M, 1), 0.0, dtype=np.float32)
        acc = ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32)

        keys = (K, V, Pages, entry, kv_head, seqlen_k, positions + offset)
        if ONE_LOOP:  # every tile masked, one loop of loads (``_flat.one_loop``)
            for j in range(start, stop):
                m_i, l_i, acc = _fold(q, keys, j, True, m_i, l_i, acc, scale, TILE_N, TILE_D,
                                      PAGE_ROWS, PAGE_SIZE, K_LATENCY, V_LATENCY, CAUSAL)
        else:
            for j in range(start, unmasked_stop):
                m_i, l_i, acc = _fold(q, keys, j, False, m_i, l_i, acc, scale, TILE_N, TILE_D,
                                      PAGE_ROWS, PAGE_SIZE, K_LATENCY, V_LATENCY, CAUSAL)
            for j in range(unmasked_stop, stop):
                m_i, l_i, acc = _fold(q, keys, j, True, m_i, l_i, acc, scale, TILE_N, TILE_D,
                                      PAGE_ROWS, PAGE_SIZE, K_LATENCY, V_LATENCY, CAUSAL)
        out = normalised(acc, l_i)
        # plain stores, not TMA: a TMA store inside the segment loop gets a warpgroup of its
        # own, and tileiras 13.4 then asks more registers of the CTA's pool than two CTAs an
        # SM leave it (TRY_ALLOC 224 of a launch budget of 80: the consumers wait forever)
        if (row_lo >= lo) & (row_lo + tiles <= hi):  # the whole row: the output itself
            ct.store(Out, index=(entry, head, 0, q_tile, 0),
                     tile=out.astype(Out.dtype).reshape((1, 1, TILE_G, TILE_S, TILE_D)),
                     allow_tma=False)
        else:
            lse = log_sum_exp(m_i, l_i, True, -np.inf)
            ct.store(Opart, index=(row + cta, 0, 0), tile=out.reshape((1, TILE_M, TILE_D)),
                     allow_tma=False)
            ct.store(Lse, index=(row + cta, 0), tile=lse.reshape((1, TILE_M)), allow_tma=False)


@ct.kernel
def flat_merge(
    Opart, Lse,  # flat_split's partials
    Out,  # [B, H', G', S_q, D] view of the output
    Cu,  # int32 [B + 1]: flat_split's offsets
    ctas: int,  # flat_split's grid
    TILE_G: ConstInt,
    TILE_S: ConstInt,
    CHUNK_D: ConstInt,  # head-dim columns per CTA (grid dim 1 walks the chunks)
    UNROLL: ConstInt,  # partials merged per step
):
    """Row ``bid(0)``: its partials merged where CTA boundaries cut it (slots ``row + c`` for
    its CTAs ``c``), zeros where its entry has no keys, nothing where one CTA wrote it."""
    TILE_M = ct.static_eval(TILE_G * TILE_S)
    q_tiles = ct.cdiv(Out.shape[3], TILE_S)
    rows_per_entry = Out.shape[1] * q_tiles
    row = ct.bid(0)
    chunk = ct.bid(1)
    per = max(ct.cdiv(ct.gather(Cu, Out.shape[0]), ctas), 1)
    entry, row_lo, tiles = _row_items_of(Cu, row, rows_per_entry)
    within = row % rows_per_entry
    first = row_lo // per  # the first CTA that walked the row
    count = (row_lo + tiles - 1) // per - first + 1
    if tiles == 0:
        count = 0
    if count != 1:
        m = ct.full((TILE_M, 1), NEG_BIG, dtype=np.float32)
        total = ct.full((TILE_M, 1), 0.0, dtype=np.float32)
        acc = ct.full((TILE_M, CHUNK_D), 0.0, dtype=np.float32)
        for step in range(ct.cdiv(count, UNROLL)):
            lses = ()
            parts = ()
            for u in ct.static_iter(range(UNROLL)):
                # slots past the row's are another row's: weight 0
                live = step * UNROLL + u < count
                slot = row + first + step * UNROLL + u
                lse = ct.load(Lse, index=(slot, 0), shape=(1, TILE_M),
                              padding_mode=ct.PaddingMode.NEG_INF).reshape((TILE_M, 1))
                part = ct.load(Opart, index=(slot, 0, chunk), shape=(1, TILE_M, CHUNK_D),
                               padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, CHUNK_D))
                lses += (ct.where(live, lse, -np.inf),)
                parts += (ct.where(live, part, 0.0),)
            m, total, acc = merged_splits(m, total, acc, lses, parts, UNROLL)
        out = normalised(acc, total)
        ct.store(Out, index=(entry, within // q_tiles, 0, within % q_tiles, chunk),
                 tile=out.astype(Out.dtype).reshape((1, 1, TILE_G, TILE_S, CHUNK_D)))
