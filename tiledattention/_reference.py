"""The float32 reference every family's GPU case compares with: attention by definition, with
an explicit mask, so rows that see no key (bottom-right alignment with ``S_q > S_k``) come out
as zeros instead of torch's NaN."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["attention_reference"]


def attention_reference(q: Any, k: Any, v: Any, problem: Any, scale: float | None = None) -> Any:
    """``softmax(q k^T * scale + mask) v`` in float32 for torch tensors ``[B, H, S, D]``
    (grouped-query ``k, v`` are expanded here). Query row ``i`` sees keys
    ``0..i + problem.causal_offset`` when ``problem.causal``; a row that sees none is zero.
    Processes one batch entry at a time to bound the score matrix's memory."""
    import torch

    scale = 1.0 / math.sqrt(problem.head_dim) if scale is None else scale
    group = problem.heads_q // problem.heads_kv
    rows = torch.arange(problem.seqlen_q, device=q.device)[:, None]
    keys = torch.arange(problem.seqlen_k, device=q.device)[None, :]
    keep = keys <= rows + problem.causal_offset if problem.causal else None
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        kb = k[b].float().repeat_interleave(group, 0)
        vb = v[b].float().repeat_interleave(group, 0)
        scores = torch.matmul(q[b].float(), kb.transpose(-1, -2)) * scale
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of -inf gives NaN
        out[b] = torch.matmul(probs, vb)
    return out
