"""An exact trial budget shared by every worker of a study.

Optuna's own trial counting races when several processes ask at once (each sees n-1 finished
trials and starts one more). Workers instead claim a ticket with one atomic ``UPDATE ... WHERE
claimed < budget`` in a small table of the study's storage database, so across any number of
processes and hosts exactly ``budget`` candidates are measured.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["Budget"]

_META = sa.MetaData()
_TABLE = sa.Table(
    "tiledtune_budget", _META,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("claimed", sa.Integer, nullable=False),
)


class Budget:
    def __init__(self, url: str, study_name: str) -> None:
        connect_args = {"timeout": 60} if url.startswith("sqlite") else {}
        self._engine = sa.create_engine(url, connect_args=connect_args)
        self._study = study_name
        _META.create_all(self._engine, checkfirst=True)
        with self._engine.begin() as conn:
            exists = conn.execute(sa.select(_TABLE.c.claimed).where(
                _TABLE.c.study_name == study_name)).first()
            if exists is None:
                try:
                    conn.execute(_TABLE.insert().values(study_name=study_name, claimed=0))
                except sa.exc.IntegrityError:  # another worker inserted it first
                    pass

    def claim(self, budget: int) -> bool:
        """Take one ticket if fewer than ``budget`` were taken."""
        with self._engine.begin() as conn:
            done = conn.execute(
                _TABLE.update()
                .where(_TABLE.c.study_name == self._study, _TABLE.c.claimed < budget)
                .values(claimed=_TABLE.c.claimed + 1))
            return done.rowcount == 1

    def release(self) -> None:
        """Give a ticket back (the candidate turned out to need no measurement)."""
        with self._engine.begin() as conn:
            conn.execute(_TABLE.update()
                         .where(_TABLE.c.study_name == self._study, _TABLE.c.claimed > 0)
                         .values(claimed=_TABLE.c.claimed - 1))

    def reset(self, claimed: int) -> None:
        """Set the count (resume: tickets of trials that never finished are returned)."""
        with self._engine.begin() as conn:
            conn.execute(_TABLE.update().where(_TABLE.c.study_name == self._study)
                         .values(claimed=claimed))

    def claimed(self) -> int:
        with self._engine.connect() as conn:
            return conn.execute(sa.select(_TABLE.c.claimed).where(
                _TABLE.c.study_name == self._study)).scalar_one()

    def close(self) -> None:
        self._engine.dispose()
