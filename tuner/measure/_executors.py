"""What measuring one candidate produces, and the GPU executor that produces it.

An *executor* runs inside an isolated worker process (``_isolation.py``) and answers four
requests: ``info``, ``warm`` (compile + one launch), ``measure`` (check against the family's
float32 reference, then time) and ``retime`` (interleaved timing of finalists and the family's
baselines). ``GpuExecutor`` makes real launches timed with CUDA events; ``SimulatedExecutor``
(``_simulated.py``) answers from an analytic model so the whole driver is testable on a CPU.
Both serve any kernel family, and both time as their :class:`~._timing.TimingMode` says
(stream or CUDA-graph launches, cold or warm L2), which the search passes them when it builds
them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

from tiledattention import Family

from ._timing import GraphCaptureError, Timing, TimingMode, first_line

__all__ = ["Measurement", "GpuExecutor", "STATUSES", "FAILURES"]

STATUSES = ("ok", "compile-error", "crash", "timeout", "wrong", "infeasible")
#: statuses that say something about the schedule itself: never measured again for the key
FAILURES = STATUSES[1:]


@dataclass(frozen=True)
class Measurement:
    status: str  # one of STATUSES
    reason: str = ""
    timing: Timing | None = None
    rel_err: float | None = None
    seconds: float = 0.0  # wall time spent (compile + check + timing)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class GpuExecutor:
    """Times ``family``'s schedules with real launches on CUDA device ``device_index``, as
    ``timing`` says."""

    def __init__(self, family: Family, device_index: int = 0, *,
                 timing: TimingMode = TimingMode()) -> None:
        self.family = family
        self.device_index = device_index
        self.timing = timing
        self._problem: Any = None
        self._case: Any = None

    def info(self) -> tuple[str, str]:
        from tiledattention import device_info

        dev = device_info(self.device_index)
        return dev.arch, dev.name

    def _case_for(self, problem: Any) -> Any:
        if self._problem != problem:
            self._case = None  # free the previous problem's buffers first
            self._case = self.family.case(problem, self.device_index)
            self._problem = problem
        return self._case

    def warm(self, problem: Any, schedule: Any) -> Measurement:
        """Compile (JIT) and launch once. Compile errors become a measurement, not a crash."""
        import torch

        start = time.perf_counter()
        try:
            self._case_for(problem).launcher(schedule)()
            torch.cuda.synchronize()
        except Exception as exc:  # cuTile raises several types for tileiras failures
            return Measurement("compile-error", first_line(exc),
                               seconds=time.perf_counter() - start)
        return Measurement("ok", seconds=time.perf_counter() - start)

    def measure(self, problem: Any, schedule: Any) -> Measurement:
        import math

        from ._timing import time_cuda

        start = time.perf_counter()
        case = self._case_for(problem)
        run = case.launcher(schedule)
        err = case.error(run)
        tolerance = self.family.tolerance(problem)
        if not math.isfinite(err) or err > tolerance:
            return Measurement("wrong", f"relative L2 error {err:.3g} > {tolerance:g}",
                               rel_err=err, seconds=time.perf_counter() - start)
        try:
            timing = time_cuda(run, **self.timing.timing_kwargs())
        except GraphCaptureError as exc:  # graph timing of a launch that cannot be captured
            return Measurement("crash", first_line(exc), rel_err=err,
                               seconds=time.perf_counter() - start)
        return Measurement("ok", timing=timing, rel_err=err, seconds=time.perf_counter() - start)

    def retime(self, problem: Any, schedules: Mapping[str, Any],
               baselines: bool = True) -> dict[str, Timing | str]:
        """Interleaved timing of ``schedules`` (name -> schedule) and, with ``baselines``, the
        family's baselines; a baseline that cannot run (or, in graph timing, be captured)
        maps to the reason."""
        from ._timing import time_interleaved

        case = self._case_for(problem)
        fns = {name: case.launcher(s) for name, s in schedules.items()}
        result: dict[str, Timing | str] = {}
        for name, run in (case.baselines() if baselines else {}).items():
            try:
                run()  # raises if the backend cannot take this problem
                fns[name] = run
            except Exception as exc:  # backend unavailable for this shape / build
                result[name] = f"unavailable: {first_line(exc, 200)}"
        for name, timed in time_interleaved(fns, rounds=30,
                                            **self.timing.timing_kwargs()).items():
            result[name] = timed if isinstance(timed, Timing) else f"unavailable: {timed}"
        return result
