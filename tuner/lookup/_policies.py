"""Fallback policies for shapes nobody tuned, judged offline against measured times.

A :class:`Policy` chooses a schedule of a kernel family for a problem from that family's tuned
rows of one architecture (``db.ScheduleRow``: a shipped table's, say) and the per-architecture
default, the way the runtime's lookup would if it followed that policy. Every policy asks for
the problem the runtime resolves (``Family.plan_problem``: for the decode family the cache length
rounded to its bucket), so ``default`` is the schedule the runtime would run with no tuned row.
``scripts/lookup_regret.py`` measures, per held-out shape, every schedule some policy picks and a
sweep of other candidates; :func:`evaluate` then scores each policy by its *regret* (the time of
the schedule it picks over the best time measured for the shape) and by its pick's time over
the default's.

``runtime`` is the lookup as it is in the code (``tiledattention.tooling.Resolver`` over the
same rows), so a study scores whatever rule the runtime has now; ``nearest (issue 18 rule)`` is
the rule the runtime had before issue 29, frozen here so that it stays comparable.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import db
from tiledattention import FORWARD, DeviceInfo, Family, Schedule, get_family, shipped_table
from tiledattention.tooling import Resolver, codecs

from ..errors import NotMeasuredError

__all__ = ["Policy", "POLICIES", "SLOWER_THAN_DEFAULT", "STUDY_DEVICE", "as_measured", "evaluate",
           "pick", "policies_for", "previous_default", "regret_table", "runtime_resolution",
           "shipped_rows", "summarise"]

#: The device the ``runtime`` policy asks the lookup for (its name decides only which user-
#: database rows are exact-device ones, and the study reads no user database).
STUDY_DEVICE = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132}

#: Above this pick/default time ratio a pick counts as slower than the default (issue 29: the
#: lookup must never run below 0.98x the default).
SLOWER_THAN_DEFAULT = 1.02


def shipped_rows(family: Family | str, arch: str, *, any_template: bool = False
                 ) -> list[db.ScheduleRow]:
    """The rows of ``family`` in ``arch``'s shipped table that the runtime's lookup reads:
    measured on a GPU, tuned with the current kernel template.

    With ``any_template`` the rows of other template identities are kept too, restamped (in
    memory) with the current one: for a study of a kernel change that does not move speed,
    before the table is restamped. The lookup itself skips such rows."""
    family = get_family(family) if isinstance(family, str) else family
    table = shipped_table(arch)
    if table is None:
        return []
    current = family.template_identity()
    found = []
    for row in table:
        if row.family != family.name or row.backend != "gpu":
            continue
        if row.provenance.template_hash != current:
            if not any_template:
                continue
            row = dataclasses.replace(row, provenance=dataclasses.replace(
                row.provenance, template_hash=current))
        found.append(row)
    return found


#: ``(family, problem, rows, arch) -> schedule``
Choose = Callable[[Family, Any, Sequence[db.ScheduleRow], str], Any]


@dataclass(frozen=True)
class Policy:
    """A named fallback rule; ``families`` names the families it applies to (``None``: all)."""

    name: str
    choose: Choose
    families: tuple[str, ...] | None = None

    def applies(self, family: Family) -> bool:
        return self.families is None or family.name in self.families


def pick(policy: Policy, family: Family, problem: Any, rows: Sequence[db.ScheduleRow],
         arch: str) -> Any:
    """``policy``'s schedule for ``problem``, normalised for it (what a launch would run)."""
    return family.normalise(problem, policy.choose(family, problem, rows, arch))


# -- the lookup now ---------------------------------------------------------------------------
def runtime_resolution(family: Family, problem: Any, rows: Sequence[db.ScheduleRow], arch: str,
                       device_name: str = STUDY_DEVICE["name"]):
    """What the runtime's lookup answers for ``problem`` (``Resolution``: schedule, source,
    detail) with ``rows`` as its shipped table and no user database, on a device of that
    name (the study's by default)."""
    table = db.RowTable(rows, source=f"the shipped {family.name} rows for {arch}",
                        codecs=codecs())
    resolver = Resolver(open_user=lambda: None, open_shipped=lambda _arch: table)
    device = DeviceInfo(index=0, arch=arch, name=device_name,
                        sm_count=STUDY_DEVICE["sm_count"])
    return resolver(family, family.plan_problem(problem), device)


