"""Lookup regret on held-out shapes (issues 18 and 29), measured on the GPU.

    python scripts/lookup_regret.py --family decode --sets varied --out $OUT/decode.json
    python scripts/lookup_regret.py --family forward --sets report --out report.json
    python scripts/lookup_regret.py --family backward --dry-run sm_90        # no GPU
    python scripts/lookup_regret.py --family forward --compile-check 20      # no GPU
    python scripts/lookup_regret.py --out decode.json --from-json            # no GPU

For every shape of the chosen held-out sets of one kernel family (``tuner.lookup``; none is a
shipped key), a per-shape sweep of candidate schedules, all timed interleaved in one run with
torch's SDPA backends (``case.baselines()``: cuDNN, flash, where they take the problem):

- the schedule every fallback policy of ``tuner.lookup.policies_for(family)`` picks: the default,
  ``runtime`` (the lookup as it is in the code, over the shipped rows), the issue 18 nearest
  rule, the nearest row at any distance (and, for the forward, the rules before issue 18);
- the schedules of the ``--neighbours`` shipped rows nearest the shape (same bucket first);
- ``--samples`` seeded random points of the family's full search space;

at most ``--max-candidates`` in all (the policies' picks always). Each candidate is compiled
ahead in ``--jobs`` processes (cuTile's disk cache then serves the launch), checked against the
float32 reference (relative L2 error within ``family.tolerance``) and timed with CUDA events, L2
flushed, ``--rounds`` interleaved rounds. The *best* of a shape is its fastest candidate that
passed; a policy's regret is its pick's time over the best, and its pick/default ratio says
whether it ran slower than the default (issue 29's bar: never below 0.98x the default). Nothing
measured here is written to any table the lookup reads. Writes ``--out`` (JSON) after every shape
and prints the per-shape table and the policies' summary last; no new shape starts after
``--budget-s`` seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

from _gpu import require_gpu

import tiledattention
from search_spaces import family_space
from tiledattention import FORWARD, get_family
from tiledattention.tooling import current_provenance
from tuner.lookup import (HeldOutShape, SET_NAMES, as_measured, evaluate, pick, policies_for,
                          runtime_resolution, shape_set, shipped_rows, summarise)
from tuner.measure import CompilePool, time_interleaved
from tuner.search import compile_job

#: The baseline key prefix in a record's timed contenders (schedule keys are hex digests).
BASELINE = "baseline:"


def shipped_tuned_rows(arch: str, family=FORWARD, any_template: bool = False) -> list:
    """The rows of ``arch``'s shipped table that the runtime's lookup reads for ``family``
    (``tuner.lookup.shipped_rows``; kept for scripts/short_causal_probe.py)."""
    return shipped_rows(family, arch, any_template=any_template)


def neighbour_rows(family, problem, rows: list, count: int) -> list:
    """The ``count`` rows nearest ``problem``: those sharing its bucket first, then those of its
    GQA group size, then by the family's distance, then the faster."""
    def rank(row):
        p = row.problem
        outside = sum(getattr(p, f) != getattr(problem, f) for f in family.bucket_fields)
        return (outside, not family.comparable(p, problem), family.distance(p, problem),
                row.median_ms)
    return sorted(rows, key=rank)[:count]


def candidates(family, shape: HeldOutShape, rows: list, arch: str, *, samples: int,
               neighbours: int, cap: int, seed: int) -> dict[str, tuple[str, Any]]:
    """key -> (why it is here, schedule normalised for the shape). The policies' picks are
    always in (even one the space's static checks reject: the lookup would run it); the rest,
    statically feasible and distinct, up to ``cap`` candidates in all."""
    problem = shape.problem
    spaces = family_space(family.name)
    space = spaces.restrict(spaces.space(arch, "full"), problem)
    found: dict[str, tuple[str, Any]] = {}

    def add(why: str, schedule, *, check: bool = True) -> bool:
        s = family.normalise(problem, schedule)
        if s.key in found or (check and (len(found) >= cap or
                                         space.infeasibility(arch, problem, s) is not None)):
            return False
        found[s.key] = (why, s)
        return True

    for policy in policies_for(family):
        add(f"policy: {policy.name}", policy.choose(family, problem, rows, arch), check=False)
    for row in neighbour_rows(family, family.plan_problem(problem), rows, neighbours):
        add(f"row of {row.problem.describe()}", row.schedule)
    rng = random.Random(f"{seed}:{family.name}:{problem.describe()}")
    names = list(space.choices)
    added = tries = 0
    while added < samples and tries < 50 * max(samples, 1) and len(found) < cap:
        tries += 1
        added += add("sample", space.schedule({n: rng.choice(space.choices[n]) for n in names}))
    return found


