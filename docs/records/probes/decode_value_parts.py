"""Value parts (``DecodeSchedule.value_parts``): each row's value and output columns cut over 2
or 4 neighbouring CTAs that walk the same keys, so a row gains CTAs without a merge. Against
the sm_90 default and cuDNN (a window: cuDNN over a cache of the window's keys) on contiguous
decode calls: rows short of the SMs over short caches (where cuDNN, one CTA a row, leads),
rows under a wave over mid caches, 4096-key windows, B1. GPU view (interleaved, L2 flushed,
medians) and the isolated view (``host=True``: from an idle GPU, the host's time counted);
"% copy" is the call's K/V bytes (the window's) over a device copy's rate in the same run.

    source .devtk/setup.sh && python3 -u docs/records/probes/decode_value_parts.py [--rounds 15]
        [--held]  # other calls (HELD), the same forms
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from compile_ahead import compile_ahead  # noqa: E402
from paged_defaults import copy_rate  # noqa: E402

#: (B, H_q, H_kv, cache keys, window (0: none), D, dtype)
POINTS = ((10, 32, 8, 1201, 0, 128, "bf16"), (9, 64, 8, 1500, 0, 128, "bf16"),
          (11, 32, 8, 900, 0, 128, "fp16"), (3, 28, 28, 1300, 0, 128, "bf16"),
          (100, 8, 1, 1000, 0, 128, "bf16"), (15, 40, 8, 800, 0, 128, "bf16"),
          (14, 28, 4, 1700, 0, 128, "bf16"), (8, 32, 8, 4096, 0, 128, "bf16"),
          (6, 32, 8, 8000, 0, 128, "bf16"), (16, 28, 4, 6000, 0, 128, "fp16"),
          (4, 64, 8, 16000, 0, 128, "bf16"), (24, 32, 8, 3000, 0, 128, "bf16"),
          (8, 32, 8, 65536, 4096, 128, "bf16"), (1, 32, 8, 65536, 4096, 128, "bf16"),
          (12, 28, 4, 40000, 4096, 128, "bf16"), (1, 32, 8, 32768, 0, 128, "bf16"),
          (1, 32, 8, 8192, 0, 128, "bf16"), (2, 32, 8, 20000, 0, 128, "bf16"),
          (9, 16, 8, 3000, 0, 64, "bf16"), (20, 32, 8, 2000, 0, 64, "bf16"))
#: other calls, the same forms
HELD = ((12, 32, 8, 1000, 0, 128, "bf16"), (7, 56, 8, 2500, 0, 128, "fp16"),
        (5, 40, 8, 12000, 0, 128, "bf16"), (30, 12, 4, 1400, 0, 128, "bf16"),
        (2, 40, 40, 3000, 0, 128, "bf16"), (6, 48, 12, 900, 0, 96, "bf16"),
        (10, 32, 8, 65536, 4096, 128, "bf16"), (16, 16, 4, 50000, 2048, 128, "fp16"),
        (13, 28, 4, 2300, 0, 64, "bf16"), (70, 8, 1, 3500, 0, 128, "bf16"),
        (3, 32, 8, 24000, 0, 128, "bf16"), (40, 16, 4, 2600, 0, 128, "bf16"))


def problem_of(b, hq, hkv, sk, window, d, dtype):
    """A decode step: one query row a head over an ``sk``-key cache (its last ``window``)."""
    if window:
        return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                          head_dim=d, dtype=dtype, causal=True, bottom_right=True,
                          window_left=window - 1, window_right=0)
    return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype=dtype, causal=False)


def forms(problem):
    """The default and its value-part forms: as it splits, with one split, with half its
    splits, one split of four parts, one split at two CTAs an SM."""
    default = ta.DECODE.default_schedule("sm_90", problem)
    plain = default.replace(tail_rows=0)
    out = {"default": default, "vp2": plain.replace(value_parts=2),
           "vp2 s1": plain.replace(value_parts=2, splits=1),
           "vp2 s1 occ2": plain.replace(value_parts=2, splits=1, occupancy=2),
           "vp4 s1": plain.replace(value_parts=4, splits=1)}
    if default.splits > 2:
        out["vp2 half"] = plain.replace(value_parts=2, splits=-(-default.splits // 2))
    kept, seen = {}, set()
    for name, schedule in out.items():  # one of each launch
        if ta.DECODE.normalise(problem, schedule) not in seen:
            seen.add(ta.DECODE.normalise(problem, schedule))
            kept[name] = schedule
    return kept


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--held", action="store_true")
    args = parser.parse_args()
    copy_gbps = copy_rate()
    plans = []
    for point in HELD if args.held else POINTS:
        p = problem_of(*point)
        plans.append((p, point, forms(p)))
    compile_ahead([(p, s) for p, _, f in plans for s in f.values()])
    table = []
    for p, (b, hq, hkv, sk, window, d, dtype), candidates in plans:
        case = ta.DECODE.case(p, 0)
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        keys = window or sk
        if window:
            flat = problem_of(b, hq, hkv, window, 0, d, dtype)
            fns["cudnn"] = ta.DECODE.case(flat, 0).baselines()["torch-cudnn"]
        else:
            fns["cudnn"] = case.baselines()["torch-cudnn"]
        gpu = {n: t.median_ms for n, t in time_interleaved(fns, rounds=args.rounds).items()}
        iso = {n: t.median_ms for n, t in
               time_interleaved(fns, rounds=args.rounds, host=True).items()}
        kv_bytes = b * hkv * keys * d * 2 * (2 if dtype in ("bf16", "fp16") else 1)
        best = min((n for n in candidates), key=gpu.get)
        print(f"== {p.describe()} rows {b * hkv} default {candidates['default'].describe()}")
        for n in fns:
            share = kv_bytes / (gpu[n] * 1e-3) / 1e9 / copy_gbps
            print(f"  {n:12s} {gpu[n] * 1e3:8.1f} us {100 * share:5.1f}% copy  default/form "
                  f"gpu {gpu['default'] / gpu[n]:.3f} iso {iso['default'] / iso[n]:.3f}  err "
                  f"{errors.get(n, float('nan')):.1e}", flush=True)
        table.append((p.describe(), b * hkv, best, gpu["default"] / gpu[best],
                      gpu["cudnn"] / gpu["default"], gpu["cudnn"] / gpu[best],
                      iso["default"] / iso[best], iso["cudnn"] / iso[best]))
    print("\ncall | rows | best form | default/best gpu | cudnn/default gpu | cudnn/best gpu "
          "| default/best iso | cudnn/best iso")
    for row in table:
        print(" | ".join(str(x) if not isinstance(x, float) else f"{x:.3f}" for x in row))


if __name__ == "__main__":
    main()
