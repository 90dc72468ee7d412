"""Measuring a ``tiledtune bench`` grid over any kernel family.

At each problem the family's GPU case (``Family.case``) gives the inputs, the float32 reference
and the launchers. Our contenders are schedules launched by a case: ``tiledattention`` the
lookup's (``runtime().resolution``), ``tiledattention-default`` the family's default (skipped
where the lookup answers with it: the same kernel would be timed twice) and
``tiledattention-<f>`` another family's lookup on the same problem (its own case); each is first
checked by its case (``Case.error``: outputs poisoned, one run, relative L2 error) against its
family's ``tolerance``. The baselines are the case's (``Case.baselines()``: PyTorch's backends),
run once before timing (a backend that cannot take the problem raises: ``unavailable``, with
torch's reason); the ``Case`` interface has no check for them, so their rows carry no error.
Variant problems (a window, a softcap, sinks) get, instead of torch's SDPA backends, the
contenders of ``_variants`` (FlexAttention, SDPA with the materialised mask, ``varlen_attn``),
built on the family's case and checked against its reference like ours; ragged problems
(``Problem.ragged``) get the contenders of ``_ragged`` (``varlen_attn`` on the packed batch, SDPA
on the padded batch), built on the family's ragged case and checked likewise; paged problems
(``Problem.page_size``) those of ``_paged`` (``varlen_attn`` with a block table, cuDNN's SDPA on
the caches padded to the longest with a key-padding mask), built on the family's paged case.
FlashAttention-4 (``_peers``) runs at every kind of problem, built on the family's case and
checked likewise (``unavailable`` where ``flash_attn.cute`` is not installed).
TFLOP/s are the
family's ``flops`` (of a ragged problem: the case's sequences' valid tokens only; of a paged
one: the case's valid keys); GB/s ``problem_bytes`` (of a paged
problem: the valid K/V bytes).
Contenders that pass are timed with ``tuner.measure``: together, one sample each per round
(``time_interleaved``) with ``--interleave``, else each on its own (``time_cuda``). A contender
that raises, is wrong or is skipped becomes a row with a status and a reason, never a hole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import subprocess
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from tiledattention.tooling import FP8_DTYPES

from ..errors import TunerError
from ._paged import PAGED_CONTENDERS, build_paged_contender, is_paged, paged_bytes
from ._peers import PEER_CONTENDERS, build_peer_contender
from ._presets import Grid, Preset
from ._ragged import RAGGED_CONTENDERS, build_ragged_contender, case_sequences, is_ragged
from ._results import COPY_BYTES, MATMUL_SIZE, BenchResult
from ._variants import VARIANT_CONTENDERS, NotRunnable, build_contender

__all__ = ["BenchSettings", "QUICK_TIMING", "TIMING_DEFAULTS", "copy_gbps", "environment",
           "gpu_clocks", "matmul_tflops", "measure_point", "problem_bytes", "result_fields",
           "run_grid"]

#: ``time_cuda`` keyword defaults behind ``--samples`` and friends; ``--quick`` loosens them.
TIMING_DEFAULTS = dict(warmup_ms=30.0, min_samples=10, max_samples=200, max_seconds=2.0,
                       rel_precision=0.01)
QUICK_TIMING = dict(warmup_ms=10.0, min_samples=5, max_samples=50, max_seconds=0.5,
                    rel_precision=0.03)


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """How to measure: ``time_cuda`` keywords, the device, the rounds of interleaved timing
    (0: each contender on its own) and the seed of the ceilings' operands."""

    warmup_ms: float = TIMING_DEFAULTS["warmup_ms"]
    min_samples: int = TIMING_DEFAULTS["min_samples"]
    max_samples: int = TIMING_DEFAULTS["max_samples"]
    max_seconds: float = TIMING_DEFAULTS["max_seconds"]
    rel_precision: float = TIMING_DEFAULTS["rel_precision"]
    device: int = 0
    seed: int = 0
    interleave: int = 0
    #: the contenders timed as isolated calls with the host's time counted (``--timing host``)
    host: bool = False
    #: the contenders timed in loops of calls back to back, the host's time counted, on a warm
    #: L2 (``--timing loop``)
    loop: bool = False

    def timing_kwargs(self) -> dict[str, Any]:
        """``time_cuda``'s keywords for a contender."""
        return {**self.ceiling_kwargs(), **self.mode_kwargs()}

    def mode_kwargs(self) -> dict[str, Any]:
        """The timing mode's keywords of ``time_cuda`` and ``time_interleaved`` for a
        contender (a loop runs on a warm L2)."""
        if self.loop:
            return {"host": False, "loop": True, "flush_l2": False}
        return {"host": self.host}

    def ceiling_kwargs(self) -> dict[str, Any]:
        """``time_cuda``'s keywords for a ceiling (the matrix-product and copy rates: GPU
        time, whatever the contenders' view)."""
        return {name: getattr(self, name) for name in TIMING_DEFAULTS}


