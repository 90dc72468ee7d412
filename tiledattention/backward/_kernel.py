"""The backward-pass kernel templates (cuTile): a dQ kernel, a dK/dV kernel and a partials' sum.

With ``S = scale * Q K^T``, ``P = softmax(S)`` and the forward's per-row log-sum-exp ``L``
(base 2, stored by ``attention_fwd`` with ``STORE_LSE``), the gradients are

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   dQ = scale * dS K,   dK = scale * dS^T Q

with ``delta_i = sum_d dO_i,d * O_i,d``. Neither kernel materialises ``S`` or ``P``: each
recomputes its tiles of ``P = 2^(s * scale * log2(e) - L)`` from Q, K and ``L``.

- ``attention_bwd_dq`` (grid: query tiles x (batch x query head)) first computes its rows'
  ``delta`` from O and dO and stores it (the preprocess step, fused), then walks the key tiles
  its rows see and accumulates ``dQ`` in float32 registers. It runs first. With
  ``HEAVY_FIRST`` (causal) the grid's first CTAs take the last query tiles, which see the most
  keys, so that the short tiles fill the tail of the launch.
- ``attention_bwd_dkdv`` (grid: key tiles x (batch x K/V head) x splits) holds one
  ``[TILE_N, D]`` tile of K and V and walks the query tiles that see it, for *every query head
  of the group*: grouped- and multi-query attention reduce dK and dV over the group in
  registers, without expanding K/V. With ``SPLITS > 1`` that walk (query heads x query tiles)
  is shared by ``SPLITS`` CTAs, each storing float32 partials that ``attention_bwd_sum`` adds
  in a fixed order: more CTAs where key tiles x K/V heads would leave SMs idle (multi-query
  heads, batch 1).

With ``TILE_MAJOR`` both grids put the tile axis last (slowest): every (batch, head) CTA of
the first tile launches before any of the second, so that with a causal mask the longest walks
(the dK/dV kernel's first key tiles, the dQ kernel's last query tiles with ``HEAVY_FIRST``) all
start in the first waves, not head by head.

All of it is deterministic: no atomics, and partials added in a fixed order.

The dQ and dK/dV kernels have two entry points each, one body: ``attention_bwd_dq`` /
``attention_bwd_dkdv`` for plain attention, and ``*_variant`` ones taking the variants'
launch-time values (``window_left``, ``window_right``, ``softcap``, ``Ranges``) after the
others. Plain attention keeps its kernels' parameters, so its machine code stays what it was
(more launch-time values grow the parameter space, which moves other constant-bank data on
sm_100 and sm_12x); a variant problem without a ragged batch passes ``Ranges`` a zero-byte
placeholder, which keeps its code what it was before ``Ranges`` existed.

The variant entry points also take ``Ranges`` (read with ``RAGGED``): a ragged batch, whose
sequences have lengths of their own. Its rows are int32 ``[4, sequences]`` query starts, query
ends, key starts and key ends along the sequence axis; the grid's batch index is a sequence's,
and every array is cut (``Array.slice`` along axis 2) to that sequence's query range (Q, Out,
dO, dQ, Lse, Delta) or key range (K, V, dK, dV), so that lengths, masks, the bottom-right
alignment and windows are the sequence's own. A CTA whose tile starts at or past its
sequence's end writes nothing (the dK/dV kernel skips the tile whole; the dQ kernel walks no key
tile and skips its stores, since a branch around its walk does not compile for sm_100). With ``PACKED`` the sequences lie end to end in batch entry 0 (``[1, H, tokens,
D]`` views of ``[tokens, H, D]`` tensors); else each is a batch entry of its own (a padded
batch). Rows and keys outside every sequence are never written.

Masking is the forward's: keys at or past ``S_k`` never count; with ``CAUSAL`` query row ``i``
sees keys ``0..i + offset`` (offset 0, or ``S_k - S_q`` with ``BOTTOM_RIGHT``). With ``WINDOW``
(a sliding window; ``window_left``, ``window_right``: -1 for an unbounded side) row ``i`` sees
keys ``i + offset - window_left .. i + offset + window_right`` only, and both kernels walk only
the tiles of that band, masking its partial tiles at either end. With ``SOFTCAP`` (``c =
softcap``) the score is ``s = c * tanh(scale * q.k / c)`` and ``dS`` is multiplied by
``1 - (s / c)^2`` before the dQ and dK products. Attention sinks change nothing here: the
forward's ``L`` holds the sink's term, and the sink's own gradient is the caller's. A row that
saw no key has ``L = +inf`` (without sinks): its ``P`` and gradients are 0. Rows and keys past
the ends load as zeros (``L`` and ``delta`` too), which makes their contributions exactly 0;
stores clip them.
Every UPPER_CASE parameter is a compile-time constant (``_launch``).
"""

