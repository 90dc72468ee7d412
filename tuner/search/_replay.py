"""Offline replay of search strategies against a measured sample of one key's space.

``scripts/tuner_sweep.py`` times a seeded uniform sample of a key's normalised schedules once on a
GPU; ``scripts/tuner_replay.py`` replays strategies against those times with many seeds. The
objective of a replay is a lookup: a schedule's measured median, or its failure (a compile error
or a wrong result costs a trial and gives no value, as in a real search).

:func:`replay_tuner` drives the search driver's own proposal code in the driver's order: the seeds
(given: ``_candidates.seeds`` makes them), a hill-climbing step (``_candidates.neighbours`` of the
best so far) whenever nothing is queued and climbing budget is left, the driver's TPE sampler
(``_trials.tpe_sampler``) otherwise; ``lookahead`` candidates asked before the first is measured
(the constant liar sees them running); repeats and static infeasibility cost nothing; the patience
window; the driver's rule for an improvement (``_trials.improves``). What ``Tuner.tune`` does beyond
proposing (storage, budget tickets, claims, compile processes, the finalists' re-timing) is left
out. ``tests/cpu/test_tuner_replay.py`` checks that on a sample that is the whole space the replay
measures exactly what the real driver measures, in the same order, so a change of the driver's
policy that the replay does not follow fails that test.

Proposals outside the sample. A sample holds a few hundred of the space's ~10^5 normalised
schedules, so most schedules a search proposes were never measured. Such a proposal is *stood in
for* by the nearest sampled schedule this run has not measured yet, under a per-dimension
distance (integer dimensions, in their listed order: |index difference| / (number of values - 1);
every other dimension: 0 if equal, else 1; ties broken in an order fixed by the run's seed). The
stand-in is measured (one trial of the budget) and recorded in the study under its own
parameters; the proposal is told as failed (TPE learns nothing of a point nobody measured) and
counts as tried: proposing it again is a free repeat, and climbing skips it. So the replay is the
tuner searching the sample, its proposals rounded to the nearest unmeasured sampled point;
:class:`Replay` counts the stand-ins and their distances, which say how much rounding there was.
"""

from __future__ import annotations

import collections
import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import optuna
from optuna.trial import TrialState, create_trial

from tiledattention import Family

from ..errors import TunerValueError
from ._candidates import neighbours
from ._trials import improves, tpe_sampler, waiting

__all__ = ["Landscape", "Replay", "replay_tuner", "replay_random", "schedule_distance"]

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class Landscape:
    """What a sweep measured for one key: ``outcomes`` maps the key of each sampled normalised
    schedule to its median time in ms, or to its failure status (``"compile-error"``,
    ``"wrong"``, ...); ``schedules`` maps the same keys to the schedules. ``feasible_count``: the
    number of feasible normalised schedules of the whole space (``None``: unknown, far more
    than any budget), which decides brute force as in the driver."""

    family: Family
    problem: Any
    space: Any  # search_spaces.SearchSpace
    outcomes: Mapping[str, float | str]
    schedules: Mapping[str, Any]
    feasible_count: int | None = None

    def __post_init__(self) -> None:
        if set(self.outcomes) != set(self.schedules):
            raise TunerValueError("a landscape needs one schedule per outcome")
        for key, s in self.schedules.items():
            if s.key != key:
                raise TunerValueError(f"schedule {s.describe()} is listed under key {key}; its "
                                      f"key is {s.key}")
        if not self.outcomes:
            raise TunerValueError("a landscape needs at least one measured schedule")

    @property
    def best_ms(self) -> float:
        """The sample's best time (``inf`` when nothing in it ran correctly)."""
        return min((v for v in self.outcomes.values() if isinstance(v, float)),
                   default=math.inf)

    def __len__(self) -> int:
        return len(self.outcomes)


