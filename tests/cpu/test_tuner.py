"""The search driver on the simulated backend: optimum, faults, resume, the CLI."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import db as dbmod
import search_spaces
from db import ScheduleRow
from tiledattention import DECODE, FORWARD, DeviceInfo, Problem, Schedule
from tiledattention.tooling import codecs, current_provenance
from tuner.cli import main
from tuner.measure import IsolatedExecutor, SimulatedExecutor, SimulatedFaults, summarize
from tuner.search import KeyResult, SearchConfig, Tuner, study_name


def ScheduleDB(location):  # noqa: N802 - the database with every family's codec
    return dbmod.ScheduleDB(location, codecs=codecs())


def space_for(arch, name="full", problem=None):
    """The forward family's named space on ``arch``, restricted to ``problem`` when given."""
    space = search_spaces.space_for("forward", arch, name)
    if problem is None:
        return space
    return search_spaces.family_space("forward").restrict(space, problem)


def normalised(problem, schedules):
    return list({FORWARD.normalise(problem, s).key: FORWARD.normalise(problem, s)
                 for s in schedules}.values())

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = Problem(batch=4, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, head_dim=128,
                  dtype="bf16", causal=True)


def make_tuner(tmp_path, factory=SimulatedExecutor, db=None, **config):
    executor = IsolatedExecutor(factory)
    config.setdefault("lookahead", 1)
    tuner = Tuner(executor, family=FORWARD, arch="sm_90", device_name="Simulated GPU",
                  storage_url=f"sqlite:///{tmp_path}/studies.sqlite", db=db,
                  config=SearchConfig(**config))
    return tuner, executor


def compact_feasible():
    return normalised(PROBLEM, space_for("sm_90", "compact", PROBLEM).feasible(PROBLEM))


def test_restricted_space_drops_what_cannot_matter_for_the_problem():
    causal = space_for("sm_90", "full", dataclasses.replace(PROBLEM, causal=True)).choices
    plain = space_for("sm_90", "full", dataclasses.replace(PROBLEM, causal=False)).choices
    causal_only = {"longest_first", "split_masked", "paired_tiles"}
    assert causal_only <= set(causal) and not causal_only & set(plain)
    # persistent CTAs are searched for non-causal problems only (measured slower when causal)
    assert "persistent" in plain and "persistent" not in causal


@pytest.mark.slow  # spawns worker processes
def test_exhaustive_budget_finds_the_model_optimum(tmp_path):
    candidates = compact_feasible()
    optimum = SimulatedExecutor().optimum(PROBLEM, candidates)
    with ScheduleDB(tmp_path / "s.sqlite") as db:
        tuner, executor = make_tuner(tmp_path, db=db, n_trials=len(candidates) + 10,
                                     space="compact", patience=None)
        with executor:
            result = tuner.tune(PROBLEM)
        assert result.best == optimum
        assert result.measured == len(candidates)  # every point once, none twice
        stored = db.get("forward", "sm_90", "Simulated GPU", PROBLEM)
        assert stored.schedule == optimum and result.stored == "added"
        assert stored.default_ms is not None
        assert set(stored.baselines) == {"torch-cudnn", "torch-flash"}  # the simulated ones


def test_the_stored_row_keeps_every_baseline_the_case_timed_whatever_its_name(tmp_path):
    """``_store`` takes the baselines from the re-timing's data: a name no layer knows is kept,
    one that did not run (its entry the reason) is left out, the default is not a baseline."""
    with ScheduleDB(tmp_path / "s.sqlite") as db:
        tuner, _ = make_tuner(tmp_path, db=db)
        result = KeyResult(problem=PROBLEM, arch="sm_90",
                           best=FORWARD.default_schedule("sm_90", PROBLEM), timings={
                               "best": summarize([1.0] * 5), "default": summarize([1.25] * 5),
                               "torch-cudnn": summarize([0.75] * 5),
                               "vendor-lib": summarize([2.5] * 5),
                               "torch-flash": "RuntimeError: no kernel for this problem"})
        assert result.baselines == {"torch-cudnn": result.timings["torch-cudnn"],
                                    "torch-flash": result.timings["torch-flash"],
                                    "vendor-lib": result.timings["vendor-lib"]}
        assert tuner._store(PROBLEM, result, 4) == "added"
        stored = db.get("forward", "sm_90", "Simulated GPU", PROBLEM)
        assert stored.baselines == {"torch-cudnn": 0.75, "vendor-lib": 2.5}
        assert stored.default_ms == 1.25 and stored.trials == 4


