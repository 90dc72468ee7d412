"""The FlashAttention-style forward kernel template (cuTile).

One CTA computes a ``[TILE_M, D]`` block of the output for one (batch, query head): it streams K
and V in ``TILE_N``-key steps through an online softmax, so the ``S_q x S_k`` score matrix never
exists in memory. UPPER_CASE parameters are compile-time constants, passed by name from
``_launch.kernel_constants``; the per-tile work is closures inside the kernel, which read them
from the kernel's scope (``tests/cpu/test_kernel_constants.py`` parses this file to hold that no
constant travels by position).

Masking follows ``scaled_dot_product_attention(is_causal=True)``: top-left aligned, row ``i``
attends keys ``0..i``; with ``BOTTOM_RIGHT`` (torch's ``causal_lower_right``) keys
``0..i + S_k - S_q``, and a row that sees no key comes out as zeros. A sliding window
(``WINDOW``) bounds row ``i`` to keys ``i + off - window_left .. i + off + window_right`` (the
same offset ``off``; a side of -1, ``kernel_core.numbers.UNBOUNDED``, is unbounded): key tiles
outside every row's window are never visited (``kernel_core.bounds``). ``SOFTCAP`` caps the
scaled scores at ``softcap * tanh(s / softcap)``; ``SINKS`` adds ``exp(Sinks[head])`` to every
row's denominator. ``FP8``: e4m3 Q, K and V whose descale factors fold into the score scale
and the output's normalisation, P shifted into e4m3's range before P·V, V read from a ``[B,
H_kv, D, S_k]`` copy (``V_TRANSPOSED``), P·V in bf16 with ``PV_WIDE``, the e4m3 products
accumulated in the tensor core's own precision with ``FAST_ACC``. ``BOTTOM_RIGHT``,
``TILE_D2``, ``STORE_LSE``, ``WINDOW``, ``SOFTCAP``, ``SINKS`` and ``FP8`` each sit under
compile-time branches: without them the code is what it was before they existed.

With ``PACK`` > 1 (FlashAttention's pack-GQA) a CTA's ``TILE_M`` rows are the ``tile_rows =
TILE_M / SLOTS`` query positions of ``SLOTS`` head slots (``PACK`` rounded up to a power of
two) holding the ``PACK`` query heads of one K/V group, head-major (row ``r`` is head ``r //
tile_rows`` of the group at position ``r % tile_rows``): each K/V tile feeds the whole group,
and a query tile spans ``tile_rows`` positions. A group that is not a power of two (7 of Qwen's
28/4) leaves ``SLOTS - PACK`` slots idle: they load the next group's heads (zeros past the
last), and their rows are never stored. With ``PACK`` = 1 ``tile_rows`` is ``TILE_M`` and the
code is the unpacked kernel's.
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from ...kernel_core.bounds import forward_key_tiles, forward_window_key_tiles
from ...kernel_core.numbers import LOG2_E, NEG_BIG, bounded, head_slots
from ...kernel_core.ranges import (page_load, page_number, rows_view, sequence_length,
                                   sequence_of, sequence_start, sequence_view)
from ...kernel_core.softmax import log_sum_exp, online_softmax_parts, reciprocal

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def attention_fwd(
    Q, K, V, Out,  # [B, H_q, S_q, D], [B, H_kv, S_k, D], [B, H_kv, S_k, D], [B, H_q, S_q, D]
    qk_scale: float, heads_q: int, group: int,  # group: query heads per K/V head
    Lse,  # STORE_LSE: [B, H_q, S_q] float32; else a placeholder int the code never reads.
    # Lse and the values after it come last of the launch-time values: the parameters before
    # them keep the offsets of the forward without them.
    window_left: int, window_right: int,  # WINDOW: keys before / after row + offset, -1 unbounded
    softcap: float,  # SOFTCAP: the cap (> 0); else unread
    Sinks,  # SINKS: [H_q] float32 sink logits (natural log, unscaled); else a placeholder int
    Ranges,  # RAGGED: [4, sequences] int32 query starts, query ends, key starts, key ends
    Work,  # WORK_TABLE: [2, items] int32 work items: sequences (-1: none) and query tiles
    Pages,  # PAGED: int32 [sequences, max_pages] block table (K, V: page pools); else ()
    QDescale, KDescale, VDescale,  # FP8: float32 [B, H_kv] factors that turn the stored e4m3
    # values into real ones; else ()
    TILE_M: ConstInt, TILE_N: ConstInt,
    PACK: ConstInt,  # query heads a tile holds: 1, or the group size (its power of two <= TILE_M)
    TILE_D: ConstInt,  # head_dim rounded up to a power of two (loads zero-fill the rest), or
    # with TILE_D2 the largest power of two below it: the first part of the head dim
    TILE_D2: ConstInt,  # 0, or the width of a second part at column TILE_D (a power of two)
    CAUSAL: ConstBool,
    BOTTOM_RIGHT: ConstBool,  # causal only: row i sees keys 0..i + S_k - S_q (torch lower-right)
    EVEN_K: ConstBool,  # S_k % TILE_N == 0
    EXP2: ConstBool, APPROX_DIV: ConstBool, K_TRANSPOSED: ConstBool,
    K_LATENCY: ConstInt, V_LATENCY: ConstInt,  # 1..10, or 0: let the compiler infer it
    ALLOW_TMA: ConstBool, KV_SAWTOOTH: ConstBool, LONGEST_FIRST: ConstBool, CHECK_BOUNDS: ConstBool,
    SPLIT_MASKED: ConstBool,  # masked key tiles in a loop of their own, after the unmasked ones
    PERSISTENT: ConstBool,  # grid (CTAs,): each CTA walks work items; else (query tiles, B * H_q)
    PAIRED: ConstBool,  # causal: a work item is the pair of query tiles (n-1-i, i), not one tile
    STORE_LSE: ConstBool,  # also store each row's base-2 log-sum-exp into Lse (for the backward)
    WINDOW: ConstBool,  # a sliding window: window_left and/or window_right bound each row's keys
    SOFTCAP: ConstBool,  # scores capped at softcap * tanh(s / softcap)
    SINKS: ConstBool,  # Sinks[head] joins each row's softmax denominator
    RAGGED: ConstBool,  # sequences of their own lengths: the batch index picks Ranges' column
    PACKED: ConstBool,  # RAGGED: the sequences lie end to end in batch 0 (else one a batch entry)
    WORK_TABLE: ConstBool,  # RAGGED: a 1-D grid, CTA i runs query head i % heads_q of Work's item
    # i // heads_q (only the tiles sequences have; longest sequences first), not the longest
    # sequence's tiles for every sequence
    PAGED: ConstBool,  # RAGGED: K and V are [pages, page_size, H_kv, D] pools; sequence s's keys
    # (Ranges' key range counts them) lie in the pages Pages[s] names
    PAGE_ROWS: ConstInt,  # PAGED: keys per load, dividing the page size and TILE_N (a key
    # tile of more walks as parts of PAGE_ROWS keys); else 0
    PAGE_SIZE: ConstInt,  # PAGED: the pools' keys a page (K.shape[1]); else 0
    FP8: ConstBool,  # float8_e4m3fn Q, K, V with descale factors; P enters P·V times 2^P_SHIFT
    V_TRANSPOSED: ConstBool,  # V is [B, H_kv, D, S_k] (the layout FP8 P·V reads from memory)
    PV_WIDE: ConstBool,  # FP8: P·V in bfloat16 (V widened per tile), not in e4m3
    FAST_ACC: ConstBool,  # FP8: e4m3 products accumulate in the tensor core's own precision
):
    SLOTS = ct.static_eval(head_slots(heads=PACK))  # the tile's head slots
    tile_rows = ct.static_eval(TILE_M // SLOTS)  # query positions per tile
    heads = heads_q  # tiles' heads per batch entry: query heads, or (PACK > 1) K/V groups
    if PACK > 1:
        heads = heads_q // PACK
    # a packed group of fewer heads than its slots: the slots past it are not stored
    IDLE_SLOTS = ct.static_eval(PACK < SLOTS)
    num_q_tiles = ct.cdiv(Q.shape[2], tile_rows)
    # FP8 P·V: P (at most 1) enters e4m3 times 2^8, so that its small values keep e4m3's three
    # mantissa bits (normal from 2^-6, not 2^-14); l_i sums the same scaled P, so the output
    # is unchanged. In the units of the running max (base 2 with EXP2); 0: P as it is.
    P_SHIFT = ct.static_eval((8.0 if EXP2 else 8.0 / LOG2_E) if FP8 and not PV_WIDE else 0.0)
    # without FAST_ACC tileiras sums each e4m3 product into a fresh float32 tile and adds that
    # to the accumulator: one FADD an element and product (2,808 against 2,512 sm_90
    # instructions at the D 128 default)
    FAST_QK = ct.static_eval(FP8 and FAST_ACC)
    FAST_PV = ct.static_eval(FP8 and FAST_ACC and not PV_WIDE)
    # Bounds-checked loads zero-fill what lies past the edge; unchecked ones never cross it.
    PAD = ct.static_eval(ct.PaddingMode.ZERO if CHECK_BOUNDS else ct.PaddingMode.UNDETERMINED)
    # RAGGED: the key tile that runs past a sequence's keys (its last, if they end inside one)
    # walks apart, its values read from the sequence's cut of V (PAGED: from its pages, the
    # rows past the keys zeroed); the other tiles and its keys by row (not PAGED)
    EDGE = ct.static_eval(RAGGED)
    # PAGED over pages smaller than a key tile: the tile walks as PARTS parts of PAGE_ROWS keys
    # (a page load each), scored apart and folded as one softmax step (no tile joined from
    # loads); else as one part
    PARTS = ct.static_eval(TILE_N // PAGE_ROWS if PAGED else 1)
    PART_N = ct.static_eval(TILE_N // PARTS)  # keys a part
    # a ragged call stores through its sequence's cuts without TMA (a cut stored through TMA
    # has every CTA build a descriptor of its own)
    STORE_TMA = ct.static_eval(False if RAGGED else None)

    def attend_rows(Out, Lse, q_tile, batch, head, seq, seqlen_q, seqlen_k, q_first, k_first,
                    Vc):
        """The ``[TILE_M, D]`` output block of query tile ``q_tile`` of ``batch``'s query head
        ``head`` (``PACK`` > 1: of heads ``head`` to ``head + PACK - 1``, one K/V group), into
        ``Out`` and ``Lse``. With ``TILE_D2`` the head dim is two parts: ``q``/``acc`` the
        first ``TILE_D`` columns, ``q2``/``acc2`` the next ``TILE_D2``. The query rows are
        ``seqlen_q`` long, the keys ``seqlen_k``. ``RAGGED``: ``Out`` and ``Lse`` are sequence
        ``seq``'s cuts, its rows start at row ``q_first`` of Q and ``k_first`` of K and V, and
        ``Vc`` is its cut of V (the edge tile's values); ``PAGED``: its keys are read from its
        pages."""
        kv_head = head // group
        score_scale = qk_scale  # what multiplies q.k: with FP8 also q's and k's descales
        v_descale = 1.0
        if FP8:
            # stored values times their descale factors are the real ones: the scores carry
            # q's and k's factors, the output v's (``seq``: the factors' batch entry)
            score_scale = (qk_scale * ct.gather(QDescale, (seq, kv_head))
                           * ct.gather(KDescale, (seq, kv_head)))
            v_descale = ct.gather(VDescale, (seq, kv_head))
        scale = score_scale
        if EXP2:
            scale = score_scale * LOG2_E
        if SOFTCAP:
            # scores s = softcap * tanh(q.k * score_scale / softcap): tanh of q.k * cap_in,
            # then the softmax scales by softcap (times log2(e) with EXP2) instead
            cap_in = score_scale / softcap
            scale = softcap
            if EXP2:
                scale = softcap * LOG2_E

        rows = q_tile * TILE_M + ct.arange(TILE_M, dtype=np.int32)[:, None]  # [TILE_M, 1]
        if PACK > 1:  # row r is position r % tile_rows of its head
            positions = ct.arange(TILE_M, dtype=np.int32) % tile_rows
            rows = q_tile * tile_rows + positions[:, None]
        offset = 0
        if BOTTOM_RIGHT:
            # row i sees keys 0..i + offset; negative when S_q > S_k (early rows then see none)
            offset = seqlen_k - seqlen_q
            rows = rows + offset  # from here on: the last key each row may see

        m_i = ct.full((TILE_M, 1), NEG_BIG, dtype=np.float32)  # running max (scaled)
        l_i = ct.full((TILE_M, 1), 0.0, dtype=np.float32)  # running denominator
        if SINKS:
            # the sink joins every row's softmax as one more score: start the running max at
            # it (in the units of m_i) and the denominator at its term, exp(sink - m) = 1 (0
            # for a sink of -inf, which the floor of m_i at NEG_BIG keeps finite)
            sink = ct.gather(Sinks, head)
            if PACK > 1:  # each row's own head's sink
                heads_of_rows = head + ct.arange(TILE_M, dtype=np.int32) // tile_rows
                if IDLE_SLOTS:  # an idle slot's (any head's: its rows are not stored)
                    heads_of_rows = ct.minimum(heads_of_rows, heads_q - 1)
                sink = ct.gather(Sinks, heads_of_rows).reshape((TILE_M, 1))
            if EXP2:
                sink = sink * LOG2_E
            m_i = ct.maximum(m_i, sink)
            sink_term = sink - m_i
            if P_SHIFT:
                sink_term = sink_term + P_SHIFT
            if EXP2:
                l_i = ct.exp2(sink_term, flush_to_zero=True)
            else:
                l_i = ct.exp(sink_term)
        acc = ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32)  # [TILE_M, TILE_D]

        # Q, Out and Lse tiles: one head's TILE_M rows, or SLOTS slots' tile_rows rows (the
        # tile index of the head axis is then the K/V head's: its group's first heads are
        # PACK apart)
        head_tile = head
        if PACK > 1:
            head_tile = head // PACK

        def load_q(part, width):
            """The query tile's ``[TILE_M, width]``, head-dim columns ``part * width`` on;
            ``RAGGED``: by row from the uncut Q (a row past the sequence, another's or
            unwritten, stays in its own row of the products, whose output is not stored)."""
            if RAGGED:
                tile = rows_view(Q, heads=SLOTS, rows=tile_rows, width=width,
                                 head_step=PACK).load(
                    (batch, head_tile, q_first + q_tile * tile_rows, part), allow_tma=ALLOW_TMA)
            elif IDLE_SLOTS:  # slots from the group's first head on, past Q's heads zeros
                view = Q.tiled_view((1, SLOTS, tile_rows, width),
                                    padding_mode=ct.PaddingMode.ZERO,
                                    traversal_steps=(1, PACK, tile_rows, width))
                tile = view.load((batch, head_tile, q_tile, part), allow_tma=ALLOW_TMA)
            else:
                tile = ct.load(Q, index=(batch, head_tile, q_tile, part),
                               shape=(1, SLOTS, tile_rows, width), padding_mode=PAD,
                               check_bounds=CHECK_BOUNDS, allow_tma=ALLOW_TMA)
            return tile.reshape((TILE_M, width))

        q = load_q(0, width=TILE_D)  # [TILE_M, TILE_D]
        pv_dtype = q.dtype  # P·V's inputs: the inputs' dtype, or bfloat16 (PV_WIDE)
        if PV_WIDE:
            pv_dtype = ct.bfloat16
        q2 = None  # the second head-dim part, with TILE_D2
        acc2 = None
        if TILE_D2:
            acc2 = ct.full((TILE_M, TILE_D2), 0.0, dtype=np.float32)  # [TILE_M, TILE_D2]
            q2 = load_q(TILE_D // TILE_D2, width=TILE_D2)  # [TILE_M, TILE_D2]

        def load_kv(A, A_cut, j, part, page, width, latency, edge):
            """``[TILE_N, width]`` of key / value tile ``j`` of ``A``, head-dim columns ``part *
            width`` on; ``EDGE``: by row from the uncut ``A``, or (``edge``: the tile runs past
            the sequence's keys) from its cut ``A_cut``, zero-filled past them (a value row
            another sequence holds, or none wrote, may be NaN, and 0 * NaN is not 0); ``PAGED``:
            ``[PART_N, width]``, the ``j``-th ``PART_N`` keys, from ``page``, which holds them."""
            if PAGED:
                return page_load(A, page, j * PART_N, kv_head, part, PAGE_ROWS, width, latency,
                                 PAD, page_size=PAGE_SIZE)
            hint = ct.static_eval(latency or None)
            if ct.static_eval(EDGE and not edge):  # (PAGED returned above)
                tile = rows_view(A, heads=1, rows=TILE_N, width=width).load(
                    (batch, kv_head, k_first + j * TILE_N, part), latency=hint,
                    allow_tma=ALLOW_TMA)
            else:
                source = A
                if edge:
                    source = A_cut
                tile = ct.load(source, index=(batch, kv_head, j, part),
                               shape=(1, 1, TILE_N, width), padding_mode=PAD,
                               check_bounds=CHECK_BOUNDS, latency=hint, allow_tma=ALLOW_TMA)
            return tile.reshape((TILE_N, width))

        def load_k(j, part, page, width):
            """Key tile ``j`` as ``[width, TILE_N]`` (loaded transposed with ``K_TRANSPOSED``,
            except by a ragged call: a view by row has no transposed order). ``EDGE``: by row,
            the tile past the sequence's keys too (the mask drops those keys' scores by a
            select, whatever their rows hold; only its values need the cut)."""
            if ct.static_eval(K_TRANSPOSED and not PAGED and not RAGGED):
                k = ct.load(K, index=(batch, kv_head, part, j), shape=(1, 1, width, TILE_N),
                            order=(0, 1, 3, 2), padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                            latency=ct.static_eval(K_LATENCY or None), allow_tma=ALLOW_TMA)
                return k.reshape((width, TILE_N))
            return ct.transpose(load_kv(K, K, j, part, page, width, latency=K_LATENCY,
                                        edge=False))

        def load_v(j, part, page, width, edge):
            """Value tile ``j`` as ``[TILE_N, width]`` (from ``[D, S_k]`` with
            ``V_TRANSPOSED``)."""
            if V_TRANSPOSED:
                v = ct.load(V, index=(batch, kv_head, j, part), shape=(1, 1, TILE_N, width),
                            order=(0, 1, 3, 2), padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                            latency=ct.static_eval(V_LATENCY or None), allow_tma=ALLOW_TMA)
                return v.reshape((TILE_N, width))
            return load_kv(V, Vc, j, part, page, width, latency=V_LATENCY, edge=edge)

        def scores(block, page, masked):
            """The ``[TILE_M, PART_N]`` scores of keys ``block * PART_N ..`` (``PAGED``: in
            ``page``): their product with the query tile, capped (``SOFTCAP``); ``masked`` (a
            constant or a per-step flag): -inf where the causal / window / sequence-end mask
            drops a key."""
            k = load_k(block, 0, page, width=TILE_D)  # [TILE_D, PART_N]
            qk = ct.full((TILE_M, PART_N), 0.0, dtype=np.float32)
            qk = ct.mma(q, k, qk, use_fast_acc=FAST_QK)  # [TILE_M, PART_N]
            if TILE_D2:
                k2 = load_k(block, TILE_D // TILE_D2, page, width=TILE_D2)  # [TILE_D2, PART_N]
                qk = ct.mma(q2, k2, qk, use_fast_acc=FAST_QK)
            if SOFTCAP:
                qk = ct.tanh(qk * cap_in)  # [TILE_M, PART_N], in units of softcap
            if masked:
                keys = block * PART_N + ct.arange(PART_N, dtype=np.int32)[None, :]  # [1, PART_N]
                keep = keys < seqlen_k  # [1, PART_N]
                if CAUSAL:
                    keep = keep & (keys <= rows)  # [TILE_M, PART_N]
                if WINDOW:
                    keep = keep & (keys >= first_keys)  # [TILE_M, PART_N]
                    if not CAUSAL:
                        keep = keep & (keys <= last_keys)
                qk = ct.where(keep, qk, -np.inf)
            return qk

        def attend(j, masked, edge, m_i, l_i, acc, acc2):
            """One step: scores against key tile ``j`` (``PARTS`` parts of it, ``PAGED``: each
            part's page looked up once for its keys and values), online softmax, P·V.
            ``masked`` (a constant or a per-step flag) applies the causal / window /
            sequence-end mask; ``edge`` (a constant): the tile runs past a ragged sequence's
            keys."""
            blocks, pages, qks = (), (), ()
            for i in ct.static_iter(range(PARTS)):
                block = j  # in keys of PART_N
                if PARTS > 1:
                    block = j * PARTS + i
                page = None
                if PAGED:
                    page = page_number(Pages, seq, block * PART_N, page_size=PAGE_SIZE)
                blocks += (block,)
                pages += (page,)
                qks += (scores(block, page, masked),)
            # ps: PARTS tiles [TILE_M, PART_N]
            ps, m_i, l_i, alpha = online_softmax_parts(qks, m_i, l_i, scale, EXP2,
                                                       prescaled=False, shift=P_SHIFT)
            acc = acc * alpha
            for i in ct.static_iter(range(PARTS)):
                block, page = blocks[i], pages[i]
                v = load_v(block, 0, page, width=TILE_D, edge=edge)  # [PART_N, TILE_D]
                if ct.static_eval(PAGED and edge):
                    # a page's rows past the keys hold anything: p is 0 there, but 0 * NaN is
                    # not 0 (only the tile past the keys holds such rows: a masked tile before
                    # it, the causal diagonal, needs no select of its values)
                    key_rows = block * PART_N + ct.arange(PART_N, dtype=np.int32)[:, None]
                    v = ct.where(key_rows < seqlen_k, v, 0.0)
                p = ps[i].astype(pv_dtype)
                acc = ct.mma(p, v.astype(pv_dtype), acc, use_fast_acc=FAST_PV)  # [TILE_M, TILE_D]
                if TILE_D2:
                    v2 = load_v(block, TILE_D // TILE_D2, page, width=TILE_D2, edge=edge)
                    if ct.static_eval(PAGED and edge):
                        v2 = ct.where(key_rows < seqlen_k, v2, 0.0)
                    v2 = v2.astype(pv_dtype)
                    acc2_in = acc2 * alpha if i == 0 else acc2  # rescaled once a tile
                    acc2 = ct.mma(p, v2, acc2_in, use_fast_acc=FAST_PV)  # [TILE_M, TILE_D2]
            return m_i, l_i, acc, acc2

        backwards = False  # KV_SAWTOOTH: odd query tiles walk their key tiles backwards
        whole = 0  # EDGE: the sequence's key tiles that lie whole before its end
        if EDGE:
            whole = seqlen_k // TILE_N
        if WINDOW:
            # Row r's keys: from r + off - window_left (if bounded) to r + off (CAUSAL) or
            # r + off + window_right (if bounded), within [0, S_k). ``rows`` holds
            # r + off.
            first_row = q_tile * tile_rows
            if BOTTOM_RIGHT:
                first_row = first_row + offset
            first_tile, unmasked_lo, unmasked_hi, end_tile = forward_window_key_tiles(
                first_row, seqlen_k, window_left, window_right, tile_rows, TILE_N, CAUSAL)
            first_keys = ct.full((TILE_M, 1), 0, dtype=np.int32)  # each row's first key
            if bounded(window_left):
                first_keys = rows - window_left
            last_keys = rows  # [TILE_M, 1]: each row's last key (CAUSAL: the diagonal)
            if not CAUSAL:
                last_keys = ct.full((TILE_M, 1), seqlen_k, dtype=np.int32)  # no bound
                if bounded(window_right):
                    last_keys = rows + window_right
            if KV_SAWTOOTH:
                backwards = (q_tile % 2) == 1
            # the loops below end at these; with EDGE before the tile past the keys, which
            # walks after them (the unmasked run never reaches it)
            masked_lo_to, walk_to = unmasked_lo, end_tile
            if EDGE:
                masked_lo_to = min(unmasked_lo, whole)
                walk_to = min(end_tile, whole)
            if SPLIT_MASKED:
                # masked tiles at the window's left edge, the unmasked run, masked tiles at
                # the right
                for j in range(first_tile, masked_lo_to):
                    m_i, l_i, acc, acc2 = attend(j, True, False, m_i, l_i, acc, acc2)
                for step in range(unmasked_lo, unmasked_hi):
                    j = step
                    if KV_SAWTOOTH:
                        if backwards:
                            j = unmasked_lo + unmasked_hi - 1 - step
                    m_i, l_i, acc, acc2 = attend(j, False, False, m_i, l_i, acc, acc2)
                for j in range(unmasked_hi, walk_to):
                    m_i, l_i, acc, acc2 = attend(j, True, False, m_i, l_i, acc, acc2)
            else:
                for step in range(first_tile, walk_to):
                    j = step
                    if KV_SAWTOOTH:
                        if backwards:
                            j = first_tile + walk_to - 1 - step
                    masked = (j < unmasked_lo) | (j >= unmasked_hi)
                    m_i, l_i, acc, acc2 = attend(j, masked, False, m_i, l_i, acc, acc2)
            edge_from, edge_to = max(first_tile, whole), end_tile
        else:
            num_kv_tiles, mask_from = forward_key_tiles(q_tile, offset, seqlen_k, tile_rows,
                                                         TILE_N, CAUSAL, BOTTOM_RIGHT)
            ANY_MASK = ct.static_eval(CAUSAL or not EVEN_K)
            if KV_SAWTOOTH:
                backwards = (q_tile % 2) == 1
            # Key tiles [0, mask_from) need no mask. With SPLIT_MASKED the first loop walks
            # only those and a second loop the masked rest, so neither branches per step;
            # otherwise one loop tests j. With EDGE both end before the tile past the keys
            # (mask_from <= whole), which walks after them.
            unmasked = num_kv_tiles  # the first loop's end
            masked_to = num_kv_tiles  # SPLIT_MASKED: the second's
            if ct.static_eval(ANY_MASK and SPLIT_MASKED):
                unmasked = min(mask_from, num_kv_tiles)
            if EDGE:
                masked_to = min(num_kv_tiles, whole)
                if not SPLIT_MASKED:
                    unmasked = masked_to
            for step in range(unmasked):
                j = step
                if KV_SAWTOOTH:
                    if backwards:
                        j = unmasked - 1 - step
                masked = False
                if ct.static_eval(ANY_MASK and not SPLIT_MASKED):
                    masked = j >= mask_from
                m_i, l_i, acc, acc2 = attend(j, masked, False, m_i, l_i, acc, acc2)
            if ct.static_eval(ANY_MASK and SPLIT_MASKED):
                for j in range(unmasked, masked_to):
                    m_i, l_i, acc, acc2 = attend(j, True, False, m_i, l_i, acc, acc2)
            edge_from, edge_to = whole, num_kv_tiles
        if EDGE:  # the key tile past the sequence's keys (at most one), if one is
            if edge_from < edge_to:
                m_i, l_i, acc, acc2 = attend(edge_from, True, True, m_i, l_i, acc, acc2)

        # normalise: rows that saw no key (nor a finite sink) have l_i == 0 and acc == 0
        inv_l = reciprocal(l_i, TILE_M, APPROX_DIV,
                           ct.static_eval(BOTTOM_RIGHT or WINDOW or SINKS or RAGGED))
        if FP8:
            inv_l = inv_l * v_descale
        acc = acc * inv_l

        def store_rows(A, tile, column):
            """``tile`` (``[1, SLOTS, tile_rows]``, then ``[width]`` from head-dim tile
            ``column`` on, or nothing: ``column`` is ()) into ``A``'s rows of the query tile;
            ``IDLE_SLOTS``: into a cut of ``A``'s heads that ends at the group's last, which
            clips the idle slots, without TMA (a cut through TMA has every CTA build a
            descriptor of its own; pieces of the tile stored through views of ``A`` instead
            ran 3-20x slower under a two-CTA cluster, which exchanged them between its CTAs)."""
            if IDLE_SLOTS:
                group_rows = A.slice(axis=1, start=head, stop=head + PACK)
                ct.store(group_rows, index=ct.static_eval((batch, 0, q_tile) + column),
                         tile=tile, allow_tma=False)
            else:
                ct.store(A, index=ct.static_eval((batch, head_tile, q_tile) + column), tile=tile,
                         allow_tma=STORE_TMA)

        store_rows(Out, acc.astype(Out.dtype).reshape((1, SLOTS, tile_rows, TILE_D)), (0,))
        if TILE_D2:
            out2 = (acc2 * inv_l).astype(Out.dtype).reshape((1, SLOTS, tile_rows, TILE_D2))
            store_rows(Out, out2, (TILE_D // TILE_D2,))
        if STORE_LSE:
            # base 2, in units of scaled scores: P = 2^(s * scale * log2(e) - lse) in the
            # backward. A row that saw no key gets +inf, so its probabilities (and gradients)
            # are zeros; with SINKS the sink's term is in l_i, and such a row gets the sink
            # (times log2(e)).
            lse = log_sum_exp(m_i, l_i, EXP2, np.inf)  # [TILE_M, 1]
            store_rows(Lse, lse.reshape((1, SLOTS, tile_rows)), ())

    def attend_tile(q_tile, bh):
        """Query tile ``q_tile`` of (batch x head) ``bh`` (``PACK`` > 1: of a K/V group's
        heads). ``RAGGED``: the batch index is a sequence's, whose query and key ranges
        (``Ranges``) its rows are read from (by row from the uncut arrays, the values of the
        tile past the keys from their cut) and stored to (through cuts, clipped to it), so its
        lengths, masks and alignment are the sequence's own; a tile past the sequence's queries
        does nothing. ``PACKED``: the sequences lie end to end in one ``[1, H, tokens, D]`` view
        (loads use batch 0). ``PAGED``: K and V are page pools; the sequence's keys, as many
        as its key range holds (at most its block table's pages), lie in the pages
        ``Pages[sequence]`` names."""
        batch = bh // heads
        head = bh % heads
        if PACK > 1:
            head = head * PACK  # the group's first query head
        if RAGGED:
            seq, batch = sequence_of(batch, PACKED)
            seqlen_q = sequence_length(Ranges, seq, 0)
            if q_tile * tile_rows < seqlen_q:
                q_first = sequence_start(Ranges, seq, 0, Q.shape[2])
                k_first = 0
                v_seq = V
                if PAGED:
                    seqlen_k = min(sequence_length(Ranges, seq, 2), Pages.shape[1] * K.shape[1])
                else:
                    seqlen_k = sequence_length(Ranges, seq, 2)
                    k_first = sequence_start(Ranges, seq, 2, K.shape[2])
                    v_seq = sequence_view(V, Ranges, seq, 2)
                out_seq = sequence_view(Out, Ranges, seq, 0)
                lse_seq = Lse
                if STORE_LSE:
                    lse_seq = sequence_view(Lse, Ranges, seq, 0)
                attend_rows(out_seq, lse_seq, q_tile, batch, head, seq, seqlen_q, seqlen_k,
                            q_first, k_first, v_seq)
        else:
            attend_rows(Out, Lse, q_tile, batch, head, batch, Q.shape[2], K.shape[2], 0, 0, V)

    def attend_slot(slot, bh):
        """Query tile ``slot`` (mirrored with ``LONGEST_FIRST``), or with ``PAIRED`` the tiles
        ``n-1-slot`` then ``slot``: each pair's causal key counts add up to the same total."""
        if PAIRED:
            count = 1
            if 2 * slot + 1 < num_q_tiles:
                count = 2
            for t in range(count):
                q_tile = slot
                if t == 0:
                    q_tile = num_q_tiles - 1 - slot
                attend_tile(q_tile, bh)
        else:
            q_tile = slot
            if LONGEST_FIRST:
                if RAGGED:  # mirrored over the grid's tiles: the longest sequence's
                    q_tile = ct.num_blocks(0) - 1 - slot
                else:
                    q_tile = num_q_tiles - 1 - slot
            attend_tile(q_tile, bh)

    # work items per (batch x head): query tiles, or pairs of them (the middle tile alone if odd)
    num_slots = num_q_tiles
    if PAIRED:
        num_slots = ct.cdiv(num_q_tiles, 2)
    if WORK_TABLE:
        item = ct.bid(0) // heads
        seq = ct.gather(Work, (0, item))
        if seq >= 0:
            attend_tile(ct.gather(Work, (1, item)), seq * heads + ct.bid(0) % heads)
    elif PERSISTENT:
        # Work item i is slot i % num_slots of (batch x head) i // num_slots: the CTAs in flight
        # at any moment work on neighbouring tiles of the same heads and share their K/V in L2.
        for item in range(ct.bid(0), num_slots * Q.shape[0] * heads, ct.num_blocks(0)):
            attend_slot(item % num_slots, item // num_slots)
    else:
        attend_slot(ct.bid(0), ct.bid(1))
