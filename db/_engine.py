"""Connections to a schedule database: where a location points, cheap checks of a SQLite file
before SQLite opens it, and the SQLite engine (WAL, ``BEGIN IMMEDIATE`` writes; readers that
write nothing beside the file, :func:`read_only_uri`). Every SQLite connection has a short busy
timeout (``_locks.BUSY_SLICE_S``): a wait for another process's lock is retried in such slices
up to a bound (``_locks.LockWait``), so a Ctrl-C is seen at once and a lock held for long is
reported, not waited out."""

from __future__ import annotations

import os
import sqlite3
import stat
import sys
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import DatabaseUnavailable
from ._locks import BUSY_SLICE_S, LOCK_WAIT_S, LockWait

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = ["Target", "check_sqlite_file", "inspect_sqlite_file", "check_writable_path",
           "read_only_uri", "SqliteReadConnections", "server_engine", "sqlite_engine",
           "is_locked", "BUSY_SLICE_S", "WRITE_OPTION"]

#: execution option that makes a connection's transactions ``BEGIN IMMEDIATE``
WRITE_OPTION = "tiledattention_write"
_SQLITE_MAGIC = b"SQLite format 3\x00"


class Target:
    """Where a location points: a SQLite file (``path``), in-memory SQLite, or another URL."""

    def __init__(self, location: str | os.PathLike) -> None:
        text = os.fspath(location)
        if not isinstance(text, str) or not text.strip():
            raise DatabaseUnavailable(f"a database location must be a path or URL; got "
                                      f"{location!r}")
        self.url: str | None = None
        self.path: Path | None = None
        self.memory = False
        if "://" in text:
            from sqlalchemy.engine import make_url

            try:
                url = make_url(text)
            except Exception as exc:
                raise DatabaseUnavailable(
                    f"{text!r} is not an SQLAlchemy URL ({exc}); give a file path or a URL "
                    "such as sqlite:///path or postgresql+psycopg://user@host/db") from None
            if url.get_backend_name() == "sqlite":
                database = url.database or ""
                if database in ("", ":memory:"):
                    self.memory = True
                else:
                    self.path = Path(database)
            else:
                self.url = text
            self.shown = (url.render_as_string(hide_password=True)
                          if self.path is None else str(self.path))
        else:
            self.path = Path(text).expanduser()
            self.shown = str(self.path)

    @property
    def sqlite(self) -> bool:
        return self.url is None


def check_sqlite_file(path: Path) -> None:
    """Cheap checks of a SQLite file's header, before SQLite sees it."""
    if path.is_dir():
        raise DatabaseUnavailable(f"{path} is a directory; expected a SQLite schedule database")
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):  # a FIFO would block the read below (and SQLite) for ever
        what = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
        raise DatabaseUnavailable(f"{path} is {what}, not a regular file; expected a SQLite "
                                  "schedule database")
    size = path.stat().st_size
    if size == 0:
        return  # SQLite reads an empty file as an empty database
    with open(path, "rb") as f:
        header = f.read(100)
    if not header.startswith(_SQLITE_MAGIC[:len(header)]) or \
            (len(header) >= 16 and header[:16] != _SQLITE_MAGIC):
        raise DatabaseUnavailable(
            f"{path} is not a SQLite database (no SQLite header); point TILEDATTN_DB at a "
            "tiledattention schedule database, or move the file away")
    if len(header) < 100:
        raise DatabaseUnavailable(f"{path} is truncated ({size} bytes, shorter than a SQLite "
                                  "header); delete it or restore it from a backup")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    size_valid = header[24:28] == header[92:96]  # the in-header size is trusted only then
    if size_valid and pages and size < pages * page_size:
        raise DatabaseUnavailable(
            f"{path} is truncated ({size} bytes; its header says {pages * page_size}); delete "
            "it or restore it from a backup")


def inspect_sqlite_file(path: Path, version_table: str, *, lock_wait_s: float = LOCK_WAIT_S
                        ) -> tuple[set[str], str | None]:
    """The table names and the recorded schema revision of an existing SQLite file, read through
    a read-only connection after SQLite's integrity check (``PRAGMA quick_check``), before any
    connection that could write opens it: opened as :func:`read_only_uri` says, so no
    ``-wal``/``-shm`` file appears beside a file we then refuse. A lock another process holds
    (a rollback-journal writer) is waited for up to ``lock_wait_s`` seconds."""
    wait = LockWait(lock_wait_s, path, str(path))
    return wait.run(lambda: _inspect_once(path, version_table), is_locked)


