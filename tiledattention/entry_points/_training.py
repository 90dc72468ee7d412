"""The training entry points on torch tensors: the forward that also keeps each row's
log-sum-exp, and the backward pass (``tiledattention.sdpa_with_lse`` / ``sdpa_backward``).

Each runs the family registered for its operation (``choose_family``: "sdpa_with_lse", then
"sdpa_backward"; an explicit schedule picks the family of its type) with the schedule the lookup
gives for the problem. Extra memory is O(S·D): the float32 log-sum-exp and row sums ``delta``
(``[B, H_q, S_q]``, in row-aligned storage: ``row_stat_shape``) besides the gradients
themselves, and the schedule's float32 scratch (dK/dV splits' partials; a one-pass schedule's dQ
accumulator, shaped like q).

A repeated call takes a warm path, as ``sdpa``'s does: its *signature* (q's, k's and v's shapes,
strides, dtypes and devices, ``causal``, ``scale`` and the variant arguments with their types,
the sinks' layout, an explicit schedule; for the backward also the layouts of ``grad_out``,
``out`` and ``lse`` and ``deterministic``) keys what the first call validated and resolved (the
family, the problem, the schedule, the scale), kept in the runtime beside ``sdpa``'s plans. A
warm call allocates its outputs and launches: no validation, lookup or schedule work. Calls that
pass ``grads`` (the caller's buffers), and CuPy arrays, take the validating path every time.

Autograd's eager route (``_autograd``) goes one step further: :func:`training_forward` hands its
node the forward's kept call, whose ``backward_plan`` (the kept backward of the same problem,
set by :func:`backward_plan` on the first backward) the node runs directly, without building
the backward's signature: a backward node runs on autograd's device thread, where its Python
costs more host time than on the calling thread (``docs/records/benchmarks/backward/host-time.md``).
"""

from __future__ import annotations

from typing import Any

from ..core import _plans as hot
from ..core._device import device_info
from ..core._dispatch import choose_family, family_for_schedule
from ..core._problem import (Problem, check_cuda, default_scale, problem_of_arrays, row_stat_shape,
                             sink_logits)
from ..core._runtime import Runtime
from ..errors import InputTypeError, InputValueError
from ._sdpa import as_float32

__all__ = ["sdpa_with_lse", "sdpa_backward", "training_forward", "backward_plan"]


def _torch_problem(function: str, q: Any, k: Any, v: Any, causal: Any, scale: Any,
                   variant: tuple) -> tuple[Problem, int, Any]:
    """The problem, q's device index and the sink logits as the kernels read them (or
    ``None``) of a training call; ``variant``: its ``(window, softcap, sinks)``. The arrays'
    device is not checked here: the caller checks its other arguments first, then calls
    ``check_cuda``."""
    window, softcap, sinks = variant
    problem, kind = problem_of_arrays(q, k, v, causal, scale, window, softcap, sinks)
    if kind != "torch":
        raise InputTypeError(f"{function} takes torch tensors (autograd is torch's); got q of "
                             f"type {type(q).__module__}.{type(q).__name__}")
    logits = None if sinks is None else sink_logits(sinks, problem.heads_q, q, kind)
    return problem, q.device.index, logits


def _row_stat(problem: Problem, device: Any) -> Any:
    """A float32 ``[B, H_q, S_q]`` view of row-aligned storage (``row_stat_shape``)."""
    store = hot.empty(row_stat_shape(problem), dtype=hot.float32, device=device)
    return store[:, :, :problem.seqlen_q]


def _explicit(schedule: Any, operation: str) -> Any:
    """The family of an explicit ``schedule`` (checked before any other argument), or ``None``
    when the lookup decides."""
    return None if schedule is None else family_for_schedule(schedule, operation)


def _resolve(runtime: Runtime, operation: str, problem: Problem, device: int, family: Any,
             schedule: Any) -> tuple[Any, Any]:
    """(family, schedule) for ``operation``: the explicit schedule and its ``family``, or the
    chosen family and its looked-up schedule."""
    if family is not None:
        return family, schedule
    family = choose_family(device_info(device).arch, problem, operation)
    return family, runtime.resolution(family, problem, device).schedule


def _signature(operation: str, q: Any, k: Any, v: Any, causal: Any, scale: Any,
               variant: tuple, schedule: Any) -> tuple | None:
    """The warm-path key of a training call on torch tensors (``None``: CuPy arrays or an
    unhashable argument, which always validate)."""
    try:
        window, softcap, sinks = variant
        key = (operation, hot.layouts(q, k, v), causal, causal.__class__, scale,
               scale.__class__, schedule)
        if window is not None or softcap is not None or sinks is not None:
            key = (key, window, window.__class__, softcap, softcap.__class__,
                   None if sinks is None else (sinks.shape, sinks.stride(), sinks.dtype,
                                               sinks.get_device()))
        hash(key)
        return key
    except (AttributeError, TypeError):
        return None


