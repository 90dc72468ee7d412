"""Add torch_flash_ms: PyTorch's flash-attention backend timing (nullable).

Revision ID: 0002
Revises: 0001
Frozen: never edit a released revision; add a new one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("schedules", sa.Column("torch_flash_ms", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("torch_flash_ms")
