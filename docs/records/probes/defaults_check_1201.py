"""Held-out check of two sm_90 default rules of 2026-12-01 on calls none of their probes ran:
the decode rule that splits D 64 calls of 89-131 rows for two CTAs an SM (256-key steps) and
the forward rule that walks full-mask D 256 key tiles sawtooth at 513-2048 keys. Each call: the
default against the default before the rule, torch's cuDNN beside; interleaved, L2 flushed, GPU
time, medians.

    source .devtk/setup.sh && python3 docs/records/probes/defaults_check_1201.py [--rounds 15]
"""

import argparse

import tiledattention as ta
from tuner.measure import time_interleaved

DECODE = ((13, 16, 8, 7000, "bf16"), (44, 20, 2, 30000, "fp16"), (125, 4, 1, 12000, "bf16"),
          (6, 64, 16, 5000, "fp16"))
FORWARD = ((12, 16, 4, 1200, "bf16"), (40, 8, 8, 800, "fp16"), (6, 32, 8, 1777, "bf16"),
           (3, 24, 24, 2000, "fp16"))


def run(case, candidates, rounds, label):
    fns = {n: case.launcher(s) for n, s in candidates.items()}
    errors = {n: case.error(f) for n, f in fns.items()}
    fns["torch-cudnn"] = case.baselines()["torch-cudnn"]
    times = time_interleaved(fns, rounds=rounds)
    base = times["previous"].median_ms
    cudnn = times["torch-cudnn"].median_ms
    print(f"== {label} default {candidates['default'].describe()}")
    for n, t in times.items():
        print(f"  {n:12s} {t.median_ms * 1e3:8.1f} us  speed vs previous x{base / t.median_ms:.3f}"
              f"  cuDNN/this {cudnn / t.median_ms:.3f}  err {errors.get(n, float('nan')):.1e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    for b, hq, hkv, sk, dtype in DECODE:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=64,
                       dtype=dtype, causal=False)
        d = ta.DECODE.default_schedule("sm_90", p)
        run(ta.DECODE.case(p, 0), {"default": d, "previous": d.replace(splits=1, occupancy=1,
                                                                       combine="block")},
            args.rounds, f"{p.describe()} rows {b * hkv}")
    for b, hq, hkv, s, dtype in FORWARD:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=256,
                       dtype=dtype, causal=False)
        d = ta.FORWARD.default_schedule("sm_90", p)
        run(ta.FORWARD.case(p, 0), {"default": d, "previous": d.replace(kv_sawtooth=False)},
            args.rounds, p.describe())


if __name__ == "__main__":
    main()
