"""Does a compile-only build (tiledattention.compile_schedule) produce the cubin the JIT of
``ct.launch`` looks up in cuTile's disk cache? Prints the kernel symbol each path produced and
the time of the first launch after a compile-only build (a cache hit costs ~0.4 s, a miss a
full tileiras run)."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
import time

cache_dir = tempfile.mkdtemp(prefix="cutile-cache-")
os.environ["CUDA_TILE_CACHE_DIR"] = cache_dir

import torch  # noqa: E402

import cuda.tile as ct  # noqa: E402

from tiledattention import FORWARD, Problem, Schedule, compile_schedule  # noqa: E402


def names() -> list[str]:
    found = []
    for root, _, files in os.walk(cache_dir):
        for f in files:
            if f.endswith(".db"):
                con = sqlite3.connect(os.path.join(root, f))
                for table, in con.execute("select name from sqlite_master where type='table'"):
                    cols = [c[1] for c in con.execute(f"pragma table_info({table})")]
                    if "metadata" in cols:
                        for (meta,) in con.execute(f"select metadata from {table}"):
                            found += json.loads(meta).get("kernel_names", [])
    return found


problem = Problem(batch=2, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024, head_dim=128,
                  dtype="bf16", causal=False)
schedule = Schedule(tile_m=64, tile_n=128, occupancy=2, exp2=True)
t0 = time.perf_counter()
compile_schedule(problem, schedule, "sm_90")
print(f"compile-only: {time.perf_counter() - t0:.2f} s; cache: {names()}")
q, k, v = (torch.randn(2, 8, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out = torch.empty_like(q)
t0 = time.perf_counter()
plan = FORWARD.plan(problem, schedule, 0, None, False)  # sdpa's launch: kernel, grid, arguments
ct.launch(torch.cuda.current_stream(), plan.grid, plan.kernel, (q, k, v, out) + plan.scalars)
torch.cuda.synchronize()
print(f"first JIT launch after it: {time.perf_counter() - t0:.2f} s; cache now: {names()}")
sys.exit(0)
