"""``tiledtune bench``: tiledattention against PyTorch's attention backends over a model-like grid.

For every grid point each contender's output is first checked against a float32 reference, then
timed (``tuner.bench``); results go to ``bench.csv``, ``run.json``, ``summary.md`` and PNG plots in
``--out``, and a rich table to the terminal. ``--report-only CSV`` measures nothing and re-renders
the summary and plots of an earlier run. ``--kernel forward`` (the default) times the prefill
family over a grid of fixed B·S and H·D in TFLOP/s; ``--kernel decode`` times decode shapes
(``S_q`` 1 or a few draft tokens against long K/V caches) in GB/s and as a share of a
device-to-device copy measured in the same run (``tuner.bench._decode_grid``);
``--kernel backward`` times the backward pass alone and a forward + backward step over the
forward grid's shape of problems (``tuner.bench._backward_grid``), in TFLOP/s with the backward
counted as 2.5x the forward's FLOPs.

Results (the tables, the files written, or the ``--json`` document) go to standard output;
progress, warnings and errors to standard error.

Exit status: 0 success; 1 no CUDA device, or a tiledattention result failed the accuracy check;
2 bad options or an unreadable CSV.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
from pathlib import Path
from typing import Any, Sequence

from ..bench import (BACKWARD_CONTENDERS, BACKWARD_INTERLEAVE, CONTENDERS, DECODE_CONTENDERS,
                     DECODE_INTERLEAVE, QUICK_BACKWARD_INTERLEAVE, QUICK_DECODE_INTERLEAVE,
                     QUICK_TIMING, TIMING_DEFAULTS, BenchConfigError, BenchResult, BenchSettings,
                     PlotsUnavailable, RunInfo, backward_rich_tables, build_backward_grid,
                     build_decode_grid, build_grid, by_point, contenders_of, copy_gbps,
                     decode_rich_tables, is_backward, is_decode, load_results,
                     make_backward_contenders, make_decode_contenders, matmul_tflops,
                     measure_backward_point, parse_positive_float, parse_positive_int,
                     ratio_table, run_grid, write_backward_plots, write_backward_summary,
                     write_csv, write_decode_plots, write_decode_summary, write_plots,
                     write_run_info, write_summary)
from ._report import add_json_option, log_console, print_json, print_table, results_console

__all__ = ["configure", "run", "KERNELS", "grid_from_args", "settings_from_args",
           "write_reports", "results_table", "ratio_rich_table"]

CSV_NAME = "bench.csv"
SUMMARY_NAME = "summary.md"
RUN_INFO_NAME = "run.json"
#: Kernel families with a benchmark grid (``--kernel``).
KERNELS = ("forward", "decode", "backward")
#: Grid options of some families' grids only (attribute, flag): the forward grid's (which the
#: backward grid shares) and the decode grid's.
_FORWARD_ONLY = (("seqlens", "--seqlens"), ("causal", "--causal"), ("tokens", "--tokens"),
                 ("hidden", "--hidden"), ("no_matmul", "--no-matmul"))
_DECODE_ONLY = (("batch", "--batch"), ("seqlens_q", "--seqlens-q"),
                ("seqlens_k", "--seqlens-k"), ("masks", "--masks"), ("heads", "--heads"))
#: Per kernel: the options it refuses, and what to call the grid they belong to.
_REFUSED = {
    "forward": (_DECODE_ONLY, "decode grid (--kernel decode)"),
    "backward": (_DECODE_ONLY, "decode grid (--kernel decode)"),
    "decode": (_FORWARD_ONLY, "forward grid (--kernel forward; the backward grid takes it "
                              "too)"),
}


def _kernel(text: str) -> str:
    if text not in KERNELS:
        raise argparse.ArgumentTypeError(
            f"tiledtune bench has grids for the {', '.join(KERNELS)} families only; got "
            f"{text!r} (other kernel families bring their own benchmark grids)")
    return text


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``tiledtune bench``'s options to ``parser`` (the subcommand's parser)."""
    parser.description = (
        "Benchmark tiledattention against PyTorch's SDPA backends (and eager attention) over a "
        "grid: --kernel forward (default) with fixed B·S (--tokens) and H·D (--hidden), "
        "--kernel decode over decode shapes, --kernel backward (the backward pass and a "
        "forward + backward step) over the forward's kind of grid; writes bench.csv, run.json, "
        "summary.md and PNG plots into --out.")
    parser.add_argument("--kernel", type=_kernel, default="forward", metavar="NAME",
                        help="kernel family to benchmark: forward (default), decode or "
                             "backward")
    grid = parser.add_argument_group("grid (every kernel)")
    grid.add_argument("--head-dims", metavar="LIST",
                      help="head dims D (default forward and backward 64,128,256; decode 128)")
    grid.add_argument("--dtypes", metavar="LIST",
                      help="bf16,fp16 (default forward and backward both; decode bf16)")
    grid.add_argument("--contenders", metavar="LIST",
                      help=f"forward: subset of {','.join(CONTENDERS)}; decode: subset of "
                           f"{','.join(DECODE_CONTENDERS)}; backward: subset of "
                           f"{','.join(BACKWARD_CONTENDERS)} (default all)")
    grid.add_argument("--quick", action="store_true",
                      help="small grid (forward and backward: D 64,128; S 1024,4096; bf16. "
                           "decode: 4 points) and looser timing; explicit options still win")
    fwd = parser.add_argument_group("forward and backward grids (--kernel forward, backward)")
    fwd.add_argument("--seqlens", metavar="LIST",
                     help="sequence lengths S (default forward 512,1024,...,16384; backward "
                          "1024,4096,16384); must divide --tokens")
    fwd.add_argument("--causal", metavar="LIST", help="yes,no (default both)")
    fwd.add_argument("--tokens", metavar="N", help="B·S, fixed over the grid (default 16384)")
    fwd.add_argument("--hidden", metavar="N", help="H·D, fixed over the grid (default 2048)")
    dec = parser.add_argument_group(
        "decode grid (--kernel decode): S_q 1 at B 1 over S_k 4096..131072, at B 8,32 over "
        "S_k 2048,8192, and S_q 16 at B 8, S_k 8192 bottom-right; each option below replaces "
        "its axis in every one of these groups")
    dec.add_argument("--batch", metavar="LIST", help="batch sizes B")
    dec.add_argument("--seqlens-q", metavar="LIST", help="query lengths S_q")
    dec.add_argument("--seqlens-k", metavar="LIST", help="K/V lengths S_k")
    dec.add_argument("--masks", metavar="LIST", help="none,top-left,bottom-right")
    dec.add_argument("--heads", metavar="LIST", help="H_q/H_kv pairs (default 32/8)")
    timing = parser.add_argument_group("timing")
    timing.add_argument("--samples", metavar="N",
                        help=f"most samples per timing (default {TIMING_DEFAULTS['max_samples']})")
    timing.add_argument("--min-samples", metavar="N",
                        help=f"fewest samples (default {TIMING_DEFAULTS['min_samples']})")
    timing.add_argument("--rel-precision", metavar="X",
                        help="stop once the median's 95%% CI half-width is within X of it "
                             f"(default {TIMING_DEFAULTS['rel_precision']})")
    timing.add_argument("--max-seconds", metavar="SEC",
                        help=f"time cap per timing (default {TIMING_DEFAULTS['max_seconds']})")
    timing.add_argument("--warmup-ms", metavar="MS",
                        help=f"warm-up per timing (default {TIMING_DEFAULTS['warmup_ms']})")
    timing.add_argument("--interleave", metavar="ROUNDS",
                        help="time the contenders of a point together, one sample each per "
                             "round in rotating order, for ROUNDS rounds (0: each on its own, "
                             "until --rel-precision; default forward 0, decode and backward "
                             f"{DECODE_INTERLEAVE}, {QUICK_DECODE_INTERLEAVE} with --quick)")
    timing.add_argument("--mem-fraction", metavar="X",
                        help="share of free GPU memory S×S contenders (eager, torch-math) may "
                             "use; beyond it they are skipped (default 0.4)")
    parser.add_argument("--device", metavar="INDEX", help="CUDA device index (default 0)")
    parser.add_argument("--seed", metavar="N", help="input seed (default 0)")
    output = parser.add_argument_group("output")
    output.add_argument("--out", metavar="DIR",
                        help="output folder (default bench-results/, or the CSV's folder with "
                             "--report-only)")
    output.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    output.add_argument("--no-matmul", action="store_true",
                        help="forward, backward: skip the bf16 matrix-product rate measured "
                             "before and after the grid (the summary's ceiling)")
    output.add_argument("--report-only", metavar="CSV",
                        help="measure nothing: re-render summary.md and plots from a bench CSV")
    add_json_option(output, "every result, the run's information and the files written")
    return parser


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """Validate the timing options (``BenchConfigError`` names the flag)."""
    quick = bool(getattr(args, "quick", False))
    defaults = QUICK_TIMING if quick else TIMING_DEFAULTS

    def pick(attr: str, flag: str, parse, key: str):
        value = getattr(args, attr, None)
        return defaults[key] if value is None else parse(flag, value)

    settings = BenchSettings(
        warmup_ms=pick("warmup_ms", "--warmup-ms", parse_positive_float, "warmup_ms"),
        min_samples=pick("min_samples", "--min-samples", parse_positive_int, "min_samples"),
        max_samples=pick("samples", "--samples", parse_positive_int, "max_samples"),
        max_seconds=pick("max_seconds", "--max-seconds", parse_positive_float, "max_seconds"),
        rel_precision=pick("rel_precision", "--rel-precision", parse_positive_float,
                           "rel_precision"),
        mem_fraction=(0.4 if getattr(args, "mem_fraction", None) is None
                      else parse_positive_float("--mem-fraction", args.mem_fraction)),
        device=(0 if getattr(args, "device", None) is None
                else _non_negative_int("--device", args.device)),
        seed=(0 if getattr(args, "seed", None) is None
              else _non_negative_int("--seed", args.seed)),
        interleave=(_default_interleave(args) if getattr(args, "interleave", None) is None
                    else _non_negative_int("--interleave", args.interleave)),
    )
    if settings.min_samples > settings.max_samples:
        raise BenchConfigError(f"--min-samples ({settings.min_samples}) must not exceed "
                               f"--samples ({settings.max_samples})")
    if not 0 < settings.mem_fraction <= 1:
        raise BenchConfigError(f"--mem-fraction must be in (0, 1]; got {settings.mem_fraction}")
    if not settings.rel_precision < 1:
        raise BenchConfigError(f"--rel-precision must be below 1 (a fraction of the median); "
                               f"got {settings.rel_precision}")
    return settings


