"""Which shipped problems an installed tiledattention runs from shipped cubins: for every row of
the shipped tables, at its batch and at batch 1, on each architecture named, ``explain``'s
launch path of the schedule the runtime's lookup hands out there. No GPU, no compiler needed.

    python scripts/bundle_coverage.py --arch sm_90,sm_100,sm_120

Prints one line per architecture (problems served from cubins / problems) and every problem
that is not, then exits 1 if any is not.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90,sm_100,sm_120")
    args = parser.parse_args()
    start = time.perf_counter()
    from tiledattention import ARCHITECTURES, get_family, shipped_table
    from tiledattention.tooling import launch_path
    from tuner.lookup import runtime_resolution, shipped_rows

    problems = []
    for table_arch in ARCHITECTURES:
        table = shipped_table(table_arch)
        if table is not None:
            for row in table.rows():
                for batch in dict.fromkeys((row.problem.batch, 1)):
                    problems.append((row.family, dataclasses.replace(row.problem, batch=batch)))
    problems = list(dict.fromkeys(problems))
    missing = 0
    for arch in args.arch.split(","):
        served = 0
        for name, problem in problems:
            family = get_family(name)
            schedule = runtime_resolution(family, problem, shipped_rows(family, arch),
                                          arch).schedule
            path = launch_path(family, problem, schedule, arch)
            if path.startswith("shipped"):
                served += 1
            else:
                missing += 1
                print(f"  {arch} {name} {problem.describe()}: {path}")
        print(f"{arch}: {served} of {len(problems)} shipped problems run from shipped cubins")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
