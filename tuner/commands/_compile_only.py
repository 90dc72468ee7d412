"""``tiledtune search --compile-only``: compile a family's candidates for an architecture on this
machine (no GPU), recording the failures in each key's study."""

from __future__ import annotations

import os
from concurrent.futures import as_completed

from tiledattention import get_family

from ._locations import db_location, shown_location, storage_location
from ._progress import LineProgress, progress
from ._report import print_json, print_table, results_console

__all__ = ["compile_only", "LineProgress"]


def compile_only(args, problems, console) -> int:
    """Compile candidates for ``--device`` on this machine; failures go into each key's study
    as failed trials, so a later GPU search skips them without spending GPU time.

    Per key ``--limit`` (default ``--trials``) candidates, the same ones for the same command
    (``compile_sample``), or every one with ``--sweep``; candidates the study already settled
    are skipped, so an interrupted run resumes (compiled ones hit cuTile's disk cache). The
    compile processes are a ``CompilePool``: a Ctrl-C kills them with their tileiras at once.
    Progress is a bar on a terminal, else lines at a low rate (``_progress.LineProgress``)."""
    import optuna
    from rich.table import Table

    import search_spaces

    from ..measure import CompilePool
    from ..search import (SearchConfig, StudyIdentity, compile_job, compile_sample, open_storage,
                          settled, study_name)

    family = get_family(args.kernel)
    spaces = search_spaces.family_space(family.name)
    storage_url = storage_location(args, db_location(args))
    config = SearchConfig(study_prefix=args.study)
    storage = open_storage(storage_url, heartbeat_s=config.heartbeat_s, grace_s=config.grace_s)
    # the failures recorded are this template's: a study of another template is refused (before
    # any key is compiled), and the studies written record the template
    identity = StudyIdentity(template=family.template_identity())
    names = [study_name(args.study, family, args.device, problem) for problem in problems]
    for name in set(names) & set(optuna.get_all_study_names(storage)):
        identity.check(optuna.load_study(study_name=name, storage=storage))
    jobs = args.jobs or max(1, os.cpu_count() or 1)
    table = Table(title=f"compile-only for {args.device}")
    for col in ("key", "candidates", "compiled", "failed", "median s", "smem KiB (min..max)",
                "spilling"):
        table.add_column(col)
    failures_total = 0
    keys = []  # the --json form of the table's rows
    for problem in problems:
        space = spaces.restrict(spaces.space(args.device, args.space), problem)
        candidates, feasible_count = compile_sample(
            family, space, problem, args.device,
            None if args.sweep else (args.limit or args.trials), seed=args.seed)
        study = optuna.create_study(study_name=study_name(args.study, family, args.device,
                                                          problem),
                                    storage=storage, direction="minimize", load_if_exists=True)
        identity.record(study)
        distributions = {n: optuna.distributions.CategoricalDistribution(list(v))
                         for n, v in space.choices.items()}
        done = settled(study)
        todo = [s for s in candidates if s.key not in done]
        if args.sweep:
            console.print(f"full sweep of {problem.describe()} for {args.device}: "
                          f"{len(todo):,} candidates to compile ({feasible_count:,} feasible, "
                          f"{feasible_count - len(todo):,} settled before) on {jobs} processes",
                          markup=False)
        elif feasible_count > len(candidates):
            console.print(f"{problem.describe()}: compiling {len(candidates):,} of "
                          f"{feasible_count:,} feasible candidates (--sweep compiles all)",
                          markup=False)
        ok, failed = [], []

        def record(schedule, outcome) -> None:
            seconds, kernels, error = outcome
            if error is None:
                ok.append((seconds, kernels))
                return
            failed.append(schedule)
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.FAIL, params=space.params(schedule),
                distributions=distributions,
                user_attrs={"schedule_key": schedule.key, "status": "compile-error",
                            "schedule": schedule.describe(), "reason": error[:1000]}))
            console.print(f"{schedule.describe()}: {error[:200]}", style="yellow", markup=False)

        # leaving the block on a Ctrl-C kills the compile processes and their tileiras
        with CompilePool(jobs) as pool, _progress(console) as bar:
            task = bar.add_task(problem.describe(), total=len(todo))
            queue = list(todo)
            if args.sweep and queue:  # time one compile (the default's) for the estimate
                first = queue.pop(0)
                outcome = pool.submit(compile_job, family, problem, first, args.device).result()
                record(first, outcome)
                bar.advance(task)
                console.print(f"estimated time: {_about(outcome[0] * -(-len(queue) // jobs))} "
                              f"for the other {len(queue):,} ({outcome[0]:.1f} s per compile, "
                              f"{jobs} at a time)", markup=False)
            futures = {pool.submit(compile_job, family, problem, s, args.device): s
                       for s in queue}
            for future in as_completed(futures):
                record(futures[future], future.result())
                bar.advance(task)
        failures_total += len(failed)
        times = sorted(s for s, _ in ok)
        read = [kernels for _, kernels in ok if kernels]
        shared = [kernels[0].shared_bytes for kernels in read]  # the main kernel's
        # candidates with a kernel that keeps values in local memory (spilled registers)
        spilling = sum(any(k.spills for k in kernels) for kernels in read)
        table.add_row(problem.describe(), f"{len(candidates)} of {feasible_count}",
                      str(len(ok)), str(len(failed)),
                      f"{times[len(times) // 2]:.1f}" if times else "-",
                      f"{min(shared) // 1024}..{max(shared) // 1024}" if shared else "-",
                      f"{spilling} of {len(read)}" if read else "-")
        keys.append({"key": problem.describe(), "problem": problem, "candidates": len(candidates),
                     "feasible": feasible_count, "settled_before": len(candidates) - len(todo),
                     "compiled": len(ok), "failed": len(failed),
                     "median_compile_s": times[len(times) // 2] if times else None,
                     "shared_memory_bytes": [min(shared), max(shared)] if shared else None,
                     "spilling": spilling if read else None})
    _print_compile_only(args, table, keys, storage_url, failures_total)
    return 0


def _progress(console):
    """A rich bar on a terminal; elsewhere (a pipe, a log, CI), where rich draws nothing until
    the bar ends, :class:`LineProgress` (``_progress``)."""
    from rich.progress import Progress

    return progress(console, lambda: Progress(console=console), what="compile-only",
                    unit="compiled")


def _about(seconds: float) -> str:
    """``"about 40 s"``, ``"about 12 min"``, ``"about 3.4 h"``."""
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 5400:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"


def _print_compile_only(args, table, keys: list[dict], storage_url: str,
                        failures: int) -> None:
    """The compile-only summary on standard output: the table (or ``--json``) and the study
    storage the failures went to."""
    if args.json:
        print_json("search", {"mode": "compile-only", "kernel": get_family(args.kernel).name,
                              "arch": args.device, "storage": shown_location(storage_url),
                              "study_prefix": args.study, "keys": keys})
        return
    out = results_console()
    print_table(out, table)
    # the storage is named either way: a GPU search with the same --db or --storage reads it
    outcome = (f"{failures} compile failure(s) recorded as infeasible for {args.device}; a "
               f"search of these keys skips them" if failures else "nothing failed")
    out.print(f"study storage: {shown_location(storage_url)} ({outcome})", markup=False)
