"""Ragged batches: sequences of their own lengths in one call (``Problem.ragged``).

A ragged call reaches the kernels as a :class:`RaggedLayout`: an int32 ``[4, sequences]`` array
of query starts, query ends, key starts and key ends along the sequence axis, the longest
sequence's query and key counts (the grid's extent; the caller's word, as torch's
``varlen_attn`` takes ``max_q`` and ``max_k``), and whether the sequences lie end to end in one
batch entry (``packed``: ``[1, H, tokens, D]`` views of ``[tokens, H, D]`` tensors) or each in
an entry of its own (a padded batch). The kernels cut every array to each sequence's range, so
nothing is copied and nothing outside a sequence is read or written.

The problem a ragged call is looked up and compiled by is a bucket (:func:`ragged_problem`):
the longest lengths rounded up to powers of two and the number of such sequences the tokens
fill, so a training run's batches of one length profile share a key, a schedule and a kernel,
and the lookup's memo stays bounded whatever offsets each batch has.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._problem import INDEX_LIMIT, ROW_STAT_ALIGN, Problem

__all__ = ["RaggedLayout", "ragged_problem", "pow2_at_least", "packed_ranges",
           "packed_row_stat_length", "packed_row_stat", "work_items", "use_work_table",
           "work_table", "TABLE_MIN_IDLE_CTAS"]

#: A ragged forward walks a work table (:func:`work_table`) when the longest sequence's grid
#: would launch at least this many CTAs with nothing to do. Measured on an H100 (skewed batch of
#: 77 sequences, 64k tokens): the ~80k idle CTAs of that grid cost 0.8 ms, ~10 ns each, while
#: building a table costs a few tens of microseconds of small kernels.
TABLE_MIN_IDLE_CTAS = 8192


class RaggedLayout(NamedTuple):
    """What a ragged launch needs beyond the arrays (module docstring)."""

    ranges: Any  # int32 [4, sequences]: query starts, query ends, key starts, key ends
    longest_q: int  # at least every sequence's query count
    longest_k: int  # at least every sequence's key count
    packed: bool  # the sequences lie end to end in batch entry 0

    @property
    def sequences(self) -> int:
        return int(self.ranges.shape[1])


def pow2_at_least(n: int) -> int:
    """The least power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def ragged_problem(*, sequences: int, tokens_q: int, longest_q: int, longest_k: int,
                   heads_q: int, heads_kv: int, head_dim: int, dtype: str, causal: bool,
                   bottom_right: bool, window: tuple[int, int] = (-1, -1),
                   softcap: float = 0.0, sinks: bool = False) -> Problem:
    """The bucketed :class:`Problem` of a ragged call (module docstring): ``seqlen_q`` and
    ``seqlen_k`` the longest counts rounded up to powers of two (capped at the int32 index
    limit), ``batch`` the number of such sequences ``tokens_q`` fills (rounded up to a power of
    two, at most ``sequences`` rounded likewise). Raises ``UnsupportedProblemError`` as
    :class:`Problem` does."""
    seqlen_q = min(pow2_at_least(longest_q), INDEX_LIMIT)
    seqlen_k = min(pow2_at_least(longest_k), INDEX_LIMIT)
    filled = pow2_at_least(-(-max(int(tokens_q), 1) // seqlen_q))
    batch = max(1, min(filled, pow2_at_least(sequences)))
    left, right = window
    return Problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q,
                   seqlen_k=seqlen_k, head_dim=head_dim, dtype=dtype, causal=causal,
                   bottom_right=bottom_right and (causal or left >= 0 or right >= 0),
                   window_left=left, window_right=right, softcap=softcap, sinks=sinks,
                   ragged=True)


def packed_ranges(cu_seq_q: Any, cu_seq_k: Any) -> Any:
    """The int32 ``[4, sequences]`` ranges of packed sequences from their cumulative offsets
    (``[sequences + 1]`` each), on their device, without a host round trip."""
    import torch

    return torch.stack((cu_seq_q[:-1], cu_seq_q[1:], cu_seq_k[:-1], cu_seq_k[1:])).to(
        torch.int32).contiguous()


def packed_row_stat_length(tokens: int) -> int:
    """The storage length of a packed call's per-row statistic: ``tokens`` rounded up to
    ``ROW_STAT_ALIGN`` (16-byte aligned rows, as ``row_stat_shape`` gives a rectangle's)."""
    return -(-tokens // ROW_STAT_ALIGN) * ROW_STAT_ALIGN


def packed_row_stat(heads: int, tokens: int, device: Any) -> Any:
    """A float32 ``[1, heads, tokens]`` view of row-aligned storage (a packed call's
    log-sum-exp or delta)."""
    import torch

    store = torch.empty((1, heads, packed_row_stat_length(tokens)), dtype=torch.float32,
                        device=device)
    return store[:, :, :tokens]


def work_items(*, sequences: int, longest_q: int, rows_q: int, tile_m: int) -> int:
    """How many query tiles a ragged call's sequences can have at most: ``tile_m``-row tiles of
    ``sequences`` sequences of at most ``longest_q`` queries each, lying in ``rows_q`` query
    rows in all without overlapping (the caller's word, as ``longest_q`` is)."""
    per_sequence = -(-int(longest_q) // tile_m)
    partial = (int(rows_q) + sequences * (tile_m - 1)) // tile_m  # every sequence may end inside
    return max(1, min(sequences * per_sequence, partial))


def use_work_table(*, sequences: int, longest_q: int, items: int, heads: int,
                   tile_m: int) -> bool:
    """Whether a work table of ``items`` saves at least :data:`TABLE_MIN_IDLE_CTAS` of the CTAs
    that a grid of the longest sequence's tiles for every (sequence x head) launches."""
    grid = sequences * -(-int(longest_q) // tile_m)
    return (grid - items) * heads >= TABLE_MIN_IDLE_CTAS


def work_table(ranges: Any, tile_m: int, items: int) -> Any:
    """The int32 ``[2, items]`` work table of a ragged call (on the ranges' device and torch's
    current stream, without a host round trip): row 0 a sequence (-1 past the last item), row 1
    one of its ``tile_m``-row query tiles. The sequences with the most work (queries x keys)
    come first and each one's last tile first (a causal sequence's heaviest), so the longest
    jobs start early and a skewed batch does not end on one long sequence."""
    import torch

    q_len = (ranges[1] - ranges[0]).long()
    tiles = (q_len + (tile_m - 1)) // tile_m
    order = torch.argsort(q_len * (ranges[3] - ranges[2]).long(), descending=True, stable=True)
    ends = torch.cumsum(tiles[order], 0)  # items [ends[p] - tiles, ends[p]) are order[p]'s
    item = torch.arange(items, device=ranges.device)
    place = torch.searchsorted(ends, item, right=True).clamp_(max=ranges.shape[1] - 1)
    last = ends[place]
    sequence = torch.where(item < last, order[place], -1)
    return torch.stack((sequence, last - 1 - item)).to(torch.int32)