class _Final(TunerError):
    """A contender's row is decided before timing: ``status`` (wrong, skipped, unavailable), the
    reason, and ``fields`` of the row (its schedule, its error)."""

    def __init__(self, status: str, reason: str, **fields: Any) -> None:
        super().__init__(reason)
        self.status, self.fields = status, fields


def problem_bytes(problem: Any) -> int:
    """Bytes one call must move at least: Q and K and V read, the output written, each once,
    in the input dtype (2 bytes an element, 1 for an FP8 input or cache):
    ``2·(2·B·H_q·S_q·D + 2·B·H_kv·S_k·D)`` for 16-bit inputs; with a
    sliding window only the keys some query row sees (``problem.key_span``) count in ``S_k``
    (a 4096-key window of a 128k cache reads 4096 keys). A ragged problem counts the sequences
    its family's case packs (``_ragged.case_sequences``), each by its own lengths: the valid
    tokens, not the bucket's rectangle. A paged problem counts the valid K/V bytes of its
    family's paged case (``_paged.paged_bytes``: its caches' lengths, each key once; Q and the
    output, under 0.1% of a decode step's bytes, left out)."""
    if is_paged(problem):
        return paged_bytes(problem)
    if is_ragged(problem):
        return sum(problem_bytes(one) for one in case_sequences(problem))
    keys = problem.seqlen_k
    if getattr(problem, "windowed", False):
        lo, hi = problem.key_span(0, problem.seqlen_q - 1)
        keys = max(0, hi - lo)
    q = problem.batch * problem.heads_q * problem.seqlen_q * problem.head_dim  # and as many out
    k_and_v = 2 * problem.batch * problem.heads_kv * keys * problem.head_dim
    fp8_q = problem.dtype in FP8_DTYPES  # one byte an element (the output stays two)
    fp8_kv = fp8_q or bool(getattr(problem, "kv_dtype", ""))
    return q * (1 if fp8_q else 2) + 2 * q + k_and_v * (1 if fp8_kv else 2)


#: The variant fields of a ``BenchResult`` and their values for a plain problem.
_VARIANT_FIELDS = dict(window_left=-1, window_right=-1, softcap=0.0, sinks=False, ragged=False,
                       page_size=0, kv_dtype="")


def result_fields(problem: Any) -> dict[str, Any]:
    """The problem's fields of a ``BenchResult`` (``heads`` = H_q, ``seqlen`` = S_k; the window,
    softcap, sinks, ``ragged``, ``page_size`` and ``kv_dtype`` where set: a plain problem's
    rows keep their defaults)."""
    variant = {name: getattr(problem, name, plain) for name, plain in _VARIANT_FIELDS.items()}
    return dict(batch=problem.batch, heads=problem.heads_q, heads_kv=problem.heads_kv,
                seqlen_q=problem.seqlen_q, seqlen=problem.seqlen_k, head_dim=problem.head_dim,
                dtype=problem.dtype, causal=problem.causal, bottom_right=problem.bottom_right,
                **{name: value for name, value in variant.items()
                   if value != _VARIANT_FIELDS[name]})


def _first_line(exc: BaseException, caught: Sequence = ()) -> str:
    from ..measure import first_line

    reason = first_line(exc).removesuffix(": ")  # "Type" alone for an empty message
    # torch says *why* a pinned SDPA backend cannot run in warnings before "No available kernel"
    why = [str(w.message).strip().splitlines()[0] for w in caught
           if str(w.message).strip() and "kernel" in str(w.message).lower()]
    return reason + (" (" + "; ".join(dict.fromkeys(why)) + ")" if why else "")


