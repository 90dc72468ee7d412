"""The copy of a paged cache that a long query run reads where its kernel cannot read the pages
in place (pages smaller than its key tile, or an FP8 cache, widened into the queries' dtype as
it is copied).

Each sequence ``b`` gets ``width`` slots of its own (``width``: the pages of the longest cache
the call names), its pages copied into them in block-table order, so the forward reads its keys
from ``b * width * page_size`` on. Only the pages holding keys the forward reads are copied:
a sequence's first ``ceil(keys / page_size)``, none for a sequence with no queries on that
kernel (a mixed step's decode tokens, which the decode kernels read in place). The copy's
bytes are the sequences' own, not every sequence's share of the longest. One launch that reads
nothing on the host, so a CUDA graph or ``torch.compile`` holds it; slots not copied are left
unwritten (the forward reads no key past a sequence's own).
"""

from __future__ import annotations

from typing import Any


from ..core import _aot
from ..core._device import device_info
from ..core._problem import padded_head_dim, page_tile
from ._regroup import check_copy

__all__ = ["copy_width", "check_copied", "copy_tile", "copy_read_pages", "compile_page_copy"]

#: the most elements one tile of the copy holds
COPY_TILE_ELEMENTS = 8192
#: CTAs the copy launches an SM, at most (they share out every sequence's pages)
CTAS_PER_SM = 8
#: sequences whose counts the copy reads at once
COPY_CHUNK = 128


def copy_width(pool: Any, block_table: Any, keys: int) -> int:
    """The slots a sequence gets: its block table's pages for ``keys`` keys."""
    return min(block_table.shape[1], -(-keys // pool.shape[1]))


def check_copied(pool: Any, block_table: Any, keys: int) -> None:
    """Raise before copying unless the copy (every sequence's slots for ``keys`` keys, whole
    pages) fits the kernels' int32 indexing."""
    width = copy_width(pool, block_table, keys)
    check_copy(pool, block_table.shape[0], width * pool.shape[1],
               f"(fewer than a key tile) copies each entry's first {width} pages first")


def copy_tile(page_size: int, heads: int, head_dim: int) -> tuple[int, int, int]:
    """``(rows, heads, columns)`` of the copy's tiles: a page's rows (a power of two dividing
    the page), its heads and its head dim rounded up to powers of two, at most
    :data:`COPY_TILE_ELEMENTS`."""
    columns = padded_head_dim(head_dim)
    head_tile = min(padded_head_dim(heads), max(1, COPY_TILE_ELEMENTS // columns))
    rows = min(page_tile(page_size), max(1, COPY_TILE_ELEMENTS // (head_tile * columns)))
    return rows, head_tile, columns


def copy_read_pages(k_pages: Any, v_pages: Any, block_table: Any,
                    ranges: Any, keys: int, packed: bool = False, factors: tuple = (),
                    dtype: Any = None) -> tuple[Any, Any]:
    """The copies of ``k_pages`` and ``v_pages`` (``[pages, page_size, H_kv, D]``) a ragged
    forward with ``ranges`` (int32 ``[4, B]``: query starts and ends, key starts and ends)
    reads, as ``[B, H_kv, width * page_size, D]`` views (``packed``: one ``[1, H_kv, B * width
    * page_size, D]`` view), ``width`` = :func:`copy_width` of ``keys``: sequence ``b``'s pages
    ``block_table[b, p]`` for ``p < ceil((ranges[3, b] - ranges[2, b]) / page_size)`` where
    ``ranges[1, b] > ranges[0, b]``; the other slots unwritten. An FP8 pool's ``factors``
    (its float32 K and V descales, ``[B or 1, H_kv]``) widen it into ``dtype`` as it is
    copied. Enqueued on the current stream."""
    import torch

    from ..core._page_kernel import copy_read_pages as kernel  # with cuda.tile, on first use

    sequences = block_table.shape[0]
    width = copy_width(k_pages, block_table, keys)
    outs = tuple(torch.empty((sequences * width, *pool.shape[1:]),
                             dtype=dtype if factors else pool.dtype, device=pool.device)
                 for pool in (k_pages, v_pages))
    if outs[0].numel():
        sms = device_info(k_pages.device.index).sm_count
        # without factors the kernel reads none: the ranges stand in
        _aot.launch(torch.cuda.current_stream(k_pages.device),
                    (min(sequences * width, CTAS_PER_SM * sms),), kernel,
                    (k_pages, v_pages, block_table, ranges, *outs,
                     *(factors or (ranges, ranges)), *copy_tile(*k_pages.shape[1:]),
                     bool(factors), COPY_CHUNK))
    entries = 1 if packed else sequences
    return tuple(out.view(entries, -1, *out.shape[2:]).transpose(1, 2) for out in outs)


def compile_page_copy(problem: Any, arch: str, pages: int = 64) -> None:
    """Compile (only) the copy a long query run of paged ``problem`` (``page_size``; with
    ``kv_dtype`` an FP8 pool widened into ``dtype`` by ``[B, H_kv]`` factors) launches on
    ``arch`` for a pool of contiguous pages (``tiledtune aot`` keeps it, under
    ``capturing``)."""
    from ..core._compile import array_constraint, export_cubin
    from ..core._page_kernel import copy_read_pages as kernel

    p = problem
    width = max(1, -(-p.seqlen_k // p.page_size))
    pool = array_constraint(p.kv_dtype or p.dtype, (pages, p.page_size, p.heads_kv, p.head_dim))
    out = array_constraint(p.dtype, (p.batch * width, p.page_size, p.heads_kv, p.head_dim))
    ranges = array_constraint("int32", (4, p.batch))
    factor = array_constraint("fp32", (p.batch, p.heads_kv)) if p.kv_dtype else ranges
    export_cubin(kernel, (pool, pool, array_constraint("int32", (p.batch, width)), ranges, out,
                          out, factor, factor, *copy_tile(p.page_size, p.heads_kv, p.head_dim),
                          bool(p.kv_dtype), COPY_CHUNK),
                 arch, "copy_read_pages")
