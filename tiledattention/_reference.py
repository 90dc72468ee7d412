"""The float32 reference every family's GPU case compares with: attention by definition, with
the mask of the problem's alignment, so rows that see no key (bottom-right alignment with
``S_q > S_k``) come out as zeros instead of torch's NaN."""

from __future__ import annotations

from typing import Any

__all__ = ["attention_reference"]


def attention_reference(q: Any, k: Any, v: Any, problem: Any, scale: float | None = None) -> Any:
    """``problem``'s attention of torch tensors ``q [B, H_q, S_q, D]``, ``k, v [B, H_kv, S_k,
    D]`` in float32 (GQA heads repeated). Top-left causal is torch's ``is_causal``; bottom-right
    builds its mask explicitly (row ``i`` keeps keys ``j <= i + causal_offset``) and sets rows
    that keep no key (``S_q > S_k``) to zeros, where torch's SDPA would give NaN. torch's SDPA
    never materialises the score matrix here, so long sequences fit."""
    import torch

    group = problem.heads_q // problem.heads_kv
    q32 = q.float()
    k32 = k.float().repeat_interleave(group, 1)
    v32 = v.float().repeat_interleave(group, 1)
    if not problem.bottom_right:  # no mask, or top-left: torch's is_causal, no mask tensor
        return torch.nn.functional.scaled_dot_product_attention(
            q32, k32, v32, is_causal=problem.causal, scale=scale)
    rows = torch.arange(problem.seqlen_q, device=q.device)[:, None]
    keys = torch.arange(problem.seqlen_k, device=q.device)[None, :]
    keep = keys <= rows + problem.causal_offset  # [S_q, S_k]
    sees_a_key = keep.any(dim=1)  # [S_q]
    keep[~sees_a_key, 0] = True  # any key: the row's result is replaced by zeros below
    out = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, attn_mask=keep,
                                                           scale=scale)
    return out.masked_fill(~sees_a_key[:, None], 0.0)
