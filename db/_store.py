"""``ScheduleDB``: the best-per-key schedule table in SQLite (default) or any SQLAlchemy database.

SQLite files run in WAL mode, so a lookup reads while a tuner writes. Every write is one
``BEGIN IMMEDIATE`` transaction (the write lock is taken before the read that decides what to
write), so concurrent writers serialise instead of failing with "database is locked"; other
databases use ``SELECT ... FOR UPDATE`` and retry a transaction that lost an insert race. A
lock another process holds is waited for ``lock_wait_s`` seconds at most (``db._locks``: in
slices that a Ctrl-C cuts short), then :class:`~db._errors.DatabaseLocked` says who holds it.

SQLAlchemy and Alembic are imported on first use, not with ``db``: a lookup without a database
file costs one ``os.path.exists``. A SQLite file opened read-only is read through the standard
library's ``sqlite3`` alone (``_sql``'s queries, which SQLAlchemy runs for the other databases).
"""

from __future__ import annotations

import itertools
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, TypeVar

from . import _sql
from ._engine import (WRITE_OPTION, SqliteReadConnections, Target, check_sqlite_file,
                      check_writable_path, inspect_sqlite_file, is_locked, server_engine,
                      sqlite_engine)
from ._encode import problem_key, row_values
from ._errors import (DatabaseArgumentError, DatabaseMisuse, DatabaseUnavailable, RecordError,
                      SchemaTooNew)
from ._locks import LOCK_WAIT_S, LockWait, check_lock_wait, locked_error
from ._queries import Queries
from ._merge import verdict
from ._rows import FamilyCodec, Provenance, ScheduleRow, codec_map

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = ["ScheduleDB", "PUT_OUTCOMES"]

#: What :meth:`ScheduleDB.put` did.
PUT_OUTCOMES = ("added", "improved", "replaced", "forced", "kept", "skipped")

#: Write transactions a call runs at most when each loses an insert race to another writer
#: (a server database; SQLite's writers serialise on the lock, waited for by time instead).
_WRITE_ATTEMPTS = 8
_T = TypeVar("_T")
#: Problems per query when :meth:`ScheduleDB.merge_many` fetches the stored rows (within
#: SQLite's oldest limit of 999 bound values a statement).
_BULK_KEYS = 500


def _empty(path: Path) -> bool:
    """A 0-byte regular file with no uncheckpointed ``-wal`` pages beside it."""
    try:
        if not path.is_file() or path.stat().st_size:
            return False
        return not Path(f"{path}-wal").stat().st_size
    except FileNotFoundError:  # no -wal file
        return True
    except OSError:  # not ours to judge: opening it says what is wrong
        return False