def test_seeds_are_the_default_and_the_nearest_winners_of_both_dtypes(tmp_path):
    """Three nearest winners of the key's dtype and the nearest of the other dtype seed a key;
    winners for another head_dim or mask never do."""
    def put(store, problem, schedule):
        store.put(ScheduleRow(family="forward", arch="sm_90", device_name="Simulated GPU",
                              problem=problem,
                              schedule=schedule, median_ms=1.0, spread_ms=0.01, tflops=1.0,
                              trials=1, provenance=current_provenance(FORWARD)))

    fp16 = dataclasses.replace(PROBLEM, dtype="fp16")
    same = [Schedule(tile_m=m, tile_n=n, occupancy=2) for m, n in ((64, 64), (64, 128), (128, 64))]
    other = Schedule(tile_m=128, tile_n=128, occupancy=1)
    unrelated = Schedule(tile_m=128, tile_n=128, occupancy=2, exp2=True)
    with ScheduleDB(tmp_path / "s.sqlite") as store:
        for schedule, seqlen in zip(same, (2048, 4096, 8192)):
            put(store, dataclasses.replace(fp16, seqlen_q=seqlen, seqlen_k=seqlen), schedule)
        put(store, PROBLEM, other)  # bf16, same shape
        put(store, dataclasses.replace(fp16, head_dim=64), unrelated)
        put(store, dataclasses.replace(fp16, causal=False), unrelated)
        tuner, _ = make_tuner(tmp_path, db=store)
        space = space_for("sm_90", "compact", fp16)
        seeds = tuner._seeds(fp16, space)
    projected = [space.schedule(space.params(s)) for s in
                 [FORWARD.default_schedule("sm_90", fp16), *same, other]]
    assert set(seeds) == set(projected) and len(seeds) == len(set(projected))
    assert space.schedule(space.params(unrelated)) not in seeds


def test_neighbours_differ_in_one_dimension_and_skip_the_known_and_infeasible(tmp_path):
    tuner, _ = make_tuner(tmp_path)
    problem = dataclasses.replace(PROBLEM, head_dim=256)
    space = space_for("sm_90", "full", problem)
    base = FORWARD.default_schedule("sm_90", problem)
    measured = base.replace(exp2=False)
    too_big = base.replace(tile_m=256)  # 256-row Q tile + K and V at D=256: > 227 KiB
    found = tuner._neighbours(space, base, problem, {measured.key: 1.0})
    one_away = {FORWARD.normalise(problem, base.replace(**{n: v})).key
                for n, values in space.choices.items() for v in values if v != getattr(base, n)}
    one_away -= {base.key, measured.key, too_big.key}  # a change normalised away: not new
    assert {s.key for s in found} == one_away and len(found) == len(one_away)
    assert measured not in found and too_big not in found and base not in found
    assert found == tuner._neighbours(space, base, problem, {measured.key: 1.0})  # seeded order


@pytest.mark.slow  # spawns worker processes
def test_after_the_seeds_the_search_climbs_from_the_best_so_far(tmp_path):
    """The neighbour_trials candidates after the seeds each differ in exactly one dimension from
    the best schedule measured before them; the sampler's candidates after them need not."""
    problem = dataclasses.replace(PROBLEM, seqlen_q=2048, seqlen_k=2048)
    tuner, executor = make_tuner(tmp_path, n_trials=16, patience=None, neighbour_trials=6)
    with executor:
        tuner.tune(problem)
    space = space_for("sm_90", "full", problem)
    study = optuna.load_study(study_name=study_name("tiledtune", FORWARD, "sm_90", problem),
                              storage=f"sqlite:///{tmp_path}/studies.sqlite")
    measured = [t for t in study.trials if t.user_attrs.get("status") == "ok"]
    assert len(measured) == 16
    seeds = len(tuner._seeds(problem, space))
    best, distances = None, []
    for i, t in enumerate(measured):  # lookahead 1: each is measured before the next is asked
        schedule = space.schedule(t.params)
        if i >= seeds:
            distances.append(sum(getattr(schedule, n) != getattr(best[1], n)
                                 for n in space.choices))
        if best is None or t.value < best[0] * (1 - 1e-3):  # the driver's improvement rule
            best = (t.value, schedule)
    assert distances[:6] == [1] * 6
    assert max(distances[6:]) > 1