class _Resolved:
    """A validated training call's family, problem, schedule, scale and device: what a warm
    call of its signature reuses. A forward's also holds ``backward_plan``: the kept backward
    of its problem once a backward through autograd's eager route has resolved it (else
    ``None``)."""

    __slots__ = ("family", "problem", "schedule", "scale", "device", "backward_plan",
                 "_launch_with_lse", "_launch_backward")

    def __init__(self, family: Any, problem: Problem, schedule: Any, scale: float,
                 device: int) -> None:
        self.family, self.problem, self.schedule = family, problem, schedule
        self.scale, self.device = scale, device
        self.backward_plan: _Resolved | None = None
        # the family's prepared forward / backward, made on the first call that needs one
        self._launch_with_lse: Any = None
        self._launch_backward: Any = None

    def forward(self, q: Any, k: Any, v: Any, sinks: Any) -> tuple[Any, Any]:
        """``sdpa_with_lse``'s launch: ``(out, lse)``, on torch's current stream."""
        out = hot.empty_like(q, memory_format=hot.contiguous_format)
        lse = _row_stat(self.problem, q.device)
        run = self._launch_with_lse
        if run is None:
            run = self._launch_with_lse = self.family.prepare_with_lse(
                self.problem, self.schedule, self.scale, self.device)
        run(hot.raw_stream(self.device), q, k, v, out, lse, sinks)
        return out, lse

    def backward(self, grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, grads: Any,
                 with_row_sums: bool = False) -> tuple:
        """``sdpa_backward``'s launch into ``grads`` (``None``: new contiguous tensors);
        ``with_row_sums``: the kernels' float32 ``delta = sum_d dO * O`` ``[B, H_q, S_q]``
        too, as a fourth. (Sinks need nothing here: ``lse`` holds their term.)"""
        if grads is None:
            like = hot.empty_like
            form = hot.contiguous_format
            grads = (like(q, memory_format=form), like(k, memory_format=form),
                     like(v, memory_format=form))
        delta = _row_stat(self.problem, q.device)
        run = self._launch_backward
        if run is None:
            run = self._launch_backward = self.family.prepare_backward(
                self.problem, self.schedule, self.scale)
        run(hot.raw_stream(self.device), q, k, v, _last_dim_contiguous(out),
            _last_dim_contiguous(grad_out), lse, delta, grads)
        return (*grads, delta) if with_row_sums else grads


def _sinks_of(variant: tuple) -> Any:
    """A warm call's sink logits as the kernels read them (float32 ``[H_q]``), or ``None``:
    the key vouched for their shape, dtype and device (``sink_logits`` checked them once)."""
    sinks = variant[2]
    return None if sinks is None else as_float32(sinks.detach())


def sdpa_with_lse(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any = False,
                  scale: float | None = None, *, schedule: Any = None,
                  variant: tuple = (None, None, None)) -> tuple[Any, Any]:
    """``tiledattention.sdpa_with_lse`` on ``runtime`` (see there); ``variant``: the call's
    ``(window, softcap, sinks)``."""
    out, lse, _ = training_forward(runtime, q, k, v, causal, scale, schedule=schedule,
                                   variant=variant)
    return out, lse


def training_forward(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any = False,
                     scale: float | None = None, *, schedule: Any = None,
                     variant: tuple = (None, None, None)) -> tuple[Any, Any, Any]:
    """:func:`sdpa_with_lse` and the kept call it ran (``None`` where the call has no warm-path
    signature): ``(out, lse, kept)``."""
    key = _signature("sdpa_with_lse", q, k, v, causal, scale, variant, schedule)
    kept = None if key is None else runtime.plan(key)
    if kept is not None:
        return (*kept.forward(q, k, v, _sinks_of(variant)), kept)
    family = _explicit(schedule, "sdpa_with_lse")
    problem, device, sinks = _torch_problem("sdpa_with_lse", q, k, v, causal, scale, variant)
    check_cuda((("q", q), ("k", k), ("v", v)), "torch")
    family, schedule = _resolve(runtime, "sdpa_with_lse", problem, device, family, schedule)
    hot.bind_torch()
    kept = _Resolved(family, problem, schedule,
                     default_scale(problem) if scale is None else float(scale), device)
    if key is None:
        return (*kept.forward(q, k, v, sinks), None)
    runtime.keep_plan(key, kept)
    return (*kept.forward(q, k, v, sinks), kept)


