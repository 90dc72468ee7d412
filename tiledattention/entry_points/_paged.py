"""Attention over a paged K/V cache (``tiledattention.paged_attention`` and
``varlen_attn(..., block_table=, seqused_k=)``), the layout serving engines keep: K and V are
pools ``[pages, page_size, H_kv, D]``, an int32 block table ``[B, max_pages]`` names each batch
entry's pages in order, and ``seqused_k [B]`` says how many of its keys are valid (the last page
is usually partly filled). Entry ``b``'s queries are the last ``S_q`` positions of its
``seqused_k[b]`` keys (a decode step, speculative tokens, a chunk of a prefill), so causal
masks and windows align bottom-right.

``varlen_attn`` over a paged cache whose sequences have query counts of their own (a serving
engine's mixed step) runs in ``_paged_mixed`` on this module's routes.

Decode steps (few query rows: the decode family's dispatch rule) run on the split-KV decode
kernels, which read the pages in place (``PAGED``): each key tile looks its pages up in the
block table, nothing is gathered or copied, and keys past ``seqused_k[b]`` (or past the block
table's pages) never enter the softmax. Every entry's key walk is split over the same number of
CTAs, so a batch whose lengths differ by 1000x runs in one launch. Long query runs (chunked
prefill) run on the forward family's ragged kernel. It reads the pages in place where one page
holds a whole key tile of its schedule, or half of one for query runs of few rows
(``ForwardFamily.reads_pages_with``: the tile then walks as two parts of a page's keys); else
the pages holding the keys each entry reads are copied first (``_page_copy.copy_read_pages``:
one read and one write of them), which costs less than a tile of four or more parts
(docs/records/benchmarks/paged/). Nothing is read on the
host: the lengths and the block table stay on the device, so a step is capturable in a CUDA
graph and replays with new lengths and tables.

An FP8 cache (float8_e4m3fn pools under bf16 / fp16 queries, with ``k_descale`` and
``v_descale``, FlashAttention-3's convention: float32 ``[B, H_kv]`` or broadcasting to it) runs
decode steps on the same kernels, which widen each key and value tile (``Problem.kv_dtype``);
a long query run over it copies the entries' pages, dequantised into q's dtype, first.

A call without sinks or an FP8 cache that repeats an earlier call's signature
(``core._plans.warm_key``: the arrays' shapes, strides, dtypes, devices and ``requires_grad``,
grad mode, and the other arguments with their types) runs the plan that call kept (a decode
step's launch plan, a long query run's :class:`LongRun`), with no validation, lookup or
problem built: the first call of a signature judged all of that, and nothing else decides it.

A decode step over pages is looked up by its batch, query count, page size and longest cache
(``max_k``, else the block table's capacity; the nearest power of two, as decode steps are):
``Problem.page_size`` with ``ragged``. A paged row answers only for its own longest cache
(``DecodeFamily.ragged_exact``): it was tuned on caches of mixed lengths up to it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from ..core import _plans as hot
from ..core._device import device_info
from ..core._dtypes import dtype_of
from ..core._family import check_arch_dtype, serving
from ..core._problem import (BOTTOM_RIGHT, SUPPORTED_HEAD_DIMS, TOP_LEFT,
                             causal_flags, check_attention_tensors, check_reach, default_scale,
                             padded_head_dim, sink_logits, variant_args)
from ..core._ragged import RaggedLayout, packed_view, ragged_problem, without_pages
from ..core._runtime import Runtime, runtime
from ..errors import InputTypeError, InputValueError, UnsupportedOperationError
from ._fp8 import DESCALE_NAMES, fp8_descales, is_fp8_tensor
from ._page_copy import check_copied, copy_read_pages, copy_width
from ._paged_order import given_entries
from ._regroup import check_regroup, regroup_pages, regrouped, regrouped_page_size
from ._ragged_fill import clear_uncovered_rows

__all__ = ["paged_attention", "paged_forward", "paged_problem", "explain_paged", "reader",
           "ragged_forward", "key_layout", "check_paged", "check_call", "check_device",
           "OP_NAME"]

OP_NAME = "tiledattention::paged_attention"


def check_paged(q: Any, k_pages: Any, v_pages: Any, block_table: Any, seqused_k: Any,
                descales: tuple = (None, None), *, packed: bool = False,
                names: tuple[str, str, str] = ("q", "k_pages", "v_pages")) -> str:
    """Raise an InputTypeError / InputValueError naming the argument unless the kernels can
    run these arrays; return the cache's element type (``Problem.kv_dtype``: ``""`` when K and
    V are in q's dtype, ``"e4m3"`` for an FP8 cache, which ``descales``, the call's
    ``(k_descale, v_descale)``, may scale; they go with an FP8 cache only). ``packed``: q holds
    packed sequences' queries ``[tokens, H_q, D]`` (``varlen_attn``'s), one sequence a row of
    the block table; ``names``: the caller's names of q and the pools."""
    kv_fp8 = is_fp8_tensor(k_pages)
    qn, kn, _ = names
    check_attention_tensors(names, q, k_pages, v_pages,
                            "[tokens, H_q, D]" if packed else "[B, H_q, S_q, D]",
                            "[pages, page_size, H_kv, D]", kv_fp8=kv_fp8)
    kv_dtype = dtype_of(kn, k_pages, fp8=True) if kv_fp8 else ""
    given = [n for n, d in zip(DESCALE_NAMES[1:], descales) if d is not None]
    if given and not kv_fp8:
        raise InputValueError(f"{' and '.join(given)} go with an FP8 cache (float8_e4m3fn "
                              f"k_pages and v_pages); got {k_pages.dtype} pages")
    hq, d = q.shape[1], q.shape[-1]
    _, page_size, hkv, dk = k_pages.shape
    if dk != d:
        raise InputValueError(f"{kn}'s head_dim must be {qn}'s ({d}); got {dk}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise InputValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}; got {d}")
    if hq % hkv:
        raise InputValueError(f"{qn}'s heads ({hq}) must be a multiple of {kn}'s ({hkv})")
    b = None if packed else q.shape[0]  # packed: the block table's rows count the sequences
    for name, x, shape in (("block_table", block_table, "[B, max_pages]"),
                           ("seqused_k", seqused_k, "[B]")):
        if not isinstance(x, torch.Tensor):
            raise InputTypeError(f"{name} must be an int32 torch.Tensor {shape}; got "
                                 f"{type(x).__name__}")
        if (x.dtype != torch.int32 or x.dim() != len(shape.split(","))
                or (b is not None and x.shape[0] != b)):
            rows = "" if b is None else f" with B = {b}"
            raise InputValueError(f"{name} must be an int32 tensor {shape}{rows}; got "
                                  f"{x.dtype} of shape {tuple(x.shape)}")
        if x.device != q.device:
            raise InputValueError(f"{name} must be on {qn}'s device {q.device}; got {x.device}")
        b = x.shape[0]
    if block_table.shape[1] < 1 or block_table.stride(1) != 1:
        raise InputValueError(f"block_table must hold at least one page per entry, contiguous "
                              f"in its last dim; got shape {tuple(block_table.shape)}, strides "
                              f"{block_table.stride()}")
    return kv_dtype


