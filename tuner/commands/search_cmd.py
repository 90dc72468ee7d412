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
import itertools
import json
import os
import re
import subprocess
import sys
from concurrent.futures import as_completed
from pathlib import Path
from typing import NamedTuple

from tiledattention import ARCHITECTURES, TiledAttentionError, families, get_family

from ._report import (add_json_option, count, int_at_least, log_console, nonempty,
                      positive_int, print_json, print_table, results_console, say)

#: The one line ``tiledtune`` prints on a Ctrl-C (``cli.main``), once the search's processes
#: are gone and its unfinished trials given back
INTERRUPTED = ("interrupted; the study keeps every finished trial: run the same command again "
               "to resume")

#: Model presets: name -> (heads_q, heads_kv, head_dim, seqlens); batch = 16384 // seqlen.
PRESETS = {
    "llama-gqa": (32, 8, 128, (1024, 2048, 4096, 8192, 16384)),
    "mha-d64": (32, 32, 64, (1024, 2048, 4096, 8192, 16384)),
    "mha-d128": (16, 16, 128, (1024, 2048, 4096, 8192, 16384)),
    "mha-d256": (8, 8, 256, (1024, 2048, 4096, 8192, 16384)),
}


def _duration(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    seconds = (float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
               if match else 0.0)
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a duration above zero like 90s, 10m or 1h; "
                                         f"got {text!r}")
    return seconds


class ShapeArg(NamedTuple):
    """One ``--shape``: ``heads_kv`` / ``seqlen_k`` are ``None`` where the text left them out
    (then they equal ``heads_q`` / ``seqlen_q``)."""

    text: str
    batch: int
    heads_q: int
    heads_kv: int | None
    seqlen_q: int
    seqlen_k: int | None
    head_dim: int


SHAPE_SYNTAX = "B,H,S,D or B,HQ/HKV,SQ:SK,D"


def _shape(text: str) -> ShapeArg:
    """``B,H,S,D``; ``H`` may be ``HQ/HKV`` (grouped-query: HKV K/V heads) and ``S`` may be
    ``SQ:SK`` (SQ queries against SK keys): ``4,32/8,4096,128``, ``1,16,1:4096,128``."""
    def number(part: str) -> int:
        part = part.strip()
        if not re.fullmatch(r"\d{1,30}", part) or int(part) < 1:
            raise ValueError(part)
        return int(part)

    try:
        b, heads, seqlens, d = text.split(",")
        hq, *hkv = heads.split("/")
        sq, *sk = seqlens.split(":")
        if len(hkv) > 1 or len(sk) > 1:
            raise ValueError(text)
        return ShapeArg(text=text.strip(), batch=number(b), heads_q=number(hq),
                        heads_kv=number(hkv[0]) if hkv else None, seqlen_q=number(sq),
                        seqlen_k=number(sk[0]) if sk else None, head_dim=number(d))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {SHAPE_SYNTAX} (positive integers; HQ/HKV for grouped-query heads, "
            f"SQ:SK for queries against a different number of keys, e.g. 4,32/8,4096,128 or "
            f"1,16,1:4096,128); got {text!r}") from None


def _choices(allowed: dict[str, object]):
    def parse(text: str) -> list:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"expected a comma list of {sorted(allowed)}; got {text!r}")
        return [allowed[v] for v in values]
    return parse


def _arch(text: str) -> str:
    if text not in ARCHITECTURES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(ARCHITECTURES)}; got {text!r}")
    return text


