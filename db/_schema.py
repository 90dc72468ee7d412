"""The ``schedules`` table (SQLAlchemy Core) at the newest schema revision, built from the row
field spec (``_rows.ROW_FIELDS``).

The migrations in ``db/migrations/versions/`` are the history of this table; this module is only
its current shape, used for queries. Change both together: add a revision, then the field, then
bump ``HEAD_REVISION`` (a test checks that a migrated file has exactly these columns).

The names (``COLUMNS``, ``KEY_COLUMNS``, ...) need no SQLAlchemy: the read queries
(``_sql``) are written with them, and a read-only SQLite file is read through the standard
library alone. ``schedules`` and ``metadata`` (SQLAlchemy objects) are made on first use.
"""

from __future__ import annotations

import functools
from typing import Any

from ._rows import LEGACY_BASELINES, MAX_TERMS, PROVENANCE_FIELDS, ROW_FIELDS

__all__ = ["TABLE_NAME", "VERSION_TABLE", "HEAD_REVISION", "COLUMNS", "KEY_COLUMNS",
           "OPTIONAL_COLUMNS", "LEGACY_BASELINE_COLUMNS", "TERM_COLUMNS", "LOOKUP_INDEX",
           "metadata", "schedules"]

TABLE_NAME = "schedules"
#: Alembic's version table, named for us so it cannot clash with an application's own Alembic
#: history in a shared (e.g. PostgreSQL) database.
VERSION_TABLE = "tiledattention_schema_version"
#: The newest revision in ``db/migrations/versions`` (a test checks they agree).
HEAD_REVISION = "0005"

#: One row per key; the problem is its canonical JSON (``_rows.canonical_json``). The order is
#: the unique index's: an exact lookup (family, arch, problem; any device) uses its prefix.
KEY_COLUMNS = ("family", "arch", "problem", "device_name")
#: ``term0..``: the family's distance terms of the problem (``FamilyCodec.terms``).
TERM_COLUMNS = tuple(f"term{i}" for i in range(MAX_TERMS))
#: The columns of the lookup's covering index (revision 0003 creates it with these).
LOOKUP_INDEX = ("family", "arch", "bucket", "template_hash", "backend", *TERM_COLUMNS,
                "median_ms")
#: Nullable columns a database of another revision may lack; reading gives ``None`` for them
#: (``baselines_ms``: revisions 0001-0003 hold ``LEGACY_BASELINE_COLUMNS`` instead).
OPTIONAL_COLUMNS = tuple(f.name for f in ROW_FIELDS if f.optional)
#: The baseline columns of revisions 0001-0003 (0001 has only the first), read into
#: ``baselines_ms`` from a file not migrated (revision 0004 moved them there).
LEGACY_BASELINE_COLUMNS = tuple(LEGACY_BASELINES)

_TEXT_WIDTH = {"family": 32, "arch": 16, "device_name": 128, "backend": 16}


def _layout() -> list[tuple[str, str, bool]]:
    """``(name, kind, nullable)`` of each column after ``id``, in table order; ``kind``: a
    ``RowField.kind``, or ``"hash"`` (a provenance field), ``"bucket"``, ``"term"``."""
    layout = []
    for f in ROW_FIELDS:
        if f.kind == "provenance":
            layout += [(name, "hash", False) for name in PROVENANCE_FIELDS]
            continue
        layout.append((f.name, f.kind, f.optional))
        if f.name == "problem":
            # what the lookup filters on (``FamilyCodec.bucket_text``) and orders by
            layout.append(("bucket", "bucket", False))
            layout += [(name, "term", True) for name in TERM_COLUMNS]
    return layout


#: Every column of the table, in its order.
COLUMNS = ("id", *(name for name, _, _ in _layout()))


def _columns() -> list[Any]:
    from sqlalchemy import Column, DateTime, Float, Integer, String, Text

    types = {"ms": Float, "count": Integer, "time": lambda: DateTime(timezone=True),
             "record": Text, "baselines": Text, "hash": lambda: String(64), "bucket": Text,
             "term": Float}
    columns = [Column("id", Integer, primary_key=True, autoincrement=True)]
    for name, kind, nullable in _layout():
        columns.append(Column(name, String(_TEXT_WIDTH[name]) if kind == "text" else
                              types[kind](), nullable=nullable))
    return columns


@functools.cache
def _table() -> tuple[Any, Any]:
    from sqlalchemy import Index, MetaData, Table, UniqueConstraint

    metadata = MetaData()
    schedules = Table(
        TABLE_NAME,
        metadata,
        *_columns(),
        UniqueConstraint(*KEY_COLUMNS, name="uq_schedules_key"),
        # covers the lookup's nearest and stale queries: they never read the table's rows
        Index("ix_schedules_lookup", *LOOKUP_INDEX),
    )
    return metadata, schedules


def __getattr__(name: str) -> Any:
    """``metadata`` and ``schedules`` (the SQLAlchemy ``Table``), made on first use: importing
    SQLAlchemy costs more than a read-only command's whole work."""
    if name == "metadata":
        return _table()[0]
    if name == "schedules":
        return _table()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