def _dimension_metric(space) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Per dimension of ``space``: its name, whether it is ordinal (integer values), and the
    scale of one index step (1 / (values - 1) for ordinal dimensions, 1 for the others)."""
    names = list(space.choices)
    ordinal = np.array([all(isinstance(v, int) and not isinstance(v, bool)
                            for v in space.choices[n]) for n in names])
    scale = np.array([1.0 / max(1, len(space.choices[n]) - 1) if o else 1.0
                      for n, o in zip(names, ordinal)])
    return names, ordinal, scale


def _indices(space, names: Sequence[str], schedule: Any) -> list[int]:
    """The index of each of ``schedule``'s values among its dimension's choices (-1: none)."""
    found = []
    for n in names:
        values = space.choices[n]
        value = getattr(schedule, n)
        found.append(next((i for i, v in enumerate(values)
                           if v == value and type(v) is type(value)), -1))
    return found


def schedule_distance(space, a: Any, b: Any) -> float:
    """The distance the replay rounds off-sample proposals with (module docstring)."""
    names, ordinal, scale = _dimension_metric(space)
    ia, ib = np.array(_indices(space, names, a)), np.array(_indices(space, names, b))
    return float(_distances(ia[None, :], ib, ordinal, scale)[0])


def _distances(rows: np.ndarray, target: np.ndarray, ordinal: np.ndarray,
               scale: np.ndarray) -> np.ndarray:
    diff = rows != target
    unknown = (rows < 0) | (target < 0)
    steps = np.where(ordinal & ~unknown, np.abs(rows - target) * scale, diff.astype(float))
    return steps.sum(axis=1)


class _Sample:
    """The landscape's schedules as index rows, for nearest-unmeasured look-ups; ties go to the
    schedule first in an order fixed by ``seed``."""

    def __init__(self, landscape: Landscape, seed: int) -> None:
        self.space = landscape.space
        self.keys = list(landscape.schedules)
        self.names, self.ordinal, self.scale = _dimension_metric(self.space)
        self.rows = np.array([_indices(self.space, self.names, landscape.schedules[k])
                              for k in self.keys])
        order = list(range(len(self.keys)))
        random.Random(f"replay-ties:{seed}").shuffle(order)
        self.rank = np.empty(len(order), dtype=np.int64)
        self.rank[order] = np.arange(len(order))
        self.index = {k: i for i, k in enumerate(self.keys)}

    def nearest(self, schedule: Any, taken: Mapping[str, Any]) -> tuple[str, float] | None:
        """The key of the sampled schedule nearest ``schedule`` that is not in ``taken``, with
        its distance; ``None`` when every sampled schedule is taken."""
        target = np.array(_indices(self.space, self.names, schedule))
        dist = _distances(self.rows, target, self.ordinal, self.scale)
        free = np.array([k not in taken for k in self.keys])
        if not free.any():
            return None
        dist = np.where(free, dist, np.inf)
        ties = np.flatnonzero(dist <= dist.min() + 1e-12)
        pick = ties[np.argmin(self.rank[ties])]
        return self.keys[pick], float(dist[pick])


@dataclass
class Replay:
    """One replayed search: the schedules it measured (each once), in order, with their
    outcomes; how many measured trials stood in for an off-sample proposal and how far they
    were from it; what was skipped at no cost."""

    strategy: str
    seed: int
    measured: list[str] = field(default_factory=list)
    outcomes: list[float | str] = field(default_factory=list)
    stand_ins: int = 0
    snap_distances: list[float] = field(default_factory=list)
    repeats: int = 0
    infeasible: int = 0

    def best_after(self, trials: int) -> float:
        """The best time among the first ``trials`` measured schedules (``inf``: none ran)."""
        return min((v for v in self.outcomes[:trials] if isinstance(v, float)),
                   default=math.inf)

    def _measured(self, key: str, outcome: float | str) -> None:
        if key in self.measured:
            raise TunerValueError(f"schedule {key} measured twice")  # a replay bug, not input
        self.measured.append(key)
        self.outcomes.append(outcome)


def replay_tuner(landscape: Landscape, seeds: Sequence[Any], *, n_trials: int, seed: int = 0,
                 neighbour_trials: int | None = None, patience: int | None = 30,
                 lookahead: int = 4, strategy: str = "tuner") -> Replay:
    """Replay the search driver with ``SearchConfig(n_trials=n_trials, seed=seed,
    neighbour_trials=neighbour_trials, patience=patience, lookahead=lookahead)`` on
    ``landscape``, starting from ``seeds`` (normalised schedules on the landscape's space, as
    ``_candidates.seeds`` returns them; ``[]`` and ``neighbour_trials=0``: TPE alone)."""
    family, problem, space = landscape.family, landscape.problem, landscape.space
    result = Replay(strategy, seed)
    sample = _Sample(landscape, seed)
    distributions = {name: optuna.distributions.CategoricalDistribution(list(values))
                     for name, values in space.choices.items()}
    feasible_count = landscape.feasible_count
    brute_force = feasible_count is not None and feasible_count <= n_trials
    study = optuna.create_study(sampler=tpe_sampler(n_trials, seed), direction="minimize")
    everything = list(landscape.schedules.values()) if brute_force else []
    for s in list(seeds) + everything:
        study.enqueue_trial(space.params(s), skip_if_exists=True)

    known: dict[str, float | str] = {}  # measured: value or failure; "running" while queued
    tried: dict[str, str] = {}  # off-sample proposal -> the sampled schedule that stood in
    claimed = 0
    best = math.inf
    incumbent = None
    climb_left = 0 if brute_force else (n_trials // 3 if neighbour_trials is None
                                        else neighbour_trials)
    since_best = 0
    pending: collections.deque = collections.deque()  # (trial number, schedule)
    skipped_in_a_row = 0
    # the driver's limit is max(50, 2 x feasible); the whole space's is far beyond any need
    skip_limit = max(50, 2 * min(feasible_count or len(landscape), len(landscape)))
    budget_spent = False

    def admit(trial) -> tuple[int, Any] | str:
        nonlocal claimed
        schedule = family.normalise(problem, space.schedule(trial.params))
        if space.infeasibility(space.arch, problem, schedule) is not None:
            study.tell(trial, state=TrialState.FAIL)
            result.infeasible += 1
            return "infeasible"
        key = schedule.key
        prior = known.get(key, "stood in" if key in tried else None)
        if prior is not None:
            if isinstance(prior, float):
                study.tell(trial, prior)
            else:
                study.tell(trial, state=TrialState.FAIL)
            result.repeats += 1
            return "repeat"
        if claimed >= n_trials:
            study.tell(trial, state=TrialState.FAIL)
            return "budget spent"
        if key in landscape.outcomes:
            claimed += 1
            known[key] = "running"
            return trial.number, schedule
        near = sample.nearest(schedule, known)
        if near is None:  # every sampled schedule is measured: nothing left to stand in
            study.tell(trial, state=TrialState.FAIL)
            return "budget spent"
        claimed += 1
        stand_key, distance = near
        study.tell(trial, state=TrialState.FAIL)  # nobody measures the proposal itself
        tried[key] = stand_key
        stand = landscape.schedules[stand_key]
        study.add_trial(create_trial(state=TrialState.RUNNING, params=space.params(stand),
                                     distributions=distributions))
        known[stand_key] = "running"
        result.stand_ins += 1
        result.snap_distances.append(distance)
        return len(study.get_trials(deepcopy=False)) - 1, stand

    while True:
        patient = patience is None or since_best < patience
        while (not budget_spent and patient and skipped_in_a_row <= skip_limit
               and len(pending) < max(1, lookahead)):
            if climb_left and incumbent is not None and not waiting(study):
                step = neighbours(family, space, incumbent, problem, {**known, **tried},
                                  seed=seed)[:1]
                for neighbour in step:
                    study.enqueue_trial(space.params(neighbour))
                    climb_left -= 1
            trial = study.ask(distributions)
            outcome = admit(trial)
            if isinstance(outcome, tuple):
                skipped_in_a_row = 0
                pending.append(outcome)
                continue
            if outcome == "budget spent":
                budget_spent = True
            else:
                skipped_in_a_row += 1
        if not pending:
            break
        number, schedule = pending.popleft()
        value = landscape.outcomes[schedule.key]
        if isinstance(value, float):
            study.tell(number, value)
        else:
            study.tell(number, state=TrialState.FAIL)
        known[schedule.key] = value
        result._measured(schedule.key, value)
        if isinstance(value, float) and improves(value, best):
            best, since_best, incumbent = value, 0, schedule
        else:
            since_best += 1
    return result


def replay_random(landscape: Landscape, *, n_trials: int, seed: int = 0) -> Replay:
    """Random search over the sample: ``n_trials`` sampled schedules, uniformly without
    replacement, in an order fixed by ``seed``."""
    keys = list(landscape.outcomes)
    random.Random(f"replay-random:{seed}").shuffle(keys)
    result = Replay("random", seed)
    for key in keys[:n_trials]:
        result._measured(key, landscape.outcomes[key])
    return result