def check_device(q: Any) -> None:
    """The device check, after every other check of a call (:func:`check_paged`, the scale, the
    problem, the sinks), so a wrong argument is named even on CPU tensors. The other arrays
    are on q's device (:func:`check_paged`)."""
    if not q.is_cuda:
        raise InputValueError(f"q, k_pages and v_pages must be CUDA tensors; got tensors on "
                              f"{q.device}")


def paged_problem(q: Any, k_pages: Any, block_table: Any, causal: Any, window: Any,
                  softcap: Any, sinks: Any, max_k: Optional[int], kv_dtype: str = "",
                  longest_q: Optional[int] = None):
    """The bucketed :class:`Problem` of a paged call (``ragged_problem``'s bucket with the page
    size and the cache's element type, ``kv_dtype``) and its longest cache (``max_k``, else the
    block table's capacity). ``longest_q``: q holds packed sequences' queries ``[tokens, H_q,
    D]``, none more than ``longest_q`` a sequence (else q is ``[B, H_q, S_q, D]``)."""
    sequences, hq, d = block_table.shape[0], q.shape[1], q.shape[-1]
    if longest_q is None:
        sq, tokens = q.shape[2], sequences * q.shape[2]
    else:
        sq, tokens = longest_q, q.shape[0]
    page_size, hkv = k_pages.shape[1], k_pages.shape[2]
    capacity = block_table.shape[1] * page_size
    if max_k is None:
        longest = capacity
    elif isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 1:
        raise InputValueError(f"max_k must be a positive int (at least every entry's "
                              f"seqused_k) or None; got {max_k!r}")
    else:
        longest = min(max_k, capacity)
    is_causal, _ = causal_flags(causal)
    if causal == TOP_LEFT and sq > 1:
        raise InputValueError("a paged call's queries are the last positions of each entry's "
                              "keys: causal=True (or 'bottom_right') aligns them bottom-right; "
                              "got causal='top_left'")
    left, right, cap = variant_args(window, softcap)
    problem = ragged_problem(sequences=sequences, tokens_q=tokens, longest_q=sq,
                             longest_k=longest, heads_q=hq, heads_kv=hkv, head_dim=d,
                             dtype=dtype_of("q", q), causal=is_causal, bottom_right=True,
                             window=(left, right), softcap=cap, sinks=sinks is not None,
                             page_size=regrouped_page_size(page_size), kv_dtype=kv_dtype)
    return problem, longest


