"""A simulated GPU: any kernel family's candidates timed by an analytic model, with injected
faults, so the whole search driver runs (and is tested) on a CPU.

The time of a schedule is its family's ``FamilySpace.model_ms`` when the family has one, else a
generic deterministic model (a fixed pseudo-random efficiency per normalised schedule), times a
small deterministic noise per (schedule, sample). That model is of stream launches with a cold
L2; the other timing modes shift it by illustrative amounts (a graph launch saves a few µs of
launch path, a warm L2 a few percent), so that a test sees which mode reached the executor.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from db import canonical_json
from search_spaces import family_space
from tiledattention import FORWARD, Family

from ._executors import Measurement
from ._timing import Timing, TimingMode, summarize

__all__ = ["SimulatedExecutor", "SimulatedFaults", "SIMULATED_DEVICE"]

SIMULATED_DEVICE = "Simulated GPU"
#: what the simulated baselines take, relative to the modelled time of the family's default
_BASELINE_FACTORS = {"torch-cudnn": 0.95, "torch-flash": 1.5}
#: what a graph launch saves over a stream launch (at most a tenth of the time), in ms
_GRAPH_SAVES_MS = 0.004
#: a warm L2's time relative to a cold one's
_WARM_L2_FACTOR = 0.97


@dataclass(frozen=True)
class SimulatedFaults:
    """Schedules (by ``key`` of the normalised schedule) that fail in a given way."""

    compile_error: frozenset[str] = frozenset()
    crash: frozenset[str] = frozenset()  # the worker process dies (like an illegal address)
    hang: frozenset[str] = frozenset()  # the launch never returns
    wrong: frozenset[str] = frozenset()  # the output is wrong
    delay_s: float = 0.0  # wall time each measurement takes (to test overlap and deadlines)


def _generic_ms(family: Family, problem: Any, schedule: Any) -> float:
    digest = hashlib.sha256(f"{family.name}:{schedule.key}".encode()).digest()
    efficiency = 0.3 + 0.6 * int.from_bytes(digest[:4], "big") / 2 ** 32
    return family.flops(problem) / (500e12 * efficiency) * 1e3


@dataclass
class SimulatedExecutor:
    """An sm_90-like GPU answering for ``family`` from its analytic model."""

    arch: str = "sm_90"
    faults: SimulatedFaults = field(default_factory=SimulatedFaults)
    noise: float = 0.003
    family: Family = FORWARD
    timing: TimingMode = TimingMode()

    def info(self) -> tuple[str, str]:
        return self.arch, SIMULATED_DEVICE

    def model_ms(self, problem: Any, schedule: Any) -> float:
        schedule = self.family.normalise(problem, schedule)
        model = family_space(self.family.name).model_ms
        if model is None:
            return _generic_ms(self.family, problem, schedule)
        return model(problem, schedule)

    def _in_mode(self, ms: float) -> float:
        """A stream, cold-L2 time ``ms`` as this executor's timing mode measures it."""
        if self.timing.graph:
            ms -= min(_GRAPH_SAVES_MS, 0.1 * ms)
        return ms * (_WARM_L2_FACTOR if not self.timing.flush_l2 else 1.0)

    def timed_ms(self, problem: Any, schedule: Any) -> float:
        """The noiseless time this executor measures: :meth:`model_ms` in its timing mode."""
        return self._in_mode(self.model_ms(problem, schedule))

    def _noisy(self, problem: Any, s: Any, count: int, salt: int) -> list[float]:
        rng = random.Random(f"{s.key}:{canonical_json(problem.to_dict())}:{salt}")
        base = self.timed_ms(problem, s)
        return [base * (1 + rng.gauss(0, self.noise)) for _ in range(count)]

    def _fault(self, problem: Any, s: Any) -> str | None:
        key = self.family.normalise(problem, s).key
        for kind in ("compile_error", "crash", "hang", "wrong"):
            if key in getattr(self.faults, kind):
                return kind
        return None

    def warm(self, problem: Any, schedule: Any) -> Measurement:
        fault = self._fault(problem, schedule)
        if fault == "compile_error":
            return Measurement("compile-error", "CompileError: simulated tileiras failure")
        if fault == "crash":
            os._exit(77)  # what an illegal memory access does to a CUDA process
        if fault == "hang":
            time.sleep(3600)
        return Measurement("ok")

    def measure(self, problem: Any, schedule: Any) -> Measurement:
        if self.faults.delay_s:
            time.sleep(self.faults.delay_s)
        if self._fault(problem, schedule) == "wrong":
            return Measurement("wrong", "relative L2 error 0.5 > tolerance", rel_err=0.5)
        return Measurement("ok", timing=summarize(self._noisy(problem, schedule, 30, 0)),
                           rel_err=1e-3, seconds=self.faults.delay_s)

    def retime(self, problem: Any, schedules: Mapping[str, Any],
               baselines: bool = True) -> dict[str, Timing | str]:
        result: dict[str, Timing | str] = {
            name: summarize(self._noisy(problem, s, 30, 1)) for name, s in schedules.items()}
        if baselines:
            reference = self.timed_ms(problem, self.family.default_schedule(self.arch, problem))
            for name, factor in _BASELINE_FACTORS.items():
                result[name] = summarize([reference * factor] * 5)
        return result

    def optimum(self, problem: Any, schedules: Any) -> Any:
        """The schedule with the best modelled time among ``schedules`` that do not fail."""
        ok = [s for s in schedules if self._fault(problem, s) is None]
        return min(ok, key=lambda s: self.model_ms(problem, s))