@contextlib.contextmanager
def _failures(on_fail: Callable[[str], None]) -> Iterator[None]:
    """Run the block with warnings recorded; an exception becomes ``on_fail(reason)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        except Exception as exc:  # failures of contenders are data, not crashes
            on_fail(_first_line(exc, caught))


def _cuda(what: str) -> None:
    """``torch.cuda.<what>()`` where CUDA is in use (tests run the engine on the CPU)."""
    import torch

    if what == "empty_cache":
        gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        getattr(torch.cuda, what)()


class _Point:
    """One problem's cases (the preset's family's and those of ``also``), made when needed."""

    def __init__(self, preset: Preset, problem: Any, device: int, arch: str) -> None:
        self.preset, self.problem, self.device, self.arch = preset, problem, device, arch
        self.family = preset.family
        self.cases: dict[str, Any] = {}
        self._baselines: Mapping[str, Callable[[], Any]] | None = None

    def case(self, family: Any) -> Any:
        if family.name not in self.cases:
            self.cases[family.name] = family.case(self.problem, self.device)
        return self.cases[family.name]

    def prepare(self, name: str) -> tuple[Callable[[], Any], float | None, dict[str, str]]:
        """(the call to time, its relative error or ``None`` when unchecked, schedule fields);
        raises :class:`_Final` for a row decided here, anything else for ``unavailable``."""
        if name.startswith("tiledattention"):
            family, schedule, fields = self._schedule(name)
            case = self.case(family)
            run = case.launcher(schedule)
            err = case.error(run)
            tol = family.tolerance(self.problem)
            if not err <= tol:  # NaN (poison left in the output) is wrong too
                raise _Final("wrong", f"err={err:.3g} > {tol:g}", **fields,
                             rel_err=err if math.isfinite(err) else None)
            return run, err, fields
        if name in VARIANT_CONTENDERS:
            return self._built(name, build_contender)
        if name in RAGGED_CONTENDERS:
            return self._built(name, build_ragged_contender)
        if name in PAGED_CONTENDERS:
            return self._built(name, build_paged_contender)
        if name in PEER_CONTENDERS:
            return self._built(name, build_peer_contender)
        if self._baselines is None:
            self._baselines = self.case(self.family).baselines()
        if name not in self._baselines:
            raise _Final("unavailable", f"the {self.family.name} family's case has no "
                                        f"baseline {name!r} (it has {sorted(self._baselines)})")
        run = self._baselines[name]
        run()  # raises when the backend cannot take this problem; warms it up otherwise
        _cuda("synchronize")
        return run, None, {}

    def _built(self, name: str, build: Callable[..., tuple[Callable[[], Any], float]]
               ) -> tuple[Callable[[], Any], float, dict[str, str]]:
        """A contender of variant, ragged or paged problems or another library's (``build``:
        ``_variants``', ``_ragged``'s, ``_paged``'s or ``_peers``' builder), built on this
        family's case and checked against its float32 reference with the family's
        tolerance."""
        try:
            run, err = build(name, self.problem, self.case(self.family),
                             backward=self.preset.phase == "backward")
        except NotRunnable as exc:
            raise _Final("skipped", str(exc)) from None
        tol = self.family.tolerance(self.problem)
        if not err <= tol:
            raise _Final("wrong", f"err={err:.3g} > {tol:g}",
                         rel_err=err if math.isfinite(err) else None)
        _cuda("synchronize")
        return run, err, {}

    def _schedule(self, name: str) -> tuple[Any, Any, dict[str, str]]:
        from tiledattention import get_family, runtime

        family = self.family
        if name == "tiledattention-default":
            schedule = family.default_schedule(self.arch, self.problem)
            looked = runtime().resolution(family, self.problem, self.device)
            if family.normalise(self.problem, looked.schedule) == family.normalise(
                    self.problem, schedule):
                raise _Final("skipped", f"the lookup's schedule ({looked.source}) is the default "
                                        f"{schedule.describe()}: tiledattention's rows time it")
            return family, schedule, dict(
                schedule=schedule.describe(), lookup_source="forced",
                lookup_detail=f"{family.name}.default_schedule({self.arch!r})")
        if name != "tiledattention":
            family = get_family(name.removeprefix("tiledattention-"))
            refused = family.dtype_refusal(self.problem)  # e.g. an FP8 cache: decode's only
            if refused is not None:
                raise _Final("skipped", refused)
        resolution = runtime().resolution(family, self.problem, self.device)
        return family, resolution.schedule, dict(schedule=resolution.schedule.describe(),
                                                 lookup_source=resolution.source,
                                                 lookup_detail=resolution.detail)


