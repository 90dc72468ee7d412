"""What ``entry_points._page_copy.copy_read_pages`` (a cuTile kernel) writes, in torch: the
reference its GPU test compares the kernel with, and what the CPU tests of the paged routes
launch in its place."""

from __future__ import annotations

import torch


def read_pages_copy(k_pages, v_pages, block_table, ranges, keys, packed=False,
                    fill=float("nan")):
    """``copy_read_pages``' two views, the slots it leaves unwritten holding ``fill``."""
    sequences, page = block_table.shape[0], k_pages.shape[1]
    width = min(block_table.shape[1], -(-keys // page))
    outs = []
    for pool in (k_pages, v_pages):
        out = torch.full((sequences * width, *pool.shape[1:]), fill, dtype=torch.float32,
                         device=pool.device).to(pool.dtype)
        for b in range(sequences):
            asked = int(ranges[1, b]) > int(ranges[0, b])
            pages = min(-(-int(ranges[3, b] - ranges[2, b]) // page), width) if asked else 0
            ids = block_table[b, :pages].long().clamp(0, pool.shape[0] - 1)
            out[b * width:b * width + pages] = pool[ids]
        outs.append(out.view(1 if packed else sequences, -1, *pool.shape[2:]).transpose(1, 2))
    return tuple(outs)
