"""Windowed decode (issue 49: a 4096 window of a 64k cache at 85% of the copy rate on the
window's bytes, B1 and B8): the sm_90 default (windows take one CTA an SM, and one split where
it would not multiply the CTAs four-fold, ``WINDOW_SPLIT_MIN_GAIN``) against more splits at two
CTAs an SM, merged by the block merge (and as a dependent launch), with the same call over a
cache of the window's length (no window) and cuDNN on that cache beside. Interleaved, L2
flushed, GPU time, medians; "% of copy" on the window's K/V bytes against a device copy's rate
in the same run.

    source .devtk/setup.sh && python3 docs/records/probes/decode_window_fill.py [--rounds 20]
        [--check]   # other calls: the default against the default before windows of a
                    # contiguous cache ran as caches of the window's length (``previous``)
        [--capped]  # Gemma-2-shaped windows with a softcap at D 256 (CAPPED), whose default
                    # splits only where that multiplies its CTAs four-fold: more splits at one
                    # CTA an SM (the capped D 256 split kernel keeps stack at two) and at two
        [--capped-held]  # other capped windows (CAPPED_HELD, D 192 and 256): the default
                         # (split as a cache of the window's keys) against one split, the rule before
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import copy_rate, report  # noqa: E402
from compile_ahead import compile_ahead  # noqa: E402

#: (B, H_q, H_kv, cache keys, window, D)
POINTS = ((8, 32, 8, 65536, 4096, 128), (1, 32, 8, 65536, 4096, 128),
          (16, 32, 8, 32768, 4096, 128), (12, 28, 4, 40000, 4096, 128),
          (8, 32, 8, 16384, 1024, 128), (4, 64, 8, 65536, 8192, 128), (6, 16, 16, 20000, 2048, 64))
CHECK = ((6, 32, 8, 50000, 4096, 128), (10, 40, 8, 32768, 4096, 128),
         (8, 16, 16, 65536, 4096, 64), (20, 32, 8, 20000, 2048, 128),
         (16, 28, 4, 30000, 4096, 128), (40, 16, 16, 8000, 1024, 64))

#: (B, H_q, H_kv, cache keys, window, D): softcap 50 (Gemma 2: 9B H16/8, 2B H8/4)
CAPPED = ((8, 16, 8, 8192, 4096, 256), (4, 16, 8, 32768, 4096, 256), (2, 8, 4, 16000, 4096, 256),
          (16, 16, 8, 20000, 4096, 256), (12, 16, 8, 9000, 4096, 256),
          (6, 8, 4, 30000, 4096, 256), (5, 16, 8, 16384, 4096, 256),
          (10, 8, 4, 12000, 4096, 256))

CAPPED_HELD = ((7, 16, 8, 10000, 4096, 256), (6, 16, 8, 24000, 4096, 256),
               (16, 8, 4, 9000, 4096, 256), (8, 16, 8, 12000, 4096, 192),
               (9, 8, 4, 15000, 1024, 256))


def window_problem(b, hq, hkv, sk, w, d, softcap=0.0, dtype="bf16"):
    """A decode step of one query row a head over the last ``w`` keys of an ``sk``-key cache."""
    return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype=dtype, causal=True, bottom_right=True, window_left=w - 1,
                      window_right=0, softcap=softcap)


def print_times(p, default, times, kv_bytes, copy_gbps, errors, candidates, also=""):
    """The point's line, one line per contender (``paged_defaults.report``), the speeds."""
    print(f"== {p.describe()} rows {p.batch * p.heads_kv} default {default.describe()}{also}")
    report(times, kv_bytes, copy_gbps, errors, candidates)
    base = times["default"].median_ms
    print("  speed vs default: " + "  ".join(f"{n}={base / t.median_ms:.3f}"
                                            for n, t in times.items()), flush=True)


def capped_candidates(default, rows, held):
    """The default against 2, 4 and a wave's splits at one CTA an SM and two waves' at two,
    block-merged; held out, against one split."""
    if held:
        return {"default": default, "one split": default.replace(splits=1, combine="kernel")}
    candidates = {"default": default}
    for splits in sorted({2, 4, 132 // rows} - {0, 1}):
        candidates[f"s{splits}"] = default.replace(splits=splits, occupancy=1, combine="block")
    if 264 // rows > 1:
        candidates[f"s{264 // rows} occ2"] = default.replace(splits=264 // rows, occupancy=2,
                                                            combine="block")
    return candidates


def capped(args, copy_gbps):
    """The capped windows (no cuDNN: torch's SDPA has no softcap), every candidate compiled
    ahead in one pool."""
    plans = []
    for b, hq, hkv, sk, w, d in CAPPED_HELD if args.capped_held else CAPPED:
        p = window_problem(b, hq, hkv, sk, w, d, softcap=50.0)
        default = ta.DECODE.default_schedule("sm_90", p)
        plans.append((p, w, capped_candidates(default, b * hkv, args.capped_held)))
    compile_ahead([(p, c) for p, _, candidates in plans for c in candidates.values()])
    for p, w, candidates in plans:
        case = ta.DECODE.case(p, 0)
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        times = time_interleaved(fns, rounds=args.rounds)
        print_times(p, candidates["default"], times, p.batch * p.heads_kv * w * p.head_dim * 4,
                    copy_gbps, errors, candidates)


def previous(default, rows, window):
    """The default before 2026-12-01 for a window of more than 512 keys over a contiguous
    cache: one CTA an SM, 128-key steps at D <= 128, ``132 // rows`` splits where that is at
    least 4, else one."""
    wanted = 132 // rows
    return default.replace(occupancy=1, tile_n=min(128, default.tile_n),
                           splits=wanted if wanted >= 4 and window > 512 else 1,
                           combine="block" if wanted >= 4 else "kernel")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--capped", action="store_true")
    parser.add_argument("--capped-held", action="store_true")
    args = parser.parse_args()
    copy_gbps = copy_rate()
    if args.capped or args.capped_held:
        return capped(args, copy_gbps)
    for b, hq, hkv, sk, w, d in CHECK if args.check else POINTS:
        p = window_problem(b, hq, hkv, sk, w, d)
        flat = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=w,
                          head_dim=d, dtype="bf16", causal=False)
        case, flat_case = ta.DECODE.case(p, 0), ta.DECODE.case(flat, 0)
        default = ta.DECODE.default_schedule("sm_90", p)
        rows = b * hkv
        candidates = {"default": default}
        if args.check:
            candidates["previous"] = previous(default, rows, w)
        for splits in () if args.check else (2, 4, 8, 16):
            if rows * splits <= 4 * 264:
                candidates[f"s{splits}"] = default.replace(splits=splits, occupancy=2,
                                                           combine="block")
        if not args.check:
            candidates["s4 pdl"] = default.replace(splits=4, occupancy=2, combine="block_pdl")
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        flat_default = ta.DECODE.default_schedule("sm_90", flat)
        fns["window-length cache"] = flat_case.launcher(flat_default)
        errors["window-length cache"] = flat_case.error(fns["window-length cache"])
        fns["cuDNN window-length"] = flat_case.baselines()["torch-cudnn"]
        errors["cuDNN window-length"] = float("nan")
        times = time_interleaved(fns, rounds=args.rounds)
        print_times(p, default, times, rows * w * d * 4, copy_gbps, errors, candidates,
                    also=f" (window-length cache: {flat_default.describe()})")


if __name__ == "__main__":
    main()
