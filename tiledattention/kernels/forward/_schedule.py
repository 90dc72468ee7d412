"""The typed schedule of the attention kernel template.

A :class:`Schedule` is a frozen, keyword-only value: every field is one search dimension that
changes the compiled code (see ``tiledattention/kernels/forward/_kernel.py``). It round-trips through a
plain, versioned dict (``to_dict`` / ``from_dict``, :class:`ScheduleValue`'s, as the decode and
backward schedules do), which is what the database and the exporters store.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core._schedule_value import ScheduleValue

__all__ = ["Schedule", "SCHEDULE_FORMAT"]

#: Version of the dict form. Bump it when a field changes meaning; add a field with a default
#: that does what the kernel did before the field existed, and list it in
#: ``Schedule.ADDED_FIELDS``, to stay compatible (old dicts then read with that default).
SCHEDULE_FORMAT = 1

_POW2_TILES = (16, 32, 64, 128, 256)
_NUM_CTAS = (1, 2, 4, 8, 16)


@dataclass(frozen=True, kw_only=True)
class Schedule(ScheduleValue):
    """One point of the kernel's schedule space.

    Tile shape:
        tile_m: query rows per CTA (power of two, 16..256).
        tile_n: keys per inner-loop step (power of two, 16..256).
    Kernel options (``ct.kernel`` hints, applied with ``kernel.replace_hints``):
        occupancy: CTAs the compiler plans to keep resident per SM (1..32).
        num_ctas: CTAs per cluster (power of two, 1..16; matters on Blackwell).
        opt_level: tileiras optimisation level (0..3).
        num_worker_warps: warps per CTA (4 or 8 with tileiras 13.4; 1..32 powers of two with
            CUDA 13.5), or ``None`` to let the compiler choose.
    Loads:
        k_latency / v_latency: DRAM latency hint of the K / V loads (1..10), or ``None`` to let the
            compiler infer it.
        k_transposed: load K already transposed (``order=`` on the load) instead of loading it
            row-major and permuting the tile.
        allow_tma: allow the loads to lower to TMA.
    Math:
        exp2: base-2 exponent with log2(e) folded into the scale, flush-to-zero; else natural ``exp``.
        approx_div: approximate division (``RoundingMode.APPROX``) for the final normalisation.
    Work order (for L2 reuse and load balance):
        kv_sawtooth: odd query tiles walk K/V backwards, so neighbouring CTAs meet the same K/V
            tiles close together in time.
        longest_first: causal only: schedule the query tiles with the most keys first.
        unchecked_loads: drop bounds checks on K/V/Q loads when the shape is a multiple of the
            tiles (the launcher only enables it where it is safe).
        split_masked: walk the key tiles that need a mask (the causal diagonal, a ragged last
            tile) in a second loop, so the main loop has no per-step mask branch.
        persistent: launch ``occupancy`` CTAs per SM that walk the query tiles in a loop,
            instead of one CTA per query tile.
        paired_tiles: causal only: one work item is the pair of query tiles ``n-1-i`` and ``i``,
            so every item visits the same number of key tiles (the longer one goes first).
    Head dim:
        split_d: a head dim that is not a power of two runs as two power-of-two parts (96 as
            64 + 32, 80 as 64 + 16) in both matrix products, instead of one part padded to the
            next power of two (128) whose zero columns cost matrix work and registers.
    FP8 inputs:
        pv_wide: P·V in bfloat16 (each value tile widened from e4m3) instead of e4m3 (P
            shifted by 2^8 into e4m3's range): about ten times more accurate, slower.
        fast_acc: the e4m3 matrix products accumulate in the tensor core's own, narrower
            accumulator (``ct.mma(..., use_fast_acc=True)``, as FlashAttention-3 does) instead
            of each being summed into a fresh float32 tile that is then added to its
            accumulator (tileiras's default for e4m3: a float32 add an element and product).
    Grouped heads:
        pack_gqa: one CTA's ``tile_m`` rows are ``tile_m / group`` query positions of every
            query head of one K/V group (FlashAttention's pack-GQA), not ``tile_m`` positions
            of one head: each K/V tile is read once for the group, and a short sequence fills
            its tile with heads instead of padding. Runs where the group size is a power of
            two of at most ``tile_m``; elsewhere (and without grouped heads) the kernel runs
            unpacked (``normalise``).
    """

    tile_m: int = 64
    tile_n: int = 64
    occupancy: int = 1
    num_ctas: int = 1
    opt_level: int = 3
    num_worker_warps: int | None = None
    k_latency: int | None = None
    v_latency: int | None = None
    k_transposed: bool = False
    allow_tma: bool = True
    exp2: bool = False
    approx_div: bool = False
    kv_sawtooth: bool = False
    longest_first: bool = False
    unchecked_loads: bool = False
    split_masked: bool = False
    persistent: bool = False
    paired_tiles: bool = False
    split_d: bool = False
    pv_wide: bool = False
    fast_acc: bool = False
    pack_gqa: bool = False

    # The dict form's version, and its name in messages ("a schedule ...": the forward was the
    # first family, so its messages name no family). Fields added to the dict form after format
    # 1 was first written (commits a77892a, 705e29e, 0ea615d, a987216, e993c64): a stored dict
    # may lack them, and their defaults are what the kernel did before they existed (no
    # worker-warp hint, one loop, one CTA per tile, no pairs, one padded head-dim part). Every
    # other field is in every dict a format-1 writer wrote. ``split_d`` is left out of the dict
    # form at its default (so the rows stored before it keep their keys).
    FORMAT = SCHEDULE_FORMAT
    LABEL = ""
    ADDED_FIELDS = ("num_worker_warps", "split_masked", "persistent", "paired_tiles",
                    "split_d", "pv_wide", "fast_acc", "pack_gqa")
    OMITTED_AT_DEFAULT = ("split_d", "pv_wide", "fast_acc", "pack_gqa")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "Schedule":
        """Raise :class:`ScheduleError` naming the first impossible field; return ``self``."""
        for name in ("tile_m", "tile_n"):
            self._check_choice(name, getattr(self, name), _POW2_TILES)
        self._check_int_range("occupancy", self.occupancy, 1, 32)
        self._check_choice("num_ctas", self.num_ctas, _NUM_CTAS)
        self._check_int_range("opt_level", self.opt_level, 0, 3)
        if self.num_worker_warps is not None:
            self._check_choice("num_worker_warps", self.num_worker_warps, (1, 2, 4, 8, 16, 32))
        for name in ("k_latency", "v_latency"):
            value = getattr(self, name)
            if value is not None:
                self._check_int_range(name, value, 1, 10, extra=" or None")
        self._check_bools()
        return self

    def describe(self) -> str:
        """One-line human summary, e.g. ``128x64 occ2 exp2 approx Kt lat(K2,V4)``."""
        parts = [f"{self.tile_m}x{self.tile_n}", f"occ{self.occupancy}"]
        if self.num_ctas != 1:
            parts.append(f"cta{self.num_ctas}")
        if self.opt_level != 3:
            parts.append(f"O{self.opt_level}")
        if self.num_worker_warps is not None:
            parts.append(f"w{self.num_worker_warps}")
        parts.append("exp2" if self.exp2 else "exp")
        if self.approx_div:
            parts.append("approx")
        if self.k_transposed:
            parts.append("Kt")
        if self.k_latency is not None or self.v_latency is not None:
            parts.append(f"lat(K{self.k_latency or '-'},V{self.v_latency or '-'})")
        if not self.allow_tma:
            parts.append("noTMA")
        for flag in ("kv_sawtooth", "longest_first", "unchecked_loads", "split_masked",
                     "persistent", "paired_tiles", "split_d", "pv_wide", "fast_acc",
                     "pack_gqa"):
            if getattr(self, flag):
                parts.append(flag)
        return " ".join(parts)

