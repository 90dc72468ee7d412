"""Running Nsight Compute on ``_target`` (one problem, one schedule or PyTorch baseline), and
why it cannot run: every such reason is a :class:`~tuner.errors.ProfileUnavailable` of one line
that says how to fix it, and a baseline the family's case does not have a
:class:`~tuner.errors.UsageError` (``tiledtune`` exits with status 2 on both), never a
traceback.

ncu runs with ``--clock-control none`` (the clocks as the kernels meet them in use, so times
compare with benchmark timings; ncu's default locks them to base) and ``--profile-from-start
off``: only the launches between the target's ``cudaProfilerStart`` and ``cudaProfilerStop``
are profiled, after a first run compiled and warmed them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import ProfileUnavailable, UsageError
from ._metrics import METRICS
from ._target import REFUSED

__all__ = ["check_profilable", "run_profile", "failure_reason", "ncu_command"]

#: (text in ncu's output, what it means and how to fix it)
_FAILURES = (
    ("ERR_NVGPUCTRPERM", "no permission to read the GPU's performance counters: run as root, or "
     "load the driver with NVreg_RestrictProfilingToAdminUsers=0 "
     "(https://developer.nvidia.com/ERR_NVGPUCTRPERM)"),
    ("LibraryNotLoaded", "Nsight Compute cannot reach this machine's performance counters "
     "(\"LibraryNotLoaded\"; seen in gVisor sandboxes): profile on a machine or VM with direct "
     "GPU access"),
    ("Failed to initialize the profiler", "Nsight Compute could not initialise its profiler "
     "here: profile on a machine with direct GPU access and a driver ncu supports"),
    ("No kernels were profiled", "ncu profiled no kernel: the target ran none between "
     "cudaProfilerStart and cudaProfilerStop"),
)


def failure_reason(output: str) -> str | None:
    """What ncu's ``output`` says went wrong, in words with a fix, or ``None``."""
    return next((why for text, why in _FAILURES if text in output), None)


def check_profilable(arch: str) -> str:
    """The path of ``ncu`` when this machine can profile kernels built for ``arch``; else
    :class:`ProfileUnavailable` (no CUDA GPU, no ncu) or :class:`UsageError` (the GPU here is
    of another architecture)."""
    import torch

    if not torch.cuda.is_available():
        raise ProfileUnavailable("no CUDA GPU on this machine: tiledtune profile runs the kernels "
                                 "under Nsight Compute; run it on the GPU machine (tiledtune "
                                 "search --compile-only and explain work without one)")
    from tiledattention import device_info

    here = device_info(torch.cuda.current_device()).arch
    if here != arch:
        raise UsageError(f"--device {arch} names another architecture than this machine's GPU "
                         f"({here}): give --device {here}")
    ncu = shutil.which("ncu")
    if ncu is None:
        raise ProfileUnavailable("Nsight Compute's ncu is not on PATH: install Nsight Compute "
                                 "(part of the CUDA toolkit) or put the directory holding ncu "
                                 "on PATH")
    return ncu


def ncu_command(ncu: str, report: Path, request: Path) -> list[str]:
    """The command line that profiles ``request``'s launches into ``report`` (.ncu-rep)."""
    return [ncu, "--profile-from-start", "off", "--clock-control", "none",
            "--metrics", ",".join(METRICS), "--export", str(report), "--force-overwrite",
            sys.executable, "-m", "tuner.profile._target", str(request)]


def _run(cmd: list[str], timeout: float) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProfileUnavailable(f"ncu ran past {timeout:.0f} s and was stopped") from None
    output = proc.stdout + proc.stderr
    refused = [line for line in output.splitlines() if line.startswith(REFUSED)]
    if refused:
        raise UsageError(refused[0][len(REFUSED):])
    why = failure_reason(output)
    if why is not None:
        raise ProfileUnavailable(why)
    if proc.returncode != 0:
        last = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
        raise ProfileUnavailable(f"ncu failed with exit status {proc.returncode}: {last[0]}")
    return proc.stdout


def run_profile(ncu: str, family: Any, problem: Any, schedule: Any, workdir: Path, label: str,
                timeout: float = 600.0, *, baseline: str | None = None) -> str:
    """Profile ``family``'s launches of ``problem`` under ``schedule`` (or, with ``baseline``,
    that PyTorch baseline of the family's case, ``schedule`` unused); return ncu's raw CSV
    page. ``workdir`` keeps ``LABEL.ncu-rep``, ``LABEL.csv`` and the target's request."""
    request = workdir / f"{label}.request.json"
    request.write_text(json.dumps({"family": family.name, "problem": problem.to_dict(),
                                   "schedule": None if schedule is None else schedule.to_dict(),
                                   "baseline": baseline}))
    report = workdir / label
    _run(ncu_command(ncu, report, request), timeout)
    text = _run([ncu, "--import", str(report) + ".ncu-rep", "--csv", "--page", "raw",
                 "--print-units", "base"], timeout)
    (workdir / f"{label}.csv").write_text(text)
    return text
