"""Initial schedules table (no torch_flash_ms column).

Revision ID: 0001
Revises:
Frozen: never edit a released revision; add a new one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("arch", sa.String(16), nullable=False),
        sa.Column("device_name", sa.String(128), nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("causal", sa.Boolean, nullable=False),
        sa.Column("batch", sa.Integer, nullable=False),
        sa.Column("heads_q", sa.Integer, nullable=False),
        sa.Column("heads_kv", sa.Integer, nullable=False),
        sa.Column("seqlen_q", sa.Integer, nullable=False),
        sa.Column("seqlen_k", sa.Integer, nullable=False),
        sa.Column("head_dim", sa.Integer, nullable=False),
        sa.Column("schedule", sa.Text, nullable=False),
        sa.Column("median_ms", sa.Float, nullable=False),
        sa.Column("spread_ms", sa.Float, nullable=False),
        sa.Column("tflops", sa.Float, nullable=False),
        sa.Column("default_ms", sa.Float, nullable=True),
        sa.Column("torch_cudnn_ms", sa.Float, nullable=True),
        sa.Column("trials", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("template_hash", sa.String(64), nullable=False),
        sa.Column("cuda_tile", sa.String(64), nullable=False),
        sa.Column("tileiras", sa.String(64), nullable=False),
        sa.Column("torch", sa.String(64), nullable=False),
        sa.Column("driver", sa.String(64), nullable=False),
        sa.UniqueConstraint("arch", "device_name", "dtype", "causal", "batch", "heads_q",
                            "heads_kv", "seqlen_q", "seqlen_k", "head_dim",
                            name="uq_schedules_key"),
    )


def downgrade() -> None:
    op.drop_table("schedules")
