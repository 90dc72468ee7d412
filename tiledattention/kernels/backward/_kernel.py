"""The backward-pass kernel templates (cuTile): a dQ kernel, a dK/dV kernel and a partials' sum;
for the one-pass backward a delta kernel and a dQ-scale kernel.

With ``S = scale * Q K^T``, ``P = softmax(S)`` and the forward's per-row log-sum-exp ``L``
(base 2, stored by ``attention_fwd`` with ``STORE_LSE``), the gradients are

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   dQ = scale * dS K,   dK = scale * dS^T Q

with ``delta_i = sum_d dO_i,d * O_i,d``. Neither kernel materialises ``S`` or ``P``: each
recomputes its tiles of ``P = 2^(s * scale * log2(e) - L)`` from Q, K and ``L``.

- ``attention_bwd_dq`` (grid: query tiles x (batch x query head)) first computes its rows'
  ``delta`` from O and dO and stores it (the preprocess step, fused), then walks the key tiles
  its rows see and accumulates ``dQ`` in float32 registers. It runs first. With
  ``HEAVY_FIRST`` (causal) the grid's first CTAs take the last query tiles, which see the most
  keys, so that the short tiles fill the tail of the launch. With ``PACK`` > 1 (the schedule's
  ``dq_pack_gqa``) a CTA's tile holds ``TILE_M / PACK`` positions of every query head of one
  K/V group (grid: position tiles x (batch x K/V group)), so each K/V tile it loads serves the
  whole group and a short sequence fills its tile with heads instead of padding.
- ``attention_bwd_dkdv`` (grid: key tiles x (batch x K/V head) x splits) holds one
  ``[TILE_N, D]`` tile of K and V and walks the query tiles that see it, for *every query head
  of the group*: grouped- and multi-query attention reduce dK and dV over the group in
  registers, without expanding K/V. With ``SPLITS > 1`` that walk (query heads x query tiles)
  is shared by ``SPLITS`` CTAs, each storing float32 partials that ``attention_bwd_sum`` adds
  in a fixed order: more CTAs where key tiles x K/V heads would leave SMs idle (multi-query
  heads, batch 1).

With ``TILE_MAJOR`` both grids put the tile axis last (slowest): every (batch, head) CTA of
the first tile launches before any of the second, so that with a causal mask the longest walks
(the dK/dV kernel's first key tiles, the dQ kernel's last query tiles with ``HEAVY_FIRST``) all
start in the first waves, not head by head.

All of that is deterministic: no atomics, and partials added in a fixed order.

The one-pass backward (``DQ_ATOMIC``; FlashAttention-3/4's) runs no dQ kernel: the dK/dV
kernel's walk already has each (query tile, key tile) pair's ``dS``, so it also computes that
pair's share of dQ, ``dS K`` (5 matrix products a pair instead of the two kernels' 7), and adds
it into a float32 ``[B, H_q, S_q, D]`` accumulator with a tiled view's ``atomic_store_add``,
which on sm_90 is a TMA bulk reduce-add (``UTMAREDG``). ``attention_bwd_delta`` computes
``delta`` and zeroes the accumulator before, ``attention_bwd_dq_scale`` scales and casts it
after. The additions' order varies run to run, and so may dQ's last bits.

The variants' launch-time values (``window_left``, ``window_right``, ``softcap``, ``Ranges``)
come after the others and are read only under their constants (``WINDOW``, ``SOFTCAP``,
``RAGGED``): plain attention passes each a zero-byte placeholder, so its parameter space, and
its machine code, are those of the kernels before the variants existed (more launch-time bytes
move other constant-bank data on sm_100 and sm_12x).

``Ranges`` (read with ``RAGGED``) is a ragged batch, whose sequences have lengths of their own.
Its rows are int32 ``[4, sequences]`` query starts, query ends, key starts and key ends along
the sequence axis; the grid's batch index is a sequence's, whose query range (Q, Out, dO, dQ,
Lse, Delta) or key range (K, V, dK, dV) the kernels read by row from the uncut arrays (``BY_ROW``:
the launch's TMA descriptors) and store to through cuts (``Array.slice`` along axis 2, without
TMA), so that lengths, masks, the bottom-right alignment and windows are the sequence's own; the
one tile of a walk that runs past its sequence reads the cuts (zero-filled past it). A CTA
whose tile starts at or past its sequence's end writes nothing (the dK/dV kernel skips the tile
whole; the dQ kernel walks no key tile and skips its stores, since a branch around its walk
does not compile for sm_100). With ``WORK_TABLE`` (what a ragged call
launches) the grid is 1-D over (work item x head) instead of the longest sequence's tiles for
every sequence: ``Work`` lists only the tiles the sequences have, heaviest first (query tiles
for the dQ kernel, key tiles for the dK/dV kernel; ``tiledattention.core._work_table``). With
``PACKED`` the sequences lie end to end in batch entry 0 (``[1, H, tokens, D]`` views of
``[tokens, H, D]`` tensors); else each is a batch entry of its own (a padded batch). Rows and
keys outside every sequence are never written.

Masking is the forward's: keys at or past ``S_k`` never count; with ``CAUSAL`` query row ``i``
sees keys ``0..i + offset`` (offset 0, or ``S_k - S_q`` with ``BOTTOM_RIGHT``). With ``WINDOW``
(a sliding window; ``window_left``, ``window_right``: -1, ``UNBOUNDED``, for an unbounded
side) row ``i`` sees keys ``i + offset - window_left .. i + offset + window_right`` only, and
both kernels walk only
the tiles of that band, masking its partial tiles at either end. With ``SOFTCAP`` (``c =
softcap``) the score is ``s = c * tanh(scale * q.k / c)`` and ``dS`` is multiplied by
``1 - (s / c)^2`` before the dQ and dK products. Attention sinks change nothing here: the
forward's ``L`` holds the sink's term, and the sink's own gradient is the caller's. A row that
saw no key has ``L = +inf`` (without sinks): its ``P`` and gradients are 0. Rows and keys past
the ends load as zeros (``L`` and ``delta`` too), which makes their contributions exactly 0;
stores clip them.
A head dim that is not a power of two is padded to one (``TILE_D``; loads zero-fill the
columns past ``D``, stores clip them), or with ``TILE_D2`` (the schedule's ``split_d``) runs
as two power-of-two parts, ``TILE_D`` columns and ``TILE_D2`` more (96 = 64 + 32): Q, K, V and
dO are loaded as two tiles each, the scores and dP sum two products, and dQ, dK and dV keep an
accumulator per part (the forward's ``TILE_D2``). Every UPPER_CASE parameter is a compile-time
constant (``_launch``).
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from ...kernel_core.bounds import (dkdv_query_tiles, dkdv_window_query_tiles, dq_key_tiles,
                                   dq_window_key_tiles)
from ...kernel_core.numbers import LOG2_E, reach
from ...kernel_core.ranges import (rows_view, sequence_length, sequence_of, sequence_start,
                                   sequence_view_at_least)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


# The row helpers take ``heads``: 1, or (the dQ kernel's ``PACK``) the query heads of one K/V
# group, whose ``rows`` rows each form one ``[heads * rows, ...]`` tile, head-major; ``head``
# is then the head axis' tile index (the group's), its heads ``heads`` apart. The loads and
# stores take ``how``, how a tile's rows ``tile * rows ..`` are found:
#: by tile index (plain attention; a ragged call's tile that runs past its sequence, from the
#: sequence's slice: zero-filled past it, at the cost of a TMA descriptor the CTA builds)
TILED = 0
#: (a ragged call's loads) rows ``first + tile * rows ..`` of the uncut array, ``first`` the
#: sequence's first row, through a view indexed by row: the array's own TMA descriptor (a
#: slice read by TMA has every CTA build one of its own, microseconds a CTA). Rows past the
#: sequence are another sequence's, or never written (NaN): the kernels read those from slices
BY_ROW = 1
#: (a ragged call's stores) by tile index into the sequence's slice, without TMA: clipped to the
#: sequence, no descriptor built
CUT = 2


def _load_part(A, batch, head, tile, part, rows, latency, heads, first, how, width):
    """Rows ``tile * rows ..`` of ``A [B, H, S, D]`` (found as ``how`` says), head-dim columns
    ``part * width ..``, as a ``[heads * rows, width]`` tile (zero-filled; ``latency``: the
    load's hint, 0 for the compiler's)."""
    hint = ct.static_eval(latency or None)
    if how == BY_ROW:
        x = rows_view(A, heads, rows, width).load((batch, head, first + tile * rows, part),
                                                  latency=hint)
    else:
        x = ct.load(A, index=(batch, head, tile, part), shape=(1, heads, rows, width),
                    padding_mode=ct.PaddingMode.ZERO, latency=hint)
    return x.reshape((heads * rows, width))


def _load_rows(A, batch, head, tile, TILE_D, rows, latency, heads, first, how):
    """Rows ``tile * rows ..`` of ``A [B, H, S, D]`` (found as ``how`` says) as a ``[heads *
    rows, TILE_D]`` tile (:func:`_load_part`)."""
    return _load_part(A, batch, head, tile, 0, rows, latency, heads, first, how, width=TILE_D)


def _second_parts(x, y, batch, head, tile, TILE_D, TILE_D2, rows, latency, heads, first, how):
    """With ``TILE_D2`` the second head-dim parts (columns ``TILE_D .. TILE_D + TILE_D2``,
    zero-filled past ``D``) of rows ``tile * rows ..`` of the arrays ``x`` and ``y``
    (``[heads * rows, TILE_D2]`` each), else ``(None, None)``."""
    x2 = None
    y2 = None
    if TILE_D2:
        x2 = _load_part(x, batch, head, tile, TILE_D // TILE_D2, rows, latency, heads, first, how,
                        width=TILE_D2)
        y2 = _load_part(y, batch, head, tile, TILE_D // TILE_D2, rows, latency, heads, first, how,
                        width=TILE_D2)
    return x2, y2


def _load_pair(x, y, batch, head, tile, TILE_D, TILE_D2, rows, latency, heads, first, how):
    """Rows ``tile * rows ..`` of the arrays ``x`` and ``y`` (found as ``how`` says):
    ``[heads * rows, TILE_D]`` tiles, and with ``TILE_D2`` their second head-dim parts
    (:func:`_second_parts`, else ``None``): ``(x, y, x2, y2)``."""
    x1 = _load_rows(x, batch, head, tile, TILE_D, rows, latency, heads, first, how)
    y1 = _load_rows(y, batch, head, tile, TILE_D, rows, latency, heads, first, how)
    x2, y2 = _second_parts(x, y, batch, head, tile, TILE_D, TILE_D2, rows, latency, heads, first,
                           how)
    return x1, y1, x2, y2


def _store_parts(A, batch, head, tile, x, x2, TILE_D, TILE_D2, rows, heads, how):
    """Store the float32 ``[heads * rows, TILE_D]`` tile ``x`` (and with ``TILE_D2`` the
    ``[heads * rows, TILE_D2]`` second head-dim part ``x2``) as rows ``tile * rows ..`` of
    ``A [B, H, S, D]`` in its dtype; ``how``: ``TILED``, or ``CUT`` (``A`` a sequence's
    slice, which the store clips to it)."""
    tma = ct.static_eval(False if how == CUT else None)
    ct.store(A, index=(batch, head, tile, 0),
             tile=x.astype(A.dtype).reshape((1, heads, rows, TILE_D)), allow_tma=tma)
    if TILE_D2:
        ct.store(A, index=(batch, head, tile, TILE_D // TILE_D2),
                 tile=x2.astype(A.dtype).reshape((1, heads, rows, TILE_D2)), allow_tma=tma)


def _load_row_stat(A, batch, head, tile, rows, heads, first, how):
    """Entries ``tile * rows ..`` of ``A [B, H, S]`` (found as ``how`` says; float32,
    zero-filled) as a ``[heads * rows]``."""
    if how == BY_ROW:
        x = A.tiled_view((1, heads, rows), padding_mode=ct.PaddingMode.ZERO,
                         traversal_steps=(1, heads, 1)).load((batch, head, first + tile * rows))
    else:
        x = ct.load(A, index=(batch, head, tile), shape=(1, heads, rows),
                    padding_mode=ct.PaddingMode.ZERO)
    return x.reshape((heads * rows,))


def _score_scales(qk_scale, softcap, SOFTCAP):
    """``(scale2, tanh_scale)``: ``P = 2^(x * scale2 - L)`` of ``x = q.k``, or with ``SOFTCAP``
    of ``x = tanh(q.k * tanh_scale)`` (the capped score ``c * x``)."""
    if SOFTCAP:
        return softcap * LOG2_E, qk_scale / softcap
    return qk_scale * LOG2_E, 0.0


def _scores(a, b, a2, b2, TILE_D2, tanh_scale, SOFTCAP, shape):
    """``(s, t)``: the ``shape`` tile of scores ``a b^T`` (plus ``a2 b2^T``, the second
    head-dim parts, with ``TILE_D2``), raw, or with ``SOFTCAP`` the capped score over the
    cap, ``t = tanh(a b^T * tanh_scale)`` (``t`` is for the gradient; None without
    ``SOFTCAP``)."""
    s = ct.mma(a, ct.transpose(b), ct.full(shape, 0.0, dtype=np.float32))
    if TILE_D2:
        s = ct.mma(a2, ct.transpose(b2), s)
    t = None
    if SOFTCAP:
        t = ct.tanh(s * tanh_scale)
        s = t
    return s, t


def _window(window_left, window_right, far, CAUSAL):
    """``(left, right)``: row ``i`` sees keys ``i + offset - left .. i + offset + right``
    (``right`` 0 with ``CAUSAL``); an unbounded side reaches ``far`` (``S_q + S_k``, past
    every key)."""
    left = reach(window_left, far)
    right = 0
    if not CAUSAL:
        right = reach(window_right, far)
    return left, right


def _accumulators(TILE_D, TILE_D2, rows):
    """A zeroed float32 ``[rows, TILE_D]`` accumulator and, with ``TILE_D2``, its second
    head-dim part ``[rows, TILE_D2]`` (else None)."""
    part2 = None
    if TILE_D2:
        part2 = ct.full((rows, TILE_D2), 0.0, dtype=np.float32)
    return ct.full((rows, TILE_D), 0.0, dtype=np.float32), part2


def _work_item(Work, heads):
    """``(tile, sequence, head, alive)`` of the CTA's (work item x head) on a 1-D grid over a
    work table (``Work``, int32 ``[2, items]``: sequences, -1 for none, and tiles); an item
    that names no sequence is ``alive`` 0, with sequence 0 and tile 0."""
    item = ct.bid(0) // heads
    head = ct.bid(0) % heads
    seq = ct.gather(Work, (0, item))
    alive = min(seq + 1, 1)
    sequence = max(seq, 0)
    return ct.gather(Work, (1, item)) * alive, sequence, head, alive


# -- dQ (and delta) ------------------------------------------------------------------------------
@ct.kernel
def attention_bwd_dq(
    Q, K, V, Out, dO,  # [B, H_q, S_q, D], [B, H_kv, S_k, D] x2, like Q x2
    Lse,  # [B, H_q, S_q] float32: the forward's log-sum-exp (base 2)
    Delta,  # [B, H_q, S_q] float32: written here, sum_d dO * Out per row
    dQ,  # like Q
    qk_scale: float,
    heads_q: int,
    group: int,  # query heads per K/V head
    window_left: int,  # WINDOW: keys a row sees before its diagonal (-1: unbounded); else ()
    window_right: int,  # WINDOW: keys a row sees past its diagonal (-1: unbounded); else ()
    softcap: float,  # SOFTCAP: the cap c; else ()
    Ranges,  # RAGGED: int32 [4, sequences] query starts, query ends, key starts, key ends;
    # else ()
    Work,  # WORK_TABLE: int32 [2, items] work items: sequences (-1: none) and query tiles;
    # else ()
    TILE_M: ConstInt,  # query rows per CTA
    TILE_N: ConstInt,  # keys per step
    PACK: ConstInt,  # query heads a tile holds: 1, or the group size (a power of two <= TILE_M)
    TILE_D: ConstInt,  # head_dim rounded up to a power of two (loads zero-fill the rest), or
    # with TILE_D2 the largest power of two below it: the first part of the head dim
    TILE_D2: ConstInt,  # 0, or the width of a second head-dim part at column TILE_D
    CAUSAL: ConstBool,
    BOTTOM_RIGHT: ConstBool,
    KV_LATENCY: ConstInt,  # latency hint of the K/V loads (1..10; 0: the compiler's)
    HEAVY_FIRST: ConstBool,  # CTA 0 takes the last query tile
    TILE_MAJOR: ConstBool,  # grid (batch x head, query tiles): a tile's CTAs of every head first
    WINDOW: ConstBool,  # a sliding window bounds either side
    SOFTCAP: ConstBool,  # scores capped by softcap * tanh(s / softcap)
    RAGGED: ConstBool,  # sequences of their own lengths: the batch index picks Ranges' column
    PACKED: ConstBool,  # RAGGED: the sequences lie end to end in batch 0 (else one a batch entry)
    WORK_TABLE: ConstBool,  # RAGGED: a 1-D grid, CTA i runs query head (PACK > 1: K/V group) i %
    # heads of Work's item
):
    """Delta and dQ of the CTA's query tile of one (batch, query head), or with ``PACK`` > 1
    of one (batch, K/V group): its ``TILE_M`` rows are then ``TILE_M / PACK`` positions of each
    of the group's query heads, head-major (FlashAttention's pack-GQA: each K/V tile feeds the
    whole group). With ``RAGGED`` the batch index is a sequence's, whose ranges the arrays are
    read in (the module's docstring), and a tile past the sequence's queries walks no key tile
    and stores nothing (nor does an item of ``WORK_TABLE`` that names no sequence)."""
    tile_rows = ct.static_eval(TILE_M // PACK)  # query positions per tile
    heads = heads_q  # tiles' heads per batch entry: query heads, or (PACK > 1) K/V groups
    if PACK > 1:
        heads = heads_q // PACK
    alive = 1  # 0: a work item past the table's last tile
    if WORK_TABLE:
        q_tile, batch, head, alive = _work_item(Work, heads)
    else:
        if TILE_MAJOR:
            q_tile = ct.bid(1)
            bh = ct.bid(0)
            tiles = ct.num_blocks(1)
        else:
            q_tile = ct.bid(0)
            bh = ct.bid(1)
            tiles = ct.num_blocks(0)
        if HEAVY_FIRST:
            q_tile = tiles - 1 - q_tile
        batch = bh // heads
        head = bh % heads
    # the head axis' tile index of Q, Out, dO, dQ, Lse and Delta: the query head, or (PACK >
    # 1) the group's, whose first query head is PACK times it
    head_tile = head
    if PACK > 1:
        head = head * PACK
    seqlen_q = Q.shape[2]
    seqlen_k = K.shape[2]
    q_first, k_first = 0, 0  # RAGGED: the sequence's first query and key rows
    loads = ct.static_eval(BY_ROW if RAGGED else TILED)  # how the loads find rows
    Kc, Vc = K, V  # RAGGED: the sequence's cuts (the key tile's that runs past its keys)
    if RAGGED:
        # (not one branch on the tile's liveness around the rest, as in the dK/dV kernel:
        # tileiras 13.4 fails on the walk's two loops inside it for sm_100; a dead tile's walk
        # is emptied and its stores skipped instead, and its loads start inside the arrays)
        seq, batch = sequence_of(batch, PACKED)
        seqlen_q = sequence_length(Ranges, seq, 0) * alive
        seqlen_k = sequence_length(Ranges, seq, 2)
        q_first = sequence_start(Ranges, seq, 0, Q.shape[2])
        k_first = sequence_start(Ranges, seq, 2, K.shape[2])
        Kc = sequence_view_at_least(K, Ranges, seq, 2)
        Vc = sequence_view_at_least(V, Ranges, seq, 2)
        # the stores' cuts (stored without TMA: no descriptor built in the kernel)
        Delta = sequence_view_at_least(Delta, Ranges, seq, 0, 1)
        dQ = sequence_view_at_least(dQ, Ranges, seq, 0, 1)
    kv_head = head // group
    whole = 0  # RAGGED: the sequence's key tiles that are whole (a later one runs past it)
    if RAGGED:
        whole = seqlen_k // TILE_N
    scale2, tanh_scale = _score_scales(qk_scale, softcap, SOFTCAP)
    left, right = 0, 0
    if WINDOW:
        left, right = _window(window_left, window_right, seqlen_q + seqlen_k, CAUSAL)

    # delta = rowsum(dO * O), the preprocess step, fused
    # [TILE_M, TILE_D] each
    # (a ragged tile's rows past its sequence hold another's: they stay in their own rows of
    # the products and are not stored)
    o = _load_rows(Out, batch, head_tile, q_tile, TILE_D, rows=tile_rows, latency=0, heads=PACK,
                   first=q_first, how=loads)
    do = _load_rows(dO, batch, head_tile, q_tile, TILE_D, rows=tile_rows, latency=0, heads=PACK,
                    first=q_first, how=loads)
    delta = ct.sum(o.astype(np.float32) * do.astype(np.float32), axis=-1)  # [TILE_M]
    # with TILE_D2 the second head-dim parts of O, dO and Q: [TILE_M, TILE_D2] each
    o2, do2 = _second_parts(Out, dO, batch, head_tile, q_tile, TILE_D, TILE_D2, rows=tile_rows,
                            latency=0, heads=PACK, first=q_first, how=loads)
    q2 = None
    if TILE_D2:
        delta = delta + ct.sum(o2.astype(np.float32) * do2.astype(np.float32), axis=-1)
        q2 = _load_part(Q, batch, head_tile, q_tile, TILE_D // TILE_D2, tile_rows, 0,
                        heads=PACK, first=q_first, how=loads, width=TILE_D2)
    if RAGGED:
        if q_tile * tile_rows < seqlen_q:
            ct.store(Delta, index=(batch, head_tile, q_tile),
                     tile=delta.reshape((1, PACK, tile_rows)), allow_tma=False)
    else:
        ct.store(Delta, index=(batch, head_tile, q_tile),
                 tile=delta.reshape((1, PACK, tile_rows)))
    delta = delta.reshape((TILE_M, 1))
    lse = _load_row_stat(Lse, batch, head_tile, q_tile, rows=tile_rows, heads=PACK,
                         first=q_first, how=loads).reshape((TILE_M, 1))
    # [TILE_M, TILE_D]
    q = _load_rows(Q, batch, head_tile, q_tile, TILE_D, rows=tile_rows, latency=0, heads=PACK,
                   first=q_first, how=loads)

    offset = 0  # query row i sees keys 0..i + offset (a ragged call: by its own lengths)
    if BOTTOM_RIGHT:
        offset = seqlen_k - seqlen_q
    first_row = q_tile * tile_rows
    positions = ct.arange(TILE_M, dtype=np.int32)  # each row's position in the tile
    if PACK > 1:  # row r is position r % tile_rows of its head
        positions = positions % tile_rows
    rows = first_row + offset + positions[:, None]  # the last key each row sees, [TILE_M, 1]

    def add_key_tile(j, masked, edge, dq, dq2):
        """dQ of key tile ``j`` added to ``dq`` (its second head-dim part to ``dq2``);
        ``masked``: apply the sequence-end / causal / window mask; ``edge`` (``RAGGED``): the
        tile runs past its sequence's keys, read from their cuts (zero-filled past them: a
        key another sequence holds, or none wrote, adds nothing, as a plain call's past
        S_k)."""
        k_in, v_in, k_loads = K, V, loads
        if edge:
            k_in, v_in, k_loads = Kc, Vc, TILED
        # [TILE_N, TILE_D] each; with TILE_D2 [TILE_N, TILE_D2] each
        k, v, k2, v2 = _load_pair(k_in, v_in, batch, kv_head, j, TILE_D, TILE_D2, rows=TILE_N,
                                  latency=KV_LATENCY, heads=1, first=k_first, how=k_loads)
        # [TILE_M, TILE_N]
        s, t = _scores(q, k, q2, k2, TILE_D2, tanh_scale, SOFTCAP, (TILE_M, TILE_N))
        if masked:
            keys = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[None, :]  # [1, TILE_N]
            keep = keys < seqlen_k
            if CAUSAL:
                keep = keep & (keys <= rows)  # rows: the last key each row sees, [TILE_M, 1]
            if WINDOW:
                keep = keep & (keys >= rows - left)
                if not CAUSAL:
                    keep = keep & (keys <= rows + right)
            s = ct.where(keep, s, -np.inf)
        p = ct.exp2(s * scale2 - lse, flush_to_zero=True)  # [TILE_M, TILE_N]
        dp = ct.mma(do, ct.transpose(v), ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
        if TILE_D2:
            dp = ct.mma(do2, ct.transpose(v2), dp)
        ds = p * (dp - delta)  # [TILE_M, TILE_N]
        if SOFTCAP:
            ds = ds * (1.0 - t * t)  # d(c * tanh(x / c)) / dx
        ds = ds.astype(q.dtype)
        if TILE_D2:
            dq2 = ct.mma(ds, k2, dq2)  # [TILE_M, TILE_D2]
        return ct.mma(ds, k, dq), dq2  # [TILE_M, TILE_D]

    if WINDOW:
        # key tiles [lo, hi) hold the keys the tile's rows see; of them [full_from, full_to)
        # are seen whole by every row (and are not past S_k): the tiles before and after need
        # the mask
        lo, full_from, full_to, hi = dq_window_key_tiles(
            first_row, min(first_row + tile_rows, seqlen_q) - 1, offset, left, right, seqlen_k,
            TILE_N)
        if RAGGED:  # a dead tile (past its sequence's queries) walks none
            live = min(max(seqlen_q - first_row, 0), 1)
            lo = lo * live
            full_from = full_from * live
            full_to = full_to * live
            hi = hi * live
        dq, dq2 = _accumulators(TILE_D, TILE_D2, rows=TILE_M)
        first_to, hi_whole = full_from, hi
        if RAGGED:  # (full_to <= whole: a tile seen whole is not past the keys)
            hi_whole = min(hi, whole)
            first_to = min(full_from, hi_whole)
        for j in range(lo, first_to):
            dq, dq2 = add_key_tile(j, True, False, dq, dq2)
        for j in range(full_from, full_to):
            dq, dq2 = add_key_tile(j, False, False, dq, dq2)
        for j in range(full_to, hi_whole):
            dq, dq2 = add_key_tile(j, True, False, dq, dq2)
        edge_from, edge_to = max(lo, whole), hi
    else:
        # key tiles [0, unmasked) need no mask; the rest of [0, num_kv_tiles) do
        num_kv_tiles, unmasked = dq_key_tiles(first_row, offset, seqlen_k, tile_rows, TILE_N,
                                              CAUSAL)
        if RAGGED:  # a dead tile (past its sequence's queries) walks none
            live = min(max(seqlen_q - first_row, 0), 1)
            num_kv_tiles = num_kv_tiles * live
            unmasked = unmasked * live
        dq, dq2 = _accumulators(TILE_D, TILE_D2, rows=TILE_M)
        masked_to = num_kv_tiles
        if RAGGED:  # (unmasked <= whole: an unmasked tile is not past the keys)
            masked_to = min(num_kv_tiles, whole)
        for j in range(unmasked):
            dq, dq2 = add_key_tile(j, False, False, dq, dq2)
        for j in range(unmasked, masked_to):
            dq, dq2 = add_key_tile(j, True, False, dq, dq2)
        edge_from, edge_to = max(unmasked, whole), num_kv_tiles
    if RAGGED:  # the key tile past the sequence's keys (at most one), if one is
        if edge_from < edge_to:
            dq, dq2 = add_key_tile(edge_from, True, True, dq, dq2)
    dq = dq * qk_scale
    if TILE_D2:
        dq2 = dq2 * qk_scale
    if RAGGED:
        if first_row < seqlen_q:
            _store_parts(dQ, batch, head_tile, q_tile, dq, dq2, TILE_D, TILE_D2, rows=tile_rows,
                         heads=PACK, how=CUT)
    else:
        _store_parts(dQ, batch, head_tile, q_tile, dq, dq2, TILE_D, TILE_D2, rows=tile_rows,
                     heads=PACK, how=TILED)


# -- dK and dV -----------------------------------------------------------------------------------
@ct.kernel
def attention_bwd_dkdv(
    Q, K, V, dO,  # [B, H_q, S_q, D], [B, H_kv, S_k, D] x2, like Q
    Lse, Delta,  # [B, H_q, S_q] float32 (the forward's; attention_bwd_dq's)
    dK, dV,  # like K; with SPLITS > 1 float32 partials [SPLITS * B, H_kv, S_k, D]
    qk_scale: float,
    heads_kv: int,
    group: int,
    window_left: int, window_right: int, softcap: float,  # as attention_bwd_dq's
    Ranges, Work,  # as attention_bwd_dq's (Work's tiles: key tiles)
    dQacc,  # DQ_ATOMIC: float32 like Q (contiguous), zeroed, dQ / scale added here; else ()
    TILE_M: ConstInt,  # query rows per step
    TILE_N: ConstInt,  # keys per CTA
    TILE_D: ConstInt,  # as attention_bwd_dq's
    TILE_D2: ConstInt,  # as attention_bwd_dq's
    CAUSAL: ConstBool,
    BOTTOM_RIGHT: ConstBool,
    Q_LATENCY: ConstInt,  # latency hint of the Q/dO loads (1..10; 0: the compiler's)
    SPLITS: ConstInt,  # CTAs sharing one key tile's walk over (query head, query tile) pairs
    TILE_MAJOR: ConstBool,  # grid (batch x K/V head x split, key tiles): key tile 0's CTAs first
    WINDOW: ConstBool, SOFTCAP: ConstBool, RAGGED: ConstBool, PACKED: ConstBool,  # as dQ's
    DQ_ATOMIC: ConstBool,  # also add each (query tile, key tile) pair's dS K into dQacc
    WORK_TABLE: ConstBool,  # RAGGED: a 1-D grid, CTA i runs (K/V head x split) i % (heads_kv x
    # SPLITS) of Work's item
):
    """dK and dV (or split ``split``'s partials) of the CTA's key tile of one (batch, K/V
    head). With ``RAGGED`` the batch index is a sequence's, whose ranges the arrays are read in
    (the module's docstring; the partials ``[SPLITS * B, H_kv, S, D]`` hold rows of the same
    sequences), and a tile past the sequence's keys does nothing (its partials stay as the
    launcher zeroed them). With ``DQ_ATOMIC`` every (query head, query tile) pair it walks also
    adds its ``dS K`` (dQ before the scale) into ``dQacc`` by a bulk reduce-add."""
    alive = 1  # 0: a work item past the table's last tile
    if WORK_TABLE:
        heads = heads_kv  # the CTAs of one work item: its K/V heads x splits
        if SPLITS > 1:
            heads = heads_kv * SPLITS
        kv_tile, batch, kv_head, alive = _work_item(Work, heads)
        split = 0
        if SPLITS > 1:
            split = kv_head % SPLITS
            kv_head = kv_head // SPLITS
    else:
        if TILE_MAJOR:
            kv_tile = ct.bid(1)
            bh = ct.bid(0) // SPLITS
            split = ct.bid(0) % SPLITS
        else:
            kv_tile = ct.bid(0)
            bh = ct.bid(1)
            split = ct.bid(2)
        batch = bh // heads_kv
        kv_head = bh % heads_kv

    loads = ct.static_eval(BY_ROW if RAGGED else TILED)  # how the loads find rows
    stores = ct.static_eval(CUT if RAGGED else TILED)  # dK's and dV's

    def key_tile(dK, dV, dQc, cuts, seqlen_q, seqlen_k, q_first, k_first):
        """dK and dV of key tile ``kv_tile`` into ``dK, dV``, the sequence ``seqlen_q``
        queries and ``seqlen_k`` keys long, its rows from ``q_first`` and ``k_first`` on with
        ``RAGGED`` (else 0); with ``DQ_ATOMIC`` each pair's dQ share is added into ``dQc``.
        With ``RAGGED`` the arrays ``dK, dV, dQc`` and ``cuts`` (``Kc, Vc, Qc, dOc, Lsec,
        Deltac``) are the sequence's cuts: the stores' (the shares', which a row past the
        sequence would spill into the next), the query tile's that runs past the sequence,
        and (with ``DQ_ATOMIC``, whose shares sum over the tile's keys) the key tile's."""
        Kc, Vc, Qc, dOc, Lsec, Deltac = cuts
        scale2, tanh_scale = _score_scales(qk_scale, softcap, SOFTCAP)
        left, right = 0, 0
        if WINDOW:
            left, right = _window(window_left, window_right, seqlen_q + seqlen_k, CAUSAL)
        k_in, v_in, k_loads = K, V, loads
        if DQ_ATOMIC:  # (zero-filled past the sequence: no share of a key it does not have)
            k_in, v_in, k_loads = Kc, Vc, TILED
        # [TILE_N, TILE_D] each; with TILE_D2 the second head-dim parts, [TILE_N, TILE_D2]
        k, v, k2, v2 = _load_pair(k_in, v_in, batch, kv_head, kv_tile, TILE_D, TILE_D2,
                                  rows=TILE_N, latency=0, heads=1, first=k_first, how=k_loads)
        first_key = kv_tile * TILE_N

        num_q_tiles = ct.cdiv(seqlen_q, TILE_M)
        offset = 0  # query row i sees keys 0..i + offset
        if BOTTOM_RIGHT:
            offset = seqlen_k - seqlen_q
        # the first row seeing each key, [TILE_N, 1]
        keys = first_key - offset + ct.arange(TILE_N, dtype=np.int32)[:, None]
        first = 0
        unmask_from = 0
        end = num_q_tiles
        unmask_to = num_q_tiles
        if WINDOW:
            # rows [first_key - offset - right, last_key - offset + left] see some of these
            # keys: query tiles [first, end); of them [unmask_from, unmask_to) see all of them,
            # the tiles before and after need the mask
            first, unmask_from, unmask_to, end = dkdv_window_query_tiles(
                first_key, min(first_key + TILE_N, seqlen_k) - 1, offset, left, right,
                seqlen_q, TILE_M)
        elif CAUSAL:
            first, unmask_from = dkdv_query_tiles(first_key, offset, num_q_tiles, TILE_M,
                                                  TILE_N)

        def add_query_tile(head, i, masked, edge, dk, dv, dk2, dv2):
            """Fold query tile ``i`` of query head ``head`` into ``dk, dv`` (their second
            head-dim parts into ``dk2, dv2``); ``masked``: the causal / window mask; ``edge``
            (``RAGGED``): the tile runs past its sequence's queries and reads their cuts,
            zero-filled past them: those rows add nothing, as a plain call's past S_q."""
            q_in, do_in, lse_in, delta_in, q_loads = Q, dO, Lse, Delta, loads
            if edge:
                q_in, do_in, lse_in, delta_in, q_loads = Qc, dOc, Lsec, Deltac, TILED
            # [TILE_M, TILE_D] each; with TILE_D2 [TILE_M, TILE_D2] each
            q, do, q2, do2 = _load_pair(q_in, do_in, batch, head, i, TILE_D, TILE_D2,
                                        rows=TILE_M, latency=Q_LATENCY, heads=1, first=q_first,
                                        how=q_loads)
            lse = _load_row_stat(lse_in, batch, head, i, rows=TILE_M, heads=1, first=q_first,
                                 how=q_loads).reshape((1, TILE_M))
            delta = _load_row_stat(delta_in, batch, head, i, rows=TILE_M, heads=1,
                                   first=q_first, how=q_loads).reshape((1, TILE_M))
            # S^T: [TILE_N, TILE_M]
            st, tt = _scores(k, q, k2, q2, TILE_D2, tanh_scale, SOFTCAP, (TILE_N, TILE_M))
            if masked:
                rows = i * TILE_M + ct.arange(TILE_M, dtype=np.int32)[None, :]  # [1, TILE_M]
                if WINDOW:
                    keep = keys <= rows + right
                    keep = keep & (keys >= rows - left)
                    st = ct.where(keep, st, -np.inf)
                else:
                    st = ct.where(keys <= rows, st, -np.inf)
            pt = ct.exp2(st * scale2 - lse, flush_to_zero=True)  # P^T: [TILE_N, TILE_M]
            p16 = pt.astype(q.dtype)
            dv = ct.mma(p16, do, dv)  # [TILE_N, TILE_D]
            dpt = ct.mma(v, ct.transpose(do), ct.full((TILE_N, TILE_M), 0.0, dtype=np.float32))
            if TILE_D2:
                dv2 = ct.mma(p16, do2, dv2)  # [TILE_N, TILE_D2]
                dpt = ct.mma(v2, ct.transpose(do2), dpt)
            dst = pt * (dpt - delta)  # [TILE_N, TILE_M]
            if SOFTCAP:
                dst = dst * (1.0 - tt * tt)  # d(c * tanh(x / c)) / dx
            ds = dst.astype(q.dtype)
            dk = ct.mma(ds, q, dk)  # [TILE_N, TILE_D]
            if TILE_D2:
                dk2 = ct.mma(ds, q2, dk2)  # [TILE_N, TILE_D2]
            if DQ_ATOMIC:
                # this pair's share of dQ / scale: dS K, [TILE_M, TILE_D] (and [TILE_M,
                # TILE_D2] of the second part)
                dq = ct.mma(ct.transpose(ds), k,
                            ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32))
                dQc.tiled_view((1, 1, TILE_M, TILE_D)).atomic_store_add(
                    (batch, head, i, 0), dq.reshape((1, 1, TILE_M, TILE_D)))
                if TILE_D2:
                    dq2 = ct.mma(ct.transpose(ds), k2,
                                 ct.full((TILE_M, TILE_D2), 0.0, dtype=np.float32))
                    dQc.tiled_view((1, 1, TILE_M, TILE_D2)).atomic_store_add(
                        (batch, head, i, TILE_D // TILE_D2),
                        dq2.reshape((1, 1, TILE_M, TILE_D2)))
            return dk, dv, dk2, dv2

        # The key tile's work is the (query head g, query tile i) pairs, g-major: group * seen
        # of them. Split `split` of SPLITS takes the contiguous share [start, stop) of that list.
        seen = end - first
        total = group * seen
        start = split * total // SPLITS
        stop = (split + 1) * total // SPLITS
        per_head = max(seen, 1)
        # [TILE_N, TILE_D] and [TILE_N, TILE_D2] each
        dk, dk2 = _accumulators(TILE_D, TILE_D2, rows=TILE_N)
        dv, dv2 = _accumulators(TILE_D, TILE_D2, rows=TILE_N)
        # with RAGGED the tile running past the sequence's queries (if one does) is walked
        # apart, read from the cuts; the query tiles before it are whole
        whole = 0
        if RAGGED:
            whole = seqlen_q // TILE_M
        for g in range(start // per_head, ct.cdiv(stop, per_head)):
            head = kv_head * group + g
            lo = first + max(start - g * seen, 0)
            hi = first + min(stop - g * seen, seen)
            hi_whole = hi
            if RAGGED:
                hi_whole = min(hi, whole)
            for i in range(lo, min(hi_whole, unmask_from)):
                dk, dv, dk2, dv2 = add_query_tile(head, i, True, False, dk, dv, dk2, dv2)
            if WINDOW:
                for i in range(max(lo, unmask_from), min(hi_whole, unmask_to)):
                    dk, dv, dk2, dv2 = add_query_tile(head, i, False, False, dk, dv, dk2, dv2)
                for i in range(max(lo, unmask_to), hi_whole):
                    dk, dv, dk2, dv2 = add_query_tile(head, i, True, False, dk, dv, dk2, dv2)
            else:
                for i in range(max(lo, unmask_from), hi_whole):
                    dk, dv, dk2, dv2 = add_query_tile(head, i, False, False, dk, dv, dk2, dv2)
            if RAGGED:  # (masked as the problem is: past the queries the cut's zeros do it)
                for i in range(max(lo, whole), hi):
                    dk, dv, dk2, dv2 = add_query_tile(head, i, ct.static_eval(CAUSAL or WINDOW),
                                                      True, dk, dv, dk2, dv2)
        dk = dk * qk_scale
        if TILE_D2:
            dk2 = dk2 * qk_scale
        part = split * Q.shape[0] + batch
        _store_parts(dK, part, kv_head, kv_tile, dk, dk2, TILE_D, TILE_D2, rows=TILE_N, heads=1,
                     how=stores)
        _store_parts(dV, part, kv_head, kv_tile, dv, dv2, TILE_D, TILE_D2, rows=TILE_N, heads=1,
                     how=stores)

    if RAGGED:
        seq, batch = sequence_of(batch, PACKED)
        seqlen_k = sequence_length(Ranges, seq, 2)
        if kv_tile * TILE_N < seqlen_k * alive:
            # the loads read the uncut arrays by row; the stores' cuts (stored without TMA: no
            # descriptor built in the kernel)
            dq_cut = dQacc
            if DQ_ATOMIC:
                dq_cut = sequence_view_at_least(dQacc, Ranges, seq, 0)
            key_tile(sequence_view_at_least(dK, Ranges, seq, 2),
                     sequence_view_at_least(dV, Ranges, seq, 2), dq_cut,
                     (sequence_view_at_least(K, Ranges, seq, 2),
                      sequence_view_at_least(V, Ranges, seq, 2),
                      sequence_view_at_least(Q, Ranges, seq, 0, 1),
                      sequence_view_at_least(dO, Ranges, seq, 0, 1),
                      sequence_view_at_least(Lse, Ranges, seq, 0, 1),
                      sequence_view_at_least(Delta, Ranges, seq, 0, 1)),
                     sequence_length(Ranges, seq, 0), seqlen_k,
                     sequence_start(Ranges, seq, 0, Q.shape[2]),
                     sequence_start(Ranges, seq, 2, K.shape[2]))
    else:
        key_tile(dK, dV, dQacc, (K, V, Q, dO, Lse, Delta), Q.shape[2], K.shape[2], 0, 0)


def _row_block(heads):
    """(row tile, batch, head) of a row-wise kernel's CTA (grid: row tiles x (B x ``heads``))."""
    tile = ct.bid(0)
    bh = ct.bid(1)
    return tile, bh // heads, bh % heads


# -- the sum of the split walk's partials -------------------------------------------------------
@ct.kernel
def attention_bwd_sum(
    Parts,  # float32 [PARTS * B, H, S, D]
    Grad,  # [B, H, S, D]: the sum of the parts, in Grad's dtype
    PARTS: ConstInt,
    TILE: ConstInt,  # rows per CTA
    TILE_D: ConstInt,
):
    """Reduce float32 partial gradients in a fixed order (bitwise reproducible)."""
    tile, batch, head = _row_block(Grad.shape[1])
    acc = ct.full((TILE, TILE_D), 0.0, dtype=np.float32)
    for part in range(PARTS):
        acc = acc + _load_rows(Parts, part * Grad.shape[0] + batch, head, tile, TILE_D,
                               rows=TILE, latency=0, heads=1, first=0, how=TILED)
    ct.store(Grad, index=(batch, head, tile, 0),
             tile=acc.astype(Grad.dtype).reshape((1, 1, TILE, TILE_D)))


# -- the one-pass backward's dQ: row sums first, float32 dQ last ---------------------------------
@ct.kernel
def attention_bwd_delta(
    Out, dO,  # [B, H_q, S_q, D]
    Delta,  # [B, H_q, S_q] float32: written here, sum_d dO * Out per row
    dQacc,  # [B, H_q, S_q, D] float32: zeroed here (attention_bwd_dkdv adds into it)
    TILE: ConstInt,  # rows per CTA
    TILE_D: ConstInt,
):
    """The rows' ``delta`` (the dQ kernel's fused preprocess step, alone) and a zeroed tile
    of the float32 dQ accumulator."""
    tile, batch, head = _row_block(Out.shape[1])
    # [TILE, TILE_D] each
    o = _load_rows(Out, batch, head, tile, TILE_D, rows=TILE, latency=0, heads=1, first=0,
                    how=TILED)
    do = _load_rows(dO, batch, head, tile, TILE_D, rows=TILE, latency=0, heads=1, first=0,
                    how=TILED)
    delta = ct.sum(o.astype(np.float32) * do.astype(np.float32), axis=-1)  # [TILE]
    ct.store(Delta, index=(batch, head, tile), tile=delta.reshape((1, 1, TILE)))
    ct.store(dQacc, index=(batch, head, tile, 0),
             tile=ct.full((1, 1, TILE, TILE_D), 0.0, dtype=np.float32))


@ct.kernel
def attention_bwd_dq_scale(
    dQacc,  # [B, H_q, S_q, D] float32: dQ / scale (attention_bwd_dkdv's sum)
    dQ,  # [B, H_q, S_q, D]: dQacc * qk_scale, in dQ's dtype
    qk_scale: float,
    TILE: ConstInt,  # rows per CTA
    TILE_D: ConstInt,
):
    """dQ from the one-pass backward's float32 accumulator: times the scale, cast."""
    tile, batch, head = _row_block(dQ.shape[1])
    # [TILE, TILE_D]
    dq = _load_rows(dQacc, batch, head, tile, TILE_D, rows=TILE, latency=0, heads=1, first=0,
                    how=TILED)
    ct.store(dQ, index=(batch, head, tile, 0),
             tile=(dq * qk_scale).astype(dQ.dtype).reshape((1, 1, TILE, TILE_D)))