def paged_forward(runtime: Runtime, q, k_pages, v_pages, block_table, seqused_k, *,
                  causal: Any = True, scale: Optional[float] = None, window: Any = None,
                  softcap: Any = None, sinks: Any = None, max_k: Optional[int] = None,
                  k_descale: Any = None, v_descale: Any = None,
                  order: Any = None) -> torch.Tensor:
    """``tiledattention.paged_attention`` (see there): the output ``[B, H_q, S_q, D]``.
    ``order``: a :class:`PagedOrder` of ``seqused_k``'s batch, read by a decode step whose
    schedule takes the entries longest first instead of ranking them itself."""
    key = None
    if sinks is None and k_descale is None and v_descale is None:
        try:
            key = hot.warm_key("paged", (q, k_pages, v_pages, block_table, seqused_k), causal,
                               scale, window, softcap, max_k)
            plan = runtime.plan(key)
        except (AttributeError, TypeError):  # not torch tensors; an unhashable argument
            key = plan = None
        if plan is not None:
            out = plan.run(runtime, q, k_pages, v_pages, q.get_device(), None,
                           ranges=seqused_k, pages=block_table,
                           order=given_entries(order, seqused_k))
            if out is not None:
                return out  # else the plan's own checks failed: validation says why
    kv_dtype = check_paged(q, k_pages, v_pages, block_table, seqused_k, (k_descale, v_descale))
    entries = given_entries(order, seqused_k)
    check_call(scale, q, k_pages, v_pages)
    problem, longest = paged_problem(q, k_pages, block_table, causal, window, softcap, sinks,
                                     max_k, kv_dtype)
    logits = None if sinks is None else sink_logits(sinks, problem.heads_q, q, "torch")
    shape = dataclasses.replace(problem, batch=q.shape[0], seqlen_q=q.shape[2],
                                seqlen_k=longest)
    # the K and V factors (16-bit queries have none of their own)
    factors = (fp8_descales((k_descale, v_descale), shape, q, DESCALE_NAMES[1:]) if kv_dtype
               else ())
    small = regrouped(k_pages)
    if small:
        check_regroup(k_pages, block_table, longest)
    check_device(q)
    if small:  # the call over a copy in pages the kernels read
        k_pages, v_pages, block_table = regroup_pages(k_pages, v_pages, block_table, longest)
        key = None  # its plan reads the copy's pools, not these
    device = q.device.index
    arch = device_info(device).arch
    check_arch_dtype(arch, shape)
    family = reader(arch, shape)
    if family is None:  # a long query run over an FP8 cache: the forward reads 16-bit caches
        problem, shape = (dataclasses.replace(p, kv_dtype="") for p in (problem, shape))
        family = reader(arch, shape)
    if family.name == "forward":  # a long query run (chunked prefill)
        run = _long_query_run(runtime, family, problem, shape, q, k_pages, block_table, longest,
                              scale, factors)
        if key is not None and not factors:  # (as a decode step's plan, below)
            runtime.keep_plan(key, run)
        return run.run(runtime, q, k_pages, v_pages, device, None, ranges=seqused_k,
                       pages=block_table, sinks=logits, factors=factors)
    # a decode step: the split-KV kernels' kept plan
    plan = hot.kept_plan(runtime, "paged", family, shape, device, scale, BOTTOM_RIGHT, q,
                         k_pages, v_pages)
    out = plan.run(runtime, q, k_pages, v_pages, device, None, sinks=logits, ranges=seqused_k,
                   pages=block_table, descales=(None, *factors), order=entries)
    if out is None:
        raise InputValueError(f"k_pages and v_pages reach past the kernels' int32 indexing "
                              f"({tuple(k_pages.shape)}, strides {k_pages.stride()}); split the "
                              f"pool")
    if key is not None and not factors:  # an FP8 cache's factors (ones) are made per call
        runtime.keep_plan(key, plan)
    return out


