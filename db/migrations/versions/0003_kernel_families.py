"""Kernel families: rows carry their family; the problem is stored as one JSON column.

Revision ID: 0003
Revises: 0002
Frozen: never edit a released revision; add a new one.

Every row before this revision was the prefill forward kernel's: it becomes a ``forward`` row whose
``problem`` is the canonical JSON of its eight problem columns (sorted keys, no spaces) and whose
``bucket`` (the fields the lookup filters on) is that of ``causal``, ``dtype`` and ``head_dim``.
The per-field problem columns are dropped; the key becomes ``(family, arch, device_name,
problem)``, and ``(family, arch, bucket)`` is indexed for the lookup.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_PROBLEM = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal")
_BUCKET = ("causal", "dtype", "head_dim")


def _text(value: dict) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("family", sa.String(32), nullable=True))
        batch.add_column(sa.Column("problem", sa.Text, nullable=True))
        batch.add_column(sa.Column("bucket", sa.Text, nullable=True))
    bind = op.get_bind()
    table = sa.table("schedules", sa.column("id", sa.Integer),
                     *[sa.column(name) for name in _PROBLEM],
                     sa.column("family", sa.String), sa.column("problem", sa.Text),
                     sa.column("bucket", sa.Text))
    records = bind.execute(sa.select(table.c.id, *[table.c[n] for n in _PROBLEM])).mappings()
    for record in list(records):
        problem = {name: record[name] for name in _PROBLEM}
        problem["causal"] = bool(problem["causal"])
        bind.execute(sa.update(table).where(table.c.id == record["id"]).values(
            family="forward", problem=_text(problem),
            bucket=_text({name: problem[name] for name in _BUCKET})))
    with op.batch_alter_table("schedules", recreate="always") as batch:
        batch.drop_constraint("uq_schedules_key", type_="unique")
        for name in _PROBLEM:
            batch.drop_column(name)
        for name in ("family", "problem", "bucket"):
            batch.alter_column(name, nullable=False)
        batch.create_unique_constraint("uq_schedules_key",
                                       ["family", "arch", "device_name", "problem"])
    op.create_index("ix_schedules_lookup", "schedules", ["family", "arch", "bucket"])


def downgrade() -> None:
    raise NotImplementedError("revision 0003 cannot be undone: rows of other kernel families "
                              "have no place in the 0002 table")
