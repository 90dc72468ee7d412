"""The forward family's launch plan: one kernel, its grid and its constant arguments, kept by
``sdpa`` per call signature and K/V layout (``Family.plan_key``'s default)."""

from __future__ import annotations

from typing import Any

from .. import _device
from .. import _plans as hot
from .._plans import Plan, clear_of, contiguous_like, out_spans
from .._lazy import lazy_module
from .._problem import Problem, default_scale
from ._launch import grid_for, kernel_args, kernel_for, normalise
from ._schedule import Schedule

ct = lazy_module("cuda.tile", globals(), "ct")

__all__ = ["ForwardPlan", "forward_plan"]


class ForwardPlan(Plan):
    __slots__ = ("out_shape", "grid", "kernel", "scalars", "like", "spans")

    def __init__(self, out_shape: tuple, grid: tuple, kernel: Any, scalars: tuple,
                 like: bool = False, spans: tuple | None = None) -> None:
        self.out_shape = out_shape
        self.grid = grid
        self.kernel = kernel
        self.scalars = scalars  # the launch arguments after q, k, v, out
        self.like = like  # q is contiguous: allocate out with torch.empty_like(q), the cheapest
        self.spans = spans  # bytes of q, k, v, out (calls with out=)

    def for_torch(self, q: Any, out: Any, k: Any, v: Any) -> "ForwardPlan":
        return ForwardPlan(self.out_shape, self.grid, self.kernel, self.scalars,
                           contiguous_like(q), out_spans(q, out, k, v))

    def run(self, runtime: Any, q: Any, k: Any, v: Any, device: int, out: Any) -> Any:
        if out is None:
            out = hot.empty_like(q) if self.like else q.new_empty(self.out_shape)
        else:
            spans = self.spans
            if not clear_of(out, spans[3], q, spans[0], k, spans[1], v, spans[2]):
                return None
        ct.launch(hot.raw_stream(device), self.grid, self.kernel, (q, k, v, out) + self.scalars)
        return out

    def run_cupy(self, q: Any, k: Any, v: Any, out: Any, problem: Problem) -> Any:
        import cupy

        with cupy.cuda.Device(q.device.id):
            if out is None:
                out = cupy.empty(self.out_shape, dtype=q.dtype)
            ct.launch(cupy.cuda.get_current_stream(), self.grid, self.kernel,
                      (q, k, v, out) + self.scalars)
        return out


def forward_plan(problem: Problem, schedule: Schedule, device_index: int,
                 scale: float | None) -> ForwardPlan:
    schedule = normalise(problem, schedule)
    scale = default_scale(problem) if scale is None else float(scale)
    return ForwardPlan(
        out_shape=(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
        grid=grid_for(problem, schedule, _device.device_info(device_index).sm_count),
        kernel=kernel_for(schedule),
        # everything after the four arrays, in the one order kernel_args defines
        scalars=tuple(kernel_args(None, None, None, None, problem, schedule, scale)[4:]),
    )
