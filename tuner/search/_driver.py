"""The search driver: one Optuna study per (kernel family, architecture, problem) key.

For each key: seed the study with the family's architecture default and the winners of the
nearest tuned problems (three of the key's bucket, one across the family's ``seed_across``
fields, e.g. the other dtype); normalise every candidate, so schedules that compile the same
kernel are one candidate; then climb: measure the schedules one
dimension away from the best so far (a third of the budget by default), so that a dimension no
seed has switched on is still tried on a good base; ask the other candidates from a sampler
fitting the space (brute force when the budget covers the feasible space, else multivariate TPE
with a constant liar for concurrent workers); reject static infeasibility and repeats without
timing; compile ahead while the GPU measures; measure each candidate in an isolated worker
(compile deadline, run deadline, crash and hang recovery); re-time the finalists interleaved
with the default schedule and the family's baselines (torch's backends); store the winner in the
schedule database: the simplest of the finalists within the measured noise of the fastest
(``_trials.pick_winner``), so that a tie is never decided by noise or by the trials' order.
Stops on the trial budget, a time limit or a patience window.

Every time is measured in the search's timing mode (``SearchConfig.timing``: stream or CUDA-graph
launches, cold or warm L2; the executor was built with the same mode). The study records it
(user attribute ``timing_mode``, also on each measured trial) with the backend, the device name
and the kernel template's identity, and a study measured otherwise is refused rather than mixed
(``check_study``, ``_identity``); the backend is part of the study's name besides. A study also
belongs to the schedule database it fills (the identity stored in it): a search filling another
database (another ``--db``, or the same path made again) measures in a study of its own, and a
key is reported stored only when the database, read back, holds its row.

Any number of processes may tune one key at once: the storage hands each asked trial to one
worker (``_storage``), the budget table gives out exactly ``n_trials`` tickets and one claim per
schedule (``_budget``), and a trial that another worker finishes while this one holds it (it
failed the trial as stale: this worker's heartbeat had stopped for longer than the grace
period) is dropped here: what this worker took for it is given back, nothing is counted, and
the search goes on. A worker that finds the budget spent while others still measure trials of
the key waits for them (``_await_others``), so every worker re-times and reports the key's
winner; it first tunes its other keys (``tune_many``), so its GPU does not idle meanwhile.
"""

from __future__ import annotations

import collections
import os
import socket
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

import search_spaces
from db import canonical_json, database_identity
from tiledattention import DeviceInfo, Family
from tiledattention.tooling import current_provenance

from ..measure import (FAILURES, TIE_REL_FLOOR, CompilePool, IsolatedExecutor, Measurement,
                       Timing, TimingMode, interrupts_held)
from ._budget import Budget
from ._identity import DATABASE_ATTR, StudyIdentity, database_study
from ._storage import Heartbeat, fail_stale_trials, open_storage, quiet_optuna, study_name
from ._candidates import feasible, neighbours, seeds
from ._trials import (TIMING_ATTR, compile_job, correct_trials, improves, known_elsewhere,
                      measured_trials, measuring_elsewhere, pick_winner, tell,
                      tpe_sampler, waiting)

__all__ = ["SearchConfig", "KeyResult", "Tuner", "compile_job"]

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
    timing: TimingMode = TimingMode()  # how the executor times (recorded in the study)
    tie_rel_floor: float = TIE_REL_FLOOR  # the tie rule's floor (``_trials.pick_winner``)


#: Study attribute: the last conclusion of the key (winner, ties, re-timings) and how many
#: measured trials it saw; a worker that measured nothing since takes it instead of re-timing.
CONCLUSION_ATTR = "conclusion"


@dataclass
class KeyResult:
    problem: Any
    arch: str
    best: Any = None
    # the finalists' re-timing: "best", "default" and each of the family's baselines (by the
    # name its case gives it, e.g. "torch-cudnn") -> its timing, or why it has none
    timings: dict[str, Timing | str] = field(default_factory=dict)
    measured: int = 0  # candidates this process measured
    repeats_skipped: int = 0
    failures: collections.Counter = field(default_factory=collections.Counter)
    stored: str = ""  # outcome of the database write
    # whether the schedule database holds a row of the key once it ended (read back from the
    # database; None: no database)
    has_row: bool | None = None
    timing_mode: TimingMode = TimingMode()  # how every time above was measured
    tied: list = field(default_factory=list)  # finalists within the noise of the fastest
    wall_s: float = 0.0
    compile_overlap_s: float = 0.0  # compile time hidden behind GPU measurement

    @property
    def baselines(self) -> dict[str, Timing | str]:
        """The baselines' entries of ``timings`` (every name but the winner's and the
        default's), in name order."""
        return {name: self.timings[name] for name in sorted(self.timings)
                if name not in ("best", "default") and not name.startswith("candidate-")}


