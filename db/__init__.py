"""The schedule database: tuned winners per key, in SQLite/SQLAlchemy and in JSON tables.

``ScheduleDB`` stores one best ``ScheduleRow`` per ``(family, arch, device_name, problem)`` key;
the tuner writes it and the runtime's lookup reads it. ``db`` is persistence only: it imports
nothing from ``tiledattention``, ``search_spaces`` or ``tuner``; the caller describes each kernel
family's records with a ``FamilyCodec``. SQLAlchemy and Alembic are imported only when a
database is actually opened.
"""

from __future__ import annotations

from ._encode import Candidates
from ._identity import IDENTITY_TABLE, database_identity
from ._errors import (DatabaseArgumentError, DatabaseError, DatabaseLocked, DatabaseMisuse,
                      DatabaseUnavailable,
                      OutputRefused, RecordError, SchemaTooNew, TiledAttentionError)
from ._rows import (
    ARCH_PATTERN,
    BACKENDS,
    BASELINE_PATTERN,
    LEGACY_BASELINES,
    LEGACY_FAMILY,
    MAX_BASELINES,
    PROVENANCE_FIELDS,
    ROW_FIELDS,
    ROW_FORMAT,
    Baselines,
    FamilyCodec,
    Provenance,
    RowDecoder,
    RowField,
    ScheduleRow,
    canonical_json,
    check_text,
)
from ._store import PUT_OUTCOMES, ScheduleDB
from ._table import RowTable, dump_rows, load_rows_file, load_rows_text, replaceable_target, \
    rows_json_chunks, write_bytes_atomic, write_chunks_atomic, write_text_atomic

__all__ = [
    "ARCH_PATTERN", "BACKENDS", "BASELINE_PATTERN", "Baselines", "Candidates",
    "DatabaseArgumentError", "DatabaseError", "DatabaseLocked", "DatabaseMisuse",
    "DatabaseUnavailable",
    "FamilyCodec", "IDENTITY_TABLE", "LEGACY_BASELINES", "LEGACY_FAMILY", "MAX_BASELINES",
    "OutputRefused", "PROVENANCE_FIELDS", "PUT_OUTCOMES", "Provenance", "ROW_FIELDS", "ROW_FORMAT", "RecordError",
    "RowDecoder", "RowField", "RowTable", "ScheduleDB", "ScheduleRow", "SchemaTooNew",
    "TiledAttentionError",
    "canonical_json", "check_text", "database_identity", "dump_rows", "load_rows_file",
    "load_rows_text", "replaceable_target", "rows_json_chunks", "write_bytes_atomic",
    "write_chunks_atomic", "write_text_atomic",
]
