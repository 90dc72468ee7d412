"""The forward family's launch plan: one kernel, its grid and its constant arguments, kept by
``sdpa`` per call signature and K/V layout (``Family.plan_key``'s default). A problem with sinks
takes the call's sink logits into the ``Sinks`` slot of the arguments on each launch."""

from __future__ import annotations

from typing import Any

from ...core import _device
from ...core import _plans as hot
from ...core import _aot
from ...core._plans import Plan, clear_of, contiguous_like, out_spans
from ...core._problem import Problem, default_scale
from ._launch import (PreparedLaunch, Slot, grid_for, kernel_args, kernel_for, normalise,
                      slots, transpose_values)
from ._schedule import Schedule

__all__ = ["ForwardPlan", "forward_plan", "Fp8ForwardPlan", "fp8_forward_plan", "dense_launch"]


class ForwardPlan(Plan):
    __slots__ = ("out_shape", "grid", "kernel", "scalars", "like", "spans", "before_sinks",
                 "after_sinks")

    def __init__(self, out_shape: tuple, grid: tuple, kernel: Any, scalars: tuple,
                 like: bool = False, spans: tuple | None = None,
                 sinks_at: int | None = None) -> None:
        self.out_shape = out_shape
        self.grid = grid
        self.kernel = kernel
        self.scalars = scalars  # the launch arguments after q, k, v, out
        self.like = like  # q is contiguous: allocate out with torch.empty_like(q), the cheapest
        self.spans = spans  # bytes of q, k, v, out (calls with out=)
        # with sinks: the scalars before and after the Sinks slot (scalars[sinks_at])
        self.before_sinks = None if sinks_at is None else scalars[:sinks_at]
        self.after_sinks = None if sinks_at is None else scalars[sinks_at + 1:]

    @property
    def sinks_at(self) -> int | None:
        """The index of the ``Sinks`` slot in :attr:`scalars` (a problem with sinks), or None."""
        return None if self.before_sinks is None else len(self.before_sinks)

    def for_torch(self, q: Any, out: Any, k: Any, v: Any) -> "ForwardPlan":
        return ForwardPlan(self.out_shape, self.grid, self.kernel, self.scalars,
                           contiguous_like(q), out_spans(q, out, k, v), self.sinks_at)

    def _args(self, q: Any, k: Any, v: Any, out: Any, sinks: Any) -> tuple:
        """The launch arguments; ``sinks`` (the validated float32 ``[H_q]`` logits, or None)
        into the ``Sinks`` slot."""
        if sinks is None:
            return (q, k, v, out) + self.scalars
        return (q, k, v, out) + self.before_sinks + (sinks,) + self.after_sinks

    def run(self, runtime: Any, q: Any, k: Any, v: Any, device: int, out: Any,
            sinks: Any = None) -> Any:
        """:meth:`Plan.run`; ``sinks``: the call's float32 contiguous ``[H_q]`` sink logits
        (validated by the caller; a plan of a problem with sinks needs them)."""
        if out is None:
            out = hot.empty_like(q) if self.like else q.new_empty(self.out_shape)
        else:
            spans = self.spans
            if not clear_of(out, spans[3], q, spans[0], k, spans[1], v, spans[2]):
                return None
        if sinks is None:  # the warm path of plain problems: as before sinks existed
            _aot.launch(hot.raw_stream(device), self.grid, self.kernel,
                        (q, k, v, out) + self.scalars)
        else:
            _aot.launch(hot.raw_stream(device), self.grid, self.kernel,
                        self._args(q, k, v, out, sinks))
        return out

    def run_cupy(self, q: Any, k: Any, v: Any, out: Any, problem: Problem,
                 sinks: Any = None) -> Any:
        """:meth:`Plan.run_cupy`; ``sinks`` as for :meth:`run` (a CuPy array)."""
        import cupy

        with cupy.cuda.Device(q.device.id):
            if out is None:
                out = cupy.empty(self.out_shape, dtype=q.dtype)
            _aot.launch(cupy.cuda.get_current_stream(), self.grid, self.kernel,
                        self._args(q, k, v, out, sinks))
        return out


