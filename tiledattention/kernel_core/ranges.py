"""Kernel helpers (cuTile) that cut one sequence out of an array by a ragged call's range
table (``Problem.ragged``: an int32 ``[4, sequences]`` array of query starts, query ends, key
starts and key ends along the sequence axis) or read its rows from the uncut array
(:func:`rows_view`), and that load a sequence's keys from a paged cache
(``Problem.page_size``). The forward, backward and decode kernels call them under their
``RAGGED`` / ``PAGED`` constants; their families count this module in their template
identity."""

from __future__ import annotations

import cuda.tile as ct


def sequence_of(batch, PACKED):
    """``(sequence, batch entry)`` of a ragged call's grid batch index ``batch``: the index is
    the sequence's, and its arrays' batch entry is that too, or 0 with ``PACKED`` (the
    sequences lie end to end in one ``[1, H, tokens, D]`` view)."""
    entry = batch
    if PACKED:
        entry = 0
    return batch, entry


def sequence_view(A, Ranges, seq, which):
    """``A`` (``[B, H, S, ...]``) cut along its sequence axis to sequence ``seq``'s range,
    ``Ranges[which:which + 2, seq]`` = ``[start, end)``; an empty range stays empty even where
    it starts at the end of ``A`` (a slice must start inside the array)."""
    start = ct.gather(Ranges, (which, seq))
    length = ct.gather(Ranges, (which + 1, seq)) - start
    start = min(start, A.shape[2] - 1)
    return A.slice(axis=2, start=start, stop=start + length)


def sequence_view_at_least(A, Ranges, seq, which, at_least=0):
    """:func:`sequence_view`, holding at least ``at_least`` rows (clipped to ``A``): a view
    that loads read but nothing stores to, whose rows past the range are never used (a load
    from an empty view faults)."""
    start = ct.gather(Ranges, (which, seq))
    length = max(ct.gather(Ranges, (which + 1, seq)) - start, at_least)
    start = min(start, A.shape[2] - 1)
    return A.slice(axis=2, start=start, stop=min(start + length, A.shape[2]))


def sequence_start(Ranges, seq, which, rows):
    """Sequence ``seq``'s first row, ``Ranges[which, seq]``, held below ``rows`` (its array's
    length): a tile read from there starts inside the array even for an empty sequence at its
    end (a load wholly outside is undefined)."""
    return min(ct.gather(Ranges, (which, seq)), rows - 1)


def rows_view(A, heads, rows, width, head_step=None):
    """``A [B, H, S, D]`` as tiles ``[1, heads, rows, width]`` (zero-filled past ``A``) indexed
    by row along ``S`` (by tile along the other axes; ``head_step``: tile ``i`` of the head axis
    starts at head ``i * head_step``, not ``i * heads``): a ragged call loads a sequence's tile
    from its first row on through the array's own TMA descriptor, the launch's (a slice read
    by TMA has every CTA build a descriptor of its own, microseconds a CTA). Its rows past
    the sequence are another sequence's, or never written (NaN)."""
    return A.tiled_view((1, heads, rows, width), padding_mode=ct.PaddingMode.ZERO,
                        traversal_steps=(1, ct.static_eval(head_step or heads), 1, width))


def sequence_length(Ranges, seq, which):
    """Sequence ``seq``'s length in ``Ranges`` (rows ``which``, ``which + 1``)."""
    return ct.gather(Ranges, (which + 1, seq)) - ct.gather(Ranges, (which, seq))


def page_number(Pages, seq, key, page_size):
    """The pool page that holds sequence ``seq``'s key ``key`` (``Pages[seq, key //
    page_size]``; -1 past the block table's pages)."""
    return ct.gather(Pages, (seq, key // page_size), padding_value=-1)


def page_load(A, page, key, kv_head, part, PAGE_ROWS, width, latency, PAD, page_size):
    """Keys ``key ..`` (``PAGE_ROWS`` of them, within one page; head-dim columns ``part *
    width`` on) of page ``page`` of ``A``, a ``[pages, page_size, H_kv, D]`` pool, as a
    ``[PAGE_ROWS, width]`` tile; a page of -1 loads as ``PAD``'s fill. ``page_size``: ``A``'s
    pages' keys, a kernel constant (a key's row in its page by a mask, not a division)."""
    return ct.load(A, index=(page, key % page_size // PAGE_ROWS, kv_head, part),
                   shape=(1, PAGE_ROWS, 1, width), padding_mode=PAD,
                   latency=ct.static_eval(latency or None)).reshape((PAGE_ROWS, width))


def page_rows(A, Pages, seq, kv_head, j, part, TILE_N, PAGE_ROWS, width, latency, PAD,
              page_size):
    """Keys ``j * TILE_N ..`` (head-dim columns ``part * width`` on) of sequence ``seq``'s
    paged cache, ``A`` a ``[pages, page_size, H_kv, D]`` pool, as a ``[TILE_N, width]`` tile:
    ``TILE_N / PAGE_ROWS`` loads of ``PAGE_ROWS`` keys (``PAGE_ROWS`` divides the page size),
    each from the page ``Pages[seq]`` names for it, joined pairwise. A key past the block
    table's pages loads as ``PAD``'s fill. ``page_size``: a constant (``A.shape[1]``), so a
    key's page and row cost shifts, not divisions."""
    parts = ()
    for i in ct.static_iter(range(TILE_N // PAGE_ROWS)):
        key = j * TILE_N + i * PAGE_ROWS
        page = page_number(Pages, seq, key, page_size)
        parts += (page_load(A, page, key, kv_head, part, PAGE_ROWS, width, latency, PAD,
                            page_size),)
    for level in ct.static_iter(range((TILE_N // PAGE_ROWS).bit_length() - 1)):
        joined = ()
        for i in ct.static_iter(range(len(parts) // 2)):
            joined += (ct.cat((parts[2 * i], parts[2 * i + 1]), 0),)
        parts = joined
    return parts[0]
