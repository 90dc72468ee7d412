"""``tiledtune bench``: tiledattention against PyTorch's attention backends over a grid of a
kernel family's problems (``--kernel``: forward, decode or backward; ``tuner.bench.PRESETS``),
or over exactly the problems named with ``--problem FIELD=VALUE,...`` instead of the grid;
``--preset variants`` benches model-shaped sliding-window, softcap and sink problems instead,
against FlexAttention, SDPA with the materialised mask and ``varlen_attn``; ``--preset ragged``
(forward, backward) model-shaped ragged buckets (packed variable-length batches) against
``varlen_attn`` and SDPA on the padded batch with the padding mask, TFLOP/s on valid tokens;
``--preset paged`` (decode) the shipped paged decode buckets (a decode step over a paged K/V
cache) against ``varlen_attn`` with a block table and cuDNN's SDPA on the caches padded to the
longest with a key-padding mask, GB/s on the valid K/V bytes and as a share of the copy rate.

At every point each of our contenders (the looked-up schedule, the family's default, for decode
also the forward family's lookup) is first checked against the family case's float32 reference,
then timed with the case's baselines (``tuner.bench``); results go to ``bench.csv``,
``run.json``, ``summary.md`` and PNG plots in ``--out``, and rich tables to the terminal.
``--report-only CSV`` measures nothing and re-renders the summary and plots of an earlier run.
Compute-bound families (forward, backward: the backward counted as 2.5x the forward's FLOPs) are
read in TFLOP/s against a bf16 matrix product measured in the same run; decode in GB/s and as a
share of a device-to-device copy measured in the same run.

Results (the tables, the files written, or the ``--json`` document) go to standard output;
progress, warnings and errors to standard error.

Exit status: 0 success; 1 a tiledattention result failed the accuracy check; 2 bad options, an
unreadable CSV, or no CUDA device (one line).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import shlex
from pathlib import Path
from typing import Any, Sequence

from ..bench import (GRID_PRESETS, PAGED_CONTENDERS, PRESETS, QUICK_TIMING, RAGGED_CONTENDERS,
                     TIMING_DEFAULTS, VARIANT_CONTENDERS, BenchConfigError, BenchResult,
                     BenchSettings, Grid, PlotsUnavailable, RunInfo, build_grid, copy_gbps,
                     kernel_of, load_results, matmul_tflops, parse_positive_float,
                     parse_positive_int, rich_tables, run_grid, write_csv,
                     write_plots, write_run_info, write_summary)
from .._source import source_commit
from ..errors import USER_ERRORS, UnreadableFile
from ._problems import parse_problem_fields
from ._report import add_json_option, log_console, print_json, print_table, results_console

__all__ = ["configure", "run", "KERNELS", "grid_from_args", "settings_from_args",
           "write_reports"]

CSV_NAME = "bench.csv"
SUMMARY_NAME = "summary.md"
RUN_INFO_NAME = "run.json"
#: Kernel families with a benchmark preset (``--kernel``).
KERNELS = tuple(PRESETS)
#: The grid options (attributes of the parsed arguments) some family's preset of some
#: ``--preset`` takes.
_GRID_OPTIONS = tuple(dict.fromkeys(o for presets in GRID_PRESETS.values()
                                    for preset in presets.values() for o in preset.options))


def _kernel(text: str) -> str:
    if text not in KERNELS:
        raise argparse.ArgumentTypeError(
            f"tiledtune bench has grids for the {', '.join(KERNELS)} families only; got "
            f"{text!r} (other kernel families bring their own benchmark presets)")
    return text


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``tiledtune bench``'s options to ``parser`` (the subcommand's parser)."""
    parser.description = (
        "Benchmark tiledattention against PyTorch's SDPA backends over a grid: --kernel "
        "forward (default) with fixed B·S (--tokens) and H·D (--hidden), --kernel decode over "
        "decode shapes (--preset paged: over a paged K/V cache), --kernel backward over the "
        "forward's kind of grid (--problem: exactly the problems named instead); writes "
        "bench.csv, run.json, summary.md and PNG plots into --out.")
    parser.add_argument("--kernel", type=_kernel, default="forward", metavar="NAME",
                        help="kernel family to benchmark: forward (default), decode or "
                             "backward")
    parser.add_argument("--preset", default="default", metavar="NAME",
                        help="default: the family's grid (below); variants: model-shaped "
                             "sliding-window, softcap and sink problems (Mistral's 4096 window "
                             "at 8k and 32k, GPT-OSS's 128 window with and without sinks, "
                             "Gemma 2's softcap 50 with and without its 4096 window; decode: "
                             "a 4096 window of a 128k cache) against torch.compile'd "
                             "FlexAttention, SDPA with the materialised mask and varlen_attn "
                             "(where torch has it); takes --batch, --dtypes. ragged (--kernel "
                             "forward, backward): packed variable-length batches as their "
                             "buckets (causal; H 32/8 D 128 at 16k and 32k tokens with the "
                             "longest sequence 1k-16k, H 16 D 64, H 8/1 D 128) against torch's "
                             "varlen_attn (where torch has it) and SDPA on the padded batch "
                             "with the padding mask (cuDNN, efficient), TFLOP/s on the valid "
                             "tokens; takes --tokens, --dtypes. paged (--kernel decode): the "
                             "shipped paged decode buckets (H 32/8 D 128, one query row: B16 "
                             "and B64 over caches up to 32k and B32 up to 16k in pages of 64, "
                             "B16 up to 32k in pages of 16) against torch's varlen_attn with a "
                             "block table (where torch has one) and cuDNN's SDPA on the caches "
                             "padded to the longest with a key-padding mask, GB/s on the valid "
                             "K/V bytes and their share of the copy rate; takes --batch, "
                             "--seqlens-k, --page-sizes, --dtypes")
    grid = parser.add_argument_group("grid (every kernel)")
    grid.add_argument("--problem", type=parse_problem_fields, action="append", default=None,
                      metavar="FIELD=VALUE,...",
                      help="bench exactly this problem of --kernel's family, every field named "
                           "(e.g. batch=1,heads_q=32,heads_kv=8,seqlen_q=4096,seqlen_k=4096,"
                           "head_dim=128,dtype=bf16,causal=yes; bottom_right=yes aligns the "
                           "causal mask bottom-right). Repeatable; replaces the preset's grid, "
                           "so no other grid option goes with it")
    grid.add_argument("--head-dims", metavar="LIST",
                      help="head dims D (default forward and backward 64,128,256; decode 128)")
    grid.add_argument("--dtypes", metavar="LIST",
                      help="bf16,fp16 (default forward and backward both; decode bf16)")
    grid.add_argument("--contenders", metavar="LIST",
                      help="; ".join(f"{name}: subset of {','.join(preset.contenders)}"
                                     for name, preset in PRESETS.items())
                      + "; --preset variants: tiledattention's and "
                      + ",".join(VARIANT_CONTENDERS) + "; --preset ragged: tiledattention's "
                      + "and " + ",".join(RAGGED_CONTENDERS) + "; --preset paged: "
                      + "tiledattention's and " + ",".join(PAGED_CONTENDERS) + " (default all)")
    grid.add_argument("--quick", action="store_true",
                      help="small grid (forward and backward: D 64,128; S 1024,4096; bf16. "
                           "decode: 4 points) and looser timing; explicit options still win")
    fwd = parser.add_argument_group("forward and backward grids (--kernel forward, backward)")
    fwd.add_argument("--seqlens", metavar="LIST",
                     help="sequence lengths S (default forward 512,1024,...,16384; backward "
                          "1024,4096,16384); must divide --tokens")
    fwd.add_argument("--causal", metavar="LIST", help="yes,no (default both)")
    fwd.add_argument("--tokens", metavar="N",
                     help="B·S, fixed over the grid (default 16384); --preset ragged: a list "
                          "of token counts, every point at each (default its own, 16k or 32k)")
    fwd.add_argument("--hidden", metavar="N", help="H·D, fixed over the grid (default 2048)")
    dec = parser.add_argument_group(
        "decode grid (--kernel decode): S_q 1 at B 1 over S_k 4096..131072, at B 8,32 over "
        "S_k 2048,8192, and S_q 16 at B 8, S_k 8192 bottom-right; each option below replaces "
        "its axis in every one of these groups")
    dec.add_argument("--batch", metavar="LIST",
                     help="batch sizes B (also --preset variants: every point at each; "
                          "--preset paged: entries, powers of two, every point at each)")
    dec.add_argument("--seqlens-q", metavar="LIST", help="query lengths S_q")
    dec.add_argument("--seqlens-k", metavar="LIST",
                     help="K/V lengths S_k (--preset paged: the longest cache, powers of two, "
                          "every point at each)")
    dec.add_argument("--page-sizes", metavar="LIST",
                     help="--preset paged only: tokens a page (multiples of 16), every point "
                          "at each (default each point's own, 64 or 16)")
    dec.add_argument("--masks", metavar="LIST", help="none,top-left,bottom-right")
    dec.add_argument("--heads", metavar="LIST", help="H_q/H_kv pairs (default 32/8)")
    timing = parser.add_argument_group("timing")
    timing.add_argument("--timing", choices=["stream", "host", "loop"], default=None,
                        help="stream: each call's GPU time between two CUDA events, the host "
                             "running ahead (GPU time; default); host: isolated calls from an "
                             "idle GPU with the host's time counted (the host clock from the "
                             "call to the end of its GPU work); loop: calls back to back "
                             "between two CUDA events on a warm L2, the host's time counted "
                             "where it is slower than the GPU (steady state of a loop of eager "
                             "calls). The ceilings are timed in stream mode either way")
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
                             "round in an order shuffled per round, for ROUNDS rounds (0: each on its own, "
                             "until --rel-precision; default " + ", ".join(
                                 f"{name} {p.interleave[0]} ({p.interleave[1]} with --quick)"
                                 for name, p in PRESETS.items()) + ")")
    parser.add_argument("--device", metavar="INDEX", help="CUDA device index (default 0)")
    parser.add_argument("--seed", metavar="N",
                        help="seed of the ceilings' operands (default 0; the families' cases "
                             "draw their own inputs)")
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

    def pick(attr: str, parse, key: str):
        value = getattr(args, attr, None)
        return defaults[key] if value is None else parse("--" + attr.replace("_", "-"), value)

    preset = PRESETS[getattr(args, "kernel", "forward")]
    settings = BenchSettings(
        warmup_ms=pick("warmup_ms", parse_positive_float, "warmup_ms"),
        min_samples=pick("min_samples", parse_positive_int, "min_samples"),
        max_samples=pick("samples", parse_positive_int, "max_samples"),
        max_seconds=pick("max_seconds", parse_positive_float, "max_seconds"),
        rel_precision=pick("rel_precision", parse_positive_float, "rel_precision"),
        device=_non_negative_int("--device", getattr(args, "device", None) or 0),
        seed=_non_negative_int("--seed", getattr(args, "seed", None) or 0),
        interleave=(preset.interleave[quick] if getattr(args, "interleave", None) is None
                    else _non_negative_int("--interleave", args.interleave)),
        host=getattr(args, "timing", None) == "host",
        loop=getattr(args, "timing", None) == "loop",
    )
    if settings.min_samples > settings.max_samples:
        raise BenchConfigError(f"--min-samples ({settings.min_samples}) must not exceed "
                               f"--samples ({settings.max_samples})")
    if not settings.rel_precision < 1:
        raise BenchConfigError(f"--rel-precision must be below 1 (a fraction of the median); "
                               f"got {settings.rel_precision}")
    return settings


