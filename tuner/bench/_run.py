"""``tiledtune bench``: tiledattention against PyTorch's attention backends over a model-like grid.

For every grid point (``tuner._bench_grid``) each contender's output is first checked against
a float32 reference (relative L2 error), then timed with ``tuner.timing.time_cuda`` (L2 flushed
before every sample, the same for everyone). A contender that raises, is wrong, or would not fit
in memory becomes a result with a status and a reason, never a hole in the table. Results go to
``bench.csv``, ``summary.md`` and PNG plots (``tuner._bench_report``).

The CLI registers it with ``bench.configure(subparser)`` and calls ``bench.run(args) -> int``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import math
import shlex
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from ._bench_grid import (
    CONTENDERS,
    QUICK_TIMING,
    TIMING_DEFAULTS,
    BenchConfigError,
    BenchGrid,
    BenchPoint,
    build_grid,
    parse_positive_float,
    parse_positive_int,
    point_tflops,
)
from ._bench_report import (
    MATMUL_SIZE,
    BenchResult,
    PlotsUnavailable,
    RunInfo,
    load_results,
    ratio_table,
    write_csv,
    write_plots,
    write_run_info,
    write_summary,
)

__all__ = ["configure", "run", "BenchSettings", "Contender", "TOLERANCES", "measure_point",
           "make_contenders", "reference_attention", "run_grid"]

#: Largest relative L2 error, against a float32 reference, that counts as correct.
TOLERANCES = {"bf16": 1e-2, "fp16": 5e-3}
CSV_NAME = "bench.csv"
SUMMARY_NAME = "summary.md"
RUN_INFO_NAME = "run.json"


# -- settings ------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """How to measure: ``time_cuda`` keywords plus the memory budget of S×S contenders."""

    warmup_ms: float = TIMING_DEFAULTS["warmup_ms"]
    min_samples: int = TIMING_DEFAULTS["min_samples"]
    max_samples: int = TIMING_DEFAULTS["max_samples"]
    max_seconds: float = TIMING_DEFAULTS["max_seconds"]
    rel_precision: float = TIMING_DEFAULTS["rel_precision"]
    mem_fraction: float = 0.4  # S×S contenders may use this share of the free GPU memory
    device: int = 0
    seed: int = 0
    interleave: int = 0  # rounds of interleaved timing per point; 0: each contender on its own

    def timing_kwargs(self) -> dict[str, Any]:
        return dict(warmup_ms=self.warmup_ms, min_samples=self.min_samples,
                    max_samples=self.max_samples, max_seconds=self.max_seconds,
                    rel_precision=self.rel_precision)


# -- contenders ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """A contender ready to run at one point: ``fn()`` returns the output; ``context`` wraps
    both the check and the timing (e.g. pins torch's SDPA backend)."""

    fn: Callable[[], Any]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    schedule: str = ""
    lookup_source: str = ""
    lookup_detail: str = ""


@dataclass(frozen=True)
class Contender:
    """``prepare(q, k, v, point, arch)`` -> :class:`Prepared`; ``score_bytes(point)`` -> bytes
    of S×S intermediates it materialises (0: none), checked against the memory budget."""

    name: str
    prepare: Callable[..., Prepared]
    score_bytes: Callable[[BenchPoint], int] = lambda point: 0


def _score_elements(point: BenchPoint) -> int:
    return point.batch * point.heads * point.seqlen * point.seqlen


def _tiledattention(q, k, v, point: BenchPoint, arch: str) -> Prepared:
    import tiledattention

    resolution = tiledattention.explain(q, k, v, point.causal)
    schedule = resolution.schedule
    # pass the explained schedule explicitly, so the row's schedule is the one that ran
    return Prepared(lambda: tiledattention.sdpa(q, k, v, point.causal, schedule=schedule),
                    schedule=schedule.describe(), lookup_source=resolution.source,
                    lookup_detail=resolution.detail)


def _tiledattention_default(q, k, v, point: BenchPoint, arch: str) -> Prepared:
    import search_spaces
    import tiledattention

    schedule = search_spaces.default_schedule(arch, point.problem)
    return Prepared(lambda: tiledattention.sdpa(q, k, v, point.causal, schedule=schedule),
                    schedule=schedule.describe(), lookup_source="forced",
                    lookup_detail=f"search_spaces.default_schedule({arch!r})")


def _torch_sdpa(backend: str | None) -> Callable[..., Prepared]:
    def prepare(q, k, v, point: BenchPoint, arch: str) -> Prepared:
        import torch.nn.functional as F

        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=point.causal)  # noqa: E731
        if backend is None:
            return Prepared(fn)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = getattr(SDPBackend, backend)
        return Prepared(fn, context=lambda: sdpa_kernel(chosen))
    return prepare


