"""The schedule database: tuned winners per key, in SQLite/SQLAlchemy and in JSON tables.

``ScheduleDB`` stores one best ``ScheduleRow`` per ``(arch, device_name, problem)`` key and is
what the tuner writes and the runtime's lookup reads (``ScheduleDB.open_for_lookup``);
``shipped_table`` reads the pre-tuned table packaged with tiledattention. SQLAlchemy and Alembic
are imported only when a database is actually opened.
"""

from __future__ import annotations

from ._errors import DatabaseUnavailable, SchemaTooNew
from ._rows import ROW_FORMAT, ScheduleRow
from ._store import PUT_OUTCOMES, ScheduleDB
from ._table import (
    RowTable,
    dump_rows,
    load_rows_file,
    shipped_table,
    write_bytes_atomic,
    write_text_atomic,
)

__all__ = [
    "DatabaseUnavailable", "PUT_OUTCOMES", "ROW_FORMAT", "RowTable", "ScheduleDB", "ScheduleRow",
    "SchemaTooNew", "dump_rows", "load_rows_file", "shipped_table", "write_bytes_atomic",
    "write_text_atomic",
]