@pytest.mark.slow  # spawns worker processes
def test_tpe_reaches_near_optimum_with_a_third_of_the_budget(tmp_path):
    candidates = compact_feasible()
    sim = SimulatedExecutor()
    best_ms = sim.model_ms(PROBLEM, sim.optimum(PROBLEM, candidates))
    tuner, executor = make_tuner(tmp_path, n_trials=len(candidates) // 3, space="compact",
                                 patience=None)
    with executor:
        result = tuner.tune(PROBLEM)
    assert result.measured <= len(candidates) // 3
    assert best_ms / sim.model_ms(PROBLEM, result.best) >= 0.98


@pytest.mark.slow  # spawns worker processes
def test_every_fault_is_recorded_and_the_search_goes_on(tmp_path):
    candidates = compact_feasible()
    sim = SimulatedExecutor()
    ranked = sorted(candidates, key=lambda s: sim.model_ms(PROBLEM, s))
    # the four fastest schedules fail, each differently; the fifth must win
    faults = SimulatedFaults(compile_error=frozenset({ranked[0].key}),
                             crash=frozenset({ranked[1].key}), hang=frozenset({ranked[2].key}),
                             wrong=frozenset({ranked[3].key}))
    factory = functools.partial(SimulatedExecutor, faults=faults)
    tuner, executor = make_tuner(tmp_path, factory=factory, n_trials=len(candidates) + 5,
                                 space="compact", patience=None, compile_deadline_s=4,
                                 run_deadline_s=4)
    with executor:
        result = tuner.tune(PROBLEM)
        assert executor.started >= 3  # restarted after the crash and after the hang
    assert result.best == ranked[4]
    assert result.failures == {"compile-error": 1, "crash": 1, "timeout": 1, "wrong": 1}
    study = optuna.load_study(study_name=study_name("tiledtune", FORWARD, "sm_90", PROBLEM),
                              storage=f"sqlite:///{tmp_path}/studies.sqlite")
    reasons = {t.user_attrs["schedule_key"]: (t.user_attrs["status"], t.user_attrs.get("reason"))
               for t in study.trials
               if t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("ticket")}
    assert reasons[ranked[0].key][0] == "compile-error"
    assert reasons[ranked[1].key][0] == "crash" and "exit code 77" in reasons[ranked[1].key][1]
    assert reasons[ranked[2].key][0] == "timeout"
    assert reasons[ranked[3].key][0] == "wrong" and "0.5" in reasons[ranked[3].key][1]


RESUME_SCRIPT = """
import sys, functools
sys.path.insert(0, {root!r})
from tuner.measure import IsolatedExecutor, SimulatedExecutor, SimulatedFaults
from tuner.search import SearchConfig, Tuner
from tiledattention import FORWARD, Problem
problem = Problem(batch=4, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, head_dim=128,
                  dtype="bf16", causal=True)
factory = functools.partial(SimulatedExecutor, faults=SimulatedFaults(delay_s=0.15))
if __name__ == "__main__":
    with IsolatedExecutor(factory) as ex:
        tuner = Tuner(ex, family=FORWARD, arch="sm_90", device_name="Simulated GPU",
                      storage_url="sqlite:///{tmp}/studies.sqlite",
                      config=SearchConfig(n_trials=30, patience=None, lookahead=1,
                                          heartbeat_s=1, grace_s=2))
        r = tuner.tune(problem)
        print("MEASURED", r.measured)
"""


@pytest.mark.slow  # spawns worker processes
def test_kill_and_resume_repeats_and_loses_no_finished_trial(tmp_path):
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT.format(root=str(ROOT), tmp=str(tmp_path)))
    storage = f"sqlite:///{tmp_path}/studies.sqlite"
    name = study_name("tiledtune", FORWARD, "sm_90", PROBLEM)

    def finished():
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            return []
        return [t for t in study.trials if t.user_attrs.get("ticket")
                and t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
                and t.user_attrs.get("status") not in ("stale", "cancelled", None)]

    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while len(finished()) < 8 and time.monotonic() < deadline:
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {t.number: t.user_attrs["schedule_key"] for t in finished()}
    assert 8 <= len(before) < 30
    time.sleep(3)  # past the heartbeat grace period: the killed trial is stale
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    after = finished()
    keys = [t.user_attrs["schedule_key"] for t in after]
    assert len(after) == 30  # the budget, exactly
    assert len(set(keys)) == len(keys)  # nothing measured twice
    assert all(before[n] == k for n, k in ((t.number, t.user_attrs["schedule_key"])
                                           for t in after if t.number in before))
    assert set(before) <= {t.number for t in after}  # nothing finished was lost


