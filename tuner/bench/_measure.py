"""Measuring one grid point of ``tiledtune bench``: check every contender, then time it.

A point is any grid's point (``BenchPoint`` of the forward grid, ``DecodePoint`` of the decode
grid): it has a ``problem`` (``tiledattention.Problem``: the inputs' shapes, dtype and mask), a
``describe()`` and the ``result_fields()`` its rows carry.

Each contender's output is first compared with a float32 reference (relative L2 error), with the
output's memory poisoned beforehand, then timed with ``tuner.measure.time_cuda`` (L2 flushed
before every sample, the same for everyone) or, with ``--interleave``, together with the others
by ``time_interleaved``. A contender that raises, is wrong, or would not fit in memory becomes a
result with a status and a reason, never a hole in the table.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from ._contenders import Contender, Prepared, reference_attention
from ._grid import TIMING_DEFAULTS, point_gbps, point_tflops
from ._report import BenchResult

__all__ = ["BenchSettings", "TOLERANCES", "measure_point"]

#: Largest relative L2 error, against a float32 reference, that counts as correct.
TOLERANCES = {"bf16": 1e-2, "fp16": 5e-3}


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


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


def measure_point(point: Any, contenders: Sequence[Contender], settings: BenchSettings,
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

    from ..measure import time_cuda, time_interleaved

    time_fn = time_fn or time_cuda
    interleaved_fn = interleaved_fn or time_interleaved
    device = torch.device("cuda", settings.device) if device is None else torch.device(device)
    if free_memory is None:
        free_memory = lambda: torch.cuda.mem_get_info(device)[0]  # noqa: E731
    problem = point.problem
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[problem.dtype]
    base = dict(point.result_fields(), **env)
    gen = torch.Generator(device=device).manual_seed(settings.seed)
    q, k, v = (torch.randn(problem.batch, heads, seqlen, problem.head_dim, generator=gen,
                           device=device, dtype=dtype)
               for heads, seqlen in ((problem.heads_q, problem.seqlen_q),
                                     (problem.heads_kv, problem.seqlen_k),
                                     (problem.heads_kv, problem.seqlen_k)))
    ref = reference_attention(q, k, v, problem.causal, bottom_right=problem.bottom_right,
                              budget_bytes=max(64 << 20,
                                               int(settings.mem_fraction * free_memory()) // 4))
    tol = TOLERANCES[problem.dtype]
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


def _check_one(contender: Contender, point: Any, q, k, v, ref, tol: float,
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


def _result(checked: _Checked, timing: Any, point: Any, base: dict) -> BenchResult:
    return BenchResult(contender=checked.name, status="ok", median_ms=timing.median_ms,
                       spread_ms=timing.spread_ms, samples=timing.samples,
                       tflops=point_tflops(point, timing.median_ms),
                       gbps=point_gbps(point, timing.median_ms), rel_err=checked.rel_err,
                       **_schedule_fields(checked.prepared), **base)


def _failed(checked: _Checked, exc: BaseException, caught: list, base: dict) -> BenchResult:
    return BenchResult(contender=checked.name, status="unavailable",
                       reason=_unavailable_reason(exc, caught),
                       **_schedule_fields(checked.prepared), **base)


def _timed(checked: _Checked, time_one: Callable[[Callable[[], Any]], Any], point: Any,
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
                    rounds: int, point: Any, base: dict) -> dict[int, BenchResult]:
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