def reader(arch: str, shape: Any) -> Any:
    """The family whose kernels read this paged call's pages (the first in dispatch order that
    reads pages and accepts it: the decode family for decode steps, else the forward, which may
    still copy them, ``reads_pages_with``)."""
    return next((f for f in serving("sdpa") if f.reads_pages and f.accepts(arch, shape)), None)


def check_call(scale: Any, q: Any, k_pages: Any, v_pages: Any) -> None:
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and 0 < scale < float("inf")):
        raise InputValueError(f"scale must be a finite positive number or None; got {scale!r}")
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k_pages, v_pages)):
        raise UnsupportedOperationError("a paged cache is for inference: it has no autograd "
                                        "(run the call under torch.no_grad())")
    # q too: a bucket's sequences may be fewer than the call's (``ragged_problem``)
    tile_d = padded_head_dim(k_pages.shape[-1])
    check_reach("k_pages", k_pages, "torch", tile_d)
    check_reach("q", q if q.dim() == 4 else packed_view(q), "torch", tile_d)


def key_layout(family: Any, problem: Any, schedule: Any, k_pages: Any, block_table: Any,
                longest: int, factors: tuple, packed: bool) -> tuple[bool, int, int]:
    """``(in place, key stride, key limit)`` of a long query run's keys: the pages themselves
    where ``family``'s kernel reads them in place under ``schedule`` (an entry's keys from 0,
    as many as its table's pages hold), else the copy (:func:`copy_read_pages`: an entry's
    slots hold its first ``longest`` keys, whole pages; packed, entry ``b``'s from ``b`` times
    that). Raises before any copy that would pass the kernels' int32 indexing."""
    if not factors and family.reads_pages_with(problem, schedule):
        return True, 0, block_table.shape[1] * k_pages.shape[1]
    check_copied(k_pages, block_table, longest)
    limit = copy_width(k_pages, block_table, longest) * k_pages.shape[1]
    return False, limit if packed else 0, limit


def _ranges(q: torch.Tensor, seqused_k: torch.Tensor, queries: Any, key_stride: int,
            key_limit: int) -> torch.Tensor:
    """The int32 ``[4, B]`` ranges of a paged call: each entry's queries (``q``'s ``S_q`` rows
    of its own batch entry, or ``queries``' packed rows ``queries[0, b]:queries[1, b]``) over
    its first ``seqused_k[b]`` keys, at most ``key_limit``, which start at ``b * key_stride``
    (packed keys copied from the pages; else 0)."""
    sequences = seqused_k.shape[0]
    ranges = torch.empty((4, sequences), dtype=torch.int32, device=q.device)
    if queries is None:
        ranges[:3].zero_()
        ranges[1].fill_(q.shape[2])
    else:
        ranges[0:2] = queries
    if key_stride:
        torch.arange(0, sequences * key_stride, key_stride, out=ranges[2])
        torch.add(ranges[2], seqused_k.clamp(max=key_limit), out=ranges[3])
    else:  # keys from 0
        if queries is not None:
            ranges[2].zero_()
        torch.clamp(seqused_k.to(torch.int32), max=key_limit, out=ranges[3])
    return ranges


