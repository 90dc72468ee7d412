"""The FlashAttention-style forward kernel template (cuTile).

One CTA computes a ``[TILE_M, D]`` block of the output for one (batch, query head): it streams K
and V in ``TILE_N``-key steps through an online softmax, so the ``S_q x S_k`` score matrix never
exists in memory. Every UPPER_CASE parameter is a compile-time constant taken from a
:class:`~tiledattention.Schedule` (see ``_launch.kernel_args``); the kernel options (occupancy,
num_ctas, opt_level) are applied with ``kernel.replace_hints``.

Masking follows ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``: top-left
aligned, query row ``i`` attends keys ``0..i``. Keys at or past ``S_k`` never enter the softmax.
"""

from __future__ import annotations

import math

import cuda.tile as ct
import numpy as np

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

LOG2_E = 1.0 / math.log(2.0)
#: Finite "minus infinity" for the running max: a row whose first visited key tile is fully
#: masked (possible with the sawtooth order) must not compute (-inf) - (-inf).
NEG_BIG = -1.0e30


def _online_softmax(qk, m_i, l_i, acc, scale, EXP2):
    """Fold one ``[rows, TILE_N]`` score tile into the running (max, denominator, accumulator);
    return the probabilities to multiply with V and the new state."""
    m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * scale)  # [rows, 1]
    shifted = qk * scale - m_ij  # [rows, TILE_N]
    if EXP2:
        p = ct.exp2(shifted, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)  # [rows, 1]
    else:
        p = ct.exp(shifted)
        alpha = ct.exp(m_i - m_ij)
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
    return p, m_ij, l_i, acc * alpha


def _load_k(K, batch, kv_head, j, TILE_N, TILE_D, K_TRANSPOSED, K_LATENCY, ALLOW_TMA,
            CHECK_BOUNDS, PAD):
    """Key tile ``j`` as ``[TILE_D, TILE_N]`` (loaded transposed, or loaded and permuted)."""
    if K_TRANSPOSED:
        k = ct.load(K, index=(batch, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                    order=(0, 1, 3, 2), padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                    latency=ct.static_eval(K_LATENCY or None), allow_tma=ALLOW_TMA)
        return k.reshape((TILE_D, TILE_N))
    k = ct.load(K, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                latency=ct.static_eval(K_LATENCY or None), allow_tma=ALLOW_TMA)
    return ct.transpose(k.reshape((TILE_N, TILE_D)))


def _scores(q, K, batch, kv_head, j, rows, seqlen_k, masked, CAUSAL, TILE_M, TILE_N, TILE_D,
            K_TRANSPOSED, K_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD):
    """``Q·K_j^T`` as a ``[TILE_M, TILE_N]`` float32 tile; ``masked`` (a constant, or a per-step
    flag) sets the causal / sequence-end entries to -inf."""
    k = _load_k(K, batch, kv_head, j, TILE_N, TILE_D, K_TRANSPOSED, K_LATENCY, ALLOW_TMA,
                CHECK_BOUNDS, PAD)
    qk = ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32)
    qk = ct.mma(q, k, qk)
    if masked:
        keys = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[None, :]  # [1, TILE_N]
        keep = keys < seqlen_k  # [1, TILE_N]
        if CAUSAL:
            keep = keep & (keys <= rows)  # [TILE_M, TILE_N]
        qk = ct.where(keep, qk, -np.inf)
    return qk


def _fold(qk, V, batch, kv_head, j, m_i, l_i, acc, scale, dtype, TILE_N, TILE_D, EXP2,
          V_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD):
    """The online softmax of score tile ``qk`` (keys of tile ``j``), then ``acc += P·V_j``."""
    p, m_i, l_i, acc = _online_softmax(qk, m_i, l_i, acc, scale, EXP2)
    v = ct.load(V, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                latency=ct.static_eval(V_LATENCY or None),
                allow_tma=ALLOW_TMA).reshape((TILE_N, TILE_D))
    acc = ct.mma(p.astype(dtype), v, acc)  # [TILE_M, TILE_D]
    return m_i, l_i, acc


def _kv_tile(step, count, backwards, KV_SAWTOOTH):
    """The key tile visited at ``step`` of ``count``: forwards, or backwards on odd query tiles
    of the sawtooth order."""
    j = step
    if KV_SAWTOOTH:
        if backwards:
            j = count - 1 - step
    return j