def forward_plan(problem: Problem, schedule: Schedule, device_index: int,
                 scale: float | None) -> ForwardPlan:
    """The plan of ``schedule`` for ``problem`` (its window and softcap included) on CUDA
    device ``device_index``; with sinks, its launches take the call's sink logits."""
    schedule = normalise(problem, schedule)
    scale = default_scale(problem) if scale is None else float(scale)
    # everything after the four arrays, in the one order kernel_args defines; with sinks, a
    # marker holds the Sinks slot that each launch fills
    marker = Slot("Sinks") if problem.sinks else None
    scalars = tuple(kernel_args(None, None, None, None, problem, schedule, scale,
                                sinks=marker)[4:])
    return ForwardPlan(
        out_shape=(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
        grid=grid_for(problem, schedule, _device.device_info(device_index).sm_count),
        kernel=kernel_for(schedule),
        scalars=scalars,
        sinks_at=None if marker is None else [a is marker for a in scalars].index(True),
    )


class Fp8ForwardPlan:
    """The launch of an FP8 (e4m3) problem, kept by ``sdpa`` per call signature: its output's
    shape and dtype and a :class:`PreparedLaunch` whose slots each call fills (the arrays, the
    sinks, the three descale factors); ``run`` transposes the values
    (``transpose_values``)."""

    __slots__ = ("out_shape", "out_dtype", "launch")

    def __init__(self, out_shape: tuple, out_dtype: Any, launch: PreparedLaunch) -> None:
        self.out_shape, self.out_dtype, self.launch = out_shape, out_dtype, launch

    def run(self, runtime: Any, q: Any, k: Any, v: Any, device: int, out: Any,
            sinks: Any = None, descales: tuple = ()) -> Any:
        """Enqueue the call on the device's current stream (``out``: bf16, or None for a new
        one; ``sinks``: the float32 ``[H_q]`` logits of a problem with sinks; ``descales``:
        the float32 ``[B, H_kv]`` factors of q, k and v) and return ``out``."""
        import torch

        if out is None:
            out = torch.empty(self.out_shape, dtype=self.out_dtype, device=q.device)
        q_descale, k_descale, v_descale = descales
        self.launch.run(torch.cuda.current_stream(device), {
            "Q": q, "K": k, "V": transpose_values(v), "Out": out, "Sinks": sinks,
            "QDescale": q_descale, "KDescale": k_descale, "VDescale": v_descale})
        return out


def fp8_forward_plan(problem: Problem, schedule: Schedule, device_index: int,
                     scale: float | None, out_dtype: Any) -> Fp8ForwardPlan:
    """The :class:`Fp8ForwardPlan` of ``schedule`` for the FP8 ``problem`` (its variants
    included) on CUDA device ``device_index``, writing ``out_dtype``."""
    schedule = normalise(problem, schedule)
    scale = default_scale(problem) if scale is None else float(scale)
    slot = slots("Q", "K", "V", "Out", "Sinks", "QDescale", "KDescale", "VDescale")
    args = kernel_args(slot["Q"], slot["K"], slot["V"], slot["Out"], problem, schedule, scale,
                       sinks=slot["Sinks"] if problem.sinks else None,
                       descales=(slot["QDescale"], slot["KDescale"], slot["VDescale"]))
    grid = grid_for(problem, schedule, _device.device_info(device_index).sm_count)
    return Fp8ForwardPlan(
        out_shape=(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
        out_dtype=out_dtype, launch=PreparedLaunch(kernel_for(schedule), grid, args))


def dense_launch(problem: Problem, schedule: Schedule, scale: float, sm_count: int, *,
                 sinks: bool) -> PreparedLaunch:
    """:func:`~._launch.launch_with_lse` of a dense (not ragged) problem as a
    :class:`~._launch.PreparedLaunch` (the arrays ``Q, K, V, Out, Lse`` and, with ``sinks``,
    ``Sinks`` fill its slots): what a training call's warm path keeps, so that a call puts its
    arrays in place and launches."""
    slot = slots("Q", "K", "V", "Out", "Lse", "Sinks")
    args = kernel_args(slot["Q"], slot["K"], slot["V"], slot["Out"], problem, schedule, scale,
                       lse=slot["Lse"], sinks=slot["Sinks"] if sinks else None)
    return PreparedLaunch(kernel_for(schedule), grid_for(problem, schedule, sm_count), args)