from __future__ import annotations

import math

import cuda.tile as ct
import numpy as np

from ..kernel_core.ranges import sequence_length, sequence_view_at_least

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

LOG2_E = 1.0 / math.log(2.0)


def _load_rows(A, batch, head, tile, TILE, TILE_D, LATENCY):
    """Rows ``tile * TILE ..`` of ``A [B, H, S, D]`` as a ``[TILE, TILE_D]`` tile (zero-filled)."""
    return ct.load(A, index=(batch, head, tile, 0), shape=(1, 1, TILE, TILE_D),
                   padding_mode=ct.PaddingMode.ZERO,
                   latency=ct.static_eval(LATENCY or None)).reshape((TILE, TILE_D))


def _load_row_stat(A, batch, head, tile, TILE):
    """Entries ``tile * TILE ..`` of ``A [B, H, S]`` (float32, zero-filled) as a ``[TILE]``."""
    return ct.load(A, index=(batch, head, tile), shape=(1, 1, TILE),
                   padding_mode=ct.PaddingMode.ZERO).reshape((TILE,))


def _causal_offset(Q, K, BOTTOM_RIGHT):
    """Query row ``i`` sees keys ``0..i + offset``."""
    offset = 0
    if BOTTOM_RIGHT:
        offset = K.shape[2] - Q.shape[2]
    return offset


# The window's bounds below are plain integer arithmetic: the kernels call them on scalars, and
# the launcher's tests call them on Python ints.
def window_reach(window_left, window_right, unbounded, CAUSAL):
    """``(left, right)``: row ``i`` sees keys ``i + offset - left .. i + offset + right``
    (``right`` 0 with ``CAUSAL``); an unbounded side (-1) reaches ``unbounded`` (``S_q + S_k``,
    past every key)."""
    left = window_left
    if window_left < 0:
        left = unbounded
    right = 0
    if not CAUSAL:
        right = window_right
        if window_right < 0:
            right = unbounded
    return left, right


