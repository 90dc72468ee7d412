"""The database's identity: a table ``tiledattention_database`` holding one random UUID, made
with the schema (or when an older schema is migrated), so that what belongs to one database (a
search's Optuna study, ``tuner.search``) can tell it from another file at the same path (the
first deleted and made again) or from another database beside it.

Revision ID: 0005
Revises: 0004
Frozen: never edit a released revision; add a new one.

The table holds exactly one row; ``db._identity`` reads it (and writes one again into a table
found empty). The downgrade drops the table: a database migrated up again gets a new identity,
as a new database would.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TABLE = "tiledattention_database"


def upgrade() -> None:
    table = op.create_table(_TABLE, sa.Column("identity", sa.String(36), primary_key=True))
    op.bulk_insert(table, [{"identity": str(uuid.uuid4())}])


def downgrade() -> None:
    op.drop_table(_TABLE)
