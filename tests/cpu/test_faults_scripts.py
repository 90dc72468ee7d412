"""The GPU scripts the README names refuse in one line on a machine without a GPU (issue 45,
point 4): exit status 2, as ``tiledtune`` answers a usage condition, and no traceback.

Each script runs in a subprocess with ``CUDA_VISIBLE_DEVICES`` empty, so the check holds on a
GPU machine too. What each still does without a GPU (``--dry-run``, ``--from-json``,
``--from-csv``, ``--help``) is not refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the README-named GPU scripts and the arguments the README gives them (``OUT`` a folder)
GPU_SCRIPTS = {
    "overhead.py": ["--out", "OUT", "--calls", "1", "--repeats", "1", "--skip-compile"],
    "backward_training_bench.py": ["--out", "OUT"],
    "lookup_regret.py": ["--family", "decode", "--out", "OUT/decode.json"],
}


def run_script(name: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TILEDATTN_DB": str(tmp_path / "user.sqlite")}
    argv = [a.replace("OUT", str(tmp_path)) for a in args]
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *argv], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", GPU_SCRIPTS)
def test_a_gpu_script_without_a_gpu_says_so_in_one_line(name, tmp_path):
    done = run_script(name, GPU_SCRIPTS[name], tmp_path)
    assert "Traceback" not in done.stderr + done.stdout
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{name}: needs a CUDA GPU"), done.stderr
    assert done.stdout == ""


def test_what_needs_no_gpu_still_runs(tmp_path):
    done = run_script("lookup_regret.py", ["--family", "decode", "--dry-run", "sm_90",
                                           "--only", "1"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
