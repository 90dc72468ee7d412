"""Route ``torch.nn.functional.scaled_dot_product_attention`` calls to tiledattention when it can
run them, and to PyTorch's own function, unchanged, otherwise.

``route_decision`` is the whole policy, a pure function of the call's arguments; the router only
swaps the ``torch.nn.functional`` attribute, so callers that bound the function earlier
(``from torch.nn.functional import scaled_dot_product_attention``) are not routed.

Causal masks come as ``is_causal=True`` (top-left) or as an ``attn_mask`` that is a
``torch.nn.attention.bias.CausalBias`` (``causal_upper_left(S_q, S_k)`` /
``causal_lower_right(S_q, S_k)``): the kernel runs both alignments. Where lower-right leaves a
query row no key (``S_q > S_k``; torch warns that its result has NaNs there), the kernel's row is
zeros. A ``CausalBias`` call that falls back goes through the bias's own dispatch, as torch would
run it without the router (see ``_fallback``).

A padded batch's mask is taken when it is a :class:`~tiledattention.integrations.PaddingMask`
(``padding_mask(lengths_k, S_q, S_k, side=...)``), which carries each entry's ranges: the call
runs ``tiledattention.sdpa(..., ranges=mask.ranges)`` (rows outside an entry's query range are
zeros). A plain boolean mask stays with torch: recognising it as padding only would read it on
the host. The ranges path has no autograd, so such a call that requires grad falls back (through
the mask's own dispatch, like a ``CausalBias``).

Calls that require grad are taken like any other: :func:`attention` then runs the forward that
keeps the log-sum-exp, and autograd runs tiledattention's backward kernels. Under
``torch.autocast`` a call is judged, and run, in autocast's dtype, as torch's function would run
it (mixed-precision training hands attention float32 queries and keys).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from ..core._dtypes import DTYPES, FP8_DTYPES, torch_dtype
from ..core._problem import BOTTOM_RIGHT, SUPPORTED_HEAD_DIMS
from ._padding import PaddingMask
from ._torch_op import attention, autocast_inputs

try:  # torch >= 2.3
    from torch.nn.attention.bias import CausalBias, CausalVariant
except ImportError:  # pragma: no cover - older torch: no bias objects to route
    CausalBias = CausalVariant = None

__all__ = [
    "FALLBACK_REASONS", "RouterStats", "causal_alignment", "disable", "enable", "is_enabled",
    "reset_router_stats", "route_decision", "router_stats", "sdpa_kernel",
]

#: Device types the kernel runs on. ``route_decision`` takes another tuple for tests.
KERNEL_DEVICE_TYPES: tuple[str, ...] = ("cuda",)
#: torch's sdpa takes no descale factors: its FP8 calls are not ours to take
_KERNEL_DTYPES = tuple(torch_dtype(name) for name in DTYPES if name not in FP8_DTYPES)

#: Every reason ``route_decision`` can give, in the order it checks them.
FALLBACK_REASONS = (
    "attn_mask",  # an attn_mask other than a torch.nn.attention.bias.CausalBias or a
                  # PaddingMask was given (a plain tensor mask: reading it would sync)
    "dropout",    # dropout_p != 0
    "cpu",        # a tensor is on the CPU
    "device",     # a tensor on another non-kernel device, or q, k, v on different devices
    "dtype",      # not bf16/fp16, or q, k, v of different dtypes
    "ndim",       # not 4-D [B, H, S, D]
    "layout",     # last dim not contiguous
    "shape",      # k, v shapes differ, batch or head_dim differ from q, or an empty dim
    "causal_bias",  # a CausalBias whose seq_len_q / seq_len_kv are not q's S_q and k's S_k, of
                    # another variant, or given with is_causal=True (torch raises for that)
    "padding_mask",  # a PaddingMask whose seq_len_q / seq_len_kv / batch are not q's S_q, k's
                     # S_k and B, whose ranges are on another device than q, or given with
                     # is_causal=True (its dispatch raises for that)
    "padding_mask_grad",  # a PaddingMask call that requires grad (grad mode on and q, k or v
                          # requires grad): the ranges path has no autograd
    "head_dim",   # head_dim not in tiledattention.core._problem.SUPPORTED_HEAD_DIMS
    "gqa",        # H_q != H_kv without enable_gqa, or H_q not a multiple of H_kv
    "scale",      # scale not a finite positive number
)


def _is_causal_bias(attn_mask: Any) -> bool:
    return CausalBias is not None and isinstance(attn_mask, CausalBias)


def _is_padding_mask(attn_mask: Any) -> bool:
    return isinstance(attn_mask, PaddingMask)


def route_decision(q: Any, k: Any, v: Any, attn_mask: Any, dropout_p: float,
                   enable_gqa: bool, *, scale: Any = None, is_causal: bool = False,
                   device_types: tuple[str, ...] | None = None) -> str | None:
    """``None`` if tiledattention runs this ``scaled_dot_product_attention`` call, else the
    reason (one of :data:`FALLBACK_REASONS`) it goes to PyTorch.

    ``attn_mask`` may be a ``torch.nn.attention.bias.CausalBias`` (upper-left or lower-right)
    made for exactly these sequence lengths; :func:`causal_alignment` then says which mask the
    kernel applies. It may be a :class:`PaddingMask` of these lengths and batch size on q's
    device, in a call that needs no gradient (``tiledattention.sdpa(..., ranges=)`` has no
    autograd). ``device_types``: the device types to accept (default
    :data:`KERNEL_DEVICE_TYPES`, CUDA); tests pass others to reach the later checks with CPU or
    meta tensors.
    """
    accepted = KERNEL_DEVICE_TYPES if device_types is None else device_types
    bias = _is_causal_bias(attn_mask)
    padding = not bias and _is_padding_mask(attn_mask)
    if attn_mask is not None and not bias and not padding:
        return "attn_mask"
    if dropout_p != 0.0:
        return "dropout"
    tensors = (q, k, v)
    if not all(isinstance(x, torch.Tensor) for x in tensors):
        return "device"
    types = {x.device.type for x in tensors}
    if not types <= set(accepted):
        return "cpu" if "cpu" in types else "device"
    if len({x.device for x in tensors}) != 1:
        return "device"
    if q.dtype not in _KERNEL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return "dtype"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "ndim"
    if any(x.stride(-1) != 1 and x.shape[-1] > 1 for x in tensors):
        return "layout"
    b, hq, sq, d = q.shape
    bk, hkv, sk, dk = k.shape
    if tuple(v.shape) != tuple(k.shape) or bk != b or dk != d or 0 in (b, hq, hkv, sq, sk):
        return "shape"
    if bias and (is_causal or attn_mask.seq_len_q != sq or attn_mask.seq_len_kv != sk
                 or attn_mask.variant not in (CausalVariant.UPPER_LEFT,
                                              CausalVariant.LOWER_RIGHT)):
        return "causal_bias"
    if padding and (is_causal or attn_mask.seq_len_q != sq or attn_mask.seq_len_kv != sk
                    or attn_mask.batch != b or attn_mask.ranges.device != q.device):
        return "padding_mask"
    if padding and torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        return "padding_mask_grad"
    if d not in SUPPORTED_HEAD_DIMS:
        return "head_dim"
    if hq != hkv and not (enable_gqa and hq % hkv == 0):
        return "gqa"
    if scale is not None and not (isinstance(scale, (int, float)) and 0 < scale < float("inf")):
        return "scale"
    return None


def causal_alignment(attn_mask: Any, is_causal: bool) -> bool | str:
    """The ``causal`` argument of :func:`tiledattention.sdpa` for a call that
    :func:`route_decision` accepted: ``"bottom_right"`` for a lower-right ``CausalBias``,
    ``True`` (top-left) for an upper-left one, a :class:`PaddingMask`'s own ``causal`` (aligned
    within each entry's ranges), else ``is_causal``."""
    if _is_padding_mask(attn_mask):
        return attn_mask.causal
    if _is_causal_bias(attn_mask):
        return BOTTOM_RIGHT if attn_mask.variant == CausalVariant.LOWER_RIGHT else True
    return bool(is_causal)


