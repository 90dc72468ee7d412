"""The read queries of ``ScheduleDB`` as SQL text with named parameters (``:name``): one definition
for both ways a database is read.

- :class:`SqliteReader`: the standard library's ``sqlite3``, for a SQLite file opened read-only
  (the runtime's lookup, ``list``, ``explain``, ``export``), which then never imports SQLAlchemy:
  importing it takes longer than such a command's whole work;
- :class:`AlchemyReader`: SQLAlchemy's ``text()`` on a connection of the engine, for server
  databases and SQLite files opened for writing.

The text is plain SQL that SQLite, PostgreSQL and MySQL read alike (``=``, ``IN``, ``abs``,
``ORDER BY``, ``LIMIT ... OFFSET ...``). Column and table names come from ``_schema`` only, never
from input; every value is a bound parameter.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Iterable, Mapping, Sequence

from ._schema import KEY_COLUMNS, TABLE_NAME, TERM_COLUMNS

__all__ = ["Query", "select_rows", "count_rows", "nearest_ids", "rows_by_id", "SqliteReader",
           "AlchemyReader"]


class Query:
    """SQL text and its parameters, built clause by clause; :meth:`bind` names each value."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}

    def bind(self, value: Any) -> str:
        name = f"p{len(self.params)}"
        self.params[name] = value
        return f":{name}"

    def where(self, filters: Mapping[str, Any], families: Iterable[str],
              extra: Sequence[str] = ()) -> str:
        """``WHERE`` every filter column equals its value, the family is one of ``families``
        (the families with a codec: no family at all matches nothing) and each ``extra`` clause
        holds."""
        clauses = [f"{name} = {self.bind(value)}" for name, value in filters.items()]
        names = sorted(families)
        clauses.append(f"family IN ({', '.join(self.bind(n) for n in names)})" if names
                       else "1 = 0")
        return " WHERE " + " AND ".join([*clauses, *extra])


def _columns(columns: Iterable[str]) -> str:
    return ", ".join(columns)


def select_rows(columns: Iterable[str], filters: Mapping[str, Any], families: Iterable[str], *,
                limit: int | None = None, offset: int = 0) -> tuple[str, dict[str, Any]]:
    """The ``columns`` of the rows matching ``filters``, in key order, one page (``limit`` rows
    after ``offset``; without a limit the caller skips ``offset`` records itself: SQLite and
    MySQL take no ``OFFSET`` without a ``LIMIT``)."""
    q = Query()
    sql = (f"SELECT {_columns(columns)} FROM {TABLE_NAME}{q.where(filters, families)} "
           f"ORDER BY {_columns(KEY_COLUMNS)}")
    if limit is not None:
        sql += f" LIMIT {q.bind(int(limit))} OFFSET {q.bind(int(offset))}"
    return sql, q.params


def count_rows(filters: Mapping[str, Any], families: Iterable[str],
               extra: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """How many rows match ``filters``; ``extra``: column -> a value it must differ from."""
    q = Query()
    unlike = [f"{name} <> {q.bind(value)}" for name, value in (extra or {}).items()]
    return f"SELECT count(*) FROM {TABLE_NAME}{q.where(filters, families, unlike)}", q.params


def nearest_ids(filters: Mapping[str, Any], families: Iterable[str], weights: Sequence[float],
                terms: Sequence[float], limit: int) -> tuple[str, dict[str, Any]]:
    """The ids of the ``limit`` rows matching ``filters`` nearest ``terms`` by the weighted sum
    of ``abs(term_i - value_i)``, ties by ``median_ms`` (the covering lookup index answers it)."""
    q = Query()
    where = q.where(filters, families)
    distance = " + ".join(f"{q.bind(float(w))} * abs({column} - {q.bind(float(v))})"
                          for column, w, v in zip(TERM_COLUMNS, weights, terms)) or "0"
    return (f"SELECT id FROM {TABLE_NAME}{where} ORDER BY {distance}, median_ms "
            f"LIMIT {q.bind(int(limit))}", q.params)


def rows_by_id(columns: Iterable[str], ids: Sequence[int]) -> tuple[str, dict[str, Any]]:
    q = Query()
    return (f"SELECT {_columns(columns)} FROM {TABLE_NAME} WHERE id IN "
            f"({', '.join(q.bind(i) for i in ids)})", q.params)


class SqliteReader:
    """Reads through one ``sqlite3`` connection (inside the caller's transaction)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def all(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        cursor = self._connection.execute(sql, params or {})
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, record)) for record in cursor.fetchall()]

    def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._connection.execute(sql, params or {}).fetchone()[0]

    def column(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        return [r[0] for r in self._connection.execute(sql, params or {}).fetchall()]

    def tables(self) -> set[str]:
        return set(self.column("SELECT name FROM sqlite_master WHERE type = 'table'"))

    def columns(self, table: str) -> list[str]:
        return [r[1] for r in self._connection.execute(f"PRAGMA table_info({table})")]


class AlchemyReader:
    """Reads through a SQLAlchemy connection (inside the caller's transaction)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def all(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        from sqlalchemy import text

        return [dict(r) for r in
                self._connection.execute(text(sql), params or {}).mappings().all()]

    def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        from sqlalchemy import text

        return self._connection.execute(text(sql), params or {}).scalar_one()

    def column(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        from sqlalchemy import text

        return list(self._connection.execute(text(sql), params or {}).scalars().all())

    def tables(self) -> set[str]:
        from sqlalchemy import inspect

        return set(inspect(self._connection).get_table_names())

    def columns(self, table: str) -> list[str]:
        from sqlalchemy import inspect

        return [c["name"] for c in inspect(self._connection).get_columns(table)]
