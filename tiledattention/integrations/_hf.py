"""Hugging Face transformers attention backend: ``attn_implementation="tiledattention"``.

Registered with ``transformers.AttentionInterface`` (the attention function) and
``AttentionMaskInterface`` (transformers' SDPA mask builder, which returns ``None`` exactly when
the mask is the plain causal pattern or no mask at all, so ``is_causal`` expresses it). Calls the
kernel runs — no mask, no dropout, bf16/fp16 CUDA, supported head dim — go to
:func:`~tiledattention.integrations.attention` (``tiledattention::sdpa_fwd``, or in training,
where the inputs require grad, ``tiledattention::sdpa_fwd_lse`` and the backward kernels);
everything else (padding masks, sliding windows, attention dropout, ...) goes to transformers'
own ``sdpa_attention_forward``. transformers is imported only here, and
only when :func:`register_hf` is called.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputValueError
from ._router import RouterStats, _Counts, route_decision
from ._torch_op import attention, autocast_inputs

__all__ = ["ATTN_IMPLEMENTATION", "hf_stats", "register_hf", "reset_hf_stats",
           "tiledattention_attention_forward"]

#: The name to pass as ``attn_implementation``.
ATTN_IMPLEMENTATION = "tiledattention"

# Keyword arguments transformers' SDPA path implements (a bias added to the scores, a paged
# cache it updates): any of them set sends the call there.
_SDPA_KWARGS = ("position_bias", "cache")
# Keyword arguments that change the softmax itself: neither the kernel nor SDPA implements them.
_UNSUPPORTED_KWARGS = ("softcap", "s_aux", "sinks")

_counts = _Counts()


def hf_stats() -> RouterStats:
    """How many transformers attention calls ran tiledattention vs transformers' SDPA, and why."""
    return _counts.snapshot()


def reset_hf_stats() -> None:
    _counts.reset()


def _fallback(reason: str, module: Any, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, attention_mask: Any, dropout: float, scaling: Any,
              is_causal: Any, kwargs: dict) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not torch.compiler.is_compiling():
        _counts.fallbacks[reason] += 1
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)


def tiledattention_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: ``query [B, H_q, S_q, D]``, ``key, value
    [B, H_kv, S_k, D]`` in; ``(attn_output [B, S_q, H_q, D] contiguous, None)`` out."""
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise InputValueError(
                f"attn_implementation='tiledattention' does not support `{name}` (got a value for "
                f"it); load the model with attn_implementation='eager' or a backend that does"
            )
    # A sliding window needs nothing here: the mask builder returns None only when no key is
    # outside the window, and materialises the mask (sent to SDPA below) otherwise.
    for name in _SDPA_KWARGS:
        if kwargs.get(name) is not None:
            return _fallback(name, module, query, key, value, attention_mask, dropout, scaling,
                             is_causal, kwargs)
    # Any mask goes to SDPA, a torch CausalBias too (route_decision would take one; the code
    # below assumes no mask). The mask is the first check either way. Judged in the dtype
    # torch's SDPA would compute in (autocast's, when it is on: mixed-precision training);
    # a fallback gets the tensors as they came.
    q, k, v = autocast_inputs(query, key, value)
    reason = "attn_mask" if attention_mask is not None else route_decision(
        q, k, v, None, dropout, True, scale=scaling)
    if reason is not None:
        return _fallback(reason, module, query, key, value, attention_mask, dropout, scaling,
                         is_causal, kwargs)
    query, key, value = q, k, v

    # attention_mask is None here: the mask builder found a plain causal (or no) pattern. As in
    # transformers' SDPA path, a single query token attends to every cached key (lower-right
    # alignment == no mask), and a longer query with as many or more keys is causal top-left.
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = bool(causal) and q_len > 1
    if causal and kv_len > q_len:
        # Only an empty static cache's prefill gets here (the mask builder materialises a mask
        # otherwise); keys past q_len are unfilled slots that top-left causal masks anyway.
        key = key[:, :, :q_len]
        value = value[:, :, :q_len]
    if not torch.compiler.is_compiling():
        _counts.tiledattention += 1
    out = attention(query, key, value, causal, scaling)
    return out.transpose(1, 2).contiguous(), None


def register_hf() -> None:
    """Register ``attn_implementation="tiledattention"`` with transformers. Idempotent.

    Afterwards ``AutoModelForCausalLM.from_pretrained(..., attn_implementation="tiledattention")``
    (or ``from_config``) uses :func:`tiledattention_attention_forward` in every attention layer.
    """
    try:
        from transformers import AttentionInterface
    except ImportError as exc:
        raise ImportError(
            "tiledattention.integrations.register_hf needs transformers>=4.48; install it with "
            "`pip install 'tiledattention[hf]'`"
        ) from exc
    AttentionInterface.register(ATTN_IMPLEMENTATION, tiledattention_attention_forward)
    try:
        from transformers import AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError:  # transformers < 4.53: masks are built by the model from the name "sdpa"
        return
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
