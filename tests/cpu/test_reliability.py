"""The schedule database's reliability cases (docs/reliability.md), on real SQLite files and
real processes: the CLI runs in subprocesses with a cache directory of its own."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

import db
import tiledattention as ta
from tiledattention import tooling
from tiledattention import FORWARD, DeviceInfo, Problem, Schedule
from tiledattention.tooling import Resolver, codecs

ROOT = Path(__file__).resolve().parents[2]
H100 = DeviceInfo(index=0, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132)
PROV = tooling.current_provenance(FORWARD)


def cli(tmp: Path, *args: str, user: int | None = None) -> tuple[int, str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "COLUMNS": "200"}
    env.pop("TILEDATTN_DB", None)
    done = subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300,
                          user=user)
    return done.returncode, done.stdout + done.stderr


def search(tmp: Path, *extra: str, user: int | None = None) -> tuple[int, str]:
    return cli(tmp, "search", "--device", "sm_90", "--backend", "simulated", "--shape",
               "1,8,512,64", "--trials", "3", "--patience", "0", *extra, user=user)


def problem(s: int = 4096, **changes) -> Problem:
    fields = dict(batch=1, heads_q=16, heads_kv=16, seqlen_q=s, seqlen_k=s, head_dim=128,
                  dtype="bf16", causal=False)
    return Problem(**{**fields, **changes})


def row(p: Problem, schedule: Schedule = Schedule(tile_m=32, tile_n=32), *, ms: float = 1.0,
        device: str = "Other GPU", **extra) -> db.ScheduleRow:
    return db.ScheduleRow(family="forward", arch="sm_90", device_name=device, problem=p,
                          schedule=schedule, median_ms=ms, spread_ms=0.0, tflops=1.0, trials=1,
                          provenance=PROV, **{"default_ms": ms * 1.2, **extra})


def resolver(path: Path, shipped=None) -> Resolver:
    return Resolver(open_user=lambda: db.ScheduleDB.open_for_lookup(path, codecs=codecs()),
                    open_shipped=lambda arch: shipped)


# -- 1: import never destroys rows the runtime uses ----------------------------------------------
@pytest.mark.slow  # real processes
def test_importing_stale_rows_keeps_the_current_ones(tmp_path):
    store = str(tmp_path / "s.sqlite")
    assert search(tmp_path, "--db", store, "--dtype", "bf16,fp16", "--causal", "yes,no")[0] == 0
    assert cli(tmp_path, "export", "--db", store, "-o", str(tmp_path / "rows.json"))[0] == 0
    data = json.loads((tmp_path / "rows.json").read_text())
    for item in data["rows"]:
        item["provenance"]["template_hash"] = "0123456789ab"
        item["median_ms"] *= 5
    (tmp_path / "old.json").write_text(json.dumps(data))
    code, out = cli(tmp_path, "import", "--db", store, str(tmp_path / "old.json"))
    assert code == 0 and out.count("skipped: the runtime would ignore it") == 4, out
    with db.ScheduleDB.open_for_lookup(store, codecs=codecs()) as database:
        rows = database.rows()
    assert len(rows) == 4
    assert all(r.provenance.template_hash == FORWARD.template_identity() for r in rows)


# -- 2: simulated measurements stay out of what the runtime reads --------------------------------
@pytest.mark.slow  # real processes
def test_simulated_search_without_db_leaves_the_user_database_alone(tmp_path):
    code, out = search(tmp_path)
    assert code == 0, out
    cache = tmp_path / "cache" / "tiledattention"
    assert not (cache / "schedules.sqlite").exists()
    assert "simulated-schedules.sqlite" in out and "never reads" in out
    with db.ScheduleDB.open_for_lookup(cache / "simulated-schedules.sqlite",
                                       codecs=codecs()) as database:
        assert [r.backend for r in database.rows()] == ["simulated"]


def test_the_lookup_and_the_shipped_loader_ignore_simulated_rows(tmp_path):
    path = tmp_path / "named.sqlite"
    with db.ScheduleDB(path, codecs=codecs()) as store:
        store.put(row(problem(), device=H100.name, backend="simulated"))
    assert resolver(path)(FORWARD, problem(), H100).source == "default"
    shipped = ta.shipped_table("sm_90")
    text = json.dumps({"format": 3, "rows": [
        row(problem(), backend="simulated").to_dict(), list(shipped)[0].to_dict()]})
    from tiledattention.core._lookup import _shipped_rows

    assert [r.backend for r in _shipped_rows(text, "test")] == ["gpu"]


# -- 3: exact before nearest, nearest across sources ---------------------------------------------
def test_an_exact_shipped_row_wins_over_a_nearest_user_row(tmp_path):
    path = tmp_path / "user.sqlite"
    shipped_row = row(problem(4096), Schedule(tile_m=128), device=H100.name)
    with db.ScheduleDB(path, codecs=codecs()) as store:
        store.put(row(problem(4000), Schedule(tile_m=64)))
    shipped = db.RowTable([shipped_row], source="shipped", codecs=codecs())
    answer = resolver(path, shipped)(FORWARD, problem(4096), H100)
    assert (answer.source, answer.schedule) == ("shipped", Schedule(tile_m=128))


def test_the_nearest_row_is_the_closest_of_both_sources(tmp_path):
    path = tmp_path / "user.sqlite"
    with db.ScheduleDB(path, codecs=codecs()) as store:
        store.put(row(problem(1024), Schedule(tile_m=64)))
    shipped = db.RowTable([row(problem(8192), Schedule(tile_m=128))], source="shipped",
                          codecs=codecs())
    near_shipped = resolver(path, shipped)(FORWARD, problem(6000), H100)
    assert (near_shipped.source, near_shipped.schedule) == ("nearest", Schedule(tile_m=128))
    assert "shipped" in near_shipped.detail
    near_user = resolver(path, shipped)(FORWARD, problem(1200), H100)  # within nearest_limit
    assert (near_user.source, near_user.schedule) == ("nearest", Schedule(tile_m=64))
    assert str(path) in near_user.detail


# -- 5: database problems are one line, checked first, and leave the file alone ------------------
def _good(tmp: Path) -> Path:
    path = tmp / "good.sqlite"
    with db.ScheduleDB(path, codecs=codecs()) as store:
        for s in range(300):
            store.put(row(problem(100 + s)))
    return path


def _corrupt_index(tmp: Path) -> str:
    path = tmp / "index.sqlite"
    shutil.copyfile(_good(tmp), path)
    connection = sqlite3.connect(path)
    page = connection.execute("PRAGMA page_size").fetchone()[0]
    root = connection.execute("SELECT rootpage FROM sqlite_master "
                              "WHERE name = 'ix_schedules_lookup'").fetchone()[0]
    connection.close()
    data = bytearray(path.read_bytes())
    start = (root - 1) * page + 8  # past the b-tree page header's first bytes
    data[start:start + 64] = bytes(range(64))
    path.write_bytes(bytes(data))
    return str(path)


def _newer(tmp: Path) -> str:
    path = tmp / "newer.sqlite"
    shutil.copyfile(_good(tmp), path)
    connection = sqlite3.connect(path)
    connection.execute("UPDATE tiledattention_schema_version SET version_num = '0099'")
    connection.commit()
    connection.close()
    return str(path)


def _foreign(tmp: Path) -> str:
    path = tmp / "foreign.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE notes (x TEXT)")
    connection.commit()
    connection.close()
    return str(path)


def _random(tmp: Path) -> str:
    path = tmp / "random.sqlite"
    path.write_bytes(bytes((i * 7919) % 251 for i in range(8192)))
    return str(path)


def _truncated(tmp: Path) -> str:
    path = tmp / "truncated.sqlite"
    path.write_bytes(_good(tmp).read_bytes()[:6000])
    return str(path)


def _directory(tmp: Path) -> str:
    (tmp / "dir.sqlite").mkdir()
    return str(tmp / "dir.sqlite")


BAD = {"directory": _directory, "bogus URL": lambda tmp: "bogus://x",
       "unreachable PostgreSQL": lambda tmp: "postgresql+psycopg://u:p@127.0.0.1:9/none",
       "random bytes": _random, "truncated": _truncated, "foreign SQLite": _foreign,
       "corrupt index page": _corrupt_index, "newer schema": _newer}


@pytest.mark.slow  # real processes
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_database_problem_is_one_line_before_tuning_and_leaves_the_file(tmp_path, case):
    location = BAD[case](tmp_path)
    path = Path(location)
    before = path.read_bytes() if path.is_file() else None
    commands = [["search"], ["import", str(tmp_path / "x.json")]]
    db.dump_rows([row(problem())], tmp_path / "x.json")
    if case != "newer schema":  # a newer schema can still be read
        commands.append(["list"])
    for command in commands:
        if command == ["search"]:
            code, out = search(tmp_path, "--db", location)
        else:
            code, out = cli(tmp_path, *command, "--db", location)
        assert code == 2, (command, out)
        assert "Traceback" not in out
        lines = [line for line in out.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"tiledtune {command[0]}: "), out
        if before is not None:
            assert path.read_bytes() == before, command
            assert not list(tmp_path.glob(path.name + "-*")), command  # no -wal / -shm
        assert not (tmp_path / "tiledtune-studies.sqlite").exists()  # nothing tuned


def _unprivileged() -> int | None:
    """Who to run as so that file permissions apply: ``None`` (this user) unless root, else
    nobody (65534); skips when this machine cannot start Python as nobody."""
    if os.geteuid() != 0:
        return None
    try:
        done = subprocess.run([sys.executable, "-c", "import tuner.cli"], cwd=ROOT,
                              user=65534, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        done = None
    if done is None or done.returncode != 0:
        pytest.skip("root ignores file permissions, and Python cannot run as nobody here")
    return 65534


@pytest.mark.slow  # real processes
def test_a_read_only_database_is_refused_before_tuning(tmp_path):
    user = _unprivileged()
    path = _good(tmp_path)
    path.chmod(0o444)
    before = path.read_bytes()
    if user is not None:
        for folder in (tmp_path, tmp_path / "cache"):
            folder.mkdir(exist_ok=True)
            folder.chmod(0o777)
    code, out = search(tmp_path, "--db", str(path), user=user)
    assert code == 2 and "read-only" in out and "Traceback" not in out, out
    assert path.read_bytes() == before


@pytest.mark.slow  # real processes
def test_one_malformed_time_skips_its_row_not_the_listing(tmp_path):
    path = _good(tmp_path)
    connection = sqlite3.connect(path)
    connection.execute("UPDATE schedules SET created_at = 'yesterday' WHERE id = 1")
    connection.commit()
    connection.close()
    code, out = cli(tmp_path, "list", "--db", str(path), "--limit", "5")
    assert code == 0 and "Traceback" not in out, out
    assert "yesterday" in out and "rows 1-4 of 300" in out


# -- 7: cost independent of database size ------------------------------------------------------
def _fill(path: Path, count: int) -> list[Problem]:
    """``count`` rows spread like a real database (dtypes, masks, head dims, GQA, lengths)."""
    codec = FORWARD.codec()
    problems = []
    from db._encode import row_values

    with db.ScheduleDB(path, codecs=codecs()):
        pass
    records = []
    for i in range(count):
        p = Problem(batch=1 + i % 5, heads_q=32, heads_kv=(32, 8)[i % 2], seqlen_q=64 + i,
                    seqlen_k=64 + i, head_dim=(64, 128, 256)[i % 3], dtype=("bf16", "fp16")[
                        i // 6 % 2], causal=bool(i // 12 % 2))
        problems.append(p)
        records.append(row_values(row(p), codec))
    columns = list(records[0])
    connection = sqlite3.connect(path)
    connection.executemany(
        f"INSERT INTO schedules ({', '.join(columns)}) VALUES "
        f"({', '.join('?' for _ in columns)})",
        [[r[c].isoformat(" ") if c == "created_at" else r[c] for c in columns] for r in records])
    connection.commit()
    connection.close()
    return problems


@pytest.mark.slow
def test_lookup_and_list_cost_does_not_grow_with_50k_rows(tmp_path):
    path = tmp_path / "big.sqlite"
    problems = _fill(path, 50_000)
    resolve = resolver(path)
    assert resolve(FORWARD, problems[123], H100).source == "exact-arch"  # opens the database
    times = []
    for s in range(20):  # shapes nobody tuned, near tuned ones: the nearest step, every time
        start = time.perf_counter()
        answer = resolve(FORWARD, problem(30_000 + 7 * s, head_dim=128, heads_q=32,
                                          heads_kv=8), H100)
        times.append((time.perf_counter() - start) * 1e3)
        assert answer.source == "nearest"
    assert statistics.median(times) <= 20, times
    start = time.perf_counter()
    code, out = cli(tmp_path, "list", "--db", str(path))
    seconds = time.perf_counter() - start
    assert code == 0 and "rows 1-50 of 50000" in out, out
    assert seconds <= 2.0, seconds