class Tuner:
    """Tunes ``family``'s keys on one device through ``executor`` (an
    :class:`IsolatedExecutor`); winners go into ``db`` (a ``db.ScheduleDB``) when given."""

    def __init__(self, executor: IsolatedExecutor, *, family: Family, arch: str,
                 device_name: str, storage_url: str, db=None,
                 config: SearchConfig = SearchConfig(), compile_workers: int = 0,
                 backend: str = "gpu", device_index: int | None = None, sm_count: int = 0,
                 on_event: Callable[[str, dict], None] | None = None) -> None:
        self.executor = executor
        self.device_index = device_index  # the local GPU measuring, recorded on its trials
        self.sm_count = sm_count  # its SMs, which device defaults count (0: not known)
        self.family = family
        self.backend = backend  # what measures: "gpu", or "simulated" (stored with each row)
        self.arch = arch
        self.device_name = device_name
        self.storage_url = storage_url
        self.storage = open_storage(storage_url, heartbeat_s=config.heartbeat_s,
                                    grace_s=config.grace_s)
        self.db = db
        # the identity stored in the schedule database: the key's study is that database's
        # (``_identity.database_study``)
        self.database = None if db is None else database_identity(db)
        self._names: dict[str, str] = {}  # the problem's canonical JSON -> its study's name
        self.config = config
        # spawned (the parent may hold a CUDA context), killed with their tileiras on Ctrl-C
        self._pool = CompilePool(compile_workers) if compile_workers > 0 else None
        self._on_event = on_event or (lambda kind, data: None)

    def close(self, *, now: bool = False) -> None:
        """Stop the compile processes: at once (killed with their compiles) when ``now``,
        else after their running compiles."""
        if self._pool is not None:
            self._pool.close(now=now)

    def __enter__(self) -> "Tuner":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(now=exc_type is not None)  # an interrupted search waits for nothing

    # -- candidates ------------------------------------------------------------------------
    def _seeds(self, problem: Any, space) -> list[Any]:
        return seeds(self.family, self.db, self.arch, problem, space)

    def _space(self, problem: Any):
        spaces = search_spaces.family_space(self.family.name)
        return spaces.restrict(spaces.space(self.arch, self.config.space), problem)

    def _feasible(self, space, problem: Any) -> list[Any]:
        """The space's feasible points when the trial budget covers them all (a brute-force
        search enqueues each); else ``n_trials + 1`` of them, which says that it does not."""
        return feasible(self.family, space, problem, self.config.n_trials)

    # -- what the study was measured by ------------------------------------------------------
    @property
    def identity(self) -> StudyIdentity:
        """How this search measures: backend, device, template identity and timing mode; a
        study that records another is refused (``_identity``)."""
        return StudyIdentity(backend=self.backend, device_name=self.device_name,
                             template=self.family.template_identity(), timing=self.config.timing,
                             database=self.database)

    def _study_name(self, problem: Any, *, own: bool = False) -> str:
        """The name of ``problem``'s study: the plain name, unless that study belongs to
        another schedule database (or ``own``: the plain study turned out to be another's),
        then the name with this database's identity; decided once per key and process."""
        key = canonical_json(problem.to_dict())
        name = self._names.get(key)
        if name is None or own:
            def named(database: str | None) -> str:
                return study_name(self.config.study_prefix, self.family, self.arch, problem,
                                  backend=self.backend, database=database)

            name = (named(self.database) if own else
                    database_study(self.storage, named(None), named(self.database),
                                   self.database))
            self._names[key] = name
        return name

    def _open_study(self, problem: Any, sampler) -> Any:
        """Create or load ``problem``'s study, refuse it when it was measured otherwise
        (``StudyIdentity.check``), and record this search's identity in it. A plain study
        that another worker bound to another database meanwhile is left to it for this
        database's own."""
        with quiet_optuna():
            study = optuna.create_study(study_name=self._study_name(problem),
                                        storage=self.storage, sampler=sampler,
                                        direction="minimize", load_if_exists=True)
        owner = study.user_attrs.get(DATABASE_ATTR)
        if self.database is not None and owner not in (None, self.database):
            with quiet_optuna():
                study = optuna.create_study(study_name=self._study_name(problem, own=True),
                                            storage=self.storage, sampler=sampler,
                                            direction="minimize", load_if_exists=True)
        identity = self.identity
        identity.check(study)
        identity.record(study)
        return study

    def check_study(self, problem: Any) -> None:
        """Raise :class:`StudyMismatchError` when ``problem``'s study (if there is one) was
        measured otherwise than this search measures: by another backend, on another device, by
        another kernel template or in another timing mode (call it for every key before tuning
        any)."""
        try:
            with quiet_optuna():
                study = optuna.load_study(study_name=self._study_name(problem),
                                          storage=self.storage)
        except KeyError:  # no study yet
            return
        self.identity.check(study)

    # -- one key ---------------------------------------------------------------------------
    def tune(self, problem: Any) -> KeyResult:
        """Tune one key: measure its candidates, wait for the trials other workers still
        measure, re-time the finalists and store the winner."""
        return self.tune_many([problem])[0]

    def tune_many(self, problems: list[Any], on_key: Callable[[Any], None] | None = None,
                  start: int = 0) -> list[KeyResult]:
        """Tune each key in turn, beginning with ``problems[start]`` and wrapping around
        (``on_key(problem)`` as each starts): workers of one study given different starts
        begin on different keys, and help each other only on the keys still open when they
        reach them. A key whose budget this worker finds spent while other workers still
        measure its trials is concluded (waited for, re-timed, stored) after the other keys, so
        that this worker measures the next keys meanwhile instead of idling; the results come
        in ``problems``' order."""
        results: dict[int, KeyResult] = {}
        deferred = []
        for i in ((start + j) % len(problems) for j in range(len(problems))):
            problem = problems[i]
            if on_key is not None:
                on_key(problem)
            study, result = self._explore(problem)
            results[i] = result
            if measuring_elsewhere(study):
                deferred.append((study, problem, result))
            else:
                self._conclude(study, problem, result)
        for study, problem, result in deferred:
            self._conclude(study, problem, result)
        return [results[i] for i in range(len(problems))]

    def _conclude(self, study, problem: Any, result: KeyResult) -> None:
        start = time.monotonic()
        self._await_others(study, result.wall_s)
        if not (result.measured == 0 and self._concluded_elsewhere(study, problem, result)):
            self._finish(study, problem, result)
        result.wall_s += time.monotonic() - start

    def _concluded_elsewhere(self, study, problem: Any, result: KeyResult) -> bool:
        """Whether another worker concluded the key after its last measurement (its
        ``conclusion`` attribute counts every measured trial there is): then ``result`` takes
        that conclusion instead of re-timing the same finalists again."""
        found = study.user_attrs.get(CONCLUSION_ATTR)
        if not found or found["measured"] != measured_trials(study):
            return False
        if self.db is not None and (found.get("database") != self.database
                                    or not self._row_stored(problem)):
            # concluded into another database, or this one no longer holds the row (deleted
            # since): conclude again, which re-times the finalists and stores the winner
            return False
        schedule = self.family.schedule_type.from_dict
        result.best = schedule(found["best"])
        result.tied = [schedule(s) for s in found["tied"]]
        result.timings = {name: Timing(**v) if isinstance(v, dict) else v
                          for name, v in found["timings"].items()}
        result.stored = "concluded by another worker"
        result.has_row = True if self.db is not None else None
        return True

    def _row_stored(self, problem: Any) -> bool:
        """Whether the schedule database holds a row of ``problem``'s key (read from it)."""
        return self.db.get(self.family.name, self.arch, self.device_name, problem) is not None

    def _explore(self, problem: Any) -> tuple[Any, KeyResult]:
        """Measure ``problem``'s candidates until its budget, time limit or patience ends;
        the study and the result so far (``wall_s``: the time this took)."""
        cfg = self.config
        start = time.monotonic()
        result = KeyResult(problem=problem, arch=self.arch, timing_mode=cfg.timing)
        space = self._space(problem)
        feasible = self._feasible(space, problem)
        distributions = {name: optuna.distributions.CategoricalDistribution(list(values))
                         for name, values in space.choices.items()}
        # TPE; when the budget covers the feasible space, every feasible point is enqueued
        # instead (brute force; Optuna's BruteForceSampler stops studies only inside optimize())
        brute_force = len(feasible) <= cfg.n_trials
        sampler = tpe_sampler(cfg.n_trials, cfg.seed)
        study = self._open_study(problem, sampler)
        name = study.study_name
        fail_stale_trials(study, self.storage, self.config.grace_s)
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
        heartbeat = Heartbeat(self.storage, max(1, cfg.heartbeat_s))
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
                    # a Ctrl-C waits until the asked trial is in `pending` or finished,
                    # so that the cleanup below knows every trial this worker holds
                    with interrupts_held(children=False):
                        if climb_left and incumbent is not None and not waiting(study):
                            # hill climbing: the next untried neighbour of the best so far
                            step = self._neighbours(space, incumbent, problem, known)[:1]
                            for neighbour in step:
                                study.enqueue_trial(space.params(neighbour))
                                climb_left -= 1
                        with quiet_optuna():
                            trial = study.ask(distributions)
                        heartbeat.hold(trial._trial_id)
                        schedule = self.family.normalise(problem, space.schedule(trial.params))
                        try:
                            outcome = self._admit(study, trial, schedule, problem, known, budget,
                                                  cfg.n_trials, space)
                        except UpdateFinishedTrialError:
                            outcome = self._drop(trial, schedule, known, budget)
                        if outcome == "measure":
                            skipped_in_a_row = 0
                            future = (self._pool.submit(compile_job, self.family, problem,
                                                        schedule, self.arch)
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
                trial, schedule, future = pending[0]  # still pending (cancelled on Ctrl-C)
                m = self._measure(problem, schedule, future, result)
                with interrupts_held(children=False):  # measured: recorded, whatever comes
                    pending.popleft()
                    try:
                        self._record(study, trial, schedule, m, known, result)
                    except UpdateFinishedTrialError:
                        self._drop(trial, schedule, known, budget)
                        continue
                    finally:
                        heartbeat.drop(trial._trial_id)
                if m.ok and improves(m.timing.median_ms, best):
                    best, since_best = m.timing.median_ms, 0
                    incumbent = space.schedule(trial.params)  # the point, as searched
                else:
                    since_best += 1
                self._on_event("trial", {"problem": problem, "schedule": schedule,
                                         "measurement": m, "best_ms": best,
                                         "measured": result.measured, "n_trials": cfg.n_trials,
                                         "queued": len(pending)})
        except KeyboardInterrupt:  # stop the compiles first; then give the trials back
            self.close(now=True)
            raise
        finally:
            # candidates asked but not measured (time limit, Ctrl-C): give their tickets back
            # and queue them again, so that the same command resumes the key where it stopped
            for trial, schedule, future in pending:
                if future is not None:
                    future.cancel()
                try:
                    try:
                        trial.set_user_attr("status", "cancelled")
                        tell(study, trial, state=TrialState.FAIL)
                        study.enqueue_trial(trial.params)
                    except UpdateFinishedTrialError:  # failed as stale by another worker
                        pass
                    budget.release(trial.number)
                except Exception:  # a Ctrl-C cut a storage call short: stale after grace_s
                    pass
                heartbeat.drop(trial._trial_id)
            heartbeat.close()
            budget.close()
        result.wall_s = time.monotonic() - start
        return study, result

    def _await_others(self, study, spent_s: float) -> None:
        """Wait while other workers still measure this key on budget tickets (this worker
        stopped because the budget was spent), so that every worker's result and stored row
        count their trials: without it, a worker whose rival took the last tickets reports no
        schedule for a key the study solves. Bounded by the key's time limit and by what the
        rival's queued candidates may take (compile and run deadlines each); a worker that died
        holding trials is failed as stale once its heartbeat is older than the grace period.
        ``spent_s``: the key's time so far in this worker."""
        cfg = self.config
        now = time.monotonic()
        deadline = now + cfg.grace_s + (cfg.lookahead + 1) * (
            cfg.compile_deadline_s + cfg.run_deadline_s)
        if cfg.timeout_s is not None:
            deadline = min(deadline, now + cfg.timeout_s - spent_s)
        while measuring_elsewhere(study) and time.monotonic() < deadline:
            time.sleep(0.5)
            fail_stale_trials(study, self.storage, cfg.grace_s)

    def _incumbent(self, study, space) -> Any:
        """The point of ``space`` (as searched, not normalised) of the fastest correct schedule
        measured so far for this key (a resumed study)."""
        ok = correct_trials(study)
        return space.schedule(ok[0].params) if ok else None

    def _neighbours(self, space, incumbent: Any, problem: Any, known: dict) -> list[Any]:
        return neighbours(self.family, space, incumbent, problem, known, seed=self.config.seed)

    def _admit(self, study, trial, schedule: Any, problem: Any, known: dict, budget: Budget,
               n_trials: int, space) -> str:
        """Decide what to do with an asked trial: ``"measure"`` it (this worker holds its
        schedule's claim and a budget ticket), or finish it at once as ``"infeasible"``,
        ``"repeat"`` (measured before, here or by another worker) or ``"budget spent"``.
        Raises :class:`UpdateFinishedTrialError` when another worker finished the trial
        meanwhile (the caller drops it)."""
        trial.set_user_attr("schedule_key", schedule.key)
        trial.set_user_attr("schedule", schedule.describe())
        if trial.user_attrs.get("ticket"):  # a stale trial's retry carries its user attributes
            trial.set_user_attr("ticket", False)
        why = space.infeasibility(self.arch, problem, schedule)
        prior = known.get(schedule.key) if why is None else "infeasible"
        if prior is None and not budget.claim_schedule(schedule.key, trial.number):
            prior = known_elsewhere(study, schedule.key)
        if prior is None and not budget.claim(n_trials, trial.number):
            budget.release(trial.number)  # its schedule claim
            trial.set_user_attr("status", "over budget")
            tell(study, trial, state=TrialState.FAIL)
            return "budget spent"
        if prior is None:
            trial.set_user_attr("ticket", True)
            trial.set_user_attr("worker", _WORKER)
            if self.device_index is not None:
                trial.set_user_attr("device", self.device_index)
            known[schedule.key] = "running"
            return "measure"
        if why is not None:
            trial.set_user_attr("status", "infeasible")
            trial.set_user_attr("reason", why)
            known[schedule.key] = "infeasible"
        else:
            trial.set_user_attr("status", "repeat")
        if isinstance(prior, float):
            tell(study, trial, prior)
        else:
            tell(study, trial, state=TrialState.FAIL)
        return "infeasible" if why is not None else "repeat"

    def _drop(self, trial, schedule: Any, known: dict, budget: Budget) -> str:
        """Let go of a trial that another worker finished while this one held it: give back
        the budget ticket and schedule claim this worker may have taken for it (the worker that
        failed the trial gave back those taken before, and re-enqueued its candidate), count
        nothing, and forget that this worker was measuring the schedule."""
        budget.release(trial.number)
        if known.get(schedule.key) == "running":
            del known[schedule.key]
        self._on_event("warning", {"message": (
            f"trial {trial.number} ({schedule.describe()}) was finished by another worker while "
            "this one held it (a heartbeat older than the grace period); dropped")})
        return "taken"

    def _measure(self, problem: Any, schedule: Any, future: Future | None,
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

    def _record(self, study, trial, schedule: Any, m: Measurement, known: dict,
                result: KeyResult) -> None:
        """Store measurement ``m`` in ``trial`` and finish it; counted once the trial is told.
        Raises :class:`UpdateFinishedTrialError` when another worker finished the trial
        meanwhile (the caller drops it)."""
        trial.set_user_attr("status", m.status)
        if m.rel_err is not None:
            trial.set_user_attr("rel_err", m.rel_err)
        if m.ok:
            trial.set_user_attr("timing", m.timing.to_dict())
            trial.set_user_attr(TIMING_ATTR, self.config.timing.to_dict())
            tell(study, trial, m.timing.median_ms)
            known[schedule.key] = m.timing.median_ms
        else:
            trial.set_user_attr("reason", m.reason[:1000])
            tell(study, trial, state=TrialState.FAIL)
            known[schedule.key] = m.status
            result.failures[m.status] += 1
        result.measured += 1

    def _finish(self, study, problem: Any, result: KeyResult) -> None:
        """Re-time the finalists interleaved with the default and the family's baselines;
        store the winner: the simplest schedule within the noise of the fastest (the default
        among them when it was measured correct)."""
        cfg = self.config
        complete = correct_trials(study)
        if not complete:
            return
        space = self._space(problem)
        finalists: dict[str, Any] = {}
        for t in complete:
            s = self.family.normalise(problem, space.schedule(t.params))
            finalists.setdefault(s.key, s)
            if len(finalists) >= cfg.finalists:
                break
        # the default the lookup runs on this device (its rules may take its name and SMs)
        device = DeviceInfo(index=-1, arch=self.arch, name=self.device_name,
                            sm_count=self.sm_count)
        default = self.family.device_default(device, problem)
        named = {f"candidate-{i}": s for i, s in enumerate(finalists.values())}
        named["default"] = default
        try:
            timings = self.executor.call("retime", problem, named, True,
                                         deadline=cfg.run_deadline_s * 2 + 30 * len(named))
        except Exception as exc:  # the finalists ran before: fall back to their own timings
            self._on_event("warning", {"message": f"re-timing failed: {exc}"})
            return
        # the default competes too (for the key it is the simplest schedule there is, and what
        # sdpa runs without the row) when it is correct: measured so by the search, or checked
        # now (a default outside the searched space is never a trial)
        default_key = self.family.normalise(problem, default).key
        eligible = [n for n in named if n.startswith("candidate-")]
        if default_key not in finalists and (
                any(t.user_attrs.get("schedule_key") == default_key for t in complete)
                or self._measure(problem, default, None, result).ok):
            eligible.append("default")
        timed = [(self.family.normalise(problem, named[n]), timings[n]) for n in eligible
                 if isinstance(timings.get(n), Timing)]
        if not timed:
            return
        best, best_timing, tied = pick_winner(self.family, self.arch, problem, timed,
                                              rel_floor=cfg.tie_rel_floor)
        result.best, result.tied = best, tied
        result.timings = {"best": best_timing, **{k: v for k, v in timings.items()
                                                  if not k.startswith("candidate-")}}
        measured = measured_trials(study)
        if self.db is not None:
            outcome = self._store(problem, result, measured)
            result.has_row = self._row_stored(problem)  # what the database holds, read back
            if not result.has_row:
                result.stored = f"NOT STORED (the write said {outcome!r})"
                self._on_event("warning", {"message": (
                    f"{problem.describe()}: the schedule database {self.db} holds no row of "
                    f"the key after the write said {outcome!r}; nothing of it was stored")})
                return  # no conclusion: the next run concludes the key again
            result.stored = outcome
        study.set_user_attr(CONCLUSION_ATTR, {
            "database": self.database,
            "measured": measured, "best": best.to_dict(), "tied": [s.to_dict() for s in tied],
            "timings": {name: v.to_dict() if isinstance(v, Timing) else str(v)
                        for name, v in result.timings.items()}})

    def _store(self, problem: Any, result: KeyResult, trials: int) -> str:
        """Store the key's winner with the default's time and that of every baseline the
        family's case timed, whatever its name (a baseline that did not run is left out)."""
        from db import ScheduleRow

        t = result.timings
        best, default = t["best"], t.get("default")
        row = ScheduleRow(family=self.family.name, arch=self.arch,
                          device_name=self.device_name, backend=self.backend,
                          problem=problem, schedule=result.best,
                          median_ms=best.median_ms, spread_ms=best.spread_ms,
                          tflops=self.family.flops(problem) / (best.median_ms * 1e-3) / 1e12,
                          default_ms=default.median_ms if isinstance(default, Timing) else None,
                          baselines={name: v.median_ms for name, v in result.baselines.items()
                                     if isinstance(v, Timing)},
                          trials=trials, provenance=current_provenance(self.family))
        return self.db.put(row, current=row.provenance)  # measured now: current by definition
