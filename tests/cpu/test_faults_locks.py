"""A schedule database another process holds locked (issue 45, point 2): ``import`` and
``search`` wait a few seconds at most (``$TILEDATTN_LOCK_WAIT`` to change it), then say in one
line which file is locked, by which process and what to do, exit status 2; a Ctrl-C during the
wait ends the command at once (before: 8 x 30 s of silence, then a traceback).

The lock is SQLite's own, held by another process (``BEGIN EXCLUSIVE`` on the file, as a
``sqlite3`` shell or another tool would); the commands run as processes of their own, so that a
command that would wait minutes fails the test at its timeout instead of hanging it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import db
from db._errors import DatabaseLocked
from tiledattention import FORWARD, Problem, Schedule
from tiledattention.tooling import codecs, current_provenance
from tuner import cli

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=512, seqlen_k=512, head_dim=64,
                  dtype="bf16", causal=False)


def _row(median_ms: float = 0.05) -> db.ScheduleRow:
    return db.ScheduleRow(family="forward", arch="sm_90", device_name="NVIDIA H100 80GB HBM3",
                          problem=PROBLEM, schedule=Schedule(), median_ms=median_ms,
                          spread_ms=0.001, tflops=100.0, trials=4,
                          provenance=current_provenance(FORWARD))


@pytest.fixture
def tuned(tmp_path) -> Path:
    path = tmp_path / "team.sqlite"
    with db.ScheduleDB(path, codecs=codecs()) as store:
        store.put(_row())
    return path


@pytest.fixture
def holder(tuned):
    """Another process holding ``tuned``'s write lock (``BEGIN EXCLUSIVE``) until the test
    ends."""
    script = ("import sqlite3, sys, time\n"
              "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "c.execute('BEGIN EXCLUSIVE')\n"
              "print('held', flush=True)\n"
              "time.sleep(120)\n")
    process = subprocess.Popen([sys.executable, "-c", script, str(tuned)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait()


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "200"}
    env.pop("TILEDATTN_DB", None)
    env.pop("TILEDATTN_LOCK_WAIT", None)
    env.update(extra)
    return env


def _tiledtune(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, str, float]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, env=_env(tmp_path, **env), timeout=60)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def _exported(tuned: Path, tmp_path: Path) -> Path:
    out = tmp_path / "rows.json"
    assert cli.main(["export", "--db", str(tuned), "-o", str(out)]) == 0
    return out


def _one_line_about_the_lock(err: str, tuned: Path, holder) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(tuned) in lines[0] and "locked by another process" in lines[0], err
    assert f"pid {holder.pid}" in lines[0], err  # who holds it, read from /proc/locks
    assert "TILEDATTN_LOCK_WAIT" in lines[0], err  # what to do


@pytest.mark.slow  # a process waiting the default bound (4 s)
def test_import_into_a_locked_database_gives_up_in_seconds_with_one_line(tuned, tmp_path,
                                                                         holder, capsys):
    rows = _exported(tuned, tmp_path)
    code, out, err, seconds = _tiledtune(tmp_path, "import", "--db", str(tuned), str(rows))
    assert code == 2 and seconds < 10, (code, seconds, err)
    assert err.startswith("tiledtune import: "), err
    _one_line_about_the_lock(err, tuned, holder)


@pytest.mark.slow  # a process
def test_search_on_a_locked_database_gives_up_after_the_wait_it_was_given(tuned, tmp_path,
                                                                          holder):
    code, out, err, seconds = _tiledtune(
        tmp_path, "search", "--device", "sm_90", "--backend", "simulated", "--shape",
        "1,8,512,64", "--trials", "3", "--db", str(tuned), TILEDATTN_LOCK_WAIT="1")
    assert code == 2 and seconds < 10, (code, seconds, err)
    assert err.startswith("tiledtune search: ") and "waiting 1." in err, err
    _one_line_about_the_lock(err, tuned, holder)


def _waiting(process: subprocess.Popen, path: Path, timeout: float = 30) -> None:
    """Until ``process`` has ``path`` open (it is past its imports and at the lock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            links = {os.readlink(f"/proc/{process.pid}/fd/{fd}")
                     for fd in os.listdir(f"/proc/{process.pid}/fd")}
        except OSError:
            links = set()
        if str(path.resolve()) in links:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    pytest.fail(f"the command did not open {path} within {timeout} s")


@pytest.mark.slow  # a process
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/PID/fd")
def test_ctrl_c_ends_a_wait_for_a_lock_within_a_second(tuned, tmp_path, holder):
    rows = _exported(tuned, tmp_path)
    # the command as a user's shell starts it, SIGINT at its default: a test run started as a
    # background job (SIGINT ignored, which a child inherits and tiledtune keeps, as it must
    # for background jobs) would otherwise test a Ctrl-C that cannot reach the command
    process = subprocess.Popen([sys.executable, "-m", "tuner.cli", "import", "--db", str(tuned),
                                str(rows)], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env=_env(tmp_path, TILEDATTN_LOCK_WAIT="60"),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _waiting(process, tuned)
        time.sleep(0.7)  # well into the wait
        start = time.monotonic()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
        seconds = time.monotonic() - start
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130 and "Traceback" not in err, err
    assert seconds < 1.5, seconds


def test_a_store_names_the_lock_holder_after_the_wait_it_was_given(tuned, holder):
    """The database layer itself: a write waits ``lock_wait_s``, then ``DatabaseLocked`` (a
    ``DatabaseUnavailable``, which ``tiledtune`` reports as one line) naming the holder."""
    with db.ScheduleDB(tuned, codecs=codecs(), read_only=True) as reader:  # reads still work
        assert len(reader.rows()) == 1
    start = time.monotonic()
    with pytest.raises(DatabaseLocked, match=f"pid {holder.pid}"):
        db.ScheduleDB(tuned, codecs=codecs(), lock_wait_s=0.5)
    assert time.monotonic() - start < 3
    assert issubclass(DatabaseLocked, db.DatabaseUnavailable)


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_a_bad_lock_wait_setting_is_one_line_naming_it(tuned, tmp_path, monkeypatch, capsys,
                                                       value):
    rows = _exported(tuned, tmp_path)
    monkeypatch.setenv("TILEDATTN_LOCK_WAIT", value)
    capsys.readouterr()
    assert cli.main(["import", "--db", str(tuned), str(rows)]) == 2
    err = capsys.readouterr().err
    assert "TILEDATTN_LOCK_WAIT must be a number of seconds >= 0" in err and repr(value) in err
    assert len(err.strip().splitlines()) == 1, err


def test_lock_wait_is_checked():
    for bad in (-1, float("nan"), "5", True):
        with pytest.raises(db.DatabaseArgumentError, match="lock_wait_s"):
            db.ScheduleDB("sqlite://", lock_wait_s=bad)
