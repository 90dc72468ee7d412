"""Pools of pages the kernels cannot read in place, copied into pages they can.

The kernels read a page a load at a time, so a page must hold a multiple of ``PAGE_ALIGN``
(16) keys. Serving engines also keep smaller pages (SGLang's token pool: pages of 1; vLLM and
TensorRT-LLM allow 8). A call over such a pool runs as the same call over pages of
:func:`regrouped_page_size` keys: each sequence's pages, in block-table order, copied end to end
into pages of its own, and a block table naming them. The copy is every sequence's first
``ceil(longest / page_size)`` pages (one read and one write of them, then the kernels' read);
it reads nothing on the host, so a CUDA graph or ``torch.compile`` holds it. Rows past a
sequence's keys are copies of whatever its table's slots name, never read (its keys end at its
``seqused_k``).
"""

from __future__ import annotations

import math
from typing import Any


from ..core._problem import INDEX_LIMIT, PAGE_ALIGN, padded_head_dim
from ..errors import UnsupportedProblemError

__all__ = ["regrouped", "regrouped_page_size", "check_copy", "check_regroup",
           "regroup_pages"]

#: the keys a regrouped page holds at least: a whole key tile a load
_TILE_KEYS = 256


def regrouped(k_pages: Any) -> bool:
    """Whether a call over this pool runs over a regrouped copy (its pages hold a number of
    keys the kernels cannot read in place)."""
    return k_pages.shape[1] % PAGE_ALIGN != 0


def regrouped_page_size(page_size: int) -> int:
    """The page size a pool of ``page_size``-key pages is regrouped into: a multiple of it and
    of 256 where that is at most 1024 keys (a whole key tile a load), else the least multiple
    of it and of 16."""
    if page_size % PAGE_ALIGN == 0:
        return page_size
    wide = math.lcm(page_size, _TILE_KEYS)
    return wide if wide <= 4 * _TILE_KEYS else math.lcm(page_size, PAGE_ALIGN)


def _shape(k_pages: Any, block_table: Any, longest: int) -> tuple[int, int, int]:
    """``(pages copied per sequence, regrouped pages per sequence, regrouped page size)``."""
    page = k_pages.shape[1]
    size = regrouped_page_size(page)
    width = min(block_table.shape[1], -(-longest // page))
    groups = -(-width * page // size)
    return groups * size // page, groups, size


def check_copy(pool: Any, sequences: int, keys: int, copy: str) -> None:
    """Raise before copying unless a copy of ``keys`` keys for each of ``sequences`` from
    ``pool``'s pages fits the kernels' int32 indexing; ``copy`` says in the message what the
    call copies (a batch whose longest cache sets every entry's share can pass it where the pool
    does not)."""
    elements = sequences * keys * pool.shape[2] * padded_head_dim(pool.shape[3])
    if elements > INDEX_LIMIT:
        raise UnsupportedProblemError(
            f"a call over pages of {pool.shape[1]} keys {copy}, {elements} elements, past the "
            f"kernels' int32 indexing ({INDEX_LIMIT}); split the batch, or pass max_k nearer "
            f"the longest seqused_k")


def check_regroup(k_pages: Any, block_table: Any, longest: int) -> None:
    """Raise before copying unless the regrouped pools fit the kernels' int32 indexing."""
    _, groups, size = _shape(k_pages, block_table, longest)
    check_copy(k_pages, block_table.shape[0], groups * size,
               f"(not a multiple of {PAGE_ALIGN}) runs over a copy in pages of {size}")


def regroup_pages(k_pages: Any, v_pages: Any, block_table: Any,
                  longest: int) -> tuple[Any, Any, Any]:
    """``(k_pages, v_pages, block_table)`` of the copy: pools ``[sequences * groups, size,
    H_kv, D]`` (``size`` :func:`regrouped_page_size`), sequence ``b``'s keys in pages ``b *
    groups ...``, and the int32 ``[sequences, groups]`` table naming them; its first ``longest``
    keys (whole pages) hold the original's."""
    import torch

    sequences, slots = block_table.shape
    copied, groups, size = _shape(k_pages, block_table, longest)
    width = min(slots, copied)
    ids = torch.zeros((sequences, copied), dtype=torch.long, device=block_table.device)
    ids[:, :width] = block_table[:, :width].clamp(0, k_pages.shape[0] - 1)
    ids = ids.flatten()
    pools = []
    for pool in (k_pages, v_pages):
        out = torch.empty((sequences * groups, size, *pool.shape[2:]), dtype=pool.dtype,
                          device=pool.device)
        torch.index_select(pool, 0, ids, out=out.view(-1, *pool.shape[1:]))
        pools.append(out)
    table = torch.arange(sequences * groups, dtype=torch.int32,
                         device=block_table.device).view(sequences, groups)
    return pools[0], pools[1], table