@dataclass(frozen=True, kw_only=True)
class RouterStats:
    """Where routed calls went since the last reset."""

    tiledattention: int
    torch: int
    fallbacks: dict[str, int] = field(default_factory=dict)  # reason -> count


class _Counts:
    def __init__(self) -> None:
        self.tiledattention = 0
        self.fallbacks: Counter[str] = Counter()

    def snapshot(self) -> RouterStats:
        return RouterStats(tiledattention=self.tiledattention, torch=sum(self.fallbacks.values()),
                           fallbacks=dict(self.fallbacks))

    def reset(self) -> None:
        self.tiledattention = 0
        self.fallbacks.clear()


_counts = _Counts()


def router_stats() -> RouterStats:
    """How many routed calls went to tiledattention and to torch, and why each fallback happened.

    Counted at run time in eager mode; inside a ``torch.compile``'d function the decision is made
    once while tracing (guarded on the inputs' properties) and is not counted per call.
    """
    return _counts.snapshot()


def reset_router_stats() -> None:
    _counts.reset()


_lock = threading.Lock()
_original: Callable[..., torch.Tensor] | None = None  # the function enable() replaced


class _Passthrough(threading.local):
    """Set while a ``CausalBias`` or a ``PaddingMask`` runs its own dispatch for a fallback: the
    calls it makes back into ``F.scaled_dot_product_attention`` (the router) go to ``_original``
    as they are, uncounted (they belong to the call already counted)."""

    active = False


