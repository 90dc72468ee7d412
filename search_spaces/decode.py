"""The decode family's search spaces: candidate values per architecture, the split counts worth
trying for a problem, and an analytic time model for the simulated backend."""

from __future__ import annotations

import math

from tiledattention import DECODE, DecodeSchedule, Problem
from tiledattention.kernels.decode import flat_applies, layout, rows_past_waves
from tiledattention.tooling import SM_COUNTS, generation

from ._space import FamilySpace, SearchSpace, register_space, smem_infeasibility

__all__ = ["DECODE_SPACE", "SPACES", "restricted", "model_ms", "infeasibility"]

_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Fewest key tiles of 64 a split should have (fewer: the split costs more than it streams).
_MIN_TILES_PER_SPLIT = 2

_FULL = {
    "splits": _SPLITS,
    "combine": ("pdl", "kernel", "block", "block_pdl"),
    # the merge kernel at the compiler's one CTA an SM (255 registers), or two or four an SM
    "merge_occupancy": (None, 2, 4),
    "balanced": (False, True),
    # every row split, or only those past whole waves of two CTAs an SM (``restricted`` puts
    # the problem's count in place of the 1, or drops the dimension where there is none)
    "tail_rows": (0, 1),
    "flat": (False, True),  # a paged batch's items shared evenly by one wave
    "longest_first": (False, True),  # a paged batch's entries longest cache first
    "tile_n": (32, 64, 128, 256),
    "tile_m": (16, 32, 64, 128),
    "occupancy": (1, 2, 3, 4),  # 3 and 4: defaults of one split at 172-660 rows on Hopper
    "num_worker_warps": (None, 8),
    "k_latency": (None, 2, 4),
    "v_latency": (None, 2, 4),
    "k_transposed": (False, True),
    "pack_heads": (True, False),
    "exp2": (True, False),
    # each key tile folded as slices of its keys (8 compiles to more instructions than 4)
    "key_slices": (1, 2, 4),
}
# What the shipped sm_90 rows were tuned over: the dimensions an H100 sweep showed to matter
# for S_q = 1 (docs/records/benchmarks/decode/README.md), the rest at the base schedule's values.
_COMPACT = {
    "splits": _SPLITS,
    "balanced": (False, True),
    "flat": (False, True),
    "longest_first": (False, True),
    "tile_n": (64, 128),
    "occupancy": (1, 2),
    "k_latency": (2, 4),
}
SPACES = {"full": _FULL, "compact": _COMPACT}
_BASE = DecodeSchedule(k_latency=2, v_latency=2, tile_n=128)


def _smem_bytes(problem: Problem, schedule: DecodeSchedule) -> int:
    """Shared memory of one pipeline stage: the query tile and one K and one V tile."""
    d = 1 << (problem.head_dim - 1).bit_length()
    return 2 * d * (layout(problem, schedule).tile_m + 2 * schedule.tile_n)


def infeasibility(arch: str, problem: Problem, schedule: DecodeSchedule) -> str | None:
    """Why ``schedule`` cannot work for ``problem`` on ``arch`` (static checks), or ``None``."""
    return smem_infeasibility(arch, _smem_bytes(problem, schedule))


def restricted(space: SearchSpace, problem: Problem) -> SearchSpace:
    """Split counts that leave every split at least two 64-key tiles; the combine strategy and
    the merge's occupancy only when there can be more than one split; balanced splits only for
    a ragged batch without a window (its entries' lengths differ); query-row tiling only when
    S_q > 1; splitting only the rows past whole waves of two CTAs an SM (``tail_rows``) only
    where some are, in a batch of one cache length (counted in whole batch entries, as
    ``normalise`` keeps it). A
    space that does not search the merge (``compact``) merges as the problem's default does:
    the base's stepping merge ran 0.56-1.04x the block merge on sixteen H200 calls
    (``docs/records/benchmarks/paged/issue49/README.md``, sections 8 and 9). The flat walk
    only where it applies (a plain 16-bit paged cache), and so the longest-first order (a paged
    batch of several entries). Key slices but for an FP8 cache (which folds whole tiles)."""
    choices = dict(space.choices)
    base = space.base
    if "combine" not in choices:
        base = base.replace(combine=DECODE.default_schedule(space.arch, problem).combine)
    most = max(1, math.ceil(problem.seqlen_k / 64) // _MIN_TILES_PER_SPLIT)
    choices["splits"] = tuple(n for n in choices.get("splits", (1,)) if n <= most) or (1,)
    names = [n for n in ("combine", "merge_occupancy") if choices["splits"] == (1,)]
    if not flat_applies(problem):
        names.append("flat")
    if not problem.page_size or problem.batch == 1:
        names.append("longest_first")
    if choices["splits"] == (1,) or not problem.ragged or problem.windowed:
        names.append("balanced")
    if problem.seqlen_q == 1:
        names.append("tile_m")
    if problem.kv_dtype:
        names.append("key_slices")
    if "tail_rows" in choices:
        tail = rows_past_waves(problem, base, 2 * SM_COUNTS[generation(space.arch)])
        if problem.ragged or choices["splits"] == (1,) or not tail:
            names.append("tail_rows")
        else:
            choices["tail_rows"] = (0, tail)
    restricted_space = SearchSpace(space.arch, choices, base, space.infeasibility)
    return restricted_space.without(*[n for n in names if n in choices])


def _space(name: str):
    def build(arch: str) -> SearchSpace:
        """The same candidates on every architecture; shared memory prunes per problem."""
        return SearchSpace(arch, dict(SPACES[name]), _BASE, infeasibility)
    return build


def model_ms(problem: Problem, schedule: DecodeSchedule) -> float:
    """A made-up analytic time on an sm_90-like GPU, for the simulated backend: the bytes of
    q, k, v and out at 3 TB/s times a penalty for too few or too many CTAs, plus 3 µs per
    launch."""
    moved = 2 * (2 * problem.batch * problem.heads_q * problem.seqlen_q * problem.head_dim
                 + 2 * problem.batch * problem.heads_kv * problem.seqlen_k * problem.head_dim)
    rows = layout(problem, schedule).rows
    tail = schedule.tail_rows if schedule.tail_rows < rows else 0  # 0: every row splits
    ctas = rows - tail + tail * schedule.splits if tail else rows * schedule.splits
    fill = min(1.0, ctas / 132) * (0.9 if ctas > 132 and ctas % 132 else 1.0)
    tiles = {64: 0.95, 128: 1.0, 256: 0.9}.get(schedule.tile_n, 0.9)
    launches = (1 if schedule.splits == 1 else 2) + schedule.longest_first
    if schedule.flat:  # one even wave, two launches
        fill, launches = 1.0, 2
    return moved / (3.0e12 * fill * tiles) * 1e3 + 0.003 * launches


DECODE_SPACE = register_space(FamilySpace(
    family=DECODE.name, spaces={name: _space(name) for name in SPACES},
    restrict=restricted, model_ms=model_ms))
