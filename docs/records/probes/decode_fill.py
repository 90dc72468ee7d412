"""Decode batches of fewer (batch x K/V head) rows than SMs, contiguous caches (issue 49: every
GPU-bound decode shape at least 1.0x cuDNN; a survey found B24 H28/4 over 37k keys, 96 rows, at
0.91x): the sm_90 default (one split: ``132 // rows``) against more splits at two CTAs an SM,
merged as the default merges (the block merge, as a dependent launch on Hopper), cuDNN
beside. Interleaved, the L2 flushed before each sample; shares of the device copy rate
measured in the same run, on the K/V bytes read once.

    source .devtk/setup.sh && python3 docs/records/probes/decode_fill.py [--rounds 20]
        [--check | --long | --d64]

Candidates: ``sN``: N splits at two CTAs an SM (the rule's merge for split calls);
``sN occ1``: at one. ``fill``: the splits that make the CTAs closest to whole waves of two an SM.

- ``--check``: other points (none of the sweep's), the default (since ``FILL_MAX_ROWS_SHARE``)
  against one split at one CTA an SM (the rule before it);
- ``--long``: 96-120 rows over long caches, 4, 6 and 8 splits with K loads two and four ahead;
- ``--d64``: D 64 calls of 88-120 rows (256-key steps), 2 and 4 splits.
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
LONG = ((13, 32, 8, 24000, 128), (120, 8, 1, 20000, 128), (14, 64, 8, 32000, 128),
        (100, 16, 1, 40000, 64), (11, 40, 10, 50000, 128), (6, 16, 16, 28000, 128))
D64 = ((100, 16, 1, 40000, 64), (120, 8, 1, 9000, 64), (12, 64, 8, 6000, 64),
       (30, 32, 4, 20000, 64), (110, 32, 1, 4000, 64), (11, 24, 8, 15000, 64))


def candidates_for(mode, default, rows, merged):
    """The schedules a mode times beside the default."""
    def split(n, **changes):
        return default.replace(splits=n, occupancy=2, combine=merged, **changes)

    if mode == "check":
        return {"previous": default.replace(splits=1, occupancy=1, combine="block")}
    if mode == "long":
        return {f"s{n} K{k}": split(n, k_latency=k) for n in (4, 6, 8) for k in (2, 4)}
    if mode == "d64":
        return {f"s{n}": split(n) for n in (2, 4)}
    found = {f"s{n}": split(n) for n in (2, 3, 4, 8)}
    found["s2 occ1"] = default.replace(splits=2, occupancy=1, combine=merged)
    waves = [(abs(rows * s / 264 - round(rows * s / 264)) / (rows * s / 264), s)
             for s in range(2, 17) if rows * s >= 264]
    fill = min(waves)[1]
    if f"s{fill}" not in found:
        found[f"fill s{fill}"] = split(fill)
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    modes = parser.add_mutually_exclusive_group()
    for mode in ("check", "long", "d64"):
        modes.add_argument(f"--{mode}", dest="mode", action="store_const", const=mode)
    args = parser.parse_args()
    points = {"check": CHECK, "long": LONG, "d64": D64}.get(args.mode, POINTS)
    copy_gbps = copy_rate()
    for b, hq, hkv, sk, d in points:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype="bf16", causal=False)
        case = ta.DECODE.case(p, 0)
        default = ta.DECODE.default_schedule("sm_90", p)
        rows = b * hkv
        merged = "block_pdl" if d <= 128 else "block"
        candidates = {"default": default,
                      **candidates_for(args.mode, default, rows, merged)}
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        fns["torch-cudnn"] = case.baselines()["torch-cudnn"]
        errors["torch-cudnn"] = float("nan")
        times = time_interleaved(fns, rounds=args.rounds)
        print(f"== {p.describe()} rows {rows} default {default.describe()}")
        report(times, rows * sk * d * 2 * 2, copy_gbps, errors, candidates)
        cudnn, base = times["torch-cudnn"].median_ms, times["default"].median_ms
        print("  cuDNN/ours: " + "  ".join(f"{n}={cudnn / t.median_ms:.3f}"
                                          for n, t in times.items() if n != "torch-cudnn"))
        print("  speed vs default: " + "  ".join(f"{n}={base / t.median_ms:.3f}"
                                                for n, t in times.items()))


if __name__ == "__main__":
    main()
