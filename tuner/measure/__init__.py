"""Measurement: isolated worker processes, the GPU and simulated executors, and CUDA timing."""

from ._executors import FAILURES, STATUSES, GpuExecutor, Measurement
from ._isolation import IsolatedExecutor, WorkerDied, WorkerTimeout
from ._processes import CompilePool, become_worker, interrupts_held, kill_group
from ._simulated import SIMULATED_DEVICE, SimulatedExecutor, SimulatedFaults
from ._timing import (L2_STATES, LAUNCHES, TIE_REL_FLOOR, GraphCaptureError, Timing, TimingMode,
                      first_line, graph_cold_unsupported, summarize, tie_noise_ms, time_cuda,
                      time_interleaved, within_noise)

__all__ = ["CompilePool", "FAILURES", "GpuExecutor", "GraphCaptureError", "IsolatedExecutor",
           "L2_STATES", "LAUNCHES", "Measurement", "SIMULATED_DEVICE", "STATUSES",
           "SimulatedExecutor", "SimulatedFaults", "TIE_REL_FLOOR", "Timing", "TimingMode",
           "WorkerDied", "WorkerTimeout", "become_worker", "first_line", "graph_cold_unsupported",
           "interrupts_held", "kill_group", "summarize", "tie_noise_ms", "time_cuda",
           "time_interleaved", "within_noise"]
