"""GPU tuning experiment behind docs/tuning.md (one run on the GPU machine):

1. tune (4,16,4096,128,bf16,causal) and (8,16,2048,64,bf16,full) over the full space;
2. on (8,16,2048,64,bf16,full) and the compact space (128 candidates): an exhaustive sweep
   and a TPE search with at most 30% of its candidates, then both winners re-timed side by side;
3. the search with and without compiling ahead (fresh cuTile caches), for the wall-clock gain.

    python scripts/tune_experiment.py OUTDIR
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile

from db import dump_rows
from tiledattention import FORWARD, Problem, open_database
from tuner.commands.search_cmd import select_device
from tuner.measure import GpuExecutor, IsolatedExecutor, Timing
from tuner.search import SearchConfig, Tuner


def fresh_cache() -> None:
    os.environ["CUDA_TILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cutile-cache-")


def gpu_executor(index: int):
    """A picklable factory of the spawned worker's executor (the default timing mode)."""
    return functools.partial(GpuExecutor, FORWARD, index)


def tune(problem, db, storage, config, compile_workers):
    device = select_device("sm_90")
    with IsolatedExecutor(gpu_executor(device.index)) as executor:
        tuner = Tuner(executor, family=FORWARD, arch=device.arch, device_name=device.name,
                      storage_url=storage, db=db, config=config, compile_workers=compile_workers)
        try:
            return tuner.tune(problem), executor
        finally:
            tuner.close()


def tflops(problem, t):
    return problem.flops / (t.median_ms * 1e-3) / 1e12 if isinstance(t, Timing) else float("nan")


def main(out: str) -> int:
    os.makedirs(out, exist_ok=True)
    storage = f"sqlite:///{out}/studies.sqlite"
    lines = []
    with open_database(f"{out}/schedules.sqlite") as db:
        fresh_cache()
        causal = Problem(batch=4, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096,
                         head_dim=128, dtype="bf16", causal=True)
        small = Problem(batch=8, heads_q=16, heads_kv=16, seqlen_q=2048, seqlen_k=2048,
                        head_dim=64, dtype="bf16", causal=False)
        lines.append("## 1. full-space search, 40 measured candidates per key")
        lines.append("| key | best | TFLOP/s | default | cuDNN | flash | best/default | "
                     "best/cuDNN | best/flash | failed | wall s |")
        lines.append("|" + "---|" * 11)
        for problem in (causal, small):
            cfg = SearchConfig(n_trials=40, patience=None, study_prefix="full")
            r, _ = tune(problem, db, storage, cfg, compile_workers=8)
            t = r.timings
            ratio = lambda n: (t[n].median_ms / t["best"].median_ms
                               if isinstance(t.get(n), Timing) else float("nan"))
            lines.append(
                f"| {problem.describe()} | {r.best.describe()} | {tflops(problem, t['best']):.0f} "
                f"| {tflops(problem, t.get('default')):.0f} | "
                f"{tflops(problem, t.get('torch-cudnn')):.0f} | "
                f"{tflops(problem, t.get('torch-flash')):.0f} | {ratio('default'):.2f} | "
                f"{ratio('torch-cudnn'):.2f} | {ratio('torch-flash'):.2f} | "
                f"{dict(r.failures) or 0} | {r.wall_s:.0f} |")
            print("\n".join(lines[-1:]), flush=True)

        lines.append("\n## 2. exhaustive sweep vs search, compact space, " + small.describe())
        results = {}
        for name, n_trials, workers in (("exhaustive", 1000, 8), ("search", 38, 8),
                                        ("search-no-overlap", 38, 0)):
            fresh_cache()
            cfg = SearchConfig(n_trials=n_trials, patience=None, space="compact",
                               study_prefix=name, lookahead=4 if workers else 1)
            results[name] = tune(small, None, storage, cfg, compile_workers=workers)[0]
            print(name, results[name].measured, f"{results[name].wall_s:.0f}s", flush=True)
        device = select_device("sm_90")
        with IsolatedExecutor(gpu_executor(device.index)) as executor:
            both = executor.call("retime", small, {
                "exhaustive": results["exhaustive"].best, "search": results["search"].best},
                False, deadline=300)  # False: no torch baselines
        ex, se = both["exhaustive"], both["search"]
        lines.append("| run | candidates timed | wall s | compile hidden s | winner | "
                     "re-timed ms |")
        lines.append("|---|---|---|---|---|---|")
        for name, r in results.items():
            timed = both.get(name)
            lines.append(f"| {name} | {r.measured} | {r.wall_s:.0f} | {r.compile_overlap_s:.0f} | "
                         f"{r.best.describe() if r.best else '-'} | "
                         f"{timed.median_ms:.4f} |" if isinstance(timed, Timing) else
                         f"| {name} | {r.measured} | {r.wall_s:.0f} | {r.compile_overlap_s:.0f} | "
                         f"{r.best.describe() if r.best else '-'} | (see search) |")
        lines.append(f"\nsearch winner speed / exhaustive winner speed = "
                     f"{ex.median_ms / se.median_ms:.3f} with "
                     f"{results['search'].measured / results['exhaustive'].measured:.0%} of the "
                     f"timed candidates")
        lines.append(f"compile-ahead wall-clock gain: "
                     f"{results['search-no-overlap'].wall_s:.0f} s -> "
                     f"{results['search'].wall_s:.0f} s for 38 candidates")
        dump_rows(db.rows(), f"{out}/tuned_rows.json")
    text = "\n".join(lines)
    print(text)
    with open(f"{out}/tune_experiment.md", "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
