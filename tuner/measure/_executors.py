"""What measuring one candidate produces, and the executors that produce it.

An *executor* runs inside an isolated worker process (``_isolation.py``) and answers four
requests: ``info``, ``warm`` (compile + one launch), ``measure`` (check against the reference,
then time) and ``retime`` (interleaved timing of finalists and baselines). Two executors exist:
``GpuExecutor`` (real cuTile launches, CUDA events) and ``SimulatedExecutor`` (a deterministic
analytic cost model with injected faults) so the whole driver is testable without a GPU.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Mapping

from tiledattention import Problem, Schedule

from .timing import Timing

__all__ = ["Measurement", "GpuExecutor", "SimulatedExecutor", "SimulatedFaults", "TOLERANCE",
           "BASELINES", "STATUSES", "FAILURES"]

#: relative L2 error a candidate may have against the float32 reference
TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3}
#: contenders timed beside the finalists (name -> what it is)
BASELINES = ("default", "torch-cudnn", "torch-flash")

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


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------
class GpuExecutor:
    """Times schedules with real launches on CUDA device ``device_index``."""

    def __init__(self, device_index: int = 0) -> None:
        self.device_index = device_index
        self._problem: Problem | None = None
        self._inputs: tuple = ()

    def info(self) -> tuple[str, str]:
        from tiledattention._device import device_info

        dev = device_info(self.device_index)
        return dev.arch, dev.name

    def _setup(self, problem: Problem):
        import torch

        if self._problem != problem:
            torch.cuda.set_device(self.device_index)
            dtype = torch.bfloat16 if problem.dtype == "bf16" else torch.float16
            gen = torch.Generator(device="cuda").manual_seed(1234)

            def rand(heads, seqlen):
                return torch.randn(problem.batch, heads, seqlen, problem.head_dim, dtype=dtype,
                                   device="cuda", generator=gen)

            q = rand(problem.heads_q, problem.seqlen_q)
            k = rand(problem.heads_kv, problem.seqlen_k)
            v = rand(problem.heads_kv, problem.seqlen_k)
            group = problem.group_size
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float().repeat_interleave(group, 1),
                v.float().repeat_interleave(group, 1), is_causal=problem.causal)
            out = torch.empty_like(q)
            self._inputs = (q, k, v, out, ref)
            self._problem = problem
        return self._inputs

    def _launcher(self, problem: Problem, schedule: Schedule):
        import torch

        from tiledattention._device import device_info
        from tiledattention._launch import default_scale, launch

        q, k, v, out, _ = self._setup(problem)
        scale = default_scale(problem)
        sm_count = device_info(self.device_index).sm_count

        def run():
            launch(torch.cuda.current_stream(), q, k, v, out, problem, schedule, scale, sm_count)

        return run

    def warm(self, problem: Problem, schedule: Schedule) -> Measurement:
        """Compile (JIT) and launch once. Compile errors become a measurement, not a crash."""
        import torch

        start = time.perf_counter()
        try:
            self._launcher(problem, schedule)()
            torch.cuda.synchronize()
        except Exception as exc:  # cuTile raises several types for tileiras failures
            lines = str(exc).strip().splitlines()
            return Measurement("compile-error", f"{type(exc).__name__}: {lines[0] if lines else ''}"
                               [:500], seconds=time.perf_counter() - start)
        return Measurement("ok", seconds=time.perf_counter() - start)

    def measure(self, problem: Problem, schedule: Schedule) -> Measurement:
        import torch

        from .timing import time_cuda

        start = time.perf_counter()
        q, k, v, out, ref = self._setup(problem)
        run = self._launcher(problem, schedule)
        out.fill_(float("nan"))
        run()
        err = (torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)).item()
        if not math.isfinite(err) or err > TOLERANCE[problem.dtype]:
            return Measurement("wrong", f"relative L2 error {err:.3g} > "
                               f"{TOLERANCE[problem.dtype]:g}", rel_err=err,
                               seconds=time.perf_counter() - start)
        timing = time_cuda(run)
        return Measurement("ok", timing=timing, rel_err=err, seconds=time.perf_counter() - start)

    def _baseline(self, problem: Problem, name: str):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v, _, _ = self._setup(problem)
        backend = {"torch-cudnn": SDPBackend.CUDNN_ATTENTION,
                   "torch-flash": SDPBackend.FLASH_ATTENTION}[name]
        gqa = problem.group_size > 1

        def run():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=problem.causal, enable_gqa=gqa)

        run()  # raises if the backend cannot take this shape
        return run

    def retime(self, problem: Problem, schedules: Mapping[str, Schedule],
               baselines: tuple[str, ...] = ()) -> dict[str, Timing | str]:
        """Interleaved timing of ``schedules`` (name -> schedule) and torch baselines; a baseline
        that cannot run maps to the reason."""
        from .timing import time_interleaved

        fns = {name: self._launcher(problem, s) for name, s in schedules.items()}
        result: dict[str, Timing | str] = {}
        for name in baselines:
            try:
                fns[name] = self._baseline(problem, name)
            except Exception as exc:  # backend unavailable for this shape / build
                result[name] = f"unavailable: {str(exc).strip().splitlines()[0][:200]}"
        result.update(time_interleaved(fns, rounds=30))
        return result


# --------------------------------------------------------------------------------------------
# Simulation
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimulatedFaults:
    """Schedules (by ``Schedule.key``) that fail in a given way in the simulation."""

    compile_error: frozenset[str] = frozenset()
    crash: frozenset[str] = frozenset()  # the worker process dies (like an illegal address)
    hang: frozenset[str] = frozenset()  # the launch never returns
    wrong: frozenset[str] = frozenset()  # the output is wrong
    delay_s: float = 0.0  # wall time each measurement takes (to test overlap and deadlines)


@dataclass
class SimulatedExecutor:
    """A deterministic analytic cost model of the kernel on an sm_90-like GPU.

    time = flops / (peak · efficiency(schedule, problem)) with a small deterministic noise per
    (schedule, sample). Its optimum is unique; ``optimum()`` finds it by brute force.
    """

    arch: str = "sm_90"
    faults: SimulatedFaults = field(default_factory=SimulatedFaults)
    noise: float = 0.003

    def info(self) -> tuple[str, str]:
        return self.arch, "Simulated GPU"

    @staticmethod
    def efficiency(problem: Problem, s: Schedule) -> float:
        tiles = {(64, 128): 1.0, (64, 64): 0.9, (128, 64): 0.86, (128, 128): 0.7,
                 (64, 32): 0.75, (128, 32): 0.72, (256, 64): 0.4, (256, 32): 0.38,
                 (256, 128): 0.3}.get((s.tile_m, s.tile_n), 0.5)
        occ = {1: 0.7, 2: 1.0, 3: 0.93}.get(s.occupancy, 0.8)
        lat = 1.0 + 0.02 * (s.k_latency == 2) - 0.01 * (s.k_latency == 4) + 0.01 * (s.v_latency == 4)
        eff = tiles * occ * lat
        eff *= 1.06 if s.exp2 else 1.0
        eff *= 1.02 if s.approx_div else 1.0
        eff *= 1.08 if s.k_transposed else 1.0
        eff *= 1.01 if s.kv_sawtooth else 1.0
        paired = s.paired_tiles and problem.causal
        eff *= 1.03 if (s.longest_first and problem.causal and not paired) else 1.0
        eff *= 1.06 if paired else 1.0
        eff *= 0.99 if s.unchecked_loads else 1.0
        eff *= 0.97 if s.num_ctas > 1 else 1.0
        return 0.72 * eff

    def model_ms(self, problem: Problem, s: Schedule) -> float:
        return problem.flops / (790e12 * self.efficiency(problem, s)) * 1e3

    def _noisy(self, problem: Problem, s: Schedule, count: int, salt: int) -> list[float]:
        import random

        rng = random.Random(f"{s.key}:{problem.as_tuple()}:{salt}")
        base = self.model_ms(problem, s)
        return [base * (1 + rng.gauss(0, self.noise)) for _ in range(count)]

    def _fault(self, s: Schedule) -> str | None:
        for kind in ("compile_error", "crash", "hang", "wrong"):
            if s.key in getattr(self.faults, kind):
                return kind
        return None

    def warm(self, problem: Problem, schedule: Schedule) -> Measurement:
        fault = self._fault(schedule)
        if fault == "compile_error":
            return Measurement("compile-error", "CompileError: simulated tileiras failure")
        if fault == "crash":
            os._exit(77)  # what an illegal memory access does to a CUDA process
        if fault == "hang":
            time.sleep(3600)
        return Measurement("ok")

    def measure(self, problem: Problem, schedule: Schedule) -> Measurement:
        from .timing import summarize

        if self.faults.delay_s:
            time.sleep(self.faults.delay_s)
        if self._fault(schedule) == "wrong":
            return Measurement("wrong", "relative L2 error 0.5 > tolerance", rel_err=0.5)
        return Measurement("ok", timing=summarize(self._noisy(problem, schedule, 30, 0)),
                           rel_err=1e-3, seconds=self.faults.delay_s)

    def retime(self, problem: Problem, schedules: Mapping[str, Schedule],
               baselines: tuple[str, ...] = ()) -> dict[str, Timing | str]:
        from .timing import summarize

        result: dict[str, Timing | str] = {
            name: summarize(self._noisy(problem, s, 30, 1)) for name, s in schedules.items()}
        for name in baselines:
            factor = {"torch-cudnn": 0.95, "torch-flash": 1.5}.get(name)
            result[name] = (summarize([self.model_ms(problem, _BEST_GUESS) * factor] * 5)
                            if factor else "unavailable: not simulated")
        return result

    def optimum(self, problem: Problem, schedules) -> Schedule:
        """The schedule with the best modelled time among ``schedules`` that do not fail."""
        ok = [s for s in schedules if self._fault(s) is None]
        return min(ok, key=lambda s: self.model_ms(problem, s))


_BEST_GUESS = Schedule(tile_m=64, tile_n=128, occupancy=2, exp2=True, approx_div=True,
                       k_transposed=True)
