"""The search driver: one Optuna study per (architecture, problem) key.

For each key: seed the study with the architecture default and the winners of the nearest tuned
shapes (three of the key's dtype, one of the other); then climb: measure the schedules one
dimension away from the best so far (a third of the budget by default), so that a dimension no
seed has switched on is still tried on a good base; ask the other candidates from a sampler
fitting the space (brute force when the budget covers the feasible space, else multivariate TPE
with a constant liar for concurrent workers); reject static infeasibility and repeats without
timing; compile ahead while the GPU measures; measure each candidate in an isolated worker
(compile deadline, run deadline, crash and hang recovery); re-time the finalists interleaved
with the default schedule and torch's backends; store the winner in the schedule database.
Stops on the trial budget, a time limit or a patience window.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import random
import socket
import threading
import time
import warnings
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import optuna
from optuna.trial import TrialState

import search_spaces
from tiledattention import Problem, Schedule, compile_schedule
from tiledattention._lookup import shape_distance
from tiledattention._provenance import current_provenance
from tiledattention.errors import CompileError

from ._budget import Budget
from ._isolation import IsolatedExecutor
from ._measure import BASELINES, FAILURES, Measurement
from .timing import Timing

__all__ = ["SearchConfig", "KeyResult", "Tuner", "study_name", "open_storage"]

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: who measured a trial (a study may be shared by processes on many hosts)
_WORKER = f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class SearchConfig:
    n_trials: int = 60  # measured candidates per key (over all workers and all runs)
    timeout_s: float | None = None  # per key, this process
    patience: int | None = 30  # stop after this many measured candidates without improvement
    space: str = "full"
    finalists: int = 4
    # candidates one dimension away from the best so far, per key and process; None: a third
    # of n_trials
    neighbour_trials: int | None = None
    lookahead: int = 4  # candidates compiled ahead while the GPU measures
    compile_deadline_s: float = 180.0
    run_deadline_s: float = 60.0
    seed: int = 0
    study_prefix: str = "tiledtune"
    heartbeat_s: int = 10
    grace_s: int = 30


@dataclass
class KeyResult:
    problem: Problem
    arch: str
    best: Schedule | None = None
    timings: dict[str, Timing | str] = field(default_factory=dict)  # retime: best, default, torch
    measured: int = 0  # candidates this process measured
    repeats_skipped: int = 0
    failures: collections.Counter = field(default_factory=collections.Counter)
    stored: str = ""  # outcome of the database write
    wall_s: float = 0.0
    compile_overlap_s: float = 0.0  # compile time hidden behind GPU measurement


def _correct_trials(study) -> list:
    """The key's measured, numerically correct trials, fastest first."""
    return sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if t.user_attrs.get("status") == "ok"), key=lambda t: t.value)


def _waiting(study) -> bool:
    """Whether enqueued candidates (seeds, brute force, retries) are still to be asked."""
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def study_name(prefix: str, arch: str, problem: Problem) -> str:
    p = problem
    return (f"{prefix}:{arch}:B{p.batch}-Hq{p.heads_q}-Hkv{p.heads_kv}-Sq{p.seqlen_q}-"
            f"Sk{p.seqlen_k}-D{p.head_dim}-{p.dtype}-{'causal' if p.causal else 'full'}")


class _StaleTrial:
    """Called once per trial of a dead worker (heartbeat older than the grace period): gives
    its budget ticket back and re-enqueues its candidate once."""

    def __init__(self, url: str) -> None:
        self._url = url
        with _quiet_optuna():
            self._retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)

    def __call__(self, study, trial) -> None:
        budget = Budget(self._url, study.study_name)
        budget.release(trial.number)
        budget.close()
        self._retry(study, trial)


def open_storage(url: str, config: SearchConfig) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats: a dead worker's running trials are failed after
    ``grace_s``, their tickets returned and their candidates re-enqueued once."""
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    attempt = 0
    while True:  # workers starting together may race to create Optuna's tables
        try:
            with _quiet_optuna():
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=engine_kwargs, heartbeat_interval=config.heartbeat_s,
                    grace_period=config.grace_s,
                    heartbeat_stale_trial_callback=_StaleTrial(url))
        except Exception:  # the losing CREATE TABLE; give up after five tries
            attempt += 1
            if attempt == 5:
                raise
            time.sleep(0.5 * attempt)


class _Heartbeat:
    """Records heartbeats for the trials this process holds, from a background thread."""

    def __init__(self, storage: optuna.storages.RDBStorage, interval: float) -> None:
        self._storage = storage
        self._ids: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            with self._lock:
                ids = list(self._ids)
            for trial_id in ids:
                try:
                    self._storage.record_heartbeat(trial_id)
                except Exception:  # a missed beat is retried next interval
                    pass

    def hold(self, trial_id: int) -> None:
        self._storage.record_heartbeat(trial_id)
        with self._lock:
            self._ids.add(trial_id)

    def drop(self, trial_id: int) -> None:
        with self._lock:
            self._ids.discard(trial_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def _quiet_optuna():
    """Heartbeats with ask/tell (rather than ``optimize``) and ``fail_stale_trials`` are what
    make concurrent workers safe here; silence Optuna's notes that they are unusual."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        yield