def _inspect_once(path: Path, version_table: str) -> tuple[set[str], str | None]:
    uri, _ = read_only_uri(path)
    try:
        connection = sqlite3.connect(uri, uri=True, timeout=BUSY_SLICE_S)
    except sqlite3.Error as exc:
        raise DatabaseUnavailable(f"{path} cannot be opened: {exc}") from None
    try:
        problems = [r[0] for r in connection.execute("PRAGMA quick_check(5)").fetchall()]
        if problems != ["ok"]:
            raise DatabaseUnavailable(
                f"{path} is corrupt (SQLite's integrity check: {'; '.join(problems)[:300]}); "
                "restore it from a backup, or move it away and re-tune")
        tables = {r[0] for r in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        revision = None
        if version_table in tables:
            found = [r[0] for r in connection.execute(
                f"SELECT version_num FROM {version_table}")]
            revision = found[0] if len(found) == 1 else None
    except sqlite3.DatabaseError as exc:
        if is_locked(exc):
            raise  # waited for by the caller
        raise DatabaseUnavailable(f"{path} is not a readable SQLite database ({exc}); restore "
                                  "it from a backup, or move it away") from None
    finally:
        connection.close()
    return tables, revision


def read_only_uri(path: Path) -> tuple[str, bool]:
    """The URI of a read-only connection to the SQLite file ``path`` that writes nothing beside
    it and needs no write access to the file or its directory, and whether it is
    ``immutable``.

    On a WAL database (every file the tool writes is one), SQLite's ``mode=ro`` needs the
    ``-wal`` and ``-shm`` files beside it: it creates them when they are missing and leaves
    them there (a read-only connection cannot remove them; with the file's permissions, where
    another user's writer could not use them), and cannot open the file at all where it may not
    create them ("unable to open database file": a read-only mount, a directory or file of
    another user). So ``mode=ro`` is used where a writer's ``-wal`` and ``-shm`` already exist
    (SQLite reads them without writing, and sees the writer's latest commits); anywhere else
    ``mode=ro&immutable=1``: SQLite reads the file as it is, creates nothing and takes no lock.
    Such a file has no writer at work (a writer keeps its ``-wal`` and ``-shm`` while it runs,
    and writes the file itself only when it checkpoints them); a writer that starts later is
    seen by the next connection, which asks again. A file in rollback-journal mode is read
    ``mode=ro`` where this process could write it and its directory (a reader creates nothing
    beside it, and its shared lock keeps a writer out of the file while it reads). A ``-wal``
    without its ``-shm`` (a writer that died, a copy of a live database) cannot be read without
    making a ``-shm`` beside it: ``immutable`` reads the file as of its last checkpoint, and the
    reader says so once (:func:`_unread_wal`)."""
    path = path.resolve()
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    if wal.exists() and shm.exists() and os.access(wal, os.R_OK) and os.access(shm, os.R_OK):
        return uri, False
    writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)
    if writable and not _wal_mode(path):
        return uri, False
    return uri + "&immutable=1", True


def _wal_mode(path: Path) -> bool:
    """Whether the header of the SQLite file ``path`` says WAL mode (read and write versions
    2); ``True`` where it cannot be read (the reading that follows says what is wrong)."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return True
    return len(header) < 20 or header[18:20] != b"\x01\x01"


def _unread_wal(path: Path) -> str | None:
    """What an ``immutable`` reader of ``path`` misses: a non-empty ``-wal`` file's pages."""
    wal = Path(f"{path.resolve()}-wal")
    try:
        size = wal.stat().st_size
    except OSError:
        return None
    return None if not size else (
        f"{path}: its {wal.name} file holds {size} bytes of changes not yet checkpointed into "
        "the database (a writer that stopped, or a copy of a live database), which a reader "
        "cannot read without writing a -shm file beside it; reading the database as of its "
        "last checkpoint (a writer, `tiledtune import` or `search`, folds them in where the "
        "file is writable; so does `sqlite3 FILE 'PRAGMA wal_checkpoint(TRUNCATE)'`)")


def check_writable_path(path: Path) -> None:
    """Raise :class:`DatabaseUnavailable` unless a SQLite database at ``path`` can be written:
    the file (when it exists) and its directory (for the journal), or the nearest existing
    ancestor when they are still to be created."""
    if path.exists():
        if not os.access(path, os.W_OK):
            raise DatabaseUnavailable(f"{path} is read-only (no write permission, or a "
                                      "read-only mount); pass --db with a writable location")
        folder = path.parent
    else:
        folder = next((p for p in path.parents if p.exists()), Path("/"))
        if not folder.is_dir():
            raise DatabaseUnavailable(f"cannot create {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DatabaseUnavailable(f"cannot write to {path}: its directory {folder} is not "
                                  "writable (SQLite keeps its journal there); pass --db with a "
                                  "writable location")