def _runtime(family: Family, problem: Any, rows: Sequence[db.ScheduleRow], arch: str) -> Any:
    return runtime_resolution(family, problem, rows, arch).schedule


def _default(family: Family, problem: Any, rows: Sequence[db.ScheduleRow], arch: str) -> Any:
    return family.default_schedule(arch, family.plan_problem(problem))


# -- the lookup before issue 29 ---------------------------------------------------------------
# The lookup metric of each family at commit 8ecb446 (the last before issue 29's rule): the
# rows of the problem's bucket (causal, dtype, head dim) with its GQA group size, by
# ``sum(weight * |log2 prod(a.fields) - log2 prod(b.fields)|)``, within the limit. Frozen so
# that 'nearest (issue 18 rule)' keeps meaning that rule whatever the families' metrics become;
# a family not named here is measured with its own metric.
_BUCKET = ("causal", "dtype", "head_dim")
_GROUP = (("heads_q", "heads_kv"),)
_PREFILL_TERMS = ((("seqlen_q",), 1.0), (("seqlen_k",), 1.0), (("batch", "heads_q"), 0.5))
_ISSUE_18_METRIC = {
    "forward": (_PREFILL_TERMS, 1.0),
    "decode": (((("seqlen_k",), 1.0), (("batch", "heads_kv"), 1.0), (("seqlen_q",), 1.0)),
               math.inf),
    "backward": (_PREFILL_TERMS, math.inf),
}


@dataclass(frozen=True)
class _Metric:
    bucket_fields: tuple[str, ...]
    match_ratios: tuple[tuple[str, str], ...]
    distance_terms: tuple[tuple[tuple[str, ...], float], ...]
    limit: float

    def comparable(self, stored: Any, problem: Any) -> bool:
        return (all(getattr(stored, f) == getattr(problem, f) for f in self.bucket_fields)
                and all(getattr(stored, n) * getattr(problem, d)
                        == getattr(problem, n) * getattr(stored, d)
                        for n, d in self.match_ratios))

    def distance(self, a: Any, b: Any) -> float:
        return sum(weight * abs(math.log2(math.prod(getattr(a, n) for n in names))
                                - math.log2(math.prod(getattr(b, n) for n in names)))
                   for names, weight in self.distance_terms)


def _issue_18_metric(family: Family, limit: float | None = None) -> _Metric:
    terms, frozen_limit = _ISSUE_18_METRIC.get(
        family.name, (tuple(family.distance_terms), family.nearest_limit))
    bucket, ratios = ((_BUCKET, _GROUP) if family.name in _ISSUE_18_METRIC
                      else (tuple(family.bucket_fields), tuple(family.match_ratios)))
    return _Metric(bucket, ratios, terms, frozen_limit if limit is None else limit)


def _nearest(metric: _Metric, problem: Any, rows: Iterable[db.ScheduleRow]
             ) -> db.ScheduleRow | None:
    """The closest comparable row within the metric's limit, ties to the faster row."""
    best: tuple[float, float, db.ScheduleRow] | None = None
    for row in rows:
        if not metric.comparable(row.problem, problem):
            continue
        d = metric.distance(row.problem, problem)
        if d <= metric.limit and (best is None or (d, row.median_ms) < best[:2]):
            best = (d, row.median_ms, row)
    return None if best is None else best[2]


def _nearest_policy(limit: float | None) -> Choose:
    """The issue 18 rule (nearest comparable row, else the default) within ``limit`` (``None``:
    the family's limit before issue 29)."""
    def choose(family: Family, problem: Any, rows: Sequence[db.ScheduleRow], arch: str) -> Any:
        asked = family.plan_problem(problem)
        row = _nearest(_issue_18_metric(family, limit), asked, rows)
        return family.default_schedule(arch, asked) if row is None else row.schedule
    return choose


# -- the forward's historical rules -----------------------------------------------------------
def previous_default(arch: str, problem: Any) -> Schedule:
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


