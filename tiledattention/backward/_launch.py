"""From a (Problem, BackwardSchedule) pair to the launches of the dQ and dK/dV kernels.

``launches`` builds what a call needs besides the arrays (hinted kernel objects, grids, constant
arguments) once per plan; ``launch`` enqueues the two kernels: dQ first (it writes the row sums
``delta`` the dK/dV kernel reads), then dK/dV, on one stream.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from .._lazy import lazy_module
from .._signature import KernelParameters
from .._problem import Problem, padded_head_dim, row_stat_shape
from ._schedule import BackwardSchedule

ct = lazy_module("cuda.tile", globals(), "ct")
_kernels = lazy_module(f"{__package__}._kernel", globals(), "_kernels")

__all__ = ["DQ_PARAMETERS", "DKDV_PARAMETERS", "dq_constants", "dkdv_constants", "dq_kernel",
           "dkdv_kernel", "Launches", "launches", "launch", "row_stat_shape", "normalise"]

DQ_PARAMETERS = KernelParameters(
    (f"{__package__}._kernel", "attention_bwd_dq"),
    ("Q", "K", "V", "Out", "dO", "Lse", "Delta", "dQ", "qk_scale", "heads_q", "group"))
DKDV_PARAMETERS = KernelParameters(
    (f"{__package__}._kernel", "attention_bwd_dkdv"),
    ("Q", "K", "V", "dO", "Lse", "Delta", "dK", "dV", "qk_scale", "heads_kv", "group"))


def normalise(problem: Problem, schedule: BackwardSchedule) -> BackwardSchedule:
    """``schedule`` with tiles no larger than the problem needs: a query tile past the next power
    of two of ``S_q`` (a key tile past ``S_k``'s) computes only padding. Idempotent."""
    q_cap = max(16, 1 << (problem.seqlen_q - 1).bit_length())
    k_cap = max(16, 1 << (problem.seqlen_k - 1).bit_length())
    changes = {name: cap for name, cap in (("dkdv_tile_m", q_cap), ("dq_tile_m", q_cap),
                                           ("dkdv_tile_n", k_cap), ("dq_tile_n", k_cap))
               if getattr(schedule, name) > cap}
    return schedule.replace(**changes) if changes else schedule


def dq_constants(problem: Problem, schedule: BackwardSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_dq`` by name."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dq_tile_m, "TILE_N": s.dq_tile_n,
            "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "KV_LATENCY": s.kv_latency or 0}


def dkdv_constants(problem: Problem, schedule: BackwardSchedule) -> dict[str, Any]:
    """The ``ct.Constant`` arguments of ``attention_bwd_dkdv`` by name."""
    s = normalise(problem, schedule)
    return {"TILE_M": s.dkdv_tile_m, "TILE_N": s.dkdv_tile_n,
            "TILE_D": padded_head_dim(problem.head_dim), "CAUSAL": problem.causal,
            "BOTTOM_RIGHT": problem.bottom_right, "Q_LATENCY": s.q_latency or 0}


@functools.lru_cache(maxsize=None)
def _hinted(kernel: ct.kernel, occupancy: int, num_worker_warps: int | None) -> ct.kernel:
    """Cached: each kernel object owns a JIT cache, so a new one per launch would recompile."""
    return kernel.replace_hints(occupancy=occupancy, num_worker_warps=num_worker_warps)


def dq_kernel(schedule: BackwardSchedule) -> ct.kernel:
    return _hinted(_kernels.attention_bwd_dq, schedule.dq_occupancy, schedule.dq_worker_warps)


def dkdv_kernel(schedule: BackwardSchedule) -> ct.kernel:
    return _hinted(_kernels.attention_bwd_dkdv, schedule.dkdv_occupancy, schedule.dkdv_worker_warps)


_NO_ARRAYS = {"Q": None, "K": None, "V": None, "dO": None, "Lse": None, "Delta": None}


class Launches(NamedTuple):
    """What one backward call launches, less the arrays: built once per plan."""

    dq_grid: tuple[int, int, int]
    dkdv_grid: tuple[int, int, int]
    dq: Any
    dkdv: Any
    dq_scalars: tuple  # the arguments after qk_scale: heads_q, group, the constants
    dkdv_scalars: tuple  # the arguments after qk_scale: heads_kv, group, the constants
    scale: float
    stat_shape: tuple[int, int, int]


def launches(problem: Problem, schedule: BackwardSchedule, scale: float) -> Launches:
    """The kernel objects, grids and constants of ``normalise(problem, schedule)``."""
    s = normalise(problem, schedule)
    return Launches(
        dq_grid=(math.ceil(problem.seqlen_q / s.dq_tile_m), problem.batch * problem.heads_q, 1),
        dkdv_grid=(math.ceil(problem.seqlen_k / s.dkdv_tile_n),
                   problem.batch * problem.heads_kv, 1),
        dq=dq_kernel(s), dkdv=dkdv_kernel(s),
        # everything after the arrays and the scale, in the order of each kernel's signature
        dq_scalars=DQ_PARAMETERS.ordered(
            {**_NO_ARRAYS, "qk_scale": scale, "heads_q": problem.heads_q,
             "group": problem.group_size, "Out": None, "dQ": None}, dq_constants(problem, s))[9:],
        dkdv_scalars=DKDV_PARAMETERS.ordered(
            {**_NO_ARRAYS, "qk_scale": scale, "heads_kv": problem.heads_kv,
             "group": problem.group_size, "dK": None, "dV": None}, dkdv_constants(problem, s))[9:],
        scale=float(scale), stat_shape=row_stat_shape(problem))


def launch(stream: Any, plan: Launches, q: Any, k: Any, v: Any, out: Any, grad_out: Any,
           lse: Any, delta: Any, dq: Any, dk: Any, dv: Any) -> None:
    """Enqueue the dQ kernel and then the dK/dV kernel on ``stream``. ``lse`` and ``delta`` are
    ``[B, H_q, S_q]`` float32 views (``delta`` is written here); ``dq, dk, dv`` are
    preallocated like ``q, k, v``."""
    ct.launch(stream, plan.dq_grid, plan.dq,
              (q, k, v, out, grad_out, lse, delta, dq, plan.scale, *plan.dq_scalars))
    ct.launch(stream, plan.dkdv_grid, plan.dkdv,
              (q, k, v, grad_out, lse, delta, dk, dv, plan.scale, *plan.dkdv_scalars))
