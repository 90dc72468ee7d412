"""Where a key's search starts and how it climbs: the seeds (the default and the nearest tuned
winners), the feasible points of a space (one per normalised schedule), and the neighbours of
the best schedule so far."""

from __future__ import annotations

import random
from typing import Any

from tiledattention import Family

__all__ = ["seeds", "feasible", "neighbours", "compile_sample"]


def seeds(family: Family, db: Any, arch: str, problem: Any, space) -> list[Any]:
    """The default, the three nearest winners of the key's bucket in ``db`` (a
    ``db.ScheduleDB`` or ``None``) and the nearest winner of a bucket that differs only in the
    family's ``seed_across`` fields (for the forward: schedules carry over between bf16 and
    fp16, a find in one is the other's best first guess); each on ``space``'s dimensions."""
    found = [family.default_schedule(arch, problem)]
    if db is not None:
        mine = problem.to_dict()
        fixed = [f for f in family.bucket_fields if f not in family.seed_across]
        rows = [r for r in db.rows(family=family.name, arch=arch)
                if all(r.problem.to_dict()[f] == mine[f] for f in fixed)
                and family.comparable(r.problem, problem)]
        rows.sort(key=lambda r: (family.distance(r.problem, problem), r.median_ms))
        same = [r for r in rows if all(r.problem.to_dict()[f] == mine[f]
                                       for f in family.bucket_fields)]
        other = [r for r in rows if r not in same]
        found += [r.schedule for r in same[:3] + other[:1]]
    unique = {}
    for seed in found:  # the seed's values on the searched dimensions
        s = family.normalise(problem, space.schedule(space.params(seed)))
        if space.contains(s):
            unique.setdefault(s.key, s)
    return list(unique.values())


def feasible(family: Family, space, problem: Any, at_most: int | None = None) -> list[Any]:
    """The feasible points of ``space``, one per normalised schedule, in the space's order;
    with ``at_most``, no more than ``at_most + 1`` of them (enough to tell whether a budget of
    ``at_most`` trials covers the space, without walking millions of points: the backward's
    full space has 2.2 million)."""
    unique: dict[str, Any] = {}
    for s in space:
        if space.infeasibility(space.arch, problem, s) is not None:
            continue
        s = family.normalise(problem, s)
        unique.setdefault(s.key, s)
        if at_most is not None and len(unique) > at_most:
            break
    return list(unique.values())


def compile_sample(family: Family, space, problem: Any, arch: str, count: int | None, *,
                   seed: int) -> tuple[list[Any], int]:
    """What ``tiledtune search --compile-only`` compiles for ``problem``, and how many feasible
    points ``space`` has: ``count`` of them (the architecture default first, as the search
    measures it first; then a sample fixed by ``seed``, so the same command picks the same
    candidates again), or every one when ``count`` is ``None`` (a full sweep; the default still
    first)."""
    every = feasible(family, space, problem)
    keys = {s.key for s in every}
    first = [s for s in seeds(family, None, arch, problem, space) if s.key in keys]
    taken = {s.key for s in first}
    rest = [s for s in every if s.key not in taken]
    if count is None or count >= len(every):
        return first + rest, len(every)
    first = first[:count]
    return first + random.Random(seed).sample(rest, count - len(first)), len(every)


def neighbours(family: Family, space, incumbent: Any, problem: Any, known: dict, *,
               seed: int) -> list[Any]:
    """The points of ``space`` that differ from ``incumbent`` (a point of ``space``: its
    dimensions' values as searched, not normalised) in one dimension and are feasible, new
    (not in ``known``) and distinct after normalisation; in a random order fixed by ``seed``
    and the incumbent. They stay points of ``space`` (a study can enqueue their values) even
    where normalisation moves a value off the space's choices (the decode family caps a
    window's splits at its key tiles: 64 splits of a 4096-key window are 33)."""
    base = family.normalise(problem, incumbent).key
    found: dict[str, Any] = {}
    for name, values in space.choices.items():
        for value in values:
            if value != getattr(incumbent, name):
                point = incumbent.replace(**{name: value})
                s = family.normalise(problem, point)
                if (s.key not in known and s.key != base
                        and space.infeasibility(space.arch, problem, s) is None):
                    found.setdefault(s.key, point)
    points = list(found.values())
    random.Random(f"{seed}:{incumbent.key}").shuffle(points)
    return points
