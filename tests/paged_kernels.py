"""What the paged routes' small cuTile kernels write, in torch (``_page_copy.copy_read_pages``,
``_mixed_tables.mixed_tables``): the references their GPU tests compare them with, and what
the CPU tests of the routes launch in their place."""

from __future__ import annotations

import torch


def read_pages_copy(k_pages, v_pages, block_table, ranges, keys, packed=False, factors=(),
                    dtype=None, fill=float("nan")):
    """``copy_read_pages``' two views, the slots it leaves unwritten holding ``fill``; with
    ``factors`` (float32 ``[B or 1, H_kv]``) the pages widened into ``dtype`` by them."""
    sequences, page = block_table.shape[0], k_pages.shape[1]
    width = min(block_table.shape[1], -(-keys // page))
    outs = []
    for i, pool in enumerate((k_pages, v_pages)):
        out = torch.full((sequences * width, *pool.shape[1:]), fill, dtype=torch.float32,
                         device=pool.device)
        for b in range(sequences):
            asked = int(ranges[1, b]) > int(ranges[0, b])
            pages = min(-(-int(ranges[3, b] - ranges[2, b]) // page), width) if asked else 0
            ids = block_table[b, :pages].long().clamp(0, pool.shape[0] - 1)
            got = pool[ids].float()
            if factors:
                got = got * factors[i][min(b, factors[i].shape[0] - 1)][None, None, :, None]
            out[b * width:b * width + pages] = got
        out = out.to(dtype if factors else pool.dtype)
        outs.append(out.view(1 if packed else sequences, -1, *pool.shape[2:]).transpose(1, 2))
    return tuple(outs)


def mixed_tables_reference(cu_seq_q, seqused_k, tokens, key_stride, key_limit, apart):
    """``mixed_tables``' ``MixedTables``."""
    from tiledattention.entry_points._mixed_tables import MixedTables

    starts, ends = cu_seq_q[:-1].int(), cu_seq_q[1:].int()
    counts = ends - starts
    key_starts = torch.arange(seqused_k.shape[0], device=seqused_k.device,
                              dtype=torch.int32) * key_stride
    longer = torch.where(counts > 1, ends, starts) if apart else ends
    ranges = torch.stack((starts, longer, key_starts,
                          key_starts + seqused_k.clamp(max=key_limit))).int()
    if not apart:
        return MixedTables(ranges, None, None)
    keys = torch.where(counts == 1, seqused_k, 0).int()
    rows = torch.stack((starts.clamp(max=max(tokens - 1, 0)),
                        torch.where(counts == 1, starts, tokens)))
    return MixedTables(ranges, keys, rows.long())
