"""Measurement: isolated worker processes, the GPU and simulated executors, and CUDA timing."""

from ._executors import FAILURES, STATUSES, GpuExecutor, Measurement, first_line
from ._isolation import IsolatedExecutor, WorkerDied, WorkerTimeout
from ._processes import CompilePool, become_worker, interrupts_held, kill_group
from ._simulated import SIMULATED_DEVICE, SimulatedExecutor, SimulatedFaults
from ._timing import Timing, summarize, time_cuda, time_interleaved

__all__ = ["CompilePool", "FAILURES", "GpuExecutor", "IsolatedExecutor", "Measurement",
           "SIMULATED_DEVICE", "STATUSES", "SimulatedExecutor", "SimulatedFaults", "Timing",
           "WorkerDied", "WorkerTimeout", "become_worker", "first_line", "interrupts_held", "kill_group",
           "summarize", "time_cuda", "time_interleaved"]
