"""The backward family's per-architecture default schedule: what runs for a shape nobody tuned
and the shipped table does not cover."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core._compile import SM_COUNTS, generation
from ...core._problem import Problem, head_dim_parts, packable, padded_head_dim
from ._launch import dkdv_walk, normalise, reach, unequal_walks
from ._schedule import SPLITS, BackwardSchedule

__all__ = ["default_backward_schedule", "dkdv_splits", "waves", "WAVES", "FILL", "SHORT_WALK",
           "TILE_MAJOR_WAVES", "WINDOW_TILE_FLOOR", "heaviest_last", "DQ_MODE",
           "SOFTCAP_ONE_PASS", "OnePassRule", "softcap_one_pass_rule",
           "deterministic_backward_schedule", "SPLIT_FIELDS", "PACK_DQ_MAX_ROWS",
           "packs_dq_heads"]

#: Hopper defaults by padded head dim, from an H100 sweep of each kernel alone at the bench
#: grid's S = 4k points, bf16, causal and not (scripts/backward_probe.py at 6113995; numbers in
#: docs/records/benchmarks/backward/README.md). Two CTAs per SM paid 1.3-1.8x in both kernels at
#: D <= 128; at D = 256 the dK/dV kernel's two [64, 256] float32 accumulators need 8 worker
#: warps (3.4x faster than without) and Q/dO loads issued ahead (+8% at three steps on the
#: H100; on an H200 two steps ran 1.02-1.04x three on five D 256 calls, whose kernel spills
#: 87 local loads: docs/records/probes/backward_splits.py --latency,
#: docs/records/benchmarks/backward/split-head-dim/).
_HOPPER = {
    64: BackwardSchedule(dkdv_tile_n=64, dkdv_tile_m=128, dkdv_occupancy=2,
                         dq_tile_m=64, dq_tile_n=64, dq_occupancy=2),
    128: BackwardSchedule(dkdv_tile_n=64, dkdv_tile_m=64, dkdv_occupancy=2,
                          dq_tile_m=128, dq_tile_n=64, dq_occupancy=2, dq_worker_warps=8),
    256: BackwardSchedule(dkdv_tile_n=64, dkdv_tile_m=64, dkdv_worker_warps=8, q_latency=2,
                          dq_tile_m=64, dq_tile_n=64, dq_occupancy=2),
}
#: Elsewhere (not measured here): Hopper's tiles, one CTA per SM (the consumer parts and Ampere
#: have less shared memory and register file per CTA to share).
_OTHER = {d: s.replace(dkdv_occupancy=1, dq_occupancy=1) for d, s in _HOPPER.items()}


#: Waves of CTAs (SMs x the dK/dV kernel's occupancy) the dK/dV grid should fill before its walk
#: is split: one without a mask (every CTA does the same work), two with one (causal walks
#: differ in length). From the H100 probes of issue 31 (scripts/backward_parallel_probe.py at
#: c05e939; docs/records/benchmarks/backward/training.md): the multi-query B1 H8/1 S6144 D128
#: causal backward ran 2.5x faster with 8 splits and tile-major grids (96 CTAs -> 768; probes 1
#: and 3), B4 H8/1 S2048 D96 full 1.41x with 2; with tile-major grids, splitting a causal grid
#: that fills two waves cost 5-15% (B1 H32/8 S4096, B2 H32/8 S2048 D64, B1 H32/4 S8192), as did
#: splitting a full grid (MHA S8192 full, D256 at one CTA per SM).
WAVES = {False: 1, True: 2}  # by unequal_walks (the causal mask, a one-sided window)
#: A grid within this share of its waves counts as filling them.
FILL = 0.9
#: A dK/dV walk of at most this many (query head, query tile) pairs per key tile is not split,
#: however few CTAs its grid has: each split would walk a pair or a few, and the float32
#: partials and their two sums cost more than the parallelism gives. On an H200
#: (docs/records/probes/backward_splits.py; docs/records/benchmarks/backward/host-time.md) one
#: split ran 1.19-1.53x the GPU time of the wave rule's 2-4 splits on five such D 64 calls
#: (walks of 2-16 pairs, B 1-2, H 8-16, S 256-2048), and 1.20-1.45x with the host counted;
#: walks of 32 pairs or more gained from their splits (one split at 0.30-0.93x on nine calls,
#: grouped and multi-query heads, D 64-128). Between the two: not measured, split as before.
SHORT_WALK = 16
#: Most waves a causal dK/dV grid (split) may have for the default to launch tile-major. With
#: few waves the longest walks finishing last leave SMs idle and tile-major pays (1.02-1.25x on
#: eleven causal shapes of 1.9-5.7 waves, H100, issue 31); with many, CTAs of many heads run
#: side by side and lose the L2's reuse of one head's Q and dO (B1 H8 S16384: 7.8 waves,
#: 0.95x; B16 H16 S1024 D64: 15.5 waves, 0.72x).
TILE_MAJOR_WAVES = 6
#: With a window of ``span`` keys a row (both sides bounded, or left-bounded and causal), no
#: tile is larger than ``max(WINDOW_TILE_FLOOR, next power of two of span)``: a larger one
#: computes mostly masked scores (a dQ tile of 128 rows under a 32-key window walks 160 keys
#: for 32 used per row; 64 rows walk 96). Not measured: from the walk's arithmetic, and kept at
#: 64 or more, the tiles the measured defaults use.
WINDOW_TILE_FLOOR = 64
_TILE_FIELDS = ("dkdv_tile_n", "dkdv_tile_m", "dq_tile_m", "dq_tile_n")
#: A head dim of two power-of-two parts (40, 72, 80, 96, 160, 192: ``head_dim_parts``) runs as
#: them (``split_d``), with these fields of the padded default's entry replaced (by padded head
#: dim): split, the D <= 128 entry's dQ kernel (128 rows, 8 worker warps) fits two CTAs an SM
#: and then gets 80 registers a thread and spills (192 bytes of stack; the padded one is held to
#: one CTA by its 232 KB of shared memory, where occupancy 1 and 2 compile to the same code)
#: (sm_90 SASS, cuobjdump). The D 256 entry's dK/dV kernel, whose Q/dO loads three steps ahead
#: spilled more split (D 160: 312 local loads), loads two ahead (none). On an H200
#: (docs/records/probes/backward_split_d_fields.py; docs/records/benchmarks/backward/
#: split-head-dim/) these ran 1.12-1.21x the padded default at D 72, 80 and 96 (GPU time;
#: 1.11-1.20x isolated), 1.47x at D 160 and 1.25x at D 192 (against the padded default with
#: loads three steps ahead), where the split kernels with the padded entry's fields ran
#: 0.85-0.88x at D 96 and D 160.
SPLIT_FIELDS = {64: {}, 128: {"dq_occupancy": 1}, 256: {}}
#: The default ``dq_mode`` by GPU generation ("kernel" where not listed): the one-pass backward
#: (dQ added into a float32 accumulator by the dK/dV kernel) only where it was measured faster.
#: Hopper keeps the dQ kernel: on an H200 the one-pass backward with the default's dK/dV fields
#: ran 0.69-0.94x its speed on six training shapes (D 64-256, GQA 1-48, causal and full; at best
#: 0.75-0.94x with one CTA per SM; docs/records/benchmarks/backward/onepass.md). Elsewhere:
#: not measured.
DQ_MODE: dict[str, str] = {}


@dataclass(frozen=True, kw_only=True)
class OnePassRule:
    """Where a default runs one-pass: with these dK/dV ``fields`` (replacing the two-kernel
    default's), for problems whose rows see at least ``min_span`` keys (or all of them)."""

    fields: Mapping[str, int]
    min_span: int


#: Capped scores (``softcap``) run one-pass where listed, by padded head dim: the two-kernel
#: backward computes every score's tanh twice (once in each kernel), the one-pass once. On an
#: H200 (docs/records/benchmarks/backward/softcap.md) the one-pass ran 1.23-1.46x the two-kernel
#: default on five swept softcap shapes, and as this default 1.17-1.54x on nine others (D 64-256,
#: GQA 1-8, causal and full, bf16 and fp16, windows of 512 keys to unbounded): at D <= 128 with
#: 128-key x 64-row dK/dV tiles, one CTA per SM and 8 worker warps (the two-kernel fields run
#: one-pass: 0.71-1.14x), at D 256 with the two-kernel default's dK/dV fields as they were then
#: (Q/dO loads three steps ahead; the one-pass kernel does not spill there), and padded: split
#: there (D 192) ran 0.94-0.95x, where D 72, 80 and 96 split ran 1.10-1.23x
#: (docs/records/probes/backward_splits.py --split-d --softcap). Under a narrow
#: window each key tile's walk is a few query tiles and the float32 adds into dQ cost more than
#: the second kernel: at D 128 a 512- or 128-key window ran 0.79-0.93x one-pass, at D 256 a
#: 512-key window 1.17-1.30x (1024 at D <= 128 lies between a measured loss at 512 and a gain at
#: 1536; not measured itself).
_WIDE_ONE_PASS = {"dkdv_tile_n": 128, "dkdv_tile_m": 64, "dkdv_occupancy": 1,
                  "dkdv_worker_warps": 8}
SOFTCAP_ONE_PASS: dict[str, dict[int, OnePassRule]] = {"hopper": {
    64: OnePassRule(fields=_WIDE_ONE_PASS, min_span=1024),
    128: OnePassRule(fields=_WIDE_ONE_PASS, min_span=1024),
    256: OnePassRule(fields={"q_latency": 3, "split_d": False}, min_span=512)}}


def heaviest_last(problem: Problem) -> bool:
    """Whether the dQ kernel's last query tiles walk the most keys and the dK/dV kernel's
    first key tiles the most query tiles: with the causal mask (a left window only trims the
    ramp's start), or a window bounded on the right only."""
    return problem.causal or (problem.window_right >= 0 and problem.window_left < 0)


def _window_tiles(problem: Problem, schedule: BackwardSchedule) -> BackwardSchedule:
    """``schedule`` with tiles capped for a window of bounded span (``WINDOW_TILE_FLOOR``)."""
    left, right = reach(problem)
    span = left + right + 1
    if span >= problem.seqlen_q + problem.seqlen_k:  # a side is unbounded
        return schedule
    cap = max(WINDOW_TILE_FLOOR, 1 << (span - 1).bit_length())
    return schedule.replace(**{name: min(getattr(schedule, name), cap) for name in _TILE_FIELDS})


def waves(arch: str, problem: Problem, schedule: BackwardSchedule, splits: int,
          sms: int = 0) -> float:
    """The dK/dV grid's CTAs (key tiles x batch x K/V heads x ``splits``) over one wave of
    ``sms`` SMs (0: the generation's ``SM_COUNTS``) x the dK/dV kernel's occupancy."""
    ctas = -(-problem.seqlen_k // schedule.dkdv_tile_n) * problem.batch * problem.heads_kv
    return ctas * splits / ((sms or SM_COUNTS[generation(arch)]) * schedule.dkdv_occupancy)


def dkdv_splits(arch: str, problem: Problem, schedule: BackwardSchedule, sms: int = 0) -> int:
    """The fewest dK/dV splits (a power of two, at most 16) with which the dK/dV grid fills
    ``WAVES[unequal_walks]`` waves (``FILL`` of them counts). Splitting only grids short of their
    waves bounds the partials: fewer than two waves' key tiles of float32 dK and dV (at most
    0.1 GiB at D = 256 on 148 SMs)."""
    splits = 1
    while (splits < SPLITS[-1]
           and waves(arch, problem, schedule, splits, sms)
           < FILL * WAVES[unequal_walks(problem)]):
        splits *= 2
    return splits


#: A packed batch whose longest sequence (its bucket: the next power of two) is at most this
#: many tokens packs each K/V group's query heads into one dQ tile on sm_90 (``dq_pack_gqa``,
#: :func:`packs_dq_heads`).
PACK_DQ_MAX_ROWS = 512


def packs_dq_heads(arch: str, problem: Problem, schedule: BackwardSchedule) -> bool:
    """Whether the default packs a K/V group's query heads into one dQ tile (``dq_pack_gqa``,
    ``docs/records/benchmarks/backward/pack-gqa.md``): on sm_90, for a packed batch
    (``ragged``) of sequences of at most ``PACK_DQ_MAX_ROWS`` tokens whose group the dQ tile
    can hold (``packable``). On an H200 the backward ran 1.07-1.34x the same schedule
    unpacked on four such batches (groups 4, 8 and 16, D 64 and 128; their sequences end
    inside tiles, which packing fills with heads), but 0.93-0.99x on four batches reaching
    2-8k tokens and 0.93-1.00x on five dense training calls (D 64-128, groups 4-8)."""
    return (generation(arch) == "hopper" and problem.ragged
            and problem.seqlen_q <= PACK_DQ_MAX_ROWS and packable(problem, schedule.dq_tile_m))


def _default(arch: str, problem: Problem, sms: int = 0, **fields: Any) -> BackwardSchedule:
    """Per-architecture default by head dim (``_HOPPER`` on sm_90, else ``_OTHER``; ``fields``
    replace its own; ``sms``: the device's SMs, 0 for the generation's), tiles capped for a narrow
    window (``WINDOW_TILE_FLOOR``), its dK/dV walk split over enough CTAs to fill the GPU
    (``dkdv_splits``; ``normalise`` caps them at the windowed walk), and where the walks grow
    towards the dQ grid's end (``heaviest_last``: a causal mask) the longest walks first: the dQ
    kernel's last query tiles (H100 probe 2 of issue 31: 0-3% faster on six causal training shapes,
    never slower) and, where the dK/dV grid is at most ``TILE_MAJOR_WAVES`` waves, both grids
    tile-major; tiles capped at what the problem needs (``normalise``); a walk of at most
    ``SHORT_WALK`` pairs stays unsplit; a head dim of two parts split into them, with
    ``SPLIT_FIELDS``. A ragged problem's default is the same tiles, unordered (``normalise``) and
    unsplit (its bucket's waves are not its sequences'; of seven packed batches, splits paid on one:
    ``docs/records/benchmarks/backward/pack-gqa.md``), its dQ tiles packed by group where
    :func:`packs_dq_heads` says so."""
    table = _HOPPER if generation(arch) == "hopper" else _OTHER
    padded = max(64, padded_head_dim(problem.head_dim))
    entry = table[padded]
    if head_dim_parts(problem.head_dim, True)[1]:
        entry = entry.replace(split_d=True, **SPLIT_FIELDS[padded])
    entry = entry.replace(**fields)
    base = normalise(problem, _window_tiles(problem, entry))
    splits = dkdv_splits(arch, problem, base, sms)
    if (problem.ragged
            or problem.group_size * dkdv_walk(problem, base.dkdv_tile_n, base.dkdv_tile_m)
            <= SHORT_WALK):
        splits = 1
    longest_first = heaviest_last(problem)
    return normalise(problem, base.replace(
        dkdv_splits=splits, dq_heavy_first=longest_first,
        tile_major=(longest_first
                    and waves(arch, problem, base, splits, sms) <= TILE_MAJOR_WAVES),
        dq_pack_gqa=packs_dq_heads(arch, problem, base)))


def softcap_one_pass_rule(arch: str, problem: Problem) -> OnePassRule | None:
    """``SOFTCAP_ONE_PASS``'s rule for a capped-score ``problem`` on ``arch`` (by generation
    and padded head dim), or None (no softcap, a ragged batch, or not listed)."""
    rules = SOFTCAP_ONE_PASS.get(generation(arch))
    if rules is None or not problem.softcap or problem.ragged:
        return None
    return rules[max(64, padded_head_dim(problem.head_dim))]


def _softcap_one_pass(arch: str, problem: Problem) -> dict[str, Any] | None:
    """The one-pass fields (``dq_mode="atomic"`` among them) of
    :func:`softcap_one_pass_rule`, or None: no rule, or a window narrower than its span."""
    rule = softcap_one_pass_rule(arch, problem)
    if rule is None:
        return None
    left, right = reach(problem)
    span = left + right + 1  # past S_q + S_k where a side is unbounded
    if span < min(rule.min_span, problem.seqlen_q + problem.seqlen_k):
        return None
    return dict(rule.fields, dq_mode="atomic")


def default_backward_schedule(arch: str, problem: Problem, sms: int = 0) -> BackwardSchedule:
    """The two-kernel default above (``dq_mode="kernel"``), run one-pass where
    ``SOFTCAP_ONE_PASS`` (capped scores) or ``DQ_MODE`` say so for the generation
    (``normalise``: never for a ragged problem); its waves counted on ``sms`` SMs (0: the
    generation's ``SM_COUNTS``)."""
    one_pass = _softcap_one_pass(arch, problem)
    if one_pass is not None:
        return _default(arch, problem, sms, **one_pass)
    schedule = _default(arch, problem, sms)
    mode = DQ_MODE.get(generation(arch), "kernel")
    return schedule if mode == "kernel" else normalise(problem, schedule.replace(dq_mode=mode))


def deterministic_backward_schedule(arch: str, problem: Problem,
                                    schedule: BackwardSchedule) -> BackwardSchedule:
    """``schedule`` where its results are bitwise reproducible run to run; a one-pass schedule
    (``dq_mode="atomic"``: the order of the float32 additions into dQ varies) gives way to the
    architecture's two-kernel default for the problem (a one-pass schedule's dK/dV fields are
    chosen for its extra float32 tile: one CTA per SM, 8 worker warps, 128-key tiles at
    D <= 128 by ``SOFTCAP_ONE_PASS``, not the two-kernel walk's best)."""
    schedule = normalise(problem, schedule)
    if schedule.dq_mode == "kernel":
        return schedule
    return _default(arch, problem)
