"""Probe (issue 29): the decode default's packed tile for groups of many query rows (group size
x S_q above 64), timed against the same rule capped at 64 and 32 rows, and cuDNN."""
import sys
import tiledattention.decode._defaults as defaults
from tiledattention import DECODE, Problem
from tuner.measure import time_interleaved

SHAPES = [(8, 32, 1, 5, 4096), (1, 32, 1, 3, 8192), (4, 64, 4, 8, 8192), (2, 16, 1, 8, 16384),
          (16, 32, 1, 4, 2048), (1, 32, 4, 16, 8192), (8, 32, 8, 16, 4096), (4, 32, 2, 8, 4096)]
print("| problem | default | cap 64 / default | cap 32 / default | cuDNN / default |")
print("|---|---|---|---|---|")
for b, hq, hkv, sq, sk in SHAPES:
    p = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=128,
                dtype="bf16", causal=True, bottom_right=True)
    case = DECODE.case(p, 0)
    fns, names = {}, {}
    for cap in (128, 64, 32):
        defaults.MAX_TILE_M = cap
        s = DECODE.default_schedule("sm_90", p)
        run = case.launcher(s)
        err = case.error(run)
        assert err < DECODE.tolerance(p), (p.describe(), s.describe(), err)
        fns[cap] = run
        names[cap] = s.describe()
    defaults.MAX_TILE_M = 128
    fns["cudnn"] = case.baselines()["torch-cudnn"]
    t = {k: v.median_ms for k, v in time_interleaved(fns, rounds=10).items()}
    print(f"| {p.describe()} | {names[128]} {t[128]:.4f} ms | {t[64] / t[128]:.3f} ({names[64]}) | "
          f"{t[32] / t[128]:.3f} ({names[32]}) | {t['cudnn'] / t[128]:.3f} |", flush=True)
