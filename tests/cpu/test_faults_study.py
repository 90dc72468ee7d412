"""Fault catalogue (issue 45, item 1): a tuned result is never silently lost. A study belongs to
the schedule database it fills (the identity stored in the database, ``db.database_identity``),
so a search against a deleted or another database measures afresh; a study concluded into a
database that no longer holds its row concludes again; ``search`` reports a key stored only when
the database, read back, holds its row, and exits 1 with a line saying so when it does not.

Before the fix, each sequence below printed a full table with its winner, "stored: concluded by
another worker", measured 0, wrote 0 rows and exited 0. The "GPU" search runs the real GPU path
with only the device faked, as ``test_study_identity.py`` does."""

from __future__ import annotations

import functools
import json
import shutil
import sqlite3

import optuna
import pytest

import db as dbmod
from tiledattention import FORWARD, DeviceInfo, Problem
from tiledattention.tooling import codecs
from tuner.cli import main
from tuner.commands import search_cmd
from tuner.measure import SimulatedExecutor
from tuner.search import _driver, study_name

from .test_study_identity import _AtOnce  # the GPU path's compile pool, compiling nothing

PROBLEM = Problem(batch=2, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024, head_dim=64,
                  dtype="bf16", causal=False)
SEARCH = ["search", "--device", "sm_90", "--shape", "2,8,1024,64", "--space", "compact",
          "--patience", "0", "--trials", "3"]
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A user cache of its own: the default schedule databases and study storage in it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEDATTN_DB", raising=False)
    return tmp_path / "cache" / "tiledattention"


@pytest.fixture
def gpu(monkeypatch):
    """``tiledtune search`` without ``--backend`` finds a made-up H100 and measures on the
    simulated executor."""
    monkeypatch.setattr(search_cmd, "select_device", lambda arch, index=None: DeviceInfo(
        index=0, arch=arch, name=H100, sm_count=132))
    monkeypatch.setattr(search_cmd, "_GpuFactory", lambda family, index, timing:
                        functools.partial(SimulatedExecutor, "sm_90", family=family,
                                          timing=timing))
    monkeypatch.setattr(_driver, "CompilePool", _AtOnce)