def dq_key_tiles(first_row, last_row, offset, left, right, seqlen_k, TILE_N):
    """``(lo, full_from, full_to, hi)``: the key tiles ``[lo, hi)`` hold every key that rows
    ``first_row..last_row`` (``< S_q``) see through the window ``(left, right)``; tiles
    ``[full_from, full_to)`` (within it) are seen whole by each of those rows and end before
    ``S_k``: only the tiles before and after them need the mask."""
    first_key = max(first_row + offset - left, 0)
    end_key = min(last_row + offset + right + 1, seqlen_k)
    lo = first_key // TILE_N
    hi = lo
    if end_key > first_key:
        hi = ct.cdiv(end_key, TILE_N)
    full_from = min(max(ct.cdiv(max(last_row + offset - left, 0), TILE_N), lo), hi)
    full_to = min(max(min(max(first_row + offset + right + 1, 0) // TILE_N, seqlen_k // TILE_N),
                      full_from), hi)
    return lo, full_from, full_to, hi


def dkdv_query_tiles(first_key, last_key, offset, left, right, seqlen_q, TILE_M):
    """``(first, full_from, full_to, end)``: the query tiles ``[first, end)`` hold every row
    that sees one of keys ``first_key..last_key`` (``< S_k``) through the window ``(left,
    right)``; in tiles ``[full_from, full_to)`` (within it) every row sees all of those keys:
    only the tiles before and after them need the mask."""
    first_row = max(first_key - offset - right, 0)
    end_row = min(last_key - offset + left + 1, seqlen_q)
    first = min(first_row // TILE_M, ct.cdiv(seqlen_q, TILE_M))
    end = first
    if end_row > first_row:
        end = ct.cdiv(end_row, TILE_M)
    full_from = min(max(ct.cdiv(max(last_key - offset - right, 0), TILE_M), first), end)
    full_to = min(max(max(first_key - offset + left + 1, 0) // TILE_M, full_from), end)
    return first, full_from, full_to, end


def _score_scales(qk_scale, softcap, SOFTCAP):
    """``(scale2, tanh_scale)``: ``P = 2^(x * scale2 - L)`` of ``x = q.k``, or with ``SOFTCAP``
    of ``x = tanh(q.k * tanh_scale)`` (the capped score ``c * x``)."""
    if SOFTCAP:
        return softcap * LOG2_E, qk_scale / softcap
    return qk_scale * LOG2_E, 0.0


# -- dQ (and delta) ------------------------------------------------------------------------------
def _dq_step(q, do, lse, delta, dq, K, V, batch, kv_head, j, rows, scale2, seqlen_k, masked,
             CAUSAL, TILE_M, TILE_N, TILE_D, KV_LATENCY, reach, tanh_scale, WINDOW, SOFTCAP):
    """Fold key tile ``j`` into ``dq``; ``masked``: apply the sequence-end / causal / window
    mask (``reach``: ``window_reach``'s pair)."""
    k = _load_rows(K, batch, kv_head, j, TILE_N, TILE_D, KV_LATENCY)  # [TILE_N, TILE_D]
    v = _load_rows(V, batch, kv_head, j, TILE_N, TILE_D, KV_LATENCY)
    s = ct.mma(q, ct.transpose(k), ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
    if SOFTCAP:
        t = ct.tanh(s * tanh_scale)  # the capped score over the cap, [TILE_M, TILE_N]
        s = t
    if masked:
        keys = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[None, :]  # [1, TILE_N]
        keep = keys < seqlen_k
        if CAUSAL:
            keep = keep & (keys <= rows)  # rows: the last key each row sees, [TILE_M, 1]
        if WINDOW:
            keep = keep & (keys >= rows - reach[0])
            if not CAUSAL:
                keep = keep & (keys <= rows + reach[1])
        s = ct.where(keep, s, -np.inf)
    p = ct.exp2(s * scale2 - lse, flush_to_zero=True)  # [TILE_M, TILE_N]
    dp = ct.mma(do, ct.transpose(v), ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
    ds = p * (dp - delta)
    if SOFTCAP:
        ds = ds * (1.0 - t * t)  # d(c * tanh(x / c)) / dx
    return ct.mma(ds.astype(q.dtype), k, dq)  # [TILE_M, TILE_D]


def _dq(Q, K, V, Out, dO, Lse, Delta, dQ, qk_scale, heads_q, group, window_left, window_right,
        softcap, Ranges, TILE_M, TILE_N, TILE_D, CAUSAL, BOTTOM_RIGHT, KV_LATENCY, HEAVY_FIRST,
        TILE_MAJOR, WINDOW, SOFTCAP, RAGGED, PACKED):
    """The dQ kernel's body (both entry points below): the CTA's query tile and (batch, query
    head); with ``RAGGED`` the batch index is a sequence's, every array is cut to that
    sequence's range, and a tile past the sequence's queries does nothing."""
    if TILE_MAJOR:
        q_tile = ct.bid(1)
        bh = ct.bid(0)
        tiles = ct.num_blocks(1)
    else:
        q_tile = ct.bid(0)
        bh = ct.bid(1)
        tiles = ct.num_blocks(0)
    if HEAVY_FIRST:
        q_tile = tiles - 1 - q_tile
    batch = bh // heads_q
    head = bh % heads_q
    q_count = 0
    if RAGGED:
        # (not one branch on the tile's liveness around the rest, as in the dK/dV kernel:
        # tileiras 13.4 fails on the walk's two loops inside it for sm_100; _dq_tile empties
        # a dead tile's walk and skips its stores instead, and its loads read views of at
        # least one row: a sequence without queries still has a view to read)
        seq = batch
        if PACKED:
            batch = 0
        q_count = sequence_length(Ranges, seq, 0)
        Q = sequence_view_at_least(Q, Ranges, seq, 0, 1)
        K = sequence_view_at_least(K, Ranges, seq, 2)
        V = sequence_view_at_least(V, Ranges, seq, 2)
        Out = sequence_view_at_least(Out, Ranges, seq, 0, 1)
        dO = sequence_view_at_least(dO, Ranges, seq, 0, 1)
        Lse = sequence_view_at_least(Lse, Ranges, seq, 0, 1)
        Delta = sequence_view_at_least(Delta, Ranges, seq, 0, 1)
        dQ = sequence_view_at_least(dQ, Ranges, seq, 0, 1)
    _dq_tile(Q, K, V, Out, dO, Lse, Delta, dQ, qk_scale, group, window_left, window_right,
             softcap, q_tile, batch, head, q_count, TILE_M=TILE_M, TILE_N=TILE_N,
             TILE_D=TILE_D, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, KV_LATENCY=KV_LATENCY,
             WINDOW=WINDOW, SOFTCAP=SOFTCAP, RAGGED=RAGGED)


def _dq_tile(Q, K, V, Out, dO, Lse, Delta, dQ, qk_scale, group, window_left, window_right,
             softcap, q_tile, batch, head, q_count, TILE_M, TILE_N, TILE_D, CAUSAL,
             BOTTOM_RIGHT, KV_LATENCY, WINDOW, SOFTCAP, RAGGED):
    """Delta and dQ of query tile ``q_tile`` of ``batch``'s query head ``head`` (:func:`_dq`);
    the sequence lengths are the arrays'. ``RAGGED``: the sequence has ``q_count`` queries (its
    query-side views hold at least one row); a tile at or past them walks no key tile and
    stores nothing."""
    kv_head = head // group
    seqlen_k = K.shape[2]
    seqlen_q = Q.shape[2]
    if RAGGED:
        seqlen_q = q_count
    scale2, tanh_scale = _score_scales(qk_scale, softcap, SOFTCAP)
    reach = (0, 0)
    if WINDOW:
        reach = window_reach(window_left, window_right, seqlen_q + seqlen_k, CAUSAL)

    o = _load_rows(Out, batch, head, q_tile, TILE_M, TILE_D, 0)
    do = _load_rows(dO, batch, head, q_tile, TILE_M, TILE_D, 0)
    delta = ct.sum(o.astype(np.float32) * do.astype(np.float32), axis=-1)  # [TILE_M]
    if RAGGED:
        if q_tile * TILE_M < seqlen_q:
            ct.store(Delta, index=(batch, head, q_tile), tile=delta.reshape((1, 1, TILE_M)))
    else:
        ct.store(Delta, index=(batch, head, q_tile), tile=delta.reshape((1, 1, TILE_M)))
    delta = delta.reshape((TILE_M, 1))
    lse = _load_row_stat(Lse, batch, head, q_tile, TILE_M).reshape((TILE_M, 1))
    q = _load_rows(Q, batch, head, q_tile, TILE_M, TILE_D, 0)

    offset = _causal_offset(Q, K, BOTTOM_RIGHT)
    if RAGGED:
        if BOTTOM_RIGHT:
            offset = seqlen_k - seqlen_q  # the sequence's own lengths
    first_row = q_tile * TILE_M
    rows = first_row + offset + ct.arange(TILE_M, dtype=np.int32)[:, None]  # last key seen

    def step(j, masked, dq):
        """dQ of key tile ``j`` added to ``dq`` (``masked``: apply the mask)."""
        return _dq_step(q, do, lse, delta, dq, K, V, batch, kv_head, j, rows, scale2, seqlen_k,
                        masked, CAUSAL, TILE_M, TILE_N, TILE_D, KV_LATENCY, reach, tanh_scale,
                        WINDOW, SOFTCAP)

    if WINDOW:
        # key tiles [lo, hi) hold the keys the tile's rows see; of them [full_from, full_to)
        # are seen whole by every row (and are not past S_k): the tiles before and after need
        # the mask
        lo, full_from, full_to, hi = dq_key_tiles(
            first_row, min(first_row + TILE_M, seqlen_q) - 1, offset, reach[0], reach[1],
            seqlen_k, TILE_N)
        if RAGGED:  # a dead tile (past its sequence's queries) walks none
            live = min(max(seqlen_q - first_row, 0), 1)
            lo = lo * live
            full_from = full_from * live
            full_to = full_to * live
            hi = hi * live
        dq = ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32)
        for j in range(lo, full_from):
            dq = step(j, True, dq)
        for j in range(full_from, full_to):
            dq = step(j, False, dq)
        for j in range(full_to, hi):
            dq = step(j, True, dq)
    else:
        if CAUSAL:
            num_kv_tiles = ct.cdiv(max(min(first_row + TILE_M + offset, seqlen_k), 0), TILE_N)
            # the first key tile past the first row's diagonal (or the ragged end) needs the mask
            mask_from = min(max(first_row + offset + 1, 0) // TILE_N, seqlen_k // TILE_N)
        else:
            num_kv_tiles = ct.cdiv(seqlen_k, TILE_N)
            mask_from = seqlen_k // TILE_N
        unmasked = min(mask_from, num_kv_tiles)
        if RAGGED:  # a dead tile (past its sequence's queries) walks none
            live = min(max(seqlen_q - first_row, 0), 1)
            num_kv_tiles = num_kv_tiles * live
            unmasked = unmasked * live
        dq = ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32)
        for j in range(unmasked):
            dq = step(j, False, dq)
        for j in range(unmasked, num_kv_tiles):
            dq = step(j, True, dq)
    dq = dq * qk_scale
    if RAGGED:
        if first_row < seqlen_q:
            ct.store(dQ, index=(batch, head, q_tile, 0),
                     tile=dq.astype(dQ.dtype).reshape((1, 1, TILE_M, TILE_D)))
    else:
        ct.store(dQ, index=(batch, head, q_tile, 0),
                 tile=dq.astype(dQ.dtype).reshape((1, 1, TILE_M, TILE_D)))


@ct.kernel
def attention_bwd_dq(
    Q, K, V, Out, dO,  # [B, H_q, S_q, D], [B, H_kv, S_k, D] x2, like Q x2
    Lse,  # [B, H_q, S_q] float32: the forward's log-sum-exp (base 2)
    Delta,  # [B, H_q, S_q] float32: written here, sum_d dO * Out per row
    dQ,  # like Q
    qk_scale: float,
    heads_q: int,
    group: int,  # query heads per K/V head
    TILE_M: ConstInt,  # query rows per CTA
    TILE_N: ConstInt,  # keys per step
    TILE_D: ConstInt,  # head_dim rounded up to a power of two
    CAUSAL: ConstBool,
    BOTTOM_RIGHT: ConstBool,
    KV_LATENCY: ConstInt,  # latency hint of the K/V loads (1..10; 0: the compiler's)
    HEAVY_FIRST: ConstBool,  # CTA 0 takes the last query tile
    TILE_MAJOR: ConstBool,  # grid (batch x head, query tiles): a tile's CTAs of every head first
):
    """dQ and delta of plain attention (no window, no softcap)."""
    _dq(Q, K, V, Out, dO, Lse, Delta, dQ, qk_scale, heads_q, group, -1, -1, 0.0, 0,
        TILE_M=TILE_M, TILE_N=TILE_N, TILE_D=TILE_D, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT,
        KV_LATENCY=KV_LATENCY, HEAVY_FIRST=HEAVY_FIRST, TILE_MAJOR=TILE_MAJOR, WINDOW=False,
        SOFTCAP=False, RAGGED=False, PACKED=False)


@ct.kernel
def attention_bwd_dq_variant(
    Q, K, V, Out, dO,  # [B, H_q, S_q, D], [B, H_kv, S_k, D] x2, like Q x2
    Lse,  # [B, H_q, S_q] float32: the forward's log-sum-exp (base 2)
    Delta,  # [B, H_q, S_q] float32: written here, sum_d dO * Out per row
    dQ,  # like Q
    qk_scale: float,
    heads_q: int,
    group: int,  # query heads per K/V head
    window_left: int,  # keys a row sees before its diagonal (-1: unbounded; read with WINDOW)
    window_right: int,  # keys a row sees past its diagonal (-1: unbounded; read with WINDOW)
    softcap: float,  # the cap c (read with SOFTCAP)
    Ranges,  # RAGGED: int32 [4, sequences] query starts, query ends, key starts, key ends;
    # else a zero-byte placeholder
    TILE_M: ConstInt,  # query rows per CTA
    TILE_N: ConstInt,  # keys per step
    TILE_D: ConstInt,  # head_dim rounded up to a power of two
    CAUSAL: ConstBool,
    BOTTOM_RIGHT: ConstBool,
    KV_LATENCY: ConstInt,  # latency hint of the K/V loads (1..10; 0: the compiler's)
    HEAVY_FIRST: ConstBool,  # CTA 0 takes the last query tile
    TILE_MAJOR: ConstBool,  # grid (batch x head, query tiles): a tile's CTAs of every head first
    WINDOW: ConstBool,  # a sliding window bounds either side
    SOFTCAP: ConstBool,  # scores capped by softcap * tanh(s / softcap)
    RAGGED: ConstBool,  # sequences of their own lengths: the batch index picks Ranges' column
    PACKED: ConstBool,  # RAGGED: the sequences lie end to end in batch 0 (else one a batch entry)
):
    """dQ and delta with a window, a softcap and / or a ragged batch."""
    _dq(Q, K, V, Out, dO, Lse, Delta, dQ, qk_scale, heads_q, group, window_left, window_right,
        softcap, Ranges, TILE_M=TILE_M, TILE_N=TILE_N, TILE_D=TILE_D, CAUSAL=CAUSAL,
        BOTTOM_RIGHT=BOTTOM_RIGHT, KV_LATENCY=KV_LATENCY, HEAVY_FIRST=HEAVY_FIRST,
        TILE_MAJOR=TILE_MAJOR, WINDOW=WINDOW, SOFTCAP=SOFTCAP, RAGGED=RAGGED, PACKED=PACKED)


# -- dK and dV -----------------------------------------------------------------------------------
def _dkdv_step(k, v, dk, dv, Q, dO, Lse, Delta, batch, head, i, keys, scale2, masked, TILE_M,
               TILE_N, TILE_D, Q_LATENCY, reach, tanh_scale, CAUSAL, WINDOW, SOFTCAP):
    """Fold query tile ``i`` of query head ``head`` into ``dk, dv``; ``masked``: causal /
    window mask (``keys``: ``[TILE_N, 1]`` key positions minus the causal offset; ``reach``:
    ``window_reach``'s pair)."""
    q = _load_rows(Q, batch, head, i, TILE_M, TILE_D, Q_LATENCY)  # [TILE_M, TILE_D]
    do = _load_rows(dO, batch, head, i, TILE_M, TILE_D, Q_LATENCY)
    lse = _load_row_stat(Lse, batch, head, i, TILE_M).reshape((1, TILE_M))
    delta = _load_row_stat(Delta, batch, head, i, TILE_M).reshape((1, TILE_M))
    st = ct.mma(k, ct.transpose(q), ct.full((TILE_N, TILE_M), 0.0, dtype=np.float32))
    if SOFTCAP:
        tt = ct.tanh(st * tanh_scale)  # the capped score over the cap, [TILE_N, TILE_M]
        st = tt
    if masked:
        rows = i * TILE_M + ct.arange(TILE_M, dtype=np.int32)[None, :]  # [1, TILE_M]
        if WINDOW:
            keep = keys <= rows + reach[1]
            keep = keep & (keys >= rows - reach[0])
            st = ct.where(keep, st, -np.inf)
        else:
            st = ct.where(keys <= rows, st, -np.inf)
    pt = ct.exp2(st * scale2 - lse, flush_to_zero=True)  # P^T: [TILE_N, TILE_M]
    dv = ct.mma(pt.astype(q.dtype), do, dv)
    dpt = ct.mma(v, ct.transpose(do), ct.full((TILE_N, TILE_M), 0.0, dtype=np.float32))
    dst = pt * (dpt - delta)
    if SOFTCAP:
        dst = dst * (1.0 - tt * tt)  # d(c * tanh(x / c)) / dx
    dk = ct.mma(dst.astype(q.dtype), q, dk)
    return dk, dv


def _dkdv(Q, K, V, dO, Lse, Delta, dK, dV, qk_scale, heads_kv, group, window_left, window_right,
          softcap, Ranges, TILE_M, TILE_N, TILE_D, CAUSAL, BOTTOM_RIGHT, Q_LATENCY, SPLITS,
          TILE_MAJOR, WINDOW, SOFTCAP, RAGGED, PACKED):
    """The dK/dV kernel's body (both entry points below): the CTA's key tile, (batch, K/V
    head) and split; with ``RAGGED`` the batch index is a sequence's, every array is cut to
    that sequence's range, and a tile past the sequence's keys does nothing (``SPLITS`` is
    then 1: the launcher's ``normalise``)."""
    if TILE_MAJOR:
        kv_tile = ct.bid(1)
        bh = ct.bid(0) // SPLITS
        split = ct.bid(0) % SPLITS
    else:
        kv_tile = ct.bid(0)
        bh = ct.bid(1)
        split = ct.bid(2)
    batch = bh // heads_kv
    kv_head = bh % heads_kv
    if RAGGED:
        seq = batch
        if PACKED:
            batch = 0
        K = sequence_view_at_least(K, Ranges, seq, 2)
        if kv_tile * TILE_N < K.shape[2]:
            V = sequence_view_at_least(V, Ranges, seq, 2)
            dK = sequence_view_at_least(dK, Ranges, seq, 2)
            dV = sequence_view_at_least(dV, Ranges, seq, 2)
            Q = sequence_view_at_least(Q, Ranges, seq, 0)
            dO = sequence_view_at_least(dO, Ranges, seq, 0)
            Lse = sequence_view_at_least(Lse, Ranges, seq, 0)
            Delta = sequence_view_at_least(Delta, Ranges, seq, 0)
            _dkdv_tile(Q, K, V, dO, Lse, Delta, dK, dV, qk_scale, group, window_left,
                       window_right, softcap, kv_tile, batch, kv_head, split, TILE_M=TILE_M,
                       TILE_N=TILE_N, TILE_D=TILE_D, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT,
                       Q_LATENCY=Q_LATENCY, SPLITS=SPLITS, WINDOW=WINDOW, SOFTCAP=SOFTCAP)
    else:
        _dkdv_tile(Q, K, V, dO, Lse, Delta, dK, dV, qk_scale, group, window_left, window_right,
                   softcap, kv_tile, batch, kv_head, split, TILE_M=TILE_M, TILE_N=TILE_N,
                   TILE_D=TILE_D, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT,
                   Q_LATENCY=Q_LATENCY, SPLITS=SPLITS, WINDOW=WINDOW, SOFTCAP=SOFTCAP)


def _dkdv_tile(Q, K, V, dO, Lse, Delta, dK, dV, qk_scale, group, window_left, window_right,
               softcap, kv_tile, batch, kv_head, split, TILE_M, TILE_N, TILE_D, CAUSAL,
               BOTTOM_RIGHT, Q_LATENCY, SPLITS, WINDOW, SOFTCAP):
    """dK and dV (or split ``split``'s partials) of key tile ``kv_tile`` of ``batch``'s K/V
    head ``kv_head`` (:func:`_dkdv`); the sequence lengths are the arrays'."""
    seqlen_q = Q.shape[2]
    scale2, tanh_scale = _score_scales(qk_scale, softcap, SOFTCAP)
    reach = (0, 0)
    if WINDOW:
        reach = window_reach(window_left, window_right, Q.shape[2] + K.shape[2], CAUSAL)
    k = _load_rows(K, batch, kv_head, kv_tile, TILE_N, TILE_D, 0)
    v = _load_rows(V, batch, kv_head, kv_tile, TILE_N, TILE_D, 0)

    num_q_tiles = ct.cdiv(seqlen_q, TILE_M)
    first_key = kv_tile * TILE_N
    offset = _causal_offset(Q, K, BOTTOM_RIGHT)
    keys = first_key - offset + ct.arange(TILE_N, dtype=np.int32)[:, None]  # first row seeing it
    first = 0
    unmask_from = 0
    end = num_q_tiles
    unmask_to = num_q_tiles
    if WINDOW:
        # rows [first_key - offset - right, last_key - offset + left] see some of these keys:
        # query tiles [first, end); of them [unmask_from, unmask_to) see all of them, the
        # tiles before and after need the mask
        first, unmask_from, unmask_to, end = dkdv_query_tiles(
            first_key, min(first_key + TILE_N, K.shape[2]) - 1, offset, reach[0], reach[1],
            seqlen_q, TILE_M)
    elif CAUSAL:
        # rows before first_key - offset see none of these keys; from row
        # first_key + TILE_N - 1 - offset on a row sees all of them
        first = min(max(first_key - offset, 0) // TILE_M, num_q_tiles)
        unmask_from = max(min(ct.cdiv(max(first_key + TILE_N - 1 - offset, 0), TILE_M),
                              num_q_tiles), first)

    # The key tile's work is the (query head g, query tile i) pairs, g-major: group * seen of
    # them. Split `split` of SPLITS takes the contiguous share [start, stop) of that list.
    seen = end - first
    total = group * seen
    start = split * total // SPLITS
    stop = (split + 1) * total // SPLITS
    per_head = max(seen, 1)
    dk = ct.full((TILE_N, TILE_D), 0.0, dtype=np.float32)
    dv = ct.full((TILE_N, TILE_D), 0.0, dtype=np.float32)

    def step(head, i, masked, dk, dv):
        """dK and dV of query tile ``i`` of ``head`` added (``masked``: apply the mask)."""
        return _dkdv_step(k, v, dk, dv, Q, dO, Lse, Delta, batch, head, i, keys, scale2, masked,
                          TILE_M, TILE_N, TILE_D, Q_LATENCY, reach, tanh_scale, CAUSAL, WINDOW,
                          SOFTCAP)

    for g in range(start // per_head, ct.cdiv(stop, per_head)):
        head = kv_head * group + g
        lo = first + max(start - g * seen, 0)
        hi = first + min(stop - g * seen, seen)
        for i in range(lo, min(hi, unmask_from)):
            dk, dv = step(head, i, True, dk, dv)
        if WINDOW:
            for i in range(max(lo, unmask_from), min(hi, unmask_to)):
                dk, dv = step(head, i, False, dk, dv)
            for i in range(max(lo, unmask_to), hi):
                dk, dv = step(head, i, True, dk, dv)
        else:
            for i in range(max(lo, unmask_from), hi):
                dk, dv = step(head, i, False, dk, dv)
    dk = dk * qk_scale
    part = split * Q.shape[0] + batch
    ct.store(dK, index=(part, kv_head, kv_tile, 0),
             tile=dk.astype(dK.dtype).reshape((1, 1, TILE_N, TILE_D)))
    ct.store(dV, index=(part, kv_head, kv_tile, 0),
             tile=dv.astype(dV.dtype).reshape((1, 1, TILE_N, TILE_D)))


@ct.kernel
def attention_bwd_dkdv(
    Q, K, V, dO,  # [B, H_q, S_q, D], [B, H_kv, S_k, D] x2, like Q
    Lse, Delta,  # [B, H_q, S_q] float32 (the forward's; attention_bwd_dq's)
    dK, dV,  # like K; with SPLITS > 1 float32 partials [SPLITS * B, H_kv, S_k, D]
    qk_scale: float,
    heads_kv: int,
    group: int,
    TILE_M: ConstInt,  # query rows per step
    TILE_N: ConstInt,  # keys per CTA
    TILE_D: ConstInt,
    CAUSAL: ConstBool,
    BOTTOM_RIGHT: ConstBool,
    Q_LATENCY: ConstInt,  # latency hint of the Q/dO loads (1..10; 0: the compiler's)
    SPLITS: ConstInt,  # CTAs sharing one key tile's walk over (query head, query tile) pairs
    TILE_MAJOR: ConstBool,  # grid (batch x K/V head x split, key tiles): key tile 0's CTAs first
):
    """dK and dV (or their partials) of plain attention."""
    _dkdv(Q, K, V, dO, Lse, Delta, dK, dV, qk_scale, heads_kv, group, -1, -1, 0.0, 0,
          TILE_M=TILE_M, TILE_N=TILE_N, TILE_D=TILE_D, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT,
          Q_LATENCY=Q_LATENCY, SPLITS=SPLITS, TILE_MAJOR=TILE_MAJOR, WINDOW=False,
          SOFTCAP=False, RAGGED=False, PACKED=False)


@ct.kernel
def attention_bwd_dkdv_variant(
    Q, K, V, dO,  # [B, H_q, S_q, D], [B, H_kv, S_k, D] x2, like Q
    Lse, Delta,  # [B, H_q, S_q] float32 (the forward's; attention_bwd_dq's)
    dK, dV,  # like K; with SPLITS > 1 float32 partials [SPLITS * B, H_kv, S_k, D]
    qk_scale: float,
    heads_kv: int,
    group: int,
    window_left: int,  # keys a row sees before its diagonal (-1: unbounded; read with WINDOW)
    window_right: int,  # keys a row sees past its diagonal (-1: unbounded; read with WINDOW)
    softcap: float,  # the cap c (read with SOFTCAP)
    Ranges,  # RAGGED: int32 [4, sequences] query starts, query ends, key starts, key ends;
    # else a zero-byte placeholder
    TILE_M: ConstInt,  # query rows per step
    TILE_N: ConstInt,  # keys per CTA
    TILE_D: ConstInt,
    CAUSAL: ConstBool,
    BOTTOM_RIGHT: ConstBool,
    Q_LATENCY: ConstInt,  # latency hint of the Q/dO loads (1..10; 0: the compiler's)
    SPLITS: ConstInt,  # CTAs sharing one key tile's walk over (query head, query tile) pairs
    TILE_MAJOR: ConstBool,  # grid (batch x K/V head x split, key tiles): key tile 0's CTAs first
    WINDOW: ConstBool,  # a sliding window bounds either side
    SOFTCAP: ConstBool,  # scores capped by softcap * tanh(s / softcap)
    RAGGED: ConstBool,  # sequences of their own lengths: the batch index picks Ranges' column
    PACKED: ConstBool,  # RAGGED: the sequences lie end to end in batch 0 (else one a batch entry)
):
    """dK and dV (or their partials) with a window, a softcap and / or a ragged batch (then
    never split)."""
    _dkdv(Q, K, V, dO, Lse, Delta, dK, dV, qk_scale, heads_kv, group, window_left, window_right,
          softcap, Ranges, TILE_M=TILE_M, TILE_N=TILE_N, TILE_D=TILE_D, CAUSAL=CAUSAL,
          BOTTOM_RIGHT=BOTTOM_RIGHT, Q_LATENCY=Q_LATENCY, SPLITS=SPLITS, TILE_MAJOR=TILE_MAJOR,
          WINDOW=WINDOW, SOFTCAP=SOFTCAP, RAGGED=RAGGED, PACKED=PACKED)


# -- the sum of the split walk's partials -------------------------------------------------------
@ct.kernel
def attention_bwd_sum(
    Parts,  # float32 [PARTS * B, H, S, D]
    Grad,  # [B, H, S, D]: the sum of the parts, in Grad's dtype
    PARTS: ConstInt,
    TILE: ConstInt,  # rows per CTA
    TILE_D: ConstInt,
):
    """Reduce float32 partial gradients in a fixed order (bitwise reproducible)."""
    tile = ct.bid(0)
    bh = ct.bid(1)
    heads = Grad.shape[1]
    batch = bh // heads
    head = bh % heads
    acc = ct.full((TILE, TILE_D), 0.0, dtype=np.float32)
    for part in range(PARTS):
        acc = acc + _load_rows(Parts, part * Grad.shape[0] + batch, head, tile, TILE, TILE_D, 0)
    ct.store(Grad, index=(batch, head, tile, 0),
             tile=acc.astype(Grad.dtype).reshape((1, 1, TILE, TILE_D)))