def _check_like(name: str, x: Any, like: Any, like_name: str) -> None:
    import torch

    if not isinstance(x, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor like {like_name}; got "
                             f"{type(x).__name__}")
    if x.shape != like.shape or x.dtype != like.dtype or x.device != like.device:
        raise InputValueError(
            f"{name} must have {like_name}'s shape {tuple(like.shape)}, dtype {like.dtype} and "
            f"device {like.device}; got {tuple(x.shape)}, {x.dtype}, {x.device}")


def _last_dim_contiguous(x: Any) -> Any:
    return x if x.stride(-1) == 1 else x.contiguous()


def sdpa_backward(runtime: Runtime, grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                  causal: Any = False, scale: float | None = None, *,
                  schedule: Any = None, grads: tuple[Any, Any, Any] | None = None,
                  variant: tuple = (None, None, None),
                  deterministic: bool = False, with_row_sums: bool = False) -> tuple:
    """``tiledattention.sdpa_backward`` on ``runtime`` (see there). ``with_row_sums``
    (internal: the sinks' gradient reads them) returns the kernels' float32 row sums ``delta
    = sum_d dO * O`` ``[B, H_q, S_q]`` as a fourth value."""
    kept = backward_plan(runtime, grad_out, q, k, v, out, lse, causal, scale, schedule=schedule,
                         grads=grads, variant=variant, deterministic=deterministic)
    return kept.backward(grad_out, q, k, v, out, lse, grads, with_row_sums)


def backward_plan(runtime: Runtime, grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                  causal: Any = False, scale: float | None = None, *,
                  schedule: Any = None, grads: tuple[Any, Any, Any] | None = None,
                  variant: tuple = (None, None, None),
                  deterministic: bool = False) -> _Resolved:
    """The kept backward call of these arguments, validated and resolved on the first call of
    their signature."""
    if not isinstance(deterministic, bool):  # before the warm key, which hashes it
        raise InputTypeError(f"deterministic must be a bool; got {deterministic!r}")
    key = None
    if grads is None:
        key = _signature("sdpa_backward", q, k, v, causal, scale, variant, schedule)
        if key is not None:
            try:
                key = (key, hot.layouts(grad_out, out, lse), deterministic,
                       deterministic.__class__)
            except (AttributeError, TypeError):
                key = None
    kept = None if key is None else runtime.plan(key)
    if kept is not None:
        return kept
    import torch

    family = _explicit(schedule, "sdpa_backward")
    problem, device, _ = _torch_problem("sdpa_backward", q, k, v, causal, scale, variant)
    _check_like("grad_out", grad_out, q, "q")
    _check_like("out", out, q, "q")
    stat = (problem.batch, problem.heads_q, problem.seqlen_q)
    if (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != stat
            or lse.dtype != torch.float32 or lse.device != q.device or lse.stride(-1) != 1):
        raise InputValueError(
            f"lse must be the float32 {list(stat)} log-sum-exp sdpa_with_lse returned for these "
            f"inputs (on {q.device}, last dim contiguous); got "
            + (f"{tuple(lse.shape)}, {lse.dtype}, {lse.device}"
               if isinstance(lse, torch.Tensor) else type(lse).__name__))
    if grads is not None:
        if not isinstance(grads, (tuple, list)) or len(grads) != 3:
            raise InputTypeError(f"grads must be a tuple (dq, dk, dv) of tensors like q, k, v, "
                                 f"or None; got {type(grads).__name__}"
                                 + (f" of {len(grads)}" if isinstance(grads, (tuple, list))
                                    else ""))
        for name, g, like, like_name in zip(("grads[0]", "grads[1]", "grads[2]"), grads,
                                            (q, k, v), ("q", "k", "v")):
            _check_like(name, g, like, like_name)
            if not g.is_contiguous():
                raise InputValueError(f"{name} must be contiguous; got strides {g.stride()}")
    check_cuda((("q", q), ("k", k), ("v", v)), "torch")  # last: a wrong argument is named first
    family, schedule = _resolve(runtime, "sdpa_backward", problem, device, family, schedule)
    if deterministic:  # (torch.use_deterministic_algorithms(True): the family's backward)
        schedule = family.deterministic_schedule(device_info(device).arch, problem, schedule)
    hot.bind_torch()
    kept = _Resolved(family, problem, schedule,
                     default_scale(problem) if scale is None else scale, device)
    if key is not None:
        runtime.keep_plan(key, kept)
    return kept