def search(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main([*SEARCH, *argv, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def rows(path) -> list:
    if not path.exists():
        return []
    with dbmod.ScheduleDB(path, codecs=codecs()) as store:
        return store.rows()


def remove(path) -> None:
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


def measured_and_stored(document: dict) -> tuple[int, str]:
    [key] = document["keys"]
    return key["measured"], key["stored"]


# -- the reproductions --------------------------------------------------------------------------

@pytest.mark.slow  # spawns worker processes
def test_a_deleted_database_at_the_default_location_is_filled_again(home, capsys):
    code, first, _ = search(capsys, "--backend", "simulated")
    database = home / "simulated-schedules.sqlite"
    assert code == 0 and measured_and_stored(first) == (3, "added") and len(rows(database)) == 1
    remove(database)  # the study storage beside it stays
    code, again, err = search(capsys, "--backend", "simulated")
    assert code == 0, err
    assert measured_and_stored(again) == (3, "added")  # measured afresh, not "concluded"
    assert [r.trials for r in rows(database)] == [3]


@pytest.mark.slow  # spawns worker processes
def test_a_second_database_in_the_same_folder_gets_its_own_study_and_row(tmp_path, capsys):
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    assert search(capsys, "--backend", "simulated", "--db", str(a))[0] == 0
    code, second, err = search(capsys, "--backend", "simulated", "--db", str(b))
    assert code == 0, err
    assert measured_and_stored(second) == (3, "added")
    assert len(rows(a)) == len(rows(b)) == 1
    # one study storage beside both, a study per database; each resumes its own
    storage = f"sqlite:///{tmp_path / 'tiledtune-studies.sqlite'}"
    names = sorted(optuna.get_all_study_names(storage))
    with dbmod.ScheduleDB(b, codecs=codecs()) as store:
        own = study_name("tiledtune", FORWARD, "sm_90", PROBLEM, backend="simulated",
                         database=dbmod.database_identity(store))
    assert names == sorted([study_name("tiledtune", FORWARD, "sm_90", PROBLEM,
                                       backend="simulated"), own])
    for database in (a, b):
        code, resumed, _ = search(capsys, "--backend", "simulated", "--db", str(database))
        assert code == 0 and measured_and_stored(resumed) == (0, "concluded by another worker")


@pytest.mark.slow  # spawns worker processes
def test_the_gpu_path_with_a_deleted_database(home, gpu, capsys):
    database = home / "schedules.sqlite"
    code, first, err = search(capsys)
    assert code == 0, err
    assert first["device"] == H100 and measured_and_stored(first) == (3, "added")
    remove(database)
    code, again, err = search(capsys)
    assert code == 0, err
    assert measured_and_stored(again) == (3, "added")
    [row] = rows(database)
    assert (row.backend, row.device_name, row.trials) == ("gpu", H100, 3)


@pytest.mark.slow  # spawns worker processes
def test_a_study_whose_row_was_deleted_from_its_database_concludes_again(tmp_path, capsys):
    database = tmp_path / "s.sqlite"
    argv = ("--backend", "simulated", "--db", str(database))
    assert search(capsys, *argv)[0] == 0
    [row] = rows(database)
    with dbmod.ScheduleDB(database, codecs=codecs()) as store:
        assert store.delete(row.family, row.arch, row.device_name, row.problem)
    code, again, err = search(capsys, *argv)
    assert code == 0, err
    # the same database (its identity unchanged): the study's trials stand, the key is
    # concluded again (finalists re-timed) and its winner stored
    assert measured_and_stored(again) == (0, "added")
    [back] = rows(database)
    assert back.schedule == row.schedule and back.trials == 3


@pytest.mark.slow  # spawns worker processes
def test_a_write_that_leaves_no_row_is_not_reported_stored_and_exits_1(
        tmp_path, capsys, monkeypatch):
    """A write that says "added" but leaves nothing (a bug, or another process deleting the
    row at once): the key is NOT STORED in the table, a line says so, and the exit status is
    1; no conclusion is recorded, so the next run concludes the key again."""
    database = tmp_path / "s.sqlite"
    monkeypatch.setattr(dbmod.ScheduleDB, "merge", lambda self, row, **kw: ("added", ""))
    code = main([*SEARCH, "--backend", "simulated", "--db", str(database)])
    out, err = capsys.readouterr()
    assert code == 1
    assert "NOT STORED" in out and "added" not in out.replace("'added'", "")
    assert "B2 H8 S1024 D64 bf16 full: no row in" in err and "could not be stored" in err
    assert rows(database) == []
    monkeypatch.undo()
    code, again, err = search(capsys, "--backend", "simulated", "--db", str(database))
    assert code == 0, err
    assert measured_and_stored(again) == (0, "added") and len(rows(database)) == 1


# -- simulated rows never go to the runtime's database ------------------------------------------

def test_a_simulated_search_into_the_runtimes_database_is_refused(tmp_path, home, capsys,
                                                                  monkeypatch):
    runtime = tmp_path / "runtime.sqlite"
    monkeypatch.setenv("TILEDATTN_DB", str(runtime))
    for given in (str(runtime), f"{tmp_path}/./runtime.sqlite"):
        assert main([*SEARCH, "--backend", "simulated", "--db", given]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith("tiledtune search: --db ") and "the runtime reads" in line
    monkeypatch.delenv("TILEDATTN_DB")  # the user cache's database
    assert main([*SEARCH, "--backend", "simulated", "--db", str(home / "schedules.sqlite")]) == 2
    assert "the runtime reads" in capsys.readouterr().err
    assert not runtime.exists() and not (home / "schedules.sqlite").exists()


# -- the database's identity --------------------------------------------------------------------

def test_the_database_identity_is_stored_in_it_and_new_for_a_new_file(tmp_path):
    path = tmp_path / "s.sqlite"
    with dbmod.ScheduleDB(path, codecs=codecs()) as store:
        first = dbmod.database_identity(store)
    with dbmod.ScheduleDB(path, codecs=codecs()) as store:
        assert dbmod.database_identity(store) == first  # stored, not made per opening
    with dbmod.ScheduleDB(path, codecs=codecs(), read_only=True) as store:
        assert dbmod.database_identity(store) == first
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(path, copy)  # a copy is the same database (the rows say which study)
    with dbmod.ScheduleDB(copy, codecs=codecs()) as store:
        assert dbmod.database_identity(store) == first
    remove(path)
    with dbmod.ScheduleDB(path, codecs=codecs()) as store:
        assert dbmod.database_identity(store) != first  # made again at the same path
    connection = sqlite3.connect(path)
    with connection:
        connection.execute(f"DELETE FROM {dbmod.IDENTITY_TABLE}")
    connection.close()
    with dbmod.ScheduleDB(path, codecs=codecs(), read_only=True) as store:
        assert dbmod.database_identity(store) is None  # readers write nothing
    with dbmod.ScheduleDB(path, codecs=codecs()) as store:
        made = dbmod.database_identity(store)
        assert made not in (None, first) and dbmod.database_identity(store) == made


def test_an_older_database_gets_an_identity_when_migrated(tmp_path):
    from pathlib import Path

    path = tmp_path / "v3.db"
    shutil.copyfile(Path(__file__).parent / "assets" / "schedules_v3.db", path)
    with dbmod.ScheduleDB(path, codecs=codecs(), read_only=True) as store:
        assert dbmod.database_identity(store) is None  # read as it is
    with dbmod.ScheduleDB(path, codecs=codecs()) as store:  # migrated on opening for writing
        identity = dbmod.database_identity(store)
    connection = sqlite3.connect(path)
    assert connection.execute(f"SELECT identity FROM {dbmod.IDENTITY_TABLE}").fetchall() == [
        (identity,)]
    connection.close()
