"""Baselines as data: one ``baselines_ms`` column (JSON text: baseline name -> median ms) in
place of the fixed ``torch_cudnn_ms`` and ``torch_flash_ms`` columns.

Revision ID: 0004
Revises: 0003
Frozen: never edit a released revision; add a new one.

A row's ``torch_cudnn_ms`` becomes ``baselines_ms["torch-cudnn"]`` and its ``torch_flash_ms``
``baselines_ms["torch-flash"]`` (the names the families' cases give those baselines); a NULL is
left out, so a row without either holds ``{}``. The text is canonical JSON (sorted keys, no
spaces). The downgrade puts ``torch-cudnn`` and ``torch-flash`` back in their columns; any other
baseline a row holds has no column in revision 0003 and is dropped.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: The columns of revision 0003 and the baseline each timed.
_COLUMNS = (("torch_cudnn_ms", "torch-cudnn"), ("torch_flash_ms", "torch-flash"))


def _table() -> sa.TableClause:
    return sa.table("schedules", sa.column("id", sa.Integer),
                    *[sa.column(name, sa.Float) for name, _ in _COLUMNS],
                    sa.column("baselines_ms", sa.Text))


def _text(value: dict) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("baselines_ms", sa.Text, nullable=True))
    bind = op.get_bind()
    table = _table()
    records = bind.execute(sa.select(table.c.id, *[table.c[name] for name, _ in _COLUMNS]))
    values = [{"row_id": record["id"],
               "text": _text({baseline: record[name] for name, baseline in _COLUMNS
                              if record[name] is not None})}
              for record in records.mappings()]
    if values:
        bind.execute(sa.update(table).where(table.c.id == sa.bindparam("row_id")).values(
            baselines_ms=sa.bindparam("text")), values)
    with op.batch_alter_table("schedules") as batch:
        for name, _ in _COLUMNS:
            batch.drop_column(name)


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        for name, _ in _COLUMNS:
            batch.add_column(sa.Column(name, sa.Float, nullable=True))
    bind = op.get_bind()
    table = _table()
    values = []
    for record in bind.execute(sa.select(table.c.id, table.c.baselines_ms)).mappings():
        baselines = json.loads(record["baselines_ms"] or "{}")
        values.append({"row_id": record["id"],
                       **{f"old_{name}": baselines.get(baseline) for name, baseline in _COLUMNS}})
    if values:
        bind.execute(sa.update(table).where(table.c.id == sa.bindparam("row_id")).values(
            **{name: sa.bindparam(f"old_{name}") for name, _ in _COLUMNS}), values)
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("baselines_ms")
