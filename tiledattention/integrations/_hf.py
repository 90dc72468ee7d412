"""Hugging Face transformers attention backend: ``attn_implementation="tiledattention"``.

Registered with ``transformers.AttentionInterface`` (the attention function) and
``AttentionMaskInterface`` (:func:`tiledattention_mask`: transformers' SDPA mask builder, which
returns ``None`` exactly when the mask is the plain causal pattern or no mask at all, so
``is_causal`` expresses it; for sliding-window layers it also returns ``None`` when the window
is the only thing the mask would add, the keys end at the last query and nothing is padded).
A padded batch's mask (left or right padding of a causal model, with or without the window)
is run as per-entry ranges (``sdpa(..., ranges=)``): the mask builder checks, once per mask it
builds, that the mask is exactly that (one comparison on the device and one host read), and
the attention function finds the ranges by the mask object it is given (no autograd: a padded
training step still goes to SDPA). A static cache's masks count too (its buffer runs past the
queries: its unfilled slots are padding). Compiled or captured into a CUDA graph, where the host
may read nothing, a decode step's mask (one query a row) gives its ranges on the device inside
the graph (``tiledattention::sdpa_ranges_fwd``), an entry whose keys are not one run coming out
NaN (:func:`_decode_ranges`). Packed sequences (transformers' padding-free path, which
passes ``cu_seq_lens_q/k`` and ``max_length_q/k``) run on ``varlen_attn``, differentiable.
Calls the kernel runs — no mask or a padded batch's, no dropout, bf16/fp16 CUDA, supported
head dim — go to
:func:`~tiledattention.integrations.attention` (``tiledattention::sdpa_fwd``, or in training,
where the inputs require grad, ``tiledattention::sdpa_fwd_lse`` and the backward kernels), with
the layer's sliding window (``sliding_window``: Mistral, Gemma 2/3, GPT-OSS), logit softcap
(``softcap``: Gemma 2) and attention sinks (``s_aux``: GPT-OSS). Everything else (other masks,
attention dropout, ...) goes to transformers' own ``sdpa_attention_forward``, or, for a call
with a softcap or sinks, which SDPA cannot compute, to the model's own
``eager_attention_forward``; a fallback of a sliding-window call whose mask was left out gets
it materialised. transformers is imported only here, and only when :func:`register_hf` is
called.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ._router import RouterStats, _Counts, route_decision
from ._torch_op import attention, autocast_inputs, ranged_attention

__all__ = ["ATTN_IMPLEMENTATION", "hf_stats", "register_hf", "reset_hf_stats",
           "tiledattention_attention_forward", "tiledattention_mask"]

#: The name to pass as ``attn_implementation``.
ATTN_IMPLEMENTATION = "tiledattention"

# Keyword arguments transformers' SDPA path implements (a bias added to the scores, a paged
# cache it updates): any of them set sends the call there.
_SDPA_KWARGS = ("position_bias", "cache")
# The layer's variant keywords (models pass them to every attention function): the kernel runs
# them; transformers' SDPA path would drop them, so they are taken out of its keywords.
_VARIANT_KWARGS = ("sliding_window", "softcap", "s_aux", "sinks")

_counts = _Counts()


def hf_stats() -> RouterStats:
    """How many transformers attention calls ran tiledattention vs transformers' SDPA, and why."""
    return _counts.snapshot()


def reset_hf_stats() -> None:
    _counts.reset()


def _fallback(reason: str, module: Any, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, attention_mask: Any, dropout: float, scaling: Any,
              is_causal: Any, kwargs: dict) -> tuple[torch.Tensor, None]:
    """The call through transformers: its SDPA path, or for a softcap or sinks the model's own
    eager attention (SDPA has neither). A sliding-window layer whose mask
    :func:`tiledattention_mask` left out gets it materialised first."""
    if not torch.compiler.is_compiling():
        _counts.fallbacks[reason] += 1
    window = kwargs.get("sliding_window")
    special = kwargs.get("softcap") is not None or _sinks_of(kwargs) is not None
    if window is not None and attention_mask is None:
        attention_mask = _window_mask(query, key, window)
    if special:
        import sys

        eager = sys.modules[type(module).__module__].eager_attention_forward
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            # eager attention adds its mask to the scores
            attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype,
                                         device=query.device).masked_fill(
                ~attention_mask, torch.finfo(query.dtype).min)
        return eager(module, query, key, value, attention_mask, dropout=dropout,
                     scaling=scaling, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rest = {name: value for name, value in kwargs.items() if name not in _VARIANT_KWARGS}
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **rest)


