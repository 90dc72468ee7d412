"""Compile, for sm_90 and in a pool of processes, every kernel the calls of a survey's lines
(``survey_shapes.py``'s output, ``FAMILY --problem ... --problem ...`` a line) launch through the
runtime's lookup (``tuner.lookup.runtime_resolution`` over the shipped rows), so that the benches
that follow on the GPU machine find them in cuTile's cache instead of compiling them one at a
time. A backward call's forward (the kernel that keeps the log-sum-exp) is compiled with it.

    python3 docs/records/probes/survey_compile.py survey_lines.txt
"""

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import tiledattention as ta
from tuner.commands._problems import parse_problem_fields
from tuner.lookup import runtime_resolution, shipped_rows

FAMILIES = {"forward": ("FORWARD",), "backward": ("FORWARD", "BACKWARD"), "decode": ("DECODE",)}


def _compile(job):
    name, fields = job
    try:
        problem = ta.Problem(**fields)
        for each in FAMILIES[name]:
            family = getattr(ta, each)
            schedule = runtime_resolution(family, problem, shipped_rows(family, "sm_90"),
                                          "sm_90").schedule
            family.compile_launchable(family.plan_problem(problem), schedule, "sm_90")
    except Exception as exc:  # noqa: BLE001 - printed here; the bench reports it again
        return f"{name} {fields}: {type(exc).__name__}: {exc}"[:200]
    return None


def main():
    jobs = []
    for line in Path(sys.argv[1]).read_text().splitlines():
        name, *args = line.split()
        jobs += [(name, parse_problem_fields(a)) for a in args if a != "--problem"]
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        for failed in pool.map(_compile, jobs):
            if failed:
                print("  not compiled:", failed)
    print(f"compiled the kernels of {len(jobs)} calls")


if __name__ == "__main__":
    main()
