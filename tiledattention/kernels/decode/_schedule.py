"""The typed schedule of the split-KV decode kernels (``tiledattention/kernels/decode/_kernel.py``).

A :class:`DecodeSchedule` is a frozen, keyword-only value; it round-trips through a plain,
versioned dict (``to_dict`` / ``from_dict``) like the forward family's ``Schedule``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core._schedule_value import ScheduleValue
from ...errors import ScheduleError

__all__ = ["DecodeSchedule", "COMBINES", "DECODE_SCHEDULE_FORMAT", "KEY_SLICES", "MIN_SLICE_KEYS"]

DECODE_SCHEDULE_FORMAT = 1
#: How the splits are merged: a second kernel walking a row's splits a few at a time, the same
#: launched as a programmatic dependent of the first (scheduled while the split kernel
#: drains), or a second kernel merging all of a row's splits from one tile (``"block"``), that
#: one too as a dependent launch (``"block_pdl"``).
COMBINES = ("kernel", "pdl", "block", "block_pdl")
_TILES_N = (16, 32, 64, 128, 256)
KEY_SLICES = (1, 2, 4, 8)
#: Fewest keys a slice of a key tile holds: the value product's reduction is 16 keys deep.
MIN_SLICE_KEYS = 16
TILES_M = (16, 32, 64, 128)  # ascending: normalise takes the first that tiles alike
MAX_SPLITS = 256
MAX_TAIL_ROWS = 1 << 20


@dataclass(frozen=True, kw_only=True)
class DecodeSchedule(ScheduleValue):
    """One point of the decode kernels' schedule space.

    Work split:
        splits: key ranges per (batch, K/V head) processed by separate CTAs (1..256); 1 writes
            the output directly, with no partials and no combine step.
        combine: ``"kernel"``, ``"pdl"`` (programmatic dependent launch), ``"block"`` (all of
            a row's splits merged from one tile) or ``"block_pdl"`` (both) for the merge.
        merge_occupancy: CTAs an SM the merge kernel is compiled for (1..32), or ``None``:
            no kernel option, the compiler's choice (for sm_90 to sm_121 the block merge takes
            255 registers at 256 threads, one CTA an SM however large its grid). With more
            than one split only.
        balanced: a ragged batch (per-entry cache lengths, a paged cache's) splits every
            entry's keys into shares of one size, 1 / ``splits`` of the call's longest cache
            (a paged call's ``max_k``, else its block table's capacity; an entry longer than
            that takes its own share), so a shorter cache takes fewer splits and every CTA
            streams as many keys; otherwise each entry's keys are divided into ``splits``
            shares of its own length.
        tail_rows: with ``splits`` > 1, only the last ``tail_rows`` rows (the layout's rows:
            batch x K/V heads x query tiles) split; the rows before run one CTA each, unsplit,
            and write the output directly, their CTAs scheduled first (0: every row splits).
            What a last wave of CTAs that one split leaves part-empty takes: its rows' splits
            fill it with shorter walks.
        flat: a paged batch's (row, key tile) items shared evenly by one wave of CTAs
            (``occupancy`` an SM), each walking its share row after row; rows its share
            cuts are merged after (``_flat_kernel``). Plain 16-bit paged caches only (no
            window, softcap or sinks); ``splits``, ``combine``, ``balanced`` and
            ``tail_rows`` then do not apply.
        longest_first: a paged batch's entries run longest cache first (a small kernel ranks
            their key counts each call; CTAs start in grid order, so a long walk no longer
            starts late and runs alone at the end). Paged caches without ``flat`` only.
    Tiles:
        tile_n: keys per inner-loop step (power of two, 16..256).
        tile_m: query rows per CTA (16..128): the packed heads of a group times as many query
            positions as fit (at least one position; at least 16 rows).
        pack_heads: pack the query heads that share a K/V head into one tile (each K/V tile is
            read once per K/V head); otherwise one query head per CTA.
        key_slices: fold each key tile as this many slices of ``tile_n / key_slices``
            consecutive keys (1, 2, 4 or 8), each slice with its own running max, denominator
            and accumulator, merged once after the walk: the warps of a CTA each take a slice
            and need not meet every step to reduce a row's max and sum across the tile. At
            least 16 keys a slice; 16-bit caches only. Off by default: on an H100 it ran
            slower on most calls measured (docs/records/benchmarks/paged/issue49, section 60).
    Kernel options and loads:
        occupancy (1..32), num_worker_warps (None, 4 or 8), k_latency / v_latency (1..10 or
        None), k_transposed (load K transposed), exp2 (base-2 softmax with flush-to-zero).
    """

    splits: int = 1
    combine: str = "kernel"
    merge_occupancy: int | None = None
    balanced: bool = False
    tail_rows: int = 0
    flat: bool = False
    longest_first: bool = False
    tile_n: int = 64
    tile_m: int = 16
    pack_heads: bool = True
    key_slices: int = 1
    occupancy: int = 1
    num_worker_warps: int | None = None
    k_latency: int | None = None
    v_latency: int | None = None
    k_transposed: bool = False
    exp2: bool = True

    FORMAT = DECODE_SCHEDULE_FORMAT
    LABEL = "decode"
    # a schedule without balanced splits, a tail, a flat walk, key slices or a merge occupancy
    # keeps the dict (and key) it had before they existed
    ADDED_FIELDS = ("balanced", "tail_rows", "flat", "longest_first", "key_slices",
                    "merge_occupancy")
    OMITTED_AT_DEFAULT = ADDED_FIELDS

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "DecodeSchedule":
        """Raise :class:`ScheduleError` naming the first impossible field; return ``self``."""
        self._check_int_range("splits", self.splits, 1, MAX_SPLITS)
        self._check_int_range("tail_rows", self.tail_rows, 0, MAX_TAIL_ROWS)
        if self.combine not in COMBINES:
            raise ScheduleError(f"DecodeSchedule.combine must be one of {list(COMBINES)}; got "
                                f"{self.combine!r}")
        self._check_choice("tile_n", self.tile_n, _TILES_N)
        self._check_choice("tile_m", self.tile_m, TILES_M)
        self._check_choice("key_slices", self.key_slices, KEY_SLICES)
        self._check_int_range("occupancy", self.occupancy, 1, 32)
        if self.merge_occupancy is not None:
            self._check_int_range("merge_occupancy", self.merge_occupancy, 1, 32, " or None")
        if self.num_worker_warps is not None:
            self._check_choice("num_worker_warps", self.num_worker_warps, (4, 8))
        for name in ("k_latency", "v_latency"):
            value = getattr(self, name)
            if value is not None:
                self._check_int_range(name, value, 1, 10)
        self._check_bools()
        return self

    def describe(self) -> str:
        """One-line summary, e.g. ``split16/pdl n128 m16 occ2 lat(K2,V2)`` (a merge compiled
        for four CTAs an SM: ``split16/pdl/occ4 ...``)."""
        parts = ["flat" if self.flat else
                 f"split{self.splits}" + (f"/{self.combine}" if self.splits > 1 else "")
                 + (f"/occ{self.merge_occupancy}" if self.merge_occupancy is not None else "")
                 + ("/bal" if self.balanced else "")
                 + (f"/tail{self.tail_rows}" if self.tail_rows else "")
                 + ("/longest" if self.longest_first else ""),
                 f"n{self.tile_n}", f"m{self.tile_m}", f"occ{self.occupancy}"]
        if not self.pack_heads:
            parts.append("unpacked")
        if self.key_slices > 1:
            parts.append(f"ks{self.key_slices}")
        if self.num_worker_warps is not None:
            parts.append(f"w{self.num_worker_warps}")
        if self.k_latency is not None or self.v_latency is not None:
            parts.append(f"lat(K{self.k_latency or '-'},V{self.v_latency or '-'})")
        if self.k_transposed:
            parts.append("Kt")
        if not self.exp2:
            parts.append("exp")
        return " ".join(parts)

