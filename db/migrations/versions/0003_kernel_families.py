"""Kernel families: rows carry their family and the backend that measured them; the problem is
stored as one JSON column with its lookup bucket and distance terms.

Revision ID: 0003
Revises: 0002
Frozen: never edit a released revision; add a new one.

Every row before this revision was the prefill forward kernel's, measured on a GPU: it becomes a
``forward`` row with backend ``gpu``, whose ``problem`` is the canonical JSON of its eight problem
columns (sorted keys, no spaces), whose ``bucket`` (what the lookup filters on) is that of
``causal``, ``dtype``, ``head_dim`` and the reduced ratio ``heads_q/heads_kv``, and whose terms are
log2 S_q, log2 S_k and log2 (B·H_q) (the forward family's distance terms). The per-field problem
columns are dropped; the key becomes ``(family, arch, problem, device_name)``, and an index on
``(family, arch, bucket, template_hash, backend, term0..3, median_ms)`` covers the lookup.
"""

from __future__ import annotations

import json
import math

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_PROBLEM = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal")
_TERMS = ("term0", "term1", "term2", "term3")


def _text(value: dict) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _bucket(problem: dict) -> str:
    common = math.gcd(problem["heads_q"], problem["heads_kv"])
    return _text({"causal": problem["causal"], "dtype": problem["dtype"],
                  "head_dim": problem["head_dim"],
                  "heads_q/heads_kv": f"{problem['heads_q'] // common}/"
                                      f"{problem['heads_kv'] // common}"})


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("family", sa.String(32), nullable=True))
        batch.add_column(sa.Column("backend", sa.String(16), nullable=True))
        batch.add_column(sa.Column("problem", sa.Text, nullable=True))
        batch.add_column(sa.Column("bucket", sa.Text, nullable=True))
        for name in _TERMS:
            batch.add_column(sa.Column(name, sa.Float, nullable=True))
    bind = op.get_bind()
    table = sa.table("schedules", sa.column("id", sa.Integer),
                     *[sa.column(name) for name in _PROBLEM],
                     sa.column("family", sa.String), sa.column("backend", sa.String),
                     sa.column("problem", sa.Text), sa.column("bucket", sa.Text),
                     *[sa.column(name, sa.Float) for name in _TERMS])
    records = bind.execute(sa.select(table.c.id, *[table.c[n] for n in _PROBLEM])).mappings()
    for record in list(records):
        problem = {name: record[name] for name in _PROBLEM}
        problem["causal"] = bool(problem["causal"])
        bind.execute(sa.update(table).where(table.c.id == record["id"]).values(
            family="forward", backend="gpu", problem=_text(problem), bucket=_bucket(problem),
            term0=math.log2(problem["seqlen_q"]), term1=math.log2(problem["seqlen_k"]),
            term2=math.log2(problem["batch"] * problem["heads_q"])))
    with op.batch_alter_table("schedules", recreate="always") as batch:
        batch.drop_constraint("uq_schedules_key", type_="unique")
        for name in _PROBLEM:
            batch.drop_column(name)
        for name in ("family", "backend", "problem", "bucket"):
            batch.alter_column(name, nullable=False)
        batch.create_unique_constraint("uq_schedules_key",
                                       ["family", "arch", "problem", "device_name"])
    op.create_index("ix_schedules_lookup", "schedules",
                    ["family", "arch", "bucket", "template_hash", "backend", *_TERMS,
                     "median_ms"])


def downgrade() -> None:
    raise NotImplementedError("revision 0003 cannot be undone: rows of other kernel families "
                              "have no place in the 0002 table")
