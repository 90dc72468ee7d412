"""Every shipped sm_90 row of a family against the family's default of today, on the row's own
key, on this device: a row tuned on another GPU, or against an older default, may now run
slower than the default it was kept for beating (exact keys take shipped rows whatever their
stored gain; nearest keys take them where that gain reaches ``transfer_margin``).
Interleaved, the L2 flushed before each sample, GPU time, medians; both schedules checked
against the family case's float32 reference first.

    source .devtk/setup.sh && python3 docs/records/probes/rows_vs_default.py --family decode
        [--rounds 12] [--tuned-on "NVIDIA H100 80GB HBM3"]   # rows of that device only
        [--rows 160-700]   # rows whose B x H_kv lies in that range only
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta
from tiledattention import shipped_table
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from compile_ahead import compile_ahead  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", required=True)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--tuned-on", default=None, help="only the rows of this device name")
    parser.add_argument("--rows", default=None,
                        help="LO-HI: only keys whose batch x K/V heads lies in [LO, HI]")
    args = parser.parse_args()
    low, high = 0, float("inf")
    if args.rows:
        try:
            low, high = (int(x) for x in args.rows.split("-"))
        except ValueError:
            parser.error(f"--rows takes LO-HI, two integers; got {args.rows!r}")
    family = ta.get_family(args.family)
    rows = [r for r in shipped_table("sm_90").rows() if r.family == family.name
            and (args.tuned_on is None or r.device_name == args.tuned_on)
            and low <= r.problem.batch * r.problem.heads_kv <= high]
    pairs = [(r, family.normalise(r.problem, r.schedule),
              family.default_schedule("sm_90", r.problem)) for r in rows]
    compile_ahead([(r.problem, s) for r, row, default in pairs for s in (row, default)
                   if row != default], family=family.name.upper())
    print("| key | row | tuned on | stored gain | default µs | default ÷ row here |\n"
          "|---|---|---|---|---|---|")
    for r, row, default in pairs:
        stored = f"{r.default_ms / r.median_ms:.3f}" if r.default_ms else "-"
        if row == default:
            print(f"| {r.problem.describe()} | {row.describe()} | {r.device_name} | {stored} | "
                  f"- | the default |", flush=True)
            continue
        case = family.case(r.problem, 0)
        fns = {"row": case.launcher(row), "default": case.launcher(default)}
        bad = {n: e for n, run in fns.items()
               if not (e := case.error(run)) <= family.tolerance(r.problem)}
        if bad:
            print(f"| {r.problem.describe()} | wrong: {bad} | | | | |", flush=True)
            continue
        t = {n: x.median_ms for n, x in time_interleaved(fns, rounds=args.rounds).items()}
        print(f"| {r.problem.describe()} | {row.describe()} | {r.device_name} | {stored} | "
              f"{1e3 * t['default']:.1f} | {t['default'] / t['row']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
