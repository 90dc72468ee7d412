"""What a study knows: its correct trials, its queue, another worker's claim of a schedule, the
timing mode it was measured in; how to finish a trial another worker may have finished first;
the tie rule that picks a key's winner among its re-timed finalists; and the compile job the
driver runs ahead in a process pool."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from db import canonical_json
from tiledattention import CompileError, Family, InputValueError
from tiledattention.tooling import KernelResources

from ..errors import TunerValueError
from ..measure import FAILURES, STATUSES, TIE_REL_FLOOR, Timing, TimingMode, within_noise

__all__ = ["correct_trials", "measured_trials", "settled", "waiting", "measuring_elsewhere",
           "known_elsewhere", "tell", "compile_job", "study_timing", "simplicity", "pick_winner",
           "tpe_sampler", "improves", "TIMING_ATTR"]

#: the study's and each measured trial's user attribute holding the timing mode (as a dict)
TIMING_ATTR = "timing_mode"


def correct_trials(study) -> list:
    """The key's measured, numerically correct trials, fastest first (equal times in the order
    of their schedule keys, not of the trials)."""
    return sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if t.user_attrs.get("status") == "ok"),
                  key=lambda t: (t.value, t.user_attrs.get("schedule_key", "")))


def study_timing(study) -> TimingMode | None:
    """The timing mode the study's times were measured in: its :data:`TIMING_ATTR` user
    attribute; stream launches with a cold L2 (the only mode there was) for a study with
    correct trials from before that attribute; ``None`` when it has no time yet."""
    recorded = study.user_attrs.get(TIMING_ATTR)
    if recorded is not None:
        return TimingMode.from_dict(recorded)
    return TimingMode() if correct_trials(study) else None


def _fields(schedule: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(schedule):
        return dataclasses.asdict(schedule)
    return {k: v for k, v in schedule.to_dict().items() if k != "format"}


def simplicity(family: Family, arch: str, problem: Any, schedule: Any) -> tuple[int, str]:
    """How simple ``schedule`` is for ``problem`` (smaller: simpler), for any family: the number
    of schedule fields on which it differs from the family's default for ``problem`` (both
    normalised; compared on the dataclass fields, so a field a dict form leaves out at its
    default still counts), then its canonical JSON, so that the order is total and fixed."""
    mine = _fields(family.normalise(problem, schedule))
    base = _fields(family.normalise(problem, family.default_schedule(arch, problem)))
    off = sum(1 for name in mine.keys() | base.keys() if mine.get(name) != base.get(name))
    return off, canonical_json(schedule.to_dict())


def pick_winner(family: Family, arch: str, problem: Any, timed: Sequence[tuple[Any, Timing]],
                *, rel_floor: float = TIE_REL_FLOOR) -> tuple[Any, Timing, list[Any]]:
    """The tie rule: among ``timed`` ((schedule, re-timed Timing) pairs), take the fastest (by
    median; equal medians by :func:`simplicity`), then every schedule within the measured noise
    of it (:func:`~tuner.measure.within_noise`: a median at most ``max(rel_floor, the 95%
    half-width of the difference of the two medians)`` slower); the winner is the simplest of
    those. Returns (winner, its timing, the schedules tied with the fastest, simplest first).
    The answer depends on the pairs only, never on their order."""
    if not timed:
        raise TunerValueError("pick_winner needs at least one timed schedule")
    rank = {id(pair): simplicity(family, arch, problem, pair[0]) for pair in timed}
    fastest = min(timed, key=lambda pair: (pair[1].median_ms, rank[id(pair)]))
    tied = sorted((pair for pair in timed
                   if within_noise(fastest[1], pair[1], rel_floor=rel_floor)),
                  key=lambda pair: (rank[id(pair)], pair[1].median_ms))
    return tied[0][0], tied[0][1], [schedule for schedule, _ in tied]


def measured_trials(study) -> int:
    """How many candidates of the key were measured (over every worker and run): finished
    trials that held a budget ticket and got a measurement's status. Not counted: repeats,
    static infeasibility, the trial asked after the budget was spent, cancelled or stale ones."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.is_finished()
               and t.user_attrs.get("ticket") and t.user_attrs.get("status") in STATUSES)


def settled(study) -> set[str]:
    """The schedule keys a search never measures again for the study's key: measured, or
    failed for a reason of the schedule's own (a compile error, a crash, ...)."""
    return {t.user_attrs["schedule_key"] for t in study.get_trials(deepcopy=False)
            if "schedule_key" in t.user_attrs and (
                t.state == TrialState.COMPLETE
                or t.state == TrialState.FAIL and t.user_attrs.get("status") in FAILURES)}


def waiting(study) -> bool:
    """Whether enqueued candidates (seeds, brute force, retries) are still to be asked."""
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def tpe_sampler(n_trials: int, seed: int):
    """The search's sampler: multivariate TPE, a constant liar for concurrent workers."""
    import optuna

    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                      n_startup_trials=max(5, min(15, n_trials // 4)))


def improves(value: float, best: float) -> bool:
    """Whether a measured time replaces the best so far: faster by more than 0.1%."""
    return value < best * (1 - 1e-3)


def measuring_elsewhere(study) -> bool:
    """Whether a trial on a budget ticket is still running: once this worker's own trials are
    finished, another worker is measuring it."""
    return any(t.user_attrs.get("ticket")
               for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def known_elsewhere(study, key: str) -> float | str:
    """What the study knows of schedule ``key``, claimed by another worker: its value, its
    failure, or ``"elsewhere"`` while that worker is still measuring it."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("schedule_key") != key or not t.user_attrs.get("ticket"):
            continue
        if t.state == TrialState.COMPLETE:
            return t.value
        if t.state == TrialState.FAIL and t.user_attrs.get("status") in FAILURES:
            return t.user_attrs["status"]
    return "elsewhere"


def tell(study, trial, value: float | None = None, *, state: TrialState | None = None) -> None:
    """``study.tell(trial, value, state=state)``, raising :class:`UpdateFinishedTrialError`
    whenever another worker finished ``trial`` first (the worker that fails a stale trial):
    Optuna raises that error when the trial finished between its read and its write, and a
    ``ValueError`` ("Cannot tell a FAIL trial.") when it was finished before; both mean the
    same to the driver."""
    try:
        study.tell(trial, value, state=state)
    except ValueError:
        now = study.get_trials(deepcopy=False)
        if not any(t.number == trial.number and t.state.is_finished() for t in now):
            raise  # a value Optuna refused, not a finished trial
        raise UpdateFinishedTrialError(
            f"trial {trial.number} was finished by another worker") from None


def compile_job(family: Family, problem: Any, schedule: Any, arch: str
                ) -> tuple[float, tuple[KernelResources, ...] | None, str | None]:
    """Compile in a pool process (this warms cuTile's disk cache for the later launch):
    (seconds, what each kernel the schedule launches asks of an SM, the main one first, or
    None where a cubin does not say, None), or (seconds, None, the compile error)."""
    start = time.perf_counter()
    try:
        built = family.compile(problem, schedule, arch)
    except CompileError as exc:
        return time.perf_counter() - start, None, str(exc)
    try:
        kernels = built.resources()
    except InputValueError:  # not a cubin tileiras wrote (a stand-in's)
        kernels = None
    return built.seconds, kernels, None
