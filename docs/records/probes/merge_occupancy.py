"""The decode merge kernel at more CTAs an SM (``DecodeSchedule.merge_occupancy``). Compiled
with no kernel option, ``decode_combine`` takes 255 registers a thread at 256 threads (sm_90):
one CTA fills an SM's register file, and a grid of rows x head-dim chunks runs in waves of one
CTA an SM (80 rows of four chunks: 2.4 waves on 132 SMs). Each call's sm_90 default (the
H200's) against the same with its merge compiled for 2 and 4 CTAs an SM (128 and 64
registers, no stack), cuDNN beside; calls whose default does not split (nothing to merge) are
skipped. GPU view (interleaved, L2 flushed, medians) and isolated (host counted).

    source .devtk/setup.sh && python3 -u docs/records/probes/merge_occupancy.py [--rounds 15]
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from decode_window_fill import window_problem  # noqa: E402
from paged_defaults import copy_rate, report  # noqa: E402

#: (B, H_q, H_kv, cache keys, window (0: none), D, dtype)
CONTIGUOUS = ((10, 32, 8, 1201, 0, 128, "bf16"), (9, 64, 8, 1500, 0, 128, "bf16"),
              (11, 32, 8, 900, 0, 128, "fp16"), (3, 28, 28, 1300, 0, 128, "bf16"),
              (14, 28, 4, 1700, 0, 128, "bf16"), (8, 32, 8, 4096, 0, 128, "bf16"),
              (6, 32, 8, 8000, 0, 128, "bf16"), (16, 28, 4, 6000, 0, 128, "fp16"),
              (9, 16, 8, 3000, 0, 64, "bf16"), (4, 64, 8, 16000, 0, 128, "bf16"),
              (5, 40, 8, 12000, 0, 128, "bf16"), (2, 40, 40, 3000, 0, 128, "bf16"),
              (8, 32, 8, 65536, 4096, 128, "bf16"), (12, 28, 4, 40000, 4096, 128, "bf16"),
              (1, 32, 8, 32768, 0, 128, "bf16"), (1, 32, 8, 8192, 0, 128, "bf16"))
#: (B, H_q, H_kv, longest cache, page size, D): the family's mixed lengths
PAGED = ((48, 32, 8, 8192, 16, 128), (24, 28, 4, 6000, 32, 128), (12, 28, 4, 9000, 32, 128),
         (40, 32, 8, 4000, 64, 128), (16, 32, 8, 12000, 256, 128))
OCCUPANCIES = (2, 4)


def problem_of(b, hq, hkv, sk, window, d, dtype):
    """A decode step over an ``sk``-key cache (its last ``window`` keys where given)."""
    if window:
        return window_problem(b, hq, hkv, sk, window, d, dtype=dtype)
    return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype=dtype, causal=False)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    copy_gbps = copy_rate()
    points = [(problem_of(*c), c[3] if not c[4] else c[4]) for c in CONTIGUOUS]
    points += [(ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                           head_dim=d, dtype="bf16", causal=True, bottom_right=True,
                           ragged=True, page_size=page), None) for b, hq, hkv, sk, page, d in PAGED]
    table = []
    for p, keys in points:
        schedule = ta.DECODE.default_schedule("sm_90", p)
        forms = {"default": schedule, **{f"merge occ{o}": schedule.replace(merge_occupancy=o)
                                         for o in OCCUPANCIES}}
        if ta.DECODE.normalise(p, forms["merge occ4"]) == ta.DECODE.normalise(p, schedule):
            print(f"== {p.describe()} {schedule.describe()}: nothing to merge, skipped")
            continue
        case = ta.DECODE.case(p, 0)
        fns = {n: case.launcher(s) for n, s in forms.items()}
        errors = {n: case.error(f) for n, f in fns.items()}
        if keys is not None:
            flat = problem_of(p.batch, p.heads_q, p.heads_kv, keys, 0, p.head_dim, p.dtype)
            fns["cudnn"] = ta.DECODE.case(flat, 0).baselines()["torch-cudnn"]
            errors["cudnn"] = float("nan")
            kv_bytes = p.batch * p.heads_kv * keys * p.head_dim * 4
        else:
            kv_bytes = int(case.seqused.sum()) * p.heads_kv * p.head_dim * 4
        times = time_interleaved(fns, rounds=args.rounds)
        gpu = {n: t.median_ms for n, t in times.items()}
        iso = {n: t.median_ms for n, t in
               time_interleaved(fns, rounds=args.rounds, host=True).items()}
        print(f"== {p.describe()} {schedule.describe()}")
        report(times, kv_bytes, copy_gbps, errors, forms)
        print("  default over form: " + "  ".join(
            f"{n} gpu {gpu['default'] / gpu[n]:.3f} iso {iso['default'] / iso[n]:.3f}"
            for n in fns), flush=True)
        table.append((p.describe(), schedule.describe(),
                      *(gpu["default"] / gpu[f"merge occ{o}"] for o in OCCUPANCIES),
                      *(iso["default"] / iso[f"merge occ{o}"] for o in OCCUPANCIES),
                      gpu["cudnn"] / gpu["default"] if "cudnn" in gpu else float("nan")))
    print("\ncall | default | gpu occ2 | gpu occ4 | iso occ2 | iso occ4 | cudnn/default gpu")
    for row in table:
        print(" | ".join(x if isinstance(x, str) else f"{x:.3f}" for x in row))


if __name__ == "__main__":
    main()
