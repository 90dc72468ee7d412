"""A tuned database that this process cannot write (issue 30, item 2): on a read-only mount, in
another user's directory, or a file without write permission. The runtime's lookup and the
read-only commands (``list``, ``export``, ``explain``) use it, with no warning and no fallback,
and leave it as they found it: the same bytes, still in WAL mode, no ``-wal``/``-shm`` created
beside it; a writer still puts the file in WAL mode.

What makes a file unwritable is tested three ways, because root (these tests often run as root)
passes every permission check but a read-only mount's:

- ``os.access`` answering "not writable" for the folder or the file (what a non-root user sees
  on a read-only directory or file, and everyone on a read-only mount), with the permissions
  set as well: runs everywhere; it tests the choice of the connection, and SQLite's own
  behaviour on the files (no ``-wal``/``-shm`` appear, a writer at work is seen, a ``-wal``
  without its ``-shm``);
- a real read-only bind mount in a private mount namespace (``unshare -m``): the kernel refuses
  every write, root included; skipped where this process may not mount;
- the CLI run as ``nobody`` on a 0444 file in a 0555 folder: skipped where Python cannot run as
  ``nobody`` (an interpreter under ``/root``).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import db
import tiledattention as ta
from tiledattention import FORWARD, DeviceInfo, Problem, Schedule, tooling
from tiledattention.tooling import codecs
from tuner import cli

ROOT = Path(__file__).resolve().parents[2]
H100 = DeviceInfo(index=0, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132)
PROBLEM = Problem(batch=1, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, head_dim=128,
                  dtype="bf16", causal=False)
TUNED = Schedule(tile_m=64, tile_n=32, occupancy=2)
LATER = Schedule(tile_m=32, tile_n=32)


def row(problem: Problem, schedule: Schedule) -> db.ScheduleRow:
    return db.ScheduleRow(family="forward", arch="sm_90", device_name=H100.name, problem=problem,
                          schedule=schedule, median_ms=1.0, spread_ms=0.0, tflops=1.0, trials=1,
                          provenance=tooling.current_provenance(FORWARD))


def tuned(path: Path) -> Path:
    """A database as the tuner leaves it: a GPU row for PROBLEM, written in WAL mode, the writer
    closed (SQLite checkpoints and removes the ``-wal``/``-shm`` then)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with db.ScheduleDB(path, codecs=codecs()) as store:
        store.put(row(PROBLEM, TUNED))
    assert path.read_bytes()[18:20] == b"\x02\x02"  # writers use WAL
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    return path


def deny_writes(monkeypatch, *paths: Path) -> None:
    """``os.access`` says W_OK is refused for ``paths`` and what lies under them, as it does for
    a non-root user on read-only permissions and for everyone on a read-only mount."""
    real = os.access
    denied = [p.resolve() for p in paths]

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK:
            target = Path(path).resolve()
            if any(target == d or d in target.parents for d in denied):
                return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def state(path: Path) -> tuple[bytes, list[str]]:
    return path.read_bytes(), sorted(p.name for p in path.parent.iterdir())


