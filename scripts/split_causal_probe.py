"""Short causal rows of a split head dim (issue 18): a few schedules against cuDNN on the GPU.

    python scripts/split_causal_probe.py --out $OUT/split_causal.json

Every causal fitting shape (``tuner.lookup.FITTING``) with 64 < D <= 128, and three proxies of
neither set (D96 B16 S1024, D80 and D128 at B16 S512), each timed interleaved with torch's cuDNN
backend (``lookup_regret.measure``: compiled ahead, checked against float32, 10 rounds, L2
flushed) with: the default, 64x128 tiles at occupancy 2, and 64x64 tiles at occupancy 2, 3, 4
(sawtooth, longest first; occupancy 3 also with latency hints 2). Prints cuDNN / schedule per
shape; the JSON holds every time. The evidence of the default's short causal split branch
(``docs/lookup.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import as_completed
from pathlib import Path

import lookup_regret

import tiledattention
from tiledattention import FORWARD, Problem
from tiledattention.forward import Schedule, head_dim_parts
from tuner.lookup import FITTING, HeldOutShape
from tuner.lookup._policies import shipped_tuned_rows
from tuner.measure._processes import CompilePool
from tuner.search._trials import compile_job

PROXIES = tuple(HeldOutShape(name, Problem(batch=16, heads_q=32, heads_kv=32, seqlen_q=s,
                                           seqlen_k=s, head_dim=d, dtype="bf16", causal=True))
                for name, s, d in (("proxy D96 S1024 B16", 1024, 96),
                                   ("proxy D80 S512 B16", 512, 80),
                                   ("proxy D128 S512 B16", 512, 128)))


def candidates(arch: str, problem: Problem) -> dict[str, tuple[str, Schedule]]:
    """key -> (names, normalised schedule); names joined with '|' where two coincide."""
    split = head_dim_parts(problem.head_dim, True)[1] != 0
    small = dict(tile_m=64, tile_n=64, exp2=True, approx_div=True, k_transposed=True,
                 kv_sawtooth=True, longest_first=True, split_d=split)
    named = {"default": FORWARD.default_schedule(arch, problem),
             "64x128 occ2": Schedule(tile_m=64, tile_n=128, occupancy=2, exp2=True,
                                     approx_div=True, k_transposed=True, split_d=split),
             **{f"64x64 occ{o}": Schedule(occupancy=o, **small) for o in (2, 3, 4)},
             "64x64 occ3 lat2": Schedule(occupancy=3, k_latency=2, v_latency=2, **small)}
    pool: dict[str, tuple[str, Schedule]] = {}
    for name, schedule in named.items():
        s = FORWARD.normalise(problem, schedule)
        pool[s.key] = ((pool[s.key][0] + "|" if s.key in pool else "") + name, s)
    return pool


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON results file")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds")
    parser.add_argument("--jobs", type=int, default=16, help="compile processes")
    args = parser.parse_args()
    shapes = [s for s in FITTING if s.problem.causal and 64 < s.problem.head_dim <= 128]
    shapes += PROXIES
    tiledattention.use_database(str(args.out.parent / "no-user-db.sqlite"))  # shipped + default
    arch = tiledattention.device_info(0).arch
    rows = shipped_tuned_rows(arch)
    pools = {s.name: candidates(arch, s.problem) for s in shapes}
    jobs = {(s.problem, key): sched for s in shapes for key, (_, sched) in pools[s.name].items()}
    failed: dict[tuple, str] = {}
    start = time.perf_counter()
    with CompilePool(args.jobs) as pool:
        futures = {pool.submit(compile_job, FORWARD, p, sched, arch): (p, key)
                   for (p, key), sched in jobs.items()}
        for fut in as_completed(futures):
            error = fut.result()[2]
            if error is not None:
                failed[futures[fut]] = error.splitlines()[0][:160]
    print(f"{len(jobs)} compiled in {time.perf_counter() - start:.0f} s, {len(failed)} failed",
          file=sys.stderr, flush=True)
    records = []
    for shape in shapes:
        r = lookup_regret.measure("probe", shape, pools[shape.name], failed, rows, arch, args)
        records.append(r)
        args.out.write_text(json.dumps({"versions": lookup_regret.versions(),
                                        "shapes": records}, indent=1))
        times, cudnn = r["times"], r["cudnn_ms"]
        line = " ".join(f"{r['why'][k]}={cudnn / times[k]:.3f}"
                        for k in sorted(times, key=times.get))
        print(f"{shape.name} [{shape.problem.describe()}] cuDNN/x: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
