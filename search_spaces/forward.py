from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, fields
from typing import Any, Iterator, Mapping

from tiledattention._compile import check_arch
from tiledattention._problem import Problem, padded_head_dim
from tiledattention._schedule import Schedule


@dataclass(frozen=True)
class ArchLimits:
    """What the static feasibility check needs to know about an architecture."""

    family: str
    smem_per_sm: int  # bytes of shared memory a CTA may use, per SM
    max_num_ctas: int  # largest cluster worth searching


ARCH_LIMITS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits("ampere", 163 * 1024, 1),
    "sm_86": ArchLimits("ampere", 99 * 1024, 1),
    "sm_87": ArchLimits("ampere", 163 * 1024, 1),
    "sm_88": ArchLimits("ampere", 99 * 1024, 1),
    "sm_89": ArchLimits("ada", 99 * 1024, 1),
    "sm_90": ArchLimits("hopper", 227 * 1024, 2),
    "sm_100": ArchLimits("blackwell", 227 * 1024, 2),
    "sm_103": ArchLimits("blackwell", 227 * 1024, 2),
    "sm_107": ArchLimits("blackwell", 227 * 1024, 2),
    "sm_110": ArchLimits("blackwell", 227 * 1024, 2),
    "sm_120": ArchLimits("blackwell-consumer", 99 * 1024, 1),
    "sm_121": ArchLimits("blackwell-consumer", 99 * 1024, 1),
}


def _smem_bytes(problem: Problem, schedule: Schedule) -> int:
    """Shared memory one CTA needs: the Q tile plus one K and one V tile (this matches the
    ``.nv.shared`` size of compiled cubins on sm_90, e.g. 164,936 B for 64x128 at D=256).
    Occupancy is a hint: the compiler lowers it when the tiles do not fit twice."""
    d = padded_head_dim(problem.head_dim)
    elem = 2  # bf16 / fp16
    return elem * d * (schedule.tile_m + 2 * schedule.tile_n)


def infeasibility(arch: str, problem: Problem, schedule: Schedule) -> str | None:
    """Why ``schedule`` cannot work for ``problem`` on ``arch`` (static checks), or ``None``."""
    limits = ARCH_LIMITS[check_arch(arch)]
    need = _smem_bytes(problem, schedule)
    if need > limits.smem_per_sm:
        return (f"shared memory: ~{need // 1024} KiB per CTA exceeds "
                f"{limits.smem_per_sm // 1024} KiB per SM on {arch}")
    if schedule.num_ctas > limits.max_num_ctas:
        return f"num_ctas {schedule.num_ctas} > {limits.max_num_ctas} on {arch}"
    return None


@dataclass(frozen=True)
class SearchSpace:
    """Candidate values per :class:`Schedule` field; fields not listed keep ``base``'s value."""

    arch: str
    choices: Mapping[str, tuple[Any, ...]]
    base: Schedule = field(default_factory=Schedule)

    def __post_init__(self) -> None:
        known = {f.name for f in fields(Schedule)}
        for name, values in self.choices.items():
            if name not in known:
                raise ValueError(f"search space dimension {name!r} is not a Schedule field")
            if not values:
                raise ValueError(f"search space dimension {name!r} has no candidate values")

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.choices.values())

    def schedule(self, params: Mapping[str, Any]) -> Schedule:
        """The schedule of one point, given a value for each dimension."""
        return self.base.replace(**{name: params[name] for name in self.choices})

    def params(self, schedule: Schedule) -> dict[str, Any]:
        return {name: getattr(schedule, name) for name in self.choices}

    def contains(self, schedule: Schedule) -> bool:
        return all(getattr(schedule, n) in vals for n, vals in self.choices.items()) and all(
            getattr(schedule, f.name) == getattr(self.base, f.name)
            for f in fields(Schedule) if f.name not in self.choices
        )

    def __iter__(self) -> Iterator[Schedule]:
        names = list(self.choices)
        for values in itertools.product(*(self.choices[n] for n in names)):
            yield self.schedule(dict(zip(names, values)))

    def feasible(self, problem: Problem) -> list[Schedule]:
        return [s for s in self if infeasibility(self.arch, problem, s) is None]

    def restricted(self, problem: Problem) -> "SearchSpace":
        """Drop dimensions that cannot matter for ``problem`` (causal work order, tile pairing
        and the masked loop split when it is not causal) or that measured slower everywhere for
        its kind."""
        choices = dict(self.choices)
        if problem.causal:
            # persistent CTAs measured 0.75-0.95x the per-tile grid in 16 of 17 causal cases
            # on an H100, equal in one: a static round-robin over tiles of unequal length
            # leaves SMs idle at the end (docs/performance-notes.md)
            choices.pop("persistent", None)
        else:
            choices.pop("longest_first", None)
            choices.pop("split_masked", None)
            choices.pop("paired_tiles", None)
        return SearchSpace(self.arch, choices, self.base)


