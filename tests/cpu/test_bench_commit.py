"""``tiledtune bench`` records the commit it ran (issue 30, item 7): ``source_commit`` reads the
checkout the code came from, ``RunInfo`` carries it to ``run.json`` and the summary's header,
a re-rendering keeps the measured run's commit, and a tree that is not a git checkout records
none rather than a guess."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tuner._source import source_commit
from tuner.bench import BenchResult, RunInfo, render_markdown, write_csv
from tuner.commands import bench_cmd
from tuner.errors import UnreadableFile

ROOT = Path(__file__).resolve().parents[2]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *argv], check=True, capture_output=True,
                          text=True).stdout.strip()


def _repo(path: Path) -> str:
    path.mkdir()
    _git(path, "init", "-q")
    (path / "kernel.py").write_text("x = 1\n")
    _git(path, "add", "kernel.py")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    return _git(path, "rev-parse", "HEAD")


def _row() -> BenchResult:
    return BenchResult(contender="tiledattention", status="ok", batch=1, heads=8, seqlen=1024,
                       head_dim=64, dtype="bf16", causal=False, median_ms=0.5, tflops=100.0,
                       device="NVIDIA H100 80GB HBM3", arch="sm_90")


@needs_git
def test_source_commit_names_the_checkout_and_its_tracked_changes(tmp_path):
    repo = tmp_path / "project"
    head = _repo(repo)
    assert source_commit(repo) == (head, False)
    (repo / "results.csv").write_text("untracked output\n")  # untracked files do not count
    assert source_commit(repo) == (head, False)
    (repo / "kernel.py").write_text("x = 2\n")
    assert source_commit(repo) == (head, True)


@needs_git
def test_no_commit_outside_a_checkout_or_below_its_top(tmp_path):
    assert source_commit(tmp_path) == ("", None)  # not a git checkout
    repo = tmp_path / "outer"
    _repo(repo)
    (repo / "site-packages").mkdir()  # an installed package inside some other repository
    assert source_commit(repo / "site-packages") == ("", None)
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")  # a checkout without commits
    assert source_commit(empty) == ("", None)


def test_no_commit_without_git(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on PATH
    assert source_commit(ROOT) == ("", None)


@needs_git
def test_by_default_the_commit_of_this_project():
    if not (ROOT / ".git").exists():
        pytest.skip("this project is not a git checkout here")
    commit, dirty = source_commit()
    assert commit == _git(ROOT, "rev-parse", "HEAD") and isinstance(dirty, bool)


def test_run_info_round_trips_and_reads_older_files():
    info = RunInfo(command="tiledtune bench", date="d", commit="a" * 40, dirty=True)
    assert RunInfo.from_json(info.to_json()) == info
    assert json.loads(info.to_json())["commit"] == "a" * 40
    old = RunInfo.from_json(json.dumps({"command": "c", "date": "d", "matmul_tflops": [1.0]}))
    assert old.commit is None and old.dirty is None  # written before runs recorded one
    with pytest.raises(UnreadableFile, match="'commit' must be a string"):
        RunInfo.from_json(json.dumps({"command": "c", "date": "d", "commit": 5}))


@pytest.mark.parametrize("commit, dirty, line", [
    ("0123456789abcdef" * 2 + "01234567", False, "- commit: 0123456789ab"),
    ("0123456789abcdef" * 2 + "01234567", True,
     "- commit: 0123456789ab with uncommitted changes to tracked files"),
    ("", None, "- commit: none (not run from a git checkout)"),
    (None, None, None),
], ids=["clean", "dirty", "no-checkout", "not-recorded"])
def test_summary_header_names_the_commit(commit, dirty, line):
    text = render_markdown([_row()], RunInfo(command="x", date="d", commit=commit, dirty=dirty))
    header = [row for row in text.splitlines() if row.startswith("- commit:")]
    assert header == ([line] if line else [])


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def test_a_run_records_the_commit_in_run_json_and_the_summary(tmp_path, monkeypatch):
    """The command's GPU path with the GPU replaced: what it writes names the commit."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    monkeypatch.setattr(bench_cmd, "run_grid", lambda grid, settings, progress=None: [_row()])
    monkeypatch.setattr(bench_cmd, "matmul_tflops", lambda settings: 700.0)
    monkeypatch.setattr(bench_cmd, "source_commit", lambda: ("f" * 40, True))
    out = tmp_path / "run"
    assert bench_cmd.run(_args("--quick", "--no-plots", "--out", str(out))) == 0
    saved = json.loads((out / "run.json").read_text())
    assert saved["commit"] == "f" * 40 and saved["dirty"] is True
    assert "- commit: ffffffffffff with uncommitted changes" in (out / "summary.md").read_text()

    # a re-rendering keeps the measured run's commit, not its own
    monkeypatch.setattr(bench_cmd, "source_commit", lambda: ("0" * 40, False))
    again = tmp_path / "again"
    assert bench_cmd.run(_args("--report-only", str(out / "bench.csv"), "--no-plots",
                               "--out", str(again))) == 0
    assert "- commit: ffffffffffff" in (again / "summary.md").read_text()


def test_a_rerendering_of_a_run_without_run_json_claims_no_commit(tmp_path):
    csv_path = write_csv([_row()], tmp_path / "bench.csv")
    assert bench_cmd.run(_args("--report-only", str(csv_path), "--no-plots")) == 0
    assert "- commit:" not in (tmp_path / "summary.md").read_text()
