"""Causal prefill at D 97-128 over 800-4000 keys (a survey at a tenth of the usual work a call,
seed 41, read B21 H24/3 S1232 D128 bf16 at 0.95x cuDNN): the sm_90 default (64x128 tiles at two
CTAs an SM, key tiles sawtooth, longest query tiles first) against its neighbours, among them
the 128-row tiles over a two-CTA cluster that the default takes from 4096 keys (an H100 rule).
Interleaved, L2 flushed, GPU time (``--host``: isolated calls, the host's time counted),
medians; every candidate checked against the family case's float32 reference; compiled ahead
in a pool.

    source .devtk/setup.sh && python3 docs/records/probes/forward_mid_causal.py [--rounds 15]
        [--held]   # calls the sweep did not run: the default against the forms named in HELD_FORMS
        [--host]
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta

sys.path.insert(0, str(Path(__file__).parent))
from compile_ahead import compile_ahead  # noqa: E402
from forward_short_d256 import timed_forms  # noqa: E402

#: (B, H_q, H_kv, S, dtype, D): causal
POINTS = ((21, 24, 3, 1232, "bf16", 128), (8, 32, 8, 2048, "bf16", 128),
          (16, 16, 16, 1024, "fp16", 128), (4, 32, 8, 3000, "bf16", 128),
          (32, 12, 12, 800, "bf16", 128), (12, 28, 4, 1600, "fp16", 128))
HELD = ((6, 40, 8, 2600, "bf16", 128), (24, 16, 2, 1100, "bf16", 128),
        (10, 32, 32, 1800, "fp16", 128), (3, 64, 8, 3500, "bf16", 128),
        (40, 8, 8, 900, "fp16", 128), (16, 28, 7, 1400, "bf16", 128),
        (2, 48, 8, 3900, "fp16", 128))
#: the forms --held times beside the default (set from the sweep)
HELD_FORMS = ("cluster 128x128",)


def candidates(d):
    """The default's neighbours, each once."""
    cluster = d.replace(tile_m=128, num_ctas=2, kv_sawtooth=False)
    forms = {"cluster 128x128": cluster,
             "cluster sawtooth": cluster.replace(kv_sawtooth=True),
             "128x128 occ2": d.replace(tile_m=128, kv_sawtooth=False),
             "64x128 occ3": d.replace(occupancy=3),
             "paired": d.replace(paired_tiles=True, longest_first=False),
             "64x64 occ3": d.replace(tile_n=64, occupancy=3),
             "K4": d.replace(k_latency=4),
             "in order": d.replace(longest_first=False)}
    if d.pack_gqa:
        forms["unpacked"] = d.replace(pack_gqa=False)
    return {"default": d, **{n: s for n, s in forms.items() if s != d}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--held", action="store_true")
    parser.add_argument("--host", action="store_true")
    args = parser.parse_args()
    points = HELD if args.held else POINTS
    plans = []
    for b, hq, hkv, s, dtype, dim in points:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=dim,
                       dtype=dtype, causal=True)
        d = ta.FORWARD.default_schedule("sm_90", p)
        forms = candidates(d)
        if args.held:
            forms = {n: s for n, s in forms.items() if n == "default" or n in HELD_FORMS}
        plans.append((p, d, forms))
    compile_ahead([(p, s) for p, _, forms in plans for s in forms.values()], family="FORWARD")
    summary = []
    for p, d, forms in plans:
        case = ta.FORWARD.case(p, 0)
        print(f"== {p.describe()} default {d.describe()}")
        times, base, cudnn, best = timed_forms(
            case, forms, 2 * p.batch * p.heads_q * p.seqlen_q * p.seqlen_k * p.head_dim,
            args.rounds, host=args.host, width=16)
        summary.append((p.describe(), base * 1e3, cudnn / base, best,
                        base / times[best].median_ms, cudnn / times[best].median_ms,
                        {n: base / t.median_ms for n, t in times.items()
                         if n not in ("default", "torch-cudnn")}))
    print("\n| call | default µs | cuDNN ÷ default | best | ÷ default (speed) | "
          "cuDNN ÷ best |\n"
          "|---|---|---|---|---|---|")
    for desc, us, vs, best, gain, best_vs, _ in summary:
        print(f"| {desc} | {us:.1f} | {vs:.3f} | {best} | {gain:.3f} | {best_vs:.3f} |")
    names = sorted({n for *_, speeds in summary for n in speeds})
    print("\nspeed ÷ default by form: " + "; ".join(
        f"{n} " + "/".join(f"{s[-1].get(n, float('nan')):.3f}" for s in summary) for n in names))


if __name__ == "__main__":
    main()