class ScheduleDB(Queries):
    """The best schedule per key ``(family, arch, device_name, problem)``.

    ``codecs`` (``FamilyCodec`` values, or a mapping of them) say how to store and rebuild the
    problems and schedules of each kernel family; stored rows of a family without a codec are
    not read.

    ``location`` is a file path (SQLite) or an SQLAlchemy URL (``sqlite:///...``,
    ``postgresql+psycopg://...``). For writing, a missing SQLite file and its directories are
    created and an older schema is migrated in place; a schema newer than this tiledattention
    knows can still be read, but :meth:`put` raises :class:`SchemaTooNew`. ``read_only=True``
    never creates, migrates or changes anything, and needs no write access to a SQLite file or
    its directory (a read-only mount, another user's file: ``_engine.read_only_uri``), and
    writes nothing beside it.

    ``lock_wait_s``: how long, in all, a read or write waits for a lock another process holds
    on a SQLite file before :class:`~db._errors.DatabaseLocked` (``None``: ``LOCK_WAIT_S``).
    """

    def __init__(self, location: str | os.PathLike, *,
                 codecs: Iterable[FamilyCodec] | Mapping[str, FamilyCodec] = (),
                 read_only: bool = False, lock_wait_s: float | None = None) -> None:
        self._lock_wait_s = LOCK_WAIT_S if lock_wait_s is None else check_lock_wait(lock_wait_s)
        self._codecs = codec_map(codecs)
        self._target = Target(location)
        self._read_only = read_only
        self._closed = False
        self._engine: Engine | None = None
        self._reads: SqliteReadConnections | None = None  # a SQLite file read-only: no engine
        self._present: frozenset[str] | None = None
        self._prepared: dict[str, tuple] = {}  # _insert_many's statement
        path = self._target.path
        if path is not None:
            self._check_file(path)
        if read_only and path is not None:
            self._reads = SqliteReadConnections(path)
        elif self._target.sqlite:
            self._engine = sqlite_engine(None if self._target.memory else path,
                                         read_only=read_only)
        else:
            self._engine = server_engine(self._target)
        try:
            if read_only:
                self._check_schema()
            else:
                self._prepare_for_writing()
        except BaseException:
            self.close()
            raise

    @classmethod
    def open_for_lookup(cls, location: str | os.PathLike, *,
                        codecs: Iterable[FamilyCodec] | Mapping[str, FamilyCodec] = (),
                        lock_wait_s: float | None = None) -> "ScheduleDB | None":
        """Open for reading at run time: ``None`` when a SQLite file does not exist or is empty
        (nothing is created); :class:`DatabaseUnavailable` naming the file when it is not a
        readable tiledattention database.

        The one rule for an empty (0-byte) file, as SQLite has it: a database with nothing in it
        yet. A reader finds no rows in it, as in a missing file (``list``, ``export``,
        ``explain``, the runtime's lookup); a writer creates the schema in it (``search``,
        ``import``), as in a new file: ``touch``-ing the file a container will mount is fine."""
        target = Target(location)
        if target.path is not None and (not target.path.exists() or _empty(target.path)):
            return None
        return cls(location, codecs=codecs, read_only=True, lock_wait_s=lock_wait_s)

    # -- life cycle ---------------------------------------------------------------------------
    def close(self) -> None:
        self._closed = True
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        if self._reads is not None:
            self._reads.close()

    def __enter__(self) -> "ScheduleDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __str__(self) -> str:
        return self._target.shown

    def __repr__(self) -> str:
        mode = ", read_only=True" if self._read_only else ""
        return f"ScheduleDB({self._target.shown!r}{mode})"

    @property
    def read_only(self) -> bool:
        return self._read_only

    # -- connections ----------------------------------------------------------------------------
    def _lock_wait(self) -> LockWait:
        """A wait for another process's lock on the database, starting now."""
        return LockWait(self._lock_wait_s, self._target.path, self._target.shown)

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator["Connection"]:
        from sqlalchemy.exc import DBAPIError, IntegrityError

        if self._engine is None:
            raise DatabaseMisuse(f"{self!r} is closed" if self._closed else
                                 f"{self!r} was opened read-only")
        try:
            with self._engine.connect() as connection:
                if write:
                    connection.execution_options(**{WRITE_OPTION: True})
                with connection.begin():
                    yield connection
        except DBAPIError as exc:
            if write and (is_locked(exc) or isinstance(exc, IntegrityError)):
                raise  # _write retries these (a lock, or another writer's insert of the key)
            if is_locked(exc):  # a read (in WAL mode, reads wait for no writer)
                raise locked_error(self._target.path, self._target.shown, 0.0) from exc
            raise DatabaseUnavailable(f"cannot use the schedule database {self}: "
                                      f"{exc.orig or exc}") from exc

    @contextmanager
    def _reading(self) -> Iterator["_sql.SqliteReader | _sql.AlchemyReader"]:
        """A reader (``_sql``) inside one read transaction, so that the queries of one call
        see one state of the database."""
        if self._reads is None:
            with self._transaction(write=False) as connection:
                yield _sql.AlchemyReader(connection)
            return
        import sqlite3

        if self._closed:
            raise DatabaseMisuse(f"{self!r} is closed")
        reads = self._reads

        def begin() -> sqlite3.Connection:
            # the read lock (a snapshot, in WAL mode) is taken here, waited for in slices; the
            # queries of the transaction then need no other
            connection = reads.take()
            try:
                connection.execute("BEGIN")
                connection.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            except BaseException:
                connection.close()
                raise
            return connection

        try:
            connection = self._lock_wait().run(begin, is_locked)
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(f"cannot use the schedule database {self}: {exc}") from exc
        try:
            yield _sql.SqliteReader(connection)
            connection.execute("COMMIT")
        except sqlite3.Error as exc:
            connection.close()
            raise DatabaseUnavailable(f"cannot use the schedule database {self}: {exc}") from exc
        except BaseException:
            connection.close()
            raise
        self._reads.give(connection)

    def _check_file(self, path: Path) -> None:
        """Everything that can be said of a SQLite file before a connection that may write it
        opens: it exists (reading), is SQLite, passes the integrity check, is ours, of a revision
        this code can write (writing), and can be written (writing). A file refused here is left
        byte for byte as it was."""
        from . import _migrate
        from ._schema import HEAD_REVISION, TABLE_NAME, VERSION_TABLE

        if not path.exists():
            if self._read_only:
                raise DatabaseUnavailable(f"{path} does not exist")
            check_writable_path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            return
        check_sqlite_file(path)
        if path.stat().st_size:
            tables, revision = inspect_sqlite_file(path, VERSION_TABLE,
                                                   lock_wait_s=self._lock_wait_s)
            if TABLE_NAME not in tables and VERSION_TABLE in tables:
                raise self._foreign(f"no {TABLE_NAME!r} table")
            if TABLE_NAME not in tables and tables:
                raise self._foreign(f"it holds other tables: {sorted(tables)[:5]}")
            if TABLE_NAME in tables and revision is None:
                raise self._foreign("no schema version record")
            if not self._read_only and revision is not None and revision != HEAD_REVISION \
                    and revision not in _migrate.known_revisions():
                raise self._too_new_error(revision)
        if not self._read_only:
            check_writable_path(path)

    def _too_new_error(self, revision: str) -> SchemaTooNew:
        from ._schema import HEAD_REVISION

        return SchemaTooNew(
            f"{self} has schema revision {revision!r}, which this tiledattention does not know "
            f"(it knows up to {HEAD_REVISION!r}): a newer tiledattention wrote it. Upgrade "
            "tiledattention to write to it (reading still works), or pass --db elsewhere")

    def _inspect(self, reader: "_sql.SqliteReader | _sql.AlchemyReader"
                 ) -> tuple[set[str], str | None, bool]:
        """Table names, the recorded revision, and whether a version table exists."""
        from ._schema import VERSION_TABLE

        tables = reader.tables()
        if VERSION_TABLE not in tables:
            return tables, None, False
        revisions = reader.column(f"SELECT version_num FROM {VERSION_TABLE}")
        return tables, (revisions[0] if len(revisions) == 1 else None), True

    def _foreign(self, what: str) -> DatabaseUnavailable:
        return DatabaseUnavailable(
            f"{self} is not a tiledattention schedule database ({what}); point TILEDATTN_DB "
            "elsewhere or move the file away")

    def _check_schema(self) -> None:
        from ._schema import TABLE_NAME

        with self._reading() as reader:
            tables, revision, _ = self._inspect(reader)
        if TABLE_NAME not in tables:
            raise self._foreign(f"no {TABLE_NAME!r} table")
        if revision is None:
            raise self._foreign("no schema version record")

    def _prepare_for_writing(self) -> None:
        """Create the schema, or migrate an older one, in one write transaction (so concurrent
        openers of a new file create it once)."""
        from . import _migrate
        from ._schema import HEAD_REVISION, TABLE_NAME

        wait = self._lock_wait()
        for attempt in itertools.count():
            try:
                with self._transaction(write=True) as connection:
                    tables, revision, has_version = self._inspect(
                        _sql.AlchemyReader(connection))
                    ours = TABLE_NAME in tables
                    if not ours and not has_version:
                        if tables and self._target.sqlite:
                            raise self._foreign(f"it holds other tables: {sorted(tables)}")
                        _migrate.upgrade(connection, "head")
                    elif not ours:
                        raise self._foreign(f"no {TABLE_NAME!r} table")
                    elif revision is None:
                        raise self._foreign("no schema version record")
                    elif revision != HEAD_REVISION:
                        if revision not in _migrate.known_revisions():
                            raise self._too_new_error(revision)
                        _migrate.upgrade(connection, "head")
                return
            except Exception as exc:
                if is_locked(exc):
                    if wait.expired():
                        raise wait.error() from exc
                elif not self._lost_create_race(exc) or attempt >= _WRITE_ATTEMPTS - 1:
                    raise
            time.sleep(_pause(attempt))

    def _lost_create_race(self, exc: Exception) -> bool:
        """On a server database, another process creating the same tables at the same moment
        makes our CREATE fail (duplicate type or table); the next attempt finds them made."""
        from sqlalchemy.exc import IntegrityError, ProgrammingError

        return not self._target.sqlite and isinstance(
            exc if isinstance(exc, IntegrityError) else exc.__cause__,
            (IntegrityError, ProgrammingError))

    def _check_writable(self) -> None:
        if self._read_only:
            raise DatabaseUnavailable(f"{self} was opened read-only")

    def _present_columns(self, reader: "_sql.SqliteReader | _sql.AlchemyReader"
                         ) -> frozenset[str]:
        if self._present is None:
            from ._schema import TABLE_NAME

            self._present = frozenset(reader.columns(TABLE_NAME))
        return self._present

    # -- writing --------------------------------------------------------------------------------
    def _codec(self, family: str) -> FamilyCodec:
        codec = self._codecs.get(family)
        if codec is None:
            raise RecordError(f"no codec for kernel family {family!r} was given to {self!r}; "
                              f"known: {sorted(self._codecs)}")
        return codec

    def put(self, row: ScheduleRow, *, force: bool = False,
            current: Provenance | None = None) -> str:
        """Store ``row`` unless the stored row of its key should stay; returns the outcome (see
        :meth:`merge`)."""
        return self.merge(row, force=force, current=current)[0]

    def merge(self, row: ScheduleRow, *, force: bool = False,
              current: Provenance | None = None) -> tuple[str, str]:
        """Store ``row`` unless the stored row of its key should stay: ``(outcome, why)``.

        A row the runtime would use is never replaced by one it would ignore. ``current`` is the
        provenance a measurement of the row's family would carry now (``None``: unknown); a row
        is *usable* when its template is ``current``'s and it was measured on a GPU. Outcomes:
        ``added`` (new key); ``improved`` / ``kept``: the same toolchain, the faster row wins;
        ``replaced``: the stored row was not usable (or of another cuda-tile/tileiras than
        ``current``) and ``row`` is; ``skipped``: ``row`` is not usable and the stored row is, or
        neither is, or their toolchains differ and nothing says which is current (nothing
        written); ``forced``: ``force=True`` overwrote whatever was stored.
        """
        from sqlalchemy import insert, select, update

        from ._schema import schedules as t

        if not isinstance(row, ScheduleRow):
            raise DatabaseArgumentError(f"put() takes a ScheduleRow; got {type(row).__name__}")
        if current is not None and not isinstance(current, Provenance):
            raise DatabaseArgumentError(f"current must be a Provenance or None; got "
                                        f"{type(current).__name__}")
        self._check_writable()
        values = row_values(row, self._codec(row.family))
        where = _key_clause(t, row.key)

        def decide(connection: "Connection") -> tuple[str, str]:
            found = connection.execute(
                select(t.c.id, t.c.median_ms, t.c.backend, t.c.template_hash, t.c.cuda_tile,
                       t.c.tileiras).where(where).with_for_update()).mappings().first()
            if found is None:
                connection.execute(insert(t).values(**values))
                return "added", ""
            outcome, why = ("forced", "--force") if force else verdict(found, row, current)
            if outcome not in ("skipped", "kept"):
                connection.execute(update(t).where(t.c.id == found["id"]).values(**values))
            return outcome, why

        return self._write(decide)

    def merge_many(self, rows: Iterable[ScheduleRow], *, force: bool = False,
                   current: Mapping[str, Provenance | None] | None = None
                   ) -> list[tuple[str, str]]:
        """:meth:`merge` of each row, in order, by the same rule: ``(outcome, why)`` per row.

        ``current`` maps a family to what :meth:`merge` takes as ``current`` (a family not in
        it: ``None``). All rows are decided and written in one write transaction: the stored
        rows of their keys are fetched in a few queries (``_BULK_KEYS`` problems each), the new
        rows inserted and the replaced ones updated in one batch each (what makes ``tiledtune
        import`` thousands of rows a second instead of one transaction, and one commit, per
        row). A key given twice is decided against what its earlier row left. Callers keep
        each call to a few thousand rows, so a concurrent writer waits for the lock briefly.
        """
        from sqlalchemy import bindparam, select, update

        from ._schema import schedules as t

        rows = list(rows)
        for row in rows:
            if not isinstance(row, ScheduleRow):
                raise DatabaseArgumentError(f"merge_many() takes ScheduleRow values; got "
                                            f"{type(row).__name__}")
        current = dict(current or {})
        for family, provenance in current.items():
            if provenance is not None and not isinstance(provenance, Provenance):
                raise DatabaseArgumentError(f"current[{family!r}] must be a Provenance or None; "
                                            f"got {type(provenance).__name__}")
        self._check_writable()
        if not rows:
            return []
        texts: dict[int, tuple[Any, str]] = {}  # schedule texts: rows share their schedules
        values = [row_values(row, self._codec(row.family), texts) for row in rows]
        # row.key, from the record (row.key would serialise the problem again)
        keys = [(v["family"], v["arch"], v["device_name"], v["problem"]) for v in values]
        # the problems of each (family, arch): the unique index's prefix, so each query reads
        # only the index entries of its problems (a row-value IN over the four key columns
        # makes SQLite scan the whole index instead)
        problems: dict[tuple[str, str], dict[str, None]] = {}
        for family, arch, _, problem in keys:
            problems.setdefault((family, arch), {})[problem] = None
        wanted = (t.c.id, t.c.family, t.c.arch, t.c.problem, t.c.device_name, t.c.median_ms,
                  t.c.backend, t.c.template_hash, t.c.cuda_tile, t.c.tileiras)

        def decide(connection: "Connection") -> list[tuple[str, str]]:
            stored: dict[tuple, dict[str, Any]] = {}
            for (family, arch), distinct in problems.items():
                listed = list(distinct)
                for start in range(0, len(listed), _BULK_KEYS):
                    found = connection.execute(select(*wanted).where(
                        t.c.family == family, t.c.arch == arch,
                        t.c.problem.in_(listed[start:start + _BULK_KEYS])
                    ).with_for_update()).mappings().all()
                    for record in found:
                        key = (record["family"], record["arch"], record["device_name"],
                               record["problem"])
                        stored[key] = dict(record)
            outcomes, inserts, updates = [], {}, {}
            for row, key, record in zip(rows, keys, values):
                found = stored.get(key)
                if found is None:
                    outcome, why = "added", ""
                elif force:
                    outcome, why = "forced", "--force"
                else:
                    outcome, why = verdict(found, row, current.get(row.family))
                outcomes.append((outcome, why))
                if outcome in ("skipped", "kept"):
                    continue
                if found is None or found["id"] is None:  # new, or new in this call
                    inserts[key] = record
                else:
                    updates[found["id"]] = {**record, "_id": found["id"]}
                stored[key] = {**record, "id": None if found is None else found["id"]}
            if inserts:
                _insert_many(connection, t, list(inserts.values()), self._prepared)
            if updates:
                connection.execute(update(t).where(t.c.id == bindparam("_id")),
                                   list(updates.values()))
            return outcomes

        return self._write(decide)

    def _write(self, decide: Callable[["Connection"], _T]) -> _T:
        """``decide(connection)`` in a write transaction, run again after a short pause when it
        lost a race: the database was locked (retried until ``lock_wait_s`` has passed, then
        :class:`DatabaseLocked`), or another writer inserted one of its keys first (the next
        run sees that row; :class:`DatabaseUnavailable` after ``_WRITE_ATTEMPTS`` such runs)."""
        from sqlalchemy.exc import IntegrityError

        wait = self._lock_wait()
        races = 0
        for attempt in itertools.count():
            try:
                with self._transaction(write=True) as connection:
                    return decide(connection)
            except IntegrityError as exc:
                races += 1
                if races >= _WRITE_ATTEMPTS:
                    raise DatabaseUnavailable(
                        f"cannot write to {self}: {races} attempts in a row lost an insert race "
                        f"to other writers ({exc.orig})") from exc
            except Exception as exc:
                if not is_locked(exc):
                    raise
                if wait.expired():
                    raise wait.error() from exc
            time.sleep(_pause(attempt))

    def delete(self, family: str, arch: str, device_name: str, problem: Any) -> bool:
        """Remove the row of this key; ``True`` when there was one."""
        from sqlalchemy import delete

        from ._schema import schedules as t

        self._check_writable()
        where = _key_clause(t, (family, arch, device_name, problem_key(problem)))
        return self._write(lambda connection: connection.execute(delete(t).where(where))
                           .rowcount > 0)