class LongRun:
    """A long query run (chunked prefill) as its first call of one signature judged it: the
    forward ``family``, the call's ``problem`` and its bucket's ``schedule``, the longest
    cache, the scale and the keys' :func:`key_layout`. Kept by that signature
    (``core._plans.warm_key``) where the call has no sinks and no FP8 factors, so a repeat
    runs :func:`ragged_forward` with no validation, lookup or layout judged again; ``run``
    takes a decode plan's arguments (``ranges``: ``seqused_k``; ``pages``: the block table)."""

    __slots__ = ("family", "problem", "schedule", "longest", "scale", "layout")

    def __init__(self, family: Any, problem: Any, schedule: Any, longest: int, scale: Any,
                 layout: tuple) -> None:
        self.family, self.problem, self.schedule = family, problem, schedule
        self.longest, self.scale, self.layout = longest, scale, layout

    def run(self, runtime: Runtime, q, k_pages, v_pages, device: int, out: Any, *, ranges,
            pages, order: Any = None, sinks: Any = None, factors: tuple = ()) -> torch.Tensor:
        return ragged_forward(self.family, self.problem, self.schedule, q, k_pages, v_pages,
                              pages, ranges, self.longest, self.scale, sinks, factors,
                              layout=self.layout)


def _long_query_run(runtime: Runtime, family: Any, problem: Any, shape: Any, q, k_pages,
                    block_table, longest: int, scale: Any, factors: tuple) -> LongRun:
    """A paged call whose query runs are long (chunked prefill): its :class:`LongRun` on the
    forward family's ragged kernel with the schedule of its bucket without pages
    (``family.paged_lookup``)."""
    bucket = family.paged_lookup(problem, shape)
    schedule = runtime.resolution(family, bucket, q.device.index).schedule
    return LongRun(family, problem, schedule, longest, scale,
                   key_layout(family, problem, schedule, k_pages, block_table, longest,
                              factors, False))


def ragged_forward(family: Any, problem: Any, schedule: Any, q, k_pages, v_pages, block_table,
                   seqused_k, longest: int, scale: Any, logits: Any = None,
                   factors: tuple = (), queries: Any = None, longest_q: int | None = None,
                   out: Any = None, layout: tuple | None = None,
                   ranges: Any = None) -> torch.Tensor:
    """A long query run with ``schedule`` on the forward ``family``'s ragged kernel: reading the
    pages in place where ``family.reads_pages_with`` says so (a page holds a whole key tile, or
    half of one for few query rows), else the pages of the keys each entry's queries read copied
    into slots of its own first (:func:`copy_read_pages`: an entry with no queries copies none;
    an FP8 cache's widened into q's dtype by ``factors``, its float32 ``[B or 1, H_kv]`` K and V
    descales). Either way ``problem``'s mask holds: each entry's queries are the last of its
    keys, its causal mask and window aligned bottom-right. ``logits``: the float32 ``[H_q]``
    sink logits when ``problem.sinks``. ``q``: ``[B, H_q, S_q, D]``, or with ``queries`` packed
    sequences' queries ``[tokens, H_q, D]`` (sequence ``b``'s rows ``queries[0, b]:queries[1,
    b]``, at most ``longest_q``, end to end), whose output (``out``, else new and laid out as q
    is) has q's shape; rows outside the first sequence's start and the last one's end are zeros.
    A caller that wrote the launch's int32 ``[4, B]`` ``ranges`` itself passes them with the
    :func:`key_layout` they were written for (``layout``); else both are made here. The forward
    walks a work table of the query tiles the sequences have, heaviest first, whatever the grid
    of the longest's tiles would idle (a mixed step's bounds count its decode tokens: 0.93-1.01x
    that grid's GPU time, 0.96x on geometric mean, over six steps and three page sizes on an
    H100)."""
    packed = queries is not None
    in_place, stride, limit = layout or key_layout(family, problem, schedule, k_pages,
                                                   block_table, longest, factors, packed)
    if ranges is None:
        ranges = _ranges(q, seqused_k, queries, stride, limit)
    if in_place:
        k, v, launched, pages = k_pages, v_pages, problem, block_table
    else:
        k, v = copy_read_pages(k_pages, v_pages, block_table, ranges, longest, packed,
                               factors, q.dtype)
        # the same problem over contiguous caches
        launched, pages = dataclasses.replace(without_pages(problem), kv_dtype=""), None
    if out is None:  # laid out as q is: a view of packed rows costs no copy back
        out = torch.empty_like(q)
    stream = torch.cuda.current_stream(q.device)
    q_view, out_view = (packed_view(x) for x in (q, out)) if packed else (q, out)
    layout = RaggedLayout(ranges, longest_q if packed else q.shape[2], longest, packed, pages,
                          table=True)
    family.forward_with_lse(stream, q_view, k, v, out_view, None, launched, schedule,
                            default_scale(problem) if scale is None else float(scale),
                            q.device.index, sinks=logits, ragged=layout)
    if packed:
        clear_uncovered_rows(stream, out_view, ranges, 0)  # tokens of no sequence: zeros
    return out


