"""Studies keyed by what makes their times comparable (issue 30, item 1), stale running trials
of dead workers (item 8) and the one rule for empty database files (item 8).

The "GPU" searches here run the real ``tiledtune search`` GPU path (storage, budget, study,
database) with only the device replaced: ``select_device`` answers with a made-up H100, its
executor is the simulated one and the compile pool answers at once."""

from __future__ import annotations

import functools
import json
import warnings
from concurrent.futures import Future
from datetime import datetime, timedelta

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

import db as dbmod
from tiledattention import FORWARD, DeviceInfo, Problem, open_database
from tiledattention.tooling import codecs
from tuner.cli import main
from tuner.commands import search_cmd
from tuner.errors import StudyMismatchError
from tuner.measure import IsolatedExecutor, SimulatedExecutor, TimingMode
from tuner.search import SearchConfig, StudyIdentity, Tuner, open_storage, study_name
from tuner.search import _driver

PROBLEM = Problem(batch=2, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024, head_dim=64,
                  dtype="bf16", causal=False)
SEARCH = ["search", "--device", "sm_90", "--shape", "2,8,1024,64", "--space", "compact",
          "--patience", "0", "--json"]
H100 = "NVIDIA H100 80GB HBM3"


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


class _AtOnce:
    """The compile pool of the GPU path, answering every compile at once (nothing compiles)."""

    def __init__(self, workers: int) -> None:
        pass

    def submit(self, fn, *args) -> Future:
        done: Future = Future()
        done.set_result((0.0, None, None))
        return done

    def close(self, *, now: bool = False) -> None:
        pass


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A user cache of its own (the default schedule database and study storage in it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEDATTN_DB", raising=False)
    return tmp_path / "cache" / "tiledattention"


@pytest.fixture
def gpu(monkeypatch):
    """Make ``tiledtune search`` without ``--backend`` find a GPU named ``name``."""
    def use(name: str = H100) -> None:
        monkeypatch.setattr(search_cmd, "select_device", lambda arch, index=None: DeviceInfo(
            index=0, arch=arch, name=name, sm_count=132))
        monkeypatch.setattr(search_cmd, "_GpuFactory", lambda family, index, timing:
                            functools.partial(SimulatedExecutor, "sm_90", family=family,
                                              timing=timing))
        monkeypatch.setattr(_driver, "CompilePool", _AtOnce)
    use()
    return use


def run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main([*SEARCH, *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def rows(path) -> list:
    if not path.exists():
        return []
    with dbmod.ScheduleDB(path, codecs=codecs()) as store:
        return store.rows()


def gpu_study(home):
    return optuna.load_study(study_name=study_name("tiledtune", FORWARD, "sm_90", PROBLEM),
                             storage=f"sqlite:///{home}/tiledtune-studies.sqlite")


def forget_identity(study) -> None:
    """Make ``study`` look as a study made before it recorded what measured it."""
    for attr in ("backend", "device_name", "template_identity"):
        study._storage.set_study_user_attr(study._study_id, attr, None)


# -- item 1: simulated, then the GPU -----------------------------------------------------------

@pytest.mark.slow  # spawns worker processes
def test_a_simulated_search_then_a_gpu_one_stores_no_simulated_trial_as_a_gpu_row(
        home, gpu, capsys):
    """The sequence of issue 30: a simulated search without --db, then the same command on the
    GPU. The GPU search measures its own budget (not "measured 0"), and its row counts its own
    trials only."""
    code, simulated, _ = run(capsys, "--backend", "simulated", "--trials", "6")
    assert code == 0 and simulated["keys"][0]["measured"] == 6
    code, measured, err = run(capsys, "--trials", "6")
    assert code == 0, err
    assert measured["backend"] == "gpu" and measured["device"] == H100
    assert measured["keys"][0]["measured"] == 6  # measured afresh
    [row] = rows(home / "schedules.sqlite")
    assert (row.backend, row.device_name, row.trials) == ("gpu", H100, 6)
    assert all(r.backend == "simulated" for r in rows(home / "simulated-schedules.sqlite"))
    study = gpu_study(home)  # the GPU's study holds the GPU's trials only
    assert study.user_attrs["backend"] == "gpu" and study.user_attrs["device_name"] == H100
    assert study.user_attrs["template_identity"] == FORWARD.template_identity()
    measured_here = [t for t in study.trials if t.user_attrs.get("ticket")]
    assert len(measured_here) == 6 and all(t.user_attrs["device"] == 0 for t in measured_here)
    # each study is resumed by its own command: nothing more to measure on either
    assert run(capsys, "--trials", "6")[1]["keys"][0]["measured"] == 0
    assert run(capsys, "--backend", "simulated", "--trials", "6")[1]["keys"][0]["measured"] == 0


@pytest.mark.slow  # spawns worker processes
def test_a_study_from_before_the_backend_was_recorded(home, gpu, capsys, tmp_path):
    """A study from before this change under the GPU's name: one whose measured trials name no
    GPU (a simulated search's) is refused in one line; one whose trials name the GPU that
    measured them is resumed, and records what it is from then on."""
    storage = f"sqlite:///{home}/tiledtune-studies.sqlite"
    home.mkdir(parents=True)
    with IsolatedExecutor(SimulatedExecutor) as executor:  # the simulated search of old
        Tuner(executor, family=FORWARD, arch="sm_90", device_name="Simulated GPU",
              storage_url=storage, config=SearchConfig(n_trials=4, lookahead=1)).tune(PROBLEM)
    forget_identity(gpu_study(home))
    code, _, err = run(capsys, "--trials", "4")
    assert code == 2
    line = one_line(err)
    assert "was measured by the simulated backend, this search by the gpu backend" in line
    assert "--study prefix" in line and "--storage" in line
    assert rows(home / "schedules.sqlite") == []
    assert gpu_study(home).user_attrs["backend"] is None  # a refused study is left as it was

    code, _, _ = run(capsys, "--trials", "4", "--study", "gpu")  # the way out it names
    assert code == 0 and [r.trials for r in rows(home / "schedules.sqlite")] == [4]

    # a GPU study of old: its measured trials record the local GPU (user attribute "device")
    code, _, _ = run(capsys, "--trials", "3", "--study", "old-gpu")
    assert code == 0
    old = optuna.load_study(study_name=study_name("old-gpu", FORWARD, "sm_90", PROBLEM),
                            storage=storage)
    forget_identity(old)
    code, resumed, err = run(capsys, "--trials", "5", "--study", "old-gpu")
    assert code == 0, err
    assert resumed["keys"][0]["measured"] == 2  # the 3 before count
    old = optuna.load_study(study_name=old.study_name, storage=storage)
    assert old.user_attrs["backend"] == "gpu" and old.user_attrs["device_name"] == H100


@pytest.mark.slow  # spawns worker processes
def test_a_study_of_another_device_or_template_is_refused_in_one_line(home, gpu, capsys):
    assert run(capsys, "--trials", "3")[0] == 0
    before = len(gpu_study(home).trials)

    gpu("NVIDIA H100 PCIe")
    code, _, err = run(capsys, "--trials", "4")
    assert code == 2
    line = one_line(err)
    assert f"was measured on '{H100}', this search on 'NVIDIA H100 PCIe'" in line
    assert "another --study prefix, or another --storage, to start one" in line

    gpu()
    study = gpu_study(home)
    study.set_user_attr("template_identity", "0123456789ab")  # measured by an older kernel
    code, _, err = run(capsys, "--trials", "4")
    assert code == 2
    assert (f"by kernel template 0123456789ab, this search's is {FORWARD.template_identity()}"
            in one_line(err))
    # several differences: each named, in one line
    code, _, err = run(capsys, "--trials", "4", "--timing", "graph", "--l2", "warm")
    line = one_line(err)
    assert code == 2 and "graph launches, warm L2" in line and "0123456789ab" in line
    assert len(gpu_study(home).trials) == before  # nothing measured in a refused study
    assert [r.trials for r in rows(home / "schedules.sqlite")] == [3]


def test_study_identity_checks_only_what_it_knows(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path}/s.sqlite", heartbeat_s=60, grace_s=120)
    study = optuna.create_study(study_name="key", storage=storage)
    gpu_here = StudyIdentity(backend="gpu", device_name=H100, template="aaaaaaaaaaaa",
                             timing=TimingMode())
    gpu_here.check(study)  # a new study: anything goes
    gpu_here.record(study)
    assert study.user_attrs == {"backend": "gpu", "device_name": H100,
                                "template_identity": "aaaaaaaaaaaa",
                                "timing_mode": {"launch": "stream", "l2": "cold"}}
    gpu_here.check(study)
    StudyIdentity(template="aaaaaaaaaaaa").check(study)  # --compile-only knows the template
    with pytest.raises(StudyMismatchError, match="kernel template aaaaaaaaaaaa, this search's "
                                                 "is bbbbbbbbbbbb"):
        StudyIdentity(template="bbbbbbbbbbbb").check(study)
    with pytest.raises(StudyMismatchError, match="by the gpu backend, this search by the "
                                                 "simulated backend"):
        StudyIdentity(backend="simulated").check(study)


def test_the_backend_is_part_of_the_study_name():
    gpu_name = study_name("tiledtune", FORWARD, "sm_90", PROBLEM)
    assert gpu_name.startswith("tiledtune:forward:sm_90:{")  # the name GPU studies always had
    simulated = study_name("tiledtune", FORWARD, "sm_90", PROBLEM, backend="simulated")
    assert simulated.startswith("tiledtune:forward:sm_90:simulated:{") and simulated != gpu_name
    # the study of the key for a database other than the one its plain study belongs to
    own = study_name("tiledtune", FORWARD, "sm_90", PROBLEM, backend="simulated",
                     database="0123")
    assert own.startswith("tiledtune:forward:sm_90:simulated:db-0123:{")


# -- item 8: a running trial that never got a heartbeat ----------------------------------------

def _orphan(study, storage, age_s: float) -> int:
    """A trial asked by a worker that died before its first heartbeat (killed while the sampler
    ran inside ``ask``), ``age_s`` seconds ago."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's note that heartbeats go with optimize()
        trial = study.ask()
    started = datetime.now() - timedelta(seconds=age_s)
    with storage.engine.begin() as connection:
        connection.execute(sa.text("UPDATE trials SET datetime_start = :t WHERE trial_id = :i"),
                           {"t": started, "i": trial._trial_id})
    return trial.number


@pytest.mark.slow  # spawns the measuring worker
def test_a_running_trial_without_heartbeat_of_a_dead_worker_is_failed_on_the_next_run(tmp_path):
    url = f"sqlite:///{tmp_path}/studies.sqlite"
    storage = open_storage(url, heartbeat_s=60, grace_s=30)
    name = study_name("tiledtune", FORWARD, "sm_90", PROBLEM)
    study = optuna.create_study(study_name=name, storage=storage)
    dead = _orphan(study, storage, age_s=75)  # the re-run "more than a minute later"
    young = _orphan(study, storage, age_s=1)  # may be a live worker's, still sampling
    with IsolatedExecutor(SimulatedExecutor) as executor:
        result = Tuner(executor, family=FORWARD, arch="sm_90", device_name="Simulated GPU",
                       storage_url=url, config=SearchConfig(n_trials=4, lookahead=1,
                                                            grace_s=30)).tune(PROBLEM)
    assert result.measured == 4 and result.best is not None
    state = {t.number: t.state for t in optuna.load_study(study_name=name, storage=url).trials}
    assert state[dead] == TrialState.FAIL
    assert state[young] == TrialState.RUNNING
    assert sum(s == TrialState.RUNNING for s in state.values()) == 1


# -- item 8: an empty file is a database with nothing in it ------------------------------------

@pytest.mark.slow  # spawns worker processes
def test_an_empty_file_is_an_empty_database_for_readers_and_a_new_one_for_writers(
        tmp_path, capsys):
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    assert open_database(str(empty), read_only=True) is None  # the runtime: no rows, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dbmod.ScheduleDB.open_for_lookup(empty, codecs=codecs()) is None
    assert main(["list", "--db", str(empty)]) == 0
    out, err = capsys.readouterr()
    assert "no schedule database at" in out and err == ""
    assert main(["list", "--db", str(empty), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == []
    # export does what it does without a database (today: the shipped tables instead)
    missing = tmp_path / "missing.sqlite"
    said = []
    for where in (missing, empty):
        output = tmp_path / f"{where.stem}.json"
        code = main(["export", "--db", str(where), "-o", str(output)])
        said.append((code, capsys.readouterr().err.replace(str(output), "OUTPUT")
                     .replace(str(where), "FILE")))
    assert said[0] == said[1]
    assert empty.read_bytes() == b""  # readers leave it as it was
    # a writer creates the schema in it, as in a new file
    assert main(["search", "--backend", "simulated", "--device", "sm_90", "--shape",
                 "1,8,512,64", "--space", "compact", "--trials", "2", "--db", str(empty)]) == 0
    assert [r.backend for r in rows(empty)] == ["simulated"]
    capsys.readouterr()
    assert main(["list", "--db", str(empty)]) == 0
    assert "1 schedules in" in " ".join(capsys.readouterr().out.split())
