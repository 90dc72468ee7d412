"""The FlashAttention-style forward kernel template (cuTile).

One CTA computes a ``[TILE_M, D]`` block of the output for one (batch, query head): it streams K
and V in ``TILE_N``-key steps through an online softmax, so the ``S_q x S_k`` score matrix never
exists in memory. UPPER_CASE parameters are compile-time constants, passed by name from
``_launch.kernel_constants``; in here they go by keyword or are read from the enclosing kernel,
never by position (``tests/cpu/test_kernel_constants.py`` parses this file to hold it so).

Masking follows ``scaled_dot_product_attention(is_causal=True)``: top-left aligned, row ``i``
attends keys ``0..i``; with ``BOTTOM_RIGHT`` (torch's ``causal_lower_right``) keys
``0..i + S_k - S_q``, and a row that sees no key comes out as zeros. A sliding window
(``WINDOW``) bounds row ``i`` to keys ``i + off - window_left .. i + off + window_right`` (the
same offset ``off``, -1 unbounded): key tiles outside every row's window are never visited.
``SOFTCAP`` caps the scaled scores at ``softcap * tanh(s / softcap)``; ``SINKS`` adds
``exp(Sinks[head])`` to every row's denominator. ``BOTTOM_RIGHT``, ``TILE_D2``, ``STORE_LSE``,
``WINDOW``, ``SOFTCAP`` and ``SINKS`` each sit under compile-time branches: without them the code
is what it was before they existed.
"""

from __future__ import annotations

import math

import cuda.tile as ct
import numpy as np

from .._kernel_ranges import page_rows, sequence_length, sequence_view

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

LOG2_E = 1.0 / math.log(2.0)
#: Finite "minus infinity" for the running max: a row whose first visited key tile is fully
#: masked (possible with the sawtooth order) must not compute (-inf) - (-inf).
NEG_BIG = -1.0e30


def _online_softmax(qk, m_i, l_i, acc, scale, *, EXP2):
    """Fold a ``[rows, TILE_N]`` score tile into the running (max, denominator, accumulator);
    return the probabilities, the new state and ``alpha``, the accumulator's rescaling."""
    m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * scale)  # [rows, 1]
    shifted = qk * scale - m_ij  # [rows, TILE_N]
    if EXP2:
        p = ct.exp2(shifted, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)  # [rows, 1]
    else:
        p = ct.exp(shifted)
        alpha = ct.exp(m_i - m_ij)
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
    return p, m_ij, l_i, acc * alpha, alpha


