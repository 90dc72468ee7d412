"""Contiguous decode schedules beside cuDNN, whence the rules of
``kernels/decode/_defaults.py`` (sections 49-60 of ``docs/records/benchmarks/paged/issue49/
README.md``; ``RULES``: each sweep's rule, ``CHECKS``: each rule's held-out calls; sweeps 1-2
at 6582740, 3-4 and 7-8 at 5413213, 5-6 at d06c1f7, sweep 17 and checks four, tail, tail-held
at d23e0ed). A check times the rule's default against the one before (GPU, isolated).
Interleaved, medians of 15, L2 flushed.

    source .devtk/setup.sh && python3 -u docs/records/probes/decode_part_fill.py --sweep 15
"""
import argparse
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention as ta
from tiledattention.kernels.decode import layout
from tiledattention.core._compile import SM_COUNTS
from tiledattention.kernels.decode._defaults import PART_WAVE_MIN_KEYS
from tuner.measure import time_interleaved

sys.path.insert(0, "docs/records/probes")
from compile_ahead import compile_ahead  # noqa: E402
from paged_defaults import default_with  # noqa: E402

# (batch, heads_q, heads_kv, keys, head dim, dtype)
SWEEPS = {9: ((12, 64, 8, 35053, 128, "bf16"), (96, 8, 1, 10759, 128, "fp16"),
              (12, 32, 8, 20000, 128, "bf16"), (100, 8, 1, 30000, 128, "fp16"),
              (13, 56, 7, 50000, 128, "bf16"), (23, 16, 4, 8000, 96, "bf16")),
          10: ((12, 64, 8, 35053, 128, "bf16"), (96, 8, 1, 10759, 128, "fp16"),
               (100, 8, 1, 30000, 128, "fp16"), (13, 56, 7, 50000, 128, "bf16"),
               (25, 32, 4, 40000, 128, "bf16"), (34, 24, 3, 15000, 128, "fp16"),
               (90, 16, 1, 20000, 128, "bf16"), (47, 16, 2, 60000, 128, "fp16")),
          11: ((11, 64, 8, 25000, 128, "fp16"), (98, 8, 1, 16000, 128, "bf16"),
               (23, 32, 4, 45000, 128, "bf16"), (101, 8, 1, 12000, 128, "bf16"),
               (31, 24, 3, 70000, 128, "fp16"), (45, 16, 2, 11000, 128, "bf16")),
          12: ((8, 56, 8, 15287, 128, "bf16"), (6, 12, 12, 43094, 128, "bf16"),
               (4, 16, 16, 13325, 128, "bf16"), (3, 16, 16, 40000, 128, "fp16"),
               (10, 32, 8, 20000, 128, "bf16"), (7, 40, 8, 30000, 128, "fp16"),
               (15, 64, 8, 12000, 128, "bf16"), (110, 8, 1, 20000, 128, "bf16"),
               (2, 32, 8, 60000, 128, "bf16"), (4, 32, 8, 24000, 128, "bf16"),
               (84, 8, 1, 12000, 128, "fp16"), (26, 16, 4, 25000, 128, "bf16")),
          13: ((24, 40, 8, 3266, 64, "bf16"), (20, 32, 8, 4000, 64, "bf16"),
               (36, 28, 4, 5000, 64, "fp16"), (28, 32, 8, 3500, 64, "bf16"),
               (45, 16, 4, 4500, 64, "bf16"), (17, 64, 8, 5500, 64, "bf16"),
               (32, 56, 7, 3100, 64, "fp16"), (21, 40, 8, 4200, 96, "bf16"),
               (50, 12, 4, 3800, 80, "bf16"), (250, 8, 1, 4000, 64, "bf16")),
          14: ((9, 64, 8, 6000, 128, "bf16"), (25, 8, 2, 8000, 128, "fp16"),
               (70, 16, 1, 4000, 128, "bf16"), (3, 48, 16, 9000, 128, "bf16"),
               (10, 32, 8, 20000, 96, "bf16"), (6, 40, 8, 30000, 96, "fp16"),
               (17, 16, 2, 40000, 80, "bf16"), (9, 64, 8, 25000, 64, "bf16"),
               (70, 8, 1, 12000, 64, "fp16"), (48, 8, 1, 30000, 64, "bf16")),
          15: ((19, 56, 8, 3300, 64, "bf16"), (140, 8, 1, 4700, 64, "bf16"),
               (11, 48, 16, 3600, 64, "fp16"), (22, 40, 8, 4400, 48, "bf16"),
               (24, 40, 8, 3266, 64, "bf16"), (45, 16, 4, 4500, 64, "bf16"),
               (17, 64, 8, 5500, 64, "bf16"), (36, 28, 4, 5000, 64, "fp16"),
               (160, 8, 1, 3500, 64, "bf16"), (28, 48, 6, 4000, 64, "bf16")),
          16: ((17, 32, 2, 8000, 128, "bf16"), (17, 32, 2, 12000, 128, "bf16"),
               (12, 16, 4, 7200, 128, "fp16"), (12, 16, 4, 11000, 128, "fp16"),
               (3, 64, 16, 9000, 128, "bf16"), (50, 8, 1, 5200, 128, "bf16"),
               (50, 8, 1, 9000, 128, "bf16"), (60, 8, 1, 6000, 128, "bf16"),
               (15, 32, 4, 8000, 128, "bf16"), (64, 8, 1, 5000, 128, "bf16"),
               (66, 8, 1, 4500, 128, "fp16"), (9, 56, 8, 7000, 128, "bf16")),
          18: ((4, 16, 16, 1094, 128, "fp16"), (6, 32, 8, 1000, 128, "bf16"),
               (3, 28, 28, 1300, 128, "bf16"), (9, 16, 8, 900, 128, "fp16"),
               (2, 48, 48, 1200, 64, "bf16"), (12, 32, 8, 1100, 64, "bf16"),
               (5, 24, 24, 1400, 96, "bf16"), (8, 40, 8, 1000, 128, "bf16")),
          19: ((4, 16, 16, 1800, 128, "bf16"), (3, 28, 28, 2200, 128, "fp16"),
               (9, 16, 8, 1600, 128, "bf16"), (8, 40, 8, 2600, 128, "bf16"),
               (5, 64, 16, 3000, 128, "bf16"), (10, 56, 7, 2000, 128, "fp16"),
               (4, 20, 20, 1000, 96, "bf16"), (3, 24, 24, 1200, 80, "bf16"),
               (7, 8, 8, 1400, 128, "bf16"), (11, 32, 4, 1250, 128, "bf16")),
          20: ((17, 16, 4, 2500, 128, "bf16"), (11, 56, 8, 1700, 128, "fp16"),
               (35, 8, 2, 2900, 128, "bf16"), (76, 8, 1, 1100, 128, "bf16"),
               (13, 30, 6, 2000, 96, "bf16"), (9, 64, 8, 3900, 128, "bf16"),
               (20, 16, 4, 5000, 128, "bf16"), (70, 8, 1, 7000, 128, "fp16"),
               (2, 40, 40, 3500, 128, "bf16"), (12, 48, 6, 1300, 112, "bf16")),
          21: ((3, 28, 28, 1300, 128, "bf16"), (9, 16, 8, 900, 128, "fp16"),
               (2, 48, 48, 1200, 64, "bf16"), (12, 32, 8, 1100, 64, "bf16"),
               (76, 8, 1, 1100, 128, "bf16"), (11, 56, 8, 1700, 128, "fp16"),
               (10, 32, 8, 1200, 128, "bf16"), (100, 8, 1, 1000, 64, "fp16"),
               (30, 16, 4, 1500, 64, "bf16"), (6, 40, 20, 800, 128, "bf16")),
          22: ((2, 48, 48, 900, 64, "bf16"), (100, 8, 1, 1800, 64, "bf16"),
               (16, 32, 8, 1600, 64, "fp16"), (13, 64, 8, 1000, 64, "bf16"),
               (3, 40, 40, 2000, 64, "bf16"), (29, 16, 4, 1300, 64, "fp16"),
               (5, 24, 24, 1200, 48, "bf16"), (10, 32, 8, 1200, 64, "bf16"),
               (1, 64, 64, 1500, 64, "bf16"), (22, 16, 4, 1000, 64, "fp16"),
               (12, 32, 8, 2500, 64, "bf16"), (110, 8, 1, 2200, 64, "bf16")),
          23: ((3, 28, 28, 1300, 128, "bf16"), (9, 16, 8, 900, 128, "fp16"),
               (76, 8, 1, 1100, 128, "bf16"), (11, 56, 8, 1700, 128, "fp16"),
               (10, 32, 8, 1200, 128, "bf16"), (4, 16, 16, 1800, 128, "bf16"),
               (2, 48, 48, 1200, 64, "bf16"), (12, 32, 8, 1100, 64, "bf16"),
               (1, 32, 8, 32768, 128, "bf16"), (1, 32, 8, 8192, 128, "bf16"),
               (17, 32, 8, 16000, 128, "bf16"), (24, 32, 8, 3000, 128, "bf16"))}