def _problem_fields(text: str) -> dict:
    """``"n=1024,dtype=bf16,causal=yes"`` -> ``{"n": 1024, "dtype": "bf16", "causal": True}``."""
    found = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise argparse.ArgumentTypeError(f"expected FIELD=VALUE,...; got {text!r}")
        if re.fullmatch(r"[+-]?\d+", value):
            found[name] = int(value)
        elif value.lower() in ("yes", "true", "no", "false"):
            found[name] = value.lower() in ("yes", "true")
        else:
            found[name] = value
    return found


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
        "error. Exit status: 0 every key has a schedule; 1 some key found none; 2 bad options, a\n"
        "problem the kernels do not take, or a database that cannot be used.")
    problems = parser.add_argument_group(
        "problems (each --shape or --preset shape, for each --dtype and --causal value)")
    problems.add_argument("--kernel", default="forward", metavar="NAME",
                          help="kernel family to tune (default: forward; known: "
                               + ", ".join(f.name for f in families()) + ")")
    problems.add_argument("--shape", type=_shape, action="append", default=[],
                          metavar="B,HQ/HKV,SQ:SK,D",
                          help="an attention problem: batch, query heads, sequence length, head "
                               "dim, e.g. 4,16,4096,128; '/HKV' gives K/V heads for grouped-query "
                               "attention (4,32/8,4096,128), ':SK' a key length other than the "
                               "query length (1,16,16:8192,128). Repeatable")
    problems.add_argument("--preset", choices=sorted(PRESETS), action="append", default=[],
                          help="model shapes: " + "; ".join(
                              f"{k}: H={v[0]}/{v[1]} D={v[2]} S={v[3][0]}..{v[3][-1]}, B·S=16k"
                              for k, v in PRESETS.items()) + ". Repeatable")
    problems.add_argument("--problem", type=_problem_fields, action="append", default=[],
                          metavar="FIELD=VALUE,...",
                          help="one problem of the kernel family, every field named (e.g. "
                               "batch=1,heads_q=32,heads_kv=8,seqlen_q=1,seqlen_k=32768,"
                               "head_dim=128,dtype=bf16,causal=false). Repeatable")
    problems.add_argument("--dtype", type=_choices({"bf16": "bf16", "fp16": "fp16"}),
                          default=["bf16"], metavar="LIST",
                          help="bf16, fp16 or bf16,fp16 (default bf16)")
    problems.add_argument("--causal", type=_choices({"yes": True, "no": False}),
                          default=[False], metavar="LIST",
                          help="yes (top-left causal mask), no, or yes,no (default no)")
    problems.add_argument("--kv-heads", type=positive_int, default=None, metavar="N",
                          help="deprecated: write --shape B,HQ/HKV,S,D. H_kv of the one --shape "
                               "(refused with several --shape, or one that gives /HKV)")
    problems.add_argument("--seqlen-k", type=positive_int, default=None, metavar="N",
                          help="deprecated: write --shape B,H,SQ:SK,D. S_k of the one --shape "
                               "(refused with several --shape, or one that gives :SK)")
    parser.add_argument("--device", type=_arch, required=True, metavar="ARCH",
                        help="architecture to tune for: " + ", ".join(ARCHITECTURES) + " (a "
                             "local GPU must have it, unless --compile-only or --backend "
                             "simulated)")
    budget = parser.add_argument_group("search budget (per key)")
    budget.add_argument("--trials", type=positive_int, default=60, metavar="N",
                        help="measured candidates per key, >= 1 (default 60)")
    budget.add_argument("--timeout", type=_duration, default=None, metavar="DURATION",
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
    add_json_option(parser, "each key's result (and where it was stored)")


def problems_from(args: argparse.Namespace) -> list:
    """The problems of ``--kernel`` the arguments name (validated by the family's problem
    type; a problem it refuses is a ``ValueError`` naming the flag that gave it)."""
    family = get_family(args.kernel)
    _check_deprecated(args)
    shapes: list[tuple[str, tuple[int, int, int, int, int, int]]] = []
    for shape in args.shape:
        hkv = shape.heads_kv or args.kv_heads or shape.heads_q
        sk = shape.seqlen_k or args.seqlen_k or shape.seqlen_q
        source = f"--shape {shape.text}" + "".join(
            f" {flag} {value}" for flag, value, given in (
                ("--kv-heads", args.kv_heads, shape.heads_kv),
                ("--seqlen-k", args.seqlen_k, shape.seqlen_k)) if value and not given)
        shapes.append((source,
                       (shape.batch, shape.heads_q, hkv, shape.seqlen_q, sk, shape.head_dim)))
    for name in args.preset:
        hq, hkv, d, seqlens = PRESETS[name]
        shapes += [(f"--preset {name}", (max(1, 16384 // s), hq, hkv, s, s, d)) for s in seqlens]
    if not shapes and not args.problem:
        raise ValueError(f"give at least one --shape {SHAPE_SYNTAX}, --preset or --problem")
    fields = [("--problem " + ",".join(f"{k}={v}" for k, v in data.items()), data)
              for data in args.problem]
    for (source, (b, hq, hkv, sq, sk, d)), dtype, causal in itertools.product(
            shapes, args.dtype, args.causal):
        fields.append((source, dict(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq,
                                    seqlen_k=sk, head_dim=d, dtype=dtype, causal=causal)))
    problems = []
    for source, data in fields:
        try:
            problems.append(family.problem_type.from_dict(data))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: not a problem the {family.name} kernel takes: "
                             f"{exc}") from None
    return list(dict.fromkeys(problems))


def _check_deprecated(args: argparse.Namespace) -> None:
    """``--kv-heads`` / ``--seqlen-k`` apply to exactly one ``--shape`` that does not give the
    value itself; anything else is ambiguous and refused."""
    for flag, value, part in (("--kv-heads", args.kv_heads, "heads_kv"),
                              ("--seqlen-k", args.seqlen_k, "seqlen_k")):
        if value is None:
            continue
        syntax = "B,HQ/HKV,S,D" if part == "heads_kv" else "B,H,SQ:SK,D"
        if len(args.shape) != 1:
            raise ValueError(
                f"{flag} {value} needs exactly one --shape (got {len(args.shape)}); it is "
                f"deprecated: give it in each --shape as {syntax}")
        shape = args.shape[0]
        if getattr(shape, part) is not None:
            raise ValueError(f"{flag} {value}: --shape {shape.text} gives it already; drop "
                             f"{flag}")


def _shape_text(shape: ShapeArg, kv_heads: int | None, seqlen_k: int | None) -> str:
    """``--shape`` in the new syntax, with the deprecated flags' values folded in."""
    hkv = shape.heads_kv or kv_heads
    sk = shape.seqlen_k or seqlen_k
    return (f"{shape.batch},{shape.heads_q}{f'/{hkv}' if hkv else ''},"
            f"{shape.seqlen_q}{f':{sk}' if sk else ''},{shape.head_dim}")


def select_device(arch: str, index: int | None = None):
    """The local GPU with ``arch`` (the ``index``-th of them), or a ValueError saying what
    there is."""
    from tiledattention import local_devices

    devices = local_devices()
    matching = [d for d in devices if d.arch == arch]
    if not matching:
        found = ", ".join(f"{d.arch} ({d.name})" for d in devices) or "no CUDA device"
        raise ValueError(f"no local GPU is {arch}; found {found}")
    if index is None:
        return matching[0]
    for d in matching:
        if d.index == index:
            return d
    raise ValueError(f"GPU {index} is not {arch}")


def _db_location(args) -> str:
    """The schedule database: ``--db``; else the user database the runtime reads, except for
    the simulated backend, whose results go to a file of their own unless ``--db`` names one."""
    from tiledattention import database_location, simulated_database_location

    if args.db:
        return args.db
    return simulated_database_location() if args.backend == "simulated" else database_location()


def _storage(args, db: str) -> str:
    """The Optuna study storage: ``--storage``; a server database's own URL; else an SQLite
    file beside the schedule database."""
    if args.storage:
        return args.storage
    if "://" in db and not db.startswith("sqlite"):
        return db
    path = Path(db.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.with_name('tiledtune-studies.sqlite')}"


def run(args: argparse.Namespace) -> int:
    console = log_console()  # progress and warnings; results go to results_console()
    try:
        _check_options(args)
        problems = problems_from(args)
        if args.kv_heads is not None or args.seqlen_k is not None:
            say("search", f"note: --kv-heads and --seqlen-k are deprecated; write --shape "
                          f"{_shape_text(args.shape[0], args.kv_heads, args.seqlen_k)}")
        if args.compile_only:
            return _compile_only(args, problems, console)
        if args.workers > 1:
            return _spawn_workers(args, console)
        return _search(args, problems, console)
    except (ValueError, TiledAttentionError) as exc:
        say("search", exc)
        return 2


def _check_options(args: argparse.Namespace) -> None:
    """What argparse's per-flag types cannot check: flags that depend on each other, and
    ``--space`` (the family's and architecture's named spaces). A ``ValueError`` names the
    flag."""
    import search_spaces

    if args.neighbour_trials is not None and args.neighbour_trials > args.trials:
        raise ValueError(f"--neighbour-trials {args.neighbour_trials} is more than --trials "
                         f"{args.trials}: they are a share of the trials; give at most "
                         f"{args.trials}")
    if args.limit is not None and not args.compile_only:
        raise ValueError(f"--limit {args.limit} applies to --compile-only only; a search "
                         f"measures --trials {args.trials} candidates per key")
    if args.sweep and (not args.compile_only or args.limit is not None):
        raise ValueError("--sweep compiles every candidate with --compile-only; "
                         + ("drop --limit" if args.compile_only else "add --compile-only"))
    if args.workers > 1 and (args.compile_only or args.backend == "simulated"):
        mode = "--compile-only" if args.compile_only else "--backend simulated"
        raise ValueError(f"--workers {args.workers} starts one search per local GPU; "
                         f"{mode} runs in one process"
                         + (" (--jobs sets its parallel compiles)" if args.compile_only else ""))
    try:
        search_spaces.family_space(get_family(args.kernel).name).space(args.device, args.space)
    except (ValueError, TiledAttentionError) as exc:
        if "space must be one of" not in str(exc):
            raise
        raise ValueError(f"--space {args.space}: {exc}") from None


def _spawn_workers(args, console) -> int:
    """One child ``tiledtune search`` per local GPU of the architecture, sharing the study."""
    from tiledattention import local_devices

    devices = [d for d in local_devices() if d.arch == args.device][:args.workers]
    if len(devices) < args.workers:
        raise ValueError(f"--workers {args.workers}: only {len(devices)} local GPU(s) are "
                         f"{args.device}")
    argv = [a for i, a in enumerate(args.argv) if a != "--workers" and
            (i == 0 or args.argv[i - 1] != "--workers") and not a.startswith("--workers=")]
    # with --json each worker prints its own document; they are gathered into one
    stdout = subprocess.PIPE if args.json else None
    children: list[subprocess.Popen] = []
    try:
        for d in devices:  # a session each: a Ctrl-C at the terminal reaches this process only
            children.append(subprocess.Popen(
                [sys.executable, "-m", "tuner.cli", *argv, "--device-index", str(d.index)],
                stdout=stdout, start_new_session=True))
        if not args.json:
            return max(child.wait() for child in children)
        documents = []
        for child in children:
            text = child.communicate()[0]
            try:
                documents.append(json.loads(text))
            except ValueError:
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
    if args.backend == "gpu":
        device = select_device(args.device, args.device_index)
        factory = _GpuFactory(family, device.index)
        arch, device_name = device.arch, device.name
    else:
        factory = functools.partial(SimulatedExecutor, args.device, family=family)
        arch, device_name = args.device, SIMULATED_DEVICE
    db_location = _db_location(args)
    database = open_database(db_location)  # checked (and migrated) before anything is tuned
    storage = _storage(args, db_location)
    if args.backend == "simulated" and not args.db:
        console.print(f"simulated results go to {db_location} (the runtime never reads it); "
                      "--db names another database")
    config = SearchConfig(n_trials=args.trials, timeout_s=args.timeout,
                          patience=args.patience or None, space=args.space, seed=args.seed,
                          neighbour_trials=args.neighbour_trials, study_prefix=args.study,
                          lookahead=4 if args.backend == "gpu" else 1)
    compile_workers = (args.jobs or max(1, min(8, (os.cpu_count() or 2) - 2))
                       if args.backend == "gpu" else 0)
    results = []
    with database as db, IsolatedExecutor(factory) as executor, Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console) as progress:
        task = {"id": None}

        def on_event(kind: str, data: dict) -> None:
            if kind == "trial":
                m = data["measurement"]
                best = data["best_ms"]
                tflops = (family.flops(data["problem"]) / (best * 1e-3) / 1e12
                          if best < float("inf") else 0)
                progress.update(task["id"], completed=data["measured"], status=(
                    f"best {tflops:.0f} TFLOP/s | last: {data['schedule'].describe()} "
                    f"{m.status} | compile queue {data['queued']}"))
            elif kind == "warning":
                console.print(f"[yellow]{data['message']}[/yellow]")

        tuner = Tuner(executor, family=family, arch=arch, device_name=device_name,
                      storage_url=storage, db=db, config=config,
                      compile_workers=compile_workers, backend=args.backend,
                      on_event=on_event)
        # leaving on a Ctrl-C kills the compile processes and the executor's worker at once,
        # with their tileiras compiles
        with tuner:
            for problem in problems:
                task["id"] = progress.add_task(problem.describe(), total=args.trials, status="")
                results.append(tuner.tune(problem))
    _print_results(args, family, results, database=db_location, storage=storage, arch=arch,
                   device_name=device_name)
    return 0 if all(r.best is not None for r in results) else 1


class _GpuFactory:
    """Picklable factory of the GPU executor for the spawned worker."""

    def __init__(self, family, index: int) -> None:
        self.family = family
        self.index = index

    def __call__(self):
        from ..measure import GpuExecutor

        return GpuExecutor(self.family, self.index)


def _hide_password(url: str) -> str:
    """A database location as it may be shown: a password in a URL masked
    (``postgresql://user:***@host/db``), a relative file path made absolute."""
    if "://" not in url:
        return str(Path(url).expanduser().absolute())
    if url.startswith("sqlite:///") and url[len("sqlite:///"):] not in ("", ":memory:"):
        return "sqlite:///" + str(Path(url[len("sqlite:///"):]).expanduser().absolute())
    return re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", url)


def _print_results(args, family, results, *, database: str, storage: str, arch: str,
                   device_name: str) -> None:
    """The search summary on standard output: a row per key (or ``--json``), then the schedule
    database the winners went to and the study storage that holds every trial."""
    from rich.table import Table

    from ..measure import Timing

    keys = []
    table = Table(title=f"tiledtune search: {family.name} on {device_name} ({arch})")
    for col in ("key", "best schedule", "TFLOP/s", "vs default", "vs cuDNN", "vs flash",
                "measured", "failed", "wall", "stored"):
        table.add_column(col)
    for r in results:
        t = r.timings
        best = t.get("best")

        def ratio(name, t=t, best=best):
            other = t.get(name)
            if isinstance(best, Timing) and isinstance(other, Timing):
                return f"{other.median_ms / best.median_ms:.2f}x"
            return "-" if other is None else str(other)[:20]

        tflops = (family.flops(r.problem) / (best.median_ms * 1e-3) / 1e12
                  if isinstance(best, Timing) else None)
        failed = ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items())) or "0"
        table.add_row(r.problem.describe(), r.best.describe() if r.best else "none",
                      "-" if tflops is None else f"{tflops:.0f}",
                      ratio("default"), ratio("torch-cudnn"), ratio("torch-flash"),
                      str(r.measured), failed, f"{r.wall_s:.0f}s", r.stored or "-")
        keys.append({
            "key": r.problem.describe(), "problem": r.problem,
            "schedule": r.best, "schedule_text": r.best.describe() if r.best else None,
            "median_ms": best.median_ms if isinstance(best, Timing) else None,
            "tflops": tflops,
            # the finalists' re-timing: "best", "default", "torch-cudnn", ... -> a timing, or
            # the reason it has none
            "timings": {name: v if isinstance(v, Timing) else str(v) for name, v in t.items()},
            "measured": r.measured, "failures": dict(sorted(r.failures.items())),
            "wall_s": r.wall_s, "stored": r.stored or None})
    simulated = args.backend == "simulated"
    if args.json:
        print_json("search", {"mode": "search", "kernel": family.name, "arch": arch,
                              "device": device_name, "backend": args.backend,
                              "database": _hide_password(database),
                              "storage": _hide_password(storage), "study_prefix": args.study,
                              "keys": keys})
        return
    out = results_console()
    print_table(out, table)
    from tiledattention import database_location

    reader = ("simulated rows: the runtime never reads them" if simulated
              else "tiledattention.sdpa reads it" if database == database_location()
              else "tiledattention.sdpa reads it once $TILEDATTN_DB or "
                   "tiledattention.use_database() names it")
    out.print(f"schedule database: {_hide_password(database)} ({reader})", markup=False)
    out.print(f"study storage: {_hide_password(storage)} (every trial; run the same command "
              f"again to resume)", markup=False)


def _compile_only(args, problems, console) -> int:
    """Compile candidates for ``--device`` on this machine; failures go into each key's study
    as failed trials, so a later GPU search skips them without spending GPU time.

    Per key ``--limit`` (default ``--trials``) candidates, the same ones for the same command
    (``compile_sample``), or every one with ``--sweep``; candidates the study already settled
    are skipped, so an interrupted run resumes (compiled ones hit cuTile's disk cache). The
    compile processes are a ``CompilePool``: a Ctrl-C kills them with their tileiras at once."""
    import optuna
    from rich.progress import Progress
    from rich.table import Table

    import search_spaces

    from ..measure import CompilePool
    from ..search import (SearchConfig, compile_job, compile_sample, open_storage, settled,
                          study_name)

    family = get_family(args.kernel)
    spaces = search_spaces.family_space(family.name)
    storage_url = _storage(args, _db_location(args))
    config = SearchConfig(study_prefix=args.study)
    storage = open_storage(storage_url, heartbeat_s=config.heartbeat_s, grace_s=config.grace_s)
    jobs = args.jobs or max(1, os.cpu_count() or 1)
    table = Table(title=f"compile-only for {args.device}")
    for col in ("key", "candidates", "compiled", "failed", "median s", "smem KiB (min..max)"):
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
            seconds, shared, error = outcome
            if error is None:
                ok.append((seconds, shared))
                return
            failed.append(schedule)
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.FAIL, params=space.params(schedule),
                distributions=distributions,
                user_attrs={"schedule_key": schedule.key, "status": "compile-error",
                            "schedule": schedule.describe(), "reason": error[:1000]}))
            console.print(f"{schedule.describe()}: {error[:200]}", style="yellow", markup=False)

        # leaving the block on a Ctrl-C kills the compile processes and their tileiras
        with CompilePool(jobs) as pool, Progress(console=console) as bar:
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
        shared = [b for _, b in ok if b is not None]
        table.add_row(problem.describe(), f"{len(candidates)} of {feasible_count}",
                      str(len(ok)), str(len(failed)),
                      f"{times[len(times) // 2]:.1f}" if times else "-",
                      f"{min(shared) // 1024}..{max(shared) // 1024}" if shared else "-")
        keys.append({"key": problem.describe(), "problem": problem, "candidates": len(candidates),
                     "feasible": feasible_count, "settled_before": len(candidates) - len(todo),
                     "compiled": len(ok), "failed": len(failed),
                     "median_compile_s": times[len(times) // 2] if times else None,
                     "shared_memory_bytes": [min(shared), max(shared)] if shared else None})
    _print_compile_only(args, table, keys, storage_url, failures_total)
    return 0


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
                              "arch": args.device, "storage": _hide_password(storage_url),
                              "study_prefix": args.study, "keys": keys})
        return
    out = results_console()
    print_table(out, table)
    # the storage is named either way: a GPU search with the same --db or --storage reads it
    outcome = (f"{failures} compile failure(s) recorded as infeasible for {args.device}; a "
               f"search of these keys skips them" if failures else "nothing failed")
    out.print(f"study storage: {_hide_password(storage_url)} ({outcome})", markup=False)
