"""A decode step's paged batch ranked once for all its layers (``tiledattention.PagedOrder``).

Where a paged batch's split CTAs pass a wave of the GPU, the decode default takes its entries
longest cache first (``DecodeSchedule.longest_first``), so no long walk starts last and runs
alone at the end; each call ranks the key counts itself, a kernel launch of its own before
the split kernel's. Every layer of a model's decode step reads the same ``seqused_k``, so a
caller can rank them once and hand the order to each layer's :func:`paged_attention` call:
those calls then launch the split kernel alone. Any order of the entries gives the same
output (the order decides only when each entry's CTAs start), so an order ranked from
earlier key counts of the same batch (a step ago; a CUDA graph replaying with new lengths)
is still right, only less well ranked. An order is made here only, by the ranking kernel
from a ``seqused_k``: every entry once, whatever the lengths held. ``torch.compile`` traces
``paged_attention`` as a torch op that takes no order (each call ranks where its schedule
wants it: a launch that a CUDA graph replays without host time); a compiled function leaves
``PagedOrder`` out (its launch breaks the graph).
"""

from __future__ import annotations

from typing import Any

from ..errors import InputTypeError, InputValueError

__all__ = ["PagedOrder", "given_entries"]


class PagedOrder:
    """The entries of a paged batch, longest cache first (equal lengths in entry order): an
    int32 ``[B]`` CUDA tensor (``entries``) that ``PagedOrder(seqused_k)`` ranks on the
    device, on torch's current stream (nothing is read on the host). Pass it as
    ``paged_attention(..., order=)`` to every call of a decode step over this batch."""

    __slots__ = ("entries",)

    def __init__(self, seqused_k: Any) -> None:
        import torch  # (``import tiledattention`` imports no torch)

        from ..kernels.decode._launch import rank_entries

        if not isinstance(seqused_k, torch.Tensor):
            raise InputTypeError(f"seqused_k must be an int32 torch.Tensor [B]; got "
                                 f"{type(seqused_k).__name__}")
        if seqused_k.dtype != torch.int32 or seqused_k.dim() != 1 or seqused_k.shape[0] < 1:
            raise InputValueError(f"seqused_k must be an int32 tensor [B] with B >= 1; got "
                                  f"{seqused_k.dtype} of shape {tuple(seqused_k.shape)}")
        if not seqused_k.is_cuda:
            raise InputValueError(f"seqused_k must be a CUDA tensor; got one on "
                                  f"{seqused_k.device}")
        self.entries = torch.empty(seqused_k.shape, dtype=torch.int32, device=seqused_k.device)
        rank_entries(torch.cuda.current_stream(seqused_k.device), seqused_k, self.entries)

    @property
    def batch(self) -> int:
        return self.entries.shape[0]

    def __repr__(self) -> str:
        return f"PagedOrder(batch={self.batch}, device={self.entries.device})"


def given_entries(order: Any, seqused_k: Any) -> Any:
    """``order``'s entries, or ``None`` for no order; raise an InputTypeError /
    InputValueError naming ``order`` unless it is ``None`` or a :class:`PagedOrder` of
    ``seqused_k``'s batch on its device (``seqused_k`` validated)."""
    if order is None:
        return None
    if type(order) is not PagedOrder:
        raise InputTypeError(f"order must be a tiledattention.PagedOrder (PagedOrder(seqused_k)) "
                             f"or None; got {type(order).__name__}")
    entries = order.entries
    if entries.shape[0] != seqused_k.shape[0] or entries.device != seqused_k.device:
        raise InputValueError(f"order must rank this call's batch: {seqused_k.shape[0]} "
                              f"entries on {seqused_k.device}; got a PagedOrder of "
                              f"{entries.shape[0]} on {entries.device}")
    return entries