#: (splits, CTAs an SM) of each sweep's forms; short-cache sweeps add 64-key steps
FORMS = {13: ((3, 2),),
         18: ((1, 1), (1, 2), (2, 2)), 19: ((1, 1),), 20: ((1, 1),)}
#: sweeps 9-11 (89-102 rows), 13, 15: (splits, CTAs an SM, key step, K and V loads ahead)
SHAPES = {9: ((2, 2, 128, 2, 2), (3, 2, 128, 2, 2), (11, 2, 128, 2, 2), (4, 3, 64, 2, 2),
              (11, 1, 128, 3, 2)),
          10: ((4, 3, 64, 2, 2), (4, 3, 64, 4, 4), (3, 3, 64, 2, 2), (8, 3, 64, 2, 2),
               (11, 3, 64, 2, 2), (11, 1, 128, 3, 2)),
          11: ((3, 3, 64, 2, 2), (4, 3, 64, 2, 2), (11, 1, 128, 3, 2)),
          13: ((1, 3, 128, 2, 2), (1, 3, 64, 2, 2), (2, 3, 128, 2, 2), (1, 4, 128, 2, 2)),
          21: ((3, 2, 64, 4, 4), (4, 3, 64, 3, 3), (6, 4, 32, 4, 4), (4, 2, 128, 2, 2),
               (2, 2, 128, 3, 3), (6, 3, 64, 2, 2), (1, 1, 256, 2, 2)),
          22: ((1, 1, 256, 1, 1), (1, 1, 256, 2, 2), (1, 1, 256, 3, 3), (2, 2, 256, 2, 2),
               (1, 2, 256, 2, 2), (1, 1, 128, 3, 3)),
          15: ((1, 3, 128, 2, 2), (1, 3, 256, 2, 2), (1, 2, 128, 3, 3), (1, 2, 256, 3, 3),
               (1, 3, 128, 3, 3), (2, 2, 128, 2, 2))}