def _known_elsewhere(study, key: str) -> float | str:
    """What the study knows of schedule ``key``, claimed by another worker: its value, its
    failure, or ``"elsewhere"`` while that worker is still measuring it."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("schedule_key") != key or t.user_attrs.get("ticket") is None:
            continue
        if t.state == TrialState.COMPLETE:
            return t.value
        if t.state == TrialState.FAIL and t.user_attrs.get("status") in FAILURES:
            return t.user_attrs["status"]
    return "elsewhere"


def compile_job(problem: Problem, schedule: Schedule, arch: str
                ) -> tuple[float, int | None, str | None]:
    """Compile in a pool process (this warms cuTile's disk cache for the later launch):
    (seconds, static shared-memory bytes, None), or (seconds, None, the compile error)."""
    start = time.perf_counter()
    try:
        built = compile_schedule(problem, schedule, arch)
    except CompileError as exc:
        return time.perf_counter() - start, None, str(exc)
    return built.seconds, built.shared_bytes, None


class Tuner:
    """Tunes keys on one device through ``executor`` (an :class:`IsolatedExecutor`)."""

    def __init__(self, executor: IsolatedExecutor, *, arch: str, device_name: str,
                 storage_url: str, db=None, config: SearchConfig = SearchConfig(),
                 compile_workers: int = 0,
                 on_event: Callable[[str, dict], None] | None = None) -> None:
        self.executor = executor
        self.arch = arch
        self.device_name = device_name
        self.storage_url = storage_url
        self.storage = open_storage(storage_url, config)
        self.db = db
        self.config = config
        # spawn, not fork: the parent may hold a CUDA context, which must not be forked
        self._pool = (ProcessPoolExecutor(max_workers=compile_workers,
                                          mp_context=multiprocessing.get_context("spawn"))
                      if compile_workers > 0 else None)
        self._on_event = on_event or (lambda kind, data: None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    # -- seeds -----------------------------------------------------------------------------
    def _seeds(self, problem: Problem, space) -> list[Schedule]:
        seeds = [search_spaces.default_schedule(self.arch, problem)]
        if self.db is not None:
            rows = [r for r in self.db.rows(arch=self.arch, causal=problem.causal,
                                            head_dim=problem.head_dim)
                    if r.problem.group_size == problem.group_size]
            rows.sort(key=lambda r: (shape_distance(r.problem, problem), r.median_ms))
            # three nearest winners of this dtype, and the nearest of another (schedules carry
            # over between bf16 and fp16: a find in one is the other's best first guess)
            same = [r for r in rows if r.problem.dtype == problem.dtype]
            other = [r for r in rows if r.problem.dtype != problem.dtype]
            seeds += [r.schedule for r in same[:3] + other[:1]]
        unique = {}
        for seed in seeds:  # the seed's values on the searched dimensions
            s = space.schedule(space.params(seed))
            if space.contains(s):
                unique.setdefault(s.key, s)
        return list(unique.values())

    # -- one key ---------------------------------------------------------------------------
    def tune(self, problem: Problem) -> KeyResult:
        cfg = self.config
        start = time.monotonic()
        result = KeyResult(problem=problem, arch=self.arch)
        space = search_spaces.space_for(self.arch, cfg.space).restricted(problem)
        feasible = space.feasible(problem)
        distributions = {name: optuna.distributions.CategoricalDistribution(list(values))
                         for name, values in space.choices.items()}
        # TPE; when the budget covers the feasible space, every feasible point is enqueued
        # instead (brute force; Optuna's BruteForceSampler stops studies only inside optimize())
        brute_force = len(feasible) <= cfg.n_trials
        sampler = optuna.samplers.TPESampler(
            seed=cfg.seed, multivariate=True, constant_liar=True,
            n_startup_trials=max(5, min(15, cfg.n_trials // 4)))
        name = study_name(cfg.study_prefix, self.arch, problem)
        with _quiet_optuna():
            study = optuna.create_study(study_name=name, storage=self.storage, sampler=sampler,
                                        direction="minimize", load_if_exists=True)
            optuna.storages.fail_stale_trials(study)
        budget = Budget(self.storage_url, name)

        # What is known for this key: measured values and recorded failures, by schedule key.
        known: dict[str, float | str] = {}
        for t in study.get_trials(deepcopy=False):
            key = t.user_attrs.get("schedule_key")
            if key is None:
                continue
            if t.state == TrialState.COMPLETE:
                known[key] = t.value
            elif t.state == TrialState.FAIL and t.user_attrs.get("status") in FAILURES:
                known.setdefault(key, t.user_attrs["status"])
        if not study.trials:
            for seed in self._seeds(problem, space) + (feasible if brute_force else []):
                study.enqueue_trial(space.params(seed), skip_if_exists=True)

        best = min((v for v in known.values() if isinstance(v, float)), default=float("inf"))
        incumbent = self._incumbent(study, space)
        climb_left = 0 if brute_force else (cfg.n_trials // 3 if cfg.neighbour_trials is None
                                            else cfg.neighbour_trials)
        since_best = 0
        heartbeat = _Heartbeat(self.storage, max(1, cfg.heartbeat_s))
        pending: collections.deque = collections.deque()
        skipped_in_a_row = 0
        budget_spent = False
        try:
            while True:
                out_of_time = cfg.timeout_s is not None and time.monotonic() - start > cfg.timeout_s
                patient = cfg.patience is None or since_best < cfg.patience
                # refill the lookahead queue
                while (not (out_of_time or budget_spent) and patient
                       and skipped_in_a_row <= max(50, 2 * len(feasible))
                       and len(pending) < max(1, cfg.lookahead)):
                    if climb_left and incumbent is not None and not _waiting(study):
                        # hill climbing: the next untried neighbour of the best so far
                        step = self._neighbours(space, incumbent, problem, known)[:1]
                        for neighbour in step:
                            study.enqueue_trial(space.params(neighbour))
                            climb_left -= 1
                    with _quiet_optuna():
                        trial = study.ask(distributions)
                    heartbeat.hold(trial._trial_id)
                    schedule = space.schedule(trial.params)
                    outcome = self._admit(study, trial, schedule, problem, known, budget,
                                          cfg.n_trials)
                    if outcome == "measure":
                        skipped_in_a_row = 0
                        future = (self._pool.submit(compile_job, problem, schedule, self.arch)
                                  if self._pool is not None else None)
                        pending.append((trial, schedule, future))
                        continue
                    heartbeat.drop(trial._trial_id)
                    if outcome == "budget spent":
                        budget_spent = True
                    else:
                        skipped_in_a_row += 1
                        result.repeats_skipped += outcome == "repeat"
                if not pending:
                    break
                trial, schedule, future = pending.popleft()
                m = self._measure(problem, schedule, future, result)
                self._record(study, trial, schedule, m, known, result)
                heartbeat.drop(trial._trial_id)
                if m.ok and m.timing.median_ms < best * (1 - 1e-3):
                    best, since_best, incumbent = m.timing.median_ms, 0, schedule
                else:
                    since_best += 1
                self._on_event("trial", {"problem": problem, "schedule": schedule,
                                         "measurement": m, "best_ms": best,
                                         "measured": result.measured, "n_trials": cfg.n_trials,
                                         "queued": len(pending)})
        finally:
            # candidates asked but never measured (time limit, Ctrl-C): give their tickets back
            for trial, schedule, future in pending:
                if future is not None:
                    future.cancel()
                trial.set_user_attr("status", "cancelled")
                study.tell(trial, state=TrialState.FAIL)
                budget.release(trial.number)
                heartbeat.drop(trial._trial_id)
            heartbeat.close()
            budget.close()
        self._finish(study, problem, result)
        result.wall_s = time.monotonic() - start
        return result

    @staticmethod
    def _incumbent(study, space) -> Schedule | None:
        """The fastest correct schedule measured so far for this key (a resumed study)."""
        ok = _correct_trials(study)
        return space.schedule(ok[0].params) if ok else None

    def _neighbours(self, space, incumbent: Schedule, problem: Problem,
                    known: dict) -> list[Schedule]:
        """The feasible, not yet tried schedules that differ from ``incumbent`` in one
        dimension of ``space``, in a random order fixed by the seed and the incumbent."""
        found = [incumbent.replace(**{name: value})
                 for name, values in space.choices.items()
                 for value in values if value != getattr(incumbent, name)]
        found = [s for s in found if s.key not in known
                 and search_spaces.infeasibility(self.arch, problem, s) is None]
        random.Random(f"{self.config.seed}:{incumbent.key}").shuffle(found)
        return found

    def _admit(self, study, trial, schedule: Schedule, problem: Problem, known: dict,
               budget: Budget, n_trials: int) -> str:
        """Decide what to do with an asked trial: ``"measure"`` it (this worker holds its
        schedule's claim and a budget ticket), or finish it at once as ``"infeasible"``,
        ``"repeat"`` (measured before, here or by another worker) or ``"budget spent"``."""
        trial.set_user_attr("schedule_key", schedule.key)
        trial.set_user_attr("schedule", schedule.describe())
        why = search_spaces.infeasibility(self.arch, problem, schedule)
        prior = known.get(schedule.key) if why is None else "infeasible"
        if prior is None and not budget.claim_schedule(schedule.key, trial.number):
            prior = _known_elsewhere(study, schedule.key)
        if prior is None and not budget.claim(n_trials, trial.number):
            budget.release(trial.number)  # its schedule claim
            trial.set_user_attr("status", "over budget")
            study.tell(trial, state=TrialState.FAIL)
            return "budget spent"
        if prior is None:
            trial.set_user_attr("ticket", True)
            trial.set_user_attr("worker", _WORKER)
            known[schedule.key] = "running"
            return "measure"
        if why is not None:
            trial.set_user_attr("status", "infeasible")
            trial.set_user_attr("reason", why)
            known[schedule.key] = "infeasible"
        else:
            trial.set_user_attr("status", "repeat")
        if isinstance(prior, float):
            study.tell(trial, prior)
        else:
            study.tell(trial, state=TrialState.FAIL)
        return "infeasible" if why is not None else "repeat"

    def _measure(self, problem: Problem, schedule: Schedule, future: Future | None,
                 result: KeyResult) -> Measurement:
        cfg = self.config
        if future is not None:
            waited = time.monotonic()
            try:
                compile_s, _, error = future.result(timeout=cfg.compile_deadline_s)
            except Exception:  # pool trouble or a compile past its deadline: let the worker try
                compile_s, error = 0.0, None
            if error is not None:
                return Measurement("compile-error", error[:500])
            result.compile_overlap_s += max(0.0, compile_s - (time.monotonic() - waited))
        warm = self.executor.measurement("warm", problem, schedule,
                                         deadline=cfg.compile_deadline_s)
        if not warm.ok:
            return warm
        m = self.executor.measurement("measure", problem, schedule, deadline=cfg.run_deadline_s)
        return Measurement(m.status, m.reason, m.timing, m.rel_err, warm.seconds + m.seconds)

    def _record(self, study, trial, schedule: Schedule, m: Measurement, known: dict,
                result: KeyResult) -> None:
        trial.set_user_attr("status", m.status)
        if m.rel_err is not None:
            trial.set_user_attr("rel_err", m.rel_err)
        if m.ok:
            result.measured += 1
            trial.set_user_attr("timing", m.timing.to_dict())
            study.tell(trial, m.timing.median_ms)
            known[schedule.key] = m.timing.median_ms
        else:
            result.measured += 1
            result.failures[m.status] += 1
            trial.set_user_attr("reason", m.reason[:1000])
            study.tell(trial, state=TrialState.FAIL)
            known[schedule.key] = m.status

    def _finish(self, study, problem: Problem, result: KeyResult) -> None:
        """Re-time the finalists interleaved with the baselines; store the winner."""
        cfg = self.config
        complete = _correct_trials(study)
        if not complete:
            return
        space = search_spaces.space_for(self.arch, cfg.space).restricted(problem)
        finalists: dict[str, Schedule] = {}
        for t in complete:
            s = space.schedule(t.params)
            finalists.setdefault(s.key, s)
            if len(finalists) >= cfg.finalists:
                break
        default = search_spaces.default_schedule(self.arch, problem)
        named = {f"candidate-{i}": s for i, s in enumerate(finalists.values())}
        named["default"] = default
        try:
            timings = self.executor.call("retime", problem, named, BASELINES[1:],
                                         deadline=cfg.run_deadline_s * 2 + 30 * len(named))
        except Exception as exc:  # the finalists ran before: fall back to their own timings
            self._on_event("warning", {"message": f"re-timing failed: {exc}"})
            return
        ranked = sorted((n for n in named if n.startswith("candidate-")
                         and isinstance(timings.get(n), Timing)),
                        key=lambda n: timings[n].median_ms)
        if not ranked:
            return
        winner = ranked[0]
        result.best = named[winner]
        result.timings = {"best": timings[winner], **{k: v for k, v in timings.items()
                                                       if not k.startswith("candidate-")}}
        if self.db is not None:
            result.stored = self._store(problem, result, len(study.trials))

    def _store(self, problem: Problem, result: KeyResult, trials: int) -> str:
        from db import ScheduleRow

        t = result.timings
        best = t["best"]

        def ms(name):
            value = t.get(name)
            return value.median_ms if isinstance(value, Timing) else None

        row = ScheduleRow(arch=self.arch, device_name=self.device_name, problem=problem,
                          schedule=result.best, median_ms=best.median_ms,
                          spread_ms=best.spread_ms,
                          tflops=problem.flops / (best.median_ms * 1e-3) / 1e12,
                          default_ms=ms("default"), torch_cudnn_ms=ms("torch-cudnn"),
                          torch_flash_ms=ms("torch-flash"), trials=trials,
                          provenance=current_provenance())
        return self.db.put(row)
