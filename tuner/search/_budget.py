"""What workers of one study share beyond Optuna: an exact budget and who measures what.

Optuna's own trial counting races when several processes ask at once (each sees n-1 finished
trials and starts one more), and two workers may be handed the same point. Workers instead
claim a ticket with one atomic ``UPDATE ... WHERE claimed < budget`` (recorded, in the same
transaction, under the trial's number), and a candidate by inserting its schedule key (a primary
key: exactly one insert succeeds), in small tables of the study's storage database. Because both
records name the trial, a dead worker's trial gives them back by its number alone. Across any
number of processes and hosts exactly ``budget`` candidates are measured, each once.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

__all__ = ["Budget"]

_META = sa.MetaData()
_TABLE = sa.Table(
    "tiledtune_budget", _META,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("claimed", sa.Integer, nullable=False),
)
_TICKETS = sa.Table(
    "tiledtune_tickets", _META,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("trial_number", sa.Integer, primary_key=True),
)
_CLAIMS = sa.Table(
    "tiledtune_claims", _META,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("schedule_key", sa.String(64), primary_key=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
)


class Budget:
    def __init__(self, url: str, study_name: str) -> None:
        connect_args = {"timeout": 60} if url.startswith("sqlite") else {}
        self._engine = sa.create_engine(url, connect_args=connect_args)
        self._study = study_name
        for attempt in range(5):  # concurrent workers may race to create the table
            try:
                _META.create_all(self._engine, checkfirst=True)
                break
            except sa.exc.DBAPIError:
                time.sleep(0.2 * (attempt + 1))
        with self._engine.begin() as conn:
            exists = conn.execute(sa.select(_TABLE.c.claimed).where(
                _TABLE.c.study_name == study_name)).first()
            if exists is None:
                try:
                    conn.execute(_TABLE.insert().values(study_name=study_name, claimed=0))
                except sa.exc.IntegrityError:  # another worker inserted it first
                    pass

    def claim(self, budget: int, trial_number: int) -> bool:
        """Take one ticket for trial ``trial_number`` if fewer than ``budget`` were taken."""
        with self._engine.begin() as conn:
            done = conn.execute(
                _TABLE.update()
                .where(_TABLE.c.study_name == self._study, _TABLE.c.claimed < budget)
                .values(claimed=_TABLE.c.claimed + 1))
            if done.rowcount != 1:
                return False
            conn.execute(_TICKETS.insert().values(study_name=self._study,
                                                  trial_number=trial_number))
            return True

    def claim_schedule(self, key: str, trial_number: int) -> bool:
        """``True`` for the one trial that gets to measure schedule ``key``."""
        try:
            with self._engine.begin() as conn:
                conn.execute(_CLAIMS.insert().values(study_name=self._study, schedule_key=key,
                                                     trial_number=trial_number))
            return True
        except sa.exc.IntegrityError:
            return False

    def release(self, trial_number: int) -> None:
        """Give back what trial ``trial_number`` holds (its measurement was cancelled or its
        worker died): its ticket and its schedule claim. Idempotent."""
        with self._engine.begin() as conn:
            gone = conn.execute(_TICKETS.delete().where(
                _TICKETS.c.study_name == self._study, _TICKETS.c.trial_number == trial_number))
            if gone.rowcount:
                conn.execute(_TABLE.update().where(_TABLE.c.study_name == self._study)
                             .values(claimed=_TABLE.c.claimed - 1))
            conn.execute(_CLAIMS.delete().where(_CLAIMS.c.study_name == self._study,
                                                _CLAIMS.c.trial_number == trial_number))

    def close(self) -> None:
        self._engine.dispose()