def _variant_of(kwargs: dict) -> dict[str, Any]:
    """The kernel's variant keywords for a layer's: its sliding window of ``W`` keys as the
    causal window ``(W - 1, 0)``, its ``softcap``, its sinks (``s_aux``); those it has."""
    variant: dict[str, Any] = {}
    window = kwargs.get("sliding_window")
    if window is not None:
        variant["window"] = (int(window) - 1, 0)
    if kwargs.get("softcap") is not None:
        variant["softcap"] = float(kwargs["softcap"])
    sinks = _sinks_of(kwargs)
    if sinks is not None:
        variant["sinks"] = sinks
    return variant


def _sinks_of(kwargs: dict) -> Any:
    sinks = kwargs.get("s_aux")
    return kwargs.get("sinks") if sinks is None else sinks


def _window_mask(query: torch.Tensor, key: torch.Tensor, window: int) -> torch.Tensor:
    """The boolean ``[1, 1, S_q, S_k]`` mask of a causal sliding window of ``window`` keys
    (transformers': key ``j`` of query ``i`` iff ``i - window < j <= i``), the queries being
    the last ``S_q`` positions of the keys (what :func:`tiledattention_mask` checked)."""
    q_len, kv_len = query.shape[2], key.shape[2]
    i = torch.arange(kv_len - q_len, kv_len, device=query.device)[:, None]
    j = torch.arange(kv_len, device=query.device)[None, :]
    return ((j <= i) & (j > i - window))[None, None]


def tiledattention_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0,
                        kv_offset: Any = 0, attention_mask: Any = None,
                        local_size: int | None = None, allow_is_causal_skip: bool = True,
                        **kwargs: Any) -> Any:
    """transformers' ``sdpa_mask``, except that for a sliding-window layer (``local_size``) it
    returns ``None`` when the window is all the mask would hold: skipping allowed (no extra
    mask functions, no packed sequences, not exporting), the queries the last ``q_length``
    positions of the keys (``q_offset + q_length == kv_offset + kv_length``: a dynamic or
    sliding cache), and no key padded. The attention function then runs the window in the
    kernel (``sliding_window``) with bottom-right alignment. Where the host may read, a mask it
    builds is entered with its ranges when they express it exactly: a one-query-a-row mask
    whose entries' keys are each one run (:func:`_decode_ranges`, one host read; a sliding
    layer's window included), else a padded batch's causal mask ending at the queries' end
    (:func:`_remember_ranges`)."""
    from transformers.masking_utils import sdpa_mask

    if (local_size is not None and allow_is_causal_skip
            and isinstance(q_offset, int) and isinstance(kv_offset, int)
            and q_offset + q_length == kv_offset + kv_length
            and not torch.compiler.is_exporting()
            and _unpadded(attention_mask, kv_length, kv_offset)):
        return None
    mask = sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)
    if (isinstance(mask, torch.Tensor) and isinstance(kv_offset, int)
            and not torch.compiler.is_exporting() and _host_may_read()):
        if _is_key_mask(mask):
            # one query a row (a static cache's decode step, a sliding layer's too: the mask
            # holds its window): its keys are the ranges if they are one run, which one host
            # read tells
            ranges, exact = _decode_ranges(mask)
            if bool(exact.all()):
                _keep_ranges(mask, ranges)
            return mask
        # the queries' end among the keys: a static cache's buffer runs past it (its layer
        # gives q_offset as a tensor: read here, once per mask built)
        end = int(q_offset) + q_length - kv_offset
        if q_length <= end <= kv_length:
            _remember_ranges(mask, attention_mask, q_length, kv_length, kv_offset, local_size,
                             end)
    return mask


def _host_may_read() -> bool:
    """Whether the host may read device values here: not while torch.compile traces (the
    graph replays without the host) nor while the stream is captured into a CUDA graph."""
    return not (torch.compiler.is_compiling() or (
        torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()))