def compile_ahead(jobs: list[tuple[Any, Any]], arch: str, processes: int, family=FORWARD,
                  deadline_s: float = 150.0) -> dict[tuple, str]:
    """Compile every (problem, schedule) of ``jobs`` in ``processes`` processes (cuTile's disk
    cache then serves the launches); the first line of each failure, by (problem, schedule
    key). Compiles still running ``deadline_s`` after the start count as failed (a compiler
    that hangs on one candidate must not stop the study) and the pool is killed. Progress goes
    to standard error."""
    start = time.perf_counter()
    failed: dict[tuple, str] = {}
    pool = CompilePool(processes)
    futures = {pool.submit(compile_job, family, p, s, arch): (p, s.key) for p, s in jobs}
    try:
        for n, fut in enumerate(as_completed(futures, timeout=deadline_s), 1):
            _, _, error = fut.result()
            if error is not None:
                failed[futures[fut]] = error.strip().splitlines()[0][:160] if error.strip() \
                    else "compile error"
            if n % 100 == 0:
                print(f"  compiled {n}/{len(jobs)} in {time.perf_counter() - start:.0f} s",
                      file=sys.stderr, flush=True)
    except TimeoutError:
        late = [key for fut, key in futures.items() if not fut.done()]
        for key in late:
            failed[key] = f"compile still running after {deadline_s:g} s"
        print(f"  {len(late)} compiles still running after {deadline_s:g} s: counted as failed",
              file=sys.stderr, flush=True)
        pool.kill()
    except BaseException:  # Ctrl-C, a bug: no compile process outlives the study
        pool.kill()
        raise
    else:
        pool.close()
    print(f"{len(jobs)} compiled in {time.perf_counter() - start:.0f} s; {len(failed)} failed",
          file=sys.stderr, flush=True)
    return failed


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:160]


def measure(set_name: str, shape: HeldOutShape, pool: dict, failed: dict, rows, arch: str,
            args, family=FORWARD) -> dict:
    """Check and time every candidate of ``pool`` and the torch baselines on ``shape``: one
    record (see the module docstring)."""
    problem = shape.problem
    policies = policies_for(family)
    picks = {p.name: pick(p, family, problem, rows, arch) for p in policies}
    found = runtime_resolution(family, problem, rows, arch)
    for name, schedule in picks.items():  # the pool holds them; a pick made now may not
        if schedule.key not in pool:
            pool = {**pool, schedule.key: (f"policy: {name}", schedule)}
    record: dict[str, Any] = {
        "family": family.name, "set": set_name, "name": shape.name,
        "problem": problem.to_dict(), "times": {}, "spread": {},
        "schedules": {k: s.to_dict() for k, (_, s) in pool.items()},
        "why": {k: why for k, (why, _) in pool.items()}, "errors": {},
        "picks": {name: s.key for name, s in picks.items()},
        "default_key": picks["default"].key,
        "runtime_source": found.source, "runtime_detail": found.detail,
        "baselines_ms": {}, "baseline": None, "baseline_ms": None, "cudnn_ms": None,
        "best_key": None, "best_ms": None,
    }
    errors = record["errors"]
    try:
        case = family.case(problem, 0)
    except Exception as exc:  # e.g. out of memory: the shape is a result, not a crash
        errors["case"] = _first_line(exc)
        return record
    tolerance = family.tolerance(problem)
    fns = {}
    for key, (_, schedule) in pool.items():
        if (problem, key) in failed:
            errors[key] = f"compile: {failed[(problem, key)]}"
            continue
        try:
            run = case.launcher(schedule)
            err = case.error(run)
        except Exception as exc:  # a candidate that cannot launch is a result, not a crash
            errors[key] = f"launch: {_first_line(exc)}"
            continue
        if not math.isfinite(err) or err > tolerance:
            errors[key] = f"wrong: relative L2 error {err:.3g}"
            continue
        fns[key] = run
    for name, baseline in case.baselines().items():
        try:
            baseline()
        except Exception as exc:  # this backend does not take the problem
            errors[BASELINE + name] = _first_line(exc)
            continue
        fns[BASELINE + name] = baseline
    if not any(not k.startswith(BASELINE) for k in fns):
        return record
    timed = time_interleaved(fns, rounds=args.rounds)
    times = {k: t.median_ms for k, t in timed.items() if not k.startswith(BASELINE)}
    record["times"] = times
    record["spread"] = {k: t.spread_ms for k, t in timed.items()
                        if not k.startswith(BASELINE)}
    base = {k[len(BASELINE):]: t.median_ms for k, t in timed.items() if k.startswith(BASELINE)}
    record["baselines_ms"] = base
    if base:
        record["baseline"] = min(base, key=base.get)
        record["baseline_ms"] = base[record["baseline"]]
    record["cudnn_ms"] = base.get("torch-cudnn")
    record["best_key"] = min(times, key=times.get)
    record["best_ms"] = times[record["best_key"]]
    return record


