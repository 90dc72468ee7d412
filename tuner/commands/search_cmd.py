"""``tiledtune search``: tune a kernel family's schedules for problems and store the winners.

    tiledtune search --device sm_90 --shape 4,16,4096,128 --dtype bf16 --causal yes
    tiledtune search --compile-only --device sm_121 --shape 4,16,4096,128 --limit 8
    tiledtune search --kernel NAME --device sm_90 --problem field=value,field=value

``--shape`` / ``--preset`` (with ``--kv-heads``, ``--seqlen-k``, ``--dtype``, ``--causal``) build
attention problems (fields batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, causal)
for any family whose problem has those fields; ``--problem`` names every field of any family's
problem directly.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import random
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from tiledattention import ARCHITECTURES, TiledAttentionError, families, get_family

from ._report import count, say

#: Model presets: name -> (heads_q, heads_kv, head_dim, seqlens); batch = 16384 // seqlen.
PRESETS = {
    "llama-gqa": (32, 8, 128, (1024, 2048, 4096, 8192, 16384)),
    "mha-d64": (32, 32, 64, (1024, 2048, 4096, 8192, 16384)),
    "mha-d128": (16, 16, 128, (1024, 2048, 4096, 8192, 16384)),
    "mha-d256": (8, 8, 256, (1024, 2048, 4096, 8192, 16384)),
}


def _duration(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a duration like 90s, 10m or 1h; got {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def _shape(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected B,H,S,D (positive ints); got {text!r}")
    return tuple(int(p) for p in parts)


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
    parser.add_argument("--kernel", default="forward", metavar="NAME",
                        help="kernel family to tune (default: forward; known: "
                             + ", ".join(f.name for f in families()) + ")")
    parser.add_argument("--problem", type=_problem_fields, action="append", default=[],
                        metavar="FIELD=VALUE,...",
                        help="one problem of the kernel family, every field named")
    parser.add_argument("--device", type=_arch, required=True,
                        help="architecture to tune for, e.g. sm_90 (a local GPU must have it, "
                             "unless --compile-only)")
    parser.add_argument("--shape", type=_shape, action="append", default=[], metavar="B,H,S,D")
    parser.add_argument("--preset", choices=sorted(PRESETS), action="append", default=[],
                        help="model shapes: " + "; ".join(
                            f"{k}: H={v[0]}/{v[1]} D={v[2]} S={v[3][0]}..{v[3][-1]}, B·S=16k"
                            for k, v in PRESETS.items()))
    parser.add_argument("--kv-heads", type=int, default=None, help="H_kv for --shape (GQA/MQA)")
    parser.add_argument("--seqlen-k", type=int, default=None, help="S_k for --shape (default S)")
    parser.add_argument("--dtype", type=_choices({"bf16": "bf16", "fp16": "fp16"}),
                        default=["bf16"])
    parser.add_argument("--causal", type=_choices({"yes": True, "no": False}), default=[False])
    parser.add_argument("--trials", type=int, default=60, help="measured candidates per key")
    parser.add_argument("--timeout", type=_duration, default=None, help="per key, e.g. 10m")
    parser.add_argument("--patience", type=int, default=30,
                        help="stop a key after this many candidates without improvement (0: never)")
    parser.add_argument("--neighbour-trials", type=count, default=None, metavar="N",
                        help="of --trials, candidates one dimension away from the best so far "
                             "(hill climbing after the seeds; default: a third)")
    parser.add_argument("--space", default="full", help="named search space (full, compact)")
    parser.add_argument("--db", default=None, help="schedule database (path or SQLAlchemy URL; "
                                                    "default: $TILEDATTN_DB or the user cache)")
    parser.add_argument("--storage", default=None,
                        help="Optuna storage URL (default: an SQLite file beside --db); a "
                             "postgresql:// URL lets workers on many hosts share one study")
    parser.add_argument("--study", default="tiledtune", help="study name prefix")
    parser.add_argument("--workers", type=int, default=1, help="one worker per local GPU")
    parser.add_argument("--device-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the space for --device on the CPU; record failures")
    parser.add_argument("--limit", type=int, default=None,
                        help="--compile-only: compile a seeded sample of this many candidates")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile processes")
    parser.add_argument("--backend", choices=["gpu", "simulated"], default="gpu",
                        help="simulated: an analytic GPU model (for trying the tool and tests)")
    parser.add_argument("--seed", type=int, default=0)


def problems_from(args: argparse.Namespace) -> list:
    """The problems of ``--kernel`` the arguments name (validated by the family's problem
    type)."""
    family = get_family(args.kernel)
    shapes: list[tuple[int, int, int, int, int, int]] = []
    for b, h, s, d in args.shape:
        shapes.append((b, h, args.kv_heads or h, s, args.seqlen_k or s, d))
    for name in args.preset:
        hq, hkv, d, seqlens = PRESETS[name]
        shapes += [(max(1, 16384 // s), hq, hkv, s, s, d) for s in seqlens]
    if not shapes and not args.problem:
        raise ValueError("give at least one --shape B,H,S,D, --preset or --problem")
    fields = list(args.problem)
    for (b, hq, hkv, sq, sk, d), dtype, causal in itertools.product(shapes, args.dtype,
                                                                     args.causal):
        fields.append(dict(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk,
                           head_dim=d, dtype=dtype, causal=causal))
    problems = []
    for data in fields:
        try:
            problems.append(family.problem_type.from_dict(data))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a {family.name} problem: {data}: {exc}") from None
    return list(dict.fromkeys(problems))


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
    from rich.console import Console

    console = Console(stderr=True)
    try:
        problems = problems_from(args)
        if args.trials < 1:
            raise ValueError(f"--trials must be >= 1; got {args.trials}")
        if args.compile_only:
            return _compile_only(args, problems, console)
        if args.workers > 1:
            return _spawn_workers(args, console)
        return _search(args, problems, console)
    except (ValueError, TiledAttentionError) as exc:
        say("search", exc)
        return 2


def _spawn_workers(args, console) -> int:
    """One child ``tiledtune search`` per local GPU of the architecture, sharing the study."""
    from tiledattention import local_devices

    devices = [d for d in local_devices() if d.arch == args.device][:args.workers]
    if len(devices) < args.workers:
        raise ValueError(f"--workers {args.workers}: only {len(devices)} local GPU(s) are "
                         f"{args.device}")
    argv = [a for i, a in enumerate(args.argv) if a != "--workers" and
            (i == 0 or args.argv[i - 1] != "--workers") and not a.startswith("--workers=")]
    children = [subprocess.Popen([sys.executable, "-m", "tuner.cli", *argv, "--device-index",
                                  str(d.index)]) for d in devices]
    return max(child.wait() for child in children)


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
        try:
            for problem in problems:
                task["id"] = progress.add_task(problem.describe(), total=args.trials, status="")
                results.append(tuner.tune(problem))
        finally:
            tuner.close()
    _print_results(family, results, console)
    return 0 if all(r.best is not None for r in results) else 1


class _GpuFactory:
    """Picklable factory of the GPU executor for the spawned worker."""

    def __init__(self, family, index: int) -> None:
        self.family = family
        self.index = index

    def __call__(self):
        from ..measure import GpuExecutor

        return GpuExecutor(self.family, self.index)


def _print_results(family, results, console) -> None:
    from rich.table import Table

    from ..measure import Timing

    table = Table(title="tiledtune search")
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

        tflops = (f"{family.flops(r.problem) / (best.median_ms * 1e-3) / 1e12:.0f}"
                  if isinstance(best, Timing) else "-")
        failed = ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items())) or "0"
        table.add_row(r.problem.describe(), r.best.describe() if r.best else "none", tflops,
                      ratio("default"), ratio("torch-cudnn"), ratio("torch-flash"),
                      str(r.measured), failed, f"{r.wall_s:.0f}s", r.stored or "-")
    console.print(table)


def _compile_only(args, problems, console) -> int:
    """Compile candidates for ``--device`` on this machine; failures go into each key's study
    as failed trials, so a later GPU search skips them without spending GPU time."""
    import optuna
    from rich.progress import Progress
    from rich.table import Table

    import search_spaces

    from ..search import SearchConfig, compile_job, open_storage, study_name

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
    for problem in problems:
        space = spaces.restrict(spaces.space(args.device, args.space), problem)
        candidates = list({s.key: s for s in (family.normalise(problem, s)
                                              for s in space.feasible(problem))}.values())
        if args.limit is not None and args.limit < len(candidates):
            candidates = random.Random(args.seed).sample(candidates, args.limit)
        study = optuna.create_study(study_name=study_name(args.study, family, args.device,
                                                          problem),
                                    storage=storage, direction="minimize", load_if_exists=True)
        distributions = {n: optuna.distributions.CategoricalDistribution(list(v))
                         for n, v in space.choices.items()}
        ok, failed = [], []
        with ProcessPoolExecutor(max_workers=jobs) as pool, Progress(console=console) as bar:
            task = bar.add_task(problem.describe(), total=len(candidates))
            futures = {pool.submit(compile_job, family, problem, s, args.device): s
                       for s in candidates}
            for future in as_completed(futures):
                schedule = futures[future]
                seconds, shared, error = future.result()
                if error is None:
                    ok.append((seconds, shared))
                else:
                    failed.append(schedule)
                    study.add_trial(optuna.trial.create_trial(
                        state=optuna.trial.TrialState.FAIL, params=space.params(schedule),
                        distributions=distributions,
                        user_attrs={"schedule_key": schedule.key, "status": "compile-error",
                                    "schedule": schedule.describe(), "reason": error[:1000]}))
                    console.print(f"[yellow]{schedule.describe()}: {error[:200]}[/yellow]")
                bar.advance(task)
        failures_total += len(failed)
        times = sorted(s for s, _ in ok)
        shared = [b for _, b in ok if b is not None]
        table.add_row(problem.describe(), str(len(candidates)), str(len(ok)), str(len(failed)),
                      f"{times[len(times) // 2]:.1f}" if times else "-",
                      f"{min(shared) // 1024}..{max(shared) // 1024}" if shared else "-")
    console.print(table)
    console.print(f"failures recorded as infeasible for {args.device} in {storage_url}")
    return 0
