"""What the shipped table's schedules, or the defaults for its problems, compile to on the CPU:
per kernel, the registers, stack (above zero: spilled registers), shared memory and CTAs an SM
(``tiledattention.tooling.kernel_resources`` / ``resident_ctas``), against the occupancy the
schedule asks of that kernel. Prints the schedules whose kernels spill or hold fewer CTAs an SM
than asked, then a summary table by family.

    python scripts/resource_audit.py --device sm_90 --set shipped [--family backward] [--jobs 2]
    python scripts/resource_audit.py --device sm_90 --set defaults

``--set defaults``: each shipped problem with its family's default schedule for ``--device``
(the schedule an untuned shape of that kind runs). Problems and schedules compiled once each.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tiledattention import get_family, shipped_table  # noqa: E402
from tiledattention.tooling import resident_ctas  # noqa: E402

#: the schedule field holding the occupancy each kernel is compiled for, by kernel name
ASKED = {"attention_fwd": "occupancy", "decode_split": "occupancy",
         "attention_bwd_dkdv": "dkdv_occupancy", "attention_bwd_dq": "dq_occupancy"}


def _compile(job):
    family_name, problem, schedule, arch = job
    family = get_family(family_name)
    try:
        built = family.compile(problem, schedule, arch)
    except Exception as exc:  # reported, not fatal: the audit goes on
        return job, f"{type(exc).__name__}: {exc}"[:200]
    return job, built.resources()


def jobs_for(arch: str, which: str, family_filter: str | None) -> list[tuple]:
    table = shipped_table(arch)
    if table is None:
        raise SystemExit(f"no shipped table for {arch}")
    seen, jobs = set(), []
    for row in table.rows():
        if family_filter and row.family != family_filter:
            continue
        family = get_family(row.family)
        schedule = (row.schedule if which == "shipped"
                    else family.default_schedule(arch, row.problem))
        schedule = family.normalise(row.problem, schedule)
        key = (row.family, row.problem, schedule)
        if key not in seen:
            seen.add(key)
            jobs.append((row.family, row.problem, schedule, arch))
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="sm_90")
    parser.add_argument("--set", choices=("shipped", "defaults"), default="shipped")
    parser.add_argument("--family", default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    jobs = jobs_for(args.device, args.set, args.family)
    print(f"{len(jobs)} schedules ({args.set}, {args.device}) to compile on {args.jobs} processes",
          file=sys.stderr, flush=True)
    summary: dict[str, list[int]] = {}  # family -> [schedules, spilling, short of the hint, failed]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for (family, problem, schedule, arch), kernels in pool.map(_compile, jobs):
            counts = summary.setdefault(family, [0, 0, 0, 0])
            counts[0] += 1
            if isinstance(kernels, str):
                counts[3] += 1
                print(f"{family} {problem.describe()} {schedule.describe()}: {kernels}")
                continue
            notes = []
            for k in kernels:
                residency = resident_ctas(k, arch)
                asked = getattr(schedule, ASKED.get(k.name, ""), None)
                if k.spills:
                    notes.append(f"{k.name} keeps {k.stack_bytes} B a thread on the stack "
                                 f"({k.registers} registers)")
                if asked and residency is not None and residency.ctas < asked:
                    notes.append(f"{k.name} asks {asked} CTAs an SM, holds "
                                 f"{residency.describe()}")
            counts[1] += any(k.spills for k in kernels)
            counts[2] += any("asks" in n for n in notes)
            if notes:
                print(f"{family} {problem.describe()} {schedule.describe()}: " + "; ".join(notes),
                      flush=True)
    print("\n| family | schedules | spilling | fewer CTAs an SM than asked | not compiled |\n"
          "|---|---|---|---|---|")
    for family, (n, spilling, short, failed) in sorted(summary.items()):
        print(f"| {family} | {n} | {spilling} | {short} | {failed} |")


if __name__ == "__main__":
    main()
