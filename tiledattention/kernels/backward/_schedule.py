"""The typed schedule of the backward kernels (``tiledattention/kernels/backward/_kernel.py``).

A :class:`BackwardSchedule` is a frozen, keyword-only value; it round-trips through a plain,
versioned dict (``to_dict`` / ``from_dict``) like the other families' schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core._schedule_value import ScheduleValue
from ...errors import ScheduleError

__all__ = ["BackwardSchedule", "BACKWARD_SCHEDULE_FORMAT", "TILES", "SPLITS", "DQ_MODES"]

BACKWARD_SCHEDULE_FORMAT = 1
TILES = (16, 32, 64, 128, 256)
SPLITS = (1, 2, 4, 8, 16)
#: how dQ is computed: "kernel", by the dQ kernel (deterministic); "atomic", by the dK/dV
#: kernel's walk, added into a float32 accumulator (one pass; the order of the additions, and
#: so the last bits of dQ, vary run to run)
DQ_MODES = ("kernel", "atomic")


@dataclass(frozen=True, kw_only=True)
class BackwardSchedule(ScheduleValue):
    """One point of the backward kernels' schedule space.

    dK/dV kernel (one CTA per key tile and (batch, K/V head); it walks query tiles):
        dkdv_tile_n: keys per CTA; dkdv_tile_m: query rows per step (powers of two, 16..256);
        dkdv_occupancy (1..32); dkdv_worker_warps (None, 4 or 8);
        q_latency: latency hint of its streamed Q / dO loads (1..10, or None: the compiler's).
        dkdv_splits: CTAs sharing one key tile's walk over (query head, query tile) pairs
        (1, 2, 4, 8, 16); above 1 each stores float32 partials that a small kernel adds in a
        fixed order. More CTAs where key tiles x K/V heads leave SMs idle (multi-query heads).
    dQ kernel (one CTA per query tile and (batch, query head); it walks key tiles; it also
    computes the row sums of dO * O the dK/dV kernel reads):
        dq_tile_m: query rows per CTA; dq_tile_n: keys per step; dq_occupancy;
        dq_worker_warps; kv_latency: latency hint of its streamed K / V loads;
        dq_heavy_first (causal only): launch the query tiles that see the most keys first.
        dq_pack_gqa: one CTA's ``dq_tile_m`` rows are ``dq_tile_m / group`` query positions
        of every query head of one K/V group (FlashAttention's pack-GQA, as the forward's
        ``pack_gqa``), not ``dq_tile_m`` positions of one head: each K/V tile the dQ kernel
        loads serves the group, and a short sequence fills its tile with heads instead of
        padding. Runs where the group size is a power of two of at most ``dq_tile_m``;
        elsewhere, and one-pass, the kernel runs unpacked (``normalise``).
    Both kernels: tile_major (causal only): order both grids tile by tile, every (batch,
    head) CTA of one tile before the next tile's, so the longest causal walks start first.
    dq_mode: "kernel" runs the dQ kernel above (bitwise reproducible); "atomic" (the one-pass
    backward) runs no dQ kernel: a small kernel computes ``delta``, the dK/dV kernel also
    computes each (query tile, key tile) pair's share of dQ and adds it into a float32
    accumulator by a bulk reduce-add, and a last kernel scales and casts it (the dq_* fields
    and dq_heavy_first then do not apply).
    split_d: a head dim that is not a power of two runs as two power-of-two parts in both
    kernels (96 as 64 + 32, 72 and 80 as 64 + 16, 192 as 128 + 64: the forward's
    ``head_dim_parts``) instead of one part padded to the next power of two; every matrix
    product shrinks with it. Without effect (``normalise``) where the parts would not cover
    fewer columns.
    """

    dkdv_tile_n: int = 64
    dkdv_tile_m: int = 64
    dkdv_occupancy: int = 1
    dkdv_worker_warps: int | None = None
    q_latency: int | None = None
    dq_tile_m: int = 64
    dq_tile_n: int = 64
    dq_occupancy: int = 1
    dq_worker_warps: int | None = None
    kv_latency: int | None = None
    dkdv_splits: int = 1
    dq_heavy_first: bool = False
    tile_major: bool = False
    dq_mode: str = "kernel"
    split_d: bool = False
    dq_pack_gqa: bool = False

    FORMAT = BACKWARD_SCHEDULE_FORMAT
    LABEL = "backward"
    #: added after format 1 was first written; their defaults are what the kernels did before
    ADDED_FIELDS = ("dkdv_splits", "dq_heavy_first", "tile_major", "dq_mode", "split_d",
                    "dq_pack_gqa")
    #: left out of the dict form at its default, so that the rows stored before it keep their
    #: keys
    OMITTED_AT_DEFAULT = ("split_d", "dq_pack_gqa")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "BackwardSchedule":
        """Raise :class:`ScheduleError` naming the first impossible field; return ``self``."""
        for name in ("dkdv_tile_n", "dkdv_tile_m", "dq_tile_m", "dq_tile_n"):
            self._check_choice(name, getattr(self, name), TILES)
        for name in ("dkdv_occupancy", "dq_occupancy"):
            self._check_int_range(name, getattr(self, name), 1, 32)
        for name in ("dkdv_worker_warps", "dq_worker_warps"):
            if getattr(self, name) is not None:
                self._check_choice(name, getattr(self, name), (4, 8))
        for name in ("q_latency", "kv_latency"):
            if getattr(self, name) is not None:
                self._check_int_range(name, getattr(self, name), 1, 10)
        self._check_choice("dkdv_splits", self.dkdv_splits, SPLITS)
        self._check_bools()
        if not isinstance(self.dq_mode, str) or self.dq_mode not in DQ_MODES:
            raise ScheduleError(f"BackwardSchedule.dq_mode must be one of {list(DQ_MODES)}; "
                                f"got {self.dq_mode!r}")
        return self

    def describe(self) -> str:
        """One-line summary, e.g. ``dkdv n128 m64 occ1 | dq m64 n64 occ2``."""
        def part(label: str, a: int, b: int, occ: int, warps: int | None,
                 latency: int | None) -> str:
            text = f"{label} {a}x{b} occ{occ}"
            if warps is not None:
                text += f" w{warps}"
            if latency is not None:
                text += f" lat{latency}"
            return text

        dkdv = part("dkdv", self.dkdv_tile_n, self.dkdv_tile_m, self.dkdv_occupancy,
                    self.dkdv_worker_warps, self.q_latency)
        if self.dkdv_splits > 1:
            dkdv += f" split{self.dkdv_splits}"
        tail = (" | tile-major" if self.tile_major else "") + (" | split-d" if self.split_d else "")
        if self.dq_mode == "atomic":
            return dkdv + " | dq atomic" + tail
        dq = part("dq", self.dq_tile_m, self.dq_tile_n, self.dq_occupancy,
                  self.dq_worker_warps, self.kv_latency)
        return (f"{dkdv} | {dq}" + (" heavy-first" if self.dq_heavy_first else "")
                + (" pack-gqa" if self.dq_pack_gqa else "") + tail)