#: Masks of padded batches the kernel can run as ranges: ``id(mask) -> (weak reference to the
#: mask, its int32 [4, B] ranges)``, entered by :func:`tiledattention_mask` and read by the
#: attention function, which gets the very mask object transformers built. Dead entries are
#: dropped as new ones come.
_RANGES: dict[int, tuple[Any, torch.Tensor]] = {}


def _padding_ranges(valid: torch.Tensor, q_length: int, end: int) -> torch.Tensor:
    """From a boolean ``[B, kv_length]`` padding mask, false from key ``end`` on: each entry's
    key range ``[ks, ke)`` (its first and one past its last valid key; empty for an entry with
    none) and query range (the queries are the ``q_length`` keys before ``end``: rows whose own
    position is in ``[ks, ke)``), as an int32 ``[4, B]`` tensor; on the mask's device, without
    a host round trip."""
    ks, ke = _key_spans(valid)
    shift = end - q_length  # query row i is key position i + shift
    qs = (ks - shift).clamp(0, q_length)
    qe = (ke - shift).clamp(0, q_length)
    return torch.stack((qs, torch.maximum(qe, qs), ks, ke)).to(torch.int32).contiguous()


def _key_spans(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of a boolean ``[B, kv_length]`` mask's first valid key and one past its last
    (``0, 0`` for a row with none), on the mask's device."""
    index = torch.arange(valid.shape[1], device=valid.device)
    ke = torch.where(valid, index + 1, 0).amax(dim=1)
    ks = torch.minimum(torch.where(valid, index, valid.shape[1]).amin(dim=1), ke)
    return ks, ke


def _ranges_mask(ranges: torch.Tensor, q_length: int, kv_length: int, local_size: int | None,
                 end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[B, 1, S_q, S_k]`` mask the kernel computes from ``ranges`` (bottom-right causal
    within each entry's ranges, and the window of ``local_size`` keys; the queries the keys
    before ``end``), and which query rows lie inside their entry's range (``[B, 1, S_q, 1]``:
    the others come out as zeros, whatever transformers' mask says for them)."""
    qs, qe, ks, ke = (r[:, None, None, None].long() for r in ranges)
    shift = end - q_length
    i = torch.arange(q_length, device=ranges.device)[None, None, :, None]
    j = torch.arange(kv_length, device=ranges.device)[None, None, None, :]
    rows = (i >= qs) & (i < qe)
    keep = rows & (j >= ks) & (j < ke) & (j <= i + shift)
    if local_size is not None:
        keep &= j > i + shift - local_size
    return keep, rows


def _remember_ranges(mask: torch.Tensor, attention_mask: Any, q_length: int, kv_length: int,
                     kv_offset: int, local_size: int | None, end: int) -> None:
    """Enter ``mask``'s ranges in :data:`_RANGES` if it is exactly a padded batch's causal
    (windowed) mask, the queries the ``q_length`` keys before ``end`` (``kv_length`` but in a
    static cache, whose unfilled slots follow): on the rows inside their ranges it equals the
    ranges' own mask. One comparison on the device and one host read per mask built (each
    forward builds one per layer type), none per attention call."""
    batch = mask.shape[0]
    if (mask.dim() != 4 or mask.dtype != torch.bool
            or tuple(mask.shape[2:]) != (q_length, kv_length) or mask.shape[1] != 1
            or (attention_mask is not None and (attention_mask.dim() != 2
                                                or attention_mask.shape[0] != batch))):
        return
    # the 2-D padding mask over the buffer's keys (a static cache's is shorter: its unfilled
    # slots are padding), none past the queries' end
    valid = torch.zeros((batch, kv_length), dtype=torch.bool, device=mask.device)
    if attention_mask is None:
        valid[:, :end] = True
    else:
        given = attention_mask[:, kv_offset:kv_offset + end].bool()
        valid[:, :given.shape[1]] = given
    ranges = _padding_ranges(valid, q_length, end)
    keep, rows = _ranges_mask(ranges, q_length, kv_length, local_size, end)
    if bool(((mask == keep) | ~rows).all()):
        _keep_ranges(mask, ranges)


def _keep_ranges(mask: torch.Tensor, ranges: torch.Tensor) -> None:
    """Enter ``mask``'s ranges in :data:`_RANGES` (dropping dead entries)."""
    for key in [key for key, (ref, _) in _RANGES.items() if ref() is None]:
        del _RANGES[key]
    _RANGES[id(mask)] = (weakref.ref(mask), ranges)


def _ranges_of(attention_mask: Any) -> torch.Tensor | None:
    """The ranges :func:`_remember_ranges` found for this very mask object, or ``None``."""
    found = _RANGES.get(id(attention_mask))
    if found is None or found[0]() is not attention_mask:
        return None
    return found[1]


def _unpadded(attention_mask: Any, kv_length: int, kv_offset: int) -> bool:
    """Whether transformers' 2-D padding mask keeps every key of ``kv_offset ..
    kv_offset + kv_length`` (``None``: no padding)."""
    if attention_mask is None:
        return True
    if attention_mask.dim() != 2 or torch.compiler.is_compiling():
        return False
    return bool(attention_mask[:, kv_offset:kv_offset + kv_length].all())


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
    [B, H_kv, S_k, D]`` in; ``(attn_output [B, S_q, H_q, D] contiguous, None)`` out. The
    layer's ``sliding_window``, ``softcap`` and ``s_aux`` (sinks) keywords go to the kernel."""
    for name in _SDPA_KWARGS:
        if kwargs.get(name) is not None:
            return _fallback(name, module, query, key, value, attention_mask, dropout, scaling,
                             is_causal, kwargs)
    # Any mask goes to SDPA, a torch CausalBias too (route_decision would take one; the code
    # below assumes no mask). The mask is the first check either way. Judged in the dtype
    # torch's SDPA would compute in (autocast's, when it is on: mixed-precision training);
    # a fallback gets the tensors as they came.
    q, k, v = autocast_inputs(query, key, value)
    if kwargs.get("cu_seq_lens_q") is not None and kwargs.get("cu_seq_lens_k") is not None:
        reason = _packed_refusal(q, k, v, dropout, scaling, kwargs)
        if reason is not None:
            return _fallback(reason, module, query, key, value, attention_mask, dropout,
                             scaling, is_causal, kwargs)
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        return _packed_call(q, k, v, bool(causal), scaling, kwargs), None
    ranges = exact = None
    variant = _variant_of(kwargs)
    if attention_mask is not None and not (
            torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
        # (training: ranges have no autograd)
        if _host_may_read():
            ranges = _ranges_of(attention_mask)  # a padded batch's mask the kernel computes
            if ranges is not None and (
                    tuple(attention_mask.shape[2:]) != (q.shape[2], k.shape[2])
                    or ranges.shape[1] != q.shape[0]):
                ranges = None  # another geometry
        elif _decode_mask(attention_mask, q, k):
            ranges, exact = _decode_ranges(attention_mask)
        if ranges is not None and _is_key_mask(attention_mask):
            # one query a row: its ranges are the whole mask, a sliding layer's window in it
            # (transformers' static sliding layer keeps its keys in order: one run)
            variant.pop("window", None)
    reason = "attn_mask" if attention_mask is not None and ranges is None else route_decision(
        q, k, v, None, dropout, True, scale=scaling)
    if reason is not None:
        return _fallback(reason, module, query, key, value, attention_mask, dropout, scaling,
                         is_causal, kwargs)
    query, key, value = q, k, v
    if ranges is not None:
        return _padded_call(query, key, value, scaling, ranges, variant, exact), None

    # attention_mask is None here: the mask builder found a plain causal (or no) pattern. As in
    # transformers' SDPA path, a single query token attends to every cached key (lower-right
    # alignment == no mask), and a longer query with as many or more keys is causal top-left.
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_len, kv_len = query.shape[2], key.shape[2]
    if "window" in variant:
        # tiledattention_mask left the mask out: the queries are the last q_len keys
        causal = "bottom_right" if kv_len > q_len else True
    else:
        causal = bool(causal) and q_len > 1
        if causal and kv_len > q_len:
            # Only an empty static cache's prefill gets here (the mask builder materialises a
            # mask otherwise); keys past q_len are unfilled slots that top-left causal masks.
            key = key[:, :, :q_len]
            value = value[:, :, :q_len]
    if not torch.compiler.is_compiling():
        _counts.tiledattention += 1
    out = attention(query, key, value, causal, scaling, **variant)
    return out.transpose(1, 2).contiguous(), None


def _packed_refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float,
                    scaling: Any, kwargs: dict) -> str | None:
    """Why a packed call (transformers' padding-free path: one row of sequences end to end,
    ``cu_seq_lens_q/k`` and ``max_length_q/k``) cannot run on ``varlen_attn``, or ``None``."""
    if q.shape[0] != 1:
        return "packed batch"
    if kwargs.get("softcap") is not None or _sinks_of(kwargs) is not None:
        return "packed variant"
    if not all(isinstance(kwargs.get(name), int) for name in ("max_length_q", "max_length_k")):
        return "packed lengths"
    return route_decision(q, k, v, None, dropout, True, scale=scaling)


def _packed_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool,
                 scaling: Any, kwargs: dict) -> torch.Tensor:
    """A packed call on ``tiledattention.varlen_attn`` (causal per sequence, the layer's
    window; differentiable): ``[1, H, T, D]`` in, ``[1, T, H_q, D]`` out."""
    import tiledattention

    window = kwargs.get("sliding_window")
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    shared = cu_k is cu_q
    cu_q = cu_q.to(torch.int32)
    cu_k = cu_q if shared else cu_k.to(torch.int32)  # one stays one: the bucket depends on it
    out = tiledattention.varlen_attn(
        query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), cu_q, cu_k,
        kwargs["max_length_q"], kwargs["max_length_k"], is_causal=causal, scale=scaling,
        window_size=(-1, -1) if window is None else (int(window) - 1, 0),
        enable_gqa=query.shape[1] != key.shape[1])
    if not torch.compiler.is_compiling():
        _counts.tiledattention += 1
    return out.unsqueeze(0)


