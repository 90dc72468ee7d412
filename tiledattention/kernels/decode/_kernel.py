"""The split-KV (flash-decoding) kernel templates (cuTile): a split kernel and a combine kernel.

Decode attends few query rows against many keys. One CTA of ``decode_split`` takes one (batch, K/V
head), one tile of query positions and one *split*, a contiguous range of key tiles: the query rows
of every query head that shares the K/V head are packed into one ``[TILE_G * TILE_S, D]`` tile
(``TILE_G`` heads x ``TILE_S`` positions), so each K/V tile is read once per K/V head, not once per
query head. The queries and the output are passed as ``[B, H_kv, G, S_q, D]`` views (the head dim
split into K/V head and group: no copy); heads past ``G`` and positions past ``S_q`` are zero-
filled on load and clipped on store.

With one split (``DIRECT``) the kernel normalises and writes the output itself. Otherwise each
split writes its normalised partial output and its log-sum-exp (base 2) in float32, and
``decode_combine`` merges the splits of each row (with ``TAIL`` only the rows from
``split_hint`` on split, each row before it one CTA that writes its output as ``DIRECT`` does,
and the merge covers the split rows only): ``out = sum_s 2^(lse_s - m) o_s / sum_s 2^(lse_s
- m)``. With ``BLOCK`` it loads all of a row's splits as one tile and merges them in one step;
otherwise it walks them ``UNROLL`` at a time. With ``PDL`` the combine is launched as a
programmatic dependent launch: its CTAs are scheduled while the split kernel drains and wait for
its memory.

Masking: keys at or past ``S_k`` never enter the softmax; with ``CAUSAL`` query position ``i`` sees
keys ``0..i + causal_offset`` (0: top-left, ``S_k - S_q``: bottom-right). With ``WINDOW`` it also
sees only keys ``i + causal_offset - window_left .. i + causal_offset + window_right`` (a side of
-1, ``kernel_core.numbers.UNBOUNDED``, is unbounded): each query tile walks only the key tiles of
its rows' union of visible keys, split over the CTAs of its row, and the key walk starts where that
range starts (computed from ``causal_offset`` at run time, so it follows a cache that grows). Only
the tiles at the range's edges are masked (``kernel_core.bounds.decode_key_tiles``). ``SOFTCAP``
caps the scaled scores at ``softcap * tanh(s / softcap)``; ``SINKS`` adds ``exp(Sinks[h] - m)`` to
each row's denominator once: in the single split's normalisation or in the combine, never per
split. A row that sees no key returns zeros. ``RAGGED`` (a padded batch's per-entry ranges,
``Ranges``): each batch entry's keys are cut out of K and V, its query rows in range are the last
positions of those keys (bottom-right), and rows outside the range come out as zeros. ``PAGED`` (a
paged cache): K and V are pools of pages and each entry's keys lie in the pages its row of the
block table (``Pages``) names, one page lookup per page-sized load. ``BALANCED`` (a ragged
batch without a window): every split takes ``1 / splits`` of the key tiles of ``split_hint``
keys (the plan's longest cache; a longer entry takes its own share), so a shorter entry uses
fewer of its splits (the rest store empty partials) and the CTAs stream alike instead of in
proportion to their entry's length. ``KV_FP8`` (an FP8 cache):
K and V are float8_e4m3fn, widened tile by tile to float16 (every e4m3 value is a float16 one:
one conversion a pair of values), with k's descale factor in the score scale and v's on each
split's normalised output; the queries go to float16 too, scaled by a power of two into its
range once a CTA (the factor undone in the score scale), and P goes to float16. V comes
as int16 words of two values each (the launcher's view of the same bytes, ``[..., D / 2]``):
read as a 16-bit tile, the compiler feeds the value product by transposing loads from shared
memory (``LDSM.T``), where a tile of bytes is gathered a byte at a time (``LDS.U8``). Each
word's low and high bytes (the even and odd head-dim columns) widen into a tile of their own,
each multiplied into an accumulator of its own, and the two are interleaved back into head-dim
order once, after the walk. ``KEY_SLICES`` (``W`` > 1): each key tile is folded as ``W``
slices of ``TILE_N / W`` consecutive keys (3-D ``[W, ...]`` tiles: the query tile broadcast
over the slices, ``ct.mma`` batched over them), each slice with its own running max,
denominator and accumulator, merged once after the walk (``merged_slices``): a slice's row
reductions stay within the warp that holds it, where a whole tile's meet across the CTA's
warps every step (named barriers and shared-memory exchanges); yet on an H100 it walked
slower on most calls (``docs/records/benchmarks/paged/issue49/``, section 60). A sink joins
the first slice's state. Every
UPPER_CASE parameter is a compile-time constant (``_launch``); nothing here depends on ``S_k``
at compile time, so a decode loop whose cache grows by a key per step reuses one compiled
kernel.
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from ...kernel_core.bounds import decode_key_tiles
from ...kernel_core.numbers import LOG2_E, NEG_BIG
from ...kernel_core.ranges import page_rows, sequence_view
from ...kernel_core.softmax import (log_sum_exp, merged_slices, merged_splits, normalised,
                                    online_softmax)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def _e4m3_halves(words):
    """The two float16 tiles of an int16 tile holding two e4m3 values a word: the low bytes
    (even head-dim columns) and the high bytes (odd ones). Every e4m3 value is a float16 one."""
    low = ct.bitcast((words & 0xFF).astype(ct.uint8), ct.float8_e4m3fn)
    high = ct.bitcast(((words >> 8) & 0xFF).astype(ct.uint8), ct.float8_e4m3fn)
    return low.astype(ct.float16), high.astype(ct.float16)


def _as_float16(q):
    """``q`` (bf16 or fp16) times the power of two that brings its largest magnitude into
    ``(2^13, 2^14]``, as float16 (exact but where a value falls 2^24 below the largest), and
    the factor that undoes it."""
    x = q.astype(np.float32)
    exponent = ct.ceil(ct.log2(ct.maximum(ct.max(ct.abs(x)), 1.0e-30)))
    return (x * ct.exp2(14.0 - exponent)).astype(ct.float16), ct.exp2(exponent - 14.0)


def _interleaved(even, odd):
    """``[M, D]`` from the ``[M, D / 2]`` tiles of its even and odd columns."""
    m, half = even.shape
    return ct.cat((even.reshape((m, half, 1)), odd.reshape((m, half, 1))), 2).reshape(
        (m, 2 * half))


def _tile_of_row(row, heads, num_q_tiles):
    """(batch, head of the view, query tile) of grid row ``row`` = (batch x head) x query tile."""
    q_tile = row % num_q_tiles
    bh = row // num_q_tiles
    return bh // heads, bh % heads, q_tile


def _row_sinks(Sinks, head, group, TILE_G, TILE_S, EXP2):
    """The sink logit of each packed row's query head (``head * group + g`` for tile head
    ``g``; padded heads get 0), in the kernel's units (times log2(e) with ``EXP2``):
    ``[TILE_G * TILE_S, 1]``."""
    g = ct.arange(TILE_G * TILE_S, dtype=np.int32)[:, None] // TILE_S  # [TILE_M, 1]
    sink = ct.gather(Sinks, head * group + g, mask=g < group, padding_value=0.0)
    if EXP2:
        sink = sink * LOG2_E
    return sink  # [TILE_M, 1]


@ct.kernel
def decode_split(
    Q, K, V, Out,  # [B, H_kv', G', S_q, D], [B, H_kv, S_k, D] x2 (KV_FP8: V int16 [.., D / 2]),
    # like Q
    Opart,  # [B * H_kv' * q_tiles, splits, TILE_M, TILE_D] float32 (unused when DIRECT)
    Lse,  # [B * H_kv' * q_tiles, splits, TILE_M] float32, base-2 log-sum-exp (unused: DIRECT)
    qk_scale: float,
    causal_offset: int,  # query position i sees keys 0..i + causal_offset (CAUSAL only)
    kv_div: int,  # head index of Q's view // kv_div = K/V head (1 when the group is packed)
    window_left: int,  # WINDOW: row i sees keys from i + causal_offset - window_left (-1: all)
    window_right: int,  # WINDOW: ... up to i + causal_offset + window_right (-1: all)
    softcap: float,  # SOFTCAP: scores capped at softcap * tanh(s / softcap)
    Sinks,  # SINKS: [H_q] float32 sink logits; else a placeholder int the code never reads.
    # The new launch-time values come last: the others keep their offsets (and the code of a
    # plain problem its bytes).
    Ranges,  # RAGGED: int32 [4, B] query starts, query ends, key starts, key ends (PAGED:
    # int32 [B], the entries' key counts); else ()
    Pages,  # PAGED: int32 [B, max_pages] block table (K, V: page pools); else ()
    KDescale, VDescale,  # KV_FP8: float32 [B, H_kv] factors of the e4m3 K and V; else ()
    split_hint: int,  # BALANCED: the batch's longest cache, whose 1 / splits is every split's
    # share (a row's own share where that is more); TAIL: the rows before the split ones (each
    # one CTA, unsplit); else 0. (One parameter for both, which never meet: another would move
    # the TMA descriptors after the parameters, and so every plain kernel's machine code.)
    Order,  # ORDERED: int32 [B], the batch entries in the order their CTAs run (decode_order's)
    # else () (no bytes: the parameters before keep their offsets)
    TILE_G: ConstInt,  # query heads per tile (>= G' when packed; padded heads are zeros)
    TILE_S: ConstInt,  # query positions per tile
    TILE_N: ConstInt,  # keys per step
    KEY_SLICES: ConstInt,  # slices of TILE_N / KEY_SLICES keys, each with its own state
    TILE_D: ConstInt,  # head_dim rounded up to a power of two
    CAUSAL: ConstBool,
    EXP2: ConstBool,
    K_TRANSPOSED: ConstBool,
    K_LATENCY: ConstInt,  # 1..10, or 0: let the compiler infer it
    V_LATENCY: ConstInt,
    DIRECT: ConstBool,  # one split: normalise and store into Out, no partials
    PDL: ConstBool,  # a dependent combine kernel may be scheduled early
    WINDOW: ConstBool,  # a sliding window bounds a side of each row's keys
    SOFTCAP: ConstBool,
    SINKS: ConstBool,  # DIRECT only: the sink joins the denominator (else the combine adds it)
    RAGGED: ConstBool,  # each batch entry's keys and query rows are its Ranges' (bottom-right)
    PAGED: ConstBool,  # RAGGED: K and V are [pages, page_size, H_kv, D] pools; entry b's keys
    # 0..Ranges[b] - 1 lie in its block table's pages, Pages[b]
    PAGE_ROWS: ConstInt,  # PAGED: keys per load, dividing the page size and TILE_N; else 0
    PAGE_SIZE: ConstInt,  # PAGED: the pools' keys a page (K.shape[1]); else 0
    KV_FP8: ConstBool,  # K and V float8_e4m3fn (an FP8 cache), widened to Q's dtype per tile
    BALANCED: ConstBool,  # RAGGED, no WINDOW: every split's share is the longest entry's
    TAIL: ConstBool,  # only the rows from split_hint on split (a one-dimensional grid)
    ORDERED: ConstBool,  # PAGED: grid row r takes entry Order[r // rows an entry]'s rows
):
    TILE_M = ct.static_eval(TILE_G * TILE_S)
    PAD = ct.static_eval(ct.PaddingMode.ZERO)
    W = KEY_SLICES
    SLICE = ct.static_eval(TILE_N // KEY_SLICES)  # keys a slice
    SLICED = ct.static_eval(KEY_SLICES > 1)
    # the running state's, a score tile's and a key index's shapes: 3-D, a slice a row, when
    # sliced
    STATE = ct.static_eval((W, TILE_M, 1) if SLICED else (TILE_M, 1))
    ACC = ct.static_eval((W, TILE_M, TILE_D) if SLICED else (TILE_M, TILE_D))
    KEYS = ct.static_eval((W, 1, SLICE) if SLICED else (1, TILE_N))
    heads = Q.shape[1]
    num_q_tiles = ct.cdiv(Q.shape[3], TILE_S)
    row = ct.bid(0)  # (batch x head of the view) x query tile
    split = ct.bid(1)
    if ORDERED:
        # CTAs start in grid order: the entries' rows in Order's (longest cache first), so no
        # long walk starts last and runs alone at the end. This kernel is a programmatic
        # dependent of the kernel before it (decode_order's, or any where the caller ranked
        # the entries): wait for that one's memory before reading Order or anything else
        ct.grid_dependency_control_wait()
        entry_rows = heads * num_q_tiles
        row = ct.gather(Order, row // entry_rows) * entry_rows + row % entry_rows
    splits = ct.num_blocks(1)
    if TAIL:
        # CTAs below whole_rows take a row each, unsplit; the rest take the last rows' splits
        # (the long walks are scheduled first, the short ones fill the last wave): the grid
        # is whole_rows + (rows - whole_rows) x tail_splits CTAs
        cta = row
        whole_rows = split_hint
        tail_rows = Q.shape[0] * heads * num_q_tiles - whole_rows
        tail_splits = (ct.num_blocks(0) - whole_rows) // tail_rows
        past = max(cta - whole_rows, 0)
        row = min(cta, whole_rows) + past // tail_splits
        split = past % tail_splits
        tail = min(max(cta - whole_rows + 1, 0), 1)  # 0 for a row of its own, 1 in the tail
        splits = 1 + (tail_splits - 1) * tail
    batch, head, q_tile = _tile_of_row(row, heads, num_q_tiles)
    kv_head = head // kv_div
    if PDL:
        ct.grid_dependency_control_launch_dependents()
    q_lo = 0
    q_hi = Q.shape[3]
    paged_keys = 0
    if RAGGED:
        # the entry's keys cut out of K and V (or, PAGED, counted in its pages, at most the
        # block table's); its query rows q_lo..q_hi - 1 are the last of them (bottom-right
        # within the ranges: row i sees keys up to i + len - q_hi); rows outside come out as
        # zeros
        if PAGED:  # Ranges: the entries' key counts, [B]; every query row is in range
            paged_keys = min(ct.gather(Ranges, batch), Pages.shape[1] * PAGE_SIZE)
            causal_offset = paged_keys - q_hi
        else:
            K = sequence_view(K, Ranges, batch, 2)
            V = sequence_view(V, Ranges, batch, 2)
            q_lo = ct.gather(Ranges, (0, batch))
            q_hi = ct.gather(Ranges, (1, batch))
            causal_offset = K.shape[2] - q_hi

    score_scale = qk_scale  # what multiplies q.k: with KV_FP8 also k's descale factor
    v_descale = 1.0
    if KV_FP8:
        score_scale = qk_scale * ct.gather(KDescale, (batch, kv_head))
        v_descale = ct.gather(VDescale, (batch, kv_head))
    scale = score_scale
    if EXP2:
        scale = score_scale * LOG2_E
    seqlen_k = K.shape[2]
    if PAGED:
        seqlen_k = paged_keys
    first_pos = q_tile * TILE_S
    # packed row r is head r // TILE_S at position first_pos + r % TILE_S
    positions = first_pos + ct.arange(TILE_M, dtype=np.int32)[:, None] % TILE_S  # [TILE_M, 1]
    row_positions = positions.reshape((1, TILE_M, 1)) if SLICED else positions
    # this split's key tiles [start, stop); with WINDOW row i keeps keys i + lo_shift .. i +
    # hi_shift, and the tiles before unmask_from are masked too
    lo_shift, hi_shift, start, unmask_from, mask_from, stop = decode_key_tiles(
        first_pos, Q.shape[3], seqlen_k, causal_offset, window_left, window_right, split,
        splits, TILE_S, TILE_N, WINDOW, CAUSAL, BALANCED=BALANCED, share_keys=split_hint)
    cap_in = 0.0
    cap_out = 0.0
    if SOFTCAP:
        cap_in = score_scale / softcap  # s / c, from the raw product
        cap_out = softcap  # c, in the kernel's units
        if EXP2:
            cap_out = softcap * LOG2_E

    q = ct.load(Q, index=(batch, head, 0, q_tile, 0), shape=(1, 1, TILE_G, TILE_S, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]
    if KV_FP8:
        # the keys widen to float16 in one conversion a pair of values (into bf16 it is
        # three), so the queries go to float16 too, scaled into its range: the factor that
        # undoes it joins the score scale
        q, q_factor = _as_float16(q)
        scale = scale * q_factor
        cap_in = cap_in * q_factor
    if SINKS:  # DIRECT, or TAIL's unsplit rows (the combine adds a split row's sink)
        # the sink as a key of value 0 seen first (sliced: by the first slice): max = sink,
        # denominator 1
        m_i = _row_sinks(Sinks, head, Q.shape[2], TILE_G, TILE_S, EXP2)  # [TILE_M, 1]
        l_i = ct.full((TILE_M, 1), 1.0, dtype=np.float32)
        if SLICED:
            first = ct.broadcast_to(ct.arange(W, dtype=np.int32).reshape((W, 1, 1)) == 0, STATE)
            m_i = ct.where(first, ct.broadcast_to(m_i.reshape((1, TILE_M, 1)), STATE), NEG_BIG)
            l_i = ct.where(first, ct.full(STATE, 1.0, dtype=np.float32), 0.0)
        if TAIL:
            own = ct.full(STATE, tail, dtype=np.int32) == 0
            m_i = ct.where(own, m_i, NEG_BIG)
            l_i = ct.where(own, l_i, 0.0)
    else:
        m_i = ct.full(STATE, NEG_BIG, dtype=np.float32)
        l_i = ct.full(STATE, 0.0, dtype=np.float32)
    if KV_FP8:  # the even and odd head-dim columns' accumulators
        acc = (ct.full((TILE_M, TILE_D // 2), 0.0, dtype=np.float32),
               ct.full((TILE_M, TILE_D // 2), 0.0, dtype=np.float32))
    else:
        acc = ct.full(ACC, 0.0, dtype=np.float32)
    if SLICED:  # every slice scores the same query rows
        q = ct.broadcast_to(q.reshape((1, TILE_M, TILE_D)), (W, TILE_M, TILE_D))

    def load_kv(A, j, latency, width):
        """Key / value tile ``j`` as ``[TILE_N, width]``: from the entry's pages with ``PAGED``
        (``PAGE_ROWS`` keys a load), else from its rows of ``A``."""
        if PAGED:
            return page_rows(A, Pages, batch, kv_head, j, 0, TILE_N, PAGE_ROWS, width=width,
                             latency=latency, PAD=PAD, page_size=PAGE_SIZE)
        tile = ct.load(A, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, width),
                       padding_mode=PAD, latency=ct.static_eval(latency or None))
        return tile.reshape((TILE_N, width))

    def step(j, masked, m_i, l_i, acc):
        """Fold key tile ``j`` into the running (max, denominator, accumulator) of the packed
        rows. ``masked``: apply the sequence-end, causal and window masks (only the tiles at
        the edges of a row's key range need it). With ``SOFTCAP`` the scores are ``cap_out *
        tanh(qk * cap_in)``: the capped scaled score in the kernel's units."""
        if ct.static_eval(K_TRANSPOSED and not PAGED):
            k = ct.load(K, index=(batch, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                        order=(0, 1, 3, 2), padding_mode=PAD,
                        latency=ct.static_eval(K_LATENCY or None)).reshape((TILE_D, TILE_N))
            if SLICED:  # [W, TILE_D, SLICE]
                k = ct.permute(k.reshape((TILE_D, W, SLICE)), (1, 0, 2))
        else:
            k = load_kv(K, j, latency=K_LATENCY, width=TILE_D)  # [TILE_N, TILE_D]
            if SLICED:  # [W, TILE_D, SLICE]
                k = ct.transpose(k.reshape((W, SLICE, TILE_D)), 1, 2)
            else:
                k = ct.transpose(k)  # [TILE_D, TILE_N]
        if KV_FP8:
            k = k.astype(q.dtype)
        # the scores: [TILE_M, TILE_N], or sliced [W, TILE_M, SLICE] (below, "scores")
        qk = ct.mma(q, k, ct.full((W, TILE_M, SLICE) if SLICED else (TILE_M, TILE_N), 0.0,
                                  dtype=np.float32))
        if SOFTCAP:
            qk = ct.tanh(qk * cap_in) * cap_out  # scaled
        if masked:
            keys = j * TILE_N + ct.arange(TILE_N, dtype=np.int32).reshape(KEYS)
            keep = keys < seqlen_k
            if WINDOW:
                keep = keep & (keys >= row_positions + lo_shift) & (
                    keys <= row_positions + hi_shift)
            elif CAUSAL:
                keep = keep & (keys <= row_positions + causal_offset)  # scores' shape
            qk = ct.where(keep, qk, -np.inf)
        # p: the scores' shape; capped scores are scaled already
        p, m_i, l_i, alpha = online_softmax(qk, m_i, l_i, scale, EXP2, prescaled=SOFTCAP)
        # [TILE_N, TILE_D], or KV_FP8 [TILE_N, TILE_D / 2] words
        v = load_kv(V, j, latency=V_LATENCY, width=TILE_D // 2 if KV_FP8 else TILE_D)
        if PAGED:
            if masked:
                # a page's rows past the entry's keys hold anything: p is 0 there, but 0 * NaN
                # is not 0
                key_rows = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[:, None]
                if KV_FP8:
                    v = ct.where(key_rows < seqlen_k, v, 0)  # words of two zeros
                else:
                    v = ct.where(key_rows < seqlen_k, v, 0.0)
        if KV_FP8:
            # P in float16, finer than bf16 on [0, 1]
            even, odd = _e4m3_halves(v)  # [TILE_N, TILE_D / 2] each
            p = p.astype(ct.float16)
            acc_even, acc_odd = acc
            acc = (ct.mma(p, even, acc_even * alpha), ct.mma(p, odd, acc_odd * alpha))
        else:
            if SLICED:
                v = v.reshape((W, SLICE, TILE_D))
            acc = ct.mma(p.astype(v.dtype), v, acc * alpha)  # ACC
        return m_i, l_i, acc

    if WINDOW:
        for j in range(start, unmask_from):
            m_i, l_i, acc = step(j, True, m_i, l_i, acc)
        for j in range(unmask_from, mask_from):
            m_i, l_i, acc = step(j, False, m_i, l_i, acc)
    else:
        for j in range(start, mask_from):
            m_i, l_i, acc = step(j, False, m_i, l_i, acc)
    for j in range(mask_from, stop):
        m_i, l_i, acc = step(j, True, m_i, l_i, acc)

    if KV_FP8:
        acc_even, acc_odd = acc
        acc = _interleaved(acc_even, acc_odd)  # [TILE_M, TILE_D]
    if SLICED:  # [TILE_M, 1] x2, [TILE_M, TILE_D]
        m_i, l_i, acc = merged_slices(m_i, l_i, acc, EXP2)
    # rows that saw no key (an empty split, or masked entirely) have l_i == 0 (with the sink:
    # acc == 0 and l_i >= 1): zeros out
    out = normalised(acc, l_i)  # [TILE_M, TILE_D]
    if KV_FP8:  # linear in the values: each split's partial carries v's factor
        out = out * v_descale
    if RAGGED:  # rows outside the entry's query range: zeros (a zero partial in every split)
        out = ct.where((positions >= q_lo) & (positions < q_hi), out, 0.0)
    if DIRECT:
        ct.store(Out, index=(batch, head, 0, q_tile, 0),
                 tile=out.astype(Out.dtype).reshape((1, 1, TILE_G, TILE_S, TILE_D)))
    elif TAIL:
        if tail == 0:
            ct.store(Out, index=(batch, head, 0, q_tile, 0),
                     tile=out.astype(Out.dtype).reshape((1, 1, TILE_G, TILE_S, TILE_D)))
        else:  # the partials are the tail rows' only
            lse = log_sum_exp(m_i, l_i, EXP2, -np.inf)  # [TILE_M, 1]
            ct.store(Opart, index=(row - whole_rows, split, 0, 0),
                     tile=out.reshape((1, 1, TILE_M, TILE_D)))
            ct.store(Lse, index=(row - whole_rows, split, 0), tile=lse.reshape((1, 1, TILE_M)))
    else:
        lse = log_sum_exp(m_i, l_i, EXP2, -np.inf)  # [TILE_M, 1]; an empty split weighs 0
        ct.store(Opart, index=(row, split, 0, 0), tile=out.reshape((1, 1, TILE_M, TILE_D)))
        ct.store(Lse, index=(row, split, 0), tile=lse.reshape((1, 1, TILE_M)))


@ct.kernel
def decode_order(
    Lengths,  # int32 [B]: the entries' key counts
    Order,  # int32 [B], written: the entries longest first (equal lengths in entry order)
    CHUNK: ConstInt,  # entries ranked a CTA (grid: ceil(B / CHUNK)), compared CHUNK at a time
):
    """Rank each entry by how many come before it (longer, or as long and earlier) and write
    it at its rank: ``Order`` lists the entries longest cache first, for ``ORDERED``."""
    ct.grid_dependency_control_launch_dependents()  # the split kernel waits for Order
    entries = Lengths.shape[0]
    mine = ct.bid(0) * CHUNK + ct.arange(CHUNK, dtype=np.int32)  # [CHUNK]
    length = ct.gather(Lengths, mine, mask=mine < entries, padding_value=0)[:, None]
    rank = ct.full((CHUNK,), 0, dtype=np.int32)
    for chunk in range(ct.cdiv(entries, CHUNK)):
        other = (chunk * CHUNK + ct.arange(CHUNK, dtype=np.int32))[None, :]  # [1, CHUNK]
        other_length = ct.gather(Lengths, other, mask=other < entries, padding_value=0)
        before = (other < entries) & ((other_length > length) | (
            (other_length == length) & (other < mine[:, None])))  # [CHUNK, CHUNK]
        rank = rank + ct.sum(before.astype(np.int32), axis=1)
    ct.scatter(Order, rank, mine, mask=mine < entries)


def _merged_block(Opart, Lse, Sinks, row, chunk, head, group, TILE_G, TILE_S, CHUNK_D, UNROLL,
                  SINKS):
    """Row ``row``'s merged output columns ``chunk`` (``[TILE_M, CHUNK_D]``) from all its
    splits at once (``UNROLL``: at least their count): one load of their log-sum-exps
    (``[UNROLL, TILE_M]``) and one of their partial outputs (``[UNROLL, TILE_M, CHUNK_D]``;
    splits past the last load as -inf and zeros, weight 0), so the merge waits on memory
    once, not once per step. A row that no split saw (every log-sum-exp -inf) comes out as
    zeros; with ``SINKS`` the sink enters as one more split of log-sum-exp ``sink * log2(e)``
    and output 0."""
    TILE_M = ct.static_eval(TILE_G * TILE_S)
    lse = ct.load(Lse, index=(row, 0, 0), shape=(1, UNROLL, TILE_M),
                  padding_mode=ct.PaddingMode.NEG_INF).reshape((UNROLL, TILE_M))
    parts = ct.load(Opart, index=(row, 0, 0, chunk), shape=(1, UNROLL, TILE_M, CHUNK_D),
                    padding_mode=ct.PaddingMode.ZERO).reshape((UNROLL, TILE_M, CHUNK_D))
    top = ct.maximum(ct.max(lse, axis=0, keepdims=True), NEG_BIG)  # [1, TILE_M], finite
    if SINKS:
        sink = _row_sinks(Sinks, head, group, TILE_G, TILE_S, True).reshape((1, TILE_M))
        top = ct.maximum(top, sink)
    weights = ct.exp2(lse - top, flush_to_zero=True)  # [UNROLL, TILE_M]; 0 for empty splits
    total = ct.sum(weights, axis=0, keepdims=True)  # [1, TILE_M]
    if SINKS:
        total = total + ct.exp2(sink - top, flush_to_zero=True)
    acc = ct.sum(parts * weights.reshape((UNROLL, TILE_M, 1)), axis=0)  # [TILE_M, CHUNK_D]
    return normalised(acc, total.reshape((TILE_M, 1)))


@ct.kernel
def decode_combine(
    Opart,  # [rows, splits, TILE_M, TILE_D] float32
    Lse,  # [rows, splits, TILE_M] float32 (base 2)
    Out,  # [B, H_kv', G', S_q, D] view of the output
    Sinks,  # SINKS: [H_q] float32 sink logits; else a placeholder int the code never reads
    TILE_G: ConstInt,
    TILE_S: ConstInt,
    CHUNK_D: ConstInt,  # head-dim columns per CTA (grid dim 1 walks the chunks)
    UNROLL: ConstInt,  # splits merged per step (BLOCK: at least the splits)
    PDL: ConstBool,  # launched as a programmatic dependent of decode_split
    SINKS: ConstBool,  # each row's sink joins the merged denominator (once)
    BLOCK: ConstBool,  # every split in one step, loaded as one [UNROLL, TILE_M, CHUNK_D] tile
):
    TILE_M = ct.static_eval(TILE_G * TILE_S)
    if PDL:
        ct.grid_dependency_control_wait()
    heads = Out.shape[1]
    num_q_tiles = ct.cdiv(Out.shape[3], TILE_S)
    row = ct.bid(0)
    chunk = ct.bid(1)
    batch, head, q_tile = _tile_of_row(row, heads, num_q_tiles)
    if BLOCK:
        out = _merged_block(Opart, Lse, Sinks, row, chunk, head, Out.shape[2], TILE_G, TILE_S,
                            CHUNK_D, UNROLL, SINKS)
        ct.store(Out, index=(batch, head, 0, q_tile, chunk),
                 tile=out.astype(Out.dtype).reshape((1, 1, TILE_G, TILE_S, CHUNK_D)))
        return

    # UNROLL splits per step, their loads issued together: the merge is a chain of dependent
    # steps, and one load per step left it waiting on memory once per split. Splits past the
    # last one are out of bounds: they load as -inf (weight 0) and zeros.
    # With SINKS the sink enters as one more split of log-sum-exp sink * log2(e) and output 0.
    if SINKS:
        m = _row_sinks(Sinks, head, Out.shape[2], TILE_G, TILE_S, True)  # [TILE_M, 1]
        total = ct.full((TILE_M, 1), 1.0, dtype=np.float32)
    else:
        m = ct.full((TILE_M, 1), NEG_BIG, dtype=np.float32)
        total = ct.full((TILE_M, 1), 0.0, dtype=np.float32)
    acc = ct.full((TILE_M, CHUNK_D), 0.0, dtype=np.float32)
    for step in range(ct.cdiv(Opart.shape[1], UNROLL)):
        lses = ()
        parts = ()
        for u in ct.static_iter(range(UNROLL)):
            split = step * UNROLL + u
            lses += (ct.load(Lse, index=(row, split, 0), shape=(1, 1, TILE_M),
                             padding_mode=ct.PaddingMode.NEG_INF).reshape((TILE_M, 1)),)
            parts += (ct.load(Opart, index=(row, split, 0, chunk), shape=(1, 1, TILE_M, CHUNK_D),
                              padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, CHUNK_D)),)
        m, total, acc = merged_splits(m, total, acc, lses, parts, UNROLL)
    out = normalised(acc, total)
    ct.store(Out, index=(batch, head, 0, q_tile, chunk),
             tile=out.astype(Out.dtype).reshape((1, 1, TILE_G, TILE_S, CHUNK_D)))
