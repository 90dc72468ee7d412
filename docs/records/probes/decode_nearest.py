"""Decode calls that the lookup answers with a nearest tuned row (issue 49: a survey, seed 26,
read B4 H8/1 over 16249 keys at 0.85x cuDNN, running a row tuned at 2048 keys): the row the
lookup picks without a limit on the cache length (the rule before 2026-12-02) against the
family default and against the row the family's ``transfer_limits`` (``seqlen_k`` within 2x)
pick, torch's cuDNN beside.
Interleaved, the L2 flushed before each sample, GPU time, medians; every schedule checked
against the family case's float32 reference.

    source .devtk/setup.sh && python3 docs/records/probes/decode_nearest.py [--rounds 15]

The resolutions are the runtime's (``tuner.lookup.runtime_resolution`` over the shipped sm_90
rows, no user database), printed with the row each came from; on the CPU ``--plan`` prints them only.
(``rows_vs_default.py --family decode`` times every shipped row on its own key.)
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta
from tuner.lookup import runtime_resolution, shipped_rows
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from compile_ahead import compile_ahead  # noqa: E402

#: (B, H_q, H_kv, keys, dtype): B x H_kv of 4, 8 or 32 (the shipped rows' grids), none a key
POINTS = ((4, 8, 1, 16249, "bf16"), (2, 16, 2, 5000, "bf16"), (8, 4, 1, 3000, "fp16"),
          (4, 8, 2, 24000, "fp16"), (2, 16, 4, 1500, "bf16"), (4, 8, 1, 50000, "bf16"),
          (8, 4, 1, 12000, "bf16"), (1, 32, 4, 600, "fp16"), (32, 8, 1, 50000, "bf16"),
          (16, 16, 2, 100000, "fp16"), (4, 64, 8, 40000, "bf16"), (2, 16, 2, 9000, "fp16"),
          (1, 32, 8, 1300, "bf16"), (4, 8, 1, 7000, "fp16"))
LIMITED = type(ta.DECODE).transfer_limits
UNLIMITED = tuple(term for term in LIMITED if term[0] != ("seqlen_k",))


def resolve(problem, rows, limits):
    """The runtime's answer for ``problem`` with the decode family's ``transfer_limits`` set to
    ``limits``: (schedule normalised for it, where it came from)."""
    family = type(ta.DECODE)
    family.transfer_limits = limits
    try:
        found = runtime_resolution(ta.DECODE, problem, rows, "sm_90")
    finally:
        family.transfer_limits = LIMITED
    where = found.detail.split(" in ")[0] if found.source == "nearest" else found.source
    return ta.DECODE.normalise(problem, found.schedule), where


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--plan", action="store_true", help="print the resolutions only")
    args = parser.parse_args()
    rows = shipped_rows(ta.DECODE, "sm_90")
    plans = []
    for b, hq, hkv, sk, dtype in POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                       head_dim=128, dtype=dtype, causal=False)
        free, free_from = resolve(p, rows, UNLIMITED)
        limited, limited_from = resolve(p, rows, LIMITED)
        default = ta.DECODE.default_schedule("sm_90", p)
        print(f"{p.describe()}: no limit {free.describe()} ({free_from}); 2x limit "
              f"{limited.describe()} ({limited_from}); default {default.describe()}")
        plans.append((p, {"no limit": free, "2x limit": limited, "default": default},
                      (free_from, limited_from)))
    if args.plan:
        return
    compile_ahead([(p, s) for p, c, _ in plans for s in c.values()])
    summary = []
    for p, candidates, (free_from, limited_from) in plans:
        case = ta.DECODE.case(p, 0)
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        fns["torch-cudnn"] = case.baselines()["torch-cudnn"]
        times = {n: t.median_ms for n, t in time_interleaved(fns, rounds=args.rounds).items()}
        print(f"== {p.describe()}: " + "  ".join(
            f"{n} {1e3 * t:.1f} us" + (f" err {errors[n]:.1e}" if n in errors else "")
            for n, t in times.items()))
        summary.append((p.describe(), free_from, limited_from, times))
    print("\n| call | row without a limit | row at a 2x limit | default µs | "
          "default ÷ no limit (speed) | default ÷ 2x limit | cuDNN ÷ no limit | "
          "cuDNN ÷ default |\n"
          "|---|---|---|---|---|---|---|---|")
    for desc, free_from, limited_from, t in summary:
        print(f"| {desc} | {free_from} | {limited_from} | {1e3 * t['default']:.1f} | "
              f"{t['default'] / t['no limit']:.3f} | {t['default'] / t['2x limit']:.3f} | "
              f"{t['torch-cudnn'] / t['no limit']:.3f} | {t['torch-cudnn'] / t['default']:.3f} |")


if __name__ == "__main__":
    main()
