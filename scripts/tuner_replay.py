"""Issue 18, item 4 (CPU part): replay search strategies against a sweep of measured schedules.

Reads the JSON of ``scripts/tuner_sweep.py`` (per key: a seeded uniform sample of the forward
family's full space, each schedule's median time or failure) and replays, with many seeds:

``tuner``
    the real tuner's strategy, through the driver's own proposal code
    (``tuner.search.replay_tuner``): its seeds (the default and the nearest shipped
    winners, as recorded by the sweep), hill climbing (a third of the budget), TPE for the
    rest, ``--lookahead`` candidates in flight, patience 30. It runs once per budget with that
    budget as ``--trials`` (the climbing share and TPE's start-up trials depend on it).
``climb``
    the same with the whole budget for climbing after the seeds (``--neighbour-trials`` =
    budget).
``tpe``
    TPE alone: no seeds, no climbing.
``random``
    random search over the sample: uniform, without replacement.

Off-sample proposals (a sample is a few hundred of ~10^5 normalised schedules): a proposal that
the sweep did not measure is stood in for by the nearest sampled schedule that run has not
measured yet (per-dimension distance; ``tuner/search/_replay.py`` says how), and the proposal
counts as tried. The table says how many of a strategy's trials were stand-ins and how far they
were from their proposals (0 would be an exact hit; 1 is one dimension's whole range).

For each key, strategy and budget: the share of the sweep's best a run reaches (sweep best time
/ best time found; 1 = it found the sample's best), its mean, median and 10th percentile over the
seeds, and how often it comes within 1% of the sweep's best.

    python scripts/tuner_replay.py sweep.json --seeds 200 [--json] [--jobs 16]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import search_spaces  # noqa: E402
from search_spaces import SearchSpace  # noqa: E402
from tiledattention import get_family  # noqa: E402
from tuner.measure import FAILURES  # noqa: E402
from tuner.search import Landscape, replay_random, replay_tuner  # noqa: E402

STRATEGIES = ("tuner", "climb", "tpe", "random")


def load(doc: dict) -> list[dict]:
    """Per key of a sweep document: its landscape (the measured and failed schedules; those the
    sweep did not reach are not part of it), the tuner's seeds and the default."""
    family = get_family(doc.get("family", "forward"))
    spaces = search_spaces.family_space(family.name)
    keys = []
    for key in doc["keys"]:
        problem = family.problem_type.from_dict(key["problem"])
        current = spaces.restrict(spaces.space(doc["arch"], doc.get("space", "full")), problem)
        recorded = {n: tuple(v) for n, v in key["space"].items()}
        space = current
        if {n: tuple(v) for n, v in current.choices.items()} != recorded:
            warnings.warn(f"{problem.describe()}: the search space changed since the sweep; "
                          "replaying on the sweep's dimensions", stacklevel=2)
            space = SearchSpace(doc["arch"], recorded, current.base, current.infeasibility)
        every, outcomes, schedules = {}, {}, {}
        for c in key["candidates"]:
            s = family.normalise(problem, family.schedule_type.from_dict(c["schedule"]))
            every[c["key"]] = s
            if c["status"] == "ok" and c.get("median_ms") is not None:
                outcomes[s.key] = float(c["median_ms"])
            elif c["status"] in FAILURES:
                outcomes[s.key] = c["status"]
            else:  # not reached within the sweep's budget: not part of the sample
                continue
            schedules[s.key] = s
        landscape = Landscape(family=family, problem=problem, space=space, outcomes=outcomes,
                              schedules=schedules,
                              feasible_count=key.get("feasible_estimate"))
        seeds = [every[k] for k in key["seeds"] if k in every]
        default = every.get(key["default"])
        keys.append({"describe": problem.describe(), "landscape": landscape, "seeds": seeds,
                     "default": default})
    return keys


# -- running the replays (in worker processes) -----------------------------------------------
_KEYS: list[dict] = []


def _init(doc: dict) -> None:
    global _KEYS
    _KEYS = load(doc)