class SqliteReadConnections:
    """Read-only ``sqlite3`` connections to the file ``path``, as :func:`read_only_uri` says,
    without SQLAlchemy (what ``sqlite_engine(path, read_only=True)`` would make, for the
    queries of ``_sql``). Connections are kept for reuse, one per concurrent reader, unless the
    file is read ``immutable`` when opened: then each read opens its own, so a writer that
    starts later is seen. The first ``immutable`` connection that misses a ``-wal`` file's
    pages warns once."""

    def __init__(self, path: Path) -> None:
        import threading

        self._path = path
        self._pooled = not read_only_uri(path)[1]
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._told = False

    def _connect(self) -> sqlite3.Connection:
        uri, immutable = read_only_uri(self._path)
        if immutable and not self._told:
            unread = _unread_wal(self._path)
            if unread:
                import warnings

                self._told = True
                warnings.warn(unread, RuntimeWarning, stacklevel=4)
        connection = sqlite3.connect(uri, uri=True, timeout=BUSY_SLICE_S,
                                     isolation_level=None, check_same_thread=False)
        connection.execute(f"PRAGMA busy_timeout = {int(BUSY_SLICE_S * 1000)}")
        return connection

    def take(self) -> sqlite3.Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def give(self, connection: sqlite3.Connection) -> None:
        if self._pooled:
            with self._lock:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def sqlite_engine(path: Path | None, *, read_only: bool) -> "Engine":
    """The engine of a SQLite file (``None``: in memory). ``read_only``: connections as
    :func:`read_only_uri` says, decided again for each new connection: where they are
    ``immutable`` no connection is pooled, so a writer that starts later is seen."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.pool import NullPool, QueuePool, StaticPool

    if path is None:
        def connect() -> sqlite3.Connection:
            return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        pool = StaticPool
    elif read_only:
        told: list[str] = []

        def connect() -> sqlite3.Connection:
            uri, immutable = read_only_uri(path)
            unread = _unread_wal(path) if immutable and not told else None
            if unread:
                import warnings

                told.append(unread)
                warnings.warn(unread, RuntimeWarning, stacklevel=2)
            return sqlite3.connect(uri, uri=True, timeout=BUSY_SLICE_S, isolation_level=None,
                                   check_same_thread=False)
        pool = NullPool if read_only_uri(path)[1] else QueuePool
    else:
        def connect() -> sqlite3.Connection:
            return sqlite3.connect(str(path), timeout=BUSY_SLICE_S, isolation_level=None,
                                   check_same_thread=False)
        pool = QueuePool
    engine = create_engine("sqlite+pysqlite://", creator=connect, poolclass=pool)

    # isolation_level=None hands transaction control to us: pysqlite's own implicit BEGIN
    # would be DEFERRED, and a deferred reader that later writes fails with SQLITE_BUSY at once.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, record: Any) -> None:
        dbapi_connection.execute(f"PRAGMA busy_timeout = {int(BUSY_SLICE_S * 1000)}")
        if path is not None and not read_only:
            dbapi_connection.execute("PRAGMA journal_mode = WAL")

    @event.listens_for(engine, "begin")
    def _on_begin(connection: "Connection") -> None:
        write = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def server_engine(target: Target) -> "Engine":
    """The engine of a server database URL (connections are made on first use)."""
    from sqlalchemy import create_engine

    try:
        return create_engine(target.url, pool_pre_ping=True)
    except Exception as exc:  # an unknown dialect or a missing driver
        raise DatabaseUnavailable(
            f"cannot use the schedule database {target.shown}: {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:200]}; give a file path or an SQLAlchemy URL "
            "whose driver is installed (e.g. postgresql+psycopg://...)") from None


def is_locked(exc: BaseException) -> bool:
    """A lock / busy / serialisation failure (SQLAlchemy's, or ``sqlite3``'s own): the
    transaction may succeed if run again."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
    elif "sqlalchemy" not in sys.modules:  # not SQLAlchemy's, and a reader never imports it
        return False
    else:
        from sqlalchemy.exc import DBAPIError

        if not isinstance(exc, DBAPIError):
            return False
        text = str(exc.orig).lower()
    return "locked" in text or "busy" in text or "deadlock" in text or "serializ" in text
