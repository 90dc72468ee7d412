"""A serving process's first calls: 16 prompt lengths, Llama-shaped (bf16, H 32/8, D 128,
causal), each prefill followed by one decode step over its cache, in a fresh process.

    # the shipped cubins for these calls (any machine with the compiler, here for sm_90):
    tiledtune aot --arch sm_90 --no-shipped --out cubins \\
        $(python scripts/cold_start.py --aot-problems)
    # a fresh process, empty cuTile cache, no compiler on PATH, compiling forbidden:
    CUDA_TILE_CACHE_DIR=$(mktemp -d) TILEDATTENTION_CUBINS=cubins/cubins-sm_90.zip \\
        TILEDATTENTION_JIT=0 python scripts/cold_start.py --label aot
    # the same with the JIT:
    CUDA_TILE_CACHE_DIR=$(mktemp -d) python scripts/cold_start.py --label jit

``--model HQ/HKV,D`` serves another model's shapes at the same lengths, e.g. from the cubins
``tiledtune warm --model 28/4,128 --arch sm_90`` built into the cubin cache (its default
lengths and batches, which are not the calls' own lengths).

It prints one JSON line: the first pass's wall time (every call of the sequence once,
synchronised after each, so each call's compile or load is in its own time), each call's
first time, and the steady state of the same sequence (its median of ``--repeats`` passes).
With ``--save FILE`` it also saves the outputs, for a bitwise comparison of two runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LENGTHS = (100, 173, 256, 390, 512, 700, 1000, 1024, 1500, 2048, 2600, 3000, 4096, 5000, 6144,
           8192)
HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128


def aot_problems() -> list[str]:
    """``--problem`` options of ``tiledtune aot`` for these calls (the default model's)."""
    base = f"batch=1,heads_q={HEADS_Q},heads_kv={HEADS_KV},head_dim={HEAD_DIM},dtype=bf16"
    found = []
    for n in LENGTHS:
        found += ["--problem", f"kernel=forward,{base},seqlen_q={n},seqlen_k={n},causal=yes",
                  "--problem", f"kernel=decode,{base},seqlen_q=1,seqlen_k={n + 1},causal=no"]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="run")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--save", type=Path)
    parser.add_argument("--model", default=f"{HEADS_Q}/{HEADS_KV},{HEAD_DIM}",
                        help="HQ/HKV,D of the calls (default %(default)s)")
    parser.add_argument("--aot-problems", action="store_true",
                        help="print the tiledtune aot --problem options and exit")
    args = parser.parse_args()
    if args.aot_problems:
        print(" ".join(aot_problems()))
        return 0
    heads, _, head_dim = args.model.partition(",")
    heads_q, _, heads_kv = heads.partition("/")
    heads_q, heads_kv, head_dim = int(heads_q), int(heads_kv or heads_q), int(head_dim)
    start = time.perf_counter()
    import torch

    import tiledattention

    torch.manual_seed(0)
    calls = []
    for n in LENGTHS:
        q = torch.randn(1, heads_q, n, head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, heads_kv, n + 1, head_dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        step = torch.randn(1, heads_q, 1, head_dim, device="cuda", dtype=torch.bfloat16)
        calls.append((f"prefill {n}", lambda q=q, k=k[:, :, :n], v=v[:, :, :n]:
                      tiledattention.sdpa(q, k, v, causal=True)))
        calls.append((f"decode {n + 1}", lambda s=step, k=k, v=v: tiledattention.sdpa(s, k, v)))
    torch.cuda.synchronize()
    setup = time.perf_counter() - start
    first, outputs = {}, []
    begin = time.perf_counter()
    for name, call in calls:
        t0 = time.perf_counter()
        outputs.append(call())
        torch.cuda.synchronize()
        first[name] = time.perf_counter() - t0
    first_pass = time.perf_counter() - begin
    passes = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _, call in calls:
            call()
        torch.cuda.synchronize()
        passes.append(time.perf_counter() - t0)
    steady = statistics.median(passes)
    if args.save:
        torch.save([o.cpu() for o in outputs], args.save)
    print(json.dumps({"label": args.label, "model": args.model, "setup_s": round(setup, 3),
                      "first_pass_s": round(first_pass, 3), "steady_pass_s": round(steady, 5),
                      "first_call_overhead_s": round(first_pass - steady, 3),
                      "slowest_first_calls": sorted(first.items(), key=lambda kv: -kv[1])[:4]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