def _non_negative_int(flag: str, text: str | int) -> int:
    return parse_positive_int(flag, text, least=0)


def grid_from_args(args: argparse.Namespace) -> Grid:
    """The ``Grid`` of ``--kernel``'s preset that the options describe, or of the problems
    ``--problem`` names; an option of another family's grid, or any grid option with
    ``--problem``, is refused, naming it."""
    options = {name: getattr(args, name, None) for name in _GRID_OPTIONS}
    return build_grid(getattr(args, "kernel", "forward"), quick=bool(args.quick),
                      contenders=args.contenders, problems=getattr(args, "problem", None),
                      preset=getattr(args, "preset", None) or "default", **options)


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
    """summary.md and (unless ``plots`` is false or matplotlib is missing) the PNG plots."""
    written = [write_summary(results, info, out_dir / SUMMARY_NAME)]
    if plots:
        try:
            pngs, messages = write_plots(results, out_dir, info.copy_gbps)
        except PlotsUnavailable as exc:
            console.print(f"[yellow]plots skipped:[/] {exc}", soft_wrap=True)
        else:
            written += pngs
            for message in messages:
                console.print(f"[yellow]{message}[/]", soft_wrap=True)
    return written


def _print_results(results: Sequence[BenchResult], info: RunInfo, written: Sequence[Path],
                   args: argparse.Namespace) -> None:
    """The results on standard output: the rich tables and the files written, or with
    ``--json`` one document ``{"kernel", "info", "written", "results"}`` (``results``: every
    ``BenchResult`` as a dict, the CSV's columns)."""
    if getattr(args, "json", False):
        print_json("bench", {"kernel": kernel_of(results), "info": info,
                             "written": [str(path) for path in written], "results": results})
        return
    console = results_console()
    for table in rich_tables(results, info):
        print_table(console, table)
    for path in written:
        console.print(f"wrote {path}", markup=False)


