"""A serving engine's mixed step over a paged K/V cache (``varlen_attn(..., block_table=,
seqused_k=)`` whose sequences have query counts of their own, ``cu_seq_q``: prefill chunks
beside decode tokens): its one-query sequences as a split-KV decode step
(``_paged.paged_forward``), the packed queries of the others on the forward family's ragged
kernel (``_paged.ragged_forward``: pages of a whole key tile read in place, or of half of one
for few query rows, smaller ones copied first, only the pages the chunks read), both launches'
index tables written by one small kernel (``_mixed_tables``). What a call's signature decides is
kept per signature. Nothing is read on the host: a step compiles
(``tiledattention::paged_varlen``) and captures in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import torch

from ..core import _plans as hot
from ..core._device import device_info
from ..core._dispatch import choose_family
from ..core._family import check_arch_dtype
from ..core._problem import BOTTOM_RIGHT, TOP_LEFT
from ..core._runtime import Runtime, runtime
from ..errors import InputTypeError, InputValueError
from ._mixed_tables import mixed_tables
from ._paged import (check_call, check_device, check_paged, key_layout, paged_forward,
                     paged_problem, ragged_forward, reader)
from ._regroup import check_regroup, regroup_pages, regrouped

__all__ = ["packed_paged_attention", "packed_paged_forward", "explain_packed_paged",
           "PACKED_OP_NAME"]

PACKED_OP_NAME = "tiledattention::paged_varlen"


def packed_paged_forward(runtime: Runtime, query, k_pages, v_pages, cu_seq_q, block_table,
                         seqused_k, max_q: int, max_k: int, *, causal: Any = True,
                         scale: Optional[float] = None, window: Any = None) -> torch.Tensor:
    """``varlen_attn(..., block_table=, seqused_k=)`` whose sequences have query counts of
    their own (a serving engine's mixed step: chunks of prefills beside decode tokens):
    ``query [T, H_q, D]`` packed, sequence ``b``'s rows ``cu_seq_q[b]:cu_seq_q[b + 1]`` (at
    most ``max_q``) the last positions of its ``seqused_k[b]`` keys (at most ``max_k``), which
    lie in the pages ``block_table[b]`` names. The output ``[T, H_q, D]``; rows of no sequence
    zeros. Nothing is read on the host.

    Where the family of a one-query paged step is another (the split-KV decode kernels), the
    sequences of one query run as such a step over every sequence's first query (two launches,
    their rows scattered into the output; the others read no key and their rows land in a
    spare row), and the forward's ragged kernel takes only the sequences of more (their packed
    queries, :func:`ragged_forward`, the schedule of the packed bucket without pages): a decode
    token's cache is split over CTAs there, where the forward walks it in one. Else the forward
    takes every sequence. One small kernel writes both launches' index tables from the offsets
    (:func:`mixed_tables`). An FP8 cache's pages are copied into q's dtype for the forward
    (``varlen_attn`` takes no descale factors: its values as they are)."""
    try:
        key = hot.warm_key("packed-paged", (query, k_pages, v_pages, cu_seq_q, block_table,
                                            seqused_k), max_q, max_k, causal, scale, window)
        route = runtime.plan(key)
    except (AttributeError, TypeError):  # not torch tensors; an unhashable argument
        key = route = None
    if route is None:
        route = _packed_route(runtime, query, k_pages, v_pages, cu_seq_q, block_table,
                              seqused_k, max_q, max_k, causal, scale, window)
        if key is not None:
            runtime.keep_plan(key, route)
    family, problem, schedule, longest, apart, forward, kv_dtype = route
    if regrouped(k_pages):  # the call over a copy in pages the kernels read
        k_pages, v_pages, block_table = regroup_pages(k_pages, v_pages, block_table, longest)
    tokens = query.shape[0]
    # an FP8 cache: copied and widened (unit factors)
    factors = tuple(torch.ones((1, k_pages.shape[2]), dtype=torch.float32, device=query.device)
                    for _ in range(2)) if kv_dtype and forward else ()
    # (in place, key stride, key limit) of the forward's keys; without it, any
    layout = key_layout(family, problem, schedule, k_pages, block_table, longest, factors,
                        True) if forward else (True, 0, longest)
    tables = mixed_tables(cu_seq_q, seqused_k, tokens, layout[1], layout[2], apart)
    if apart:  # the others read no key there; launched first: the GPU reads the caches
        # while the host prepares the forward's launches
        single = paged_forward(runtime, query.index_select(0, tables.rows[0]).unsqueeze(2),
                               k_pages, v_pages, block_table, tables.keys, causal=causal,
                               scale=scale, window=window, max_k=longest)
    # row `tokens`: where the one-query step's rows of other sequences land (without the
    # forward, whose clear zeros them, rows of no sequence are zeros from the start)
    make = torch.empty if forward else torch.zeros
    out = make((tokens + 1, *query.shape[1:]), dtype=query.dtype, device=query.device)
    if forward:
        ragged_forward(family, problem, schedule, query, k_pages, v_pages, block_table,
                       seqused_k, longest, scale, None, factors, tables.ranges[:2], max_q,
                       out[:tokens], layout=layout, ranges=tables.ranges)
    if apart:  # after the forward's clear of the rows it does not cover
        out.index_copy_(0, tables.rows[1], single[:, :, 0])
    return out[:tokens]


def explain_packed_paged(runtime: Runtime, query, k_pages, v_pages, cu_seq_q, block_table,
                         seqused_k, max_q: int, max_k: int, *, causal: Any = True,
                         window: Any = None):
    """The :class:`Resolution` :func:`packed_paged_forward` runs its sequences of more than
    one query with: the packed bucket's without pages, on the forward's kernel (reading the
    pages in place or copied). (Its one-query sequences run as a decode step of every
    sequence: ``explain_paged`` of a ``[N, H_q, 1, D]`` query says how.)"""
    return _packed_call(runtime, query, k_pages, v_pages, cu_seq_q, block_table, seqused_k,
                        max_q, max_k, causal, None, window)[2]


def _packed_call(runtime: Runtime, query, k_pages, v_pages, cu_seq_q, block_table, seqused_k,
                 max_q: int, max_k: int, causal: Any, scale: Any, window: Any) -> tuple:
    """Validate a packed call over pages (:func:`packed_paged_forward`); ``(family, problem,
    resolution, longest cache, the cache's element type)``."""
    kv_dtype = check_paged(query, k_pages, v_pages, block_table, seqused_k, packed=True,
                           names=("query", "key", "value"))
    _check_offsets(cu_seq_q, block_table.shape[0], query)
    check_call(scale, query, k_pages, v_pages)
    if causal == TOP_LEFT:
        raise InputValueError("varlen_attn over a paged cache takes each sequence's queries as "
                              "the last positions of its keys: is_causal=True aligns them "
                              "bottom-right; got is_causal='top_left'")
    problem, longest = paged_problem(query, k_pages, block_table, causal, window, None, None,
                                     max_k, longest_q=max_q)
    if regrouped(k_pages):
        check_regroup(k_pages, block_table, longest)
    check_device(query)
    device = query.device.index
    arch = device_info(device).arch
    check_arch_dtype(arch, problem)
    family = choose_family(arch, problem, "sdpa_with_lse")
    resolution = runtime.resolution(family, family.paged_lookup(problem, problem), device)
    return family, problem, resolution, longest, kv_dtype


class _PackedRoute(NamedTuple):
    """What a packed paged call's signature decides (:func:`_packed_route`), kept per
    signature (``core._plans.warm_key``) so a repeat runs no checks, problem or lookup:
    ``apart``, its one-query sequences on the decode step; ``forward``, a forward launch;
    ``kv_dtype``, an FP8 cache's element type (else ``""``)."""
    family: Any
    problem: Any
    schedule: Any
    longest: int
    apart: bool
    forward: bool
    kv_dtype: str


def _packed_route(runtime: Runtime, query, k_pages, v_pages, cu_seq_q, block_table, seqused_k,
                  max_q: int, max_k: int, causal: Any, scale: Any, window: Any) -> _PackedRoute:
    """Validate a packed call over pages and decide its launches (:class:`_PackedRoute`)."""
    family, problem, resolution, longest, kv_dtype = _packed_call(
        runtime, query, k_pages, v_pages, cu_seq_q, block_table, seqused_k, max_q, max_k,
        causal, scale, window)
    step = dataclasses.replace(problem, batch=block_table.shape[0], seqlen_q=1,
                               seqlen_k=longest)
    apart = reader(device_info(query.device.index).arch, step) is not family
    return _PackedRoute(family, problem, resolution.schedule, longest, apart,
                        max_q > 1 or not apart, kv_dtype)


def packed_paged_attention(query, k_pages, v_pages, cu_seq_q, block_table, seqused_k,
                           max_q: int, max_k: int, *, causal: Any = True,
                           scale: Optional[float] = None, window: Any = None) -> torch.Tensor:
    """:func:`packed_paged_forward` on the process's runtime: the torch op while
    ``torch.compile`` traces, the launch otherwise."""
    if torch.compiler.is_compiling():
        left, right = window if window is not None else (-1, -1)
        return packed_paged_op(query, k_pages, v_pages, cu_seq_q, block_table, seqused_k,
                               max_q, max_k, bool(causal), scale, left, right)
    return packed_paged_forward(runtime(), query, k_pages, v_pages, cu_seq_q, block_table,
                                seqused_k, max_q, max_k, causal=causal, scale=scale,
                                window=window)


def _check_offsets(cu_seq_q: Any, sequences: int, query: Any) -> None:
    """``cu_seq_q`` is an int32 (or int64) ``[sequences + 1]`` tensor on query's device."""
    if not isinstance(cu_seq_q, torch.Tensor):
        raise InputTypeError(f"cu_seq_q must be an int32 torch.Tensor [sequences + 1]; got "
                             f"{type(cu_seq_q).__name__}")
    if (cu_seq_q.dtype not in (torch.int32, torch.int64)
            or tuple(cu_seq_q.shape) != (sequences + 1,)):
        raise InputValueError(f"cu_seq_q must be an int32 tensor [sequences + 1] = "
                              f"[{sequences + 1}] (the block table's rows are the sequences); "
                              f"got {cu_seq_q.dtype} of shape {tuple(cu_seq_q.shape)}")
    if cu_seq_q.device != query.device:
        raise InputValueError(f"cu_seq_q must be on query's device {query.device}; got "
                              f"{cu_seq_q.device}")



# -- torch.compile ------------------------------------------------------------------------------
@torch.library.custom_op(PACKED_OP_NAME, mutates_args=())
def packed_paged_op(query: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                    cu_seq_q: torch.Tensor, block_table: torch.Tensor, seqused_k: torch.Tensor,
                    max_q: int, max_k: int, causal: bool, scale: Optional[float],
                    window_left: int, window_right: int) -> torch.Tensor:
    """:func:`packed_paged_forward` as a torch op (``torch.compile`` traces it as one node)."""
    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    return packed_paged_forward(runtime(), query, k_pages, v_pages, cu_seq_q, block_table,
                                seqused_k, max_q, max_k,
                                causal=BOTTOM_RIGHT if causal else False, scale=scale,
                                window=window)


@packed_paged_op.register_fake
def _packed_paged_fake(query, k_pages, v_pages, cu_seq_q, block_table, seqused_k, max_q, max_k,
                       causal, scale, window_left, window_right):
    return torch.empty(query.shape, dtype=query.dtype, device=query.device)
