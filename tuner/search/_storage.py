"""The Optuna side of a search: study names, the RDB storage with heartbeats (on SQLite with
transactions that lock before they read), and the thread that keeps this process's running
trials alive."""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
import warnings
from datetime import datetime, timedelta
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from db import canonical_json
from tiledattention import Family

from ..errors import StorageError
from ._budget import Budget

__all__ = ["study_name", "open_storage", "fail_stale_trials", "Heartbeat", "quiet_optuna"]


def study_name(prefix: str, family: Family, arch: str, problem: Any, *,
               backend: str = "gpu", database: str | None = None) -> str:
    """The Optuna study of one key: ``prefix:family:arch:<problem as canonical JSON>`` for the
    GPU (the name studies had before the backend was part of it), and
    ``prefix:family:arch:backend:<problem>`` for another backend, so that a simulated study is
    never resumed by a GPU search (``_identity`` checks the rest of what makes times
    comparable). ``database``: the identity of a schedule database (``db.database_identity``),
    named after the backend as ``db-<identity>:``: the study of the key for that database when
    the study of the plain name belongs to another (``_identity.study_for_database``)."""
    where = f"{arch}:" if backend == "gpu" else f"{arch}:{backend}:"
    if database is not None:
        where += f"db-{database}:"
    return f"{prefix}:{family.name}:{where}{canonical_json(problem.to_dict())}"


class StaleTrial:
    """Called once per trial of a dead worker (heartbeat older than the grace period), after
    Optuna failed it: marks its status ``"stale"``, gives its budget ticket back and
    re-enqueues its candidate once.

    The status matters where the worker died while recording a measurement (between writing
    the trial's ``status`` and telling its state): the failed trial would otherwise keep a
    measurement's status and count as measured next to its retry."""

    def __init__(self, url: str) -> None:
        self._url = url
        with quiet_optuna():
            self._retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)

    def __call__(self, study, trial) -> None:
        _mark_stale(self._url, trial._trial_id)
        budget = Budget(self._url, study.study_name)
        budget.release(trial.number)
        budget.close()
        self._retry(study, trial)


def _mark_stale(url: str, trial_id: int) -> None:
    """Set the ``status`` user attribute of failed trial ``trial_id`` to ``"stale"``, in
    Optuna's own table: Optuna writes no attribute of a finished trial."""
    table = sa.table("trial_user_attributes", sa.column("trial_id"), sa.column("key"),
                     sa.column("value_json"))
    stale = json.dumps("stale")
    connect_args = {"timeout": 60} if url.startswith("sqlite") else {}
    engine = sa.create_engine(url, connect_args=connect_args)
    try:
        with engine.begin() as conn:
            mine = (table.c.trial_id == trial_id) & (table.c.key == "status")
            if not conn.execute(table.update().where(mine).values(value_json=stale)).rowcount:
                conn.execute(table.insert().values(trial_id=trial_id, key="status",
                                                   value_json=stale))
    finally:
        engine.dispose()


def open_storage(url: str, *, heartbeat_s: int, grace_s: int) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats: a dead worker's running trials are failed after
    ``grace_s``, their tickets returned and their candidates re-enqueued once. On SQLite,
    every transaction takes the database's write lock first (:func:`_lock_before_reading`),
    so that an enqueued trial goes to one worker only. Raises
    :class:`~tuner.errors.StorageError` when the storage cannot be opened."""
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    attempt = 0
    while True:  # workers starting together may race to create Optuna's tables
        try:
            with quiet_optuna():
                storage = optuna.storages.RDBStorage(
                    url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s,
                    grace_period=grace_s,
                    heartbeat_stale_trial_callback=StaleTrial(url))
            break
        except Exception as exc:  # the losing CREATE TABLE; give up after five tries
            attempt += 1
            if attempt == 5:
                raise StorageError(f"cannot open the study storage {_shown_url(url)}: "
                                   f"{type(exc).__name__}: {exc}") from exc
            time.sleep(0.5 * attempt)
    if storage.engine.dialect.name == "sqlite":
        _lock_before_reading(storage.engine)
    return storage


def _shown_url(url: str) -> str:
    """``url`` with its password masked."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy can parse: nothing to mask in it
        return url