def _unwritable(folder: Path) -> str | None:
    """Why the results cannot be written into ``folder`` (made if missing), or ``None``."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"cannot write the results there ({exc.strerror or exc})"
    return None


def run(args: argparse.Namespace) -> int:
    """Run ``tiledtune bench``; 0 on success, 2 for bad options or no (such) GPU, 1 when
    tiledattention produced a wrong result."""
    console = log_console()  # progress, warnings and errors; results go to standard output
    try:
        if args.report_only:
            return _report_only(args, console)
        grid = grid_from_args(args)
        settings = settings_from_args(args)
    except USER_ERRORS as exc:  # BenchConfigError, an unreadable CSV: what the user gave
        console.print(f"[red]tiledtune bench: error:[/] {exc}", soft_wrap=True)
        return 2

    import torch

    if not torch.cuda.is_available():
        console.print("[red]tiledtune bench: error:[/] no CUDA device is visible; the benchmark "
                      "needs one (re-render an old run with --report-only CSV)", soft_wrap=True)
        return 2
    if settings.device >= torch.cuda.device_count():
        console.print(f"[red]tiledtune bench: error:[/] --device {settings.device} does not "
                      f"exist; this machine has {torch.cuda.device_count()} CUDA device(s)",
                      soft_wrap=True)
        return 2
    out_dir = Path(args.out or "bench-results")
    unwritable = _unwritable(out_dir)  # before anything is measured, not after the whole grid
    if unwritable is not None:
        console.print(f"[red]tiledtune bench: error:[/] --out {out_dir}: {unwritable}",
                      soft_wrap=True)
        return 2
    torch.cuda.set_device(settings.device)
    console.print(f"tiledtune bench: {len(grid.problems)} points × {len(grid.contenders)} "
                  f"contenders on {torch.cuda.get_device_name(settings.device)} → {out_dir}/",
                  soft_wrap=True)

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    commit, dirty = source_commit()  # the code as it is when the run starts

    # the ceiling the summary reads results against, measured before and after the grid
    copy = grid.preset.ceiling == "copy"
    ceiling = (lambda: copy_gbps(settings)) if copy else (lambda: matmul_tflops(settings))
    measure_ceiling = copy or not args.no_matmul
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                  transient=False) as progress:
        ceilings = [ceiling()] if measure_ceiling else []
        results = run_grid(grid, settings, progress=progress)
        if measure_ceiling:
            ceilings.append(ceiling())

    info = RunInfo(command=_command_line(args), date=_now(),
                   matmul_tflops=() if copy else tuple(ceilings),
                   copy_gbps=tuple(ceilings) if copy else (), commit=commit, dirty=dirty)
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
    results = load_results(csv_path)  # UnreadableFile -> exit 2 with the message
    if not results:
        raise UnreadableFile(f"--report-only: {csv_path} holds no results")
    out_dir = Path(args.out) if args.out else csv_path.parent
    saved = csv_path.parent / RUN_INFO_NAME  # the run's ceilings, when they were measured
    # the measured run's ceilings and commit, not the re-rendering's (none: it recorded none)
    run_info = (RunInfo.from_json(saved.read_text()) if saved.is_file()
                else RunInfo(command="", date=""))
    info = dataclasses.replace(run_info, date=_now(),
                               command=_command_line(args) + f" (re-rendered from {csv_path})")
    written = write_reports(results, out_dir, info, plots=not args.no_plots, console=console)
    _print_results(results, info, written, args)
    return 0