def lookup(path: Path) -> ta.Resolution:
    """The runtime's own lookup (``tiledattention.use_database``), warnings as errors: a
    database that cannot be read would be a RuntimeWarning and a default schedule."""
    ta.use_database(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return ta.runtime().resolution(FORWARD, PROBLEM, 0)


@pytest.fixture
def runtime(monkeypatch):
    """The process's runtime, restored afterwards; the device is an H100 (no GPU asked)."""
    import tiledattention.core._runtime as runtime_module

    monkeypatch.setattr(ta._runtime, "current", None)
    monkeypatch.setattr(runtime_module, "device_info", lambda index: H100)
    monkeypatch.setenv("COLUMNS", "200")


def read_with_every_reader(path: Path, tmp_path: Path, capsys) -> None:
    """The runtime, ``list``, ``export`` and ``explain`` each read ``path``'s row."""
    answer = lookup(path)
    assert (answer.source, answer.schedule) == ("exact-device", TUNED)
    capsys.readouterr()
    assert cli.main(["list", "--db", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "rows 1-1 of 1 schedules" in out and not err, err
    exported = tmp_path / "exported.json"
    assert cli.main(["export", "--db", str(path), "-o", str(exported)]) == 0
    assert [r.schedule for r in db.load_rows_file(exported, codecs())] == [TUNED]
    capsys.readouterr()
    assert cli.main(["explain", "--device", "sm_90", "--device-name", H100.name, "--db",
                     str(path), "--shape", "1,16,4096,128", "--causal", "no"]) == 0
    out, err = capsys.readouterr()
    assert "exact-device" in out and not err, err


@pytest.mark.parametrize("what", ["read-only directory", "read-only file"])
def test_readers_use_a_database_they_cannot_write(tmp_path, monkeypatch, capsys, runtime, what):
    folder = tmp_path / "deployed"
    path = tuned(folder / "schedules.sqlite")
    locked = folder if what == "read-only directory" else path
    before = state(path)
    locked.chmod(0o555 if locked.is_dir() else 0o444)
    deny_writes(monkeypatch, locked)
    try:
        read_with_every_reader(path, tmp_path, capsys)
        assert state(path) == before  # same bytes (still WAL), no -wal/-shm created
    finally:
        locked.chmod(0o755 if locked.is_dir() else 0o644)


def test_a_writer_at_work_is_seen_by_a_reader_that_cannot_write(tmp_path, monkeypatch, runtime):
    """A writer keeps its ``-wal``/``-shm`` while it runs: the reader reads them (its newest
    commit, still only in the ``-wal``), without writing them."""
    path = tuned(tmp_path / "deployed" / "schedules.sqlite")
    writer = sqlite3.connect(path)  # holds the -wal and -shm open, checkpoints nothing
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("SELECT count(*) FROM schedules").fetchall()  # opens the -wal and -shm
    try:
        with db.ScheduleDB(path, codecs=codecs()) as store:
            store.put(row(PROBLEM, LATER), force=True)
        assert Path(f"{path}-wal").stat().st_size > 0
        before = state(path)
        deny_writes(monkeypatch, path.parent)
        assert lookup(path).schedule == LATER
        assert state(path) == before
    finally:
        writer.close()


def test_a_wal_without_its_shm_is_read_as_of_its_last_checkpoint_with_one_warning(tmp_path,
                                                                                   monkeypatch):
    """A ``-wal`` whose ``-shm`` is gone (a writer that died, a copy of a live database) cannot
    be read without write access: the reader says so once and reads the checkpointed file."""
    live = tuned(tmp_path / "live" / "schedules.sqlite")
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("SELECT count(*) FROM schedules").fetchall()  # opens the -wal and -shm
    try:
        with db.ScheduleDB(live, codecs=codecs()) as store:
            store.put(row(PROBLEM, LATER), force=True)
        copy = tmp_path / "copied" / "schedules.sqlite"
        copy.parent.mkdir()
        shutil.copyfile(live, copy)
        shutil.copyfile(f"{live}-wal", f"{copy}-wal")
    finally:
        writer.close()
    before = state(copy)
    deny_writes(monkeypatch, copy.parent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with db.ScheduleDB.open_for_lookup(copy, codecs=codecs()) as store:
            assert [r.schedule for r in store.rows()] == [TUNED]
            assert [r.schedule for r in store.rows()] == [TUNED]
    told = [str(w.message) for w in caught if "-wal" in str(w.message)]
    assert len(told) == 1 and str(copy) in told[0] and "last checkpoint" in told[0], told
    assert state(copy) == before


def test_a_writable_database_is_read_through_a_writers_wal_and_written_in_wal_mode(tmp_path):
    """Where the reader could write, it reads a writer's ``-wal`` (``mode=ro``) while there is
    one, and the file as it is (``immutable``, nothing made beside it) when there is none; a
    writer opening a file leaves it in WAL mode."""
    path = tuned(tmp_path / "schedules.sqlite")
    uri, immutable = db._engine.read_only_uri(path)
    assert immutable and uri.endswith("?mode=ro&immutable=1")
    writer = sqlite3.connect(path)
    writer.execute("SELECT count(*) FROM schedules").fetchall()  # opens the -wal and -shm
    try:
        uri, immutable = db._engine.read_only_uri(path)
        assert not immutable and uri.endswith("?mode=ro")
    finally:
        writer.close()
    with db.ScheduleDB(path, codecs=codecs()) as store:
        store.put(row(PROBLEM, LATER), force=True)
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_readers_write_nothing_beside_a_writable_database(tmp_path, monkeypatch, capsys,
                                                          runtime):
    """Issue 45: ``list``, ``explain``, ``export`` and the runtime's lookup left ``-wal`` and
    ``-shm`` files beside a database they could write (SQLite's ``mode=ro`` makes them on a WAL
    file and cannot remove them); the README says readers write nothing beside it."""
    path = tuned(tmp_path / "deployed" / "schedules.sqlite")
    before = state(path)
    read_with_every_reader(path, tmp_path, capsys)
    assert state(path) == before  # the folder holds the database file alone


# -- the kernel's and the operating system's own refusals --------------------------------------
def _run(args: list[str], tmp_path: Path, *, user: int | None = None,
         namespace: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "200"}
    env.pop("TILEDATTN_DB", None)
    command = [sys.executable, *args]
    if namespace is not None:  # a shell line that mounts, then runs the command
        command = ["unshare", "-m", "sh", "-c", namespace + ' && exec "$@"', "sh", *command]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, user=user)


_READERS = [
    ["-m", "tuner.cli", "list", "--db", "{db}"],
    ["-m", "tuner.cli", "export", "--db", "{db}", "-o", "{out}"],
    ["-m", "tuner.cli", "explain", "--device", "sm_90", "--device-name", H100.name, "--db",
     "{db}", "--shape", "1,16,4096,128", "--causal", "no"],
    ["-W", "error::RuntimeWarning", "-c",
     "import sys, tiledattention as ta, tiledattention.core._runtime as r; "
     "from tiledattention import DeviceInfo, FORWARD, Problem; "
     "r.device_info = lambda i: DeviceInfo(index=0, arch='sm_90', name=sys.argv[2], "
     "sm_count=132); ta.use_database(sys.argv[1]); "
     "p = Problem(batch=1, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, "
     "head_dim=128, dtype='bf16', causal=False); "
     "print('source', ta.runtime().resolution(FORWARD, p, 0).source)", "{db}", H100.name],
]


def _check_readers(path: Path, out: Path, tmp_path: Path, *, seen: Path | None = None,
                   **how) -> None:
    """Every reader of ``_READERS`` reads ``path``; ``seen`` (default: ``path``) is where this
    process sees the same file, unchanged afterwards."""
    seen = seen or path
    before = state(seen)
    for args in _READERS:
        done = _run([a.format(db=path, out=out) for a in args], tmp_path, **how)
        text = done.stdout + done.stderr
        assert done.returncode == 0 and "Traceback" not in text and "warning" not in \
            text.lower(), (args, text)
        assert "rows 1-1 of 1" in text or "wrote 1 row" in text or "exact-device" in text, text
    assert state(seen) == before


@pytest.mark.slow  # real processes
def test_readers_use_a_database_on_a_read_only_mount(tmp_path):
    source = tuned(tmp_path / "image" / "schedules.sqlite").parent
    mount = tmp_path / "mnt"
    mount.mkdir()
    line = (f"mount --bind {source} {mount} && mount -o remount,bind,ro {mount} && "
            f"! touch {mount}/probe 2>/dev/null")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", line], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot make a read-only bind mount here (needs unshare -m and mount)")
    _check_readers(mount / "schedules.sqlite", tmp_path / "out.json", tmp_path,
                   seen=source / "schedules.sqlite", namespace=line)


def _nobody() -> int:
    try:
        done = subprocess.run([sys.executable, "-c", "import tuner.cli"], cwd=ROOT,
                              user=65534, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        done = None
    if os.geteuid() != 0 or done is None or done.returncode != 0:
        pytest.skip("needs root that can start Python as nobody")
    return 65534


@pytest.mark.slow  # real processes
def test_readers_use_another_users_read_only_database(tmp_path):
    user = _nobody()
    folder = tmp_path / "deployed"
    path = tuned(folder / "schedules.sqlite")
    path.chmod(0o444)
    folder.chmod(0o555)
    tmp_path.chmod(0o777)
    try:
        _check_readers(path, tmp_path / "out.json", tmp_path, user=user)
    finally:
        folder.chmod(0o755)
