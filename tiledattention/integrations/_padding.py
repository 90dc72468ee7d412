"""A padded batch's attention mask that says what it is: :class:`PaddingMask`.

A boolean ``attn_mask`` tensor cannot be recognised as "padding only" without reading it on the
host (a device sync), so the SDPA router leaves plain masks to PyTorch. A :class:`PaddingMask`
carries its batch entries' ranges instead (an int32 ``[4, B]`` tensor: query starts, query ends,
key starts, key ends, the ``ranges=`` argument of :func:`tiledattention.sdpa`), made on the
device from the entries' lengths without a host read, so the router knows it by its type and
runs ``tiledattention.sdpa(q, k, v, mask.causal, scale, ranges=mask.ranges)``.

Like ``torch.nn.attention.bias.CausalBias`` it is a ``torch.Tensor`` subclass whose
``__torch_function__`` handles ``torch.nn.functional.scaled_dot_product_attention`` (without
the router, or where the router falls back: torch's result with the boolean mask
:meth:`PaddingMask._materialize` builds); any other torch function sees that boolean mask
(``[B, 1, S_q, S_k]``, True = attend), built on the mask's device. Its shape, dtype and device
are the materialised mask's and are answered without building it.

Rows that see no key (rows outside their entry's query range, every row of an entry without
keys, the first rows of a bottom-right causal entry with more queries than keys): the kernel
returns zeros, and so does this mask's SDPA dispatch (torch's functions give NaN or zeros there,
by backend). The materialised mask holds no True on such rows; passed to torch's SDPA as a plain
tensor it leaves their values to torch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from ..core._problem import BOTTOM_RIGHT, INDEX_LIMIT, TOP_LEFT
from ..errors import InputTypeError, InputValueError

__all__ = ["PaddingMask", "padding_mask"]

_SIDES = ("left", "right")
_LENGTH_DTYPES = (torch.int32, torch.int64)
#: torch's own scaled_dot_product_attention (a C function: the router swaps the module
#: attribute, not this)
_TORCH_SDPA = torch._C._nn.scaled_dot_product_attention
#: metadata the placeholder answers as the materialised mask would, without building it
_METADATA = frozenset({
    torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.device.__get__,
    torch.Tensor.ndim.__get__, torch.Tensor.layout.__get__, torch.Tensor.is_cuda.__get__,
    torch.Tensor.is_meta.__get__, torch.Tensor.requires_grad.__get__, torch.Tensor.dim,
    torch.Tensor.size, torch.Tensor.numel, torch.Tensor.__len__, torch.Tensor.stride,
    torch.Tensor.storage_offset, torch.Tensor.is_contiguous, torch.Tensor.element_size,
})


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}"[:200]


def _check_length(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputTypeError(f"{name} must be an int (a sequence length); got "
                             f"{_describe(value)}")
    if not 1 <= value <= INDEX_LIMIT:
        raise InputValueError(f"{name} must be a sequence length of at least 1; got {value}")
    return value


def _check_causal(causal: Any) -> bool | str:
    """The ``causal`` argument of :func:`tiledattention.sdpa` the mask stands for: ``False``,
    ``True`` (top-left) or ``"bottom_right"``."""
    if isinstance(causal, bool):
        return causal
    if causal == TOP_LEFT:
        return True
    if causal == BOTTOM_RIGHT:
        return BOTTOM_RIGHT
    raise (InputValueError if isinstance(causal, str) else InputTypeError)(
        f"causal must be False, True or {TOP_LEFT!r} (top-left within each entry's ranges) or "
        f"{BOTTOM_RIGHT!r} (the valid queries are the last of the valid keys); got "
        f"{_describe(causal)}")


def _check_lengths(name: str, lengths: Any, batch: int | None = None,
                   device: torch.device | None = None) -> torch.Tensor:
    if not isinstance(lengths, torch.Tensor):
        raise InputTypeError(f"{name} must be an int32 or int64 torch.Tensor [B] (each batch "
                             f"entry's valid tokens); got {_describe(lengths)}")
    if lengths.dtype not in _LENGTH_DTYPES or lengths.dim() != 1 or lengths.shape[0] < 1:
        raise InputValueError(f"{name} must be a 1-dim int32 or int64 tensor [B] of at least one "
                              f"entry; got {_describe(lengths)}")
    if batch is not None and lengths.shape[0] != batch:
        raise InputValueError(f"{name} must have one length per batch entry ({batch}, as "
                              f"lengths_k); got {_describe(lengths)}")
    if device is not None and lengths.device != device:
        raise InputValueError(f"{name} must be on lengths_k's device {device}; got "
                              f"{_describe(lengths)}")
    return lengths


class PaddingMask(torch.Tensor):
    """A padded batch's attention mask, ``[B, 1, S_q, S_k]`` (True = attend), held as each
    entry's query and key ranges.

    ``PaddingMask(ranges, seq_len_q, seq_len_kv, *, causal=False)``: ``ranges`` an int32 (or
    int64) tensor ``[4, B]`` whose columns hold entry ``b``'s query rows ``[ranges[0, b],
    ranges[1, b])`` and keys ``[ranges[2, b], ranges[3, b])``, as
    :func:`tiledattention.sdpa`'s ``ranges=`` takes them; ``causal``: ``False``, ``True`` /
    ``"top_left"`` or ``"bottom_right"``, aligned within each entry's ranges as ``sdpa`` aligns
    it (``"bottom_right"``: the valid queries are the last of the valid keys, as in a
    left-padded generation step). The values are not read on the host: they are clamped into
    ``0 .. S`` on their device (an end before its start is an empty range). :func:`padding_mask`
    builds one from each entry's lengths.

    Attributes: ``ranges`` (int32 ``[4, B]``, contiguous, on the mask's device),
    ``seq_len_q``, ``seq_len_kv``, ``causal`` (``False``, ``True`` or ``"bottom_right"``),
    ``batch``. ``_materialize(device)`` builds the boolean mask. Any torch function other than
    SDPA (``.to``, ``.cuda``, indexing, ``&``) returns plain tensors of the boolean mask: make
    the mask on q's device (the router takes it only there).
    """

    ranges: torch.Tensor
    seq_len_q: int
    seq_len_kv: int
    causal: bool | str

    @staticmethod
    def __new__(cls, ranges: Any, seq_len_q: int, seq_len_kv: int, *,
                causal: Any = False) -> "PaddingMask":
        if not isinstance(ranges, torch.Tensor):
            raise InputTypeError(f"ranges must be an int32 torch.Tensor [4, B] (query starts, "
                                 f"query ends, key starts, key ends); got {_describe(ranges)}")
        if (ranges.dtype not in _LENGTH_DTYPES or ranges.dim() != 2 or ranges.shape[0] != 4
                or ranges.shape[1] < 1):
            raise InputValueError(f"ranges must be an int32 or int64 tensor [4, B] with B >= 1 "
                                  f"(query starts, query ends, key starts, key ends); got "
                                  f"{_describe(ranges)}")
        sq = _check_length("seq_len_q", seq_len_q)
        sk = _check_length("seq_len_kv", seq_len_kv)
        causal = _check_causal(causal)
        placeholder = torch.empty((), dtype=torch.bool, device=ranges.device).expand(
            ranges.shape[1], 1, sq, sk)
        self = torch.Tensor._make_subclass(cls, placeholder)
        with torch.no_grad():
            r = ranges.detach().long()
            qs = r[0].clamp(0, sq)
            qe = torch.maximum(r[1].clamp(0, sq), qs)
            ks = r[2].clamp(0, sk)
            ke = torch.maximum(r[3].clamp(0, sk), ks)
            self.ranges = torch.stack((qs, qe, ks, ke)).to(torch.int32).contiguous()
        self.seq_len_q, self.seq_len_kv, self.causal = sq, sk, causal
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # all done by __new__
        super().__init__()

    @property
    def batch(self) -> int:
        return self.ranges.shape[1]

    def _materialize(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The boolean ``[B, 1, S_q, S_k]`` mask (True = attend) on ``device`` (default: the
        mask's): key ``j`` of entry ``b`` for query row ``i`` where ``i`` is in the entry's query
        range, ``j`` in its key range, and the causal mask (aligned within the ranges) allows
        it. Built on the device, no host read. Rows that see no key are all False."""
        r = self.ranges if device is None else self.ranges.to(device)
        qs, qe, ks, ke = (x.long()[:, None, None, None] for x in r)
        i = torch.arange(self.seq_len_q, device=r.device)[None, None, :, None]
        j = torch.arange(self.seq_len_kv, device=r.device)[None, None, None, :]
        keep = (i >= qs) & (i < qe) & (j >= ks) & (j < ke)
        if self.causal == BOTTOM_RIGHT:  # query qe - 1 sees key ke - 1
            keep &= j - ke <= i - qe
        elif self.causal:  # query qs sees key ks
            keep &= j - ks <= i - qs
        return keep

    @staticmethod
    def _dispatch(func: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: "PaddingMask", dropout_p: float = 0.0, is_causal: bool = False,
                  scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
        """``func`` (torch's ``scaled_dot_product_attention``, or the router's attribute while
        it falls back) with the materialised mask; rows that see no key are zeros."""
        if is_causal:
            raise InputValueError("is_causal must be False with a PaddingMask attn_mask (the "
                                  "mask carries its causal alignment: padding_mask(..., "
                                  "causal=...)); got is_causal=True")
        mask = attn_mask._materialize(query.device)
        kwargs: dict[str, Any] = {"attn_mask": mask, "dropout_p": dropout_p,
                                  "is_causal": False, "scale": scale}
        if enable_gqa:  # passed only when set: torch < 2.5 has no enable_gqa
            kwargs["enable_gqa"] = enable_gqa
        out = func(query, key, value, **kwargs)
        return out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = {} if kwargs is None else kwargs
        if func is F.scaled_dot_product_attention or func is _TORCH_SDPA:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                     "enable_gqa")
            call = {**dict(zip(names, args)), **kwargs}
            if isinstance(call.get("attn_mask"), PaddingMask) and len(args) <= len(names):
                return cls._dispatch(func, **call)
        elif func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        args, kwargs = tree_map(
            lambda x: x._materialize() if isinstance(x, PaddingMask) else x, (args, kwargs))
        return func(*args, **kwargs)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        # the ranges are not printed: reading them would wait for the device
        return (f"PaddingMask(batch={self.batch}, seq_len_q={self.seq_len_q}, "
                f"seq_len_kv={self.seq_len_kv}, causal={self.causal!r}, "
                f"device={self.ranges.device})")


def padding_mask(lengths_k: torch.Tensor, seq_len_q: int, seq_len_kv: int, *, side: str,
                 lengths_q: torch.Tensor | None = None, causal: Any = False,
                 device: torch.device | str | None = None) -> PaddingMask:
    """A :class:`PaddingMask` from each batch entry's number of valid keys.

    ``lengths_k``: int32 or int64 tensor ``[B]`` (CPU or CUDA; e.g. a transformers
    ``attention_mask.sum(-1)``), each entry's valid keys out of ``seq_len_kv``: with
    ``side="left"`` the last ``lengths_k[b]`` positions (left padding, as in batched
    generation), with ``side="right"`` the first. ``lengths_q``: ``None`` (the queries are the
    last ``seq_len_q`` of the ``seq_len_kv`` key positions, and a query row is valid where its
    position is a valid key: with ``seq_len_q == seq_len_kv`` (a prefill) the queries are padded
    like the keys, and a left-padded decode step's query rows are all valid), or a tensor like
    ``lengths_k`` of each entry's valid query rows, padded on the same side (cross-attention,
    queries with a padding of their own). ``causal``: ``False``, ``True`` / ``"top_left"`` or
    ``"bottom_right"`` (the valid queries are the last of the valid keys: causal by position
    for the default queries, in a prefill and a decode step alike). ``device``: where the
    ranges live (default: ``lengths_k``'s; the router takes the mask only on q's device).

    Lengths are clamped into ``0 .. seq_len`` on their device, never read on the host.
    """
    sq = _check_length("seq_len_q", seq_len_q)
    sk = _check_length("seq_len_kv", seq_len_kv)
    if side not in _SIDES:
        raise (InputValueError if isinstance(side, str) else InputTypeError)(
            f"side must be 'left' (valid tokens last) or 'right' (valid tokens first); got "
            f"{_describe(side)}")
    causal = _check_causal(causal)
    lengths_k = _check_lengths("lengths_k", lengths_k)
    if lengths_q is not None:
        lengths_q = _check_lengths("lengths_q", lengths_q, lengths_k.shape[0], lengths_k.device)
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise InputValueError(f"device must be a torch.device or its name; got "
                                  f"{_describe(device)}") from error
    with torch.no_grad():
        lk = lengths_k.long().clamp(0, sk)
        if side == "left":
            ks, ke = sk - lk, torch.full_like(lk, sk)
        else:
            ks, ke = torch.zeros_like(lk), lk
        if lengths_q is None:
            shift = sk - sq  # query row i is key position i + shift
            qs = (ks - shift).clamp(0, sq)
            qe = (ke - shift).clamp(0, sq)
        else:
            lq = lengths_q.long().clamp(0, sq)
            qs, qe = (sq - lq, torch.full_like(lq, sq)) if side == "left" else (
                torch.zeros_like(lq), lq)
        ranges = torch.stack((qs, qe, ks, ke))
        if device is not None:
            ranges = ranges.to(device)
    return PaddingMask(ranges, sq, sk, causal=causal)
