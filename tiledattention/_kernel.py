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
):
    # Bounds-checked loads zero-fill what lies past the edge; unchecked ones never cross it.
    PAD = ct.static_eval(ct.PaddingMode.ZERO if CHECK_BOUNDS else ct.PaddingMode.UNDETERMINED)
    num_q_tiles = ct.num_blocks(0)
    q_tile = ct.bid(0)
    if LONGEST_FIRST:
        q_tile = num_q_tiles - 1 - q_tile
    bh = ct.bid(1)
    batch = bh // heads_q
    head = bh % heads_q
    kv_head = head // group

    scale = qk_scale
    if EXP2:
        scale = qk_scale * LOG2_E

    rows = q_tile * TILE_M + ct.arange(TILE_M, dtype=np.int32)[:, None]  # [TILE_M, 1]
    cols = ct.arange(TILE_N, dtype=np.int32)[None, :]  # [1, TILE_N]

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

    backwards = False
    if KV_SAWTOOTH:
        backwards = (q_tile % 2) == 1

    for step in range(num_kv_tiles):
        j = step
        if KV_SAWTOOTH:
            if backwards:
                j = num_kv_tiles - 1 - step

        if K_TRANSPOSED:
            k = ct.load(K, index=(batch, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                        order=(0, 1, 3, 2), padding_mode=PAD,
                        check_bounds=CHECK_BOUNDS, latency=ct.static_eval(K_LATENCY or None), allow_tma=ALLOW_TMA)
            k = k.reshape((TILE_D, TILE_N))  # [TILE_D, TILE_N]
        else:
            k = ct.load(K, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                        padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                        latency=ct.static_eval(K_LATENCY or None), allow_tma=ALLOW_TMA)
            k = ct.transpose(k.reshape((TILE_N, TILE_D)))  # [TILE_D, TILE_N]

        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32)
        qk = ct.mma(q, k, qk)  # [TILE_M, TILE_N]

        if (CAUSAL or not EVEN_K) and j >= mask_from:
            keys = j * TILE_N + cols  # [1, TILE_N]
            keep = keys < seqlen_k  # [1, TILE_N]
            if CAUSAL:
                keep = keep & (keys <= rows)  # [TILE_M, TILE_N]
            qk = ct.where(keep, qk, -np.inf)

        m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * scale)  # [TILE_M, 1]
        shifted = qk * scale - m_ij  # [TILE_M, TILE_N]
        if EXP2:
            p = ct.exp2(shifted, flush_to_zero=True)
            alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)  # [TILE_M, 1]
        else:
            p = ct.exp(shifted)
            alpha = ct.exp(m_i - m_ij)
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
        acc = acc * alpha

        v = ct.load(V, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=PAD, check_bounds=CHECK_BOUNDS,
                    latency=ct.static_eval(V_LATENCY or None), allow_tma=ALLOW_TMA).reshape((TILE_N, TILE_D))
        acc = ct.mma(p.astype(Q.dtype), v, acc)  # [TILE_M, TILE_D]
        m_i = m_ij

    if APPROX_DIV:
        acc = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    else:
        acc = acc / l_i
    out = acc.astype(Out.dtype).reshape((1, 1, TILE_M, TILE_D))
    ct.store(Out, index=(batch, head, q_tile, 0), tile=out)
