"""A compile-only run whose standard error is not a terminal (a pipe, a log, CI) shows its
progress as lines at a low rate (issue 30, item 8): rich's bar draws nothing there until it
ends. On a terminal the bar stays."""

from __future__ import annotations

import io
import re

from rich.console import Console

from tuner.cli import main
from tuner.commands._compile_only import LineProgress, _progress

SHAPE = ["--device", "sm_121", "--shape", "1,4,256,64", "--space", "compact", "--jobs", "2"]


def compiles(family, problem, schedule, arch):
    """A stand-in compile job (a module function: the spawned compile processes import it)."""
    return 2.0, None, None  # compiled; what its kernels ask of an SM not said


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(console: Console) -> list[str]:
    return console.file.getvalue().splitlines()


def _console() -> Console:
    return Console(file=io.StringIO(), width=200)


def test_a_line_per_tenth_of_the_candidates_and_one_at_the_end():
    console, clock = _console(), Clock()
    with LineProgress(console, clock=clock) as bar:
        task = bar.add_task("B1 H4 S256 D64 bf16 full", total=95)
        for _ in range(95):
            clock.now += 0.5
            bar.advance(task)
    lines = _lines(console)
    assert len(lines) == 10
    assert lines[0] == "compile-only B1 H4 S256 D64 bf16 full: 10/95 compiled (10%), 5 s"
    assert lines[-1] == "compile-only B1 H4 S256 D64 bf16 full: 95/95 compiled (100%), 48 s"


def test_slow_compiles_give_a_line_every_thirty_seconds():
    console, clock = _console(), Clock()
    bar = LineProgress(console, every_s=30.0, clock=clock)
    task = bar.add_task("key", total=10_000)  # a sweep: a tenth is 1,000 compiles
    for _ in range(100):
        clock.now += 1.0
        bar.advance(task)
    lines = _lines(console)
    assert len(lines) == 3  # at 30, 60 and 90 s
    assert lines[0] == "compile-only key: 30/10,000 compiled (0%), 30 s"


def test_few_candidates_give_at_most_one_line_each():
    console = _console()
    bar = LineProgress(console, clock=Clock())
    task = bar.add_task("key", total=3)
    for _ in range(3):
        bar.advance(task)
    assert [re.sub(r", \d+ s$", "", line) for line in _lines(console)] == [
        "compile-only key: 1/3 compiled (33%)", "compile-only key: 2/3 compiled (66%)",
        "compile-only key: 3/3 compiled (100%)"]


def test_a_terminal_keeps_the_rich_bar():
    from rich.progress import Progress

    assert isinstance(_progress(Console(file=io.StringIO(), force_terminal=True)), Progress)
    assert isinstance(_progress(Console(file=io.StringIO(), force_terminal=False)), LineProgress)


def test_a_compile_only_run_in_a_pipe_reports_progress_on_standard_error(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tuner.search.compile_job", compiles)
    assert main(["search", "--compile-only", *SHAPE, "--trials", "5", "--db",
                 str(tmp_path / "schedules.sqlite")]) == 0
    captured = capsys.readouterr()
    progress = [line for line in captured.err.splitlines() if line.startswith("compile-only ")]
    assert len(progress) == 5 and progress[-1].startswith(
        "compile-only B1 H4 S256 D64 bf16 full: 5/5 compiled (100%), ")
    assert "compiled (" not in captured.out  # progress stays off standard output