def _pause(attempt: int) -> float:
    """Seconds between two write attempts: short (a SQLite attempt has already waited its busy
    timeout), growing for a server database's races."""
    return min(0.01 * 2 ** attempt, 0.2)


def _insert_many(connection: "Connection", t: Any, records: list[dict[str, Any]],
                 prepared: dict[str, tuple]) -> None:
    """``connection.execute(insert(t), records)``: on a database of positional parameters
    (SQLite), one prepared INSERT of every column but ``id`` given a tuple per record, each
    value converted as SQLAlchemy converts it (the column type's bind processor: a
    ``created_at`` to SQLite's text), a missing column ``NULL``. SQLAlchemy's own executemany
    builds a parameter dict per record again, which costs more than the insert itself.
    ``prepared``: the statement made for the connection's dialect, kept by the caller."""
    from sqlalchemy import insert

    dialect = connection.dialect
    statement = prepared.get(dialect.name)
    if statement is None:
        columns = [c for c in t.columns if c.name != "id"]
        compiled = insert(t).compile(dialect=dialect, column_keys=[c.name for c in columns])
        order = compiled.positiontup if compiled.positional else None
        if order is not None and sorted(order) == sorted(c.name for c in columns):
            types = {c.name: c.type for c in columns}
            convert = [(i, p) for i, name in enumerate(order)
                       if (p := types[name].dialect_impl(dialect).bind_processor(dialect))]
            statement = (str(compiled), tuple(order), convert)
        else:  # named parameters (PostgreSQL's drivers): SQLAlchemy's way
            statement = (None, (), [])
        prepared[dialect.name] = statement
    sql, order, convert = statement
    if sql is None:
        connection.execute(insert(t), records)
        return
    params = []
    for record in records:
        values = list(map(record.get, order))
        for i, process in convert:
            values[i] = process(values[i])
        params.append(tuple(values))
    connection.exec_driver_sql(sql, params)


def _key_clause(t: Any, key: tuple[str, str, str, str]) -> Any:
    from sqlalchemy import and_

    family, arch, device_name, problem = key
    return and_(t.c.family == family, t.c.arch == arch, t.c.problem == problem,
                t.c.device_name == device_name)

