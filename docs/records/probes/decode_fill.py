"""Decode batches of fewer (batch x K/V head) rows than SMs, contiguous caches (issue 49: every
GPU-bound decode shape at least 1.0x cuDNN; a survey found B24 H28/4 over 37k keys, 96 rows, at
0.91x): the sm_90 default (one split: ``132 // rows``) against more splits at two CTAs an SM,
merged as the default merges (the block merge, as a dependent launch on Hopper), cuDNN
beside. Interleaved, the L2 flushed before each sample; shares of the device copy rate
measured in the same run, on the K/V bytes read once.

    source .devtk/setup.sh && python3 docs/records/probes/decode_fill.py [--rounds 20] [--check]

Candidates: ``sN``: N splits at two CTAs an SM (the rule's merge for split calls);
``sN occ1``: at one. ``fill``: the splits that make the CTAs closest to whole waves of two an SM.

``--check``: other points (none of the sweep's), the default (since ``FILL_MAX_ROWS_SHARE``)
against one split at one CTA an SM (the rule before it), cuDNN beside.
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import copy_rate, report  # noqa: E402

#: (B, H_q, H_kv, keys, D): rows = B x H_kv below 132
POINTS = ((24, 28, 4, 37185, 128), (10, 32, 8, 20000, 128), (12, 64, 8, 8000, 128),
          (15, 32, 8, 3000, 128), (100, 8, 1, 4000, 128), (7, 16, 16, 12000, 64),
          (3, 32, 32, 30000, 128), (20, 40, 5, 16000, 128), (9, 28, 4, 60000, 128),
          (70, 16, 1, 9000, 64))
CHECK = ((9, 64, 8, 12000, 128), (11, 32, 8, 5000, 128), (84, 8, 1, 6000, 128),
         (5, 16, 16, 20000, 64), (2, 40, 40, 7000, 128), (18, 28, 4, 2500, 128),
         (10, 32, 8, 1500, 128), (10, 32, 8, 9000, 256), (68, 14, 1, 30000, 128),
         (4, 20, 20, 11111, 96))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    copy_gbps = copy_rate()
    for b, hq, hkv, sk, d in CHECK if args.check else POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype="bf16", causal=False)
        case = ta.DECODE.case(p, 0)
        default = ta.DECODE.default_schedule("sm_90", p)
        rows = b * hkv
        merged = "block_pdl" if d <= 128 else "block"
        candidates = {"default": default}
        if args.check:
            candidates["previous"] = default.replace(splits=1, occupancy=1, combine="block")
        for splits in () if args.check else (2, 3, 4, 8):
            candidates[f"s{splits}"] = default.replace(splits=splits, occupancy=2,
                                                       combine=merged)
        if not args.check:
            candidates["s2 occ1"] = default.replace(splits=2, occupancy=1, combine=merged)
            waves = [(abs(rows * s / 264 - round(rows * s / 264)) / (rows * s / 264), s)
                     for s in range(2, 17) if rows * s >= 264]
            fill = min(waves)[1]
            if f"s{fill}" not in candidates:
                candidates[f"fill s{fill}"] = default.replace(splits=fill, occupancy=2,
                                                              combine=merged)
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        fns["torch-cudnn"] = case.baselines()["torch-cudnn"]
        errors["torch-cudnn"] = float("nan")
        times = time_interleaved(fns, rounds=args.rounds)
        kv = b * hkv * sk * d * 2 * 2
        print(f"== {p.describe()} rows {rows} default {default.describe()}")
        report(times, kv, copy_gbps, errors, candidates)
        cudnn = times["torch-cudnn"].median_ms
        print("  cuDNN/ours: " + "  ".join(f"{n}={cudnn / t.median_ms:.3f}"
                                          for n, t in times.items() if n != "torch-cudnn"))


if __name__ == "__main__":
    main()
