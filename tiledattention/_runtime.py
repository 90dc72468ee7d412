"""The runtime entry point: validate, resolve a schedule (memoised), allocate, launch."""

from __future__ import annotations

from typing import Any, Callable

from ._device import DeviceInfo, device_info
from ._launch import default_scale, launch
from ._problem import Problem, problem_from_arrays
from ._schedule import Schedule

__all__ = ["Runtime"]


class Runtime:
    """Runs attention with the schedule ``resolve(problem, device)`` picks.

    ``resolve`` is called once per (problem, device) and its answer kept: a repeated call costs a
    dict lookup. ``clear()`` forgets the answers (e.g. after new schedules were stored).
    """

    def __init__(self, resolve: Callable[[Problem, DeviceInfo], Any]) -> None:
        self._resolve = resolve
        self._memo: dict[tuple[Problem, int], Any] = {}

    def resolution(self, problem: Problem, device_index: int) -> Any:
        key = (problem, device_index)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._resolve(problem, device_info(device_index))
        return found

    def clear(self) -> None:
        self._memo.clear()

    def sdpa(self, q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None, *,
             schedule: Schedule | None = None) -> Any:
        problem, kind = problem_from_arrays(q, k, v, causal, scale)
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TypeError(
                f"schedule must be a tiledattention.Schedule or None; got {type(schedule).__name__}"
            )
        if kind == "torch":
            import torch

            device_index = q.device.index
            if schedule is None:
                schedule = self.resolution(problem, device_index).schedule
            out = torch.empty((problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
                              dtype=q.dtype, device=q.device)
            stream = torch.cuda.current_stream(device_index)
        else:
            import cupy

            device_index = q.device.id
            if schedule is None:
                schedule = self.resolution(problem, device_index).schedule
            with cupy.cuda.Device(device_index):
                out = cupy.empty(
                    (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
                    dtype=q.dtype,
                )
                stream = cupy.cuda.get_current_stream()
        launch(stream, q, k, v, out, problem, schedule,
               default_scale(problem) if scale is None else scale)
        return out