def _padded_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: Any,
                 ranges: torch.Tensor, variant: dict, exact: torch.Tensor | None
                 ) -> torch.Tensor:
    """A padded batch's call: each entry within its ranges, bottom-right causal (the queries
    are the last positions of the keys: what :func:`_remember_ranges` checked, or for one query
    a row, :func:`_decode_ranges`), with ``variant`` (the layer's window, softcap and sinks:
    :func:`_variant_of`); ``[B, S_q, H_q, D]`` out. ``exact``: which entries the ranges express
    (``None``: all); the others' rows are NaN."""
    if torch.compiler.is_compiling():
        out = ranged_attention(query, key, value, ranges, scaling, **variant)
    else:
        import tiledattention

        _counts.tiledattention += 1
        out = tiledattention.sdpa(query, key, value, "bottom_right", scaling, ranges=ranges,
                                  **variant)
    if exact is not None:
        out = torch.where(exact[:, None, None, None], out, float("nan"))
    return out.transpose(1, 2).contiguous()


def _decode_mask(attention_mask: Any, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether a mask the host may not read is one query a row's boolean mask over the keys
    (``[B, 1, 1, S_k]``: a static cache's decode step, compiled or captured; a sliding
    layer's holds its window, its buffer rolled so that the keys stay in order)."""
    return (_is_key_mask(attention_mask) and q.dim() == 4
            and tuple(attention_mask.shape) == (q.shape[0], 1, 1, k.shape[2]))


def _is_key_mask(mask: Any) -> bool:
    """Whether ``mask`` is a boolean ``[B, 1, 1, S_k]`` mask: one query a row, over the keys."""
    return (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 4
            and mask.shape[1] == 1 and mask.shape[2] == 1)


def _decode_ranges(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A one-query-a-row mask's ranges, found on the device: each entry's query and its keys
    from the first to one past the last it may see, as an int32 ``[4, B]`` tensor; and which
    entries' keys are exactly those (one run, or none: a boolean ``[B]``). One query sees its
    whole range, so the alignment is immaterial. Inside a compiled graph or a CUDA capture
    nothing reads this on the host: an entry whose keys have a hole cannot go elsewhere, and
    its rows come out NaN (:func:`_padded_call`) rather than wrong."""
    valid = attention_mask[:, 0, 0, :]
    ks, ke = _key_spans(valid)
    exact = valid.sum(dim=1) == ke - ks
    one = torch.ones_like(ks)
    return torch.stack((one - 1, one, ks, ke)).to(torch.int32), exact


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
    del sdpa_mask  # imported to check it exists: tiledattention_mask calls it
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, tiledattention_mask)
