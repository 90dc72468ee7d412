"""Issue 31 probe: the backward's default and its neighbours on training shapes (GPU).

    python scripts/backward_parallel_probe.py [--rounds 15] [--jobs 16] [--only N]

For each shape: every candidate (``candidates``: the sm_90 default and its neighbours) is
compiled ahead, checked against the float32 reference (NaN-poisoned gradients; relative L2
error within the family's tolerance) and timed interleaved with torch's cuDNN and flash
backward (L2 flushed). Prints one table per shape and a summary last.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import as_completed

from tiledattention import BACKWARD, BackwardSchedule, Problem
from tuner.measure import CompilePool, time_interleaved
from tuner.search import compile_job

SHAPES = [  # (B, H_q, H_kv, S_q, S_k, D, causal ("br": bottom-right), dtype)
    (1, 32, 8, 4096, 4096, 128, True, "bf16"),
    (1, 8, 1, 6144, 6144, 128, True, "bf16"),
    (1, 16, 16, 8192, 8192, 128, False, "bf16"),
    (1, 16, 8, 4096, 4096, 256, True, "bf16"),
    (2, 16, 4, 1000, 3000, 128, "br", "bf16"),
    (2, 32, 8, 2048, 2048, 64, True, "fp16"),
    (1, 32, 4, 8192, 8192, 128, True, "bf16"),
    (4, 8, 1, 2048, 2048, 96, False, "bf16"),
]


def candidates(problem: Problem) -> dict[str, BackwardSchedule]:
    """The sm_90 default (its dK/dV splits from the default's rule) and its neighbours: half
    and twice the splits, the causal dQ order, dK/dV and dQ tile, occupancy and warp variants."""
    base = BACKWARD.default_schedule("sm_90", problem)
    n = base.dkdv_splits
    found = {"default": base, "unsplit": base.replace(dkdv_splits=1),
             "splits/2": base.replace(dkdv_splits=max(1, n // 2)),
             "splits*2": base.replace(dkdv_splits=min(16, n * 2)),
             "heavy-first": base.replace(dq_heavy_first=True),
             "tile-major": base.replace(tile_major=True),
             "tile-major splits*2": base.replace(tile_major=True,
                                                 dkdv_splits=min(16, n * 2)),
             "tile-major unsplit": base.replace(tile_major=True, dkdv_splits=1),
             "dkdv m128": base.replace(dkdv_tile_m=128),
             "dkdv m64": base.replace(dkdv_tile_m=64),
             "dkdv n128 w8 occ1": base.replace(dkdv_tile_n=128, dkdv_worker_warps=8,
                                               dkdv_occupancy=1),
             "dkdv occ1 w8": base.replace(dkdv_occupancy=1, dkdv_worker_warps=8),
             "dkdv lat3": base.replace(q_latency=3),
             "dq m64": base.replace(dq_tile_m=64, dq_worker_warps=None),
             "dq m128 w8": base.replace(dq_tile_m=128, dq_worker_warps=8),
             "dq occ1": base.replace(dq_occupancy=1)}
    unique: dict[str, BackwardSchedule] = {}
    seen = set()
    for name, s in found.items():
        s = BACKWARD.normalise(problem, s)
        if s.key not in seen:
            seen.add(s.key)
            unique[name] = s
    return unique


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--only", type=int, default=None)
    args = parser.parse_args()
    shapes = SHAPES if args.only is None else SHAPES[:args.only]
    problems = [Problem(batch=b, heads_q=hq, heads_kv=hk, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                        causal=bool(c), bottom_right=c == "br", dtype=dt)
                for b, hq, hk, sq, sk, d, c, dt in shapes]
    jobs = [(p, s) for p in problems for s in candidates(p).values()]
    start = time.perf_counter()
    pool = CompilePool(args.jobs)
    futures = {pool.submit(compile_job, BACKWARD, p, s, "sm_90"): (p, s.key) for p, s in jobs}
    failed = {}
    for fut in as_completed(futures):
        _, _, error = fut.result()
        if error:
            failed[futures[fut]] = error.strip().splitlines()[0][:120]
    pool.close()
    print(f"{len(jobs)} compiled in {time.perf_counter() - start:.0f} s, {len(failed)} failed",
          flush=True)
    summary = []
    for problem in problems:
        case = BACKWARD.case(problem, 0)
        flops = BACKWARD.flops(problem)
        fns, errs = {}, {}
        for name, s in candidates(problem).items():
            if (problem, s.key) in failed:
                errs[name] = "compile: " + failed[(problem, s.key)]
                continue
            run = case.launcher(s)
            err = case.error(run)
            errs[name] = f"{err:.2e}"
            if math.isfinite(err) and err <= BACKWARD.tolerance(problem):
                fns[name] = run
        for name, fn in case.baselines().items():
            try:
                fn()
                fns[name] = fn
            except Exception as exc:  # the backend refuses the problem
                errs[name] = str(exc).splitlines()[0][:80]
        timed = time_interleaved(fns, rounds=args.rounds)
        cudnn = timed.get("torch-cudnn")
        flash = timed.get("torch-flash")
        print(f"\n{problem.describe()}")
        for name in list(candidates(problem)) + ["torch-cudnn", "torch-flash"]:
            t = timed.get(name)
            if t is None:
                print(f"  {name:18s} --  {errs.get(name)}")
                continue
            ms = t.median_ms
            line = f"  {name:18s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TF/s"
            if cudnn is not None:
                line += f"  x{cudnn.median_ms / ms:5.2f} cudnn"
            if flash is not None:
                line += f"  x{flash.median_ms / ms:5.2f} flash"
            print(line + f"  err {errs.get(name, '')}", flush=True)
        ours = {n: timed[n].median_ms for n in candidates(problem) if n in timed}
        best = min(ours, key=ours.get)
        summary.append((problem.describe(), ours.get("default"), best, ours[best],
                        cudnn.median_ms if cudnn else None, flash.median_ms if flash else None))
    print("\nshape | default/cuDNN | best | best/cuDNN | best/flash")
    for desc, d, best, b, c, f in summary:
        print(f"{desc} | {c / d if c and d else float('nan'):.2f} | {best} | "
              f"{c / b if c else float('nan'):.2f} | {f / b if f else float('nan'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
