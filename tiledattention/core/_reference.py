"""The float32 reference every family's GPU case compares with: attention by definition, with
the problem's mask (causal in either alignment, a sliding window), softcap and sinks applied
explicitly, so rows that see no key come out as zeros instead of torch's NaN."""

from __future__ import annotations

from typing import Any

from ..errors import InputValueError

__all__ = ["attention_reference", "varlen_reference", "visible_keys"]

#: Score elements one chunk of the explicit reference holds at most (float32: 1 GiB).
_CHUNK_ELEMENTS = 1 << 28


def visible_keys(problem: Any, device: Any, first_row: int = 0, rows: int | None = None) -> Any:
    """The boolean ``[rows, S_k]`` mask of the keys query rows ``first_row ..`` see: key ``j``
    of row ``i`` iff ``(not causal or j <= i + off)`` and ``j >= i + off - window_left`` and
    ``j <= i + off + window_right`` (an unbounded side, ``-1``, binds nothing), with ``off``
    the problem's alignment offset."""
    import torch

    rows = problem.seqlen_q - first_row if rows is None else rows
    off = problem.causal_offset
    i = torch.arange(first_row, first_row + rows, device=device)[:, None] + off
    j = torch.arange(problem.seqlen_k, device=device)[None, :]
    keep = torch.ones(rows, problem.seqlen_k, dtype=torch.bool, device=device)
    if problem.causal:
        keep &= j <= i
    if problem.window_left >= 0:
        keep &= j >= i - problem.window_left
    if problem.window_right >= 0:
        keep &= j <= i + problem.window_right
    return keep


def attention_reference(q: Any, k: Any, v: Any, problem: Any, scale: float | None = None,
                        sinks: Any = None) -> Any:
    """``problem``'s attention of torch tensors ``q [B, H_q, S_q, D]``, ``k, v [B, H_kv, S_k,
    D]`` in float32 (GQA heads repeated); ``sinks``: the ``[H_q]`` sink logits when
    ``problem.sinks``. Plain problems go through torch's SDPA (top-left causal as
    ``is_causal``; bottom-right with its mask built here), which never materialises the score
    matrix, so long sequences fit; variants (a window, a softcap, sinks) compute the scores
    explicitly in chunks of query rows. Differentiable (autograd through it gives reference
    gradients, the sinks' included)."""
    import torch

    group = problem.heads_q // problem.heads_kv
    q32 = q.float()
    k32 = k.float().repeat_interleave(group, 1)
    v32 = v.float().repeat_interleave(group, 1)
    if problem.variant:
        return _explicit(q32, k32, v32, problem, scale, sinks)
    if not problem.bottom_right:  # no mask, or top-left: torch's is_causal, no mask tensor
        return torch.nn.functional.scaled_dot_product_attention(
            q32, k32, v32, is_causal=problem.causal, scale=scale)
    keep = visible_keys(problem, q.device)  # [S_q, S_k]
    sees_a_key = keep.any(dim=1)  # [S_q]
    keep[~sees_a_key, 0] = True  # any key: the row's result is replaced by zeros below
    out = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, attn_mask=keep,
                                                           scale=scale)
    return out.masked_fill(~sees_a_key[:, None], 0.0)


def _explicit(q32: Any, k32: Any, v32: Any, problem: Any, scale: float | None,
              sinks: Any) -> Any:
    import torch

    if problem.sinks and sinks is None:
        raise InputValueError("sinks must be the [H_q] sink logits for a problem with sinks; "
                              "got None")
    scale = problem.head_dim ** -0.5 if scale is None else scale
    b, h, sq, _ = q32.shape
    step = max(1, _CHUNK_ELEMENTS // max(1, b * h * problem.seqlen_k))
    outs = []
    for first in range(0, sq, step):
        rows = min(step, sq - first)
        s = q32[:, :, first:first + rows] @ k32.transpose(-1, -2) * scale  # [B, H, rows, S_k]
        if problem.softcap > 0:
            s = problem.softcap * torch.tanh(s / problem.softcap)
        s = s.masked_fill(~visible_keys(problem, q32.device, first, rows), float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        if problem.sinks:
            sink = sinks.float().view(1, h, 1, 1).expand(b, h, rows, 1)
            m = torch.maximum(m, sink)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
        p = torch.exp(s - m)  # masked keys: exactly 0
        denom = p.sum(dim=-1, keepdim=True)
        if problem.sinks:
            denom = denom + torch.exp(sink - m)
        out = (p @ v32) / torch.where(denom > 0, denom, torch.ones_like(denom))
        outs.append(out)  # a row with no key and no sink: p = 0, so out = 0
    return torch.cat(outs, dim=2)


def varlen_reference(query: Any, key: Any, value: Any, cu_seq_q: Any, cu_seq_k: Any, *,
                     causal: bool = False, bottom_right: bool = True,
                     scale: float | None = None, window: tuple[int, int] = (-1, -1)) -> Any:
    """Packed variable-length attention (``tiledattention.varlen_attn``'s semantics) in float32,
    sequence by sequence through :func:`attention_reference`: ``query [T_q, H_q, D]``, ``key,
    value [T_k, H_kv, D]``, offsets ``cu_seq_q, cu_seq_k [N + 1]`` (read on the host). The
    causal mask and the window align per sequence (bottom-right with ``bottom_right``); rows
    outside every sequence, and rows that see no key, are zeros. Differentiable."""
    import torch

    from ._problem import Problem

    starts_q, starts_k = cu_seq_q.tolist(), cu_seq_k.tolist()
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    pieces = []
    for i in range(len(starts_q) - 1):
        (q0, q1), (k0, k1) = starts_q[i:i + 2], starts_k[i:i + 2]
        if q1 <= q0:
            continue
        rows = (q0, q1)
        if k1 <= k0:  # no keys: the rows stay zeros
            continue
        problem = Problem(batch=1, heads_q=query.shape[1], heads_kv=key.shape[1],
                          seqlen_q=q1 - q0, seqlen_k=k1 - k0, head_dim=query.shape[2],
                          dtype="bf16", causal=causal,
                          bottom_right=bottom_right and (causal or window != (-1, -1)),
                          window_left=window[0], window_right=window[1])

        def packed(x, a, b):
            return x[a:b].transpose(0, 1).unsqueeze(0)  # [1, H, S, D]
        seq = attention_reference(packed(query, q0, q1), packed(key, k0, k1),
                                  packed(value, k0, k1), problem, scale=scale)
        pieces.append((rows, seq[0].transpose(0, 1)))
    if not pieces:
        return out
    # rows outside every sequence stay zero; assembled without in-place writes (autograd)
    index = torch.cat([torch.arange(a, b, device=query.device) for (a, b), _ in pieces])
    values = torch.cat([p for _, p in pieces])
    return out.index_add(0, index, values)
