"""Fallback policies for shapes nobody tuned, judged offline against measured times.

A :class:`Policy` chooses a forward schedule for a problem from the tuned rows of its
architecture (a shipped table's, say) and the per-architecture default, the way the runtime's
lookup would if it followed that policy. ``scripts/lookup_regret.py`` measures, per held-out
shape, every schedule some policy picks and a sweep of other candidates; :func:`evaluate` then
scores each policy by its *regret*: the time of the schedule it picks over the best time measured
for the shape. The runtime's own rule (``Family.nearest_limit`` in the resolver) is the policy
chosen this way on the fitting set.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from tiledattention import shipped_table
from tiledattention import FORWARD, Problem, Schedule

from ..errors import NotMeasuredError

__all__ = ["Policy", "POLICIES", "TunedRow", "evaluate", "previous_default", "regret_table",
           "shipped_tuned_rows"]


@dataclass(frozen=True)
class TunedRow:
    problem: Problem
    schedule: Schedule
    median_ms: float


def shipped_tuned_rows(arch: str) -> list[TunedRow]:
    """The forward rows of ``arch``'s shipped table that the runtime's lookup reads: measured on
    a GPU, tuned with the current kernel template."""
    table = shipped_table(arch)
    if table is None:
        return []
    current = FORWARD.template_identity()
    return [TunedRow(r.problem, r.schedule, r.median_ms) for r in table
            if r.family == FORWARD.name and r.backend == "gpu"
            and r.provenance.template_hash == current]


#: ``(problem, rows, arch) -> schedule``
Choose = Callable[[Problem, Sequence[TunedRow], str], Schedule]


@dataclass(frozen=True)
class Policy:
    name: str
    choose: Choose


def _nearest(problem: Problem, rows: Iterable[TunedRow], *, same_group: bool,
             limit: float) -> TunedRow | None:
    """The closest row of ``problem``'s lookup bucket (causal, dtype, head dim) within
    ``limit`` of it by the family's distance; with ``same_group`` only rows of its GQA group
    size (what the runtime requires)."""
    best: tuple[float, float, TunedRow] | None = None
    for row in rows:
        p = row.problem
        if any(getattr(p, f) != getattr(problem, f) for f in FORWARD.bucket_fields):
            continue
        if same_group and not FORWARD.comparable(p, problem):
            continue
        d = FORWARD.distance(p, problem)
        if d <= limit and (best is None or (d, row.median_ms) < best[:2]):
            best = (d, row.median_ms, row)
    return None if best is None else best[2]


def _nearest_policy(limit: float, same_group: bool) -> Choose:
    def choose(problem: Problem, rows: Sequence[TunedRow], arch: str) -> Schedule:
        row = _nearest(problem, rows, same_group=same_group, limit=limit)
        if row is None:
            return FORWARD.default_schedule(arch, problem)
        return row.schedule
    return choose


def _default(problem: Problem, rows: Sequence[TunedRow], arch: str) -> Schedule:
    return FORWARD.default_schedule(arch, problem)


def _padded_default(problem: Problem, rows: Sequence[TunedRow], arch: str) -> Schedule:
    return FORWARD.default_schedule(arch, problem).replace(split_d=False)


def previous_default(arch: str, problem: Problem) -> Schedule:
    """The forward default as it was before issue 18 (commit ef20c0c) on sm_90: three
    schedules by head dim and causal length, head dim padded to a power of two."""
    if arch != "sm_90":
        return FORWARD.default_schedule(arch, problem)
    fast_math = dict(exp2=True, approx_div=True, k_transposed=True)
    if problem.head_dim > 128:
        return Schedule(tile_m=128, tile_n=128, occupancy=3, num_worker_warps=8, exp2=True,
                        k_transposed=True, k_latency=4, v_latency=2, paired_tiles=problem.causal)
    if problem.causal and problem.seqlen_q >= 4096:
        return Schedule(tile_m=128, tile_n=128, occupancy=2, num_ctas=2, longest_first=True,
                        **fast_math)
    return Schedule(tile_m=64, tile_n=128, occupancy=2, **fast_math)


def _before(problem: Problem, rows: Sequence[TunedRow], arch: str) -> Schedule:
    row = _nearest(problem, rows, same_group=True, limit=math.inf)
    return row.schedule if row is not None else previous_default(arch, problem)


def _runtime(problem: Problem, rows: Sequence[TunedRow], arch: str) -> Schedule:
    return _nearest_policy(FORWARD.nearest_limit, True)(problem, rows, arch)


def _policies() -> tuple[Policy, ...]:
    """before: the lookup before issue 18 (nearest row of the group size at any distance, else
    the former default); runtime: the lookup now (``FORWARD.nearest_limit``); default: the
    default alone, or with the head dim padded; nearest within L: the nearest row of the group
    size within distance L, else the default (any group: of any group size)."""
    found = [
        Policy("before", _before),
        Policy("runtime", _runtime),
        Policy("default", _default),
        Policy("default, padded head dim", _padded_default),
        Policy("nearest, any group", _nearest_policy(math.inf, False)),
    ]
    for limit in (0.5, 1.0, 2.0, 3.0, math.inf):
        found.append(Policy(f"nearest within {limit:g}", _nearest_policy(limit, True)))
    return tuple(found)


POLICIES: tuple[Policy, ...] = _policies()


def evaluate(policy: Policy, shapes: Sequence[Mapping[str, Any]], rows: Sequence[TunedRow],
             arch: str) -> list[dict[str, Any]]:
    """Per measured shape (``scripts/lookup_regret.py``'s records): the schedule ``policy``
    picks, its time, and its regret against the best measured time and against the default.

    Raises :class:`~tuner.errors.NotMeasuredError` (a ``KeyError``) naming the shape when the
    picked schedule was not measured."""
    scored = []
    for shape in shapes:
        problem = Problem.from_dict(shape["problem"])
        pick = FORWARD.normalise(problem, policy.choose(problem, rows, arch))
        times = shape["times"]
        if pick.key not in times:
            raise NotMeasuredError(f"{policy.name}: {shape['name']} was not measured with "
                                   f"{pick.describe()}")
        ms = times[pick.key]
        scored.append({"name": shape["name"], "schedule": pick.describe(), "ms": ms,
                       "regret": ms / shape["best_ms"],
                       "vs_default": ms / times[shape["default_key"]]})
    return scored


def regret_table(shapes: Sequence[Mapping[str, Any]], rows: Sequence[TunedRow], arch: str,
                 policies: Sequence[Policy] = POLICIES) -> list[dict[str, Any]]:
    """One summary per policy: geometric-mean and worst regret, and how many shapes run more
    than 2% slower than the default."""
    summary = []
    for policy in policies:
        scored = evaluate(policy, shapes, rows, arch)
        regrets = [s["regret"] for s in scored]
        summary.append({
            "policy": policy.name,
            "geomean_regret": statistics.geometric_mean(regrets),
            "worst_regret": max(regrets),
            "slower_than_default": sum(s["vs_default"] > 1.02 for s in scored),
            "shapes": len(scored),
        })
    return summary