def _eager(q, k, v, point: BenchPoint, arch: str) -> Prepared:
    import torch

    scale = 1.0 / math.sqrt(point.head_dim)
    mask = None
    if point.causal:  # top-left aligned, like torch's is_causal; built once, outside the timing
        mask = torch.ones(point.seqlen, point.seqlen, dtype=torch.bool,
                          device=q.device).triu_(1)

    def fn():
        scores = torch.matmul(q, k.transpose(-1, -2))  # [B, H, S, S] in the input dtype
        scores.mul_(scale)
        if mask is not None:
            scores.masked_fill_(mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)
    return Prepared(fn)


def make_contenders() -> dict[str, Contender]:
    """Every known contender, by name (``_bench_grid.CONTENDERS`` order)."""
    table = {
        "tiledattention": Contender("tiledattention", _tiledattention),
        "tiledattention-default": Contender("tiledattention-default", _tiledattention_default),
        "torch-auto": Contender("torch-auto", _torch_sdpa(None)),
        "torch-flash": Contender("torch-flash", _torch_sdpa("FLASH_ATTENTION")),
        "torch-cudnn": Contender("torch-cudnn", _torch_sdpa("CUDNN_ATTENTION")),
        "torch-efficient": Contender("torch-efficient", _torch_sdpa("EFFICIENT_ATTENTION")),
        # the math backend upcasts half inputs: fp32 scores, fp32 probabilities and a copy
        "torch-math": Contender("torch-math", _torch_sdpa("MATH"),
                                score_bytes=lambda p: 3 * 4 * _score_elements(p)),
        # eager: scores and probabilities in the input dtype (2 x 2 bytes: the fp32 size)
        "eager": Contender("eager", _eager, score_bytes=lambda p: 4 * _score_elements(p)),
    }
    assert tuple(table) == CONTENDERS
    return table


# -- measurement ---------------------------------------------------------------------------------