def _default_interleave(args: argparse.Namespace) -> int:
    kernel = getattr(args, "kernel", "forward")
    quick = getattr(args, "quick", False)
    if kernel == "decode":
        return QUICK_DECODE_INTERLEAVE if quick else DECODE_INTERLEAVE
    if kernel == "backward":
        return QUICK_BACKWARD_INTERLEAVE if quick else BACKWARD_INTERLEAVE
    return 0


def _non_negative_int(flag: str, text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise BenchConfigError(f"{flag} must be a non-negative integer; got {text!r}") from None
    if value < 0:
        raise BenchConfigError(f"{flag} must be a non-negative integer; got {text!r}")
    return value


def grid_from_args(args: argparse.Namespace):
    """The ``BenchGrid`` (``--kernel forward``), ``DecodeGrid`` (``--kernel decode``) or
    ``BackwardGrid`` (``--kernel backward``) the options describe; an option of another
    kernel's grid is refused, naming it."""
    kernel = getattr(args, "kernel", "forward")
    refused, owner = _REFUSED[kernel]
    for attr, flag in refused:
        if getattr(args, attr, None) not in (None, False):
            raise BenchConfigError(f"{flag} belongs to the {owner}; it does nothing with "
                                   f"--kernel {kernel}")
    if kernel == "backward":
        return _checked(build_backward_grid(tokens=args.tokens, hidden=args.hidden,
                                            head_dims=args.head_dims, seqlens=args.seqlens,
                                            dtypes=args.dtypes, causal=args.causal,
                                            contenders=args.contenders, quick=bool(args.quick)))
    if kernel == "decode":
        return build_decode_grid(batches=args.batch, seqlens_q=args.seqlens_q,
                                 seqlens_k=args.seqlens_k, masks=args.masks, heads=args.heads,
                                 head_dims=args.head_dims, dtypes=args.dtypes,
                                 contenders=args.contenders, quick=bool(args.quick))
    return _checked(build_grid(tokens=args.tokens, hidden=args.hidden, head_dims=args.head_dims,
                               seqlens=args.seqlens, dtypes=args.dtypes, causal=args.causal,
                               contenders=args.contenders, quick=bool(args.quick)))


def _checked(grid):
    """``grid`` once each of its points is a problem the kernels take (the decode grid checks
    its own); else a ``BenchConfigError`` naming the flags that make the points."""
    from tiledattention import UnsupportedProblemError

    for point in grid.points():
        try:
            point.problem
        except UnsupportedProblemError as exc:
            raise BenchConfigError(
                f"--tokens/--hidden/--seqlens/--head-dims: B={point.batch} H={point.heads} "
                f"S={point.seqlen} D={point.head_dim} is not a problem the kernels take: "
                f"{exc}") from None
    return grid


def _console():
    """Progress, warnings and errors (standard error); results go to ``results_console()``."""
    return log_console()


def _now() -> str:
    """Local time with its UTC offset, to the second (the report's date)."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _command_line(args: argparse.Namespace) -> str:
    """The command as the user gave it (``tuner.cli.main`` keeps its argv, also when called
    from Python rather than through the ``tiledtune`` script)."""
    argv = getattr(args, "argv", None)
    return "tiledtune " + shlex.join(argv) if argv is not None else ""


def write_reports(results: Sequence[BenchResult], out_dir: Path, info: RunInfo, *,
                  plots: bool, console: Any) -> list[Path]:
    """summary.md and (unless ``plots`` is false or matplotlib is missing) the PNG plots, of
    the forward, the decode or the backward grid as the rows say."""
    decode, backward = is_decode(results), is_backward(results)
    write = (write_decode_summary if decode else write_backward_summary if backward
             else write_summary)
    written = [write(results, info, out_dir / SUMMARY_NAME)]
    if plots:
        try:
            if decode:
                pngs, messages = write_decode_plots(results, out_dir, info.copy_gbps)
            elif backward:
                pngs, messages = write_backward_plots(results, out_dir)
            else:
                pngs, messages = write_plots(results, out_dir)
        except PlotsUnavailable as exc:
            console.print(f"[yellow]plots skipped:[/] {exc}", soft_wrap=True)
        else:
            written += pngs
            for message in messages:
                console.print(f"[yellow]{message}[/]", soft_wrap=True)
    return written


def results_table(results: Sequence[BenchResult]):
    """A rich table: a row per point, TFLOP/s (or the status) per contender."""
    from rich.table import Table

    contenders = contenders_of(results)
    table = Table(title="TFLOP/s (tiledtune bench)", show_lines=False)
    for column in ("dtype", "D", "mask", "S", "B×H"):
        table.add_column(column, justify="right" if column in ("D", "S") else "left")
    for name in contenders:
        table.add_column(name, justify="right")
    for key, row in sorted(by_point(results).items()):
        first = next(iter(row.values()))
        cells = [key[0], str(key[1]), first.mask, str(key[3]), f"{first.batch}×{first.heads}"]
        for name in contenders:
            r = row.get(name)
            if r is None:
                cells.append("")
            elif r.status == "ok":
                cells.append(f"{r.tflops:.1f}")
            else:
                style = "red" if r.status == "wrong" else "dim"
                cells.append(f"[{style}]{r.status}[/]")
        table.add_row(*cells)
    return table


def _print_results(results: Sequence[BenchResult], info: RunInfo, written: Sequence[Path],
                   args: argparse.Namespace) -> None:
    """The results on standard output: the rich tables and the files written, or with
    ``--json`` one document ``{"kernel", "info", "written", "results"}`` (``results``: every
    ``BenchResult`` as a dict, the CSV's columns)."""
    if getattr(args, "json", False):
        kernel = ("decode" if is_decode(results) else "backward" if is_backward(results)
                  else "forward")
        print_json("bench", {"kernel": kernel, "info": info,
                             "written": [str(path) for path in written], "results": results})
        return
    console = results_console()
    if is_decode(results) or is_backward(results):
        tables = (decode_rich_tables(results, info.copy_gbps) if is_decode(results)
                  else backward_rich_tables(results))
    else:
        ratios = ratio_rich_table(results)
        tables = [results_table(results)] + ([] if ratios is None else [ratios])
    for table in tables:
        print_table(console, table)
    for path in written:
        console.print(f"wrote {path}", markup=False)


def ratio_rich_table(results: Sequence[BenchResult]):
    from rich.table import Table

    ratios = ratio_table(results)
    if not ratios:
        return None
    others = list(next(iter(ratios.values())))
    table = Table(title="geomean tiledattention ÷ contender (> 1: tiledattention faster)")
    table.add_column("D", justify="right")
    table.add_column("mask")
    for name in others:
        table.add_column(name, justify="right")
    for (d, causal), per in ratios.items():
        table.add_row(str(d), "causal" if causal else "full",
                      *("—" if per.get(n) is None else f"{per[n]:.2f}" for n in others))
    return table


def run(args: argparse.Namespace) -> int:
    """Run ``tiledtune bench``; 0 on success, 2 for bad options, 1 when there is no GPU or
    tiledattention produced a wrong result."""
    console = _console()
    try:
        if args.report_only:
            return _report_only(args, console)
        grid = grid_from_args(args)
        settings = settings_from_args(args)
    except (BenchConfigError, ValueError) as exc:
        console.print(f"[red]tiledtune bench: error:[/] {exc}", soft_wrap=True)
        return 2

    import torch

    if not torch.cuda.is_available():
        console.print("[red]tiledtune bench: error:[/] no CUDA device is visible; the benchmark "
                      "needs one (re-render an old run with --report-only CSV)", soft_wrap=True)
        return 1
    if settings.device >= torch.cuda.device_count():
        console.print(f"[red]tiledtune bench: error:[/] --device {settings.device} does not "
                      f"exist; this machine has {torch.cuda.device_count()} CUDA device(s)",
                      soft_wrap=True)
        return 2
    torch.cuda.set_device(settings.device)
    out_dir = Path(args.out or "bench-results")
    decode = args.kernel == "decode"
    backward = args.kernel == "backward"
    points = grid.points()
    console.print(f"tiledtune bench: {len(points)} points × {len(grid.contenders)} contenders "
                  f"on {torch.cuda.get_device_name(settings.device)} → {out_dir}/",
                  soft_wrap=True)

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    # the ceiling the summary reads results against, measured before and after the grid
    ceiling = (lambda: copy_gbps(settings)) if decode else (lambda: matmul_tflops(settings))
    measure_ceiling = decode or not args.no_matmul
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                  transient=False) as progress:
        ceilings = [ceiling()] if measure_ceiling else []
        table, measure = ((make_backward_contenders(), measure_backward_point) if backward
                          else (make_decode_contenders(), None) if decode else (None, None))
        results = run_grid(grid, settings, progress=progress, contenders=table, measure=measure)
        if measure_ceiling:
            ceilings.append(ceiling())

    info = RunInfo(command=_command_line(args), date=_now(),
                   matmul_tflops=() if decode else tuple(ceilings),
                   copy_gbps=tuple(ceilings) if decode else ())
    csv_path = write_csv(results, out_dir / CSV_NAME)
    info_path = write_run_info(info, out_dir / RUN_INFO_NAME)
    written = [csv_path, info_path] + write_reports(results, out_dir, info,
                                                    plots=not args.no_plots, console=console)
    _print_results(results, info, written, args)
    wrong = [r for r in results if r.status == "wrong" and r.contender.startswith("tiledattention")]
    if wrong:
        console.print(f"[red]{len(wrong)} tiledattention result(s) failed the accuracy check; "
                      f"see {out_dir / SUMMARY_NAME}[/]", soft_wrap=True)
        return 1
    return 0


def _report_only(args: argparse.Namespace, console: Any) -> int:
    csv_path = Path(args.report_only)
    results = load_results(csv_path)  # ValueError -> exit 2 with the message
    if not results:
        raise ValueError(f"--report-only: {csv_path} holds no results")
    out_dir = Path(args.out) if args.out else csv_path.parent
    saved = csv_path.parent / RUN_INFO_NAME  # the run's ceilings, when they were measured
    run_info = RunInfo.from_json(saved.read_text()) if saved.is_file() else None
    info = RunInfo(command=_command_line(args) + f" (re-rendered from {csv_path})",
                   date=_now(),
                   matmul_tflops=run_info.matmul_tflops if run_info else (),
                   copy_gbps=run_info.copy_gbps if run_info else ())
    written = write_reports(results, out_dir, info, plots=not args.no_plots, console=console)
    _print_results(results, info, written, args)
    return 0
