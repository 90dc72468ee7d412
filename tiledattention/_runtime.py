"""The runtime entry point: validate, resolve a schedule (memoised), allocate, launch.

The hot path: a call whose tensors have the signature of an earlier call (shapes, dtypes,
devices, last-dim strides, ``causal``, ``scale``, explicit schedule) reuses that call's *plan*
(the validated problem, chosen schedule, kernel object, grid and constant arguments), so a warm
call costs a tuple build, a dict lookup, an output allocation and the launch.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import cuda.tile as ct

from ._device import DeviceInfo, device_info
from .forward._launch import default_scale, grid_for, kernel_args, kernel_for
from .forward._problem import Problem, problem_from_arrays
from .forward._schedule import Schedule

__all__ = ["Runtime"]


class _Plan(NamedTuple):
    out_shape: tuple[int, int, int, int]
    grid: tuple[int, int, int]
    kernel: Any
    scalars: tuple  # the launch arguments after q, k, v, out


class Runtime:
    """Runs attention with the schedule ``resolve(problem, device)`` picks.

    ``resolve`` is called once per (problem, device) and its answer kept: a repeated call costs a
    dict lookup. ``clear()`` forgets the answers (e.g. after new schedules were stored).
    """

    def __init__(self, resolve: Callable[[Problem, DeviceInfo], Any]) -> None:
        self._resolve = resolve
        self._memo: dict[tuple[Problem, int], Any] = {}
        self._plans: dict[tuple, _Plan] = {}

    def resolution(self, problem: Problem, device_index: int) -> Any:
        key = (problem, device_index)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._resolve(problem, device_info(device_index))
        return found

    def clear(self) -> None:
        self._memo.clear()
        self._plans.clear()

    def _plan(self, problem: Problem, device_index: int, scale: float | None,
              schedule: Schedule | None) -> _Plan:
        if schedule is None:
            schedule = self.resolution(problem, device_index).schedule
        scale = default_scale(problem) if scale is None else float(scale)
        return _Plan(
            out_shape=(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
            grid=grid_for(problem, schedule, device_info(device_index).sm_count),
            kernel=kernel_for(schedule),
            # everything after the four arrays, in the one order kernel_args defines
            scalars=kernel_args(None, None, None, None, problem, schedule, scale)[4:],
        )

    def sdpa(self, q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None, *,
             schedule: Schedule | None = None) -> Any:
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TypeError(
                f"schedule must be a tiledattention.Schedule or None; got {type(schedule).__name__}"
            )
        try:  # the signature of a torch call; anything else takes the general path
            signature = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.get_device(),
                         k.get_device(), v.get_device(), q.stride(-1), k.stride(-1),
                         v.stride(-1), causal, scale, schedule)
            plan = self._plans.get(signature)
        except (AttributeError, TypeError):  # not torch tensors (CuPy), or unhashable arguments
            signature, plan = None, None
        if plan is not None:
            import torch

            out = q.new_empty(plan.out_shape)
            ct.launch(torch.cuda.current_stream(signature[6]), plan.grid, plan.kernel,
                      (q, k, v, out, *plan.scalars))
            return out

        problem, kind = problem_from_arrays(q, k, v, causal, scale)
        if kind == "torch":
            import torch

            plan = self._plan(problem, q.device.index, scale, schedule)
            if signature is not None:
                self._plans[signature] = plan
            out = torch.empty(plan.out_shape, dtype=q.dtype, device=q.device)
            stream = torch.cuda.current_stream(q.device)
        else:
            import cupy

            device_index = q.device.id
            plan = self._plan(problem, device_index, scale, schedule)
            with cupy.cuda.Device(device_index):
                out = cupy.empty(plan.out_shape, dtype=q.dtype)
                stream = cupy.cuda.get_current_stream()
        ct.launch(stream, plan.grid, plan.kernel, (q, k, v, out, *plan.scalars))
        return out
