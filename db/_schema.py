"""The ``schedules`` table (SQLAlchemy Core) at the newest schema revision.

The migrations in ``db/migrations/versions/`` are the history of this table; this module is only
its current shape, used for queries. Change both together: add a revision, then the column here,
then bump ``HEAD_REVISION``.
"""

from __future__ import annotations

from sqlalchemy import (Boolean, Column, DateTime, Float, Integer, MetaData, String, Table, Text,
                        UniqueConstraint)

__all__ = ["TABLE_NAME", "VERSION_TABLE", "HEAD_REVISION", "KEY_COLUMNS", "OPTIONAL_COLUMNS",
           "metadata", "schedules"]

TABLE_NAME = "schedules"
#: Alembic's version table, named for us so it cannot clash with an application's own Alembic
#: history in a shared (e.g. PostgreSQL) database.
VERSION_TABLE = "tiledattention_schema_version"
#: The newest revision in ``db/migrations/versions`` (a test checks they agree).
HEAD_REVISION = "0002"

KEY_COLUMNS = ("arch", "device_name", "dtype", "causal", "batch", "heads_q", "heads_kv",
               "seqlen_q", "seqlen_k", "head_dim")
#: Nullable columns a database of another revision may lack; reading gives ``None`` for them.
OPTIONAL_COLUMNS = ("default_ms", "torch_cudnn_ms", "torch_flash_ms")

metadata = MetaData()

schedules = Table(
    TABLE_NAME,
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("arch", String(16), nullable=False),
    Column("device_name", String(128), nullable=False),
    Column("dtype", String(8), nullable=False),
    Column("causal", Boolean, nullable=False),
    Column("batch", Integer, nullable=False),
    Column("heads_q", Integer, nullable=False),
    Column("heads_kv", Integer, nullable=False),
    Column("seqlen_q", Integer, nullable=False),
    Column("seqlen_k", Integer, nullable=False),
    Column("head_dim", Integer, nullable=False),
    Column("schedule", Text, nullable=False),  # Schedule.to_json()
    Column("median_ms", Float, nullable=False),
    Column("spread_ms", Float, nullable=False),
    Column("tflops", Float, nullable=False),
    Column("default_ms", Float, nullable=True),
    Column("torch_cudnn_ms", Float, nullable=True),
    Column("torch_flash_ms", Float, nullable=True),  # revision 0002
    Column("trials", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("template_hash", String(64), nullable=False),
    Column("cuda_tile", String(64), nullable=False),
    Column("tileiras", String(64), nullable=False),
    Column("torch", String(64), nullable=False),
    Column("driver", String(64), nullable=False),
    UniqueConstraint(*KEY_COLUMNS, name="uq_schedules_key"),
)
