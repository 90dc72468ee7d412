"""Ctrl-C ends any search within 3 s: one line on standard error, no compile process, tileiras
or worker left behind, and the same command resumes the study (issue 19, item 4).

The searches run as ``tiledtune`` subprocesses in sessions of their own; the Ctrl-C is sent as a
terminal sends it, to the whole process group. Processes are read from ``/proc`` (psutil is not
a dependency), so these tests need Linux.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import optuna
import pytest

from tuner.measure import CompilePool, interrupts_held

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


# -- processes, from /proc ---------------------------------------------------------------------
def _processes() -> dict[int, tuple[int, str, str, str]]:
    """pid -> (parent pid, state, start time, command line)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        found[int(entry)] = (int(fields[1]), fields[0], fields[19], cmdline)
    return found


def _descendants(root: int) -> dict[int, tuple[str, str]]:
    """pid -> (start time, command line) of every live descendant of ``root``."""
    table = _processes()
    found: dict[int, tuple[str, str]] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, state, start, cmdline) in table.items():
            if ppid == parent and pid not in found and state != "Z":
                found[pid] = (start, cmdline)
                frontier.append(pid)
    return found


def _still_running(snapshot: dict[int, tuple[str, str]]) -> list[str]:
    """The processes of ``snapshot`` still alive (the same pid and start time; not a zombie)."""
    table = _processes()
    return [f"{pid}: {cmdline[:120]}" for pid, (start, cmdline) in snapshot.items()
            if pid in table and table[pid][2] == start and table[pid][1] != "Z"]


