"""Workers that tune one key at once: eight `tiledtune search` processes on one study storage
(SQLite and PostgreSQL), the storage handing an enqueued trial to one worker only, and a worker
dropping a trial that another worker failed as stale.

Every process must finish cleanly, and together they measure exactly the trial budget, each
candidate once: the budget table, the study and the schedule database agree. On SQLite this
needs the study storage to hand an enqueued trial to one worker only (see
``tuner/search/_storage.py``); before that, two workers could pop the same candidate, and one
died with ``UpdateFinishedTrialError`` when the other had finished it.
"""

from __future__ import annotations

import collections
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

import search_spaces
from tiledattention import FORWARD, Problem, open_database
from tuner.measure import FAILURES, IsolatedExecutor, SimulatedExecutor
from tuner.search import SearchConfig, Tuner, open_storage, study_name

from .test_postgres import postgres_url  # noqa: F401 - the PostgreSQL server fixture

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 8
TRIALS = 24  # the compact space has 128 feasible points here: the budget, not the space, binds
PROBLEM = Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024, head_dim=64,
                  dtype="bf16", causal=False)


def _measured(trials: list) -> list:
    """The trials that measured a candidate on a budget ticket (a failure is a measurement
    too): finished, ticketed, with a measurement's status that agrees with their state."""
    found = [t for t in trials if t.user_attrs.get("ticket")
             and t.user_attrs.get("status") in ("ok", *FAILURES)]
    assert all(t.state == (TrialState.COMPLETE if t.user_attrs["status"] == "ok"
                           else TrialState.FAIL) for t in found)
    return found


def _budget_records(url: str, name: str) -> tuple[int, set[int]]:
    """The budget table's count of tickets given out for study ``name``, and the trials that
    hold them."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            claimed = conn.execute(sa.text(
                "SELECT claimed FROM tiledtune_budget WHERE study_name = :s"), {"s": name}).scalar()
            tickets = {n for (n,) in conn.execute(sa.text(
                "SELECT trial_number FROM tiledtune_tickets WHERE study_name = :s"), {"s": name})}
    finally:
        engine.dispose()
    return claimed, tickets


def _study_trials(url: str, name: str) -> list:
    """Study ``name``'s trials, its storage's connections closed after (left to the garbage
    collector, psycopg's would warn in whichever later test it ran in)."""
    storage = optuna.storages.RDBStorage(url)
    try:
        return optuna.load_study(study_name=name, storage=storage).trials
    finally:
        storage.engine.dispose()


def _queue_candidates(storage: str, count: int) -> None:
    """Create the key's study with ``count`` candidates waiting, as a previous run leaves its
    seeds, neighbours and retries: the workers start by contending for them."""
    spaces = search_spaces.family_space("forward")
    space = spaces.restrict(spaces.space("sm_90", "compact"), PROBLEM)
    feasible = {FORWARD.normalise(PROBLEM, s).key: FORWARD.normalise(PROBLEM, s)
                for s in space.feasible(PROBLEM)}
    assert len(feasible) > 4 * TRIALS  # the budget binds, not the space
    study = optuna.create_study(study_name=study_name("tiledtune", FORWARD, "sm_90", PROBLEM,
                                                      backend="simulated"),
                                storage=storage, direction="minimize")
    for key in sorted(feasible)[:count]:
        study.enqueue_trial(space.params(feasible[key]))


def _run_workers(storage: str, db: str) -> list[tuple[int, str]]:
    """Start the workers together; their exit codes and outputs. They begin on the queued
    candidates; after those, every candidate is a neighbour of the best so far, enqueued in
    the study and popped by whichever worker asks next: the queue the workers contend for."""
    _queue_candidates(storage, 3 * TRIALS)
    argv = [sys.executable, "-m", "tuner.cli", "search", "--device", "sm_90", "--backend",
            "simulated", "--shape", "1,8,1024,64", "--space", "compact", "--trials",
            str(TRIALS), "--neighbour-trials", str(TRIALS), "--patience", "0", "--db", db,
            "--storage", storage]
    workers = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
               for _ in range(WORKERS)]
    return [(w.wait(timeout=300), w.communicate()[0]) for w in workers]