@pytest.mark.slow  # spawns worker processes
def test_cli_simulated_search_and_list(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps table cells to the terminal's width
    db = tmp_path / "s.sqlite"
    code = main(["search", "--device", "sm_90", "--backend", "simulated", "--shape",
                 "2,8,1024,64", "--causal", "yes,no", "--trials", "12", "--space", "compact",
                 "--db", str(db)])
    assert code == 0
    with ScheduleDB(db) as store:
        rows = store.rows()
    assert sorted(r.problem.causal for r in rows) == [False, True]
    assert main(["list", "--db", str(db)]) == 0
    assert "B2 H8 S1024 D64 bf16 causal" in capsys.readouterr().out


def test_hill_climbing_enqueues_points_of_the_space_where_normalising_leaves_it(tmp_path):
    """A 4096-key window walks 33 key tiles of 128, so the decode family normalises 48 or 64
    splits to 33, which is no choice of the space: the climb must enqueue the point it
    searched (splits 64), not the normalised schedule (Optuna refused 33 mid-search)."""
    problem = ("batch=1,heads_q=32,heads_kv=8,seqlen_q=1,seqlen_k=32768,head_dim=128,"
               "dtype=bf16,causal=false,bottom_right=true,window_left=4095")
    db = tmp_path / "s.sqlite"
    code = main(["search", "--kernel", "decode", "--device", "sm_90", "--backend",
                 "simulated", "--problem", problem, "--trials", "12", "--space", "compact",
                 "--db", str(db)])
    assert code == 0
    with ScheduleDB(db) as store:
        (row,) = store.rows()
    assert row.problem.window_left == 4095 and row.schedule.splits <= 33


def test_cli_rejects_a_missing_gpu_architecture(capsys):
    code = main(["search", "--device", "sm_121", "--shape", "1,8,1024,128"])
    assert code == 2
    assert "no local GPU is sm_121; found" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--shape", "1,8,1024"], "B,H,S,D"),
    (["--shape", "1,8,1024,128", "--causal", "maybe"], "comma list"),
    (["--shape", "1,8,1024,128", "--timeout", "soon"], "duration"),
    (["--shape", "1,8,1024,128", "--neighbour-trials", "-1"], "integer >= 0; got '-1'"),
])
def test_cli_bad_arguments(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", "--device", "sm_90", *argv])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.slow  # spawns worker processes
def test_compile_only_for_sm_121_records_failures_as_infeasible(tmp_path, capsys):
    code = main(["search", "--compile-only", "--device", "sm_121", "--shape", "1,4,256,64",
                 "--space", "compact", "--limit", "3", "--jobs", "2", "--db",
                 str(tmp_path / "s.sqlite")])
    assert code == 0
    out = capsys.readouterr().out  # the results table on stdout
    assert "compile-only for sm_121" in out and "B1 H4 S256 D64 bf16 full" in out


# -- the default the finalists are re-timed beside -----------------------------------------------
TOKEN = Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=32768, head_dim=128,
                dtype="bf16", causal=False)


class _Recorder:
    """An executor that records what it is asked to re-time, and fails it (the search then
    keeps its own timings and stores nothing)."""

    def __init__(self):
        self.named = None

    def call(self, what, problem, named, *args, **kwargs):
        self.named = named
        raise RuntimeError("not timed here")


def test_the_search_retimes_the_default_of_the_devices_own_sms(tmp_path):
    """The default the lookup runs on the device tuned: the decode family's counts its SMs
    (``Tuner(sm_count=)``, the GPU's), so a 170-SM sm_120 part meets what sdpa runs there."""
    space = search_spaces.space_for("decode", "sm_120", "full")
    finalist = DECODE.default_schedule("sm_120", TOKEN).replace(splits=4)
    trial = types.SimpleNamespace(value=1.0, params=space.params(finalist),
                                  user_attrs={"status": "ok", "schedule_key": finalist.key})
    study = types.SimpleNamespace(
        get_trials=lambda deepcopy, states: [trial] if TrialState.COMPLETE in states else [])
    executor = _Recorder()
    tuner = Tuner(executor, family=DECODE, arch="sm_120", device_name="NVIDIA GeForce RTX 5090",
                  storage_url=f"sqlite:///{tmp_path}/studies.sqlite", sm_count=170)
    tuner._finish(study, TOKEN, types.SimpleNamespace())
    device = DeviceInfo(index=-1, arch="sm_120", name="NVIDIA GeForce RTX 5090", sm_count=170)
    assert executor.named["default"] == DECODE.device_default(device, TOKEN)
    assert executor.named["default"].splits == 170 // 8  # not the generation's 48 // 8
