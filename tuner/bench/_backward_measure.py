"""Measuring one point of the backward grid: check every contender, then time its backward and
its forward + backward step.

The check runs each contender's ``backward()`` once (which runs its forward, untimed), then
compares a second, poisoned run's ``(dq, dk, dv)`` and a poisoned ``forward_backward()``'s
output and gradients with float32 references (``reference_gradients``); the relative L2 error
of a phase is the largest of its tensors'. The tolerance is the backward family's
(``BACKWARD.tolerance``). Phases that pass are timed like the other grids' contenders
(``tuner.measure``: L2 flushed before every sample; with ``--interleave`` the contenders of a
point take turns, one phase at a time). Each contender gets one row per phase
(``BenchResult.phase``); TFLOP/s counts the backward as 2.5x the forward's FLOPs
(``BACKWARD.flops``, FlashAttention's count) and a step as 3.5x. A contender that raises, is
wrong, or would time what another does becomes rows with a status and a reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ._backward_contenders import (BackwardContender, BackwardPrepared, SameSchedule,
                                   reference_gradients)
from ._backward_grid import BACKWARD_PHASES
from ._measure import BenchSettings, _captured_warnings, _rel_err, _release, \
    _unavailable_reason
from ._report import BenchResult

__all__ = ["measure_backward_point", "phase_flops"]

_GRADS = ("dq", "dk", "dv")


def phase_flops(problem: Any) -> dict[str, float]:
    """FLOPs of each phase: the backward ``BACKWARD.flops`` (2.5x the forward's), a step the
    forward's plus that."""
    from tiledattention import BACKWARD

    backward = BACKWARD.flops(problem)
    return {"backward": backward, "forward+backward": problem.flops + backward}


@dataclass(frozen=True)
class _Checked:
    """A contender whose ``phase`` computed the right answer at this point, ready to time."""

    name: str
    prepared: BackwardPrepared
    phase: str
    rel_err: float


def _poison(tensors: Sequence[Any]) -> None:
    """Hold NaN-filled blocks of the sizes of ``tensors`` at once, then free them: torch's
    caching allocator hands them to the next allocations of those sizes (the outputs), so a
    kernel that leaves part of an output unwritten leaves NaN, not an earlier run's numbers."""
    import torch

    blocks = [torch.empty(t.numel() * t.element_size() // 2, dtype=torch.float16,
                          device=t.device).fill_(float("nan")) for t in tensors]
    del blocks


def _errors(values: Sequence[Any], references: Sequence[Any], names: Sequence[str]
            ) -> tuple[float, str]:
    """The largest relative L2 error (``inf`` when any is not finite) and each one, named."""
    if not isinstance(values, (tuple, list)) or len(values) != len(references):
        raise ValueError(f"expected {len(references)} tensors ({', '.join(names)}); got "
                         f"{type(values).__name__}")
    errs = [_rel_err(x, r) for x, r in zip(values, references)]
    worst = max(errs) if all(math.isfinite(e) for e in errs) else math.inf
    return worst, ", ".join(f"{n} {e:.3g}" for n, e in zip(names, errs))


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fields(prepared: BackwardPrepared | None) -> dict[str, str]:
    if prepared is None:
        return {}
    return dict(schedule=prepared.schedule, lookup_source=prepared.lookup_source,
                lookup_detail=prepared.lookup_detail)


def _check_one(contender: BackwardContender, point: Any, inputs: tuple, ref: tuple,
               tol: float, base: dict, arch: str) -> list[BenchResult | _Checked]:
    """One entry per phase: a final row (skipped, unavailable, wrong) or the checked phase."""
    import torch

    q, k, v, grad_out = inputs
    prepared = None

    def rows(status: str, reason: str, **extra) -> list[BenchResult | _Checked]:
        return [BenchResult(contender=contender.name, status=status, reason=reason, phase=phase,
                            **_fields(prepared), **extra, **base) for phase in BACKWARD_PHASES]

    with _captured_warnings() as caught:
        try:
            prepared = contender.prepare(q, k, v, grad_out, point, arch)
            with prepared.context():
                prepared.backward()  # the forward the backward-only timing follows
                _sync(q.device)
                _poison((q, k, v))
                grads = prepared.backward()
                _sync(q.device)
                backward = _errors(grads, ref[1:], _GRADS)
                del grads
                _poison((q, q, k, v))
                out, grads = prepared.forward_backward()
                _sync(q.device)
                step = _errors((out, *grads), ref, ("out",) + _GRADS)
                del out, grads
        except SameSchedule as exc:
            return rows("skipped", str(exc))
        except Exception as exc:  # failures of contenders are data, not crashes
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                _release(q.device)
            return rows("unavailable", _unavailable_reason(exc, caught))
    entries: list[BenchResult | _Checked] = []
    for phase, (err, detail) in zip(BACKWARD_PHASES, (backward, step)):
        if err <= tol:
            entries.append(_Checked(contender.name, prepared, phase, err))
        else:
            entries.append(BenchResult(
                contender=contender.name, status="wrong", phase=phase,
                reason=f"err={err:.3g} > {tol:g} ({detail})",
                rel_err=err if math.isfinite(err) else None, **_fields(prepared), **base))
    return entries


def _call(checked: _Checked) -> Callable[[], Any]:
    fn = checked.prepared.backward if checked.phase == "backward" \
        else checked.prepared.forward_backward

    def run() -> Any:
        with checked.prepared.context():
            return fn()
    return run


def _result(checked: _Checked, timing: Any, flops: Mapping[str, float],
            base: dict) -> BenchResult:
    return BenchResult(contender=checked.name, status="ok", phase=checked.phase,
                       median_ms=timing.median_ms, spread_ms=timing.spread_ms,
                       samples=timing.samples,
                       tflops=flops[checked.phase] / (timing.median_ms * 1e-3) / 1e12,
                       rel_err=checked.rel_err, **_fields(checked.prepared), **base)


def _failed(checked: _Checked, exc: BaseException, caught: list, base: dict) -> BenchResult:
    return BenchResult(contender=checked.name, status="unavailable", phase=checked.phase,
                       reason=_unavailable_reason(exc, caught), **_fields(checked.prepared),
                       **base)


def measure_backward_point(point: Any, contenders: Sequence[BackwardContender],
                           settings: BenchSettings, *, env: Mapping[str, str],
                           on_contender: Callable[[str], None] | None = None,
                           time_fn: Callable[..., Any] | None = None,
                           interleaved_fn: Callable[..., Any] | None = None, device: Any = None,
                           free_memory: Callable[[], int] | None = None) -> list[BenchResult]:
    """Check, then time, every contender's two phases at ``point`` (a ``BackwardPoint``); two
    rows per contender (``BACKWARD_PHASES`` order), whatever happens. The keywords are
    ``measure_point``'s (tests replace the CUDA timing and memory query to run on the CPU)."""
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
    shapes = ((problem.heads_q, problem.seqlen_q), (problem.heads_kv, problem.seqlen_k),
              (problem.heads_kv, problem.seqlen_k), (problem.heads_q, problem.seqlen_q))
    inputs = tuple(torch.randn(problem.batch, heads, seqlen, problem.head_dim, generator=gen,
                               device=device, dtype=dtype) for heads, seqlen in shapes)
    ref = reference_gradients(*inputs, problem.causal, bottom_right=problem.bottom_right,
                              budget_bytes=max(64 << 20,
                                               int(settings.mem_fraction * free_memory()) // 4))
    from tiledattention import BACKWARD

    tol = BACKWARD.tolerance(problem)
    flops = phase_flops(problem)
    entries: list[BenchResult | _Checked] = []
    for contender in contenders:
        if on_contender is not None:
            on_contender(contender.name)
        entries += _check_one(contender, point, inputs, ref, tol, base, env.get("arch", ""))
        _release(device)
    results: list[BenchResult | None] = [e if isinstance(e, BenchResult) else None
                                         for e in entries]
    for phase in BACKWARD_PHASES:
        todo = {i: e for i, e in enumerate(entries) if isinstance(e, _Checked)
                and e.phase == phase}
        if not todo:
            continue
        if settings.interleave:
            with _captured_warnings() as caught:
                try:
                    timings = interleaved_fn({c.name: _call(c) for c in todo.values()},
                                             rounds=settings.interleave)
                except Exception as exc:  # one failing contender spoils the round: all listed
                    timings = exc
            for i, c in todo.items():
                results[i] = (_failed(c, timings, caught, base)
                              if isinstance(timings, Exception)
                              else _result(c, timings[c.name], flops, base))
            continue
        for i, c in todo.items():
            with _captured_warnings() as caught:
                try:
                    timing = time_fn(_call(c), **settings.timing_kwargs())
                except Exception as exc:  # failures of contenders are data, not crashes
                    results[i] = _failed(c, exc, caught, base)
                    continue
            results[i] = _result(c, timing, flops, base)
    del inputs, ref, entries
    _release(device)
    return results