_passthrough = _Passthrough()


def _routed_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                 is_causal: bool = False, scale: float | None = None,
                 enable_gqa: bool = False) -> torch.Tensor:
    original = _original if _original is not None else _TORCH_SDPA
    kwargs: dict[str, Any] = {"attn_mask": attn_mask, "dropout_p": dropout_p,
                              "is_causal": is_causal, "scale": scale}
    if enable_gqa:  # passed only when set: torch < 2.5 has no enable_gqa
        kwargs["enable_gqa"] = enable_gqa
    if _passthrough.active:
        return original(query, key, value, **kwargs)
    # decided on the dtypes torch's function would compute in (autocast's, when it is on); a
    # fallback gets the tensors as they came
    q, k, v = autocast_inputs(query, key, value)
    reason = route_decision(q, k, v, attn_mask, dropout_p, enable_gqa, scale=scale,
                            is_causal=is_causal)
    compiling = torch.compiler.is_compiling()
    if reason is None:
        if not compiling:
            _counts.tiledattention += 1
        if _is_padding_mask(attn_mask):
            import tiledattention  # looked up per call, so tests can substitute a reference

            return tiledattention.sdpa(q, k, v, attn_mask.causal, scale, ranges=attn_mask.ranges)
        return attention(q, k, v, causal_alignment(attn_mask, is_causal), scale)
    if not compiling:
        _counts.fallbacks[reason] += 1
    return _fallback(original, query, key, value, kwargs)


def _fallback(original: Callable[..., torch.Tensor], query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """PyTorch's result for a call the router does not take.

    A ``CausalBias`` mask cannot simply be handed to ``original``: torch's function hands it to
    ``CausalBias.__torch_function__``, which runs the bias's own dispatch only if the function
    it was called for *is* ``torch.nn.functional.scaled_dot_product_attention`` -- while the
    router is on, that attribute is ``_routed_sdpa``, so the bias would be treated as a plain
    tensor (an uninitialised one: the computation breaks or returns garbage). So the bias's
    ``__torch_function__`` is called here for the attribute it checks against, and the calls its
    dispatch makes back into that attribute pass straight through to ``original``. A
    :class:`PaddingMask` goes the same way (its dispatch materialises the boolean mask)."""
    attn_mask = kwargs["attn_mask"]
    if not (_is_causal_bias(attn_mask) or _is_padding_mask(attn_mask)):
        return original(query, key, value, **kwargs)
    _passthrough.active = True
    try:
        return type(attn_mask).__torch_function__(
            F.scaled_dot_product_attention, (type(attn_mask),), (query, key, value), kwargs)
    finally:
        _passthrough.active = False


_routed_sdpa.__doc__ = (
    "torch.nn.functional.scaled_dot_product_attention, routed by tiledattention.integrations "
    "(calls tiledattention supports run its kernel; the rest run PyTorch's function unchanged)."
)
_TORCH_SDPA = F.scaled_dot_product_attention  # as found when this module was imported


def is_enabled() -> bool:
    """Whether ``torch.nn.functional.scaled_dot_product_attention`` is routed now."""
    return F.scaled_dot_product_attention is _routed_sdpa


def enable() -> None:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` until :func:`disable`.
    Idempotent."""
    global _original
    with _lock:
        if F.scaled_dot_product_attention is _routed_sdpa:
            return
        _original = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = _routed_sdpa


def disable() -> None:
    """Put back the function :func:`enable` replaced. Idempotent."""
    global _original
    with _lock:
        if F.scaled_dot_product_attention is _routed_sdpa and _original is not None:
            F.scaled_dot_product_attention = _original
        _original = None


@contextlib.contextmanager
def sdpa_kernel() -> Iterator[None]:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` inside the block.

    Nests: the outermost block that enabled routing disables it on exit, also on exceptions; a
    block entered while routing is on (by :func:`enable` or an outer block) leaves it on.
    """
    was_enabled = is_enabled()
    enable()
    try:
        yield
    finally:
        if not was_enabled:
            disable()