def explain_paged(runtime: Runtime, q, k_pages, v_pages, block_table, seqused_k, *,
                  causal: Any = True, window: Any = None, softcap: Any = None,
                  sinks: Any = None, max_k: Optional[int] = None):
    """The :class:`Resolution` a paged call gets: a decode step's bucket's, on the split-KV
    kernels; a long query run's ragged bucket without pages, on the forward's kernel (reading
    the pages in place or copied; an FP8 cache's copied and dequantised)."""
    kv_dtype = check_paged(q, k_pages, v_pages, block_table, seqused_k)
    problem, longest = paged_problem(q, k_pages, block_table, causal, window, softcap, sinks,
                                     max_k, kv_dtype)
    if sinks is not None:
        sink_logits(sinks, problem.heads_q, q, "torch")
    if regrouped(k_pages):
        check_regroup(k_pages, block_table, longest)
    check_device(q)
    device = q.device.index
    arch = device_info(device).arch
    shape = dataclasses.replace(problem, batch=q.shape[0], seqlen_q=q.shape[2],
                                seqlen_k=longest)
    check_arch_dtype(arch, shape)
    family = reader(arch, shape)  # the forward reads every paged problem no other family does
    if family is None:  # a long query run over an FP8 cache: the forward's, dequantised
        problem, shape = (dataclasses.replace(p, kv_dtype="") for p in (problem, shape))
        family = reader(arch, shape)
    return runtime.resolution(family, family.paged_lookup(problem, shape), device)


def paged_attention(q: Any, k_pages: Any, v_pages: Any, block_table: Any, seqused_k: Any, *,
                    causal: Any = True, scale: Optional[float] = None, window: Any = None,
                    softcap: Optional[float] = None, sinks: Any = None,
                    max_k: Optional[int] = None, k_descale: Any = None,
                    v_descale: Any = None, order: Any = None) -> torch.Tensor:
    """``tiledattention.paged_attention`` (see there) on the process's runtime: the torch op
    while ``torch.compile`` traces (which takes no ``order``: each call ranks its entries
    where its schedule wants them ranked, a launch a CUDA graph replays without host time),
    the launch otherwise."""
    if torch.compiler.is_compiling():
        left, right = window if window is not None else (-1, -1)
        return paged_op(q, k_pages, v_pages, block_table, seqused_k, bool(causal), scale, left,
                        right, float(softcap or 0.0), sinks, max_k, k_descale, v_descale)
    return paged_forward(runtime(), q, k_pages, v_pages, block_table, seqused_k, causal=causal,
                         scale=scale, window=window, softcap=softcap, sinks=sinks, max_k=max_k,
                         k_descale=k_descale, v_descale=v_descale, order=order)


# -- torch.compile ------------------------------------------------------------------------------
@torch.library.custom_op(OP_NAME, mutates_args=())
def paged_op(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
             block_table: torch.Tensor, seqused_k: torch.Tensor, causal: bool,
             scale: Optional[float], window_left: int, window_right: int, softcap: float,
             sinks: Optional[torch.Tensor], max_k: Optional[int],
             k_descale: Optional[torch.Tensor] = None,
             v_descale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`paged_forward` as a torch op (``torch.compile`` traces it as one node)."""
    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    out = paged_forward(runtime(), q, k_pages, v_pages, block_table, seqused_k,
                        causal=BOTTOM_RIGHT if causal else False, scale=scale, window=window,
                        softcap=softcap or None, sinks=sinks, max_k=max_k,
                        k_descale=k_descale, v_descale=v_descale)
    return out.contiguous()  # the layout the fake promises (a long run's follows q's)


@paged_op.register_fake
def _paged_fake(q, k_pages, v_pages, block_table, seqused_k, causal, scale, window_left,
                window_right, softcap, sinks, max_k, k_descale=None, v_descale=None):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)
