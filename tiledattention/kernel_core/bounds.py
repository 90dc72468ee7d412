"""Tile bounds (cuTile, plain integer arithmetic): which key tiles a query tile visits, and
which query tiles a key tile visits, under the causal mask of either alignment and under a
sliding window; of those, which need no mask.

Conventions, shared by every kernel: query row ``i`` sees keys ``0 .. i + offset`` under the
causal mask (``offset`` 0: top-left, torch's ``is_causal``; ``S_k - S_q``: bottom-right,
torch's ``causal_lower_right``), and with a window keys ``i + offset - left .. i + offset +
right``, a side that is :data:`~.numbers.UNBOUNDED` (-1) reaching past every key. A walk is
returned as tile indices ``[first, end)`` with an unmasked run inside it: only the tiles before
and after the run need the mask. The functions take scalars and return scalars, so the
launchers' tests call them with Python ints as well.

Each kernel keeps the arithmetic it was tuned with: two spellings of one bound compile to
different machine code (the forward's causal walk written as the dQ kernel's compiles to other
instructions on sm_90), and the shipped schedules were timed on the code they compile to (a
change here shows in ``tiledtune restamp``). So each kernel's walk is one function here, named
after the kernel: the forward and the dQ kernel walk key tiles of a query tile (by the causal
diagonal, or by a window's band), the dK/dV kernel query tiles of a key tile, the decode split
kernel its split's share of a query tile's key tiles.
"""

from __future__ import annotations

import cuda.tile as ct

from .numbers import FAR, bounded, reach

__all__ = ["forward_key_tiles", "forward_window_key_tiles", "dq_key_tiles",
           "dq_window_key_tiles", "dkdv_query_tiles", "dkdv_window_query_tiles",
           "decode_key_tiles"]


