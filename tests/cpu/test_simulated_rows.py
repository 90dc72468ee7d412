"""Commands that must not mislead the next one (issue 30, item 5): simulated rows stay out of the
database the runtime reads and are never exported as tuned; ``restamp`` creates no database;
``export``'s "nothing to export" names ``--source shipped``."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

import db
from tiledattention import FORWARD, Problem, Schedule, tooling
from tiledattention.tooling import codecs
from tuner import cli
from tuner.transfer import render_module

PROV = tooling.current_provenance(FORWARD)


def row(seqlen: int, *, backend: str = "gpu", ms: float = 1.0, device: str = "NVIDIA H100",
        tile_m: int = 64) -> db.ScheduleRow:
    problem = Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=seqlen, seqlen_k=seqlen,
                      head_dim=64, dtype="bf16", causal=False)
    return db.ScheduleRow(family="forward", arch="sm_90", device_name=device, problem=problem,
                          schedule=Schedule(tile_m=tile_m, tile_n=32), median_ms=ms,
                          spread_ms=0.0, tflops=1.0, trials=3, provenance=PROV, backend=backend)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A cache directory of the test's own: the runtime's database is
    ``home/tiledattention/schedules.sqlite``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEDATTN_DB", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path / "cache" / "tiledattention"


def rows_in(path: Path) -> list[db.ScheduleRow]:
    with db.ScheduleDB.open_for_lookup(path, codecs=codecs()) as store:
        return store.rows()


# -- import ------------------------------------------------------------------------------------
def test_simulated_rows_are_refused_by_the_database_the_runtime_reads(tmp_path, home, capsys):
    exported = tmp_path / "mixed.json"
    db.dump_rows([row(512, backend="simulated"), row(1024), row(2048, backend="simulated")],
                 exported)
    assert cli.main(["import", str(exported)]) == 1
    err = capsys.readouterr().err
    assert err.count("a simulated row") == 2, err
    assert f"--db {home / 'simulated-schedules.sqlite'}" in err
    assert [(r.problem.seqlen_q, r.backend) for r in rows_in(home / "schedules.sqlite")] == [
        (1024, "gpu")]


def test_a_simulated_only_import_creates_no_runtime_database(tmp_path, home, capsys):
    exported = tmp_path / "sim.json"
    db.dump_rows([row(512, backend="simulated")], exported)
    assert cli.main(["import", str(exported)]) == 1
    assert "a simulated row" in capsys.readouterr().err
    assert not home.exists() or not (home / "schedules.sqlite").exists()


def test_tiledattn_db_named_by_db_is_the_runtimes_database_too(tmp_path, home, monkeypatch,
                                                                capsys):
    runtime = tmp_path / "team.sqlite"
    monkeypatch.setenv("TILEDATTN_DB", str(runtime))
    exported = tmp_path / "sim.json"
    db.dump_rows([row(512, backend="simulated")], exported)
    assert cli.main(["import", "--db", str(tmp_path / "." / "team.sqlite"), str(exported)]) == 1
    assert "a simulated row" in capsys.readouterr().err
    assert not runtime.exists()


def test_another_database_takes_simulated_rows_marked_as_such(tmp_path, home):
    exported = tmp_path / "sim.json"
    db.dump_rows([row(512, backend="simulated")], exported)
    other = tmp_path / "experiments.sqlite"
    assert cli.main(["import", "--db", str(other), str(exported)]) == 0
    assert [r.backend for r in rows_in(other)] == ["simulated"]


# -- bytarget ----------------------------------------------------------------------------------
def test_bytarget_of_gpu_rows_is_titled_tuned_and_marks_nothing():
    text = render_module([row(512), row(1024)], source="x.sqlite")
    assert '"""Tuned tiledattention schedules' in text
    assert "SIMULATED" not in text and '"backend"' not in text


def test_bytarget_never_presents_simulated_rows_as_tuned(tmp_path, home, capsys):
    store = tmp_path / "sim.sqlite"
    with db.ScheduleDB(store, codecs=codecs()) as database:
        database.put(row(512, backend="simulated"))
    out = tmp_path / "sim.py"
    assert cli.main(["export", "--db", str(store), "-o", str(out)]) == 0
    text = out.read_text()
    assert "Tuned tiledattention schedules" not in text
    assert text.splitlines()[1].startswith("# SIMULATED: 1 of 1 rows")
    assert '"""SIMULATED tiledattention schedules' in text and "NOT" in text
    assert '"backend": "simulated"' in text
    compile(text, str(out), "exec")


def test_bytarget_prefers_a_gpu_row_and_counts_the_simulated_ones():
    rows = [row(512), row(512, backend="simulated", ms=0.1, device="Simulated GPU", tile_m=32),
            row(1024, backend="simulated")]
    text = render_module(rows, source="x.sqlite")
    scope: dict = {}
    exec(compile(text, "<module>", "exec"), scope)
    entries = {e["problem"]["seqlen_q"]: e for e in scope["SCHEDULES"]["forward"]["sm_90"]}
    measured, simulated = entries[512], entries[1024]
    assert measured["schedule"]["tile_m"] == 64 and "backend" not in measured  # the GPU row won
    assert simulated["backend"] == "simulated"
    assert "1 tuned on a GPU and 1 SIMULATED" in text
    assert "# SIMULATED: 2 of 3 rows" in text and '"""Tuned' not in text


# -- restamp and export ------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["--db", "default"])
def test_restamp_never_creates_a_database(tmp_path, home, capsys, where):
    missing = tmp_path / "none" / "schedules.sqlite"
    args = ["--db", str(missing)] if where == "--db" else []
    assert cli.main(["restamp", "--from", "HEAD", *args]) == 2
    err = capsys.readouterr().err
    target = missing if where == "--db" else home / "schedules.sqlite"
    assert err == f"tiledtune restamp: no schedule database at {target}: nothing to re-stamp " \
                  "(pass --db, or --file for a rows file such as " \
                  "tiledattention/pretuned/sm_90.json)\n"
    assert not target.exists() and not target.parent.exists()
    # and so export, next, finds no database and exports the shipped tables
    assert cli.main(["export", "-o", str(tmp_path / "rows.json")]) == 0


def test_restamp_of_current_rows_reads_and_writes_nothing(tmp_path, home, capsys, monkeypatch):
    """Nothing stale: the database is only read (a read-only one will do), never written."""
    store = tmp_path / "current.sqlite"
    with db.ScheduleDB(store, codecs=codecs()) as database:
        database.put(row(512))
    before = store.read_bytes()
    monkeypatch.setattr(db.ScheduleDB, "put", lambda *a, **k: pytest.fail("restamp wrote"))
    assert cli.main(["restamp", "--from", "HEAD", "--db", str(store)]) == 0
    assert "1 row(s) already current; re-stamped 0; 0 need re-tuning" in capsys.readouterr().out
    assert store.read_bytes() == before


def test_nothing_to_export_names_source_shipped(tmp_path, home, capsys):
    empty = tmp_path / "empty.sqlite"
    db.ScheduleDB(empty, codecs=codecs()).close()
    assert cli.main(["export", "--db", str(empty), "-o", str(tmp_path / "rows.json")]) == 1
    err = capsys.readouterr().err
    assert "nothing to export" in err and "--source shipped" in err, err
    assert cli.main(["export", "--db", str(empty), "--source", "shipped", "-o",
                     str(tmp_path / "rows.json")]) == 0
