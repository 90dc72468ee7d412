"""Profile the looked-up schedules of the worst three points of each family's latest benchmark
beside torch's cuDNN backend on the same call (``tiledtune profile --compare torch-cudnn``),
for ``docs/performance-notes.md``.

    python scripts/profile_worst.py --out $OUT [--only NAME ...]

The points: the forward's ``docs/records/benchmarks/bench.csv`` (H100, three lowest ratios to
cuDNN), the decode's ``docs/records/benchmarks/decode/bench.csv`` and the backward's training run 3
(``git show 1da4114:docs/records/benchmarks/backward/training/training-3.csv``, out of the tree
since 2026-12-01). Each point's ncu reports, CSV pages
and ``profile.json`` go under ``OUT/NAME``; a table of the two profiles' totals and main kernels is
printed last."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

#: name -> (benchmark ratio to cuDNN, where it comes from, tiledtune profile arguments)
POINTS = {
    "fwd-B16-H16-S1024-D128-causal": (0.906, "bench.csv", ["--kernel", "forward", "--shape",
                                                           "16,16,1024,128", "--causal", "yes"]),
    "fwd-B16-H16-S1024-D128": (0.916, "bench.csv", ["--kernel", "forward", "--shape",
                                                    "16,16,1024,128"]),
    "fwd-B8-H16-S2048-D128-causal": (0.934, "bench.csv", ["--kernel", "forward", "--shape",
                                                          "8,16,2048,128", "--causal", "yes"]),
    "dec-B1-H32/8-S8192": (0.946, "decode/bench.csv", ["--kernel", "decode", "--shape",
                                                       "1,32/8,1:8192,128"]),
    "dec-B1-H32/8-S131072": (0.964, "decode/bench.csv", ["--kernel", "decode", "--shape",
                                                         "1,32/8,1:131072,128"]),
    "dec-B8-H32/8-S8192": (0.964, "decode/bench.csv", ["--kernel", "decode", "--shape",
                                                       "8,32/8,1:8192,128"]),
    "bwd-B1-H16-S8192-D128": (0.80, "training-3", ["--kernel", "backward", "--shape",
                                                   "1,16,8192,128"]),
    "bwd-B1-H8-S16384-D128-causal": (0.85, "training-3", ["--kernel", "backward", "--shape",
                                                          "1,8,16384,128", "--causal", "yes"]),
    "bwd-B1-H64/8-S8192-D128-causal": (0.86, "training-3", ["--kernel", "backward", "--shape",
                                                            "1,64/8,8192,128", "--causal",
                                                            "yes"]),
}


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _main_kernel(rows: list[dict]) -> dict:
    return max(rows[:-1], key=lambda r: r["time_us"] or 0.0)


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", action="append", default=None, choices=sorted(POINTS))
    parser.add_argument("--timeout", type=int, default=300, help="seconds a point may take")
    args = parser.parse_args()
    lines = []
    for name in args.only or POINTS:
        ratio, source, argv = POINTS[name]
        out = args.out / name.replace("/", "-")
        cmd = [sys.executable, "-m", "tuner.cli", "profile", "--device", _arch(), *argv,
               "--looked-up", "--compare", "torch-cudnn", "--out", str(out)]
        try:
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:
            lines.append(f"{name}: ran past {args.timeout} s")
            continue
        (args.out / f"{name.replace('/', '-')}.log").write_text(
            " ".join(cmd) + "\n" + done.stdout + done.stderr)
        print(done.stdout[-3000:], done.stderr[-1000:], flush=True)
        if done.returncode != 0:
            lines.append(f"{name}: failed ({done.returncode})")
            continue
        ours, theirs = json.loads((out / "profile.json").read_text())["profiles"]
        a, b = ours["kernels"][-1], theirs["kernels"][-1]
        ka, kb = _main_kernel(ours["kernels"]), _main_kernel(theirs["kernels"])
        lines.append(" | ".join([
            name, f"{ratio:.3f} ({source})", ours["schedule"],
            f"{a['time_us']:.1f} / {b['time_us']:.1f} = {b['time_us'] / a['time_us']:.3f}",
            f"{_fmt(ka.get('tensor_pipe_pct'), '.0f')} / {_fmt(kb.get('tensor_pipe_pct'), '.0f')}",
            f"{_fmt(a.get('gbps'), '.0f')} / {_fmt(b.get('gbps'), '.0f')}",
            f"{_fmt(ka.get('occupancy_pct'), '.0f')} / {_fmt(kb.get('occupancy_pct'), '.0f')}",
            f"{_fmt(ka.get('registers'), '.0f')} / {_fmt(kb.get('registers'), '.0f')}",
            f"{ka.get('stalls')} / {kb.get('stalls')}"]))
    print("point | bench ÷ cuDNN | looked-up | total µs ours / cuDNN = ratio | tensor pipe % | "
          "DRAM GB/s | occupancy % | registers | top stalls")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
