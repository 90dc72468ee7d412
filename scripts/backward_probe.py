"""GPU probe of the backward kernels: correctness of the default schedule over odd shapes, then
each kernel's tiles and occupancy timed alone (interleaved with torch's flash and cuDNN
backward) at the bench grid's S = 4k points, to choose the per-architecture defaults.

    python scripts/backward_probe.py [--quick] [--out DIR]

Candidates are compiled ahead in parallel processes (cuTile's disk cache then serves the
launches). Prints a table per point; writes probe.json to --out.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time

import cuda.tile as ct
import torch

import tiledattention as ta
from tiledattention.backward import _launch as L
from tuner.measure import time_interleaved

CORRECTNESS = [  # (B, H_q, H_kv, S_q, S_k, D, causal, bottom_right, dtype)
    (1, 8, 2, 1, 1, 64, False, False, "bf16"),
    (2, 8, 2, 17, 1000, 128, False, False, "bf16"),
    (1, 8, 8, 1000, 1000, 128, True, False, "bf16"),
    (2, 4, 1, 257, 300, 96, True, False, "fp16"),
    (1, 8, 2, 300, 257, 40, True, True, "bf16"),
    (1, 4, 4, 777, 100, 256, True, True, "fp16"),
    (1, 8, 1, 1000, 4097, 64, True, True, "bf16"),
    (1, 16, 4, 2048, 2048, 128, True, False, "bf16"),
    (2, 6, 3, 333, 333, 256, False, False, "bf16"),
    (1, 32, 8, 7, 4000, 128, False, False, "fp16"),
]

#: (tiles, occupancies, worker warps, latency hints) per kernel
DKDV = ([(64, 64), (64, 128), (64, 32), (32, 64)], (1, 2), (None, 8), (None, 3))
DQ = ([(64, 64), (64, 128), (128, 64)], (2, 3, 4), (None, 8), (None,))


def _compile(args):
    problem, schedule = args
    try:
        ta.compile_backward(problem, schedule, "sm_90")
        return None
    except ta.CompileError as exc:
        return str(exc)[:300]


def _problems(quick: bool):
    out = []
    for d in (64, 128, 256):
        for causal in (False, True):
            s = 4096
            out.append(ta.Problem(batch=16384 // s, heads_q=2048 // d, heads_kv=2048 // d,
                                  seqlen_q=s, seqlen_k=s, head_dim=d, causal=causal,
                                  dtype="bf16"))
            if quick:
                break
    return out


def _candidates(problem):
    base = ta.BACKWARD.default_schedule("sm_90", problem)
    tiles, occs, warps, lats = DKDV
    dkdv = [base.replace(dkdv_tile_n=n, dkdv_tile_m=m, dkdv_occupancy=o, dkdv_worker_warps=w,
                         q_latency=lat)
            for n, m in tiles for o in occs for w in warps for lat in lats]
    tiles, occs, warps, lats = DQ
    dq = [base.replace(dq_tile_m=m, dq_tile_n=n, dq_occupancy=o, dq_worker_warps=w,
                       kv_latency=lat)
          for m, n in tiles for o in occs for w in warps for lat in lats]
    if problem.head_dim == 256:  # 128-row tiles of D = 256 hold 128 KiB of accumulators
        dkdv = [s for s in dkdv if s.dkdv_tile_n * s.dkdv_tile_m <= 64 * 64]
        dq = [s for s in dq if s.dq_tile_m * s.dq_tile_n <= 64 * 64]
    return base, dkdv, dq


def correctness(log):
    rows = []
    for b, hq, hk, sq, sk, d, causal, br, dtype in CORRECTNESS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hk, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                       causal=causal, bottom_right=br, dtype=dtype)
        case = ta.BACKWARD.case(p, 0)
        s = ta.BACKWARD.default_schedule("sm_90", p)
        run = case.launcher(s)
        err = case.error(run)
        errs = ta.backward._family.relative_errors(case.grads, case.reference_grads)
        torch_err = None
        try:
            grads = case.baselines()["torch-cudnn"]()
            torch_err = max(ta.backward._family.relative_errors(grads, case.reference_grads))
        except Exception as exc:  # cuDNN cannot run some shapes
            print(f"  cudnn n/a for {p.describe()}: {type(exc).__name__}", file=log)
        ok = err <= ta.BACKWARD.tolerance(p)
        rows.append({"problem": p.describe(), "error": err, "dq_dk_dv": errs,
                     "cudnn_error": torch_err, "ok": ok})
        print(f"{'ok ' if ok else 'BAD'} {p.describe():60s} err {err:.2e} "
              f"(dq {errs[0]:.1e} dk {errs[1]:.1e} dv {errs[2]:.1e}) cudnn "
              f"{torch_err if torch_err is None else f'{torch_err:.2e}'}", flush=True)
    return rows


def sweep(problem, log, rounds):
    base, dkdv, dq = _candidates(problem)
    case = ta.BACKWARD.case(problem, 0)
    stream = torch.cuda.current_stream()
    fns = {}
    bad = {}
    plan0 = L.launches(problem, base, case.scale)
    L.launch(stream, plan0, case.q, case.k, case.v, case.out, case.grad_out, case.lse, case.delta,
             *case.grads)  # delta for the dK/dV-only runs
    for s in dkdv:
        plan = L.launches(problem, s, case.scale)
        name = s.describe().split(" | ")[0]
        args = (case.q, case.k, case.v, case.grad_out, case.lse, case.delta, case.grads[1],
                case.grads[2], plan.scale, *plan.dkdv_scalars)
        fns[name] = lambda g=plan.dkdv_grid, k=plan.dkdv, a=args: ct.launch(stream, g, k, a)
    for s in dq:
        plan = L.launches(problem, s, case.scale)
        name = s.describe().split(" | ")[1]
        args = (case.q, case.k, case.v, case.out, case.grad_out, case.lse, case.delta,
                case.grads[0], plan.scale, *plan.dq_scalars)
        fns[name] = lambda g=plan.dq_grid, k=plan.dq, a=args: ct.launch(stream, g, k, a)
    for name, fn in list(fns.items()):
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as exc:
            bad[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            del fns[name]
    fns["default both"] = case.launcher(base)
    for name, fn in case.baselines().items():
        try:
            fn()
            torch.cuda.synchronize()
            fns[name] = fn
        except Exception as exc:
            bad[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    times = time_interleaved(fns, rounds=rounds)
    flops = ta.BACKWARD.flops(problem)
    print(f"== {problem.describe()}  default: {base.describe()}", flush=True)
    result = {}
    for name, t in sorted(times.items(), key=lambda kv: kv[1].median_ms):
        ms = t.median_ms
        result[name] = ms
        extra = f"{flops / ms / 1e9:7.1f} TFLOP/s" if name in ("default both", "torch-cudnn",
                                                               "torch-flash") else ""
        print(f"  {name:26s} {ms:8.3f} ms {extra}", flush=True)
    for name, why in bad.items():
        print(f"  {name:26s} failed: {why}", flush=True)
    return {"problem": problem.describe(), "ms": result, "failed": bad}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--skip-correctness", action="store_true")
    args = ap.parse_args()
    log = sys.stderr
    problems = _problems(args.quick)
    work = []
    for p in problems:
        base, dkdv, dq = _candidates(p)
        work += [(p, s) for s in [base, *dkdv, *dq]]
    start = time.time()
    with cf.ProcessPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 2)) as pool:
        failures = [e for e in pool.map(_compile, work) if e]
    print(f"compiled {len(work)} candidates ahead in {time.time() - start:.0f} s; "
          f"{len(failures)} failed", flush=True)
    for e in failures[:10]:
        print("  ", e, flush=True)
    report = {"correctness": [] if args.skip_correctness else correctness(log), "sweeps": []}
    for p in problems:
        report["sweeps"].append(sweep(p, log, args.rounds))
    with open(os.path.join(args.out, "probe.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