def _check_one_key_exactly(storage: str, db: str, outputs: list[tuple[int, str]]) -> None:
    crashed = [(i, out) for i, (code, out) in enumerate(outputs)
               if code != 0 or "Traceback" in out]
    assert not crashed, (f"{len(crashed)} of {WORKERS} workers failed; the first:\n"
                         + crashed[0][1][-3000:])

    name = study_name("tiledtune", FORWARD, "sm_90", PROBLEM, backend="simulated")
    trials = _study_trials(storage, name)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]  # none left behind
    measured = _measured(trials)
    assert len(measured) == TRIALS  # the budget, exactly, over all workers
    keys = [t.user_attrs["schedule_key"] for t in measured]
    assert len(set(keys)) == len(keys)  # no candidate measured twice
    # the budget's own records agree: one ticket per measured trial, none leaked
    assert _budget_records(storage, name) == (TRIALS, {t.number for t in measured})

    with open_database(db) as schedules:
        rows = schedules.rows()
    assert [r.problem for r in rows] == [PROBLEM]  # one winner for the key


@pytest.mark.slow  # eight processes; about 15 s on two cores
def test_eight_workers_on_one_key_sqlite(tmp_path):
    storage, db = f"sqlite:///{tmp_path}/studies.sqlite", str(tmp_path / "schedules.sqlite")
    _check_one_key_exactly(storage, db, _run_workers(storage, db))


@pytest.mark.slow  # eight processes and a PostgreSQL server
def test_eight_workers_on_one_key_postgres(postgres_url, tmp_path):  # noqa: F811
    db = str(tmp_path / "schedules.sqlite")  # the fixture's server is fresh for this module
    _check_one_key_exactly(postgres_url, db, _run_workers(postgres_url, db))


# -- the storage hands an enqueued trial to one worker -----------------------------------------

def _pop(url: str, asks: int, queue) -> None:
    """A worker process: ask ``asks`` trials of study "queue" and report their numbers."""
    study = optuna.load_study(study_name="queue", storage=open_storage(url, heartbeat_s=60,
                                                                         grace_s=120))
    queue.put([study.ask().number for _ in range(asks)])


@pytest.mark.slow  # eight processes
def test_an_enqueued_trial_goes_to_one_worker_only(tmp_path):
    url = f"sqlite:///{tmp_path}/queue.sqlite"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="queue",
                                storage=open_storage(url, heartbeat_s=60, grace_s=120))
    for x in range(WORKERS * 10):
        study.enqueue_trial({"x": x})
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    workers = [spawn.Process(target=_pop, args=(url, 10, queue)) for _ in range(WORKERS)]
    for w in workers:
        w.start()
    handed = [n for _ in workers for n in queue.get(timeout=120)]
    for w in workers:
        w.join(timeout=60)
    twice = sorted(n for n, c in collections.Counter(handed).items() if c > 1)
    assert twice == []  # before: about one ask in seven got a trial another worker had too
    assert len(handed) == WORKERS * 10


# -- a trial failed as stale by another worker is dropped ----------------------------------------

class _StallsOnce:
    """An executor whose worker stalls past the heartbeat grace period in its ``at``-th
    measurement, while another worker starting on the key fails the running trial as stale
    (giving its ticket back and re-enqueueing its candidate, as ``fail_stale_trials`` does)."""

    def __init__(self, inner: IsolatedExecutor, url: str, name: str, at: int, stall_s: float):
        self._inner, self._url, self._name = inner, url, name
        self._at, self._stall_s, self._measured = at, stall_s, 0
        self.swept: list[int] = []

    def measurement(self, method, *args, deadline):
        m = self._inner.measurement(method, *args, deadline=deadline)
        if method == "measure":
            self._measured += 1
            if self._measured == self._at:
                time.sleep(self._stall_s)
                other = optuna.load_study(study_name=self._name, storage=open_storage(
                    self._url, heartbeat_s=60, grace_s=1))
                before = {t.number for t in other.get_trials(states=(TrialState.FAIL,))}
                optuna.storages.fail_stale_trials(other)
                self.swept = sorted({t.number for t in other.get_trials(
                    states=(TrialState.FAIL,))} - before)
        return m

    def call(self, method, *args, deadline):
        return self._inner.call(method, *args, deadline=deadline)


