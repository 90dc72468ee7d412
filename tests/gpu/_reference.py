"""float32 reference and error measure shared by the GPU tests."""

from __future__ import annotations

import math

import torch

from tiledattention import FORWARD
from tiledattention.core._dtypes import torch_dtype

#: the forward family's declared bounds (``Family.tolerances``), keyed by torch dtype
TOLERANCE = {torch_dtype(name): bound for name, bound in FORWARD.tolerances.items()}


def reference(q, k, v, causal, scale=None):
    group = q.shape[1] // k.shape[1]
    k32 = k.float().repeat_interleave(group, dim=1)
    v32 = v.float().repeat_interleave(group, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(
        q.float(), k32, v32, is_causal=causal, scale=scale)


def rel_l2(out, ref) -> float:
    out = out.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def random_qkv(b, hq, hkv, sq, sk, d, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda h, s: torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen)
    return make(hq, sq), make(hkv, sk), make(hkv, sk)


def attend(q, k, v, *, causal, bottom_right, window, softcap, sinks, scale):
    """float32 attention of one entry: ``q [H_q, S_q, D]``, ``k, v [H_kv, S_k, D]``; query row
    ``i`` sits at key position ``i + off`` (``off = S_k - S_q`` bottom-right, else 0); a row
    that sees no key gives zeros; ``sinks [H_q]`` join each row's denominator."""
    group = q.shape[0] // k.shape[0]
    k = k.float().repeat_interleave(group, 0)
    v = v.float().repeat_interleave(group, 0)
    s = torch.matmul(q.float(), k.transpose(1, 2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[1], k.shape[1]
    rows = torch.arange(sq, device=q.device)[:, None] + (sk - sq if bottom_right else 0)
    keys = torch.arange(sk, device=q.device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        keep &= keys <= rows
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= keys >= rows - left
        if right >= 0:
            keep &= keys <= rows + right
    s = s.masked_fill(~keep, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.float()[:, None, None].expand(-1, sq, 1)], dim=2)
    m = s.amax(dim=2, keepdim=True).clamp_min(-1e30)  # a row of -inf alone stays finite
    p = torch.exp(s - m)
    total = p.sum(dim=2, keepdim=True)
    p = p / torch.where(total > 0, total, 1.0)  # a row of no key and no sink: zeros, no NaN
    out = torch.matmul(p[..., :sk], v)
    return torch.where(keep.any(dim=1)[None, :, None], out, 0.0)