def _wait_for(condition, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _env(tmp_path: Path) -> dict[str, str]:
    """cuTile's compile cache and temporary files under ``tmp_path``: every compile of the first
    run starts tileiras, and nothing is left in the user's cache."""
    return dict(os.environ, CUDA_TILE_CACHE_DIR=str(tmp_path / "cutile-cache"),
                CUDA_TILE_TEMP_DIR=str(tmp_path / "cutile-tmp"))


def _as_from_a_terminal() -> None:
    """A child's signal state as a shell gives it: SIGINT and SIGTERM at their defaults and
    unblocked, whatever the test process's own state (earlier tests of a long run may leave
    it otherwise)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


@pytest.fixture(autouse=True)
def _terminal_signals():
    """This process's SIGINT as an interactive Python's: the default handler, unblocked."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGINT, previous)


def _interrupt(argv: list[str], tmp_path: Path, ready) -> tuple[float, str, dict]:
    """Start ``tiledtune argv``; once ``ready(descendants)`` holds, Ctrl-C it. Returns the
    seconds it took to exit, its standard error, and the processes it had started."""
    child = subprocess.Popen([sys.executable, "-m", "tuner.cli", *argv], cwd=ROOT,
                             env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True,
                             preexec_fn=_as_from_a_terminal)
    seen: dict = {}  # the processes of the poll that found the search ready

    def going() -> bool:
        if child.poll() is not None:
            return True
        descendants = _descendants(child.pid)
        if ready(descendants):
            seen.update(descendants)
            return True
        return False

    try:
        _wait_for(going, 120, "the search to get going")
        assert child.poll() is None, child.communicate()
        # what ran when it was ready (a compile may end between two polls) and what runs now
        # (a process of both keeps what the ready poll read: its command line may be gone now)
        started = {**_descendants(child.pid), **seen}
        sent = time.monotonic()
        os.killpg(child.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        _, err = child.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 130, err
    return took, err, started


def _check_interrupted(took: float, err: str, started: dict) -> None:
    assert took < 3, f"took {took:.1f} s to stop"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    about = [line for line in err.splitlines() if "interrupt" in line.lower()]
    assert len(about) == 1 and "run the same command again to resume" in about[0], err
    end = time.monotonic() + 2  # killed at once; an orphan's reaper may take a moment
    while _still_running(started) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _still_running(started)


def _tileiras_running(descendants: dict) -> bool:
    return any("tileiras" in cmdline.split(" ")[0] for _, cmdline in descendants.values())


@pytest.mark.slow  # real compiles: about 20 s on two cores
def test_ctrl_c_ends_a_compile_only_search_and_it_resumes(tmp_path):
    argv = ["search", "--compile-only", "--device", "sm_121", "--shape", "1,4,256,64",
            "--space", "compact", "--trials", "2", "--jobs", "2", "--db",
            str(tmp_path / "schedules.sqlite")]
    took, err, started = _interrupt(argv, tmp_path, _tileiras_running)
    assert _tileiras_running(started)  # it was interrupted mid-compile
    _check_interrupted(took, err, started)
    print(f"compile-only: stopped {took:.2f} s after the Ctrl-C")

    again = subprocess.run([sys.executable, "-m", "tuner.cli", *argv, "--json"], cwd=ROOT,
                           env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    (key,) = json.loads(again.stdout)["keys"]
    assert key["candidates"] == 2 and key["compiled"] + key["failed"] == 2


def _complete_trials(path: Path) -> int:
    """Finished trials with a value, read without creating anything (the search may not have
    made its tables yet)."""
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as db:
            return db.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.Error:  # no tables yet, or locked for a moment
        return 0


def _measured(storage: str) -> int:
    from tuner.search._trials import measured_trials

    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    return measured_trials(study)


def test_ctrl_c_ends_a_gpu_search_and_the_same_command_resumes_it(tmp_path):
    """The GPU path (isolated worker, driver, study) on the simulated backend: after the Ctrl-C
    the interrupted trial's ticket is back, and the second run measures the rest of the budget
    exactly."""
    studies = tmp_path / "tiledtune-studies.sqlite"
    storage = f"sqlite:///{studies}"
    argv = ["search", "--backend", "simulated", "--device", "sm_90", "--shape", "1,8,1024,64",
            "--space", "compact", "--trials", "12", "--patience", "0", "--db",
            str(tmp_path / "schedules.sqlite")]

    def measuring(descendants) -> bool:  # the worker is up and a few trials are done
        return (any("spawn_main" in c for _, c in descendants.values())
                and _complete_trials(studies) >= 2)

    took, err, started = _interrupt(argv, tmp_path, measuring)
    _check_interrupted(took, err, started)
    print(f"simulated GPU search: stopped {took:.2f} s after the Ctrl-C")
    before = _measured(storage)
    assert 2 <= before < 12
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert optuna.trial.TrialState.RUNNING not in states  # the interrupted one was given back

    again = subprocess.run([sys.executable, "-m", "tuner.cli", *argv, "--json"], cwd=ROOT,
                           env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    (key,) = json.loads(again.stdout)["keys"]
    assert key["measured"] == 12 - before  # resumed: only the rest of the budget
    assert _measured(storage) == 12


# -- the pieces -----------------------------------------------------------------------------
def _run_a_child(marker: str) -> int:
    """A compile job's stand-in: starts a child (as cuTile starts tileiras) and waits on it."""
    return subprocess.run([sys.executable, "-c", "import time; time.sleep(60)", marker]).returncode


def test_killing_the_compile_pool_kills_what_its_workers_started(tmp_path):
    marker = f"tiledtune-test-{os.getpid()}-{time.monotonic_ns()}"
    pool = CompilePool(2)
    future = pool.submit(_run_a_child, marker)

    def sleeping() -> dict:
        return {pid: v for pid, v in _descendants(os.getpid()).items() if marker in v[1]}

    children = _wait_for(sleeping, 60, "the job's child process")
    workers = _descendants(os.getpid())
    # CPython's pool internals (3.11): the thread that manages it and the pipe that wakes it
    manager, wakeup = pool._executor_manager_thread, pool._executor_manager_thread_wakeup
    start = time.monotonic()
    pool.kill()
    assert time.monotonic() - start < 2
    # kill() returns once that thread has closed the pipe: at exit Python writes to every open
    # one, unlocked, and a pipe closed meanwhile printed an OSError traceback (CI, once)
    assert not manager.is_alive() and wakeup._closed
    assert _wait_for(lambda: not _still_running(children) or None, 2, "the child to die")
    assert _wait_for(lambda: not _still_running(
        {p: v for p, v in workers.items() if "spawn_main" in v[1]}) or None, 2, "the workers")
    with pytest.raises(BrokenProcessPool):
        future.result(timeout=5)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_ctrl_c_while_children_start_is_raised_after_the_block():
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers live in the main thread")
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # a handler would run here, half-way through starting a child
            reached_the_end = True
    assert reached_the_end
