"""Fault catalogue (issue 45, item 3): a search whose standard error is not a terminal (``2>&1 |
tee log``, a batch job) shows its progress as lines: one per tenth of a key's trials, and one
whenever 30 s pass without one (``_progress.EVERY_S``, set lower here), on the GPU and simulated
backends alike (``--compile-only`` shares the mechanism: ``test_compile_only_progress.py``).
Before the fix a piped search printed nothing until each key ended."""

from __future__ import annotations

import io
import re
import sys
import threading
import time

import pytest
from rich.console import Console

import tuner.measure
from tuner.cli import main
from tuner.commands import _progress
from tuner.commands._progress import LineProgress
from tuner.measure import IsolatedExecutor

SEARCH = ["search", "--backend", "simulated", "--device", "sm_90", "--shape", "2,8,1024,64",
          "--space", "compact", "--patience", "0"]
LINE = re.compile(r"^search B2 H8 S1024 D64 bf16 full: (\d+)/(\d+) measured \(\d+%\), \d+ s")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _console() -> Console:
    return Console(file=io.StringIO(), width=80)


def _lines(console: Console) -> list[str]:
    return console.file.getvalue().splitlines()


class _Stamped(io.StringIO):
    """Standard error of a pipe: not a terminal; each line written is kept with its time."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            for line in text.splitlines():
                if line.strip():
                    self.lines.append((time.monotonic(), line))
            return super().write(text)

    def isatty(self) -> bool:
        return False


def _slowed(delay_s: float):
    class Slowed(IsolatedExecutor):
        """The executor of the search, each timed run taking ``delay_s`` longer (a GPU's
        slow candidates)."""

        def measurement(self, method, *args, **kwargs):
            if method == "measure":
                time.sleep(delay_s)
            return super().measurement(method, *args, **kwargs)

    return Slowed


# -- the rule, on a fake clock ------------------------------------------------------------------

def test_a_line_per_tenth_of_a_keys_trials_with_its_status():
    console, clock = _console(), Clock()
    bar = LineProgress(console, every_s=30.0, clock=clock, what="search", unit="measured")
    task = bar.add_task("key", total=60, status="")
    for measured in range(1, 61):
        clock.now += 1.0
        bar.update(task, completed=measured, status=f"best {measured} TFLOP/s")
    lines = _lines(console)
    assert [int(re.search(r": (\d+)/", line).group(1)) for line in lines] == list(
        range(6, 61, 6))  # long lines are never wrapped
    assert lines[0] == "search key: 6/60 measured (10%), 6 s | best 6 TFLOP/s"


def test_updates_without_a_new_tenth_give_a_line_after_every_s():
    console, clock = _console(), Clock()
    bar = LineProgress(console, every_s=30.0, clock=clock, what="search", unit="measured")
    task = bar.add_task("key", total=1000)
    for measured in range(1, 91):
        clock.now += 1.0
        bar.update(task, completed=measured)
    assert [line.split(": ")[1] for line in _lines(console)] == [
        "30/1,000 measured (3%), 30 s", "60/1,000 measured (6%), 60 s",
        "90/1,000 measured (9%), 90 s"]


def test_with_no_update_at_all_a_line_still_comes_every_s():
    """A candidate that takes minutes (or a key's re-timing): no update for a long time, and
    still a line every ``every_s`` from the background thread."""
    console = _console()
    with LineProgress(console, every_s=0.05, what="search", unit="measured") as bar:
        bar.add_task("key", total=60)
        time.sleep(0.6)
    lines = _lines(console)
    assert len(lines) >= 3 and all(line.startswith("search key: 0/60 measured (0%), ")
                                   for line in lines)
    time.sleep(0.2)
    assert len(_lines(console)) == len(lines)  # none after the progress ended


def test_a_terminal_keeps_the_rich_bar():
    from rich.progress import Progress

    def bar():
        return Progress(console=terminal)

    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(_progress.progress(terminal, bar, what="search", unit="measured"),
                      Progress)
    assert isinstance(_progress.progress(_console(), bar, what="search", unit="measured"),
                      LineProgress)


# -- a piped search ------------------------------------------------------------------------------

@pytest.mark.slow  # spawns the measuring worker
def test_a_piped_search_with_slow_candidates_shows_a_line_at_least_every_interval(
        tmp_path, capsys, monkeypatch):  # capsys first: monkeypatch gives its stderr back
    """The timed run takes 1.5 s, the interval is 0.2 s: before the candidate's result the
    piped search prints lines (the count unchanged), never going 1 s without one."""
    monkeypatch.setattr(_progress, "EVERY_S", 0.2)
    monkeypatch.setattr(tuner.measure, "IsolatedExecutor", _slowed(1.5))
    stderr = _Stamped()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert main([*SEARCH, "--trials", "1", "--db", str(tmp_path / "s.sqlite")]) == 0
    progress = [(at, line) for at, line in stderr.lines if LINE.match(line)]
    counts = [int(LINE.match(line).group(1)) for _, line in progress]
    assert counts[-1] == 1 and counts.count(0) >= 3, counts  # lines while nothing moved
    gaps = [b - a for (a, _), (b, _) in zip(progress, progress[1:])]
    assert max(gaps) < 1.0, gaps
    assert not LINE.search(capsys.readouterr().out)  # progress stays off standard output


@pytest.mark.slow  # spawns the measuring worker
def test_a_piped_search_prints_a_line_per_tenth_of_its_trials(tmp_path, monkeypatch, capsys):
    """Ten trials: a line as each is measured (each is a tenth), none twice."""
    monkeypatch.setattr(_progress, "EVERY_S", 600.0)  # only the count drives the lines
    assert main([*SEARCH, "--trials", "10", "--db", str(tmp_path / "s.sqlite")]) == 0
    counts = [int(m.group(1)) for m in map(LINE.match, capsys.readouterr().err.splitlines())
              if m]
    assert counts == list(range(1, 11)), counts