def _before(family: Family, problem: Any, rows: Sequence[db.ScheduleRow], arch: str) -> Any:
    row = _nearest(_issue_18_metric(family, math.inf), problem, rows)
    return row.schedule if row is not None else previous_default(arch, problem)


def _padded_default(family: Family, problem: Any, rows: Sequence[db.ScheduleRow],
                    arch: str) -> Any:
    return family.default_schedule(arch, problem).replace(split_d=False)


POLICIES: tuple[Policy, ...] = (
    Policy("default", _default),
    Policy("runtime", _runtime),
    Policy("nearest (issue 18 rule)", _nearest_policy(None)),
    Policy("nearest, any distance", _nearest_policy(math.inf)),
    # the forward lookup before issue 18: the nearest row of the group size at any distance,
    # else the former default; and the default with the head dim padded to a power of two
    Policy("before", _before, ("forward",)),
    Policy("default, padded head dim", _padded_default, ("forward",)),
)


def policies_for(family: Family) -> tuple[Policy, ...]:
    """The policies of :data:`POLICIES` that apply to ``family``."""
    return tuple(p for p in POLICIES if p.applies(family))


# -- scoring ----------------------------------------------------------------------------------
def _scored(shape: Mapping[str, Any], label: str, key: str, described: str) -> dict[str, Any]:
    times = shape["times"]
    for what, k in (("its pick", key), ("the default", shape["default_key"])):
        if k not in times:
            raise NotMeasuredError(f"{label}: {shape['name']} was not measured with {what} "
                                   f"({described if k == key else k})")
    ms = times[key]
    return {"name": shape["name"], "key": key, "schedule": described, "ms": ms,
            "regret": ms / shape["best_ms"], "vs_default": ms / times[shape["default_key"]]}


def evaluate(policy: Policy, family: Family, shapes: Sequence[Mapping[str, Any]],
             rows: Sequence[db.ScheduleRow], arch: str) -> list[dict[str, Any]]:
    """Per measured shape (``scripts/lookup_regret.py``'s records of ``family``): the schedule
    ``policy`` picks now, its time, and its time over the best measured one (``regret``) and
    over the default's (``vs_default``).

    Raises :class:`~tuner.errors.NotMeasuredError` (a ``KeyError``) naming the shape when the
    picked schedule (or the default) was not measured."""
    scored = []
    for shape in shapes:
        problem = family.problem_type.from_dict(shape["problem"])
        chosen = pick(policy, family, problem, rows, arch)
        scored.append(_scored(shape, policy.name, chosen.key, chosen.describe()))
    return scored


def as_measured(label: str, shapes: Sequence[Mapping[str, Any]], policy_name: str
                ) -> list[dict[str, Any]]:
    """Like :func:`evaluate`, for the pick each record stored at measurement time (its
    ``picks[policy_name]``): what the policy chose then, whatever the code chooses now."""
    return [_scored(s, label, s["picks"][policy_name], s["picks"][policy_name])
            for s in shapes]


def summarise(label: str, scored: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Geometric-mean and worst regret, how many picks run more than 2% slower than the default
    (pick/default above :data:`SLOWER_THAN_DEFAULT`), and the worst pick/default ratio."""
    regrets = [s["regret"] for s in scored]
    vs_default = [s["vs_default"] for s in scored]
    return {
        "policy": label,
        "geomean_regret": statistics.geometric_mean(regrets),
        "worst_regret": max(regrets),
        "slower_than_default": sum(v > SLOWER_THAN_DEFAULT for v in vs_default),
        "worst_vs_default": max(vs_default),
        "shapes": len(scored),
    }


def regret_table(family: Family, shapes: Sequence[Mapping[str, Any]],
                 rows: Sequence[db.ScheduleRow], arch: str,
                 policies: Sequence[Policy] | None = None) -> list[dict[str, Any]]:
    """One :func:`summarise` per policy (default: those of ``family``) over ``shapes``."""
    chosen = policies_for(family) if policies is None else policies
    return [summarise(p.name, evaluate(p, family, shapes, rows, arch)) for p in chosen]
