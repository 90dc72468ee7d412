"""A stored row's ``trials`` is the number of candidates measured for its key: ``--trials 20``
stores 20, not the 21 Optuna trials the study holds once the trial asked after the budget was
spent is counted (nor repeats, infeasible schedules or cancelled trials)."""

from __future__ import annotations

import pytest

import db as dbmod
from tiledattention import FORWARD, Problem
from tiledattention.tooling import codecs
from tuner.measure import IsolatedExecutor, SimulatedExecutor
from tuner.search import SearchConfig, Tuner, study_name

PROBLEM = Problem(batch=4, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, head_dim=128,
                  dtype="bf16", causal=True)


@pytest.mark.slow  # spawns a worker process
def test_stored_trials_is_the_measured_count(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path}/studies.sqlite"
    with dbmod.ScheduleDB(tmp_path / "s.sqlite", codecs=codecs()) as store, \
            IsolatedExecutor(SimulatedExecutor) as executor:
        tuner = Tuner(executor, family=FORWARD, arch="sm_90", device_name="Simulated GPU",
                      storage_url=storage, db=store,
                      config=SearchConfig(n_trials=20, patience=None, lookahead=1))
        result = tuner.tune(PROBLEM)
        row = store.get("forward", "sm_90", "Simulated GPU", PROBLEM)
    study = optuna.load_study(study_name=study_name("tiledtune", FORWARD, "sm_90", PROBLEM),
                              storage=storage)
    assert len(study.trials) > 20  # the study holds more trials than were measured ...
    assert result.measured == 20
    assert row.trials == 20  # ... the row counts the measured ones
