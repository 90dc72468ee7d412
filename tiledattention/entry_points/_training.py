"""The training entry points on torch tensors: the forward that also keeps each row's
log-sum-exp, and the backward pass (``tiledattention.sdpa_with_lse`` / ``sdpa_backward``).

Each runs the family registered for its operation (``choose_family``: "sdpa_with_lse", then
"sdpa_backward"; an explicit schedule picks the family of its type) with the schedule the lookup
gives for the problem. Extra memory is O(S·D): the float32 log-sum-exp and row sums ``delta``
(``[B, H_q, S_q]``, in row-aligned storage: ``row_stat_shape``) besides the gradients
themselves.
"""

from __future__ import annotations

from typing import Any

from ..core._device import device_info
from ..core._dispatch import choose_family, family_for_schedule
from ..core._problem import (Problem, check_cuda, default_scale, problem_of_arrays, row_stat_shape,
                             sink_logits)
from ..core._runtime import Runtime
from ..errors import InputTypeError, InputValueError

__all__ = ["sdpa_with_lse", "sdpa_backward"]


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
    import torch

    store = torch.empty(row_stat_shape(problem), dtype=torch.float32, device=device)
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


def sdpa_with_lse(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any = False,
                  scale: float | None = None, *, schedule: Any = None,
                  variant: tuple = (None, None, None)) -> tuple[Any, Any]:
    """``tiledattention.sdpa_with_lse`` on ``runtime`` (see there); ``variant``: the call's
    ``(window, softcap, sinks)``."""
    import torch

    family = _explicit(schedule, "sdpa_with_lse")
    problem, device, sinks = _torch_problem("sdpa_with_lse", q, k, v, causal, scale, variant)
    check_cuda((("q", q), ("k", k), ("v", v)), "torch")
    family, schedule = _resolve(runtime, "sdpa_with_lse", problem, device, family, schedule)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = _row_stat(problem, q.device)
    family.forward_with_lse(torch.cuda.current_stream(q.device), q, k, v, out, lse, problem,
                            schedule, default_scale(problem) if scale is None else float(scale),
                            device, sinks=sinks)
    return out, lse


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
                  deterministic: bool = False) -> tuple[Any, Any, Any]:
    """``tiledattention.sdpa_backward`` on ``runtime`` (see there)."""
    import torch

    if not isinstance(deterministic, bool):
        raise InputTypeError(f"deterministic must be a bool; got {deterministic!r}")

    family = _explicit(schedule, "sdpa_backward")
    problem, device, sinks = _torch_problem("sdpa_backward", q, k, v, causal, scale, variant)
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
        for name, g, like, like_name in zip(("grads[0]", "grads[1]", "grads[2]"), grads,
                                            (q, k, v), ("q", "k", "v")):
            _check_like(name, g, like, like_name)
            if not g.is_contiguous():
                raise InputValueError(f"{name} must be contiguous; got strides {g.stride()}")
    check_cuda((("q", q), ("k", k), ("v", v)), "torch")  # last: a wrong argument is named first
    if grads is None:
        grads = (torch.empty_like(q, memory_format=torch.contiguous_format),
                 torch.empty_like(k, memory_format=torch.contiguous_format),
                 torch.empty_like(v, memory_format=torch.contiguous_format))
    family, schedule = _resolve(runtime, "sdpa_backward", problem, device, family, schedule)
    if deterministic:  # (torch.use_deterministic_algorithms(True): the family's backward)
        schedule = family.deterministic_schedule(device_info(device).arch, problem, schedule)
    delta = _row_stat(problem, q.device)
    family.backward(torch.cuda.current_stream(q.device), problem, schedule,
                    default_scale(problem) if scale is None else scale, q, k, v,
                    _last_dim_contiguous(out), _last_dim_contiguous(grad_out), lse, delta,
                    grads, sinks=sinks)
    return grads
