"""A second signal during the cleanup of an interrupted search: a second Ctrl-C (users press it
when the first seems slow) or a SIGTERM (a supervisor stopping the job) must not cut the cleanup
short. Whatever the pair, the search exits with the first signal's status (130 for a Ctrl-C, 143
for a SIGTERM), prints no traceback, leaves no process behind and holds no trial RUNNING.

``tiledtune search --backend simulated`` runs as a subprocess in a session of its own, as in
``test_interrupt.py``. The second signal is sent once the first has been taken: the moment the
search's handler has set both signals to "ignored" (read from ``/proc/<pid>/status``), which
is when its cleanup starts (``tuner._signals``); a search whose handler never does that fails
here too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from .test_interrupt import (ROOT, _as_from_a_terminal, _complete_trials, _descendants, _env,
                             _still_running, _wait_for)
from .test_interrupt import _terminal_signals  # noqa: F401 - this module's SIGINT, autouse

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")

_BOTH = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))


def _ignores_both(pid: int) -> bool | None:
    """Whether process ``pid`` ignores SIGINT and SIGTERM (``None``: it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("State", "").strip().startswith("Z"):
        return None
    return int(fields["SigIgn"].strip(), 16) & _BOTH == _BOTH


def _send(pid: int, sig: signal.Signals) -> None:
    """A Ctrl-C as a terminal sends it (to the whole process group); a SIGTERM as a supervisor
    or ``search --workers`` sends it (to the process)."""
    if sig == signal.SIGINT:
        os.killpg(pid, sig)
    else:
        os.kill(pid, sig)


PAIRS = [(signal.SIGINT, signal.SIGINT), (signal.SIGINT, signal.SIGTERM),
         (signal.SIGTERM, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM)]


@pytest.mark.slow  # a search in a subprocess: a few seconds each
@pytest.mark.parametrize("first, second", PAIRS,
                         ids=[f"{a.name}-then-{b.name}" for a, b in PAIRS])
def test_a_second_signal_during_the_cleanup_changes_nothing(first, second, tmp_path):
    studies = tmp_path / "tiledtune-studies.sqlite"
    argv = ["search", "--backend", "simulated", "--device", "sm_90", "--shape", "1,8,1024,64",
            "--space", "compact", "--trials", "40", "--patience", "0", "--db",
            str(tmp_path / "schedules.sqlite")]
    child = subprocess.Popen([sys.executable, "-m", "tuner.cli", *argv], cwd=ROOT,
                             env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True, preexec_fn=_as_from_a_terminal)
    try:
        _wait_for(lambda: child.poll() is not None or (
            any("spawn_main" in c for _, c in _descendants(child.pid).values())
            and _complete_trials(studies) >= 2), 120, "the search to get going")
        assert child.poll() is None, child.communicate()
        assert _ignores_both(child.pid) is False  # both are caught while it searches
        started = _descendants(child.pid)
        _send(child.pid, first)
        end = time.monotonic() + 10
        while not (ignoring := _ignores_both(child.pid)) and time.monotonic() < end:
            if ignoring is None:  # gone
                break  # (no sleep: the cleanup may take only a few milliseconds)
        assert ignoring, "the search never ignored further signals after the first"
        _send(child.pid, second)  # the cleanup has started and not ended
        _, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()

    assert child.returncode == (130 if first == signal.SIGINT else 143), err
    for word in ("Traceback", "KeyboardInterrupt", "Exception ignored", "race condition"):
        assert word not in err, err
    about = [line for line in err.splitlines() if "interrupt" in line.lower()]
    if first == signal.SIGINT:
        assert len(about) == 1 and "run the same command again to resume" in about[0], err
    else:
        assert about == [], err  # a SIGTERM ends quietly
    end = time.monotonic() + 2  # killed at once; an orphan's reaper may take a moment
    while _still_running(started) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _still_running(started)
    # the cleanup ran to its end: the interrupted trials were given back
    storage = f"sqlite:///{studies}"
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert optuna.trial.TrialState.RUNNING not in states


@pytest.mark.parametrize("code", [130, 143, 0, 2])
def test_the_program_exits_an_interrupted_run_with_signals_ignored(monkeypatch, code):
    """After a Ctrl-C or SIGTERM, ``tiledtune`` (``tuner.cli.program``) exits with both signals
    ignored: a late second Ctrl-C lands in the interpreter's exit (atexit handlers) otherwise and
    prints a traceback. Other exits keep the handlers."""
    import signal

    from tuner import cli

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(cli, "main", lambda: code)
    try:
        with pytest.raises(SystemExit) as stopped:
            cli.program()
        assert stopped.value.code == code
        ignored = all(signal.getsignal(sig) is signal.SIG_IGN for sig in before)
        assert ignored == (code in (130, 143))
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