def measure_point(preset: Preset, problem: Any, contenders: Sequence[str],
                  settings: BenchSettings, *, env: Mapping[str, str],
                  on_contender: Callable[[str], None] | None = None,
                  time_fn: Callable[..., Any] | None = None,
                  interleaved_fn: Callable[..., Any] | None = None) -> list[BenchResult]:
    """Check, then time, every contender at ``problem``; one row each, in ``contenders`` order,
    whatever happens. ``time_fn`` and ``interleaved_fn`` default to ``tuner.measure``'s
    ``time_cuda`` and ``time_interleaved`` (tests replace them to run on the CPU)."""
    from ..measure import time_cuda, time_interleaved

    time_fn = time_fn or time_cuda
    interleaved_fn = interleaved_fn or time_interleaved
    point = _Point(preset, problem, settings.device, env.get("arch", ""))
    base = dict(result_fields(problem), kernel=preset.kernel, phase=preset.phase, **env)
    # a paged problem's work: its case's valid keys (the family counts the bucket's rectangle)
    flops = preset.family.flops(problem)
    nbytes = problem_bytes(problem) if preset.gbps else None
    rows: dict[str, BenchResult] = {}
    ready: dict[str, tuple[Callable[[], Any], float | None, dict[str, str]]] = {}

    def final(name: str, status: str, reason: str, fields: Mapping[str, Any] | None = None
              ) -> None:
        rows[name] = BenchResult(contender=name, status=status, reason=reason, **(fields or {}),
                                 **base)

    def timed(name: str, timing: Any) -> None:
        run, err, fields = ready[name]
        if isinstance(timing, str):  # time_interleaved's reason for a contender it could not time
            return final(name, "unavailable", timing, fields)
        ms = timing.median_ms
        rows[name] = BenchResult(
            contender=name, status="ok", median_ms=ms, spread_ms=timing.spread_ms,
            samples=timing.samples, tflops=flops / (ms * 1e-3) / 1e12, rel_err=err,
            gbps=None if nbytes is None else nbytes / (ms * 1e-3) / 1e9, **fields, **base)

    for name in contenders:
        if on_contender is not None:
            on_contender(name)
        with _failures(lambda reason, name=name: final(name, "unavailable", reason)):
            try:
                ready[name] = point.prepare(name)
            except _Final as decided:
                final(name, decided.status, str(decided), decided.fields)
    if settings.interleave and ready:
        fns = dict((name, run) for name, (run, _, _) in ready.items())
        with _failures(lambda reason: [final(n, "unavailable", reason, ready[n][2])
                                       for n in fns]):
            for name, timing in interleaved_fn(fns, rounds=settings.interleave,
                                               **settings.mode_kwargs()).items():
                timed(name, timing)
    else:
        for name, (run, _, fields) in ready.items():
            with _failures(lambda reason, n=name, f=fields: final(n, "unavailable", reason, f)):
                timed(name, time_fn(run, **settings.timing_kwargs()))
    del point, ready
    _cuda("empty_cache")  # give cached GPU memory back between points
    return [rows[name] for name in contenders]


def run_grid(grid: Grid, settings: BenchSettings, *, progress: Any = None,
             measure: Callable[..., list[BenchResult]] = measure_point) -> list[BenchResult]:
    """Measure every problem of ``grid``; ``progress`` (a rich ``Progress``) is advanced per
    contender when given. Each row gets the device's clocks read right after its point."""
    env = environment(settings.device, grid.preset.family)
    task = None if progress is None else progress.add_task(
        "bench", total=sum(len(grid.contenders_at(p)) for p in grid.problems))
    results: list[BenchResult] = []
    for problem in grid.problems:
        def on_contender(name: str, problem=problem) -> None:
            if progress is not None:
                progress.update(task, description=f"{problem.describe()} · {name}", advance=1)
        rows = measure(grid.preset, problem, grid.contenders_at(problem), settings, env=env,
                       on_contender=on_contender)
        sm, mem = gpu_clocks(settings.device)  # right after timing, while clocks are up
        results += [dataclasses.replace(r, sm_clock=sm, mem_clock=mem) for r in rows]
    return results


# -- the run's environment and ceilings ------------------------------------------------------------

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


def environment(device: int, family: Any) -> dict[str, str]:
    """Device and version fields every row carries (the versions ``family``'s rows record)."""
    from tiledattention import device_info
    from tiledattention.tooling import current_provenance

    info = device_info(device)
    prov = current_provenance(family)
    return dict(device=info.name, arch=info.arch, driver=prov.driver, torch_version=prov.torch,
                cuda_tile_version=prov.cuda_tile)


def matmul_tflops(settings: BenchSettings, n: int = MATMUL_SIZE) -> float:
    """The bf16 matrix-product rate (``n``³, ``torch.matmul`` into a preallocated output): the
    ceiling compute-bound TFLOP/s are read against, timed like the contenders."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(settings.seed)
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n ** 3 / _ceiling_ms(lambda: torch.matmul(a, b, out=c), settings) / 1e9


def copy_gbps(settings: BenchSettings, nbytes: int = COPY_BYTES) -> float:
    """The device-to-device copy rate (``dst.copy_(src)`` of ``nbytes``), in GB/s of bytes read
    plus bytes written: the ceiling a memory-bound kernel's GB/s is read against."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.int32, device=torch.device("cuda", settings.device))
    dst = torch.empty_like(src)
    return 2 * nbytes / _ceiling_ms(lambda: dst.copy_(src), settings) / 1e6


def _ceiling_ms(fn: Callable[[], Any], settings: BenchSettings) -> float:
    """Median ms of ``fn``, timed like a contender (interleaved rounds with ``--interleave``)."""
    from ..measure import time_cuda, time_interleaved

    timing = (time_interleaved({"ceiling": fn}, rounds=settings.interleave)["ceiling"]
              if settings.interleave else time_cuda(fn, **settings.ceiling_kwargs()))
    return timing.median_ms
