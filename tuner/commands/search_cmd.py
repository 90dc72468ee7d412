"""``tiledtune search``: tune a kernel family's schedules for problems and store the winners.

    tiledtune search --device sm_90 --shape 4,16,4096,128 --dtype bf16 --causal yes
    tiledtune search --device sm_90 --shape 4,32/8,4096,128 --shape 1,32/8,16:8192,128
    tiledtune search --compile-only --device sm_121 --shape 4,16,4096,128 --limit 8
    tiledtune search --kernel NAME --device sm_90 --problem field=value,field=value

``--shape`` (``B,H,S,D``, or ``B,HQ/HKV,SQ:SK,D`` for grouped-query and cross attention) and
``--preset`` (with ``--dtype``, ``--causal``) build attention problems (fields batch, heads_q,
heads_kv, seqlen_q, seqlen_k, head_dim, dtype, causal) for any family whose problem has those
fields; ``--problem`` names every field of any family's problem directly. ``--kv-heads`` and
``--seqlen-k`` are deprecated: they are taken with exactly one ``--shape`` that does not give
H_kv / S_k itself, and refused otherwise (they used to apply to every ``--shape`` silently).

Results (the table, or the ``--json`` document) go to standard output, progress and warnings to
standard error; a bad option is one line ``tiledtune search: ...`` and exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys

from tiledattention import ARCHITECTURES, DTYPES, families, get_family

from ..errors import UsageError

from ._compile_only import compile_only
from ._locations import db_location, is_runtime_database, shown_location, storage_location
from ._progress import progress
from ._problems import (PRESETS, parse_arch, parse_choices, parse_duration, parse_problem_fields,
                        parse_shape, problems_from, shape_text)
from ._report import (add_json_option, count, int_at_least, log_console, nonempty,
                      positive_int, print_json, print_table, results_console, say)

#: The one line ``tiledtune`` prints on a Ctrl-C (``cli.main``), once the search's processes
#: are gone and its unfinished trials given back
INTERRUPTED = ("interrupted; the study keeps every finished trial: run the same command again "
               "to resume")

def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Tune a kernel family's schedules for the problems given, on a GPU of --device (or on an\n"
        "analytic model: --backend simulated), and store each problem's winner in the schedule\n"
        "database; --compile-only compiles the search space on this machine instead.")
    parser.epilog = (
        "examples:\n"
        "  tiledtune search --device sm_90 --shape 4,16,4096,128 --dtype bf16,fp16 --causal yes,no\n"
        "  tiledtune search --device sm_90 --shape 4,32/8,4096,128 --shape 1,32/8,16:8192,128\n"
        "  tiledtune search --device sm_90 --preset llama-gqa --trials 30 --timeout 10m\n"
        "  tiledtune search --compile-only --device sm_121 --shape 4,16,4096,128 --limit 16\n"
        "  tiledtune search --device sm_90 --backend simulated --shape 2,8,1024,64 --json\n"
        "\n"
        "Results (a table, or --json) go to standard output; progress and warnings to standard\n"
        "error. Exit status: 0 every key has a schedule, stored (read back from the database);\n"
        "1 some key ended without a row (no schedule found, or none could be stored: a line on\n"
        "standard error says which); 2 bad options, a problem the kernels do not take, or a\n"
        "database that cannot be used.")
    problems = parser.add_argument_group(
        "problems (each --shape or --preset shape, for each --dtype and --causal value)")
    problems.add_argument("--kernel", default="forward", metavar="NAME",
                          help="kernel family to tune (default: forward; known: "
                               + ", ".join(f.name for f in families()) + ")")
    problems.add_argument("--shape", type=parse_shape, action="append", default=[],
                          metavar="B,HQ/HKV,SQ:SK,D",
                          help="an attention problem: batch, query heads, sequence length, head "
                               "dim, e.g. 4,16,4096,128; '/HKV' gives K/V heads for grouped-query "
                               "attention (4,32/8,4096,128), ':SK' a key length other than the "
                               "query length (1,16,16:8192,128). Repeatable")
    problems.add_argument("--preset", choices=sorted(PRESETS), action="append", default=[],
                          help="model shapes: " + "; ".join(
                              f"{k}: H={v[0]}/{v[1]} D={v[2]} S={v[3][0]}..{v[3][-1]}, B·S=16k"
                              for k, v in PRESETS.items()) + ". Repeatable")
    problems.add_argument("--problem", type=parse_problem_fields, action="append", default=[],
                          metavar="FIELD=VALUE,...",
                          help="one problem of the kernel family, every field named (e.g. "
                               "batch=1,heads_q=32,heads_kv=8,seqlen_q=1,seqlen_k=32768,"
                               "head_dim=128,dtype=bf16,causal=false). Repeatable")
    problems.add_argument("--dtype", type=parse_choices({name: name for name in DTYPES}),
                          default=[DTYPES[0]], metavar="LIST",
                          help=f"one of {', '.join(DTYPES)} or a comma list (default "
                               f"{DTYPES[0]}; a family takes its own: Family.tolerances)")
    problems.add_argument("--causal", type=parse_choices({"yes": True, "no": False}),
                          default=[False], metavar="LIST",
                          help="yes (top-left causal mask), no, or yes,no (default no)")
    problems.add_argument("--kv-heads", type=positive_int, default=None, metavar="N",
                          help="deprecated: write --shape B,HQ/HKV,S,D. H_kv of the one --shape "
                               "(refused with several --shape, or one that gives /HKV)")
    problems.add_argument("--seqlen-k", type=positive_int, default=None, metavar="N",
                          help="deprecated: write --shape B,H,SQ:SK,D. S_k of the one --shape "
                               "(refused with several --shape, or one that gives :SK)")
    parser.add_argument("--device", type=parse_arch, required=True, metavar="ARCH",
                        help="architecture to tune for: " + ", ".join(ARCHITECTURES) + " (a "
                             "local GPU must have it, unless --compile-only or --backend "
                             "simulated)")
    budget = parser.add_argument_group("search budget (per key)")
    budget.add_argument("--trials", type=positive_int, default=60, metavar="N",
                        help="measured candidates per key, >= 1 (default 60)")
    budget.add_argument("--timeout", type=parse_duration, default=None, metavar="DURATION",
                        help="wall-clock limit per key, e.g. 90s, 10m, 1h (default none)")
    budget.add_argument("--patience", type=count, default=30, metavar="N",
                        help="stop a key after this many candidates without improvement "
                             "(default 30; 0: never)")
    budget.add_argument("--neighbour-trials", type=count, default=None, metavar="N",
                        help="of --trials, candidates one dimension away from the best so far "
                             "(hill climbing after the seeds; default: a third; at most "
                             "--trials)")
    budget.add_argument("--space", type=nonempty, default="full", metavar="NAME",
                        help="named search space: full (default) or compact")
    budget.add_argument("--seed", type=int_at_least(0, 2**32 - 1), default=0, metavar="N",
                        help="seed of the sampler and of --limit's sample (default 0)")
    where = parser.add_argument_group("storage")
    where.add_argument("--db", type=nonempty, default=None, metavar="PATH_OR_URL",
                       help="schedule database (path or SQLAlchemy URL; default: $TILEDATTN_DB "
                            "or the user cache; --backend simulated: a file of its own)")
    where.add_argument("--storage", type=nonempty, default=None, metavar="URL",
                       help="Optuna storage URL (default: an SQLite file beside --db); a "
                            "postgresql:// URL lets workers on many hosts share one study")
    where.add_argument("--study", type=nonempty, default="tiledtune", metavar="PREFIX",
                       help="study name prefix (default tiledtune)")
    run_group = parser.add_argument_group("how it runs")
    run_group.add_argument("--backend", choices=["gpu", "simulated"], default="gpu",
                           help="simulated: an analytic GPU model (for trying the tool and "
                                "tests); its rows are marked simulated and never used")
    run_group.add_argument("--workers", type=positive_int, default=1, metavar="N",
                           help="tune on N local GPUs of --device at once, one process each, "
                                "sharing the study (default 1)")
    run_group.add_argument("--device-index", type=count, default=None, help=argparse.SUPPRESS)
    # a --workers child's place among them (I of N): it begins on key I * keys // N
    run_group.add_argument("--worker-slot", type=count, nargs=2, default=(0, 1),
                           help=argparse.SUPPRESS)
    run_group.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                           help="parallel compile processes (default: the CPU count, up to 8 "
                                "while a GPU search measures)")
    run_group.add_argument("--compile-only", action="store_true",
                           help="compile the space for --device on this machine (no GPU "
                                "needed); record failures so a GPU search skips them")
    run_group.add_argument("--limit", type=positive_int, default=None, metavar="N",
                           help="with --compile-only: compile a seeded sample of N candidates "
                                "per key (default: --trials of them)")
    run_group.add_argument("--sweep", action="store_true",
                           help="with --compile-only: compile every candidate of the space "
                                "(thousands: it prints how many and an estimate of the time "
                                "first)")
    timing = parser.add_argument_group(
        "timing (how each candidate is timed: match how the kernel will be deployed)")
    timing.add_argument("--timing", choices=["stream", "graph", "host", "loop"], default=None,
                        help="stream: each launch enqueued by the host between two CUDA events "
                             "(default); graph: launches captured into a CUDA graph and "
                             "replayed, as in a model served from CUDA graphs (time per launch "
                             "= replay time / launches); host: an isolated call from an idle "
                             "GPU, the host's time counted (the host clock from the call to "
                             "the end of its GPU work), for host-bound callers; loop: calls "
                             "back to back between two CUDA events, the host's time counted "
                             "where it is slower than the GPU (steady state of a loop of eager "
                             "calls; a warm L2)")
    timing.add_argument("--l2", choices=["cold", "warm"], default=None,
                        help="cold: the L2 is flushed (a buffer of at least twice its size "
                             "read) before every timed launch, the flush itself not timed "
                             "(default; --timing loop: warm, its only state); warm: no flush, "
                             "the inputs stay in L2 from the launch before, as when a kernel "
                             "runs again on the same tensors")
    add_json_option(parser, "each key's result (and where it was stored)")


def timing_mode(args: argparse.Namespace):
    """The ``TimingMode`` of ``--timing`` and ``--l2`` (stream launches, a cold L2 unless
    given; loop launches run on a warm L2, and ``--l2 cold`` with them is a UsageError)."""
    from ..measure import TimingMode

    launch = args.timing or "stream"
    if launch == "loop" and args.l2 == "cold":
        raise UsageError("--timing loop runs its calls back to back, each on the L2 the one "
                         "before left: drop --l2 cold (its L2 is warm)")
    return TimingMode(launch=launch, l2=args.l2 or ("warm" if launch == "loop" else "cold"))


def select_device(arch: str, index: int | None = None):
    """The local GPU with ``arch`` (the ``index``-th of them), or a UsageError saying what
    there is."""
    from tiledattention import local_devices

    devices = local_devices()
    matching = [d for d in devices if d.arch == arch]
    if not matching:
        found = ", ".join(f"{d.arch} ({d.name})" for d in devices) or "no CUDA device"
        raise UsageError(f"no local GPU is {arch}; found {found}")
    if index is None:
        return matching[0]
    for d in matching:
        if d.index == index:
            return d
    raise UsageError(f"GPU {index} is not {arch}")


def run(args: argparse.Namespace) -> int:
    """Bad options, a problem the kernel does not take, a database or study that cannot be used
    raise; ``tuner.cli`` prints them as one line, exit status 2 (``tuner.errors.USER_ERRORS``)."""
    console = log_console()  # progress and warnings; results go to results_console()
    _check_options(args)
    problems = problems_from(args)
    if args.kv_heads is not None or args.seqlen_k is not None:
        say("search", f"note: --kv-heads and --seqlen-k are deprecated; write --shape "
                      f"{shape_text(args.shape[0], args.kv_heads, args.seqlen_k)}")
    if args.compile_only:
        return compile_only(args, problems, console)
    if args.workers > 1:
        return _spawn_workers(args, console)
    return _search(args, problems, console)


def _check_options(args: argparse.Namespace) -> None:
    """What argparse's per-flag types cannot check: flags that depend on each other, and
    ``--space`` (the family's and architecture's named spaces). A ``UsageError`` names the
    flag."""
    import search_spaces

    if args.neighbour_trials is not None and args.neighbour_trials > args.trials:
        raise UsageError(f"--neighbour-trials {args.neighbour_trials} is more than --trials "
                         f"{args.trials}: they are a share of the trials; give at most "
                         f"{args.trials}")
    if args.limit is not None and not args.compile_only:
        raise UsageError(f"--limit {args.limit} applies to --compile-only only; a search "
                         f"measures --trials {args.trials} candidates per key")
    if args.sweep and (not args.compile_only or args.limit is not None):
        raise UsageError("--sweep compiles every candidate with --compile-only; "
                         + ("drop --limit" if args.compile_only else "add --compile-only"))
    if args.compile_only and (args.timing or args.l2):
        flag = f"--timing {args.timing}" if args.timing else f"--l2 {args.l2}"
        raise UsageError(f"{flag} says how candidates are timed; --compile-only times nothing: "
                         f"drop it")
    timed = timing_mode(args)
    if args.backend == "gpu" and not args.compile_only and timed.graph and timed.flush_l2:
        from ..measure import graph_cold_unsupported

        why = graph_cold_unsupported()
        if why is not None:
            raise UsageError(f"--timing graph with a cold L2 (--l2 cold, the default): {why}; "
                             f"give --l2 warm, or install a newer torch")
    if args.backend == "simulated" and not args.compile_only and args.db \
            and is_runtime_database(args.db):
        raise UsageError(f"--db {args.db} is the database the runtime reads, and --backend "
                         "simulated rows never go there (a model's numbers, not measurements); "
                         "give another --db, or none (they then go to a file of their own)")
    if args.workers > 1 and (args.compile_only or args.backend == "simulated"):
        mode = "--compile-only" if args.compile_only else "--backend simulated"
        raise UsageError(f"--workers {args.workers} starts one search per local GPU; "
                         f"{mode} runs in one process"
                         + (" (--jobs sets its parallel compiles)" if args.compile_only else ""))
    spaces = search_spaces.family_space(get_family(args.kernel).name)
    if args.space not in spaces.spaces:
        raise UsageError(f"--space {args.space}: space must be one of {sorted(spaces.spaces)} "
                         f"for the {spaces.family} kernel")
    spaces.space(args.device, args.space)  # the architecture's space builds


def _spawn_workers(args, console) -> int:
    """One child ``tiledtune search`` per local GPU of the architecture, sharing the study."""
    from tiledattention import local_devices

    devices = [d for d in local_devices() if d.arch == args.device][:args.workers]
    if len(devices) < args.workers:
        raise UsageError(f"--workers {args.workers}: only {len(devices)} local GPU(s) are "
                         f"{args.device}")
    argv = [a for i, a in enumerate(args.argv) if a != "--workers" and
            (i == 0 or args.argv[i - 1] != "--workers") and not a.startswith("--workers=")]
    # with --json each worker prints its own document; they are gathered into one
    stdout = subprocess.PIPE if args.json else None
    children: list[subprocess.Popen] = []
    try:
        for slot, d in enumerate(devices):  # a session each: a Ctrl-C reaches this one only
            children.append(subprocess.Popen(
                [sys.executable, "-m", "tuner.cli", *argv, "--device-index", str(d.index),
                 "--worker-slot", str(slot), str(len(devices))],
                stdout=stdout, start_new_session=True))
        if not args.json:
            return max(child.wait() for child in children)
        documents = []
        for child in children:
            text = child.communicate()[0]
            try:
                documents.append(json.loads(text))
            except (json.JSONDecodeError, UnicodeDecodeError):
                documents.append(None)  # it failed before printing (its error is above)
        print_json("search", {"mode": "workers", "workers": documents})
        return max(child.returncode for child in children)
    except KeyboardInterrupt:
        _stop_workers(children)
        raise


def _stop_workers(children: list[subprocess.Popen], grace_s: float = 2.5) -> None:
    """Stop the per-GPU searches of an interrupted ``--workers`` run: SIGTERM (each cleans up as
    on a Ctrl-C, without a message: ``tuner._signals``), then after ``grace_s`` SIGKILL for
    any left (their compile processes die with them: ``PR_SET_PDEATHSIG``)."""
    import signal
    import time

    from ..measure import kill_group

    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(child.pid)
            child.wait()


def _search(args, problems, console) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tiledattention import open_database

    from ..measure import SIMULATED_DEVICE, IsolatedExecutor, SimulatedExecutor
    from ..search import SearchConfig, Tuner

    family = get_family(args.kernel)
    timing = timing_mode(args)  # the executor times so; the study and the summary record it
    if args.backend == "gpu":
        device = select_device(args.device, args.device_index)
        factory = _GpuFactory(family, device.index, timing)
        arch, device_name, device_index = device.arch, device.name, device.index
        sm_count = device.sm_count
    else:
        factory = functools.partial(SimulatedExecutor, args.device, family=family, timing=timing)
        arch, device_name, device_index, sm_count = args.device, SIMULATED_DEVICE, None, 0
    database_at = db_location(args)
    database = open_database(database_at)  # checked (and migrated) before anything is tuned
    storage = storage_location(args, database_at)
    if args.backend == "simulated" and not args.db:
        console.print(f"simulated results go to {database_at} (the runtime never reads it); "
                      "--db names another database")
    config = SearchConfig(n_trials=args.trials, timeout_s=args.timeout,
                          patience=args.patience or None, space=args.space, seed=args.seed,
                          neighbour_trials=args.neighbour_trials, study_prefix=args.study,
                          lookahead=4 if args.backend == "gpu" else 1, timing=timing)
    compile_workers = (args.jobs or max(1, min(8, (os.cpu_count() or 2) - 2))
                       if args.backend == "gpu" else 0)
    def bar() -> Progress:
        return Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"),
                        TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console)

    # a bar on a terminal; in a pipe or a log, a line per tenth of a key's trials or after
    # 30 s without one
    with database as db, IsolatedExecutor(factory) as executor, progress(
            console, bar, what="search", unit="measured") as shown:
        task = {"id": None}

        def on_event(kind: str, data: dict) -> None:
            if kind == "trial":
                m = data["measurement"]
                best = data["best_ms"]
                tflops = (family.flops(data["problem"]) / (best * 1e-3) / 1e12
                          if best < float("inf") else 0)
                shown.update(task["id"], completed=data["measured"], status=(
                    f"best {tflops:.0f} TFLOP/s | last: {data['schedule'].describe()} "
                    f"{m.status} | compile queue {data['queued']}"))
            elif kind == "warning":
                console.print(f"[yellow]{data['message']}[/yellow]")

        tuner = Tuner(executor, family=family, arch=arch, device_name=device_name,
                      storage_url=storage, db=db, config=config,
                      compile_workers=compile_workers, backend=args.backend,
                      device_index=device_index, sm_count=sm_count, on_event=on_event)
        # leaving on a Ctrl-C kills the compile processes and the executor's worker at once,
        # with their tileiras compiles
        with tuner:
            for problem in problems:  # a study measured otherwise (another timing mode,
                tuner.check_study(problem)  # device or template) is refused before any is tuned

            def on_key(problem) -> None:
                task["id"] = shown.add_task(problem.describe(), total=args.trials, status="")

            slot, slots = args.worker_slot
            results = tuner.tune_many(problems, on_key, start=slot * len(problems) // max(1, slots))
    _print_results(args, family, results, database=database_at, storage=storage, arch=arch,
                   device_name=device_name, timing=timing)
    return _exit_status(results, shown_location(database_at))


def _exit_status(results, database: str) -> int:
    """0 when every key ended with a schedule and the database, read back, holds its row; else
    a line on standard error for each key that did not, and 1 (a search that ran to its end
    without a result: the README's rule keeps 2 for what the user can fix before it runs)."""
    missing = [r for r in results if r.best is None or not r.has_row]
    for r in missing:
        why = ("no schedule was found (none measured correct, or the re-timing failed: see "
               "above)" if r.best is None else "its winner could not be stored (see above)")
        say("search", f"{r.problem.describe()}: no row in {database}: {why}")
    return 1 if missing else 0


class _GpuFactory:
    """Picklable factory of the GPU executor for the spawned worker."""

    def __init__(self, family, index: int, timing) -> None:
        self.family = family
        self.index = index
        self.timing = timing

    def __call__(self):
        from ..measure import GpuExecutor

        return GpuExecutor(self.family, self.index, timing=self.timing)


def _print_results(args, family, results, *, database: str, storage: str, arch: str,
                   device_name: str, timing) -> None:
    """The search summary on standard output: a row per key (or ``--json``), then the schedule
    database the winners went to and the study storage that holds every trial; both say how
    the times were measured (``timing``). The speed-ups over the default and over each of the
    family's baselines (a column ``vs <name>`` per baseline any key's re-timing holds) are
    the other's time over the winner's."""
    from rich.table import Table

    from ..measure import Timing

    keys = []
    table = Table(title=f"tiledtune search: {family.name} on {device_name} ({arch}), "
                        f"timed with {timing.describe()}")
    versus = ["default", *sorted({name for r in results for name in r.baselines})]
    for col in ("key", "best schedule", "TFLOP/s", *(f"vs {name}" for name in versus),
                "measured", "failed", "wall", "stored"):
        table.add_column(col)
    for r in results:
        t = r.timings
        best = t.get("best")

        def speedup(name, t=t, best=best):
            other = t.get(name)
            if isinstance(best, Timing) and isinstance(other, Timing):
                return other.median_ms / best.median_ms
            return None

        def ratio(name, t=t):
            value = speedup(name)
            if value is not None:
                return f"{value:.2f}x"
            other = t.get(name)
            return "-" if other is None else str(other)[:20]

        tflops = (family.flops(r.problem) / (best.median_ms * 1e-3) / 1e12
                  if isinstance(best, Timing) else None)
        failed = ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items())) or "0"
        ties = f" (simplest of {len(r.tied)} within noise)" if len(r.tied) > 1 else ""
        table.add_row(r.problem.describe(), r.best.describe() + ties if r.best else "none",
                      "-" if tflops is None else f"{tflops:.0f}",
                      *(ratio(name) for name in versus),
                      str(r.measured), failed, f"{r.wall_s:.0f}s", r.stored or "-")
        keys.append({
            "key": r.problem.describe(), "problem": r.problem,
            "schedule": r.best, "schedule_text": r.best.describe() if r.best else None,
            # the finalists within the measured noise of the fastest, the winner (the simplest
            # of them) first
            "tied": [s.describe() for s in r.tied],
            "median_ms": best.median_ms if isinstance(best, Timing) else None,
            "tflops": tflops,
            # the finalists' re-timing: "best", "default", "torch-cudnn", ... -> a timing, or
            # the reason it has none
            "timings": {name: v if isinstance(v, Timing) else str(v) for name, v in t.items()},
            # the baselines the family's case timed (their names, as in "timings"), and the
            # winner's speed-up over the default and each of them (None: one did not run)
            "baselines": sorted(r.baselines),
            "speedup": {name: speedup(name) for name in ("default", *sorted(r.baselines))},
            "measured": r.measured, "failures": dict(sorted(r.failures.items())),
            "wall_s": r.wall_s, "stored": r.stored or None})
    simulated = args.backend == "simulated"
    if args.json:
        print_json("search", {"mode": "search", "kernel": family.name, "arch": arch,
                              "device": device_name, "backend": args.backend,
                              "timing": timing.to_dict(),
                              "database": shown_location(database),
                              "storage": shown_location(storage), "study_prefix": args.study,
                              "keys": keys})
        return
    out = results_console()
    print_table(out, table)
    from tiledattention import database_location

    reader = ("simulated rows: the runtime never reads them" if simulated
              else "tiledattention.sdpa reads it" if database == database_location()
              else "tiledattention.sdpa reads it once $TILEDATTN_DB or "
                   "tiledattention.use_database() names it")
    out.print(f"schedule database: {shown_location(database)} ({reader})", markup=False)
    out.print(f"study storage: {shown_location(storage)} (every trial; run the same command "
              f"again to resume)", markup=False)