def _lock_before_reading(engine: sa.engine.Engine) -> None:
    """Make each transaction on ``engine`` (SQLite) begin with ``BEGIN IMMEDIATE``.

    Optuna changes a trial's state by reading the row ``FOR UPDATE`` and then writing it: a
    row lock on PostgreSQL and MySQL, but nothing on SQLite, where Python's ``sqlite3`` runs
    the read outside any transaction and begins one only at the write. Two workers could then
    both read an enqueued trial as WAITING and both mark it RUNNING: both were handed the same
    trial, and the write of the later one could even turn a trial the other had already
    finished back into RUNNING (then failed as stale, its ticket returned, and measured again).
    Taking SQLite's write lock at the start of the transaction makes that read and write one
    step, as the row lock does elsewhere; a waiting worker waits in the busy handler (the
    60 s ``timeout`` above) instead of failing with "database is locked" on a lock upgrade.
    SQLAlchemy's recipe for transactions on ``sqlite3``: the driver's own BEGIN is switched off
    (``isolation_level = None``) and the engine emits ours.
    """
    @sa.event.listens_for(engine, "connect")
    def _no_driver_begin(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _begin_immediate(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while Optuna created its tables lack the hook


def fail_stale_trials(study, storage: optuna.storages.RDBStorage, grace_s: float) -> None:
    """Fail the running trials of ``study`` whose worker died, each once, through the storage's
    stale-trial callback (:class:`StaleTrial`: its ticket given back, its candidate queued
    again): those whose heartbeat is older than the grace period (Optuna's rule), and those
    that never got a heartbeat and started more than ``grace_s`` ago.

    A trial is RUNNING from the moment ``study.ask`` creates it (or takes it from the queue),
    and the sampler runs inside ``ask``; its first heartbeat is recorded only after that
    (``Heartbeat.hold``). A worker killed in between (a SIGKILL, an out-of-memory kill, a lost
    host) leaves a running trial with no heartbeat row, which Optuna's ``fail_stale_trials``
    passes over for good. Such a trial holds no ticket and no schedule claim yet (both are
    taken after the heartbeat), so nothing else waits for it; it is failed here so that the
    study shows what happened, and its candidate (a seed, say) is asked again. Its start time
    is the clock of the host that asked it (Optuna's ``datetime_start``), so across hosts the
    grace period also absorbs their clocks' difference; a live worker's trial failed too early
    by a wrong clock is dropped by that worker as one another worker finished
    (``Tuner._drop``), never measured twice."""
    with quiet_optuna():
        optuna.storages.fail_stale_trials(study)
    callback = storage.get_heartbeat_stale_trial_callback()
    for trial_id in _never_beaten(study, storage, grace_s):
        try:
            if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:  # finished meanwhile: by its worker, or another's
            continue
        if callback is not None:
            callback(study, copy.deepcopy(storage.get_trial(trial_id)))


def _never_beaten(study, storage: optuna.storages.RDBStorage, grace_s: float) -> list[int]:
    """The ids of ``study``'s running trials that started more than ``grace_s`` ago and have
    no heartbeat row."""
    limit = datetime.now() - timedelta(seconds=grace_s)
    old = [t._trial_id for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
           if t.datetime_start is not None and t.datetime_start < limit]
    if not old:
        return []
    query = sa.text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
        sa.bindparam("ids", expanding=True))
    with storage.engine.connect() as connection:  # Optuna's table of heartbeats
        beating = {row[0] for row in connection.execute(query, {"ids": old})}
    return [trial_id for trial_id in old if trial_id not in beating]


class Heartbeat:
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
def quiet_optuna():
    """Heartbeats with ask/tell (rather than ``optimize``) and ``fail_stale_trials`` are what
    make concurrent workers safe here; silence Optuna's notes that they are unusual."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        yield
