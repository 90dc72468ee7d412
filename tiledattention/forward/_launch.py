"""From a (Problem, Schedule) pair to a cuTile launch: hinted kernel objects, grid, arguments.

The long argument tuple of ``attention_fwd`` is written once, here (``kernel_args``); the launcher,
the compile-only exporter and the tuner all go through it.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import cuda.tile as ct

from ._kernel import attention_fwd
from ._problem import Problem, padded_head_dim
from ._schedule import Schedule

__all__ = ["hinted_kernel", "kernel_for", "grid_for", "kernel_args", "constant_args",
           "default_scale", "launch"]


@functools.lru_cache(maxsize=None)
def hinted_kernel(occupancy: int, num_ctas: int, opt_level: int,
                  num_worker_warps: int | None) -> ct.kernel:
    """The template with these kernel options. Cached: each object owns a JIT cache, so making
    a new one per launch would recompile every time."""
    return attention_fwd.replace_hints(occupancy=occupancy, num_ctas=num_ctas, opt_level=opt_level,
                                       num_worker_warps=num_worker_warps)


def kernel_for(schedule: Schedule) -> ct.kernel:
    return hinted_kernel(schedule.occupancy, schedule.num_ctas, schedule.opt_level,
                         schedule.num_worker_warps)


def grid_for(problem: Problem, schedule: Schedule, sm_count: int) -> tuple[int, int, int]:
    """The launch grid; ``sm_count`` is the device's number of SMs (persistent schedules)."""
    slots = math.ceil(problem.seqlen_q / schedule.tile_m)  # work items per (batch x head)
    if _paired(problem, schedule):
        slots = math.ceil(slots / 2)
    if schedule.persistent:
        work = slots * problem.batch * problem.heads_q
        return (min(work, sm_count * schedule.occupancy), 1, 1)
    return (slots, problem.batch * problem.heads_q, 1)


def _paired(problem: Problem, schedule: Schedule) -> bool:
    return schedule.paired_tiles and problem.causal


def default_scale(problem: Problem) -> float:
    return 1.0 / math.sqrt(problem.head_dim)


def constant_args(problem: Problem, schedule: Schedule) -> tuple:
    """The compile-time constants of ``attention_fwd``, in parameter order after ``group``."""
    tile_d = padded_head_dim(problem.head_dim)
    even_k = problem.seqlen_k % schedule.tile_n == 0
    even_all = even_k and problem.seqlen_q % schedule.tile_m == 0 and tile_d == problem.head_dim
    return (
        schedule.tile_m,
        schedule.tile_n,
        tile_d,
        problem.causal,
        even_k,
        schedule.exp2,
        schedule.approx_div,
        schedule.k_transposed,
        schedule.k_latency or 0,
        schedule.v_latency or 0,
        schedule.allow_tma,
        schedule.kv_sawtooth,
        schedule.longest_first and problem.causal and not schedule.paired_tiles,
        not (schedule.unchecked_loads and even_all),
        schedule.split_masked,
        schedule.persistent,
        _paired(problem, schedule),
    )


def kernel_args(q: Any, k: Any, v: Any, out: Any, problem: Problem, schedule: Schedule,
                scale: float) -> tuple:
    return (q, k, v, out, float(scale), problem.heads_q, problem.group_size,
            *constant_args(problem, schedule))


def launch(stream: Any, q: Any, k: Any, v: Any, out: Any, problem: Problem,
           schedule: Schedule, scale: float, sm_count: int) -> None:
    """Enqueue one forward pass on ``stream`` (validated inputs, preallocated ``out``)."""
    ct.launch(stream, grid_for(problem, schedule, sm_count), kernel_for(schedule),
              kernel_args(q, k, v, out, problem, schedule, scale))