#: sweeps 12, 14 (rows short of the SMs): (CTAs an SM, key step, K and V loads ahead), split
#: for one wave of that many CTAs an SM (CTAs x SMs // rows splits)
WAVES = {12: ((3, 64, 2, 2), (2, 128, 2, 2), (1, 128, 3, 2), (4, 32, 4, 4)),
         14: ((4, 32, 4, 4), (4, 64, 2, 2), (3, 64, 2, 2), (3, 128, 2, 2)),
         16: ((4, 32, 4, 4), (3, 64, 2, 2), (4, 64, 2, 2), (3, 64, 3, 3))}
#: sweep 23: (key slices, key step, splits, CTAs an SM; 0: the default's)
SLICES = {23: ((2, 0, 0, 0), (4, 0, 0, 0), (8, 0, 0, 0), (4, 256, 0, 0), (4, 64, 0, 0),
               (4, 0, 1, 1))}
#: each sweep's rule (``before``)
RULES = {9: "three", 10: "three", 11: "three", 12: "fill4",
         13: "short-wave", 14: "fill4", 15: "short-wave", 16: "fill4", 18: "arch", 19: "arch",
         20: "arch", 21: "alone", 22: "alone", 23: "arch"}
CHECKS = {"part": ((8, 18, 18, 30000, 64, "bf16"), (17, 32, 8, 24000, 64, "fp16"),
                   (5, 28, 28, 50000, 80, "bf16"), (23, 56, 7, 7000, 64, "bf16"),
                   (44, 16, 4, 9000, 96, "fp16"), (2, 80, 80, 40000, 64, "bf16"),
                   (11, 16, 16, 60000, 64, "bf16"), (47, 32, 4, 12000, 64, "bf16")),
          "short": ((18, 32, 8, 1700, 64, "bf16"), (30, 40, 8, 2600, 64, "fp16"),
                    (22, 56, 8, 1300, 64, "bf16"), (300, 8, 1, 900, 64, "bf16"),
                    (64, 20, 5, 2200, 64, "fp16"), (50, 48, 6, 1000, 64, "bf16"),
                    (140, 8, 1, 2900, 64, "bf16"), (28, 48, 12, 800, 48, "bf16"),
                    (10, 36, 18, 2000, 64, "fp16"), (37, 32, 8, 1500, 64, "bf16")),
          "double": ((11, 24, 6, 15000, 64, "fp16"), (3, 56, 8, 60000, 64, "bf16"),
                     (1, 40, 8, 200000, 64, "bf16"), (13, 40, 5, 12000, 64, "bf16"),
                     (2, 32, 4, 80000, 48, "fp16"), (9, 28, 7, 30000, 64, "bf16"),
                     (5, 12, 12, 45000, 64, "bf16"), (1, 96, 12, 65536, 64, "bf16")),
          "deep": ((2, 32, 8, 50000, 128, "bf16"), (5, 28, 4, 77777, 128, "fp16"),
                   (1, 64, 8, 100000, 128, "bf16"), (9, 16, 2, 45000, 128, "bf16"),
                   (3, 48, 8, 36000, 128, "fp16"), (14, 16, 4, 70000, 128, "bf16"),
                   (1, 128, 16, 33000, 128, "fp16"), (1, 32, 8, 32768, 128, "bf16"),
                   (2, 32, 8, 40000, 128, "bf16")),
          "three": ((97, 8, 1, 14000, 128, "bf16"), (19, 40, 5, 25000, 128, "fp16"),
                    (46, 16, 2, 18000, 128, "bf16"), (33, 24, 3, 30000, 128, "bf16"),
                    (93, 16, 1, 12500, 128, "fp16"), (102, 8, 1, 20000, 128, "bf16"),
                    (15, 48, 6, 40000, 128, "bf16")),
          "fill4": ((9, 64, 8, 25000, 128, "bf16"), (17, 16, 4, 16000, 128, "fp16"),
                    (11, 56, 7, 60000, 128, "bf16"), (86, 8, 1, 12000, 128, "bf16"),
                    (25, 8, 2, 35000, 128, "fp16"), (6, 64, 8, 70000, 128, "bf16"),
                    (17, 16, 2, 50000, 128, "bf16"), (70, 16, 1, 10500, 128, "fp16"),
                    (3, 48, 16, 20000, 128, "bf16")),
          "fill4-short": ((11, 32, 8, 5000, 128, "bf16"), (45, 8, 1, 4500, 128, "bf16"),
                          (9, 32, 8, 9500, 128, "fp16"), (34, 16, 1, 6500, 128, "bf16"),
                          (3, 64, 16, 4200, 128, "bf16"), (76, 8, 1, 8000, 128, "bf16"),
                          (17, 56, 4, 5500, 128, "fp16")),
          "fill4-held": ((47, 8, 1, 6100, 128, "bf16"), (12, 16, 4, 7200, 128, "fp16"),
                         (17, 32, 2, 8000, 128, "bf16"), (80, 8, 1, 4100, 128, "bf16"),
                         (9, 56, 8, 4400, 128, "fp16"), (50, 8, 1, 5200, 128, "bf16"),
                         (3, 64, 16, 6000, 128, "fp16")),
          "alone": ((9, 48, 12, 1100, 64, "bf16"), (90, 8, 1, 1400, 64, "fp16"),
                    (31, 16, 4, 1900, 64, "bf16"), (4, 28, 28, 950, 64, "bf16"),
                    (14, 56, 7, 1700, 48, "bf16"), (11, 40, 10, 1250, 64, "fp16"),
                    (132, 8, 1, 1000, 64, "bf16"), (6, 16, 16, 1600, 64, "bf16")),
          "short-wave": ((19, 56, 8, 3300, 64, "bf16"), (26, 32, 8, 5800, 64, "fp16"),
                         (140, 8, 1, 4700, 64, "bf16"), (33, 28, 7, 3900, 64, "bf16"),
                         (60, 16, 4, 5200, 64, "bf16"), (11, 48, 16, 3600, 64, "fp16"),
                         (22, 40, 8, 4400, 48, "bf16"), (8, 32, 32, 3000, 64, "bf16"))}