def _run(task: tuple) -> tuple:
    """One (key, strategy, budget) over a chunk of seeds: per seed the best time found, the
    stand-ins and the sum of their distances."""
    k, strategy, budget, seeds, lookahead, patience = task
    key = _KEYS[k]
    out = []
    for seed in seeds:
        if strategy == "tuner":
            r = replay_tuner(key["landscape"], key["seeds"], n_trials=budget, seed=seed,
                             lookahead=lookahead, patience=patience)
        elif strategy == "climb":
            r = replay_tuner(key["landscape"], key["seeds"], n_trials=budget, seed=seed,
                             neighbour_trials=budget, lookahead=lookahead, patience=patience,
                             strategy="climb")
        elif strategy == "tpe":
            r = replay_tuner(key["landscape"], [], n_trials=budget, seed=seed,
                             neighbour_trials=0, lookahead=lookahead, patience=patience,
                             strategy="tpe")
        else:
            r = replay_random(key["landscape"], n_trials=budget, seed=seed)
        out.append((seed, r.best_after(budget), len(r.measured), r.stand_ins,
                    sum(r.snap_distances)))
    return k, strategy, budget, out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def replay(doc: dict, *, seeds: int, budgets: list[int], strategies: list[str],
           lookahead: int = 4, patience: int | None = 30, jobs: int = 1,
           first_seed: int = 0) -> dict:
    """The summary ``--json`` prints (see the module docstring)."""
    keys = load(doc)
    chunk = max(1, min(25, seeds // max(1, jobs)))
    tasks = []
    for k in range(len(keys)):
        for strategy in strategies:
            for budget in budgets:
                for lo in range(first_seed, first_seed + seeds, chunk):
                    tasks.append((k, strategy, budget,
                                  list(range(lo, min(first_seed + seeds, lo + chunk))),
                                  lookahead, patience))
    results: dict = {}
    started = time.monotonic()
    if jobs > 1:
        ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux")
                                          else "spawn")
        with ctx.Pool(jobs, initializer=_init, initargs=(doc,)) as pool:
            for i, (k, strategy, budget, out) in enumerate(pool.imap_unordered(_run, tasks)):
                results.setdefault((k, strategy, budget), []).extend(out)
                if (i + 1) % max(1, len(tasks) // 10) == 0:
                    print(f"[{time.monotonic() - started:5.0f} s] {i + 1}/{len(tasks)} chunks",
                          file=sys.stderr, flush=True)
    else:
        _init(doc)
        for task in tasks:
            k, strategy, budget, out = _run(task)
            results.setdefault((k, strategy, budget), []).extend(out)
    summary = {"seeds": seeds, "first_seed": first_seed, "budgets": budgets,
               "strategies": strategies, "lookahead": lookahead, "patience": patience,
               "keys": []}
    for k, key in enumerate(keys):
        land = key["landscape"]
        best = land.best_ms
        values = land.outcomes
        default = values.get(key["default"].key) if key["default"] is not None else None
        seed_values = [values[s.key] for s in key["seeds"] if isinstance(values.get(s.key),
                                                                          float)]
        entry = {"key": key["describe"], "sample": len(land),
                 "correct": sum(isinstance(v, float) for v in values.values()),
                 "sweep_best_ms": best,
                 "default_share": best / default if isinstance(default, float) else None,
                 "seeds_share": best / min(seed_values) if seed_values else None,
                 "results": {}}
        for strategy in strategies:
            per_budget = {}
            for budget in budgets:
                runs = sorted(results[(k, strategy, budget)])
                shares = [best / found if found < math.inf else 0.0
                          for _, found, _, _, _ in runs]
                measured = sum(m for _, _, m, _, _ in runs)
                stand_ins = sum(s for _, _, _, s, _ in runs)
                per_budget[str(budget)] = {
                    "mean": statistics.fmean(shares), "median": statistics.median(shares),
                    "p10": _percentile(shares, 0.10),
                    "within_1pct": sum(s >= 0.99 for s in shares) / len(shares),
                    "found_best": sum(s >= 1 - 1e-12 for s in shares) / len(shares),
                    "mean_trials": measured / len(runs),
                    "stand_in_share": stand_ins / measured if measured else 0.0,
                    "mean_snap_distance": (sum(d for _, _, _, _, d in runs) / stand_ins
                                           if stand_ins else 0.0),
                    "shares": shares,
                }
            entry["results"][strategy] = per_budget
        summary["keys"].append(entry)
    summary["winner"] = {}
    for budget in budgets:
        means = {s: statistics.fmean(e["results"][s][str(budget)]["mean"]
                                     for e in summary["keys"]) for s in strategies}
        summary["winner"][str(budget)] = {"strategy": max(means, key=means.get),
                                          "mean_share_over_keys": means}
    return summary


def markdown(summary: dict) -> str:
    lines = []
    for entry in summary["keys"]:
        default = entry["default_share"]
        seeds = entry["seeds_share"]
        lines.append(f"### {entry['key']}: {entry['sample']} sampled schedules "
                     f"({entry['correct']} correct), sweep best {entry['sweep_best_ms']:.4f} ms; "
                     f"default reaches {default:.3f}" if default is not None else
                     f"### {entry['key']}: {entry['sample']} sampled schedules")
        if seeds is not None:
            lines[-1] += f", the best seed {seeds:.3f}"
        lines.append("")
        lines.append("| strategy | trials | mean share | median | p10 | within 1% | found best | "
                     "stand-ins | mean snap distance |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for strategy, per_budget in entry["results"].items():
            for budget, r in per_budget.items():
                snap = (f"{r['stand_in_share']:.0%} | {r['mean_snap_distance']:.2f}"
                        if strategy != "random" else "- | -")
                lines.append(f"| {strategy} | {budget} | {r['mean']:.3f} | {r['median']:.3f} | "
                             f"{r['p10']:.3f} | {r['within_1pct']:.0%} | {r['found_best']:.0%} | "
                             f"{snap} |")
        lines.append("")
    lines.append("Mean share over the keys (the higher, the better):")
    lines.append("")
    strategies = summary["strategies"]
    lines.append("| trials | " + " | ".join(strategies) + " | best |")
    lines.append("|---|" + "---|" * (len(strategies) + 1))
    for budget, w in summary["winner"].items():
        means = w["mean_share_over_keys"]
        lines.append(f"| {budget} | " + " | ".join(f"{means[s]:.3f}" for s in strategies)
                     + f" | {w['strategy']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Replay search strategies against a tuner_sweep.py result, with many "
                    "seeds (issue 18, item 4).")
    parser.add_argument("sweep", help="the JSON scripts/tuner_sweep.py wrote")
    parser.add_argument("--seeds", type=int, default=200, help="seeds per strategy (200)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--budgets", default="10,20,40",
                        help="comma-separated trial budgets (default 10,20,40)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated, of {', '.join(STRATEGIES)} (default: all)")
    parser.add_argument("--lookahead", type=int, default=4,
                        help="candidates in flight, as the GPU search has (default 4)")
    parser.add_argument("--patience", type=int, default=30,
                        help="the driver's patience (default 30; 0: none)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes (default: every core)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document instead of the tables")
    args = parser.parse_args(argv)
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        parser.error(f"--budgets must be comma-separated integers; got {args.budgets!r}")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        parser.error(f"--strategies must be some of {', '.join(STRATEGIES)}; got {unknown}")
    if args.seeds < 1 or any(b < 1 for b in budgets) or args.jobs < 1 or args.lookahead < 1:
        parser.error("--seeds, --budgets, --jobs and --lookahead must be positive")
    with open(args.sweep) as f:
        doc = json.load(f)
    summary = replay(doc, seeds=args.seeds, budgets=budgets, strategies=strategies,
                     lookahead=args.lookahead, patience=args.patience or None, jobs=args.jobs,
                     first_seed=args.first_seed)
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        print()
    else:
        print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
