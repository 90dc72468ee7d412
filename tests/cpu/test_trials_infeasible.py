"""A stored row's ``trials`` is exactly the measured count on a space with statically infeasible
candidates: a trial the driver finishes at once as "infeasible" (its status is one of the
measurement statuses, but it held no budget ticket) counts neither against the budget nor in
the row. (``test_trials_count.py`` checks the count on a space without infeasible points.)

Decode at head dim 256 on sm_90: a third of the full space needs more shared memory than the
GPU has, so the sampler asks some of them."""

from __future__ import annotations

import functools

import pytest

import db as dbmod
from tiledattention import DECODE, Problem
from tiledattention.tooling import codecs
from tuner.measure import IsolatedExecutor, SimulatedExecutor
from tuner.search import SearchConfig, Tuner, study_name
from tuner.search._trials import measured_trials

PROBLEM = Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=1, seqlen_k=4096, head_dim=256,
                  dtype="bf16", causal=False)
N_TRIALS = 16


@pytest.mark.slow  # spawns a worker process
def test_stored_trials_is_the_measured_count_with_infeasible_candidates(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path}/studies.sqlite"
    with dbmod.ScheduleDB(tmp_path / "s.sqlite", codecs=codecs()) as store, \
            IsolatedExecutor(functools.partial(SimulatedExecutor, family=DECODE)) as executor:
        tuner = Tuner(executor, family=DECODE, arch="sm_90", device_name="Simulated GPU",
                      storage_url=storage, db=store,
                      config=SearchConfig(n_trials=N_TRIALS, patience=None, lookahead=1))
        result = tuner.tune(PROBLEM)
        row = store.get("decode", "sm_90", "Simulated GPU", PROBLEM)
    study = optuna.load_study(study_name=study_name("tiledtune", DECODE, "sm_90", PROBLEM),
                              storage=storage)
    statuses = [t.user_attrs.get("status") for t in study.trials]
    infeasible = statuses.count("infeasible")
    assert infeasible >= 1, f"no infeasible candidate was asked: {statuses}"  # the case at hand
    assert result.measured == N_TRIALS
    assert measured_trials(study) == N_TRIALS
    assert row is not None and row.trials == N_TRIALS
    assert statuses.count("ok") == N_TRIALS  # every measured one, and only those, timed