# Named spaces. "full" is what the tuner searches; "compact" is small enough to sweep
# exhaustively (the tuner is measured against that sweep).
_FULL = {
    "tile_m": (64, 128, 256),
    "tile_n": (32, 64, 128),
    "occupancy": (1, 2, 3, 4),
    "num_worker_warps": (None, 8),
    "k_latency": (None, 2, 4),
    "v_latency": (None, 2, 4),
    "exp2": (True, False),
    "approx_div": (True, False),
    "k_transposed": (True, False),
    "kv_sawtooth": (False, True),
    "longest_first": (False, True),
    "unchecked_loads": (False, True),
    "split_masked": (False, True),
    "persistent": (False, True),
    "paired_tiles": (False, True),
}
_COMPACT = {
    "tile_m": (64, 128),
    "tile_n": (64, 128),
    "occupancy": (1, 2),
    "k_latency": (None, 4),
    "exp2": (True, False),
    "approx_div": (True, False),
    "k_transposed": (True, False),
}
SPACES = {"full": _FULL, "compact": _COMPACT}


def space_for(arch: str, name: str = "full") -> SearchSpace:
    """The search space of ``arch``. Architectures differ in what is worth searching: clusters
    (``num_ctas``) only on Hopper and datacenter Blackwell, small tiles on consumer parts."""
    limits = ARCH_LIMITS[check_arch(arch)]
    if name not in SPACES:
        raise ValueError(f"space must be one of {sorted(SPACES)}; got {name!r}")
    choices = dict(SPACES[name])
    if name == "full" and limits.max_num_ctas > 1:
        choices["num_ctas"] = tuple(2 ** i for i in range(limits.max_num_ctas.bit_length()))
    if limits.family in ("blackwell-consumer", "ampere", "ada"):
        choices["tile_m"] = tuple(t for t in choices["tile_m"] if t <= 128) or (64,)
        choices["tile_n"] = tuple(t for t in choices["tile_n"] if t <= 64) or (64,)
    return SearchSpace(arch, choices)


# The untuned fallback ("seed") schedule: what the first kernel shipped with.
SEED = Schedule(tile_m=64, tile_n=64, occupancy=1)


def default_schedule(arch: str, problem: Problem) -> Schedule:
    """Per-architecture default, used when no tuned schedule is known for a shape.

    sm_90 (``docs/tuning.md``, ``docs/performance-notes.md``): for D <= 128 the best of ten
    hand-picked schedules (H200), 64x128 tiles at occupancy 2 with exp2, approximate division
    and K loaded transposed; causal with S_q >= 4k, the same 128-row tile split over a cluster of
    two CTAs, longest query tiles first (H100 probe 8: 0.99-1.24x the 64x128 default on the 12
    D64/D128 bf16/fp16 points with S >= 4k, 1.13-1.24x at D128 S >= 8k; 0.97-1.02x below 4k).
    For D > 128 the schedule the tuner found for every D=256 key with S >= 4k (128x128, 8 worker
    warps, occupancy 3), 1.2-1.36x faster than 64x128 there; causal, with query tiles paired
    (H100 probe 11, bf16: 1.03x, 1.08x, 1.11x, 1.12x, 1.10x the unpaired schedule at S = 1k,
    2k, 4k, 8k, 16k). Other architectures get the choices public cuTile attention code reports
    as good there (not measured by this project).
    """
    family = ARCH_LIMITS[check_arch(arch)].family
    fast_math = dict(exp2=True, approx_div=True, k_transposed=True)
    if family == "hopper":
        if problem.head_dim > 128:
            return Schedule(tile_m=128, tile_n=128, occupancy=3, num_worker_warps=8, exp2=True,
                            k_transposed=True, k_latency=4, v_latency=2,
                            paired_tiles=problem.causal)
        if problem.causal and problem.seqlen_q >= 4096:
            return Schedule(tile_m=128, tile_n=128, occupancy=2, num_ctas=2, longest_first=True,
                            **fast_math)
        return Schedule(tile_m=64, tile_n=128, occupancy=2, **fast_math)
    if family == "blackwell":
        return Schedule(tile_m=128, tile_n=128, occupancy=2, **fast_math)
    # consumer Blackwell, Ada, Ampere: 99-163 KiB of shared memory per SM
    return Schedule(tile_m=64, tile_n=64, occupancy=2 if problem.head_dim <= 128 else 1,
                    **fast_math)
