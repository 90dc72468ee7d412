"""From a (Problem, DecodeSchedule) pair to the launches of the split and combine kernels.

Nothing here depends on ``S_k`` except the causal offset, a launch-time value: the constants,
the kernel objects and the grid of a schedule serve every cache length, so a decode loop whose
cache grows by one key per call keeps one plan (``_sdpa``). A sliding window is passed as
launch-time values too (``window_left``, ``window_right``, -1 unbounded): the kernel derives each
query tile's key range, and so where its walk starts, from them and the causal offset.
``normalise`` gives every field that cannot change the launches for a problem its canonical
value.

The variants' launch-time values (``window_left, window_right, softcap, Sinks``) come after the
older ones. ``Sinks`` is the ``[H_q]`` float32 array of sink logits when ``SINKS`` is on, else
:data:`NO_SINKS`, an int32 scalar no code reads (as the forward's ``NO_LSE``): with the variants
off the kernels compile to the same machine code as before these parameters existed.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from ...core import _aot
from ...core._lazy import lazy_module
from ...core._signature import KernelParameters
from ...core._problem import Problem, default_scale, padded_head_dim, page_load_rows
from ._flat import FlatLaunches, flat_launches, flat_scratch, flat_scratch_shapes, launch_flat
from ._schedule import MIN_SLICE_KEYS, TILES_M, DecodeSchedule

ct = lazy_module("cuda.tile", globals(), "ct")

__all__ = ["Layout", "layout", "normalise", "split_constants", "combine_constants",
           "split_kernel", "combine_kernel", "order_grid", "SPLIT_PARAMETERS",
           "COMBINE_PARAMETERS", "default_scale", "launch", "NO_SINKS", "UNUSED", "Variant",
           "variant_of", "key_walk", "max_key_tiles", "tail_rows", "rows_past_waves",
           "new_scratch", "partial_shapes"]


def _split() -> ct.kernel:
    """``decode_split``, imported on first use: the kernel module loads cuda.tile, which
    ``import tiledattention`` does not pay for."""
    from ._kernel import decode_split

    return decode_split


def _combine() -> ct.kernel:
    """``decode_combine``, imported on first use (like :func:`_split`)."""
    from ._kernel import decode_combine

    return decode_combine


def order_kernel() -> ct.kernel:
    """``decode_order`` (``DecodeSchedule.longest_first``'s ranking), imported on first use."""
    from ._kernel import decode_order

    return decode_order


SPLIT_PARAMETERS = KernelParameters(
    _split,
    ("Q", "K", "V", "Out", "Opart", "Lse", "qk_scale", "causal_offset", "kv_div", "window_left",
     "window_right", "softcap", "Sinks", "Ranges", "Pages", "KDescale", "VDescale",
     "split_hint", "Order"))
COMBINE_PARAMETERS = KernelParameters(_combine, ("Opart", "Lse", "Out", "Sinks"))

#: What ``Sinks`` receives when ``SINKS`` is off: an int32 scalar that no code reads.
NO_SINKS = 0
#: What ``Ranges`` receives when ``RAGGED`` is off (and ``Pages`` when ``PAGED`` is, ``Order``
#: when ``ORDERED`` is): an empty
#: tuple, a parameter of no bytes (the forward's placeholder), so the split kernel's parameter
#: space and machine code are unchanged.
UNUSED = ()



class Variant(NamedTuple):
    """The attention variant a plan launches: the window (-1: a side unbounded), the softcap
    (0: none) and whether sinks join the denominator. Usually the problem's own
    (:func:`variant_of`); a plan kept for a band of cache lengths may carry the call's window
    where the canonical problem of one length dropped a side that binds at another."""

    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    sinks: bool = False

    @property
    def windowed(self) -> bool:
        return self.window_left >= 0 or self.window_right >= 0


def variant_of(problem: Problem, window: tuple[int, int] | None = None) -> Variant:
    """``problem``'s variant, with ``window`` (the call's ``(left, right)``) instead of the
    problem's where given."""
    left, right = window if window is not None else (problem.window_left, problem.window_right)
    return Variant(int(left), int(right), float(problem.softcap), bool(problem.sinks))

#: Fewest rows a packed tile has (the matrix-product units work on 16-row tiles at least).
MIN_TILE_ROWS = 16


class Layout(NamedTuple):
    """How a problem's query rows map onto tiles for one schedule."""

    view_heads: int  # heads of the [B, H', G', S_q, D] view of q and out
    view_group: int  # G': query heads per tile group (the GQA group when packed, else 1)
    kv_div: int  # view head // kv_div = K/V head
    tile_g: int  # heads per tile (power of two >= G', padded with zero rows)
    tile_s: int  # query positions per tile
    q_tiles: int  # query tiles per (batch, view head)
    rows: int  # B * H' * q_tiles: the first grid dim

    @property
    def tile_m(self) -> int:
        return self.tile_g * self.tile_s


def _pow2_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=4096)
def layout(problem: Problem, schedule: DecodeSchedule) -> Layout:
    """The tiling of ``problem``'s query rows under ``schedule``."""
    group = problem.group_size
    if schedule.pack_heads:
        view_heads, view_group, kv_div = problem.heads_kv, group, 1
    else:
        view_heads, view_group, kv_div = problem.heads_q, 1, group
    tile_g = _pow2_at_least(view_group)
    tile_s = min(_pow2_at_least(problem.seqlen_q), max(1, schedule.tile_m // tile_g))
    if tile_g * tile_s < MIN_TILE_ROWS:
        tile_g = MIN_TILE_ROWS // tile_s
    q_tiles = math.ceil(problem.seqlen_q / tile_s)
    return Layout(view_heads, view_group, kv_div, tile_g, tile_s, q_tiles,
                  problem.batch * view_heads * q_tiles)


def _whole_entries(problem: Problem, schedule: DecodeSchedule, rows: int) -> int:
    """The last ``rows`` rows of ``schedule``'s layout rounded up to whole batch entries (the
    merge of a tail writes the output from the tail's first entry on); 0 where that is every
    row."""
    tiles = layout(problem, schedule)
    entry = tiles.rows // problem.batch  # rows a batch entry
    tail = -(-rows // entry) * entry
    return tail if tail < tiles.rows else 0


def tail_rows(problem: Problem, schedule: DecodeSchedule) -> int:
    """The rows ``schedule`` splits when only its last rows split: ``tail_rows`` in whole batch
    entries, else 0: every row splits, or none does, or the batch is ragged (a padded or paged
    batch: not measured)."""
    if schedule.splits == 1 or problem.ragged:
        return 0
    return _whole_entries(problem, schedule, schedule.tail_rows)


def rows_past_waves(problem: Problem, schedule: DecodeSchedule, wave: int) -> int:
    """The rows of ``schedule``'s layout past its whole waves of ``wave`` CTAs (one a row), in
    whole batch entries: what ``tail_rows`` would split to fill the last wave; 0 where the rows
    fill whole waves or the tail is every row (at most one wave, or rounded up to all)."""
    return _whole_entries(problem, schedule, layout(problem, schedule).rows % wave)


def max_key_tiles(problem: Problem, schedule: DecodeSchedule) -> int | None:
    """The most key tiles a query tile's walk can touch under ``problem``'s window, whatever
    the cache length (a plan serves a band of them); ``None`` when the walk grows with the
    cache. A query tile of rows ``first..last`` walks keys ``first + off - left .. last + off +
    right``: ``rows - 1 + left + right + 1`` keys with both sides bounded (causal bounds the
    right at 0); bottom-right, the cache's end bounds the right (``off + S_q = S_k``): at most
    ``S_q + left`` keys. A range of ``n`` keys at any alignment touches at most ``ceil((n - 1)
    / tile_n) + 1`` tiles."""
    if problem.window_left < 0:
        return None
    right = 0 if problem.causal else problem.window_right
    keys = None
    if right >= 0:
        rows = min(layout(problem, schedule).tile_s, problem.seqlen_q)
        keys = rows - 1 + problem.window_left + right + 1
    if problem.bottom_right:
        tail = problem.seqlen_q + problem.window_left
        keys = tail if keys is None else min(keys, tail)
    if keys is None:
        return None
    return -(-(keys - 1) // schedule.tile_n) + 1


def normalise(problem: Problem, schedule: DecodeSchedule) -> DecodeSchedule:
    """``schedule`` with every field that cannot change the launches for ``problem`` at a
    canonical value: ``splits`` at most the key tiles a window lets a query tile walk (more
    splits only add CTAs with no keys: each split would take one tile either way),
    ``combine`` and ``merge_occupancy`` with one split (and ``"block"`` past the merged
    rows one block holds, :data:`BLOCK_MAX_ROWS`), ``tail_rows`` rounded up to whole batch
    entries (0 where one split or every row splits, or the batch is ragged), ``balanced``
    where there is one split, one cache length or a window (whose walk is at most the
    window's), ``longest_first`` but for a paged batch of more than one entry without a flat
    walk, ``pack_heads`` when each K/V head has one query head, ``tile_m`` at the smallest
    value that gives the same tiling, ``key_slices`` at most ``tile_n / 16`` (1 for a flat
    walk or an FP8 cache), and for a paged cache ``k_transposed`` canonical (a page's keys
    load as rows; idempotent; ``schedule`` itself when nothing changes). ``flat`` stays on
    only where it applies (:func:`flat_applies`), and then one split, no balance and no
    tail."""
    changes: dict[str, Any] = {}
    canonical = DecodeSchedule()
    if schedule.flat:
        if not flat_applies(problem):
            changes["flat"] = False
        else:  # the work is shared by items, not splits
            changes.update((name, value) for name, value in (
                ("splits", 1), ("combine", canonical.combine), ("balanced", False),
                ("tail_rows", 0)) if getattr(schedule, name) != value)
        if changes:
            schedule = schedule.replace(**changes)
    if problem.page_size and schedule.k_transposed != canonical.k_transposed:
        changes["k_transposed"] = canonical.k_transposed
        schedule = schedule.replace(k_transposed=canonical.k_transposed)
    most = max_key_tiles(problem, schedule) if problem.windowed else None
    if most is not None and schedule.splits > most:
        changes["splits"] = most
        schedule = schedule.replace(splits=most)
    too_many_rows = schedule.combine in BLOCK_COMBINES and (
        _pow2_at_least(schedule.splits) * layout(problem, schedule).tile_m > BLOCK_MAX_ROWS)
    if schedule.splits == 1 and schedule.combine != canonical.combine:
        changes["combine"] = canonical.combine  # one split: no merge
    elif too_many_rows:  # too many rows for one block: the stepping merge, launched alike
        changes["combine"] = "pdl" if schedule.combine in PDL_COMBINES else "kernel"
    if schedule.splits == 1 and schedule.merge_occupancy != canonical.merge_occupancy:
        changes["merge_occupancy"] = canonical.merge_occupancy  # nor the merge's options
    tail = tail_rows(problem, schedule)
    if tail != schedule.tail_rows:  # whole entries; none with one split, every row split or
        changes["tail_rows"] = tail  # a ragged batch
    if schedule.balanced and (schedule.splits == 1 or not problem.ragged or problem.windowed):
        changes["balanced"] = False  # one split, entries of one length, or a window's walk
    if schedule.longest_first and not ordered(problem, schedule):
        changes["longest_first"] = False
    slices = (1 if schedule.flat or problem.kv_dtype
              else min(schedule.key_slices, schedule.tile_n // MIN_SLICE_KEYS))
    if slices != schedule.key_slices:  # the flat walk and an FP8 cache fold whole tiles
        changes["key_slices"] = slices
    if problem.group_size == 1 and schedule.pack_heads != canonical.pack_heads:
        changes["pack_heads"] = canonical.pack_heads
    tiles = layout(problem, schedule)
    smallest = next(m for m in TILES_M if layout(problem, schedule.replace(tile_m=m)) == tiles)
    if smallest != schedule.tile_m:
        changes["tile_m"] = smallest
    return schedule.replace(**changes) if changes else schedule


def ordered(problem: Problem, schedule: DecodeSchedule) -> bool:
    """Whether ``schedule`` runs ``problem``'s entries longest first: a paged batch of more
    than one entry, not walked flat."""
    return (schedule.longest_first and problem.page_size > 0 and problem.batch > 1
            and not schedule.flat)


def flat_applies(problem: Problem) -> bool:
    """Whether ``DecodeSchedule.flat`` can take ``problem``: a paged cache of 16-bit keys and
    values, no window, softcap or sinks."""
    return (problem.page_size > 0 and not problem.kv_dtype and not problem.windowed
            and problem.softcap == 0 and not problem.sinks)


def split_constants(problem: Problem, schedule: DecodeSchedule,
                    variant: Variant | None = None) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``decode_split`` by name (``variant``: the problem's
    unless given)."""
    tiles = layout(problem, schedule)
    variant = variant_of(problem) if variant is None else variant
    tail = tail_rows(problem, schedule) > 0
    return {
        "TILE_G": tiles.tile_g, "TILE_S": tiles.tile_s, "TILE_N": schedule.tile_n,
        "KEY_SLICES": schedule.key_slices,
        "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
        "EXP2": schedule.exp2, "K_TRANSPOSED": schedule.k_transposed,
        "K_LATENCY": schedule.k_latency or 0, "V_LATENCY": schedule.v_latency or 0,
        "DIRECT": schedule.splits == 1,
        "PDL": schedule.splits > 1 and schedule.combine in PDL_COMBINES,
        "WINDOW": variant.windowed, "SOFTCAP": variant.softcap > 0,
        # else the combine adds the sink (a tail's split rows' too)
        "SINKS": variant.sinks and (schedule.splits == 1 or tail),
        "RAGGED": problem.ragged, "PAGED": problem.page_size > 0,
        # (normalise drops it where it cannot apply; a call's own window walks as before)
        "BALANCED": (schedule.balanced and problem.ragged and schedule.splits > 1
                     and not variant.windowed),
        # keys per load from a page: a load never straddles two pages
        "PAGE_ROWS": page_load_rows(problem.page_size, schedule.tile_n),
        # a key's page and row by shifts, not divisions on the producer's way to each load
        "PAGE_SIZE": problem.page_size,
        "KV_FP8": bool(problem.kv_dtype),
        "TAIL": tail,
        "ORDERED": ordered(problem, schedule),
    }


#: Entries ``decode_order`` ranks a CTA (a ``[64, 64]`` comparison a step).
ORDER_CHUNK = 64
#: Head-dim columns per combine CTA: the combine reads splits x rows x D floats per output
#: row, so it is spread over ``ceil(D / 32)`` CTAs per row instead of one.
COMBINE_CHUNK_D = 32
#: Splits the combine merges per step (their loads issued together). An H100 probe
#: (scripts/decode_parts.py at 7415564) timed the one-split-per-step merge at 10-12 µs for 8-16
#: splits at B = 1, a sixth of a 32k-key call.
COMBINE_UNROLL = 8
#: ``combine="block"``: every split of a row merged in one step, from one tile of at most this
#: many float32 values (splits, padded to a power of two, x the tile's rows x the columns of a
#: CTA); the columns per CTA shrink to fit, to no fewer than ``BLOCK_MIN_CHUNK_D`` (16 bytes, a
#: bulk load's least), so it serves up to ``BLOCK_MAX_ROWS`` merged rows (splits, padded, x
#: the tile's rows); ``normalise`` sends a schedule past that to the stepping merge.
COMBINE_BLOCK_VALUES = 8192
BLOCK_MIN_CHUNK_D = 4
BLOCK_MAX_ROWS = COMBINE_BLOCK_VALUES // BLOCK_MIN_CHUNK_D
#: The merges that load all of a row's splits as one block, and those launched as programmatic
#: dependents of the split kernel.
BLOCK_COMBINES = ("block", "block_pdl")
PDL_COMBINES = ("pdl", "block_pdl")


def combine_constants(problem: Problem, schedule: DecodeSchedule,
                      variant: Variant | None = None) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``decode_combine`` by name."""
    tiles = layout(problem, schedule)
    variant = variant_of(problem) if variant is None else variant
    splits = _pow2_at_least(schedule.splits)
    chunk = min(padded_head_dim(problem.head_dim), COMBINE_CHUNK_D)
    block = schedule.combine in BLOCK_COMBINES
    if block:
        chunk = max(BLOCK_MIN_CHUNK_D, min(chunk, COMBINE_BLOCK_VALUES // (splits * tiles.tile_m)))
    return {"TILE_G": tiles.tile_g, "TILE_S": tiles.tile_s, "CHUNK_D": chunk,
            "UNROLL": splits if block else min(COMBINE_UNROLL, splits),
            "PDL": schedule.combine in PDL_COMBINES, "SINKS": variant.sinks, "BLOCK": block}


@functools.lru_cache(maxsize=None)
def _hinted(kernel: ct.kernel, occupancy: int, num_worker_warps: int | None) -> ct.kernel:
    """Cached: each kernel object owns a JIT cache, so a new one per launch would recompile."""
    return kernel.replace_hints(occupancy=occupancy, num_worker_warps=num_worker_warps)


def split_kernel(schedule: DecodeSchedule) -> ct.kernel:
    return _hinted(_split(), schedule.occupancy, schedule.num_worker_warps)


def combine_kernel(schedule: DecodeSchedule) -> ct.kernel:
    """The combine kernel: with ``merge_occupancy`` compiled for that many CTAs an SM, else
    with no kernel option."""
    if schedule.merge_occupancy is None:
        return _combine()
    return _hinted(_combine(), schedule.merge_occupancy, None)


def grouped_view(x: Any, tiles: Layout) -> Any:
    """``x [B, H, S, D]`` (torch or CuPy) as the ``[B, H', G', S, D]`` view the kernels index:
    no copy, whatever the strides."""
    b, h, s, d = x.shape
    shape = (b, tiles.view_heads, tiles.view_group, s, d)
    if hasattr(x, "unflatten"):  # torch
        return x.unflatten(1, shape[1:3])
    import cupy

    sb, sh, ss, sd = x.strides
    return cupy.lib.stride_tricks.as_strided(
        x, shape, (sb, sh * tiles.view_group, sh, ss, sd))


class Launches(NamedTuple):
    """What one call launches, less the arrays: built once per plan."""

    tiles: Layout
    splits: int
    split_grid: tuple[int, int, int]
    combine_grid: tuple[int, int, int]
    split: Any  # the hinted decode_split kernel
    combine: Any  # decode_combine, or None with one split
    split_constants: tuple
    combine_constants: tuple
    pdl: bool
    scale: float
    tile_d: int
    variant: Variant  # its window and softcap are passed at launch; sinks: a Sinks array
    tile_n: int  # keys per step (key_walk mirrors the split kernel's walk with it)
    causal: bool  # the problem's causal mask (CAUSAL)
    share_keys: int  # BALANCED: the problem's longest cache (each split's share is 1 / splits
    # of it); else 0
    whole_rows: int  # TAIL: the rows before the split ones, whole batch entries; else 0
    whole_batches: int  # TAIL: the batch entries of those (the merge's Out starts after); else 0
    flat: FlatLaunches | None  # DecodeSchedule.flat: the flat walk's launches (split, combine
    # and their grids then unused); else None
    order_entries: int  # ORDERED: the batch entries decode_order ranks each call; else 0

    @property
    def scratch(self) -> bool:
        """Whether a call needs the float32 buffers of :func:`partial_shapes`."""
        return self.combine is not None or self.flat is not None or self.order_entries > 0


#: The SMs a flat walk's wave fills where no device is named (a compile-only build, whose code
#: does not depend on the grid): an H100's or H200's.
DEFAULT_SMS = 132


def launches(problem: Problem, schedule: DecodeSchedule, scale: float | None,
             window: tuple[int, int] | None = None, sms: int = DEFAULT_SMS) -> Launches:
    """The kernel objects, grids and constants of ``normalise(problem, schedule)``;
    ``window``: the call's ``(left, right)`` where it is not the problem's (``variant_of``);
    ``sms``: the device's SMs (a flat walk's wave; no other launch depends on them). A flat
    schedule with a call's window falls back to its one split."""
    schedule = normalise(problem, schedule)
    tiles = layout(problem, schedule)
    variant = variant_of(problem, window)
    split = split_constants(problem, schedule, variant)
    flat = (flat_launches(problem.batch, tiles, schedule, padded_head_dim(problem.head_dim),
                          split["PAGE_ROWS"], problem.page_size, problem.causal, sms,
                          problem.dtype)
            if schedule.flat and not variant.windowed else None)
    combine = combine_constants(problem, schedule, variant)
    tail = tail_rows(problem, schedule)
    whole = tiles.rows - tail if tail else 0
    merged = tail or tiles.rows  # the rows of partials
    return Launches(
        tiles=tiles, splits=schedule.splits,
        split_grid=((whole + tail * schedule.splits, 1, 1) if tail
                    else (tiles.rows, schedule.splits, 1)),
        combine_grid=(merged, math.ceil(problem.head_dim / combine["CHUNK_D"]), 1),
        split=split_kernel(schedule),
        combine=combine_kernel(schedule) if schedule.splits > 1 else None,
        split_constants=SPLIT_PARAMETERS.constant_values(split),
        combine_constants=COMBINE_PARAMETERS.constant_values(combine),
        pdl=bool(combine["PDL"]), scale=default_scale(problem) if scale is None else float(scale),
        tile_d=padded_head_dim(problem.head_dim), variant=variant, tile_n=schedule.tile_n,
        causal=problem.causal, share_keys=problem.seqlen_k if split["BALANCED"] else 0,
        whole_rows=whole, whole_batches=whole // (tiles.rows // problem.batch), flat=flat,
        order_entries=problem.batch if split["ORDERED"] else 0)


def launch(stream: Any, plan: Launches, q: Any, k: Any, v: Any, out: Any, offset: int,
           partials: tuple | None, sinks: Any = None, ranges: Any = None,
           pages: Any = None, descales: tuple | None = None, order: Any = None) -> None:
    """Enqueue the split kernel (and the combine) on ``stream``. ``out`` is preallocated like
    ``q``; ``partials``: the scratch of :func:`new_scratch` (``None`` with one split);
    ``sinks``: the contiguous float32 ``[H_q]`` sink logits when the plan's variant has sinks
    (the caller validates it), else ignored; ``ranges``: a ragged plan's int32
    ``[4, B]`` query and key ranges (:data:`UNUSED` otherwise: a parameter of no bytes);
    ``pages``: a paged plan's int32 ``[B, max_pages]`` block table (``k`` and ``v`` then the
    ``[pages, page_size, H_kv, D]`` pools, and ``ranges`` the int32 ``[B]`` key counts);
    ``descales``: an FP8 cache's float32 ``[B, H_kv]`` factors of k and v (its ``v`` then goes
    to the split kernel as :func:`fp8_words`). An ordered plan first ranks ``ranges`` into
    the scratch's order (:func:`rank_entries`), unless the caller ranked them already
    (``order``: :func:`rank_entries`' int32 ``[B]`` of these key counts, or of earlier
    ones: any order of the entries is right, the longest first is faster); a plan that
    is not ordered ignores ``order``. An ordered plan's split kernel is launched as a
    programmatic dependent either way (it waits for the kernel before it first)."""
    q5 = grouped_view(q, plan.tiles)
    out5 = grouped_view(out, plan.tiles)
    if plan.flat is not None:
        launch_flat(stream, plan.flat, q5, out5, k, v, partials, plan.scale, ranges, pages)
        return
    if descales is not None:
        v = fp8_words(v)
    opart, lse, scratch_order = partials if partials is not None else (None, None, UNUSED)
    if opart is None:  # one split: placeholders the kernel never reads
        opart = lse = out5
    if not plan.order_entries:
        order = UNUSED
    elif order is None:
        order = scratch_order
        rank_entries(stream, ranges, order)
    # An ordered split kernel waits for the kernel before it (the ranking, or whatever the
    # stream ran last) before it reads anything, so it may start as that one's dependent
    variant = plan.variant
    sink_arg = sinks if variant.sinks else NO_SINKS
    _aot.launch(stream, plan.split_grid, plan.split,
                (q5, k, v, out5, opart, lse, plan.scale, offset, plan.tiles.kv_div,
                 variant.window_left, variant.window_right, variant.softcap, sink_arg,
                 UNUSED if ranges is None else ranges, UNUSED if pages is None else pages,
                 *(descales or (UNUSED, UNUSED)), plan.share_keys or plan.whole_rows, order,
                 *plan.split_constants), programmatic_dependent_launch=bool(plan.order_entries))
    if plan.combine is not None:
        if plan.whole_batches:  # only the last entries' rows split: the merge writes those
            out5 = out5[plan.whole_batches:]
        _aot.launch(stream, plan.combine_grid, plan.combine,
                    (opart, lse, out5, sink_arg, *plan.combine_constants),
                    programmatic_dependent_launch=plan.pdl)


def rank_entries(stream: Any, lengths: Any, order: Any) -> None:
    """Enqueue ``decode_order`` on ``stream``: the int32 ``[B]`` ``order`` lists the entries of
    the int32 ``[B]`` key counts ``lengths`` longest first (equal counts in entry order). It
    lets a split kernel that follows it as a programmatic dependent start at once."""
    _aot.launch(stream, order_grid(lengths.shape[0]), order_kernel(),
                (lengths, order, ORDER_CHUNK))


def order_grid(entries: int) -> tuple[int, int, int]:
    """``decode_order``'s grid for a batch of ``entries``: :data:`ORDER_CHUNK` of them a CTA."""
    return (math.ceil(entries / ORDER_CHUNK), 1, 1)


def fp8_words(v: Any) -> Any:
    """An FP8 cache's V (torch, ``[..., D]`` float8_e4m3fn, unit stride along D) as what the
    split kernel reads: the same bytes as int16 words of two values, ``[..., D / 2]``; no copy
    but where a word would straddle two of V's elements' pairs (an odd offset or stride)."""
    import torch

    if v.storage_offset() % 2 or any(stride % 2 for stride in v.stride()[:-1]):
        v = v.contiguous()
    return v.view(torch.int16)


def new_scratch(plan: Launches, empty: Any) -> tuple | None:
    """The scratch a call of ``plan`` launches with, in float32 buffers of
    :func:`partial_shapes` that ``empty(shape)`` makes: (Opart, Lse, Order), the last two cut
    from the second buffer (Order's int32 entries after the log-sum-exps; the parameter of no
    bytes where the plan has no order, Opart and Lse None where it has one split), or a flat
    walk's three arrays (:func:`flat_scratch`), cut here once rather than in every call; None
    where the plan needs none."""
    if not plan.scratch:
        return None
    first, second = (empty(shape) for shape in partial_shapes(plan))
    if plan.flat is not None:
        return flat_scratch(plan.flat, first, second)
    rows, m = plan.combine_grid[0], plan.tiles.tile_m
    merged = rows * plan.splits * m if plan.combine is not None else 0
    opart, lse, order = None, None, UNUSED
    if merged:
        opart, lse = first, second[:merged].reshape(rows, plan.splits, m)
    if plan.order_entries:
        order = second[merged:]
        order = order.view(int32_of(order))
    return opart, lse, order


def int32_of(array: Any) -> Any:
    """int32 in ``array``'s library (torch or CuPy)."""
    if hasattr(array, "unflatten"):
        import torch

        return torch.int32
    return "int32"


def partial_shapes(plan: Launches) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the float32 buffers of :func:`new_scratch`: a multi-split plan's Opart (the
    tail's rows where only they split) and its log-sum-exps with an ordered plan's entries
    after them, or a flat one's (``flat_scratch_shapes``)."""
    if plan.flat is not None:
        return flat_scratch_shapes(plan.flat)
    rows, m = plan.combine_grid[0], plan.tiles.tile_m
    if plan.combine is None:  # one split, ordered: the order alone
        return (0,), (plan.order_entries,)
    return (rows, plan.splits, m, plan.tile_d), (rows * plan.splits * m + plan.order_entries,)


def key_walk(plan: Launches, seqlen_q: int, seqlen_k: int, offset: int
             ) -> list[list[tuple[int, int]]]:
    """The key tiles ``[start, stop)`` each (query tile, split) CTA of ``plan`` walks for a
    call of ``seqlen_q`` query rows against ``seqlen_k`` keys at causal offset ``offset``, per
    query tile: the split kernel's range arithmetic, in Python (what the CPU tests check the
    window's splits and their movement with a growing cache against). With ``tail_rows`` these
    are the split rows' walks; each row before them walks one split's."""
    t_n, t_s, splits = plan.tile_n, plan.tiles.tile_s, plan.splits
    variant = plan.variant
    causal = plan.causal
    walks = []
    for q_tile in range(-(-seqlen_q // t_s)):
        first_pos = q_tile * t_s
        last_pos = min(first_pos + t_s, seqlen_q) - 1
        if variant.windowed:
            far = 1 << 30
            reach_left = variant.window_left if variant.window_left >= 0 else far
            reach_right = variant.window_right if variant.window_right >= 0 else far
            if causal:
                reach_right = min(reach_right, 0)
            kv_start = max(min(first_pos + offset - reach_left, seqlen_k), 0)
            kv_end = max(min(seqlen_k, last_pos + offset + reach_right + 1), 0)
            first_tile = kv_start // t_n
            num_tiles = 0 if kv_end <= kv_start else -(-kv_end // t_n) - first_tile
        else:
            kv_end = seqlen_k
            if causal:
                kv_end = max(min(seqlen_k, last_pos + offset + 1), 0)
            first_tile, num_tiles = 0, -(-kv_end // t_n)
        per_split = -(-num_tiles // splits)
        if plan.share_keys and not variant.windowed:  # balanced: the longest cache's share
            share_tiles = -(-plan.share_keys // t_n)
            per_split = max(-(-share_tiles // splits), per_split)
        walk = []
        for split in range(splits):
            start = first_tile + min(split * per_split, num_tiles)
            walk.append((start, min(start + per_split, first_tile + num_tiles)))
        walks.append(walk)
    return walks