@pytest.mark.slow  # spawns the measuring worker and stalls past a grace period
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_trial_failed_as_stale_by_another_worker_is_dropped(tmp_path):
    url, trials = f"sqlite:///{tmp_path}/studies.sqlite", 6
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = study_name("tiledtune", FORWARD, "sm_90", PROBLEM)
    events = []
    with IsolatedExecutor(SimulatedExecutor) as inner:
        # SQLite's clock has whole seconds: 3.5 s is past a 1 s grace period however rounded
        executor = _StallsOnce(inner, url, name, at=3, stall_s=3.5)
        tuner = Tuner(executor, family=FORWARD, arch="sm_90", device_name="Simulated GPU",
                      storage_url=url, on_event=lambda kind, data: events.append((kind, data)),
                      config=SearchConfig(n_trials=trials, patience=None, space="compact",
                                          lookahead=1, heartbeat_s=60, grace_s=1))
        try:
            result = tuner.tune(PROBLEM)
        finally:
            tuner.close()

    assert len(executor.swept) == 1  # the trial being measured in the stall, and only it
    swept = executor.swept[0]
    assert any(kind == "warning" and f"trial {swept} " in data["message"]
               for kind, data in events)
    assert result.measured == trials  # the dropped measurement is not counted
    study = optuna.load_study(study_name=name, storage=url)
    trials_ = study.get_trials(deepcopy=False)
    dropped = next(t for t in trials_ if t.number == swept)
    assert dropped.state == TrialState.FAIL and dropped.user_attrs["status"] == "stale"
    retry = [t for t in trials_ if t.system_attrs.get("failed_trial") == swept]
    assert len(retry) == 1 and retry[0].user_attrs.get("status") == "ok"  # measured again
    measured = _measured(trials_)
    assert len(measured) == trials  # the budget, exactly: the dropped trial's ticket came back
    keys = [t.user_attrs["schedule_key"] for t in measured]
    assert len(set(keys)) == len(keys)
    assert _budget_records(url, name) == (trials, {t.number for t in measured})


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_worker_killed_while_recording_leaves_a_stale_trial_not_a_measured_one(
        tmp_path, request, backend):
    """A worker killed between writing a trial's measurement status and telling its state
    leaves a running trial with status "ok": failed as stale, it must not count as measured
    (its retry measures the candidate again), and its ticket comes back."""
    from tuner.search import Budget
    from tuner.search._storage import fail_stale_trials
    from tuner.search._trials import measured_trials

    url = (f"sqlite:///{tmp_path}/studies.sqlite" if backend == "sqlite"
           else request.getfixturevalue("postgres_url"))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(url, heartbeat_s=60, grace_s=1)
    try:
        study = optuna.create_study(study_name="killed", storage=storage)
        trial = study.ask({"x": optuna.distributions.IntDistribution(0, 9)})
        budget = Budget(url, "killed")
        assert budget.claim(4, trial.number)
        budget.close()
        trial.set_user_attr("ticket", True)
        trial.set_user_attr("schedule_key", "k")
        trial.set_user_attr("status", "ok")  # ... and the worker dies before the tell
        time.sleep(1.5)  # past the grace period; it never had a heartbeat
        fail_stale_trials(study, storage, grace_s=1)
        (failed,) = [t for t in study.get_trials() if t.number == trial.number]
        assert failed.state == TrialState.FAIL and failed.user_attrs["status"] == "stale"
        assert measured_trials(study) == 0
        assert _budget_records(url, "killed") == (0, set())
        retry = [t for t in study.get_trials()
                 if t.system_attrs.get("failed_trial") == trial.number]
        assert len(retry) == 1 and retry[0].state == TrialState.WAITING
    finally:
        # its pooled connections closed now: collected later, in whichever test runs then,
        # PostgreSQL's would warn there (psycopg's ResourceWarning on an open connection)
        storage.engine.dispose()


