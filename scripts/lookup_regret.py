"""Lookup regret on held-out shapes (issue 18), measured on the GPU.

    python scripts/lookup_regret.py --sets both --out $OUT/lookup.json

For every shape of the held-out sets (``tuner.lookup``; none is a shipped key): a per-shape
sweep of candidate schedules, all timed interleaved in one run with torch's cuDNN backend:

- the schedule every fallback policy of ``tuner.lookup.POLICIES`` picks (the default, the nearest
  shipped row under several rules), and what ``tiledattention.explain`` answers now;
- every distinct forward schedule of the shipped table;
- the schedule of every branch of the default's decision list;
- ``--samples`` seeded random points of the full search space;
- for a head dim that is not a power of two, each of these with the head dim split and padded.

Each candidate is compiled ahead in ``--jobs`` processes (cuTile's disk cache then serves the
launch), checked against the float32 reference (relative L2 error) and timed with CUDA events,
L2 flushed, ``--rounds`` interleaved rounds. The *tuned winner* of a shape is the fastest
candidate that passed; a policy's regret is its pick's time over the winner's. Nothing measured
here is written to any table the lookup reads. Writes every time to ``--out`` (JSON) and prints
the per-shape table and the policies' regret summary last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from concurrent.futures import as_completed
from pathlib import Path


import tiledattention
from search_spaces import FORWARD_SPACE
from tiledattention import FORWARD, Problem, shipped_table
from tiledattention.tooling import current_provenance
from tiledattention.forward import head_dim_parts
from tuner.lookup import POLICIES, HeldOutShape, regret_table, shape_set
from tuner.measure import CompilePool, time_interleaved
from tuner.search import compile_job


def shipped_tuned_rows(arch: str) -> list:
    """The forward rows of ``arch``'s shipped table that the runtime's lookup reads (measured on
    a GPU with the current kernel template): the rows the policies choose from (each has the
    ``problem``, ``schedule`` and ``median_ms`` a policy reads)."""
    current = FORWARD.template_identity()
    return [r for r in shipped_table(arch) or ()
            if r.family == FORWARD.name and r.backend == "gpu"
            and r.provenance.template_hash == current]


def candidates(shape: HeldOutShape, rows: list, arch: str, samples: int,
               seed: int) -> dict[str, tuple[str, object]]:
    """key -> (why it is here, normalised schedule)."""
    problem = shape.problem
    space = FORWARD_SPACE.restrict(FORWARD_SPACE.space(arch, "full"), problem)
    found: dict[str, tuple[str, object]] = {}
    splits = head_dim_parts(problem.head_dim, True)[1] != 0

    def add(why: str, schedule) -> None:
        variants = [schedule] + ([schedule.replace(split_d=not schedule.split_d)]
                                 if splits else [])
        for s in variants:
            s = FORWARD.normalise(problem, s)
            if space.infeasibility(arch, problem, s) is None and s.key not in found:
                found[s.key] = (why, s)

    for policy in POLICIES:
        add(f"policy: {policy.name}", policy.choose(problem, rows, arch))
    padded = head_dim_parts(problem.head_dim, False)[0]
    for row in rows:  # the shipped schedules of the head dim (or the power of two above it)
        if row.problem.head_dim == padded:
            add("shipped schedule", row.schedule)
    for schedule in default_branches(arch, problem):
        add("default branch", schedule)
    rng = random.Random(seed)
    names = list(space.choices)
    drawn = 0
    while drawn < samples:
        s = space.schedule({n: rng.choice(space.choices[n]) for n in names})
        before = len(found)
        add("sample", s)
        drawn += len(found) > before or space.infeasibility(arch, problem, s) is not None
    return found


def default_branches(arch: str, problem: Problem) -> list:
    """The schedules every branch of the architecture's default decision list gives (asked
    with stand-in head dims, masks and lengths), so a branch's schedule is also measured on
    the shapes other branches serve."""
    found = {}
    for d, causal, length in itertools.product((48, 64, 96, 128, 256), (False, True),
                                               (256, 257, 1024, 8192)):
        stand_in = Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=length, seqlen_k=length,
                           head_dim=d, dtype=problem.dtype, causal=causal)
        schedule = FORWARD.default_schedule(arch, stand_in).replace(split_d=False)
        found[schedule.key] = schedule
    return list(found.values())


def causal_arg(problem: Problem):
    return "bottom_right" if problem.bottom_right else problem.causal


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="both", choices=("fitting", "report", "both"))
    parser.add_argument("--samples", type=int, default=8, help="random full-space points")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds")
    parser.add_argument("--jobs", type=int, default=16, help="compile processes")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--budget-s", type=float, default=520.0,
                        help="stop starting new shapes after this many seconds")
    parser.add_argument("--only", default="", help="comma-separated shape indices (debug)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON results file")
    parser.add_argument("--dry-run", default="", metavar="ARCH",
                        help="no GPU: only count the candidates per shape for ARCH")
    parser.add_argument("--from-json", action="store_true",
                        help="no GPU: print the tables of an earlier run's --out file")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.from_json:
        saved = json.loads(args.out.read_text())
        report(saved["shapes"], shipped_tuned_rows(saved["arch"]), saved["arch"])
        return 0
    if args.dry_run:
        rows = shipped_tuned_rows(args.dry_run)
        for name in ("fitting", "report"):
            for s in shape_set(name):
                print(name, s.problem.describe(),
                      len(candidates(s, rows, args.dry_run, args.samples, args.seed)))
        return 0

    tiledattention.use_database(str(args.out.parent / "no-user-db.sqlite"))  # shipped + default
    dev = tiledattention.device_info(0)
    arch = dev.arch
    rows = shipped_tuned_rows(arch)
    shapes = [(name, s) for name in (("fitting", "report") if args.sets == "both"
                                     else (args.sets,)) for s in shape_set(name)]
    if args.only:
        keep = {int(i) for i in args.only.split(",")}
        shapes = [x for i, x in enumerate(shapes) if i in keep]
    pools = {s.name: candidates(s, rows, arch, args.samples, args.seed) for _, s in shapes}
    jobs = [(s.problem, sched) for _, s in shapes for _, sched in pools[s.name].values()]
    print(f"{dev.name} ({arch}); {len(rows)} shipped forward rows; {len(shapes)} shapes; "
          f"{len(jobs)} (shape, schedule) compiles", file=sys.stderr, flush=True)

    failed = compile_ahead(jobs, arch, args.jobs)

    records = []
    for set_name, shape in shapes:
        if time.perf_counter() - start > args.budget_s:
            print(f"budget spent: {shape.name} and later shapes not measured", file=sys.stderr)
            break
        records.append(measure(set_name, shape, pools[shape.name], failed, rows, arch, args))
        args.out.write_text(json.dumps({"device": dev.name, "arch": arch,
                                        "versions": versions(), "shapes": records}, indent=1))
        r = records[-1]
        print(f"  {shape.name}: {len(r['times'])} timed, best/cuDNN "
              f"{r['cudnn_ms'] / r['best_ms'] if r['cudnn_ms'] else float('nan'):.2f}x "
              f"at {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    report(records, rows, arch)
    return 0


def compile_ahead(jobs: list[tuple[Problem, object]], arch: str, processes: int
                  ) -> dict[tuple, str]:
    """Compile every (problem, schedule) of ``jobs`` in ``processes`` processes (cuTile's disk
    cache then serves the launches); the first line of each failure, by (problem, schedule
    key). Progress goes to standard error."""
    start = time.perf_counter()
    failed: dict[tuple, str] = {}
    with CompilePool(processes) as pool:
        futures = {pool.submit(compile_job, FORWARD, p, s, arch): (p, s.key) for p, s in jobs}
        for n, fut in enumerate(as_completed(futures), 1):
            _, _, error = fut.result()
            if error is not None:
                failed[futures[fut]] = error.splitlines()[0][:160]
            if n % 200 == 0:
                print(f"  compiled {n}/{len(jobs)} in {time.perf_counter() - start:.0f} s",
                      file=sys.stderr, flush=True)
    print(f"{len(jobs)} compiled in {time.perf_counter() - start:.0f} s; {len(failed)} failed",
          file=sys.stderr, flush=True)
    return failed


def measure(set_name: str, shape: HeldOutShape, pool: dict, failed: dict, rows, arch: str,
            args) -> dict:
    problem = shape.problem
    case = FORWARD.case(problem, 0)
    tolerance = FORWARD.tolerance(problem)
    found = tiledattention.explain(case.q, case.k, case.v, causal=causal_arg(problem))
    looked_up = FORWARD.normalise(problem, found.schedule)
    if looked_up.key not in pool:
        pool = {**pool, looked_up.key: (f"lookup: {found.source}", looked_up)}
    fns, errors, why = {}, {}, {}
    for key, (reason, schedule) in pool.items():
        why[key] = reason
        if (problem, key) in failed:
            errors[key] = f"compile: {failed[(problem, key)]}"
            continue
        try:
            run = case.launcher(schedule)
            err = case.error(run)
        except Exception as exc:  # a candidate that cannot launch is a result, not a crash
            errors[key] = f"launch: {str(exc).splitlines()[0][:160]}"
            continue
        if not math.isfinite(err) or err > tolerance:
            errors[key] = f"wrong: relative L2 error {err:.3g}"
            continue
        fns[key] = run
    cudnn = case.baselines()["torch-cudnn"]
    try:
        cudnn()
        fns["cudnn"] = cudnn
    except Exception as exc:
        errors["cudnn"] = str(exc).splitlines()[0][:160]
    timed = time_interleaved(fns, rounds=args.rounds)
    times = {k: t.median_ms for k, t in timed.items() if k != "cudnn"}
    best_key = min(times, key=times.get)
    default_key = FORWARD.normalise(problem, FORWARD.default_schedule(arch, problem)).key
    lookup_key = looked_up.key
    return {
        "set": set_name, "name": shape.name, "problem": problem.to_dict(),
        "times": times, "spread": {k: t.spread_ms for k, t in timed.items() if k != "cudnn"},
        "schedules": {k: s.to_dict() for k, (_, s) in pool.items()},
        "why": why, "errors": errors,
        "cudnn_ms": timed["cudnn"].median_ms if "cudnn" in timed else None,
        "best_key": best_key, "best_ms": times[best_key],
        "default_key": default_key, "lookup_key": lookup_key,
        "lookup_source": found.source, "lookup_detail": found.detail,
    }


def versions() -> dict:
    """The software the run measured with (``current_provenance``) and the driver release."""
    import subprocess

    try:
        release = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        release = ""
    return {**current_provenance(FORWARD).to_dict(), "driver_release": release}


def report(records: list[dict], rows, arch: str) -> None:
    """Per shape, times over the tuned winner's (regret) for the lookup before issue 18, the
    lookup now (what ``explain`` answered in this run), the default; and cuDNN's time over
    the lookup's and the winner's (above 1: faster than cuDNN)."""
    before = {r["name"]: s for r, s in zip(records, _picks("before", records, rows, arch))}
    print("\n| set | shape | problem | before / tuned | lookup / tuned (source) | "
          "default / tuned | cuDNN / lookup | cuDNN / tuned | tuned ms | tuned schedule |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in records:
        problem = Problem.from_dict(r["problem"])
        t, best = r["times"], r["best_ms"]
        look = t.get(r["lookup_key"], math.nan)
        cudnn = r["cudnn_ms"] or math.nan
        tuned = FORWARD.schedule_type.from_dict(r["schedules"][r["best_key"]]).describe()
        print(f"| {r['set']} | {r['name']} | {problem.describe()} | "
              f"{before[r['name']] / best:.3f} | {look / best:.3f} ({r['lookup_source']}) | "
              f"{t.get(r['default_key'], math.nan) / best:.3f} | {cudnn / look:.2f} | "
              f"{cudnn / best:.2f} | {best:.3f} | {tuned} |")
    for set_name in ("fitting", "report"):
        chosen = [r for r in records if r["set"] == set_name]
        if not chosen:
            continue
        print(f"\n{set_name} set ({len(chosen)} shapes)\n\n| policy | geomean regret | worst | "
              f"shapes > 2% slower than the default |\n|---|---|---|---|")
        for policy in POLICIES:
            try:
                (row,) = regret_table(chosen, rows, arch, [policy])
            except KeyError as exc:  # its pick failed to compile or to check on some shape
                print(f"| {policy.name} | not scored: {exc} | | |")
                continue
            print(f"| {row['policy']} | {row['geomean_regret']:.3f} | "
                  f"{row['worst_regret']:.3f} | {row['slower_than_default']} |")


def _picks(policy_name: str, records: list[dict], rows, arch: str) -> list[float]:
    """The measured time of ``policy_name``'s pick per record (nan where it was not timed)."""
    (policy,) = [p for p in POLICIES if p.name == policy_name]
    found = []
    for r in records:
        problem = Problem.from_dict(r["problem"])
        key = FORWARD.normalise(problem, policy.choose(problem, rows, arch)).key
        found.append(r["times"].get(key, math.nan))
    return found


if __name__ == "__main__":
    sys.exit(main())