def forward_key_tiles(q_tile, offset, seqlen_k, TILE_M, TILE_N, CAUSAL, BOTTOM_RIGHT):
    """The forward's walk without a window: ``(end, mask_from)``, the key tiles ``[0, end)``
    that query tile ``q_tile``'s rows see, of which tiles from ``mask_from`` on cross the
    diagonal (``CAUSAL``) or the end of the keys and need the mask."""
    if CAUSAL:
        if BOTTOM_RIGHT:
            # keys the tile's last row sees, and the full key tiles its first row sees; both
            # clamped at 0 before dividing (no floor division of negative numbers)
            last_key = max(min((q_tile + 1) * TILE_M + offset, seqlen_k), 0)
            end = ct.cdiv(last_key, TILE_N)
            mask_from = min(max(q_tile * TILE_M + offset + 1, 0) // TILE_N, seqlen_k // TILE_N)
        else:
            last_key = min((q_tile + 1) * TILE_M, seqlen_k)
            end = ct.cdiv(last_key, TILE_N)
            # first key tile that crosses the diagonal (or the end of the keys)
            mask_from = min((q_tile * TILE_M) // TILE_N, seqlen_k // TILE_N)
    else:
        end = ct.cdiv(seqlen_k, TILE_N)
        mask_from = seqlen_k // TILE_N
    return end, mask_from


def forward_window_key_tiles(first_row, seqlen_k, window_left, window_right, TILE_M, TILE_N,
                             CAUSAL):
    """The forward's walk under a window: ``(first, unmasked_lo, unmasked_hi, end)``, visiting
    ``[first, end)``, of which ``[unmasked_lo, unmasked_hi)`` (possibly empty) lie inside every
    row's window and before ``S_k``. ``first_row`` is the tile's first row plus the offset; the
    tile's rows reach ``TILE_M - 1`` further. Row ``r`` sees keys ``r - window_left``
    (where :func:`~.numbers.bounded`) to ``r`` (``CAUSAL``) or ``r + window_right``, within
    ``[0, S_k)``."""
    last_row = first_row + (TILE_M - 1)
    lo_key = 0  # the first key any row of the tile sees
    mask_lo = 0  # the first key tile that every row sees from its start on
    if bounded(window_left):
        lo_key = max(first_row - window_left, 0)
        mask_lo = (max(last_row - window_left, 0) + TILE_N - 1) // TILE_N
    full_tiles = seqlen_k // TILE_N  # key tiles that end before S_k
    if CAUSAL:
        hi_key = min(last_row + 1, seqlen_k)  # one past the last key any row sees
        mask_hi = min(max(first_row + 1, 0) // TILE_N, full_tiles)
    else:
        hi_key = seqlen_k
        mask_hi = full_tiles
        if bounded(window_right):
            hi_key = min(last_row + window_right + 1, seqlen_k)
            mask_hi = min(max(first_row + window_right + 1, 0) // TILE_N, full_tiles)
    first = lo_key // TILE_N
    end = max((max(hi_key, 0) + TILE_N - 1) // TILE_N, first)
    if hi_key <= lo_key:  # no row of the tile sees a key
        end = first
    # the unmasked run, clamped into the visited tiles
    unmasked_lo = min(max(mask_lo, first), end)
    unmasked_hi = max(min(mask_hi, end), unmasked_lo)
    return first, unmasked_lo, unmasked_hi, end



def dq_key_tiles(first_row, offset, seqlen_k, TILE_M, TILE_N, CAUSAL):
    """The dQ kernel's walk without a window: ``(end, unmasked)``, the key tiles ``[0, end)``
    that rows ``first_row .. first_row + TILE_M - 1`` see, of which ``[0, unmasked)`` need no
    mask."""
    if CAUSAL:
        end = ct.cdiv(max(min(first_row + TILE_M + offset, seqlen_k), 0), TILE_N)
        # the first key tile past the first row's diagonal (or the ragged end) needs the mask
        mask_from = min(max(first_row + offset + 1, 0) // TILE_N, seqlen_k // TILE_N)
    else:
        end = ct.cdiv(seqlen_k, TILE_N)
        mask_from = seqlen_k // TILE_N
    return end, min(mask_from, end)


def dq_window_key_tiles(first_row, last_row, offset, left, right, seqlen_k, TILE_N):
    """The dQ kernel's walk under a window: ``(lo, full_from, full_to, hi)``; the key tiles
    ``[lo, hi)`` hold every key that rows ``first_row..last_row`` (``< S_q``) see through the
    window (``left``, ``right``: :func:`~.numbers.reach` of its sides); tiles ``[full_from,
    full_to)`` (within it) are seen whole by each of those rows and end before ``S_k``: only
    the tiles before and after them need the mask."""
    first_key = max(first_row + offset - left, 0)
    end_key = min(last_row + offset + right + 1, seqlen_k)
    lo = first_key // TILE_N
    hi = lo
    if end_key > first_key:
        hi = ct.cdiv(end_key, TILE_N)
    full_from = min(max(ct.cdiv(max(last_row + offset - left, 0), TILE_N), lo), hi)
    full_to = min(max(min(max(first_row + offset + right + 1, 0) // TILE_N, seqlen_k // TILE_N),
                      full_from), hi)
    return lo, full_from, full_to, hi


def dkdv_query_tiles(first_key, offset, num_q_tiles, TILE_M, TILE_N):
    """The dK/dV kernel's walk under the causal mask: ``(first, unmask_from)``; rows before
    ``first_key - offset`` see none of keys ``first_key .. first_key + TILE_N - 1``, and from
    row ``first_key + TILE_N - 1 - offset`` on a row sees all of them: the query tiles before
    ``first`` are skipped, those in ``[first, unmask_from)`` masked."""
    first = min(max(first_key - offset, 0) // TILE_M, num_q_tiles)
    unmask_from = max(min(ct.cdiv(max(first_key + TILE_N - 1 - offset, 0), TILE_M),
                          num_q_tiles), first)
    return first, unmask_from


def dkdv_window_query_tiles(first_key, last_key, offset, left, right, seqlen_q, TILE_M):
    """The dK/dV kernel's walk under a window: ``(first, full_from, full_to, end)``; the query
    tiles ``[first, end)`` hold every row that sees one of keys ``first_key..last_key`` (``<
    S_k``) through the window (``left``, ``right``); in tiles ``[full_from, full_to)`` (within
    it) every row sees all of those keys: only the tiles before and after them need the
    mask."""
    first_row = max(first_key - offset - right, 0)
    end_row = min(last_key - offset + left + 1, seqlen_q)
    first = min(first_row // TILE_M, ct.cdiv(seqlen_q, TILE_M))
    end = first
    if end_row > first_row:
        end = ct.cdiv(end_row, TILE_M)
    full_from = min(max(ct.cdiv(max(last_key - offset - right, 0), TILE_M), first), end)
    full_to = min(max(max(first_key - offset + left + 1, 0) // TILE_M, full_from), end)
    return first, full_from, full_to, end

def decode_key_tiles(first_pos, seqlen_q, seqlen_k, offset, window_left, window_right, split,
                    splits, TILE_S, TILE_N, WINDOW, CAUSAL, *, BALANCED=False, share_keys=0):
    """The decode split kernel's walk: ``(lo_shift, hi_shift, start, unmask_from, mask_from,
    stop)``. Query positions ``first_pos .. first_pos + TILE_S - 1`` (those ``< S_q``) see the
    key tiles ``[first, end)``; split ``split`` of ``splits`` walks its contiguous share
    ``[start, stop)`` of them. With ``WINDOW`` position ``i`` keeps keys ``i + lo_shift .. i +
    hi_shift`` (the causal bound folded into ``hi_shift``; an unbounded side reaches
    :data:`~.numbers.FAR`), and the tiles ``[unmask_from, mask_from)`` are seen whole by every
    real position; without it the tiles ``[start, mask_from)`` are (``unmask_from`` is then
    ``start``). The tiles after ``mask_from`` (and, with ``WINDOW``, before ``unmask_from``)
    need the mask. ``BALANCED`` (no ``WINDOW``): each share is ``1 / splits`` of the key tiles
    of ``share_keys`` keys (a ragged batch's longest entry) where that is more than this row's
    own share, so a shorter entry's later splits are empty and the splits stream alike."""
    # the keys this tile's rows can see: all, or up to the last real row's diagonal
    kv_end = seqlen_k
    mask_from_key = seqlen_k - seqlen_k % TILE_N  # key tiles from here on need the end mask
    lo_shift = 0
    hi_shift = 0
    if WINDOW:
        # row i keeps keys i + lo_shift .. i + hi_shift
        reach_left = reach(window_left, far=FAR)
        reach_right = reach(window_right, far=FAR)
        if CAUSAL:
            reach_right = min(reach_right, 0)
        lo_shift = offset - reach_left
        hi_shift = offset + reach_right
        last_pos = min(first_pos + TILE_S, seqlen_q) - 1
        # the union of the real rows' keys: from the first row's first to the last row's last
        kv_start = max(min(first_pos + lo_shift, seqlen_k), 0)
        kv_end = max(min(seqlen_k, last_pos + hi_shift + 1), 0)
        first_tile = kv_start // TILE_N
        num_tiles = ct.cdiv(kv_end, TILE_N) - first_tile
        if kv_end <= kv_start:
            num_tiles = 0
        per_split = ct.cdiv(num_tiles, splits)
        start = first_tile + min(split * per_split, num_tiles)
        stop = min(start + per_split, first_tile + num_tiles)
        # tiles every real row sees whole: from the last row's first key to the first row's
        # last key (and short of a partial last tile); the tiles before and after are masked
        unmasked_key = max(last_pos + lo_shift, 0)
        mask_from_key = max(min(mask_from_key, first_pos + hi_shift + 1), 0)
        unmask_from = max(min(ct.cdiv(unmasked_key, TILE_N), stop), start)
        mask_from = max(min(mask_from_key // TILE_N, stop), unmask_from)
    else:
        if CAUSAL:
            last_pos = min(first_pos + TILE_S, seqlen_q) - 1
            kv_end = max(min(seqlen_k, last_pos + offset + 1), 0)
            mask_from_key = max(min(mask_from_key, first_pos + offset + 1), 0)
        num_tiles = ct.cdiv(kv_end, TILE_N)
        per_split = ct.cdiv(num_tiles, splits)
        if BALANCED:  # at least the row's own share: every tile is walked whatever the hint
            per_split = max(ct.cdiv(ct.cdiv(share_keys, TILE_N), splits), per_split)
        start = min(split * per_split, num_tiles)
        stop = min(start + per_split, num_tiles)
        unmask_from = start
        mask_from = max(min(mask_from_key // TILE_N, stop), start)
    return lo_shift, hi_shift, start, unmask_from, mask_from, stop
