"""The forward family's entry point: validate, resolve a schedule (memoised), allocate, launch.

The hot path: a call whose tensors have the signature of an earlier call (shapes, dtypes,
devices, strides, ``causal``, ``scale``, explicit schedule) reuses that call's *plan*
(the chosen schedule's kernel object, grid and constant arguments), so a warm call costs a tuple
build, a dict lookup, an output allocation and the launch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cuda.tile as ct

from .._device import device_info
from .._runtime import Runtime
from ..errors import InputTypeError
from ._family import FORWARD
from ._launch import default_scale, grid_for, kernel_args, kernel_for
from ._problem import Problem, problem_from_arrays
from ._schedule import Schedule

__all__ = ["sdpa"]


class _Plan(NamedTuple):
    out_shape: tuple[int, int, int, int]
    grid: tuple[int, int, int]
    kernel: Any
    scalars: tuple  # the launch arguments after q, k, v, out


def _make_plan(runtime: Runtime, problem: Problem, device_index: int, scale: float | None,
               schedule: Schedule | None) -> _Plan:
    if schedule is None:
        schedule = runtime.resolution(FORWARD, problem, device_index).schedule
    schedule = FORWARD.normalise(problem, schedule)
    scale = default_scale(problem) if scale is None else float(scale)
    return _Plan(
        out_shape=(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
        grid=grid_for(problem, schedule, device_info(device_index).sm_count),
        kernel=kernel_for(schedule),
        # everything after the four arrays, in the one order kernel_args defines
        scalars=kernel_args(None, None, None, None, problem, schedule, scale)[4:],
    )


def sdpa(runtime: Runtime, q: Any, k: Any, v: Any, causal: bool = False,
         scale: float | None = None, *, schedule: Schedule | None = None) -> Any:
    """``tiledattention.sdpa`` on ``runtime`` (see there)."""
    if schedule is not None and not isinstance(schedule, Schedule):
        raise InputTypeError(
            f"schedule must be a tiledattention.Schedule or None; got {type(schedule).__name__}")
    try:  # the signature of a torch call; anything else takes the general path
        signature = ("forward", q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                     q.get_device(), k.get_device(), v.get_device(), q.stride(), k.stride(),
                     v.stride(), causal, scale, schedule)
        plan = runtime.plan(signature)
    except (AttributeError, TypeError):  # not torch tensors (CuPy), or unhashable arguments
        signature, plan = None, None
    if plan is not None:
        import torch

        out = q.new_empty(plan.out_shape)
        ct.launch(torch.cuda.current_stream(signature[7]), plan.grid, plan.kernel,
                  (q, k, v, out, *plan.scalars))
        return out

    problem, kind = problem_from_arrays(q, k, v, causal, scale)
    if kind == "torch":
        import torch

        plan = _make_plan(runtime, problem, q.device.index, scale, schedule)
        if signature is not None:
            runtime.keep_plan(signature, plan)
        out = torch.empty(plan.out_shape, dtype=q.dtype, device=q.device)
        stream = torch.cuda.current_stream(q.device)
    else:
        import cupy

        device_index = q.device.id
        plan = _make_plan(runtime, problem, device_index, scale, schedule)
        with cupy.cuda.Device(device_index):
            out = cupy.empty(plan.out_shape, dtype=q.dtype)
            stream = cupy.cuda.get_current_stream()
    ct.launch(stream, plan.grid, plan.kernel, (q, k, v, out, *plan.scalars))
    return out
