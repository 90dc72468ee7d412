"""What a study knows: its correct trials, its queue, another worker's claim of a schedule; how
to finish a trial another worker may have finished first; and the compile job the driver runs
ahead in a process pool."""

from __future__ import annotations

import time
from typing import Any

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from tiledattention import CompileError, Family

from ..measure import FAILURES, STATUSES

__all__ = ["correct_trials", "measured_trials", "settled", "waiting", "known_elsewhere", "tell",
           "compile_job"]


def correct_trials(study) -> list:
    """The key's measured, numerically correct trials, fastest first."""
    return sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if t.user_attrs.get("status") == "ok"), key=lambda t: t.value)


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
                ) -> tuple[float, int | None, str | None]:
    """Compile in a pool process (this warms cuTile's disk cache for the later launch):
    (seconds, static shared-memory bytes, None), or (seconds, None, the compile error)."""
    start = time.perf_counter()
    try:
        built = family.compile(problem, schedule, arch)
    except CompileError as exc:
        return time.perf_counter() - start, None, str(exc)
    return built.seconds, built.shared_bytes, None
