"""Decode batches of 89-131 (batch x K/V head) rows over long contiguous caches (issue 49; the
fill probe, ``decode_fill.py``, read 8 splits at two CTAs an SM 1.04-1.05x the one split at 96
rows over 30-37k keys, 0.88-0.98x over 8-16k): the default against 4-8 splits at two CTAs an
SM, K loads two or four ahead, cuDNN beside. Interleaved, L2 flushed, GPU time, medians.

    source .devtk/setup.sh && python3 docs/records/probes/decode_rows_long.py [--rounds 20]
        [--d64]   # D 64 calls of 89-131 rows: the default against 2 and 4 splits, two CTAs an SM
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import copy_rate, report  # noqa: E402

POINTS = ((13, 32, 8, 24000, 128), (120, 8, 1, 20000, 128), (14, 64, 8, 32000, 128),
          (100, 16, 1, 40000, 64), (11, 40, 10, 50000, 128), (6, 16, 16, 28000, 128))
D64 = ((100, 16, 1, 40000, 64), (120, 8, 1, 9000, 64), (12, 64, 8, 6000, 64),
       (30, 32, 4, 20000, 64), (110, 32, 1, 4000, 64), (11, 24, 8, 15000, 64))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--d64", action="store_true")
    args = parser.parse_args()
    copy_gbps = copy_rate()
    for b, hq, hkv, sk, d in D64 if args.d64 else POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype="bf16", causal=False)
        case = ta.DECODE.case(p, 0)
        default = ta.DECODE.default_schedule("sm_90", p)
        candidates = {"default": default}
        for splits in (2, 4) if args.d64 else (4, 6, 8):
            for k in (2,) if args.d64 else (2, 4):
                candidates[f"s{splits} K{k}"] = default.replace(
                    splits=splits, occupancy=2, combine="block_pdl", k_latency=k)
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        fns["torch-cudnn"] = case.baselines()["torch-cudnn"]
        errors["torch-cudnn"] = float("nan")
        times = time_interleaved(fns, rounds=args.rounds)
        print(f"== {p.describe()} rows {b * hkv} default {default.describe()}")
        report(times, b * hkv * sk * d * 4, copy_gbps, errors, candidates)
        base = times["default"].median_ms
        print("  speed vs default: " + "  ".join(f"{n}={base / t.median_ms:.3f}"
                                                for n, t in times.items()))


if __name__ == "__main__":
    main()
