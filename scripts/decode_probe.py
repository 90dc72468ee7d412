"""GPU probe for the decode family: correctness of a few schedules, a schedule sweep on the
B = 1 and batched decode points against cuDNN and the copy bandwidth, and the S_q crossover
between the decode and forward families (the dispatch rule's measurement).

    python scripts/decode_probe.py --out DIR [--quick]

Prints tables; writes DIR/probe.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import tiledattention as ta
from tuner.measure import time_interleaved

sys.stdout.reconfigure(line_buffering=True)


def problem(b, hq, hkv, sq, sk, d=128, dtype="bf16", causal=False, br=False):
    return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                      dtype=dtype, causal=causal, bottom_right=br)


def copy_gbps() -> float:
    src = torch.empty(1 << 29, dtype=torch.float32, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    t = time_interleaved({"copy": lambda: dst.copy_(src)}, rounds=20)["copy"]
    return 2 * src.numel() * 4 / (t.median_ms * 1e-3) / 1e9


def bytes_moved(p) -> int:
    e = 2
    return e * (2 * p.batch * p.heads_q * p.seqlen_q * p.head_dim
                + 2 * p.batch * p.heads_kv * p.seqlen_k * p.head_dim)


def correctness(log):
    cases = [
        (problem(1, 32, 8, 1, 32768), ta.DecodeSchedule(splits=16, tile_n=128, combine="pdl")),
        (problem(2, 28, 4, 1, 4097), ta.DecodeSchedule(splits=3)),
        (problem(3, 8, 8, 7, 100, d=64, causal=True, br=True), ta.DecodeSchedule(splits=2)),
        (problem(2, 16, 2, 16, 8191, d=96, dtype="fp16", causal=True, br=True),
         ta.DecodeSchedule(splits=5, tile_m=64, k_transposed=True)),
        (problem(1, 32, 1, 2, 1), ta.DecodeSchedule(splits=4)),
        (problem(2, 8, 2, 64, 4097, d=256, causal=True), ta.DecodeSchedule(splits=3,
                                                                           tile_n=32)),
        (problem(1, 8, 2, 9, 5, causal=True, br=True), ta.DecodeSchedule(splits=2)),
        (problem(2, 8, 2, 5, 300), ta.DecodeSchedule(splits=4, pack_heads=False, exp2=False)),
    ]
    rows = []
    for p, s in cases:
        case = ta.DECODE.case(p, 0)
        err = case.error(case.launcher(s))
        ok = err <= ta.DECODE.tolerance(p)
        rows.append((p.describe(), s.describe(), err, ok))
        log(f"correct {p.describe():50s} {s.describe():40s} err={err:.2e} {'ok' if ok else 'FAIL'}")
    return rows


def sweep(point, schedules, copy, log):
    case = ta.DECODE.case(point, 0)
    fns, errs = {}, {}
    for s in schedules:
        try:
            run = case.launcher(s)
            errs[s.describe()] = case.error(run)
            fns[s.describe()] = run
        except Exception as exc:  # a failing candidate is reported, not fatal
            log(f"  {s.describe()}: {type(exc).__name__}: {str(exc)[:200]}")
    for name, run in case.baselines().items():
        try:
            run()
            fns[name] = run
        except Exception as exc:
            log(f"  {name}: unavailable ({type(exc).__name__})")
    times = time_interleaved(fns, rounds=25)
    moved = bytes_moved(point)
    cudnn = times.get("torch-cudnn")
    out = []
    for name, t in sorted(times.items(), key=lambda kv: kv[1].median_ms):
        gbps = moved / (t.median_ms * 1e-3) / 1e9
        vs = cudnn.median_ms / t.median_ms if cudnn else float("nan")
        out.append({"name": name, "ms": t.median_ms, "gbps": gbps, "copy_share": gbps / copy,
                    "vs_cudnn": vs, "err": errs.get(name)})
    return out


def crossover(log):
    """Forward (its lookup) vs decode (its default) over S_q."""
    rows = []
    for b, hq, hkv in ((1, 32, 8), (8, 32, 8), (4, 16, 16), (32, 32, 8)):
        for sk in (4096, 32768):
            for sq in (1, 8, 16, 32, 64, 128):
                if b * hkv * sk > 2 ** 21:
                    continue
                p = problem(b, hq, hkv, sq, sk)
                case = ta.DECODE.case(p, 0)
                dec = ta.DECODE.default_schedule("sm_90", p)
                q, k, v = case.q, case.k, case.v
                fwd_s = ta.runtime().resolution(ta.FORWARD, p, 0).schedule
                fns = {
                    "decode": lambda: ta.sdpa(q, k, v, False,
                                              schedule=dec),
                    "forward": lambda: ta.sdpa(q, k, v, False,
                                               schedule=fwd_s),
                }
                try:
                    t = time_interleaved(fns, rounds=15)
                except Exception as exc:
                    log(f"crossover {p.describe()}: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                ratio = t["forward"].median_ms / t["decode"].median_ms
                rows.append({"problem": p.describe(), "b": b, "group": hq // hkv, "sq": sq,
                             "sk": sk, "decode_ms": t["decode"].median_ms,
                             "forward_ms": t["forward"].median_ms, "decode_speedup": ratio})
                log(f"crossover {p.describe():50s} decode {t['decode'].median_ms:.4f} ms "
                    f"forward {t['forward'].median_ms:.4f} ms  forward/decode {ratio:.2f}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of sections to skip")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    logf = open(f"{args.out}/probe.log", "w")

    def log(msg):
        print(msg)
        logf.write(msg + "\n")
        logf.flush()

    result = {"device": torch.cuda.get_device_name(0)}
    start = time.time()
    result["copy_gbps"] = copy = copy_gbps()
    log(f"copy bandwidth {copy:.0f} GB/s")
    if "correct" not in skip:
        result["correct"] = correctness(log)
    S = ta.DecodeSchedule
    sweeps = {}
    if "sweep" not in skip:
        b1 = [S(splits=n, tile_n=128, k_latency=2, v_latency=2, occupancy=o)
              for n in (8, 12, 16, 24, 32) for o in (1, 2)] + [
            S(splits=16, tile_n=128, k_latency=2, v_latency=2, combine="pdl"),
            S(splits=16, tile_n=256, k_latency=2, v_latency=2),
            S(splits=16, tile_n=128, k_latency=3, v_latency=3),
            S(splits=16, tile_n=64, k_latency=4, v_latency=4, combine="kernel")]
        points = [problem(1, 32, 8, 1, 32768), problem(1, 32, 8, 1, 131072)]
        if not args.quick:
            points.append(problem(1, 32, 8, 1, 4096))
        for p in points:
            sched = list(b1)
            sched.append(ta.DECODE.default_schedule("sm_90", p))
            sweeps[p.describe()] = r = sweep(p, sched, copy, log)
            log(f"== {p.describe()}")
            for row in r[:8] + [x for x in r if x["name"].startswith("torch")]:
                log(f"  {row['name']:45s} {row['ms']:.4f} ms {row['gbps']:7.0f} GB/s "
                    f"{100 * row['copy_share']:5.1f}% copy  {row['vs_cudnn']:.2f}x cuDNN")
        batched = [S(splits=n, tile_n=128, k_latency=2, v_latency=2)
                   for n in (1, 2, 3, 4)]
        for b in ((8,) if args.quick else (8, 32)):
            for sk in (8192,):
                p = problem(b, 32, 8, 1, sk)
                sweeps[p.describe()] = r = sweep(
                    p, batched + [ta.DECODE.default_schedule("sm_90", p)], copy, log)
                log(f"== {p.describe()}")
                for row in r[:5] + [x for x in r if x["name"].startswith("torch")]:
                    log(f"  {row['name']:45s} {row['ms']:.4f} ms {row['gbps']:7.0f} GB/s "
                        f"{100 * row['copy_share']:5.1f}% copy  {row['vs_cudnn']:.2f}x cuDNN")
        p = problem(8, 32, 8, 16, 8192, causal=True, br=True)
        sweeps[p.describe()] = r = sweep(
            p, [S(splits=n, tile_n=t, tile_m=m, k_latency=2, v_latency=2, combine="pdl")
                for n in (1, 2, 4) for t in (64, 128) for m in (64, 128)], copy, log)
        log(f"== {p.describe()}")
        for row in r[:5] + [x for x in r if x["name"].startswith("torch")]:
            log(f"  {row['name']:45s} {row['ms']:.4f} ms {row['vs_cudnn']:.2f}x cuDNN")
    result["sweeps"] = sweeps
    if "crossover" not in skip:
        result["crossover"] = crossover(log)
    result["seconds"] = time.time() - start
    with open(f"{args.out}/probe.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    log(f"done in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