def _window_tiles(first_row, seqlen_k, window_left, window_right, *, TILE_M, TILE_N, CAUSAL):
    """The key tiles a query tile visits under a window: ``(first, unmasked_lo, unmasked_hi,
    end)``, visiting ``[first, end)``, of which ``[unmasked_lo, unmasked_hi)`` (possibly empty)
    lie inside every row's window and before ``S_k``, and need no mask. ``first_row`` is the
    tile's first row plus the alignment offset; the tile's rows reach ``TILE_M - 1`` further.
    Row ``r`` sees keys ``r - window_left`` (``window_left >= 0``) to ``r`` (``CAUSAL``) or
    ``r + window_right`` (``window_right >= 0``), within ``[0, S_k)``. Plain integer
    arithmetic, so the launcher's tests call it with Python ints too."""
    last_row = first_row + (TILE_M - 1)
    lo_key = 0  # the first key any row of the tile sees
    mask_lo = 0  # the first key tile that every row sees from its start on
    if window_left >= 0:
        lo_key = max(first_row - window_left, 0)
        mask_lo = (max(last_row - window_left, 0) + TILE_N - 1) // TILE_N
    full_tiles = seqlen_k // TILE_N  # key tiles that end before S_k
    if CAUSAL:
        hi_key = min(last_row + 1, seqlen_k)  # one past the last key any row sees
        mask_hi = min(max(first_row + 1, 0) // TILE_N, full_tiles)
    else:
        hi_key = seqlen_k
        mask_hi = full_tiles
        if window_right >= 0:
            hi_key = min(last_row + window_right + 1, seqlen_k)
            mask_hi = min(max(first_row + window_right + 1, 0) // TILE_N, full_tiles)
    first = lo_key // TILE_N
    end = max((max(hi_key, 0) + TILE_N - 1) // TILE_N, first)
    if hi_key <= lo_key:  # no row of the tile sees a key
        end = first
    # the unmasked run, clamped into the visited tiles
    unmasked_lo = min(max(mask_lo, first), end)
    unmasked_hi = max(min(mask_hi, end), unmasked_lo)
    return first, unmasked_lo, unmasked_hi, end


def _attend_q_tile(Q, K, V, Out, Lse, q_tile, bh, qk_scale, heads_q, group, *, window_left,
                   window_right, softcap, Sinks, Ranges, Pages, TILE_M, TILE_N, TILE_D, TILE_D2,
                   CAUSAL, BOTTOM_RIGHT, EVEN_K, EXP2, APPROX_DIV, K_TRANSPOSED, K_LATENCY,
                   V_LATENCY, ALLOW_TMA, KV_SAWTOOTH, CHECK_BOUNDS, SPLIT_MASKED, STORE_LSE,
                   WINDOW, SOFTCAP, SINKS, RAGGED, PACKED, PAGED, PAGE_ROWS):
    """The ``[TILE_M, D]`` output block of query tile ``q_tile`` of (batch x head) ``bh``.

    ``RAGGED``: the batch index is a sequence's, and every array is cut to that sequence's
    query or key range (``Ranges``: ``[4, sequences]`` int32 rows of query starts, query ends,
    key starts, key ends), so its lengths, masks and alignment are the sequence's own; a tile
    past the sequence's queries does nothing. ``PACKED``: the sequences lie end to end in one
    ``[1, H, tokens, D]`` view (loads use batch 0); else each is a batch entry of its own.
    ``PAGED``: K and V are page pools; the sequence's keys, as many as its key range holds (at
    most its block table's pages), lie in the pages ``Pages[sequence]`` names."""
    batch = bh // heads_q
    head = bh % heads_q
    if RAGGED:
        seq = batch
        if PACKED:
            batch = 0
        Q = sequence_view(Q, Ranges, seq, 0)
        if q_tile * TILE_M < Q.shape[2]:
            paged_keys = 0
            if PAGED:
                paged_keys = min(sequence_length(Ranges, seq, 2), Pages.shape[1] * K.shape[1])
            else:
                K = sequence_view(K, Ranges, seq, 2)
                V = sequence_view(V, Ranges, seq, 2)
            Out = sequence_view(Out, Ranges, seq, 0)
            if STORE_LSE:
                Lse = sequence_view(Lse, Ranges, seq, 0)
            _attend_rows(Q, K, V, Out, Lse, q_tile, batch, head, qk_scale, group,
                         window_left=window_left, window_right=window_right, softcap=softcap,
                         Sinks=Sinks, TILE_M=TILE_M, TILE_N=TILE_N, TILE_D=TILE_D,
                         TILE_D2=TILE_D2, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT,
                         EVEN_K=EVEN_K, EXP2=EXP2, APPROX_DIV=APPROX_DIV,
                         K_TRANSPOSED=K_TRANSPOSED, K_LATENCY=K_LATENCY, V_LATENCY=V_LATENCY,
                         ALLOW_TMA=ALLOW_TMA, KV_SAWTOOTH=KV_SAWTOOTH,
                         CHECK_BOUNDS=CHECK_BOUNDS, SPLIT_MASKED=SPLIT_MASKED,
                         STORE_LSE=STORE_LSE, WINDOW=WINDOW, SOFTCAP=SOFTCAP, SINKS=SINKS,
                         RAGGED=RAGGED, seq=seq, paged_keys=paged_keys, Pages=Pages,
                         PAGED=PAGED, PAGE_ROWS=PAGE_ROWS)
    else:
        _attend_rows(Q, K, V, Out, Lse, q_tile, batch, head, qk_scale, group,
                     window_left=window_left, window_right=window_right, softcap=softcap,
                     Sinks=Sinks, TILE_M=TILE_M, TILE_N=TILE_N, TILE_D=TILE_D, TILE_D2=TILE_D2,
                     CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, EVEN_K=EVEN_K, EXP2=EXP2,
                     APPROX_DIV=APPROX_DIV, K_TRANSPOSED=K_TRANSPOSED, K_LATENCY=K_LATENCY,
                     V_LATENCY=V_LATENCY, ALLOW_TMA=ALLOW_TMA, KV_SAWTOOTH=KV_SAWTOOTH,
                     CHECK_BOUNDS=CHECK_BOUNDS, SPLIT_MASKED=SPLIT_MASKED, STORE_LSE=STORE_LSE,
                     WINDOW=WINDOW, SOFTCAP=SOFTCAP, SINKS=SINKS, RAGGED=RAGGED, seq=batch,
                     paged_keys=0, Pages=Pages, PAGED=False, PAGE_ROWS=PAGE_ROWS)


def _attend_rows(Q, K, V, Out, Lse, q_tile, batch, head, qk_scale, group, *, window_left,
                 window_right, softcap, Sinks, TILE_M, TILE_N, TILE_D, TILE_D2, CAUSAL,
                 BOTTOM_RIGHT, EVEN_K, EXP2, APPROX_DIV, K_TRANSPOSED, K_LATENCY, V_LATENCY,
                 ALLOW_TMA, KV_SAWTOOTH, CHECK_BOUNDS, SPLIT_MASKED, STORE_LSE, WINDOW,
                 SOFTCAP, SINKS, RAGGED, seq, paged_keys, Pages, PAGED, PAGE_ROWS):
    """Query tile ``q_tile`` of ``batch``'s query head ``head`` (:func:`_attend_q_tile`). With
    ``TILE_D2`` the head dim is two parts: ``q``/``acc`` the first ``TILE_D`` columns,
    ``q2``/``acc2`` the next ``TILE_D2``. ``PAGED``: sequence ``seq``'s ``paged_keys`` keys are
    read from its pages."""
    # Bounds-checked loads zero-fill what lies past the edge; unchecked ones never cross it.
    PAD = ct.static_eval(ct.PaddingMode.ZERO if CHECK_BOUNDS else ct.PaddingMode.UNDETERMINED)
    kv_head = head // group
    scale = qk_scale
    if EXP2:
        scale = qk_scale * LOG2_E
    if SOFTCAP:
        # scores s = softcap * tanh(q.k * qk_scale / softcap): tanh of q.k * cap_in, then the
        # softmax scales by softcap (times log2(e) with EXP2) instead of qk_scale
        cap_in = qk_scale / softcap
        scale = softcap
        if EXP2:
            scale = softcap * LOG2_E

    rows = q_tile * TILE_M + ct.arange(TILE_M, dtype=np.int32)[:, None]  # [TILE_M, 1]
    seqlen_k = K.shape[2]
    if PAGED:
        seqlen_k = paged_keys
    if BOTTOM_RIGHT:
        # row i sees keys 0..i + offset; negative when S_q > S_k (early rows then see none)
        offset = seqlen_k - Q.shape[2]
        rows = rows + offset  # from here on: the last key each row may see

    m_i = ct.full((TILE_M, 1), NEG_BIG, dtype=np.float32)  # running max (scaled)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=np.float32)  # running denominator
    if SINKS:
        # the sink joins every row's softmax as one more score: start the running max at it
        # (in the units of m_i) and the denominator at its term, exp(sink - m) = 1 (0 for a
        # sink of -inf, which the floor of m_i at NEG_BIG keeps finite)
        sink = ct.gather(Sinks, head)
        if EXP2:
            sink = sink * LOG2_E
        m_i = ct.maximum(m_i, sink)
        if EXP2:
            l_i = ct.exp2(sink - m_i, flush_to_zero=True)
        else:
            l_i = ct.exp(sink - m_i)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32)  # [TILE_M, TILE_D]

    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                allow_tma=ALLOW_TMA).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]
    q2 = None  # the second head-dim part, with TILE_D2
    acc2 = None
    if TILE_D2:
        acc2 = ct.full((TILE_M, TILE_D2), 0.0, dtype=np.float32)  # [TILE_M, TILE_D2]
        q2 = ct.load(Q, index=(batch, head, q_tile, TILE_D // TILE_D2),
                     shape=(1, 1, TILE_M, TILE_D2), padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                     allow_tma=ALLOW_TMA).reshape((TILE_M, TILE_D2))

    def load_kv(A, j, part, width, latency):
        """``[TILE_N, width]`` of key / value tile ``j``, head-dim columns ``part * width`` on."""
        if PAGED:
            return page_rows(A, Pages, seq, kv_head, j, part, TILE_N, PAGE_ROWS, width, latency,
                             PAD)
        tile = ct.load(A, index=(batch, kv_head, j, part), shape=(1, 1, TILE_N, width),
                       padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                       latency=ct.static_eval(latency or None), allow_tma=ALLOW_TMA)
        return tile.reshape((TILE_N, width))

    def load_k(j, part, width):
        """Key tile ``j`` as ``[width, TILE_N]`` (loaded transposed with ``K_TRANSPOSED``)."""
        if ct.static_eval(K_TRANSPOSED and not PAGED):
            k = ct.load(K, index=(batch, kv_head, part, j), shape=(1, 1, width, TILE_N),
                        order=(0, 1, 3, 2), padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                        latency=ct.static_eval(K_LATENCY or None), allow_tma=ALLOW_TMA)
            return k.reshape((width, TILE_N))
        return ct.transpose(load_kv(K, j, part, width, latency=K_LATENCY))

    def attend(j, masked, m_i, l_i, acc, acc2):
        """One step: scores against key tile ``j``, online softmax, P·V. ``masked`` (a
        constant or a per-step flag) applies the causal / sequence-end mask."""
        k = load_k(j, 0, width=TILE_D)  # [TILE_D, TILE_N]
        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32)
        qk = ct.mma(q, k, qk)  # [TILE_M, TILE_N]
        if TILE_D2:
            k2 = load_k(j, TILE_D // TILE_D2, width=TILE_D2)  # [TILE_D2, TILE_N]
            qk = ct.mma(q2, k2, qk)
        if SOFTCAP:
            qk = ct.tanh(qk * cap_in)  # [TILE_M, TILE_N], in units of softcap
        if masked:
            keys = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[None, :]  # [1, TILE_N]
            keep = keys < seqlen_k  # [1, TILE_N]
            if CAUSAL:
                keep = keep & (keys <= rows)  # [TILE_M, TILE_N]
            if WINDOW:
                keep = keep & (keys >= first_keys)  # [TILE_M, TILE_N]
                if not CAUSAL:
                    keep = keep & (keys <= last_keys)
            qk = ct.where(keep, qk, -np.inf)
        p, m_i, l_i, acc, alpha = _online_softmax(qk, m_i, l_i, acc, scale, EXP2=EXP2)
        v = load_kv(V, j, 0, width=TILE_D, latency=V_LATENCY)  # [TILE_N, TILE_D]
        if ct.static_eval(PAGED):
            # a page's rows past the keys hold anything: p is 0 there, but 0 * NaN is not 0
            key_rows = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[:, None]  # [TILE_N, 1]
            if masked:
                v = ct.where(key_rows < seqlen_k, v, 0.0)
        acc = ct.mma(p.astype(q.dtype), v, acc)  # [TILE_M, TILE_D]
        if TILE_D2:
            v2 = load_kv(V, j, TILE_D // TILE_D2, width=TILE_D2, latency=V_LATENCY)
            if ct.static_eval(PAGED):
                if masked:
                    v2 = ct.where(key_rows < seqlen_k, v2, 0.0)
            acc2 = ct.mma(p.astype(q.dtype), v2, acc2 * alpha)  # [TILE_M, TILE_D2]
        return m_i, l_i, acc, acc2

    if WINDOW:
        # Row r's keys: from r + off - window_left (window_left >= 0) to r + off (CAUSAL) or
        # r + off + window_right (window_right >= 0), within [0, S_k). ``rows`` holds r + off.
        first_row = q_tile * TILE_M
        if BOTTOM_RIGHT:
            first_row = first_row + offset
        first_tile, unmasked_lo, unmasked_hi, end_tile = _window_tiles(
            first_row, seqlen_k, window_left, window_right, TILE_M=TILE_M, TILE_N=TILE_N,
            CAUSAL=CAUSAL)
        first_keys = ct.full((TILE_M, 1), 0, dtype=np.int32)  # each row's first key
        if window_left >= 0:
            first_keys = rows - window_left
        last_keys = rows  # [TILE_M, 1]: each row's last key (CAUSAL: the diagonal)
        if not CAUSAL:
            last_keys = ct.full((TILE_M, 1), seqlen_k, dtype=np.int32)  # no bound
            if window_right >= 0:
                last_keys = rows + window_right
        backwards = False
        if KV_SAWTOOTH:
            backwards = (q_tile % 2) == 1
        if SPLIT_MASKED:
            # masked tiles at the window's left edge, the unmasked run, masked tiles at the right
            for j in range(first_tile, unmasked_lo):
                m_i, l_i, acc, acc2 = attend(j, True, m_i, l_i, acc, acc2)
            for step in range(unmasked_lo, unmasked_hi):
                j = step
                if KV_SAWTOOTH:
                    if backwards:
                        j = unmasked_lo + unmasked_hi - 1 - step
                m_i, l_i, acc, acc2 = attend(j, False, m_i, l_i, acc, acc2)
            for j in range(unmasked_hi, end_tile):
                m_i, l_i, acc, acc2 = attend(j, True, m_i, l_i, acc, acc2)
        else:
            for step in range(first_tile, end_tile):
                j = step
                if KV_SAWTOOTH:
                    if backwards:
                        j = first_tile + end_tile - 1 - step
                masked = (j < unmasked_lo) | (j >= unmasked_hi)
                m_i, l_i, acc, acc2 = attend(j, masked, m_i, l_i, acc, acc2)
    else:
        if CAUSAL:
            if BOTTOM_RIGHT:
                # keys the tile's last row sees, and the full key tiles its first row sees;
                # both clamped at 0 before dividing (no floor division of negative numbers)
                last_key = max(min((q_tile + 1) * TILE_M + offset, seqlen_k), 0)
                num_kv_tiles = ct.cdiv(last_key, TILE_N)
                mask_from = min(max(q_tile * TILE_M + offset + 1, 0) // TILE_N,
                                seqlen_k // TILE_N)
            else:
                last_key = min((q_tile + 1) * TILE_M, seqlen_k)
                num_kv_tiles = ct.cdiv(last_key, TILE_N)
                # first key tile that crosses the diagonal (or the end of the keys)
                mask_from = min((q_tile * TILE_M) // TILE_N, seqlen_k // TILE_N)
        else:
            num_kv_tiles = ct.cdiv(seqlen_k, TILE_N)
            mask_from = seqlen_k // TILE_N
        ANY_MASK = ct.static_eval(CAUSAL or not EVEN_K)
        backwards = False
        if KV_SAWTOOTH:
            backwards = (q_tile % 2) == 1

        # Key tiles [0, unmasked) need no mask. With SPLIT_MASKED the first loop walks only those
        # and a second loop the masked rest, so neither branches per step; otherwise one loop
        # tests j.
        unmasked = num_kv_tiles
        if ct.static_eval(ANY_MASK and SPLIT_MASKED):
            unmasked = min(mask_from, num_kv_tiles)
        for step in range(unmasked):
            j = step
            if KV_SAWTOOTH:
                if backwards:
                    j = unmasked - 1 - step
            masked = False
            if ct.static_eval(ANY_MASK and not SPLIT_MASKED):
                masked = j >= mask_from
            m_i, l_i, acc, acc2 = attend(j, masked, m_i, l_i, acc, acc2)
        if ct.static_eval(ANY_MASK and SPLIT_MASKED):
            for j in range(unmasked, num_kv_tiles):
                m_i, l_i, acc, acc2 = attend(j, True, m_i, l_i, acc, acc2)

    # Normalise with one reciprocal per row and a multiply per element: TILE_M x TILE_D exact
    # divisions cost 7-8% at D=256, S <= 2k (H100).
    ones = ct.full((TILE_M, 1), 1.0, dtype=np.float32)
    if APPROX_DIV:
        inv_l = ct.truediv(ones, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    else:
        inv_l = ones / l_i
    if ct.static_eval(BOTTOM_RIGHT or WINDOW or SINKS or RAGGED):
        # a row that saw no key (nor a finite sink) has l_i == 0 and acc == 0: store 0, not
        # 0 * inf
        inv_l = ct.where(l_i > 0.0, inv_l, 0.0)
    acc = acc * inv_l
    out = acc.astype(Out.dtype).reshape((1, 1, TILE_M, TILE_D))
    ct.store(Out, index=(batch, head, q_tile, 0), tile=out)
    if TILE_D2:
        out2 = (acc2 * inv_l).astype(Out.dtype).reshape((1, 1, TILE_M, TILE_D2))
        ct.store(Out, index=(batch, head, q_tile, TILE_D // TILE_D2), tile=out2)
    if STORE_LSE:
        # base 2, in units of scaled scores: P = 2^(s * scale * log2(e) - lse) in the backward.
        # A row that saw no key gets +inf, so its probabilities (and gradients) are zeros; with
        # SINKS the sink's term is in l_i, and such a row gets the sink (times log2(e)).
        seen = l_i > 0.0
        if EXP2:
            lse = m_i + ct.log2(ct.where(seen, l_i, 1.0))
        else:
            lse = (m_i + ct.log(ct.where(seen, l_i, 1.0))) * LOG2_E
        lse = ct.where(seen, lse, np.inf)
        ct.store(Lse, index=(batch, head, q_tile), tile=lse.reshape((1, 1, TILE_M)))


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
    TILE_M: ConstInt, TILE_N: ConstInt,
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
    PAGE_ROWS: ConstInt,  # PAGED: keys per load, dividing the page size and TILE_N; else 0
):
    num_q_tiles = ct.cdiv(Q.shape[2], TILE_M)

    def attend_tile(q_tile, bh):
        _attend_q_tile(
            Q, K, V, Out, Lse, q_tile, bh, qk_scale, heads_q, group, window_left=window_left,
            window_right=window_right, softcap=softcap, Sinks=Sinks, Ranges=Ranges, Pages=Pages,
            TILE_M=TILE_M, TILE_N=TILE_N, TILE_D=TILE_D, TILE_D2=TILE_D2, CAUSAL=CAUSAL,
            BOTTOM_RIGHT=BOTTOM_RIGHT, EVEN_K=EVEN_K, EXP2=EXP2, APPROX_DIV=APPROX_DIV,
            K_TRANSPOSED=K_TRANSPOSED, K_LATENCY=K_LATENCY, V_LATENCY=V_LATENCY,
            ALLOW_TMA=ALLOW_TMA, KV_SAWTOOTH=KV_SAWTOOTH, CHECK_BOUNDS=CHECK_BOUNDS,
            SPLIT_MASKED=SPLIT_MASKED, STORE_LSE=STORE_LSE, WINDOW=WINDOW, SOFTCAP=SOFTCAP,
            SINKS=SINKS, RAGGED=RAGGED, PACKED=PACKED, PAGED=PAGED, PAGE_ROWS=PAGE_ROWS)

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
        item = ct.bid(0) // heads_q
        seq = ct.gather(Work, (0, item))
        if seq >= 0:
            attend_tile(ct.gather(Work, (1, item)), seq * heads_q + ct.bid(0) % heads_q)
    elif PERSISTENT:
        # Work item i is slot i % num_slots of (batch x head) i // num_slots: the CTAs in flight
        # at any moment work on neighbouring tiles of the same heads and share their K/V in L2.
        for item in range(ct.bid(0), num_slots * Q.shape[0] * heads_q, ct.num_blocks(0)):
            attend_slot(item % num_slots, item // num_slots)
    else:
        attend_slot(ct.bid(0), ct.bid(1))
