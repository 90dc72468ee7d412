"""float32 reference and error measure shared by the GPU tests."""

from __future__ import annotations

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