# -- a worker whose rival holds the key's last tickets -----------------------------------------

class _Slow:
    """An executor that takes ``delay_s`` per measurement (a rival still measuring)."""

    def __init__(self, inner: IsolatedExecutor, delay_s: float):
        self._inner, self._delay_s = inner, delay_s

    def measurement(self, method, *args, deadline):
        if method == "measure":
            time.sleep(self._delay_s)
        return self._inner.measurement(method, *args, deadline=deadline)

    def call(self, method, *args, deadline):
        return self._inner.call(method, *args, deadline=deadline)


def _rival_first(tmp_path, problems: list, rival_delay_s: float, trials: int = 2):
    """Worker A (GPU 0) tunes ``problems``, each measurement taking ``rival_delay_s``; once
    it holds every ticket of the first key, worker B (GPU 1) tunes them at full speed. Returns
    the storage URL, the database path and, per worker, its results and its keys as each
    started (``tune_many``'s ``on_key``)."""
    import threading

    url, db = f"sqlite:///{tmp_path}/studies.sqlite", str(tmp_path / "s.sqlite")
    config = SearchConfig(n_trials=trials, patience=None, space="compact", lookahead=trials,
                          heartbeat_s=60, grace_s=120)
    results: dict[str, list] = {}
    started: dict[str, list] = {"a": [], "b": []}

    def worker(name: str, delay_s: float) -> None:
        with open_database(db) as schedules, IsolatedExecutor(SimulatedExecutor) as inner:
            tuner = Tuner(_Slow(inner, delay_s), family=FORWARD, arch="sm_90",
                          device_name="Simulated GPU", storage_url=url, db=schedules,
                          config=config, device_index={"a": 0, "b": 1}[name])
            try:
                results[name] = tuner.tune_many(problems, started[name].append)
            finally:
                tuner.close()

    rival = threading.Thread(target=worker, args=("a", rival_delay_s))
    rival.start()
    name = study_name("tiledtune", FORWARD, "sm_90", problems[0])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until A holds every ticket of the first key
        try:
            if _budget_records(url, name)[0] == trials:
                break
        except sa.exc.SQLAlchemyError:  # the tables do not exist yet
            pass
        time.sleep(0.1)
    worker("b", 0.0)
    rival.join()
    return url, db, results, started


@pytest.mark.slow  # two measuring processes; a few seconds
def test_a_worker_that_finds_the_budget_spent_waits_for_the_rivals_trials(tmp_path):
    """Worker A (GPU 0) takes every ticket of the key and measures slowly; worker B (GPU 1),
    starting after, finds the budget spent while none of A's trials has finished. B waits for
    them instead of reporting no schedule, and both report and store the same winner; the
    trials record the GPU that measured them."""
    trials = 2
    url, db, results, _ = _rival_first(tmp_path, [PROBLEM], 2.0, trials)
    (a,), (b,) = results["a"], results["b"]
    assert a.measured == trials and b.measured == 0
    assert b.best is not None and b.best.key == a.best.key
    name = study_name("tiledtune", FORWARD, "sm_90", PROBLEM)
    measured = _measured(optuna.load_study(study_name=name, storage=url).get_trials())
    assert [t.user_attrs["device"] for t in measured] == [0] * trials  # who measured: GPU 0
    with open_database(db) as schedules:
        assert [r.problem for r in schedules.rows()] == [PROBLEM]


