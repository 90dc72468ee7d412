"""Which calls an installed tiledattention runs from shipped cubins (the package's bundles, the
cubin cache of ``tiledtune warm``, ``$TILEDATTENTION_CUBINS``): ``explain``'s launch path of the
schedule the runtime's lookup hands out, on each architecture named. No GPU, no compiler.

    python scripts/bundle_coverage.py --arch sm_90,sm_100,sm_120            # the shipped rows
    python scripts/bundle_coverage.py --arch sm_90 --model 28/4,128 \\
        --lengths 100,173,700,3000,12000 --batch 1,4                         # a model's calls

Without ``--model``: every row of the shipped tables, at its batch and at batch 1. With it: at
each batch and length L, a causal prefill of L tokens and a decode step over L keys, in the
family ``sdpa``'s dispatch picks. Prints one line per architecture (calls served from cubins /
calls) and every call that is not, then exits 1 if any is not.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90,sm_100,sm_120")
    parser.add_argument("--model", help="HQ/HKV,D: a model's calls instead of the shipped rows")
    parser.add_argument("--lengths", type=_ints, default=[100, 173, 700, 1000, 3000, 12000])
    parser.add_argument("--batch", type=_ints, default=[1, 4])
    parser.add_argument("--dtype", default="bf16")
    args = parser.parse_args()
    start = time.perf_counter()
    from tiledattention import ARCHITECTURES, choose_family, get_family, shipped_table
    from tiledattention.tooling import launch_path
    from tuner.aot import model_calls
    from tuner.lookup import runtime_resolution, shipped_rows

    calls = []  # (family name, or an operation the dispatch picks the family of; problem)
    if args.model:
        heads, _, dim = args.model.partition(",")
        hq, _, hkv = heads.partition("/")
        calls = model_calls(int(hq), int(hkv or hq), int(dim), dtypes=(args.dtype,),
                            batches=args.batch, lengths=args.lengths, training=False)
    else:
        for table_arch in ARCHITECTURES:
            table = shipped_table(table_arch)
            if table is not None:
                for row in table.rows():
                    for batch in dict.fromkeys((row.problem.batch, 1)):
                        calls.append((row.family, dataclasses.replace(row.problem, batch=batch)))
        calls = list(dict.fromkeys(calls))
    missing = 0
    for arch in args.arch.split(","):
        served = 0
        for name, problem in calls:
            family = (choose_family(arch, problem, name) if args.model else get_family(name))
            schedule = runtime_resolution(family, problem, shipped_rows(family, arch),
                                          arch).schedule
            path = launch_path(family, problem, schedule, arch)
            if path.startswith("shipped"):
                served += 1
            else:
                missing += 1
                print(f"  {arch} {family.name} {problem.describe()}: {path}")
        print(f"{arch}: {served} of {len(calls)} calls run from shipped cubins")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
