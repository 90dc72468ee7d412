"""The offline replay of search strategies (tuner/search/_replay.py, scripts/tuner_replay.py)
and the sampling of scripts/tuner_sweep.py, on synthetic sweeps: measured times made up from the
simulated backend's model over a sample of the space."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import tempfile
from pathlib import Path

import optuna
import pytest

import search_spaces
from search_spaces.forward import model_ms
from tiledattention import FORWARD, Problem
from tuner.measure import Measurement, summarize
from tuner.search import SearchConfig, Tuner
from tuner.search._candidates import feasible, seeds
from tuner.search._replay import Landscape, replay_random, replay_tuner, schedule_distance

ROOT = Path(__file__).resolve().parents[2]
CAUSAL = Problem(batch=2, heads_q=32, heads_kv=8, seqlen_q=3000, seqlen_k=3000, head_dim=128,
                 dtype="bf16", causal=True)
LONG = Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=12008, seqlen_k=12008, head_dim=128,
               dtype="bf16", causal=True)


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sweep_script():
    return script("tuner_sweep")


@pytest.fixture(scope="module")
def replay_script():
    return script("tuner_replay")


def space_of(problem, name="full"):
    spaces = search_spaces.family_space("forward")
    return spaces.restrict(spaces.space("sm_90", name), problem)


def landscape(problem, schedules, fail_every=0):
    """Model times (the simulated backend's) for ``schedules``; every ``fail_every``-th one a
    compile error."""
    outcomes = {}
    for i, s in enumerate(schedules):
        failed = fail_every and i % fail_every == fail_every - 1
        outcomes[s.key] = "compile-error" if failed else model_ms(problem, s)
    return Landscape(family=FORWARD, problem=problem, space=space_of(problem),
                     outcomes=outcomes, schedules={s.key: s for s in schedules})


@pytest.fixture(scope="module")
def sampled(sweep_script):
    """A 60-schedule sample of the full space (the default first), as the sweep draws it."""
    space = space_of(CAUSAL)
    default = FORWARD.normalise(CAUSAL, FORWARD.default_schedule("sm_90", CAUSAL))
    sample, _ = sweep_script.draw_sample(CAUSAL, space, [default], 60, seed=5)
    return landscape(CAUSAL, sample, fail_every=7), [default]


class Scripted:
    """The executor interface the driver uses, answered in this process from a landscape: a
    compile error at the warm-up, another failure at the measurement, else the landscape's
    time."""

    def __init__(self, land):
        self.land = land

    def _value(self, problem, schedule):
        return self.land.outcomes[FORWARD.normalise(problem, schedule).key]

    def measurement(self, method, problem, schedule, deadline):
        value = self._value(problem, schedule)
        if method == "warm":
            return Measurement("compile-error" if value == "compile-error" else "ok", "made up")
        if isinstance(value, str):
            return Measurement(value, "made up")
        return Measurement("ok", timing=summarize([value]), rel_err=1e-3)

    def call(self, method, problem, schedules, baselines, deadline):  # the finalists' retime
        return {name: summarize([self._value(problem, s)]) for name, s in schedules.items()
                if isinstance(self._value(problem, s), float)}


def near_ties(schedules):
    """A made-up landscape of two levels, 1 and 1.1 ms, each schedule on one at random (fixed by its
    key) and moved by less than 0.05%: candidates of one level are within the driver's 0.1%
    improvement threshold of each other. Every ninth schedule a compile error, every thirteenth
    wrong."""
    outcomes = {}
    for i, s in enumerate(schedules):
        digest = hashlib.sha1(s.key.encode()).digest()
        level, jitter = digest[0] % 2, int.from_bytes(digest[1:5], "big") / 2 ** 32 - 0.5
        outcomes[s.key] = ("compile-error" if i % 9 == 8 else "wrong" if i % 13 == 12
                           else (1 + 0.1 * level) * (1 + 0.001 * jitter))
    return outcomes


@pytest.fixture
def fast_dir(tmp_path):
    """A directory for the study storage; in memory where there is /dev/shm (SQLite's commits
    cost ~10 ms each on a disk)."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as path:
        yield Path(path)


@pytest.mark.parametrize("lookahead, climb", [(4, None), (1, 0)], ids=["lookahead4", "no-climb"])
def test_replay_measures_what_the_real_driver_measures(fast_dir, lookahead, climb):
    """On a sample that is the whole (compact) space nothing is rounded: the replay must propose
    and measure exactly what Tuner.tune does, in the same order (seeds, climbing, TPE and its
    start-up trials, lookahead, failures, repeats, the improvement rule on near-ties). A change
    of the driver's policy fails this test."""
    problem = Problem(batch=4, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096,
                      head_dim=128, dtype="bf16", causal=True)
    space = space_of(problem, "compact")
    points = feasible(FORWARD, space, problem)
    land = Landscape(family=FORWARD, problem=problem, space=space,
                     outcomes=near_ties(points), schedules={s.key: s for s in points},
                     feasible_count=len(points))
    config = SearchConfig(n_trials=24, space="compact", seed=5, lookahead=lookahead,
                          neighbour_trials=climb)
    tuner = Tuner(Scripted(land), family=FORWARD, arch="sm_90", device_name="sim",
                  storage_url=f"sqlite:///{fast_dir}/studies.sqlite", config=config)
    with tuner:
        tuner.tune(problem)
    (summary,) = optuna.get_all_study_summaries(tuner.storage)
    study = optuna.load_study(study_name=summary.study_name, storage=tuner.storage)
    real = [t.user_attrs["schedule_key"] for t in sorted(study.trials, key=lambda t: t.number)
            if t.user_attrs.get("ticket")]
    replayed = replay_tuner(land, seeds(FORWARD, None, "sm_90", problem, space), n_trials=24,
                            seed=5, lookahead=lookahead, neighbour_trials=climb)
    assert replayed.stand_ins == 0
    assert replayed.measured == real
    assert len(real) == 24
    assert {"compile-error", "wrong"} & set(replayed.outcomes)


def test_replay_is_deterministic_for_a_seed(sampled):
    land, first = sampled
    a = replay_tuner(land, first, n_trials=20, seed=7)
    b = replay_tuner(land, first, n_trials=20, seed=7)
    c = replay_tuner(land, first, n_trials=20, seed=8)
    assert a.measured == b.measured and a.outcomes == b.outcomes
    assert a.snap_distances == b.snap_distances
    assert a.measured != c.measured  # another seed proposes otherwise
    assert replay_random(land, n_trials=20, seed=7).measured == \
        replay_random(land, n_trials=20, seed=7).measured


@pytest.mark.parametrize("strategy", ["tuner", "climb", "tpe"])
def test_the_tuner_never_measures_a_schedule_twice(sampled, strategy):
    """Off-sample proposals are stood in for by unmeasured sampled schedules: every measured
    schedule is in the sample, none twice, at most the budget, and the rounding is counted."""
    land, first = sampled
    options = {"tuner": {}, "climb": {"neighbour_trials": 30},
               "tpe": {"neighbour_trials": 0}}[strategy]
    for seed in range(4):
        r = replay_tuner(land, [] if strategy == "tpe" else first, n_trials=30, seed=seed,
                         **options)
        assert len(r.measured) == len(set(r.measured)) == 30
        assert set(r.measured) <= set(land.outcomes)
        assert r.stand_ins == len(r.snap_distances) > 0
        assert all(d > 0 for d in r.snap_distances)
        if strategy != "tpe":
            assert r.measured[0] == first[0].key  # the default is measured first
        # the best found is never better than the sample's best, and the outcomes are the
        # sample's own
        assert r.best_after(30) >= land.best_ms
        assert r.outcomes == [land.outcomes[k] for k in r.measured]


def test_stand_ins_are_the_nearest_unmeasured_sampled_schedules(sampled):
    land, first = sampled
    space = land.space
    base = first[0]
    assert schedule_distance(space, base, base) == 0
    assert schedule_distance(space, base.replace(tile_m=256), base.replace(tile_m=64)) == 1.0
    assert schedule_distance(space, base.replace(tile_m=128), base.replace(tile_m=64)) == 0.5
    assert schedule_distance(space, base.replace(exp2=False), base) == 1.0
    assert schedule_distance(space, base.replace(k_latency=4), base.replace(k_latency=2)) == 1.0
    # a budget of the whole sample measures every sampled schedule once
    r = replay_tuner(land, first, n_trials=len(land), seed=1, patience=None)
    assert sorted(r.measured) == sorted(land.outcomes)


def test_random_search_share_matches_the_closed_form(replay_script, tmp_path):
    """One schedule at 1 ms, nine at 2 ms: after k random trials the best is found with
    probability k/10, so the mean share is k/10 + (1 - k/10) / 2."""
    space = space_of(CAUSAL)
    sample = feasible(FORWARD, space_of(CAUSAL, "compact"), CAUSAL)[:10]
    doc = sweep_doc([(CAUSAL, space, sample, {s.key: 1.0 if i == 3 else 2.0
                                               for i, s in enumerate(sample)})])
    summary = replay_script.replay(doc, seeds=3000, budgets=[1, 3, 10],
                                   strategies=["random"], jobs=1)
    results = summary["keys"][0]["results"]["random"]
    for k in (1, 3, 10):
        expected = k / 10 + (1 - k / 10) / 2
        assert results[str(k)]["mean"] == pytest.approx(expected, abs=0.015)
        assert results[str(k)]["found_best"] == pytest.approx(k / 10, abs=0.03)
    assert results["10"]["p10"] == 1.0


def sweep_doc(keys) -> dict:
    """A tuner_sweep.py document: per key (problem, space, sample, outcome by schedule key)."""
    out = []
    for problem, space, sample, outcomes in keys:
        default = FORWARD.normalise(problem, FORWARD.default_schedule("sm_90", problem))
        candidates = []
        for s in sample:
            value = outcomes[s.key]
            c = {"key": s.key, "schedule": s.to_dict(), "describe": s.describe(),
                 "role": "default" if s.key == default.key else "sample"}
            c.update({"status": "ok", "median_ms": value} if isinstance(value, float)
                     else {"status": value, "reason": "made up"})
            candidates.append(c)
        out.append({"problem": problem.to_dict(), "describe": problem.describe(),
                    "space": {n: list(v) for n, v in space.choices.items()},
                    "feasible_estimate": 100_000, "default": default.key,
                    "seeds": [default.key], "candidates": candidates})
    return {"format": 1, "family": "forward", "arch": "sm_90", "space": "full", "keys": out}


def test_replay_script_reads_a_sweep_and_reports(replay_script, sweep_script, tmp_path, capsys):
    space = space_of(CAUSAL)
    default = FORWARD.normalise(CAUSAL, FORWARD.default_schedule("sm_90", CAUSAL))
    sample, _ = sweep_script.draw_sample(CAUSAL, space, [default], 40, seed=2)
    outcomes = {s.key: model_ms(CAUSAL, s) for s in sample}
    outcomes[sample[5].key] = "wrong"
    doc = sweep_doc([(CAUSAL, space, sample, outcomes)])
    doc["keys"][0]["candidates"].append(  # not reached by the sweep: not part of the sample
        {"key": "x", "schedule": default.replace(tile_m=256).to_dict(), "status": "skipped"})
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(doc))
    assert replay_script.main([str(path), "--seeds", "2", "--budgets", "5,10", "--jobs", "1",
                               "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    entry = summary["keys"][0]
    assert entry["sample"] == 40 and entry["correct"] == 39
    assert set(entry["results"]) == {"tuner", "climb", "tpe", "random"}
    for per_budget in entry["results"].values():
        for r in per_budget.values():
            assert 0 < r["mean"] <= 1 and r["p10"] <= r["median"] <= 1
    assert summary["winner"]["10"]["strategy"] in entry["results"]
    assert replay_script.main([str(path), "--seeds", "1", "--budgets", "5", "--jobs", "1",
                               "--strategies", "random,tuner"]) == 0
    assert "| tuner | 5 |" in capsys.readouterr().out


def test_sweep_sample_is_uniform_normalised_and_shared_between_like_keys(sweep_script):
    space = space_of(CAUSAL)
    default = FORWARD.normalise(CAUSAL, FORWARD.default_schedule("sm_90", CAUSAL))
    sample, estimate = sweep_script.draw_sample(CAUSAL, space, [default], 120, seed=0)
    assert sample[0] == default and len({s.key for s in sample}) == 120
    assert all(FORWARD.normalise(CAUSAL, s) == s and space.contains(s)
               and space.infeasibility("sm_90", CAUSAL, s) is None for s in sample)
    # 248,832 normalised feasible schedules (124,416 before pack_gqa doubled a grouped key's)
    assert 1.0e5 < estimate < 5.0e5
    # 3000 and 12008 tokens are both 8 mod 16: same normalisation, same kernels
    long_default = FORWARD.normalise(LONG, FORWARD.default_schedule("sm_90", LONG))
    other, _ = sweep_script.draw_sample(LONG, space_of(LONG), [long_default], 120, seed=0)
    shared = {s.key for s in sample} & {s.key for s in other}
    assert len(shared) >= 118
    assert {sweep_script.compile_identity(CAUSAL, s) for s in sample[1:50]} == \
        {sweep_script.compile_identity(LONG, s) for s in sample[1:50]}
    assert sweep_script.compile_identity(CAUSAL, default) != \
        sweep_script.compile_identity(CAUSAL, default.replace(exp2=False))


def test_sweep_script_help_and_dry_run_need_no_gpu(sweep_script, capsys):
    with pytest.raises(SystemExit) as exit_:
        sweep_script.main(["--help"])
    assert exit_.value.code == 0
    assert sweep_script.main(["--dry-run", "--count", "20"]) == 0
    out = capsys.readouterr().out
    assert "distinct kernels to compile" in out and "B1 H32/8 S12008 D128" in out
    with pytest.raises(SystemExit):  # a shipped key is not held out
        sweep_script.main(["--dry-run", "--key", "4,32/8,4096,128,causal"])


def test_landscape_refuses_mismatched_keys():
    s = FORWARD.default_schedule("sm_90", CAUSAL)
    with pytest.raises(ValueError):
        Landscape(family=FORWARD, problem=CAUSAL, space=space_of(CAUSAL),
                  outcomes={"nope": 1.0}, schedules={"nope": s})
    assert math.isinf(Landscape(family=FORWARD, problem=CAUSAL, space=space_of(CAUSAL),
                                outcomes={s.key: "wrong"}, schedules={s.key: s}).best_ms)