@pytest.mark.slow  # two measuring processes; a few seconds
def test_a_worker_tunes_its_other_keys_before_waiting_for_a_rival(tmp_path):
    """Worker A (slow) takes every ticket of the first key; worker B, starting after, finds
    that budget spent, tunes the second key meanwhile (all its tickets: A is still busy), then
    comes back to the first, waits for A's trials and reports A's winner. Without deferring,
    B would idle on the first key until A's trials end and measure the second only then."""
    trials = 2
    second = Problem(batch=2, heads_q=8, heads_kv=8, seqlen_q=512, seqlen_k=512, head_dim=64,
                     dtype="bf16", causal=True)
    url, db, results, started = _rival_first(tmp_path, [PROBLEM, second], 3.0, trials)
    (a1, a2), (b1, b2) = results["a"], results["b"]
    assert started["b"] == [PROBLEM, second] and [r.problem for r in results["b"]] == \
        [PROBLEM, second]
    assert (a1.measured, b1.measured) == (trials, 0)  # the first key: A's alone
    assert (a2.measured, b2.measured) == (0, trials)  # the second: B's, measured meanwhile
    assert b1.best is not None and b1.best.key == a1.best.key
    assert a2.best is not None and a2.best.key == b2.best.key
    # B measured the second key while A still measured the first (not after it)
    done = {key: max(t.datetime_complete for t in _measured(optuna.load_study(
        study_name=study_name("tiledtune", FORWARD, "sm_90", key), storage=url).get_trials()))
        for key in (PROBLEM, second)}
    assert done[second] < done[PROBLEM]
    with open_database(db) as schedules:
        assert sorted(r.problem.seqlen_q for r in schedules.rows()) == [512, 1024]


class _Counting(_Slow):
    """An executor that counts the calls of each method (re-timings among them)."""

    def __init__(self, inner: IsolatedExecutor):
        super().__init__(inner, 0.0)
        self.calls: collections.Counter = collections.Counter()

    def measurement(self, method, *args, deadline):
        self.calls[method] += 1
        return super().measurement(method, *args, deadline=deadline)

    def call(self, method, *args, deadline):
        self.calls[method] += 1
        return super().call(method, *args, deadline=deadline)


def _worker(url: str, db: str, problems: list, start: int = 0, trials: int = 2):
    """One in-process worker tuning ``problems`` from ``problems[start]`` on: its results, the
    keys as each started, and its executor's call counts."""
    config = SearchConfig(n_trials=trials, patience=None, space="compact", lookahead=trials)
    started: list = []
    with open_database(db) as schedules, IsolatedExecutor(SimulatedExecutor) as inner:
        executor = _Counting(inner)
        tuner = Tuner(executor, family=FORWARD, arch="sm_90", device_name="Simulated GPU",
                      storage_url=url, db=schedules, config=config, device_index=0)
        try:
            results = tuner.tune_many(problems, started.append, start=start)
        finally:
            tuner.close()
    return results, started, executor.calls


def test_workers_begin_on_different_keys_and_report_in_order(tmp_path):
    """``tune_many(start=1)`` walks the keys from the second, wrapping around, and returns the
    results in the keys' order (``--workers`` gives each worker its own start)."""
    keys = [PROBLEM, *(Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=s, seqlen_k=s,
                               head_dim=64, dtype="bf16", causal=False) for s in (512, 2048))]
    url, db = f"sqlite:///{tmp_path}/studies.sqlite", str(tmp_path / "s.sqlite")
    results, started, _ = _worker(url, db, keys, start=1)
    assert started == [keys[1], keys[2], keys[0]]
    assert [r.problem for r in results] == keys and all(r.best is not None for r in results)


def test_a_key_concluded_by_another_worker_is_not_retimed(tmp_path):
    """A worker that reaches a key another worker measured to its budget and concluded since
    (nothing measured after the conclusion) reports that conclusion and re-times nothing; a
    measurement after the conclusion makes the next worker conclude again."""
    url, db = f"sqlite:///{tmp_path}/studies.sqlite", str(tmp_path / "s.sqlite")
    (first,), _, calls = _worker(url, db, [PROBLEM])
    assert first.measured == 2 and calls["retime"] == 1
    (second,), _, calls = _worker(url, db, [PROBLEM])
    assert second.measured == 0 and calls["retime"] == 0 and calls["measure"] == 0
    assert second.best == first.best and second.tied == first.tied
    assert second.timings == first.timings
    assert second.stored == "concluded by another worker"
    (third,), _, calls = _worker(url, db, [PROBLEM], trials=3)  # a larger budget: one more
    assert third.measured == 1 and calls["retime"] == 1
