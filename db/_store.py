"""``ScheduleDB``: the best-per-key schedule table in SQLite (default) or any SQLAlchemy database.

SQLite files run in WAL mode, so a lookup reads while a tuner writes. Every write is one
``BEGIN IMMEDIATE`` transaction (the write lock is taken before the read that decides what to
write), so concurrent writers serialise instead of failing with "database is locked"; other
databases use ``SELECT ... FOR UPDATE`` and retry a transaction that lost an insert race.

SQLAlchemy and Alembic are imported on first use, not with ``db``: a lookup without a database
file costs one ``os.path.exists``.
"""

from __future__ import annotations

import os
import time
import warnings
from contextlib import contextmanager
from datetime import timezone
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

from ._engine import WRITE_OPTION, Target, check_sqlite_file, is_locked, sqlite_engine
from ._errors import DatabaseUnavailable, RecordError, SchemaTooNew
from ._legacy import LEGACY_PROBLEM, from_legacy, legacy_columns
from ._rows import PROVENANCE_FIELDS, FamilyCodec, Provenance, ScheduleRow, canonical_json, \
    codec_map

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

__all__ = ["ScheduleDB", "PUT_OUTCOMES"]

#: What :meth:`ScheduleDB.put` did.
PUT_OUTCOMES = ("added", "improved", "replaced", "forced", "kept")

_WRITE_ATTEMPTS = 8