def versions(family=FORWARD) -> dict:
    """The software the run measured with (``current_provenance``) and the driver release."""
    import subprocess

    try:
        release = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        release = ""
    return {**current_provenance(family).to_dict(), "driver_release": release}


# -- tables -------------------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b):
        return "-"
    return f"{a / b:.3f}"


def upgraded(record: dict) -> dict:
    """A record of this script before issue 29 (forward only: ``lookup_key``, ``cudnn_ms``) in
    today's form; today's records unchanged."""
    if "picks" in record or "lookup_key" not in record:
        return record
    return {**record, "family": "forward", "picks": {"runtime": record["lookup_key"]},
            "runtime_source": record.get("lookup_source", "?"),
            "baseline": "torch-cudnn" if record.get("cudnn_ms") else None,
            "baseline_ms": record.get("cudnn_ms")}


def report(records: list[dict], rows, arch: str, family=FORWARD) -> None:
    """Per shape (picks as stored at measurement time): the default's, the runtime lookup's and
    the issue 18 rule's times over the best and over the default, and the fastest torch
    baseline's time over the runtime pick's (above 1: faster than torch); then per set one
    summary per policy, as the code picks now, and the runtime's picks as measured."""
    measured = [r for r in records if r["times"]]
    for r in records:
        if not r["times"]:
            why = "; ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "nothing passed"
            print(f"not measured: {r['name']} ({why})")
    print(f"\n{family.name}: {len(measured)} shapes measured on {arch}\n")
    print("| set | shape | problem | default / best | runtime / best (source) | "
          "runtime / default | issue-18 nearest / default | baseline / runtime | best ms | "
          "best schedule |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in measured:
        problem = family.problem_type.from_dict(r["problem"])
        t, best = r["times"], r["best_ms"]
        picks = r["picks"]
        default = t.get(r["default_key"])
        runtime = t.get(picks.get("runtime", ""))
        nearest = t.get(picks.get("nearest (issue 18 rule)", ""))
        tuned = family.schedule_type.from_dict(r["schedules"][r["best_key"]]).describe()
        baseline = (f"{_ratio(r['baseline_ms'], runtime)} ({r['baseline']})"
                    if r["baseline"] else "-")
        print(f"| {r['set']} | {r['name']} | {problem.describe()} | {_ratio(default, best)} | "
              f"{_ratio(runtime, best)} ({r['runtime_source']}) | {_ratio(runtime, default)} | "
              f"{_ratio(nearest, default)} | {baseline} | {best:.4f} | {tuned} |")
    for set_name in dict.fromkeys(r["set"] for r in measured):
        chosen = [r for r in measured if r["set"] == set_name]
        print(f"\n{family.name}, {set_name} set ({len(chosen)} shapes)\n\n| policy | geomean "
              f"regret | worst regret | shapes > 2% slower than the default | worst pick / "
              f"default |\n|---|---|---|---|---|")
        summaries = []
        for policy in policies_for(family):
            try:
                summaries.append(summarise(policy.name, evaluate(policy, family, chosen, rows,
                                                                 arch)))
            except KeyError as exc:  # its pick now was not measured (or failed) on some shape
                print(f"| {policy.name} | not scored: {exc} | | | |")
        try:
            summaries.append(summarise("runtime, as measured",
                                       as_measured("runtime, as measured", chosen, "runtime")))
        except KeyError as exc:
            print(f"| runtime, as measured | not scored: {exc} | | | |")
        for s in summaries:
            print(f"| {s['policy']} | {s['geomean_regret']:.3f} | {s['worst_regret']:.3f} | "
                  f"{s['slower_than_default']} | {s['worst_vs_default']:.3f} |")


# -- the command ---------------------------------------------------------------------------------
def chosen_shapes(family, sets: str, only: str = "") -> list[tuple[str, HeldOutShape]]:
    names = [n.strip() for n in sets.split(",") if n.strip()]
    found = []
    for name in names:
        label = "fitting+report" if name == "both" else name
        found += [(label, s) for s in shape_set(name, family.name)]
    if only:
        keep = {int(i) for i in only.split(",")}
        found = [x for i, x in enumerate(found) if i in keep]
    return found


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="forward", choices=sorted(SET_NAMES),
                        help="the kernel family studied")
    parser.add_argument("--sets", default="varied",
                        help="comma-separated held-out sets: 'varied' (every family); "
                             "'fitting', 'report', 'both' (forward)")
    parser.add_argument("--samples", type=int, default=4, help="random full-space points")
    parser.add_argument("--neighbours", type=int, default=6,
                        help="schedules of the shipped rows nearest each shape")
    parser.add_argument("--max-candidates", type=int, default=14,
                        help="candidates per shape (the policies' picks always count)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds")
    parser.add_argument("--jobs", type=int, default=16, help="compile processes")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no new shape after this many seconds (compiles included)")
    parser.add_argument("--only", default="", help="comma-separated shape indices (debug)")
    parser.add_argument("--any-template", action="store_true",
                        help="use shipped rows tuned with another kernel template too (restamped "
                             "in memory; the installed lookup skips them)")
    parser.add_argument("--out", type=Path, help="the JSON results file")
    parser.add_argument("--dry-run", default="", metavar="ARCH",
                        help="no GPU: the candidates per shape for ARCH, and the total")
    parser.add_argument("--compile-check", type=int, default=0, metavar="N",
                        help="no GPU: compile N seeded random (shape, candidate) pairs for sm_90 "
                             "(the policies' picks first); exit 1 if any fails")
    parser.add_argument("--from-json", action="store_true",
                        help="no GPU: print the tables of an earlier run's --out file")
    args = parser.parse_args(argv)
    for name in args.sets.split(","):
        if name.strip() and name.strip() not in SET_NAMES[args.family]:
            parser.error(f"--sets: {name.strip()!r} is not a set of the {args.family} family "
                         f"(one of {', '.join(SET_NAMES[args.family])})")
    if not (args.dry_run or args.compile_check) and args.out is None:
        parser.error("--out is required (except with --dry-run or --compile-check)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    start = time.perf_counter()
    if args.from_json:
        saved = json.loads(args.out.read_text())
        family = get_family(saved.get("family", "forward"))
        rows = shipped_tuned_rows(saved["arch"], family, saved.get("any_template", False))
        report([upgraded(r) for r in saved["shapes"]], rows, saved["arch"], family)
        return 0
    family = get_family(args.family)
    shapes = chosen_shapes(family, args.sets, args.only)
    arch = args.dry_run or ("sm_90" if args.compile_check else "")
    if arch:
        return plan_only(family, shapes, arch, args)

    require_gpu()
    tiledattention.use_database(str(args.out.parent / "no-user-db.sqlite"))  # shipped + default
    dev = tiledattention.device_info(0)
    arch = dev.arch
    rows = shipped_tuned_rows(arch, family, args.any_template)
    warn_if_no_rows(family, arch, rows, args.any_template)
    pools = {s.name: pool_of(family, s, rows, arch, args) for _, s in shapes}
    jobs = [(s.problem, sched) for _, s in shapes for _, sched in pools[s.name].values()]
    print(f"{dev.name} ({arch}); {len(rows)} shipped {family.name} rows; {len(shapes)} shapes; "
          f"{len(jobs)} (shape, schedule) compiles", file=sys.stderr, flush=True)
    failed = compile_ahead(jobs, arch, args.jobs, family)

    records = []
    header = {"family": family.name, "device": dev.name, "arch": arch,
              "any_template": args.any_template, "rows": len(rows),
              "versions": versions(family), "argv": sys.argv[1:]}
    for set_name, shape in shapes:
        if time.perf_counter() - start > args.budget_s:
            print(f"budget spent: {shape.name} and later shapes not measured", file=sys.stderr)
            break
        try:
            r = measure(set_name, shape, pools[shape.name], failed, rows, arch, args, family)
        except Exception as exc:  # one shape's failure (out of memory, say) ends no run
            r = {"family": family.name, "set": set_name, "name": shape.name,
                 "problem": shape.problem.to_dict(), "times": {},
                 "errors": {"shape": f"{type(exc).__name__}: {_first_line(exc)}"}}
        records.append(r)
        args.out.write_text(json.dumps({**header, "shapes": records}, indent=1))
        if r["times"]:
            t = r["times"]
            print(f"  {shape.name}: {len(t)} timed, runtime/default "
                  f"{_ratio(t.get(r['picks']['runtime']), t.get(r['default_key']))}, "
                  f"default/best {_ratio(t.get(r['default_key']), r['best_ms'])} "
                  f"at {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        else:
            print(f"  {shape.name}: not measured ({r['errors']})", file=sys.stderr, flush=True)
    report(records, rows, arch, family)
    return 0


def pool_of(family, shape: HeldOutShape, rows, arch: str, args) -> dict:
    return candidates(family, shape, rows, arch, samples=args.samples,
                      neighbours=args.neighbours, cap=args.max_candidates, seed=args.seed)


def warn_if_no_rows(family, arch: str, rows, any_template: bool) -> None:
    if not rows:
        print(f"warning: no shipped {family.name} row for {arch} has the current kernel "
              f"template ({family.template_identity()}): every lookup policy answers the "
              f"default{'' if any_template else '; --any-template uses the stale rows'}",
              file=sys.stderr, flush=True)


def plan_only(family, shapes: list, arch: str, args) -> int:
    """``--dry-run``: the candidate counts; ``--compile-check N``: N compiles on this host."""
    rows = shipped_tuned_rows(arch, family, args.any_template)
    warn_if_no_rows(family, arch, rows, args.any_template)
    pools = [(set_name, s, pool_of(family, s, rows, arch, args)) for set_name, s in shapes]
    if args.dry_run:
        for set_name, s, pool in pools:
            picks = len({k for k, (why, _) in pool.items() if why.startswith("policy: ")})
            print(f"{set_name} | {s.name} | {s.problem.describe()} | {len(pool)} candidates "
                  f"({picks} distinct policy picks)")
        total = sum(len(p) for *_, p in pools)
        print(f"{family.name}: {len(rows)} shipped rows, {len(pools)} shapes, {total} "
              f"candidates (= compiles)")
        return 0
    rng = random.Random(args.seed)
    picks = [(s, sched) for _, s, pool in pools for why, sched in pool.values()
             if why.startswith("policy: ")]
    others = [(s, sched) for _, s, pool in pools for why, sched in pool.values()
              if not why.startswith("policy: ")]
    rng.shuffle(picks)
    rng.shuffle(others)
    jobs = (picks + others)[:args.compile_check]
    failed = compile_ahead([(s.problem, sched) for s, sched in jobs], arch,
                           min(args.jobs, os.cpu_count() or 1), family)
    for s, sched in jobs:
        error = failed.get((s.problem, sched.key))
        if error is not None:
            print(f"FAILED {s.name} [{s.problem.describe()}] {sched.describe()}: {error}")
    print(f"{family.name}: {len(jobs)} compiled for {arch}, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
