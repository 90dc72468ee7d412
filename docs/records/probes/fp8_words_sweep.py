"""Decode over an FP8 cache after its value tile is read as int16 words (issue 52, GPU): does
the sm_90 default's shape (``FP8_SPLIT_FACTOR`` times the bf16 rule's splits at two CTAs an SM,
K loads ``FP8_K_LATENCY`` steps ahead), chosen when the step waited on byte reads, still fit
the leaner step? Each batch's default against its neighbours (fewer and more splits, one CTA an
SM, other load distances) and the same batch over a bf16 cache (its own default), interleaved,
the L2 flushed before each sample (GPU time), medians of ``--rounds``; shares of the device
copy rate (read + written, same run) on the valid K/V bytes read once; errors against the
float32 attention of the dequantised cache.

    source .devtk/setup.sh && python3 docs/records/probes/fp8_words_sweep.py [--rounds 15]

(The sweep recorded in ``docs/records/benchmarks/fp8/README.md`` ran on the tree of 7b3b78e:
its candidates are the neighbours of that tree's defaults, the former FP8 rule's.)
    source .devtk/setup.sh && python3 docs/records/probes/fp8_words_sweep.py --check

``--fill``: contiguous batches whose rows leave the rule's splits short of two CTAs an SM in
one wave (``FILL``), the default against 1-2 splits more and twice its splits.
``--check``: other batches (``CHECK``, none of the sweep's), the default against the former rule
(four times ``SMs // rows`` splits of at least 512 keys, as paged batches keep) and, at pages of
16 and 32, against the value loads two steps ahead (four before ``FP8_SMALL_PAGE_V_LATENCY``
was the rule: the probe's first check ran with two, its ``V4`` form four).
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from compile_ahead import compile_ahead  # noqa: E402
from paged_defaults import copy_rate  # noqa: E402
from paged_fp8 import unique_forms  # noqa: E402

# (batch, heads_q, heads_kv, longest cache, page size; 0: contiguous, one length)
POINTS = ((1, 32, 8, 40000, 0), (1, 32, 8, 8192, 0), (2, 64, 8, 24000, 0), (4, 32, 8, 16000, 0),
          (16, 28, 4, 6000, 0), (12, 32, 8, 14000, 16), (30, 28, 4, 5000, 32),
          (6, 32, 8, 26000, 64), (20, 32, 8, 9000, 256))


# (batch, heads_q, heads_kv, longest cache, page size, head dim)
CHECK = ((1, 32, 8, 20000, 0), (1, 28, 4, 65536, 0), (3, 32, 8, 12000, 0), (8, 40, 8, 9000, 0),
         (1, 64, 8, 4096, 0), (6, 16, 8, 30000, 0), (2, 16, 8, 20000, 0, 256),
         (4, 32, 8, 10000, 0, 64), (8, 32, 8, 20000, 16), (40, 28, 4, 6000, 16),
         (24, 32, 8, 9000, 32))


FILL = ((6, 16, 8, 30000, 0), (5, 28, 4, 20000, 0), (7, 32, 8, 16000, 0), (3, 40, 8, 24000, 0))


def problem(b, hq, hkv, sk, page, d=128, kv_dtype="e4m3"):
    return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype="bf16", causal=bool(page), bottom_right=bool(page),
                      ragged=bool(page), page_size=page, kv_dtype=kv_dtype)


def candidates(p):
    d = ta.DECODE.default_schedule("sm_90", p)
    forms = {"default": d,
             "splits /2": d.replace(splits=max(1, d.splits // 2)),
             "splits /4": d.replace(splits=max(1, d.splits // 4)),
             "splits x2": d.replace(splits=min(2 * d.splits, max(1, p.seqlen_k // 256))),
             "occ1": d.replace(occupancy=1),
             "occ1 splits /2": d.replace(occupancy=1, splits=max(1, d.splits // 2)),
             "K2": d.replace(k_latency=2),
             "V4": d.replace(v_latency=4)}
    return unique_forms(forms)


def check_candidates(p):
    from tiledattention.kernels.decode import _defaults, _launch

    d = ta.DECODE.default_schedule("sm_90", p)
    forms = {"default": d}
    if not p.page_size:
        rows = _launch.layout(p, d).rows
        forms["former rule"] = d.replace(splits=max(1, min(
            4 * max(132 // rows, 1), p.seqlen_k // 512, _defaults.MAX_SPLITS,
            _defaults.MAX_MERGED_ROWS // d.tile_m)))
    elif p.page_size <= 32:
        forms["V2" if d.v_latency == 4 else "V4"] = d.replace(v_latency=6 - d.v_latency)
    return unique_forms(forms)


def fill_candidates(p):
    d = ta.DECODE.default_schedule("sm_90", p)
    forms = {"default": d, "+1 split": d.replace(splits=d.splits + 1),
             "+2 splits": d.replace(splits=d.splits + 2),
             "x2 splits": d.replace(splits=2 * d.splits)}
    return unique_forms(forms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--fill", action="store_true")
    args = ap.parse_args()
    gbps = copy_rate()
    points, forms = ((CHECK, check_candidates) if args.check else (FILL, fill_candidates)
                     if args.fill else (POINTS, candidates))
    plans = [(problem(*pt), forms(problem(*pt))) for pt in points]
    jobs = [(p, s) for p, c in plans for s in c.values()]
    jobs += [(dataclasses.replace(p, kv_dtype=""),
              ta.DECODE.default_schedule("sm_90", dataclasses.replace(p, kv_dtype="")))
             for p, _ in plans]
    compile_ahead(jobs)
    rows = []
    for p, cands in plans:
        case = ta.DECODE.case(p, 0)
        fns = {name: case.launcher(s) for name, s in cands.items()}
        errors = {name: case.error(fn) for name, fn in fns.items()}
        plain_p = dataclasses.replace(p, kv_dtype="")
        plain = ta.DECODE.case(plain_p, 0)
        fns["bf16 cache"] = plain.launcher(ta.DECODE.default_schedule("sm_90", plain_p))
        errors["bf16 cache"] = plain.error(fns["bf16 cache"])
        seqused = getattr(case, "seqused", None)
        keys = int(seqused.sum()) if seqused is not None else p.batch * p.seqlen_k
        nbytes = keys * p.heads_kv * p.head_dim * 2
        times = {n: t.median_ms for n, t in time_interleaved(fns, rounds=args.rounds).items()}
        base = times["default"]
        print(f"== {p.describe()}  default {cands['default'].describe()}")
        for name, t in sorted(times.items(), key=lambda kv: kv[1]):
            share = nbytes * (2 if name == "bf16 cache" else 1) / (t * 1e-3) / (gbps * 1e9)
            print(f"  {name:16s} {t * 1e3:8.1f} us  x{base / t:.3f}  {share:.0%} of copy  "
                  f"err {errors[name]:.1e}", flush=True)
        best = min((n for n in times if n != "bf16 cache"), key=times.get)
        rows.append((p.describe(), cands["default"].describe(), base, best, times[best],
                     times["bf16 cache"], nbytes / (base * 1e-3) / (gbps * 1e9)))
    print("\n| batch (e4m3 cache) | default | µs | best form | ÷ default (speed) | "
          "default ÷ bf16 cache (speed) | default % of copy |\n|---|---|---|---|---|---|---|")
    for desc, sched, base, best, tb, t16, share in rows:
        print(f"| {desc} | {sched} | {base * 1e3:.1f} | {best} | {base / tb:.3f} | "
              f"{t16 / base:.2f} | {share:.0%} |")


if __name__ == "__main__":
    main()