class ScheduleDB:
    """The best schedule per key ``(family, arch, device_name, problem)``.

    ``codecs`` (``FamilyCodec`` values, or a mapping of them) say how to store and rebuild the
    problems and schedules of each kernel family; stored rows of a family without a codec are
    not read.

    ``location`` is a file path (SQLite) or an SQLAlchemy URL (``sqlite:///...``,
    ``postgresql+psycopg://...``). For writing, a missing SQLite file and its directories are
    created and an older schema is migrated in place; a schema newer than this tiledattention
    knows can still be read, but :meth:`put` raises :class:`SchemaTooNew`. ``read_only=True``
    opens SQLite files with ``mode=ro`` and never creates or migrates anything.
    """

    def __init__(self, location: str | os.PathLike, *,
                 codecs: Iterable[FamilyCodec] | Mapping[str, FamilyCodec] = (),
                 read_only: bool = False) -> None:
        self._codecs = codec_map(codecs)
        self._target = Target(location)
        self._read_only = read_only
        self._engine: Engine | None = None
        self._too_new: str | None = None
        self._columns: frozenset[str] | None = None
        path = self._target.path
        if path is not None:
            if read_only and not path.exists():
                raise DatabaseUnavailable(f"{path} does not exist")
            if path.exists():
                check_sqlite_file(path)
            elif not read_only:
                path.parent.mkdir(parents=True, exist_ok=True)
        from sqlalchemy import create_engine

        if self._target.sqlite:
            self._engine = sqlite_engine(None if self._target.memory else path,
                                          read_only=read_only)
        else:
            self._engine = create_engine(self._target.url, pool_pre_ping=True)
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
                        codecs: Iterable[FamilyCodec] | Mapping[str, FamilyCodec] = ()
                        ) -> "ScheduleDB | None":
        """Open for reading at run time: ``None`` when a SQLite file does not exist (nothing is
        created); :class:`DatabaseUnavailable` naming the file when it is not a readable
        tiledattention database."""
        target = Target(location)
        if target.path is not None and not target.path.exists():
            return None
        return cls(location, codecs=codecs, read_only=True)

    # -- life cycle ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

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
    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator["Connection"]:
        from sqlalchemy.exc import DBAPIError, IntegrityError

        if self._engine is None:
            raise RuntimeError(f"{self!r} is closed")
        try:
            with self._engine.connect() as connection:
                if write:
                    connection.execution_options(**{WRITE_OPTION: True})
                with connection.begin():
                    yield connection
        except DBAPIError as exc:
            if write and (is_locked(exc) or isinstance(exc, IntegrityError)):
                raise  # put() retries these (a lock, or another writer's insert of the key)
            raise DatabaseUnavailable(f"cannot use the schedule database {self}: "
                                      f"{exc.orig or exc}") from exc

    def _inspect(self, connection: "Connection") -> tuple[set[str], str | None, bool]:
        """Table names, the recorded revision, and whether a version table exists."""
        from sqlalchemy import inspect, text

        from ._schema import VERSION_TABLE

        tables = set(inspect(connection).get_table_names())
        if VERSION_TABLE not in tables:
            return tables, None, False
        revisions = connection.execute(
            text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
        return tables, (revisions[0] if len(revisions) == 1 else None), True

    def _foreign(self, what: str) -> DatabaseUnavailable:
        return DatabaseUnavailable(
            f"{self} is not a tiledattention schedule database ({what}); point TILEDATTN_DB "
            "elsewhere or move the file away")

    def _check_schema(self) -> None:
        from ._schema import TABLE_NAME

        with self._transaction(write=False) as connection:
            tables, revision, _ = self._inspect(connection)
        if TABLE_NAME not in tables:
            raise self._foreign(f"no {TABLE_NAME!r} table")
        if revision is None:
            raise self._foreign("no schema version record")

    def _prepare_for_writing(self) -> None:
        """Create the schema, or migrate an older one, in one write transaction (so concurrent
        openers of a new file create it once)."""
        from . import _migrate
        from ._schema import HEAD_REVISION, TABLE_NAME

        for attempt in range(_WRITE_ATTEMPTS):
            try:
                with self._transaction(write=True) as connection:
                    tables, revision, has_version = self._inspect(connection)
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
                        if revision in _migrate.known_revisions():
                            _migrate.upgrade(connection, "head")
                        else:
                            self._too_new = revision
                return
            except Exception as exc:
                if not (is_locked(exc) or self._lost_create_race(exc)) \
                        or attempt == _WRITE_ATTEMPTS - 1:
                    raise
                time.sleep(0.05 * 2 ** attempt)

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
        if self._too_new is not None:
            from ._schema import HEAD_REVISION

            raise SchemaTooNew(
                f"{self} has schema revision {self._too_new!r}, which this tiledattention does "
                f"not know (it knows up to {HEAD_REVISION!r}): a newer tiledattention wrote it. "
                "Upgrade tiledattention to write to it; reading still works")

    def _present_columns(self, connection: "Connection") -> frozenset[str]:
        if self._columns is None:
            from sqlalchemy import inspect

            from ._schema import TABLE_NAME

            self._columns = frozenset(c["name"] for c in
                                      inspect(connection).get_columns(TABLE_NAME))
        return self._columns

    # -- writing --------------------------------------------------------------------------------
    def _codec(self, family: str) -> FamilyCodec:
        codec = self._codecs.get(family)
        if codec is None:
            raise RecordError(f"no codec for kernel family {family!r} was given to {self!r}; "
                              f"known: {sorted(self._codecs)}")
        return codec

    def put(self, row: ScheduleRow, *, force: bool = False) -> str:
        """Store ``row`` unless a faster row of the same toolchain holds its key.

        Returns ``"added"`` (new key), ``"improved"`` (faster than the stored row),
        ``"replaced"`` (the stored row came from another kernel template, cuda-tile or tileiras,
        so its timing is not comparable), ``"forced"`` (``force=True``) or ``"kept"`` (the stored
        row is as fast or faster; nothing written).
        """
        from sqlalchemy import insert, select, update
        from sqlalchemy.exc import IntegrityError

        from ._schema import schedules as t

        if not isinstance(row, ScheduleRow):
            raise TypeError(f"put() takes a ScheduleRow; got {type(row).__name__}")
        self._check_writable()
        values = _row_values(row, self._codec(row.family))
        where = _key_clause(t, row.key)
        last: Exception | None = None
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                with self._transaction(write=True) as connection:
                    found = connection.execute(
                        select(t.c.id, t.c.median_ms, t.c.template_hash, t.c.cuda_tile,
                               t.c.tileiras).where(where).with_for_update()).first()
                    if found is None:
                        connection.execute(insert(t).values(**values))
                        return "added"
                    if force:
                        outcome = "forced"
                    elif tuple(found[2:]) != row.provenance.toolchain():
                        outcome = "replaced"
                    elif row.median_ms < found.median_ms:
                        outcome = "improved"
                    else:
                        return "kept"
                    connection.execute(update(t).where(t.c.id == found.id).values(**values))
                    return outcome
            except IntegrityError as exc:  # another writer inserted this key first: look again
                last = exc
            except Exception as exc:
                if not is_locked(exc):
                    raise
                last = exc
            time.sleep(0.02 * 2 ** attempt)
        raise DatabaseUnavailable(f"cannot write to {self} after {_WRITE_ATTEMPTS} attempts: "
                                  f"{last}")

    def delete(self, family: str, arch: str, device_name: str, problem: Any) -> bool:
        """Remove the row of this key; ``True`` when there was one."""
        from sqlalchemy import delete

        from ._schema import schedules as t

        self._check_writable()
        with self._transaction(write=True) as connection:
            result = connection.execute(delete(t).where(_key_clause(
                t, _key(family, arch, device_name, problem))))
            return result.rowcount > 0

    # -- reading --------------------------------------------------------------------------------
    def get(self, family: str, arch: str, device_name: str, problem: Any) -> ScheduleRow | None:
        """The row of this exact key, or ``None`` (also when it no longer decodes: one warning)."""
        found = self._select(_key(family, arch, device_name, problem), {})
        return found[0] if found else None

    def rows(self, *, family: str | None = None, arch: str | None = None,
             device_name: str | None = None, like: Any = None) -> list[ScheduleRow]:
        """The rows matching every filter that is not ``None``, in key order. ``like``: only
        rows whose problem has the lookup fields (``FamilyCodec.bucket_fields``) of this
        problem (needs ``family``; an indexed query). A row that no longer decodes (e.g. its
        schedule stopped validating) is skipped with one warning."""
        filters: dict[str, Any] = {"family": family, "arch": arch, "device_name": device_name}
        if like is not None:
            if family is None:
                raise TypeError("rows(like=...) needs family=")
            filters["bucket"] = self._codec(family).bucket_text(like)
        return self._select(None, {k: v for k, v in filters.items() if v is not None})

    def __len__(self) -> int:
        from sqlalchemy import func, select

        from ._schema import schedules as t

        with self._transaction(write=False) as connection:
            return connection.execute(select(func.count()).select_from(t)).scalar_one()

    def _select(self, key: tuple[str, str, str, str] | None,
                filters: dict[str, Any]) -> list[ScheduleRow]:
        from sqlalchemy import select

        from ._schema import KEY_COLUMNS, OPTIONAL_COLUMNS, schedules as t

        if not self._codecs:
            return []
        with self._transaction(write=False) as connection:
            present = self._present_columns(connection)
            if "problem" not in present and set(LEGACY_PROBLEM) <= present:
                records = connection.execute(select(*[c for c in legacy_columns(present)])
                                             ).mappings().all()
                return self._decoded(from_legacy(records, self._codecs, key, filters))
            lacking = [c.name for c in t.c if c.name not in present
                       and c.name not in OPTIONAL_COLUMNS]
            if lacking:
                raise DatabaseUnavailable(
                    f"{self} lacks the column(s) {lacking}: its schema revision is not one this "
                    "tiledattention can read; upgrade tiledattention")
            query = select(*[c for c in t.c if c.name in present])
            if key is not None:
                query = query.where(_key_clause(t, key))
            for name, value in filters.items():
                query = query.where(t.c[name] == value)
            query = query.where(t.c.family.in_(sorted(self._codecs)))
            query = query.order_by(*[t.c[name] for name in KEY_COLUMNS])
            records = connection.execute(query).mappings().all()
        return self._decoded(records)

    def _decoded(self, records: Iterable[Any]) -> list[ScheduleRow]:
        rows = []
        for record in records:
            try:
                rows.append(_decode(record, self._codecs[record["family"]]))
            except (ValueError, TypeError, KeyError) as exc:
                warnings.warn(
                    f"tiledattention: skipping the stored {record.get('family')} schedule for "
                    f"{record.get('problem')} on {record.get('arch')} in {self}: {exc}",
                    RuntimeWarning, stacklevel=3)
        return rows


def _key(family: str, arch: str, device_name: str, problem: Any) -> tuple[str, str, str, str]:
    to_dict = getattr(problem, "to_dict", None)
    if not callable(to_dict):
        raise TypeError(f"problem must be a problem value with to_dict(); got "
                        f"{type(problem).__name__}")
    return (family, arch, device_name, canonical_json(to_dict()))


def _key_clause(t: Any, key: tuple[str, str, str, str]) -> Any:
    from sqlalchemy import and_

    family, arch, device_name, problem = key
    return and_(t.c.family == family, t.c.arch == arch, t.c.device_name == device_name,
                t.c.problem == problem)


def _row_values(row: ScheduleRow, codec: FamilyCodec) -> dict[str, Any]:
    values = {name: getattr(row, name) for name in (
        "family", "arch", "device_name", "median_ms", "spread_ms", "tflops", "default_ms",
        "torch_cudnn_ms", "torch_flash_ms", "trials", "created_at")}
    values.update(problem=codec.problem_text(row.problem), bucket=codec.bucket_text(row.problem),
                  schedule=canonical_json(row.schedule.to_dict()), **row.provenance.to_dict())
    return values


def _decode(record: Any, codec: FamilyCodec) -> ScheduleRow:
    created_at = record["created_at"]
    if created_at.tzinfo is None:  # SQLite stores the UTC wall time without an offset
        created_at = created_at.replace(tzinfo=timezone.utc)
    return ScheduleRow(
        family=record["family"], arch=record["arch"], device_name=record["device_name"],
        problem=codec.problem(record["problem"]), schedule=codec.schedule(record["schedule"]),
        median_ms=record["median_ms"], spread_ms=record["spread_ms"], tflops=record["tflops"],
        default_ms=record.get("default_ms"), torch_cudnn_ms=record.get("torch_cudnn_ms"),
        torch_flash_ms=record.get("torch_flash_ms"), trials=record["trials"],
        created_at=created_at,
        provenance=Provenance.from_dict({name: record[name] for name in PROVENANCE_FIELDS}),
    )
