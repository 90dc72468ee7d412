"""The ``schedules`` table (SQLAlchemy Core) at the newest schema revision, built from the row
field spec (``_rows.ROW_FIELDS``).

The migrations in ``db/migrations/versions/`` are the history of this table; this module is only
its current shape, used for queries. Change both together: add a revision, then the field, then
bump ``HEAD_REVISION`` (a test checks that a migrated file has exactly these columns).
"""

from __future__ import annotations

from sqlalchemy import (Column, DateTime, Float, Index, Integer, MetaData, String, Table, Text,
                        UniqueConstraint)

from ._rows import LEGACY_BASELINES, MAX_TERMS, PROVENANCE_FIELDS, ROW_FIELDS

__all__ = ["TABLE_NAME", "VERSION_TABLE", "HEAD_REVISION", "KEY_COLUMNS", "OPTIONAL_COLUMNS",
           "LEGACY_BASELINE_COLUMNS", "TERM_COLUMNS", "LOOKUP_INDEX", "metadata", "schedules"]

TABLE_NAME = "schedules"
#: Alembic's version table, named for us so it cannot clash with an application's own Alembic
#: history in a shared (e.g. PostgreSQL) database.
VERSION_TABLE = "tiledattention_schema_version"
#: The newest revision in ``db/migrations/versions`` (a test checks they agree).
HEAD_REVISION = "0004"

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

_TYPES = {"ms": Float, "count": Integer, "time": lambda: DateTime(timezone=True), "record": Text,
          "baselines": Text}
_TEXT_WIDTH = {"family": 32, "arch": 16, "device_name": 128, "backend": 16}


def _columns() -> list[Column]:
    columns = [Column("id", Integer, primary_key=True, autoincrement=True)]
    for f in ROW_FIELDS:
        if f.kind == "provenance":
            columns += [Column(name, String(64), nullable=False) for name in PROVENANCE_FIELDS]
            continue
        kind = String(_TEXT_WIDTH[f.name]) if f.kind == "text" else _TYPES[f.kind]()
        columns.append(Column(f.name, kind, nullable=f.optional))
        if f.name == "problem":
            # what the lookup filters on (``FamilyCodec.bucket_text``) and orders by
            columns.append(Column("bucket", Text, nullable=False))
            columns += [Column(name, Float, nullable=True) for name in TERM_COLUMNS]
    return columns


metadata = MetaData()

schedules = Table(
    TABLE_NAME,
    metadata,
    *_columns(),
    UniqueConstraint(*KEY_COLUMNS, name="uq_schedules_key"),
    # covers the lookup's nearest and stale queries: they never read the table's rows
    Index("ix_schedules_lookup", *LOOKUP_INDEX),
)