def _step_masked(j, mask_from, STEP_MASK):
    """Whether key tile ``j`` of a loop that tests each step needs the mask."""
    masked = False
    if STEP_MASK:
        masked = j >= mask_from
    return masked


def _attend_q_tile(Q, K, V, Out, q_tile, bh, qk_scale, heads_q, group, TILE_M, TILE_N, TILE_D,
                   CAUSAL, EVEN_K, EXP2, APPROX_DIV, K_TRANSPOSED, K_LATENCY, V_LATENCY, ALLOW_TMA,
                   KV_SAWTOOTH, CHECK_BOUNDS, SPLIT_MASKED, QK_AHEAD):
    """The ``[TILE_M, D]`` output block of query tile ``q_tile`` of (batch x head) ``bh``."""
    # Bounds-checked loads zero-fill what lies past the edge; unchecked ones never cross it.
    PAD = ct.static_eval(ct.PaddingMode.ZERO if CHECK_BOUNDS else ct.PaddingMode.UNDETERMINED)
    batch = bh // heads_q
    head = bh % heads_q
    kv_head = head // group

    scale = qk_scale
    if EXP2:
        scale = qk_scale * LOG2_E

    rows = q_tile * TILE_M + ct.arange(TILE_M, dtype=np.int32)[:, None]  # [TILE_M, 1]

    m_i = ct.full((TILE_M, 1), NEG_BIG, dtype=np.float32)  # running max (scaled)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=np.float32)  # running denominator
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32)  # [TILE_M, TILE_D]

    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                allow_tma=ALLOW_TMA).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]

    seqlen_k = K.shape[2]
    if CAUSAL:
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

    # Key tiles [0, unmasked) need no mask. With SPLIT_MASKED the first loop walks only those and
    # a second loop the masked rest, so neither branches per step; otherwise one loop tests j.
    unmasked = num_kv_tiles
    if ct.static_eval(ANY_MASK and SPLIT_MASKED):
        unmasked = min(mask_from, num_kv_tiles)
    STEP_MASK = ct.static_eval(ANY_MASK and not SPLIT_MASKED)  # the main loop tests each j
    if QK_AHEAD:
        # Software-pipelined main loop: the scores of step s+1 are issued before the softmax and
        # P·V of step s, so the tensor cores have work while the softmax runs (FA3's overlap).
        qk = ct.full((TILE_M, TILE_N), -np.inf, dtype=np.float32)
        j_prev = 0
        if unmasked > 0:
            j_prev = _kv_tile(0, unmasked, backwards, KV_SAWTOOTH)
            qk = _scores(q, K, batch, kv_head, j_prev, rows, seqlen_k,
                         _step_masked(j_prev, mask_from, STEP_MASK), CAUSAL, TILE_M, TILE_N, TILE_D,
                         K_TRANSPOSED, K_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD)
        for step in range(1, unmasked):
            j = _kv_tile(step, unmasked, backwards, KV_SAWTOOTH)
            qk_next = _scores(q, K, batch, kv_head, j, rows, seqlen_k,
                              _step_masked(j, mask_from, STEP_MASK), CAUSAL, TILE_M, TILE_N, TILE_D,
                              K_TRANSPOSED, K_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD)
            m_i, l_i, acc = _fold(qk, V, batch, kv_head, j_prev, m_i, l_i, acc, scale, q.dtype,
                                  TILE_N, TILE_D, EXP2, V_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD)
            qk = qk_next
            j_prev = j
        if unmasked > 0:
            m_i, l_i, acc = _fold(qk, V, batch, kv_head, j_prev, m_i, l_i, acc, scale, q.dtype,
                                  TILE_N, TILE_D, EXP2, V_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD)
    else:
        for step in range(unmasked):
            j = _kv_tile(step, unmasked, backwards, KV_SAWTOOTH)
            qk = _scores(q, K, batch, kv_head, j, rows, seqlen_k,
                         _step_masked(j, mask_from, STEP_MASK), CAUSAL, TILE_M, TILE_N,
                         TILE_D, K_TRANSPOSED, K_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD)
            m_i, l_i, acc = _fold(qk, V, batch, kv_head, j, m_i, l_i, acc, scale, q.dtype,
                                  TILE_N, TILE_D, EXP2, V_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD)
    if ct.static_eval(ANY_MASK and SPLIT_MASKED):
        for j in range(unmasked, num_kv_tiles):
            qk = _scores(q, K, batch, kv_head, j, rows, seqlen_k, True, CAUSAL, TILE_M, TILE_N,
                         TILE_D, K_TRANSPOSED, K_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD)
            m_i, l_i, acc = _fold(qk, V, batch, kv_head, j, m_i, l_i, acc, scale, q.dtype,
                                  TILE_N, TILE_D, EXP2, V_LATENCY, ALLOW_TMA, CHECK_BOUNDS, PAD)

    # Normalise with one reciprocal per row and a multiply per element: TILE_M x TILE_D exact
    # divisions cost 7-8% at D=256, S <= 2k (H100).
    ones = ct.full((TILE_M, 1), 1.0, dtype=np.float32)
    if APPROX_DIV:
        inv_l = ct.truediv(ones, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    else:
        inv_l = ones / l_i
    acc = acc * inv_l
    out = acc.astype(Out.dtype).reshape((1, 1, TILE_M, TILE_D))
    ct.store(Out, index=(batch, head, q_tile, 0), tile=out)


@ct.kernel
def attention_fwd(
    Q, K, V, Out,  # [B, H_q, S_q, D], [B, H_kv, S_k, D], [B, H_kv, S_k, D], [B, H_q, S_q, D]
    qk_scale: float,
    heads_q: int,
    group: int,  # query heads per K/V head
    TILE_M: ConstInt,
    TILE_N: ConstInt,
    TILE_D: ConstInt,  # head_dim rounded up to a power of two; loads zero-fill the rest
    CAUSAL: ConstBool,
    EVEN_K: ConstBool,  # S_k % TILE_N == 0
    EXP2: ConstBool,
    APPROX_DIV: ConstBool,
    K_TRANSPOSED: ConstBool,
    K_LATENCY: ConstInt,  # 1..10, or 0: let the compiler infer it
    V_LATENCY: ConstInt,
    ALLOW_TMA: ConstBool,
    KV_SAWTOOTH: ConstBool,
    LONGEST_FIRST: ConstBool,
    CHECK_BOUNDS: ConstBool,
    SPLIT_MASKED: ConstBool,  # masked key tiles in a loop of their own, after the unmasked ones
    PERSISTENT: ConstBool,  # grid (CTAs,): each CTA walks work items; else (query tiles, B * H_q)
    QK_AHEAD: ConstBool,  # issue the next step's Q·K^T before this step's softmax
):
    if PERSISTENT:
        # Work item i is query tile i % q_tiles of (batch x head) i // q_tiles: the CTAs in flight
        # at any moment work on neighbouring tiles of the same heads and share their K/V in L2.
        num_q_tiles = ct.cdiv(Q.shape[2], TILE_M)
        for item in range(ct.bid(0), num_q_tiles * Q.shape[0] * heads_q, ct.num_blocks(0)):
            q_tile = item % num_q_tiles
            if LONGEST_FIRST:
                q_tile = num_q_tiles - 1 - q_tile
            _attend_q_tile(Q, K, V, Out, q_tile, item // num_q_tiles, qk_scale, heads_q, group,
                           TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, EXP2, APPROX_DIV, K_TRANSPOSED,
                           K_LATENCY, V_LATENCY, ALLOW_TMA, KV_SAWTOOTH, CHECK_BOUNDS,
                           SPLIT_MASKED, QK_AHEAD)
    else:
        num_q_tiles = ct.num_blocks(0)
        q_tile = ct.bid(0)
        if LONGEST_FIRST:
            q_tile = num_q_tiles - 1 - q_tile
        _attend_q_tile(Q, K, V, Out, q_tile, ct.bid(1), qk_scale, heads_q, group, TILE_M, TILE_N,
                       TILE_D, CAUSAL, EVEN_K, EXP2, APPROX_DIV, K_TRANSPOSED, K_LATENCY, V_LATENCY,
                       ALLOW_TMA, KV_SAWTOOTH, CHECK_BOUNDS, SPLIT_MASKED, QK_AHEAD)
