"""The forward family's search spaces: candidate values per architecture, static feasibility,
the dimensions that cannot matter for a problem, and an analytic time model for simulation."""

from __future__ import annotations

from tiledattention import FORWARD, Problem, Schedule
from tiledattention.kernels.forward import head_dim_parts, packable
from tiledattention.tooling import FP8_DTYPES, array_itemsize

from ._space import (FamilySpace, SearchSpace, arch_limits, register_space,
                     smem_infeasibility)

__all__ = ["FORWARD_SPACE", "infeasibility", "restricted", "model_ms", "SPACES"]


def _smem_bytes(problem: Problem, schedule: Schedule) -> int:
    """Shared memory one CTA needs: the Q tile plus one K and one V tile (this matches the
    ``.nv.shared`` size of compiled cubins on sm_90, e.g. 164,936 B for 64x128 at D=256).
    Occupancy is a hint: the compiler lowers it when the tiles do not fit twice."""
    d = sum(head_dim_parts(problem.head_dim, schedule.split_d))  # head dim as the kernel pads it
    return array_itemsize(problem.dtype) * d * (schedule.tile_m + 2 * schedule.tile_n)


def infeasibility(arch: str, problem: Problem, schedule: Schedule) -> str | None:
    """Why ``schedule`` cannot work for ``problem`` on ``arch`` (static checks), or ``None``."""
    found = smem_infeasibility(arch, _smem_bytes(problem, schedule))
    if found is not None:
        return found
    limits = arch_limits(arch)
    if schedule.num_ctas > limits.max_num_ctas:
        return f"num_ctas {schedule.num_ctas} > {limits.max_num_ctas} on {arch}"
    return None


def restricted(space: SearchSpace, problem: Problem) -> SearchSpace:
    """Drop dimensions that cannot matter for ``problem`` (causal work order, tile pairing and
    the masked loop split when it is not causal; the head-dim split for a power of two) or that
    measured slower everywhere for its kind; packed query heads without a group a tile can
    hold). A space that does not search ``split_d`` splits a
    head dim that can be split (1.00-1.15x the padded kernel on every such fitting shape of
    issue 18)."""
    if head_dim_parts(problem.head_dim, True)[1] == 0:  # a power of two: nothing to split
        space = space.without("split_d")
    elif "split_d" not in space.choices:  # a space that does not search it: split (the default)
        space = SearchSpace(space.arch, space.choices, space.base.replace(split_d=True),
                            space.infeasibility)
    if problem.dtype in FP8_DTYPES and "tile_n" in space.choices:
        # FP8: half the bytes a key: 256-key steps fit (the sm_90 default's at D <= 128), P·V
        # in bf16 is a choice of accuracy over speed, and so is where e4m3 products accumulate
        choices = dict(space.choices)
        choices["tile_n"] = tuple(sorted({*choices["tile_n"], 256}))
        choices["pv_wide"] = (False, True)
        choices["fast_acc"] = (False, True)
        space = SearchSpace(space.arch, choices, space.base, space.infeasibility)
    else:
        space = space.without("pv_wide", "fast_acc")
    if not packable(problem, max(space.choices.get("tile_m", (space.base.tile_m,))),
                    idle_slots=True):
        space = space.without("pack_gqa")  # no group of query heads a tile could hold
    if problem.causal:
        # persistent CTAs measured 0.75-0.95x the per-tile grid in 16 of 17 causal cases on an
        # H100, equal in one: a static round-robin over tiles of unequal length leaves SMs idle
        # at the end (docs/performance-notes.md)
        return space.without("persistent")
    return space.without("longest_first", "split_masked", "paired_tiles")


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
    "split_d": (False, True),
    "pack_gqa": (False, True),
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


def _space(name: str):
    def build(arch: str) -> SearchSpace:
        """Architectures differ in what is worth searching: clusters (``num_ctas``) only on
        Hopper and datacenter Blackwell, small tiles on consumer parts."""
        limits = arch_limits(arch)
        choices = dict(SPACES[name])
        if name == "full" and limits.max_num_ctas > 1:
            choices["num_ctas"] = tuple(2 ** i for i in range(limits.max_num_ctas.bit_length()))
        if limits.generation in ("blackwell-consumer", "ampere", "ada"):
            choices["tile_m"] = tuple(t for t in choices["tile_m"] if t <= 128) or (64,)
            choices["tile_n"] = tuple(t for t in choices["tile_n"] if t <= 64) or (64,)
        return SearchSpace(arch, choices, Schedule(), infeasibility)
    return build


def _efficiency(problem: Problem, s: Schedule) -> float:
    tiles = {(64, 128): 1.0, (64, 64): 0.9, (128, 64): 0.86, (128, 128): 0.7,
             (64, 32): 0.75, (128, 32): 0.72, (256, 64): 0.4, (256, 32): 0.38,
             (256, 128): 0.3}.get((s.tile_m, s.tile_n), 0.5)
    occ = {1: 0.7, 2: 1.0, 3: 0.93}.get(s.occupancy, 0.8)
    lat = 1.0 + 0.02 * (s.k_latency == 2) - 0.01 * (s.k_latency == 4) + 0.01 * (s.v_latency == 4)
    eff = tiles * occ * lat
    eff *= 1.06 if s.exp2 else 1.0
    eff *= 1.02 if s.approx_div else 1.0
    eff *= 1.08 if s.k_transposed else 1.0
    eff *= 1.01 if s.kv_sawtooth else 1.0
    paired = s.paired_tiles and problem.causal
    eff *= 1.03 if (s.longest_first and problem.causal and not paired) else 1.0
    eff *= 1.06 if paired else 1.0
    eff *= 0.99 if s.unchecked_loads else 1.0
    eff *= 0.97 if s.num_ctas > 1 else 1.0
    return 0.72 * eff


def model_ms(problem: Problem, schedule: Schedule) -> float:
    """A made-up analytic time of ``schedule`` on an sm_90-like GPU, for the simulated backend:
    ``flops / (790 TFLOP/s x efficiency)``, with a unique optimum (64x128, occupancy 2, exp2,
    approximate division, K transposed, ...)."""
    return problem.flops / (790e12 * _efficiency(problem, schedule)) * 1e3


FORWARD_SPACE = register_space(FamilySpace(
    family=FORWARD.name, spaces={name: _space(name) for name in SPACES},
    restrict=restricted, model_ms=model_ms))
