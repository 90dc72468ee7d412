"""The Optuna side of a search: study names, the RDB storage with heartbeats (on SQLite with
transactions that lock before they read), and the thread that keeps this process's running
trials alive."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from typing import Any

import optuna
import sqlalchemy as sa

from db import canonical_json
from tiledattention import Family

from ..errors import StorageError
from ._budget import Budget

__all__ = ["study_name", "open_storage", "Heartbeat", "quiet_optuna"]


def study_name(prefix: str, family: Family, arch: str, problem: Any) -> str:
    """The Optuna study of one key: ``prefix:family:arch:<problem as canonical JSON>``."""
    return f"{prefix}:{family.name}:{arch}:{canonical_json(problem.to_dict())}"


class StaleTrial:
    """Called once per trial of a dead worker (heartbeat older than the grace period): gives
    its budget ticket back and re-enqueues its candidate once."""

    def __init__(self, url: str) -> None:
        self._url = url
        with quiet_optuna():
            self._retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)

    def __call__(self, study, trial) -> None:
        budget = Budget(self._url, study.study_name)
        budget.release(trial.number)
        budget.close()
        self._retry(study, trial)


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