def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def reference_attention(q, k, v, causal: bool, *, budget_bytes: int) -> Any:
    """float32 attention (top-left causal), in query chunks whose fp32 scores fit
    ``budget_bytes``; full-precision matmuls (no TF32)."""
    import torch

    b, h, sq, d = q.shape
    sk = k.shape[2]
    scale = 1.0 / math.sqrt(d)
    kf, vf = k.float(), v.float()
    out = torch.empty(b, h, sq, d, dtype=torch.float32, device=q.device)
    rows = max(1, int(budget_bytes // (2 * 4 * b * h * sk)))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, sq, rows):
            stop = min(sq, start + rows)
            scores = torch.matmul(q[:, :, start:stop].float(), kf.transpose(-1, -2)).mul_(scale)
            if causal:
                i = torch.arange(start, stop, device=q.device)[:, None]
                j = torch.arange(sk, device=q.device)[None, :]
                scores.masked_fill_(j > i, float("-inf"))
            out[:, :, start:stop] = torch.matmul(torch.softmax(scores, dim=-1), vf)
            del scores
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return out


def _rel_err(out, ref) -> float:
    import torch

    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
        shape = tuple(out.shape) if hasattr(out, "shape") else type(out).__name__
        raise ValueError(f"output has shape {shape}; expected {tuple(ref.shape)}")
    diff = (out.double() - ref.double()).norm()
    return float(diff / ref.double().norm())


def _poison_allocator(nbytes: int, device) -> None:
    """Fill a block of the output's size with NaN and free it: torch's caching allocator hands
    it to the next allocation of that size, so a kernel that skips part of its output leaves
    NaN there instead of a previous contender's correct numbers."""
    import torch

    block = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    block.fill_(float("nan"))
    del block


@contextlib.contextmanager
def _captured_warnings() -> Iterator[list]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _unavailable_reason(exc: BaseException, caught: list) -> str:
    reason = _first_line(exc)
    # torch says *why* a pinned SDPA backend cannot run in warnings before "No available kernel"
    why = [str(w.message).strip().splitlines()[0] for w in caught
           if str(w.message).strip() and "kernel" in str(w.message).lower()]
    if why:
        reason += " (" + "; ".join(dict.fromkeys(why)) + ")"
    return reason


def measure_point(point: BenchPoint, contenders: Sequence[Contender], settings: BenchSettings,
                  *, env: Mapping[str, str], on_contender: Callable[[str], None] | None = None,
                  time_fn: Callable[..., Any] | None = None,
                  interleaved_fn: Callable[..., Any] | None = None, device: Any = None,
                  free_memory: Callable[[], int] | None = None) -> list[BenchResult]:
    """Check, then time, every contender at ``point``; one result each, whatever happens.

    With ``settings.interleave`` the contenders that pass the check are timed together, one
    sample each per round in rotating order (``time_interleaved``), so that drift of the shared
    machine hits all of them alike; otherwise each is timed on its own (``time_cuda``).
    ``device`` defaults to ``cuda:<settings.device>``; ``time_fn``, ``interleaved_fn`` and
    ``free_memory`` to the CUDA ones (tests replace them to run on the CPU)."""
    import torch

    from .timing import time_cuda, time_interleaved

    time_fn = time_fn or time_cuda
    interleaved_fn = interleaved_fn or time_interleaved
    device = torch.device("cuda", settings.device) if device is None else torch.device(device)
    if free_memory is None:
        free_memory = lambda: torch.cuda.mem_get_info(device)[0]  # noqa: E731
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[point.dtype]
    base = dict(batch=point.batch, heads=point.heads, seqlen=point.seqlen,
                head_dim=point.head_dim, dtype=point.dtype, causal=point.causal, **env)
    gen = torch.Generator(device=device).manual_seed(settings.seed)
    shape = (point.batch, point.heads, point.seqlen, point.head_dim)
    q, k, v = (torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(3))
    ref = reference_attention(q, k, v, point.causal, budget_bytes=max(
        64 << 20, int(settings.mem_fraction * free_memory()) // 4))
    tol = TOLERANCES[point.dtype]
    results: list[BenchResult | None] = []
    passed: dict[int, _Checked] = {}  # index in results -> contender that passed the check
    for contender in contenders:
        if on_contender is not None:
            on_contender(contender.name)
        outcome = _check_one(contender, point, q, k, v, ref, tol, settings, base,
                             env.get("arch", ""), free_memory)
        if isinstance(outcome, BenchResult):
            results.append(outcome)
        elif settings.interleave:
            passed[len(results)] = outcome
            results.append(None)
        else:
            results.append(_timed(outcome, lambda fn: time_fn(fn, **settings.timing_kwargs()),
                                  point, base))
        _release(device)
    if passed:
        for index, result in _timed_together(passed, interleaved_fn, settings.interleave,
                                             point, base).items():
            results[index] = result
    del q, k, v, ref
    _release(device)
    return results


@dataclass(frozen=True)
class _Checked:
    """A contender that computed the right answer at this point, ready to be timed."""

    name: str
    prepared: Prepared
    rel_err: float


def _release(device: Any) -> None:
    """Give cached GPU memory back between contenders and points."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _check_one(contender: Contender, point: BenchPoint, q, k, v, ref, tol: float,
               settings: BenchSettings, base: dict, arch: str,
               free_memory: Callable[[], int]) -> BenchResult | _Checked:
    """Prepare ``contender`` and compare one poisoned run with the reference: a final result
    (skipped, wrong, unavailable) or the prepared contender."""
    import torch

    need = contender.score_bytes(point)
    if need:
        free = free_memory()
        if need > settings.mem_fraction * free:
            return BenchResult(contender=contender.name, status="skipped",
                               reason=f"would need {need / 2**30:.1f} GiB for S×S scores "
                                      f"(budget {settings.mem_fraction:.0%} of "
                                      f"{free / 2**30:.1f} GiB free)", **base)
    prepared = None
    with _captured_warnings() as caught:
        try:
            prepared = contender.prepare(q, k, v, point, arch)
            with prepared.context():
                _poison_allocator(q.numel() * q.element_size(), q.device)
                out = prepared.fn()
                if q.device.type == "cuda":
                    torch.cuda.synchronize(q.device)
                err = _rel_err(out, ref)
                del out
        except Exception as exc:  # failures of contenders are data, not crashes
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                _release(q.device)
            return BenchResult(contender=contender.name, status="unavailable",
                               reason=_unavailable_reason(exc, caught),
                               **(_schedule_fields(prepared) if prepared else {}), **base)
    if not err <= tol:  # NaN (poison left in the output) is wrong too
        return BenchResult(contender=contender.name, status="wrong",
                           reason=f"err={err:.3g} > {tol:g}", rel_err=err,
                           **_schedule_fields(prepared), **base)
    return _Checked(contender.name, prepared, err)


def _in_context(prepared: Prepared) -> Callable[[], Any]:
    def run():
        with prepared.context():
            return prepared.fn()
    return run


def _result(checked: _Checked, timing: Any, point: BenchPoint, base: dict) -> BenchResult:
    return BenchResult(contender=checked.name, status="ok", median_ms=timing.median_ms,
                       spread_ms=timing.spread_ms, samples=timing.samples,
                       tflops=point_tflops(point, timing.median_ms), rel_err=checked.rel_err,
                       **_schedule_fields(checked.prepared), **base)


def _failed(checked: _Checked, exc: BaseException, caught: list, base: dict) -> BenchResult:
    return BenchResult(contender=checked.name, status="unavailable",
                       reason=_unavailable_reason(exc, caught),
                       **_schedule_fields(checked.prepared), **base)


def _timed(checked: _Checked, time_one: Callable[[Callable[[], Any]], Any], point: BenchPoint,
           base: dict) -> BenchResult:
    import torch

    with _captured_warnings() as caught:
        try:
            with checked.prepared.context():
                timing = time_one(checked.prepared.fn)
        except Exception as exc:  # failures of contenders are data, not crashes
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                _release(torch.device("cuda"))
            return _failed(checked, exc, caught, base)
    return _result(checked, timing, point, base)


def _timed_together(passed: Mapping[int, _Checked], interleaved_fn: Callable[..., Any],
                    rounds: int, point: BenchPoint, base: dict) -> dict[int, BenchResult]:
    fns = {c.name: _in_context(c.prepared) for c in passed.values()}
    with _captured_warnings() as caught:
        try:
            timings = interleaved_fn(fns, rounds=rounds)
        except Exception as exc:  # one failing contender spoils the round: all are reported
            return {i: _failed(c, exc, caught, base) for i, c in passed.items()}
    return {i: _result(c, timings[c.name], point, base) for i, c in passed.items()}


def _schedule_fields(prepared: Prepared) -> dict[str, str]:
    return dict(schedule=prepared.schedule, lookup_source=prepared.lookup_source,
                lookup_detail=prepared.lookup_detail)


def matmul_tflops(settings: BenchSettings, n: int = MATMUL_SIZE) -> float:
    """The bf16 matrix-product rate (``n``³, ``torch.matmul`` into a preallocated output): the
    ceiling attention's TFLOP/s is read against, measured like every contender."""
    import torch

    timing = _time_matmul(settings, n)
    _release(torch.device("cuda", settings.device))  # the operands are gone by now
    return 2 * n ** 3 / (timing.median_ms * 1e-3) / 1e12


def _time_matmul(settings: BenchSettings, n: int):
    import torch

    from .timing import time_cuda

    gen = torch.Generator(device="cuda").manual_seed(settings.seed)
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    return time_cuda(lambda: torch.matmul(a, b, out=c), **settings.timing_kwargs())


def gpu_clocks(device: int) -> tuple[str, str]:
    """(SM clock, memory clock) as ``nvidia-smi`` reports them; ``("", "")`` when it cannot."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "-i", str(device), "--query-gpu=clocks.sm,clocks.mem",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "", ""
    parts = [p.strip() for p in proc.stdout.strip().splitlines()[0].split(",")] \
        if proc.returncode == 0 and proc.stdout.strip() else []
    return (parts[0], parts[1]) if len(parts) == 2 else ("", "")


def environment(device: int) -> dict[str, str]:
    """Device and version fields every row carries."""
    from tiledattention._device import device_info
    from tiledattention._provenance import current_provenance

    info = device_info(device)
    prov = current_provenance()
    return dict(device=info.name, arch=info.arch, driver=prov.driver, torch_version=prov.torch,
                cuda_tile_version=prov.cuda_tile)


def run_grid(grid: BenchGrid, settings: BenchSettings, *, contenders: Mapping[str, Contender]
             | None = None, progress: Any = None) -> list[BenchResult]:
    """Measure every point of ``grid``; ``progress`` (a rich ``Progress``) is advanced per
    contender when given."""
    table = contenders if contenders is not None else make_contenders()
    chosen = [table[name] for name in grid.contenders]
    env = environment(settings.device)
    points = grid.points()
    task = None
    if progress is not None:
        task = progress.add_task("bench", total=len(points) * len(chosen))
    results: list[BenchResult] = []
    for point in points:
        def on_contender(name: str, point=point) -> None:
            if progress is not None:
                progress.update(task, description=f"{point.describe()} · {name}")
        point_results = measure_point(point, chosen, settings, env=env,
                                      on_contender=_advancing(on_contender, progress, task))
        sm, mem = gpu_clocks(settings.device)  # right after timing, while clocks are up
        results += [_with_clocks(r, sm, mem) for r in point_results]
        if progress is not None:
            progress.advance(task)
    return results


def _advancing(callback: Callable[[str], None], progress: Any, task: Any
               ) -> Callable[[str], None]:
    """Advance the bar when the next contender starts (the last one advances at point end)."""
    started = [0]

    def on_contender(name: str) -> None:
        if started[0] and progress is not None:
            progress.advance(task)
        started[0] += 1
        callback(name)
    return on_contender


def _with_clocks(result: BenchResult, sm: str, mem: str) -> BenchResult:
    import dataclasses

    return dataclasses.replace(result, sm_clock=sm, mem_clock=mem)


# -- CLI -----------------------------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``tiledtune bench``'s options to ``parser`` (the subcommand's parser)."""
    parser.description = (
        "Benchmark tiledattention against PyTorch's SDPA backends and eager attention over a "
        "grid with fixed B·S (--tokens) and H·D (--hidden); writes bench.csv, summary.md and "
        "PNG plots into --out.")
    grid = parser.add_argument_group("grid")
    grid.add_argument("--head-dims", metavar="LIST", help="head dims D (default 64,128,256)")
    grid.add_argument("--seqlens", metavar="LIST",
                      help="sequence lengths S (default 512,1024,...,16384); must divide "
                           "--tokens")
    grid.add_argument("--dtypes", metavar="LIST", help="bf16,fp16 (default both)")
    grid.add_argument("--causal", metavar="LIST", help="yes,no (default both)")
    grid.add_argument("--tokens", metavar="N", help="B·S, fixed over the grid (default 16384)")
    grid.add_argument("--hidden", metavar="N", help="H·D, fixed over the grid (default 2048)")
    grid.add_argument("--contenders", metavar="LIST",
                      help=f"subset of {','.join(CONTENDERS)} (default all)")
    grid.add_argument("--quick", action="store_true",
                      help="small grid (D 64,128; S 1024,4096; bf16) and looser timing; "
                           "explicit options still win")
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
                             "round in rotating order, for ROUNDS rounds (default 0: each on "
                             "its own, until --rel-precision)")
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
                        help="skip the bf16 matrix-product rate measured before and after the "
                             "grid (the summary's ceiling)")
    output.add_argument("--report-only", metavar="CSV",
                        help="measure nothing: re-render summary.md and plots from a bench CSV")
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
        interleave=(0 if getattr(args, "interleave", None) is None
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


def _non_negative_int(flag: str, text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise BenchConfigError(f"{flag} must be a non-negative integer; got {text!r}") from None
    if value < 0:
        raise BenchConfigError(f"{flag} must be a non-negative integer; got {text!r}")
    return value


def grid_from_args(args: argparse.Namespace) -> BenchGrid:
    return build_grid(tokens=args.tokens, hidden=args.hidden, head_dims=args.head_dims,
                      seqlens=args.seqlens, dtypes=args.dtypes, causal=args.causal,
                      contenders=args.contenders, quick=bool(args.quick))


def _console():
    from rich.console import Console

    return Console(stderr=True)


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

    from ._bench_report import _contenders_of, _index

    contenders = _contenders_of(results)
    table = Table(title="TFLOP/s (tiledtune bench)", show_lines=False)
    for column in ("dtype", "D", "mask", "S", "B×H"):
        table.add_column(column, justify="right" if column in ("D", "S") else "left")
    for name in contenders:
        table.add_column(name, justify="right")
    for key, row in sorted(_index(results).items()):
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
                      f"exist; this machine has {torch.cuda.device_count()} CUDA device(s)", soft_wrap=True)
        return 2
    torch.cuda.set_device(settings.device)
    out_dir = Path(args.out or "bench-results")
    points = grid.points()
    console.print(f"tiledtune bench: {len(points)} points × {len(grid.contenders)} contenders "
                  f"on {torch.cuda.get_device_name(settings.device)} → {out_dir}/", soft_wrap=True)

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                  transient=False) as progress:
        matmul = [] if args.no_matmul else [matmul_tflops(settings)]
        results = run_grid(grid, settings, progress=progress)
        if not args.no_matmul:
            matmul.append(matmul_tflops(settings))

    info = RunInfo(command=_command_line(args),
                   date=_now(),
                   matmul_tflops=tuple(matmul))
    csv_path = write_csv(results, out_dir / CSV_NAME)
    info_path = write_run_info(info, out_dir / RUN_INFO_NAME)
    written = [csv_path, info_path] + write_reports(results, out_dir, info, plots=not args.no_plots,
                                         console=console)
    console.print(results_table(results))
    ratios = ratio_rich_table(results)
    if ratios is not None:
        console.print(ratios)
    for path in written:
        console.print(f"wrote {path}", soft_wrap=True)
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
    saved = csv_path.parent / RUN_INFO_NAME  # the run's matmul rate, when it was measured
    matmul = RunInfo.from_json(saved.read_text()).matmul_tflops if saved.is_file() else ()
    info = RunInfo(command=_command_line(args) + f" (re-rendered from {csv_path})",
                   date=_now(),
                   matmul_tflops=matmul)
    written = write_reports(results, out_dir, info, plots=not args.no_plots, console=console)
    console.print(results_table(results))
    for path in written:
        console.print(f"wrote {path}", soft_wrap=True)
    return 0
