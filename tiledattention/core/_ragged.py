"""Ragged batches: sequences of their own lengths in one call (``Problem.ragged``).

A ragged call reaches the kernels as a :class:`RaggedLayout`: an int32 ``[4, sequences]`` array
of query starts, query ends, key starts and key ends along the sequence axis, the longest
sequence's query and key counts (the grid's extent; the caller's word, as torch's
``varlen_attn`` takes ``max_q`` and ``max_k``), and whether the sequences lie end to end in one
batch entry (``packed``: ``[1, H, tokens, D]`` views of ``[tokens, H, D]`` tensors) or each in
an entry of its own (a padded batch); with a paged cache, the block table that maps each
sequence's keys to pages of the K/V pools. The kernels cut every array to each sequence's
range, so nothing is copied and nothing outside a sequence is read or written.

The problem a ragged call is looked up and compiled by is a bucket (:func:`ragged_problem`):
the longest lengths rounded up to powers of two and the number of such sequences the tokens
fill, so a training run's batches of one length profile share a key, a schedule and a kernel,
and the lookup's memo stays bounded whatever offsets each batch has.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from ._problem import INDEX_LIMIT, Problem, padded_head_dim, row_stat_rows

__all__ = ["RaggedLayout", "ragged_problem", "pow2_at_least", "packed_ranges",
           "packed_row_stat_length", "packed_row_stat", "packed_view", "without_pages"]


class RaggedLayout(NamedTuple):
    """What a ragged launch needs beyond the arrays (module docstring)."""

    ranges: Any  # int32 [4, sequences]: query starts, query ends, key starts, key ends
    longest_q: int  # at least every sequence's query count
    longest_k: int  # at least every sequence's key count
    packed: bool  # the sequences lie end to end in batch entry 0
    pages: Any = None  # a paged cache's int32 [sequences, max_pages] block table (K, V: pools)
    # a work table whatever the grid of the longest sequence's tiles would idle (a paged long
    # query run: its bounds count a mixed step's decode tokens, which hold no query tile)
    table: bool = False

    @property
    def sequences(self) -> int:
        return int(self.ranges.shape[1])


def pow2_at_least(n: int) -> int:
    """The least power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def ragged_problem(*, sequences: int, tokens_q: int, longest_q: int, longest_k: int,
                   heads_q: int, heads_kv: int, head_dim: int, dtype: str, causal: bool,
                   bottom_right: bool, window: tuple[int, int] = (-1, -1),
                   softcap: float = 0.0, sinks: bool = False, page_size: int = 0,
                   kv_dtype: str = "") -> Problem:
    """The bucketed :class:`Problem` of a ragged call (module docstring): ``seqlen_q`` and
    ``seqlen_k`` the longest counts rounded up to powers of two (capped at the int32 index
    limit), ``batch`` the number of such sequences ``tokens_q`` fills (rounded up to a power of
    two, at most ``sequences`` rounded likewise, halved while the bucket would pass the int32
    index range, :func:`_fitting`); ``page_size``: a paged cache's, exact;
    ``kv_dtype``: an FP8 cache's element type.
    Raises ``UnsupportedProblemError`` as :class:`Problem` does."""
    seqlen_q = min(pow2_at_least(longest_q), INDEX_LIMIT)
    seqlen_k = min(pow2_at_least(longest_k), INDEX_LIMIT)
    filled = pow2_at_least(-(-max(int(tokens_q), 1) // seqlen_q))
    batch = _fitting(max(1, min(filled, pow2_at_least(sequences))), heads_q * seqlen_q,
                     0 if page_size else heads_kv * seqlen_k, head_dim)
    left, right = window
    return Problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q,
                   seqlen_k=seqlen_k, head_dim=head_dim, dtype=dtype, causal=causal,
                   bottom_right=bottom_right and (causal or left >= 0 or right >= 0),
                   window_left=left, window_right=right, softcap=softcap, sinks=sinks,
                   ragged=True, page_size=page_size, kv_dtype=kv_dtype)


def _fitting(batch: int, rows_q: int, rows_k: int, head_dim: int) -> int:
    """``batch`` halved while ``batch`` entries of ``rows_q`` query rows (heads x length) or
    ``rows_k`` key rows would pass the kernels' int32 index range (:class:`Problem` checks it):
    a bucket is a lookup key, not the call's arrays (each call checks their reach)."""
    entry = max(rows_q, rows_k) * padded_head_dim(head_dim)
    while batch > 1 and batch * entry > INDEX_LIMIT:
        batch //= 2
    return batch


def without_pages(bucket: Problem) -> Problem:
    """A paged bucket as the same work over contiguous caches (the one a call that gathers its
    pages, or the forward's lookup, takes): no page size, and where its keys would pass the
    index range the pools exempted it from, fewer sequences (:func:`_fitting`)."""
    batch = _fitting(bucket.batch, bucket.heads_q * bucket.seqlen_q,
                     bucket.heads_kv * bucket.seqlen_k, bucket.head_dim)
    return dataclasses.replace(bucket, page_size=0, batch=batch)


def packed_ranges(cu_seq_q: Any, cu_seq_k: Any) -> Any:
    """The int32 ``[4, sequences]`` ranges of packed sequences from their cumulative offsets
    (``[sequences + 1]`` each), on their device, without a host round trip: each pair of rows
    copied from a (start, end) view of its offsets; where the queries' and keys' offsets are
    one tensor, all four rows are one view of it ([row pair, start or end, sequence]: strides
    0, 1, 1), copied in one op. Not ``torch.stack``: in a training loop on an H200 its ``cat``
    took 350 µs of host time a call (it waited for the GPU), the copies 85 µs less a step
    (``docs/records/benchmarks/varlen/issue50/README.md``)."""
    import torch

    sequences = cu_seq_q.shape[0] - 1
    if cu_seq_k is cu_seq_q:
        step = cu_seq_q.stride(0)
        pairs = cu_seq_q.as_strided((2, 2, sequences), (0, step, step))
        form = torch.contiguous_format
        copied = (pairs.clone(memory_format=form) if cu_seq_q.dtype == torch.int32
                  else pairs.to(torch.int32, memory_format=form))
        return copied.view(4, sequences)
    ranges = torch.empty((4, sequences), dtype=torch.int32, device=cu_seq_q.device)
    ranges[0:2] = cu_seq_q.unfold(0, 2, 1).t()
    ranges[2:4] = cu_seq_k.unfold(0, 2, 1).t()
    return ranges


def packed_row_stat_length(tokens: int) -> int:
    """The storage length of a packed call's per-row statistic: ``tokens`` rounded up to
    ``ROW_STAT_ALIGN`` (16-byte aligned rows, as ``row_stat_shape`` gives a rectangle's)."""
    return row_stat_rows(tokens)


def packed_row_stat(heads: int, tokens: int, device: Any) -> Any:
    """A float32 ``[1, heads, tokens]`` view of row-aligned storage (a packed call's
    log-sum-exp or delta)."""
    import torch

    store = torch.empty((1, heads, packed_row_stat_length(tokens)), dtype=torch.float32,
                        device=device)
    return store[:, :, :tokens]


def packed_view(x: Any) -> Any:
    """A packed ``[tokens, H, D]`` tensor as the kernels' ``[1, H, tokens, D]`` (a view: the
    strides of ``x.unsqueeze(0).transpose(1, 2)`` in one op, not two; a warm packed call makes
    eight)."""
    tokens, heads, dim = x.shape
    s_tokens, s_heads, s_dim = x.stride()
    return x.as_strided((1, heads, tokens, dim), (tokens * s_tokens, s_heads, s_tokens, s_dim))
