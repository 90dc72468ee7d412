"""Short full-mask D 256 prefill (a survey, docs/records/probes/survey_shapes.py, read B32 H8/1
S1047 fp16 and B32 H8 S933 at 0.94-0.95x cuDNN): the sm_90 default against its neighbours,
torch's cuDNN beside. Interleaved, L2 flushed, GPU time, medians; every candidate checked
against the family case's float32 reference.

    source .devtk/setup.sh && python3 docs/records/probes/forward_short_d256.py [--rounds 15]
        [--check]   # other calls (longer, causal, D 192): the default against key tiles
                    # walked sawtooth only
        [--causal]  # short causal D 256 at large batches (a survey, seed 26, read B32 H32/8
                    # S527 and B32 H64/8 S1119 at 0.82x and 0.89x cuDNN): the default
                    # (paired query tiles) against its neighbours, compiled ahead in a pool
        [--causal-lengths]  # causal D 192-256, 400-12000 keys: lengths_candidates
        [--causal-held]     # the same on calls neither set ran (CAUSAL_HELD)
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from compile_ahead import compile_ahead  # noqa: E402

POINTS = ((32, 8, 1, 1047, "fp16"), (32, 8, 8, 933, "bf16"), (16, 16, 8, 1500, "bf16"),
          (24, 12, 12, 700, "fp16"))
#: (B, H_q, H_kv, S, dtype, D, causal)
CHECK = ((4, 16, 8, 4096, "bf16", 256, False), (2, 32, 8, 8192, "fp16", 256, False),
         (8, 8, 2, 2000, "bf16", 256, False), (1, 16, 16, 16000, "bf16", 256, False),
         (64, 4, 4, 512, "fp16", 256, False), (8, 12, 12, 2048, "bf16", 192, False),
         (2, 16, 8, 4096, "bf16", 256, True), (16, 8, 8, 1000, "fp16", 256, True))

#: (B, H_q, H_kv, S, dtype): causal, D 256; none the survey's
CAUSAL = ((32, 16, 8, 600, "bf16"), (24, 32, 8, 900, "fp16"), (48, 8, 2, 1300, "bf16"),
          (16, 64, 8, 777, "bf16"))

#: (B, H_q, H_kv, S, dtype, D): causal, lengths from a short to a long call
CAUSAL_LENGTHS = ((64, 8, 8, 400, "bf16", 256), (16, 8, 8, 1600, "bf16", 256),
                  (8, 16, 8, 2048, "bf16", 256), (4, 32, 8, 3000, "fp16", 256),
                  (2, 16, 16, 4096, "bf16", 256), (1, 32, 8, 8192, "bf16", 256),
                  (2, 8, 2, 12000, "fp16", 256), (32, 16, 16, 1000, "fp16", 192),
                  (4, 16, 4, 2500, "bf16", 192))

CAUSAL_HELD = ((48, 16, 16, 700, "fp16", 256), (8, 32, 8, 1900, "bf16", 256),
               (128, 4, 4, 300, "bf16", 256), (12, 24, 8, 1111, "bf16", 256),
               (20, 16, 2, 1500, "fp16", 192), (6, 64, 8, 2048, "bf16", 256),
               (4, 32, 4, 2600, "bf16", 256), (3, 16, 16, 5000, "fp16", 256))


def lengths_candidates(d):
    """The causal default against paired query tiles (the default before
    ``CAUSAL_UNPAIRED_KEYS``), unpaired ones longest first with key tiles sawtooth (the form
    ``--causal`` found faster), and paired ones walking their keys sawtooth; each form once."""
    forms = {"paired": d.replace(paired_tiles=True, kv_sawtooth=False, longest_first=False),
             "unpaired sawtooth": d.replace(paired_tiles=False, kv_sawtooth=True,
                                            longest_first=True),
             "paired sawtooth": d.replace(paired_tiles=True, kv_sawtooth=True,
                                          longest_first=False)}
    return {"default": d, **{name: s for name, s in forms.items() if s != d}}


def causal_candidates(d):
    """The short causal D 256 default's neighbours: query tiles unpaired (longest first or in
    order), 64-row tiles, 64-key steps, key tiles walked sawtooth. (Every one of them compiles
    to one CTA an SM on sm_90, the default too though it asks three: 168 registers x 384
    threads or 255 x 256, checked on the CPU; so no occupancy form is among them.)"""
    unpaired = d.replace(paired_tiles=False)
    return {"default": d, "unpaired": unpaired,
            "unpaired longest": unpaired.replace(longest_first=True),
            "unpaired sawtooth": unpaired.replace(kv_sawtooth=True, longest_first=True),
            "64x128 w4": d.replace(tile_m=64, num_worker_warps=4, occupancy=1),
            "64x64 w4": d.replace(tile_m=64, tile_n=64, num_worker_warps=4, occupancy=1),
            "128x64": d.replace(tile_n=64), "persistent": d.replace(persistent=True),
            "K2": d.replace(k_latency=2)}


def checked_launchers(case, candidates):
    """``(launchers, errors)`` of the named schedules on ``case``: each one's launch and its
    error against the case's float32 reference; a schedule that fails is printed and left
    out."""
    fns, errors = {}, {}
    for name, schedule in candidates.items():
        try:
            fns[name] = case.launcher(schedule)
            errors[name] = case.error(fns[name])
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            print(f"  {name}: {type(exc).__name__}: {str(exc)[:120]}")
            fns.pop(name, None)
    return fns, errors


def timed_forms(case, candidates, flops, rounds, host=False, width=12):
    """The named schedules on ``case`` beside torch's cuDNN, interleaved (``host``: isolated
    calls with the host's time counted), each printed with its time, TFLOP/s (``flops`` a
    call), speed over ``"default"`` and error: ``(times, default ms, cuDNN ms, best name)``."""
    fns, errors = checked_launchers(case, candidates)
    fns["torch-cudnn"] = case.baselines()["torch-cudnn"]
    times = time_interleaved(fns, rounds=rounds, host=host)
    base = times["default"].median_ms
    for name, t in sorted(times.items(), key=lambda kv: kv[1].median_ms):
        print(f"  {name:{width}s} {t.median_ms * 1e3:8.1f} us {flops / t.median_ms / 1e9:6.1f} "
              f"TF/s speed x{base / t.median_ms:.3f} err {errors.get(name, float('nan')):.1e}")
    best = min((n for n in times if n != "torch-cudnn"), key=lambda n: times[n].median_ms)
    return times, base, times["torch-cudnn"].median_ms, best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--causal-lengths", action="store_true")
    parser.add_argument("--causal-held", action="store_true")
    args = parser.parse_args()
    pick = (causal_candidates if args.causal
            else lengths_candidates if args.causal_lengths or args.causal_held else None)
    points = (CHECK if args.check else [(*x, 256, True) for x in CAUSAL] if args.causal
              else [(*x, True) for x in CAUSAL_LENGTHS] if args.causal_lengths
              else [(*x, True) for x in CAUSAL_HELD] if args.causal_held
              else [(*x, 256, False) for x in POINTS])
    if pick is not None:
        jobs = []
        for b, hq, hkv, s, dtype, dim, causal in points:
            p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s,
                           head_dim=dim, dtype=dtype, causal=causal)
            jobs += [(p, c) for c in pick(ta.FORWARD.default_schedule("sm_90", p)).values()]
        compile_ahead(jobs, family="FORWARD")
    summary = []
    for b, hq, hkv, s, dtype, dim, causal in points:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=dim,
                       dtype=dtype, causal=causal)
        case = ta.FORWARD.case(p, 0)
        d = ta.FORWARD.default_schedule("sm_90", p)
        candidates = {"default": d,
                      "occ2": d.replace(occupancy=2),
                      "approx": d.replace(approx_div=True),
                      "K2": d.replace(k_latency=2),
                      "64x128 w4": d.replace(tile_m=64, num_worker_warps=4, occupancy=2),
                      "128x64": d.replace(tile_n=64),
                      "128x64 occ2": d.replace(tile_n=64, occupancy=2),
                      "persistent": d.replace(persistent=True),
                      "sawtooth": d.replace(kv_sawtooth=True),
                      "cta2": d.replace(num_ctas=2)}
        if args.check:
            candidates = {"default": d, "sawtooth": d.replace(kv_sawtooth=not d.kv_sawtooth)}
        elif pick is not None:
            candidates = pick(d)
        print(f"== {p.describe()} default {d.describe()}")
        times, base, cudnn, best = timed_forms(
            case, candidates, 4 * b * hq * s * s * dim / (2 if causal else 1), args.rounds)
        summary.append((p.describe(), cudnn / base, best, base / times[best].median_ms,
                        cudnn / times[best].median_ms))
    print("\n| call | cuDNN ÷ default | best | ÷ default (speed) | cuDNN ÷ best |\n"
          "|---|---|---|---|---|")
    for desc, vs, best, gain, best_vs in summary:
        print(f"| {desc} | {vs:.3f} | {best} | {gain:.3f} | {best_vs:.3f} |")


if __name__ == "__main__":
    main()
