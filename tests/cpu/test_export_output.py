"""Where ``tiledtune export -o`` writes (issue 30, item 3): through a symlink (its target
replaced atomically, the link kept), never over a directory, a device, a FIFO or a socket (one
line, exit status 2, the path untouched), and ``-o -`` to standard output, the same bytes a file
gets. The devices and links are made in the test's own folder: no system file is ever at risk,
even with the refusal broken."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import db
from tiledattention import FORWARD, Problem, Schedule
from tiledattention.tooling import codecs, current_provenance
from tuner import cli

ROOT = Path(__file__).resolve().parents[2]
PROV = current_provenance(FORWARD)
FORMATS = {"json": ".json", "csv": ".csv", "bytarget": ".py"}


def _row(s: int) -> db.ScheduleRow:
    problem = Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=s, seqlen_k=s, head_dim=64,
                      dtype="bf16", causal=False)
    return db.ScheduleRow(family="forward", arch="sm_90", device_name="NVIDIA H100 80GB HBM3",
                          problem=problem, schedule=Schedule(tile_m=64, tile_n=64),
                          median_ms=0.01 * s, spread_ms=0.0, tflops=1.0, trials=3,
                          provenance=PROV)


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "source.sqlite"
    with db.ScheduleDB(path, codecs=codecs()) as database:
        for s in (128, 256, 512):
            database.put(_row(s))
    return path


@pytest.fixture
def export(monkeypatch, source):
    """``tiledtune export --db SOURCE ...`` in this process: (exit status, stdout, stderr)."""
    monkeypatch.setenv("COLUMNS", "200")

    def run(capfd, *argv):
        capfd.readouterr()
        code = cli.main(["export", "--db", str(source), *map(str, argv)])
        out, err = capfd.readouterr()
        return code, out, err
    return run


def _reference(export, capfd, tmp_path, fmt: str = "json") -> bytes:
    path = tmp_path / f"reference{FORMATS[fmt]}"
    code, _, err = export(capfd, "-o", path)
    assert code == 0, err
    return path.read_bytes()


def _refused(code: int, out: str, err: str, path, what: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and f"{path} is {what}, not a regular file: nothing written" \
        in lines[0], err
    assert "-o - writes to standard output" in lines[0]


def _no_temp_files(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


# -- symlinks ----------------------------------------------------------------------------------
def test_a_symlink_is_written_through_and_stays_a_link(export, capfd, tmp_path):
    expected = _reference(export, capfd, tmp_path)
    target = tmp_path / "data" / "rows.json"
    target.parent.mkdir()
    target.write_text("old rows\n")
    target.chmod(0o600)  # a private file stays private
    link = tmp_path / "latest.json"
    link.symlink_to(Path("data") / "rows.json")
    code, out, err = export(capfd, "-o", link)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(Path("data") / "rows.json")
    assert target.read_bytes() == expected
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    _no_temp_files(tmp_path)
    _no_temp_files(target.parent)


def test_a_dangling_symlink_creates_its_target(export, capfd, tmp_path):
    expected = _reference(export, capfd, tmp_path)
    link = tmp_path / "new.json"
    link.symlink_to(tmp_path / "made" / "here.json")
    code, _, err = export(capfd, "-o", link)
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "made" / "here.json").read_bytes() == expected


# -- what is never replaced --------------------------------------------------------------------
def test_a_fifo_is_refused_and_left_a_fifo(export, capfd, tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    code, out, err = export(capfd, "-o", fifo)
    _refused(code, out, err, fifo, "a FIFO (named pipe)")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    _no_temp_files(tmp_path)


def test_a_socket_is_refused_and_left_a_socket(export, capfd):
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:  # AF_UNIX paths are short
        path = Path(folder) / "s.json"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(str(path))
            code, out, err = export(capfd, "-o", path)
        finally:
            server.close()
        _refused(code, out, err, path, "a socket")
        assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_a_directory_is_refused(export, capfd, tmp_path):
    folder = tmp_path / "out.json"
    folder.mkdir()
    (folder / "kept").write_text("x")
    code, out, err = export(capfd, "-o", folder)
    _refused(code, out, err, folder, "a directory")
    assert folder.is_dir() and (folder / "kept").read_text() == "x"


def test_a_character_device_is_refused_and_left_a_device(export, capfd, tmp_path):
    """A device node of our own (the null device's numbers) in the test's folder, never
    /dev/null itself; and a link to it, as /dev/stdout is a link."""
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    link = tmp_path / "stdout.json"
    link.symlink_to(device)
    for path in (device, link):
        code, out, err = export(capfd, "-o", path, "--format", "json")
        _refused(code, out, err, path, "a character device")
        assert stat.S_ISCHR(os.lstat(device).st_mode) and link.is_symlink()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_link_to_standard_output_is_refused_when_it_is_a_pipe(source, tmp_path):
    """``-o /dev/stdout`` through a link of the test's own to ``/proc/self/fd/1`` (the link
    the issue saw replaced), in a process whose standard output is a pipe."""
    if not Path("/proc/self/fd/1").exists():
        pytest.skip("no /proc/self/fd")
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    done = subprocess.run([sys.executable, "-m", "tuner.cli", "export", "--db", str(source),
                           "-o", str(link), "--format", "json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{link} is a FIFO (named pipe), not a regular file" in done.stderr
    assert done.stdout == ""
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


def test_a_read_only_file_is_refused(monkeypatch, tmp_path):
    """``os.access`` says no for a file this process may not write (root may write a 0444
    file, so the refusal is driven through ``os.access`` here)."""
    path = tmp_path / "rows.json"
    path.write_text("kept\n")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == path
                        else real(p, mode, **kw))
    with pytest.raises(db.OutputRefused, match="read-only file"):
        db.write_text_atomic(path, "new\n")
    assert path.read_text() == "kept\n"


# -- standard output ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_dash_writes_to_standard_output_what_a_file_gets(export, capfd, tmp_path, fmt):
    expected = _reference(export, capfd, tmp_path, fmt)
    code, out, err = export(capfd, "-o", "-", "--format", fmt)
    assert code == 0, err
    assert out.encode() == expected
    assert "to standard output" in err and not (tmp_path / "-").exists()
    assert not Path("-").exists()


def test_dash_without_a_format_is_one_line(export, capfd):
    code, out, err = export(capfd, "-o", "-")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "pass --format" in err and not Path("-").exists()


def test_dash_through_a_real_pipe(source, tmp_path):
    """In a subprocess: the bytes on the pipe are the file's; the summary on standard error."""
    file = tmp_path / "rows.csv"
    args = [sys.executable, "-m", "tuner.cli", "export", "--db", str(source)]
    assert subprocess.run(args + ["-o", str(file)], cwd=ROOT, timeout=120).returncode == 0
    done = subprocess.run(args + ["-o", "-", "--format", "csv"], cwd=ROOT, capture_output=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == file.read_bytes()
    assert b"wrote 3 row(s)" in done.stderr
