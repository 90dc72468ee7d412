"""optuna-dashboard on the tuner's study storage: a simulated search writes a study, the
dashboard's WSGI app (what ``optuna-dashboard URL`` serves) lists it and shows its trials with
their schedule parameters, values and user attributes."""

from __future__ import annotations

import json
from wsgiref.util import setup_testing_defaults

import optuna
import optuna_dashboard
import pytest

from tiledattention import FORWARD, Problem
from tuner.measure import IsolatedExecutor, SimulatedExecutor
from tuner.search import SearchConfig, Tuner, study_name

PROBLEM = Problem(batch=2, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024, head_dim=64,
                  dtype="bf16", causal=True)


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory):
    """A study storage as ``tiledtune search`` leaves it: six simulated trials of one key
    (the seventh asked is refused as over budget, a failed trial)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('studies')}/tiledtune-studies.sqlite"
    executor = IsolatedExecutor(SimulatedExecutor)
    tuner = Tuner(executor, family=FORWARD, arch="sm_90", device_name="Simulated GPU",
                  storage_url=url, db=None,
                  config=SearchConfig(lookahead=1, n_trials=6, space="compact"))
    with executor:
        tuner.tune(PROBLEM)
    return url


def _get(app, path: str, query: str = "") -> dict:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query}
    setup_testing_defaults(environ)
    status = []
    body = b"".join(app(environ, lambda code, headers, exc_info=None: status.append(code)))
    assert status == ["200 OK"], (path, status, body[:500])
    return json.loads(body)


@pytest.fixture(scope="module")
def app(storage_url):
    return optuna_dashboard.wsgi(optuna.storages.RDBStorage(storage_url))


def test_the_dashboard_lists_the_tuner_study(app):
    summaries = _get(app, "/api/studies")["study_summaries"]
    assert [s["study_name"] for s in summaries] == [
        study_name("tiledtune", FORWARD, "sm_90", PROBLEM)]
    assert summaries[0]["directions"] == ["minimize"]


def test_the_dashboard_shows_each_trial_with_its_schedule_and_user_attributes(app, storage_url):
    study_id = _get(app, "/api/studies")["study_summaries"][0]["study_id"]
    shown = _get(app, f"/api/studies/{study_id}", "after=0")
    stored = optuna.load_study(study_name=study_name("tiledtune", FORWARD, "sm_90", PROBLEM),
                               storage=storage_url).trials
    assert [t["number"] for t in shown["trials"]] == [t.number for t in stored]
    complete = [t for t in shown["trials"] if t["state"] == "Complete"]
    assert len(complete) >= 6
    assert any(t["state"] == "Fail" for t in shown["trials"])  # failures are data, shown too
    for trial, original in zip(shown["trials"], stored):
        params = {p["name"]: p["param_external_value"] for p in trial["params"]}
        assert params == {k: str(v) for k, v in original.params.items()}
        assert {"tile_m", "tile_n", "occupancy"} <= set(params)  # the schedule's fields
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        assert set(attrs) == set(original.user_attrs)
        assert attrs["schedule"] == original.user_attrs["schedule"]
        assert attrs["schedule_key"] == original.user_attrs["schedule_key"]
        assert attrs["status"] == original.user_attrs["status"]
        if trial["state"] == "Complete":
            assert attrs["status"] in ("ok", "repeat")
            assert trial["values"] == [original.value]
        if "timing" in attrs:  # a dict attribute arrives as JSON text
            assert json.loads(attrs["timing"])["median_ms"] == original.value
    # the columns the trial table offers: every user attribute, rel_err sortable as a number
    columns = {a["key"]: a["sortable"] for a in shown["union_user_attrs"]}
    assert {"schedule", "schedule_key", "status", "timing"} <= set(columns)
    assert columns["rel_err"] is True
    assert {p["name"] for p in shown["union_search_space"]} == set(stored[0].params)


def test_the_dashboard_page_is_served(app):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/dashboard"}
    setup_testing_defaults(environ)
    status = []
    body = b"".join(app(environ, lambda code, headers, exc_info=None: status.append(code)))
    assert status == ["200 OK"]
    assert b"<html" in body.lower()