def before(problem, rule):
    """The default before ``rule``: its constant past every cache (the short-cache rule's wave
    bound at ``PART_WAVE_MIN_KEYS``)."""
    off = {"double": "SHORT_HEAD_SPLIT_MIN_KEYS", "deep": "LONG_SPLIT_MIN_KEYS",
           "three": "DEEP_STEP_SPLIT_MIN_KEYS", "fill4": "FILL_FOURTH_CTA_MIN_KEYS",
           "short": "SHORT_CACHE_MIN_KEYS", "part": "PART_FILL_MIN_KEYS",
           "alone": "SHORT_HEAD_ALONE_MIN_KEYS"}
    if rule == "arch":  # no device name
        return ta.DECODE.default_schedule("sm_90", problem)
    if rule == "short-wave":
        return default_with(problem, SHORT_CACHE_WAVE_MAX_KEYS=PART_WAVE_MIN_KEYS)
    return default_with(problem, **{off[rule.split("-")[0]]: 1 << 30})


def cudnn(case):
    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(case.q, case.k, case.v,
                                                                    enable_gqa=True)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", type=int, choices=sorted(SWEEPS))
    ap.add_argument("--check", action="store_true")
    named = ("short", "double", "deep", "three", "fill4",
             "fill4-short", "fill4-held", "short-wave", "alone")
    for name in named:
        ap.add_argument(f"--check-{name}", action="store_true")
    args = ap.parse_args()
    check = ("part" if args.check else next((n for n in named if getattr(
        args, f"check_{n}".replace("-", "_"))), None))
    points = CHECKS[check] if check else SWEEPS[args.sweep]
    rule = check or RULES[args.sweep]
    problems = [ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                           head_dim=d, dtype=dt, causal=False) for b, hq, hkv, sk, d, dt in points]
    forms = {}
    for p in problems:
        old = before(p, rule)
        forms[p] = {"old": old}
        if check:
            forms[p]["new"] = ta.DECODE.default_schedule("sm_90", p)
            continue
        for s, o in FORMS.get(args.sweep, ()):
            forms[p][f"s{s} occ{o}"] = old.replace(
                splits=s, occupancy=o, combine="block_pdl" if s > 1 else old.combine)
        for sp, o, n, k, v in SHAPES.get(args.sweep, ()):
            forms[p][f"s{sp} occ{o} n{n} K{k}"] = old.replace(
                splits=sp, occupancy=o, tile_n=n, k_latency=k, v_latency=v,
                combine="block_pdl" if sp > 1 else old.combine)
        for w, n, sp, o in SLICES.get(args.sweep, ()):
            form = old.replace(key_slices=w, tile_n=n or old.tile_n, splits=sp or old.splits,
                               occupancy=o or old.occupancy)
            forms[p][f"ks{w} n{form.tile_n} s{form.splits} occ{form.occupancy}"] = form
        for o, n, k, v in WAVES.get(args.sweep, ()):
            sp = max(1, min(o * SM_COUNTS["hopper"] // layout(p, old).rows, p.seqlen_k // 256))
            forms[p][f"w{o} s{sp} n{n} K{k}"] = old.replace(
                splits=sp, occupancy=o, tile_n=n, k_latency=k, v_latency=v,
                combine="block_pdl" if sp > 1 else old.combine)
    compile_ahead([(p, s) for p in problems for s in forms[p].values()])
    for p in problems:
        case = ta.DECODE.case(p, 0)
        fns = {n: case.launcher(s) for n, s in forms[p].items()}
        errors = {n: case.error(f) for n, f in fns.items()}
        fns["cudnn"] = cudnn(case)
        gpu = {n: t.median_ms for n, t in time_interleaved(fns, rounds=15).items()}
        line = (f"{p.describe()} rows {layout(p, forms[p]['old']).rows} old "
                f"{forms[p]['old'].describe()} {gpu['old'] * 1e3:.1f} us; old / form: " +
                "  ".join(f"{n} {gpu['old'] / t:.3f}" for n, t in gpu.items()) +
                f"; worst error {max(errors.values()):.1e}")
        if check:
            iso = {n: t.median_ms for n, t in
                   time_interleaved(fns, rounds=15, host=True).items()}
            line += (f"; isolated old / new {iso['old'] / iso['new']:.3f}, cuDNN / new "
                     f"{iso['cudnn'] / iso['new']:.3f}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
