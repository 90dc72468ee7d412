"""``tiledattention.sdpa`` of FP8 inputs: float8_e4m3fn q, k and v with descale factors (the
convention of FlashAttention-3 and cuDNN: the stored values times ``q_descale``, ``k_descale``,
``v_descale`` are the real ones), a bfloat16 output; or an FP8 K/V cache: float8_e4m3fn k and v
with their factors under bf16 / fp16 queries (``Problem.kv_dtype``), the output in q's dtype
(the decode family's kernels, which widen each key and value tile).

A descale factor is a float32 torch tensor on q's device of shape ``[B, H_kv]``, or one that
broadcasts to it (``[]``, ``[1]``, ``[B, 1]``, ``[1, H_kv]``: per tensor, per batch entry, per
K/V head); ``None`` means 1. A query head takes its K/V head's factor. The family that declares
the dtype runs the call (``Family.fp8_plan``: the prefill forward for FP8 inputs, on Hopper and
later; the decode family for an FP8 cache, which its dispatch rule must take: few query rows).
As ``_sdpa`` does, a call's plan is kept per signature, so a repeated call (a decode loop whose
cache grows within a band of lengths) skips validation, lookup and plan building. No autograd,
no CuPy arrays (CuPy has no float8 type), no packed or paged sequences here.
"""

from __future__ import annotations

import sys
from typing import Any

from ..core import _device
from ..core import _plans as hot
from ..core._call import Call
from ..core._dispatch import choose_family, family_for_schedule
from ..core._dtypes import FP8_DTYPES, element, torch_dtype
from ..core._problem import Problem, check_cuda, problem_of_arrays, sink_logits
from ..core._runtime import Runtime
from ..errors import (InputTypeError, InputValueError, KernelArgumentError,
                      UnsupportedOperationError, UnsupportedProblemError)
from ._sdpa import as_float32, check_out

__all__ = ["sdpa_fp8", "is_fp8_call", "DESCALE_NAMES"]

#: The descale arguments, in the order of q, k, v.
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


#: torch's FP8 dtypes, once torch is imported (:func:`_fp8_torch_dtypes`)
_FP8_TORCH: frozenset = frozenset()


def _fp8_torch_dtypes() -> frozenset:
    """torch's FP8 dtype objects, kept once torch is imported (before, no array can be a torch
    tensor: empty, and ``import tiledattention`` does not import torch for it)."""
    global _FP8_TORCH
    torch = sys.modules.get("torch")
    if torch is not None:
        _FP8_TORCH = frozenset(getattr(torch, element(name).torch) for name in FP8_DTYPES)
    return _FP8_TORCH


def is_fp8_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor of an FP8 dtype."""
    return getattr(x, "dtype", None) in (_FP8_TORCH or _fp8_torch_dtypes())


def is_fp8_call(q: Any, k: Any, descales: tuple) -> bool:
    """Whether ``sdpa`` was given FP8 inputs (q, or k: an FP8 cache) or any descale factor
    (then the FP8 path checks the rest). On every ``sdpa`` call: dtype objects compared, not
    their names (0.2 µs, against 0.34 µs for ``str(dtype)``)."""
    if descales[0] is not None or descales[1] is not None or descales[2] is not None:
        return True
    dtypes = _FP8_TORCH or _fp8_torch_dtypes()
    return getattr(q, "dtype", None) in dtypes or getattr(k, "dtype", None) in dtypes


def _check_inputs(q: Any, k: Any, v: Any, descales: tuple) -> bool:
    """FP8 inputs: torch tensors, k and v float8_e4m3fn, q too or (an FP8 cache) bf16 / fp16
    without a ``q_descale``, none requiring grad. Returns whether q is FP8."""
    import torch

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise InputTypeError(f"{name} must be a torch.Tensor for FP8 attention (CuPy has no "
                                 f"float8 type); got {type(x).__name__}")
    wanted = torch_dtype("e4m3")
    given = [n for n, d in zip(DESCALE_NAMES, descales) if d is not None]
    why = f" (given {', '.join(given)})" if given else ""
    fp8_q = q.dtype == wanted
    if not fp8_q and q.dtype not in (torch.bfloat16, torch.float16):
        raise InputTypeError(f"q must be {wanted} (FP8 attention) or bfloat16 / float16 over an "
                             f"FP8 K/V cache{why}; got {q.dtype}")
    if not fp8_q and descales[0] is not None:
        raise InputValueError(f"q_descale goes with {wanted} queries; got it with {q.dtype} "
                              f"queries (an FP8 K/V cache takes k_descale and v_descale only)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if name != "q" and x.dtype != wanted:
            raise InputTypeError(f"{name} must be {wanted} for FP8 attention{why}; got "
                                 f"{x.dtype}")
        if x.requires_grad:
            raise UnsupportedOperationError(
                f"FP8 attention has no backward pass; got {name} requiring grad (pass "
                f"{name}.detach(), or train in bf16)")
    return fp8_q


def fp8_descales(descales: tuple, problem: Problem, q: Any,
                 names: tuple = DESCALE_NAMES) -> tuple:
    """Each descale factor (``names``: the arguments they came as, q's, k's and v's by
    default) as the kernel reads it: a contiguous float32 ``[B, H_kv]`` tensor (``None``:
    ones). Raises naming the argument for a wrong type, dtype, shape or device."""
    import torch

    target = (problem.batch, problem.heads_kv)
    checked = []
    ones = None
    for name, d in zip(names, descales):
        if d is None:
            if ones is None:
                ones = torch.ones(target, dtype=torch.float32, device=q.device)
            checked.append(ones)
            continue
        if not isinstance(d, torch.Tensor):
            raise InputTypeError(f"{name} must be a float32 torch.Tensor of shape [B, H_kv] = "
                                 f"{list(target)} (or one that broadcasts to it), or None; got "
                                 f"{type(d).__name__}")
        if d.dtype != torch.float32:
            raise InputTypeError(f"{name} must be float32; got {d.dtype}")
        if d.dim() > 2 or any(n not in (1, t) for n, t in zip(d.shape[::-1], target[::-1])):
            raise InputValueError(f"{name} must have shape [B, H_kv] = {list(target)} or one "
                                  f"that broadcasts to it ([], [1], [B, 1], [1, H_kv]); got "
                                  f"{list(d.shape)}")
        if d.device != q.device:
            raise InputValueError(f"{name} must be on q's device {q.device}; got {d.device}")
        checked.append(_as_factor(d, target))
    return tuple(checked)


class _Kept:
    """An FP8 call's plan, kept per signature: the family's plan, the ``[B, H_kv]`` shape of
    the factors and, per factor, how a call's argument becomes one (kept ones for ``None``,
    the tensor itself, or a detached contiguous expansion: :func:`_as_factor`)."""

    __slots__ = ("plan", "target", "ones", "as_is")

    def __init__(self, plan: Any, target: tuple, ones: Any, descales: tuple) -> None:
        self.plan, self.target, self.ones = plan, target, ones
        self.as_is = tuple(d is not None and _as_factor(d, target) is d for d in descales)

    def factors(self, descales: tuple) -> tuple:
        return tuple(self.ones if d is None else d if as_is else _as_factor(d, self.target)
                     for d, as_is in zip(descales, self.as_is))


def _as_factor(d: Any, target: tuple) -> Any:
    """A valid descale argument as the kernel reads it: itself when it is a contiguous
    ``target``-shaped tensor outside autograd, else a detached contiguous expansion."""
    if tuple(d.shape) == target and d.is_contiguous() and not d.requires_grad:
        return d
    return d.detach().expand(target).contiguous()


#: The families whose FP8 plans were kept (their ``plan_key`` finds a call's plan).
_warm: list[Any] = []


def _signature(q: Any, k: Any, v: Any, causal: Any, scale: Any, variant: tuple,
               schedule: Any, descales: tuple) -> tuple:
    """What a kept FP8 plan depends on besides K and V's shapes (``Family.plan_key``): q's
    layout, the dtypes, devices and gradient flags of q, k and v, the arguments with their
    types, the sinks' and the factors' layouts (as ``_sdpa``'s signature)."""
    window, softcap, sinks = variant
    return (hot.layouts(q), k.dtype, k.get_device(), v.dtype, v.get_device(), q.requires_grad,
            k.requires_grad, v.requires_grad, causal, causal.__class__, scale, scale.__class__,
            schedule, window, window.__class__, softcap, softcap.__class__,
            None if sinks is None else hot.layouts(sinks),
            tuple(None if d is None else (hot.layouts(d), d.requires_grad) for d in descales))


def sdpa_fp8(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any, scale: Any,
             variant: tuple, schedule: Any, out: Any, descales: tuple) -> Any:
    """``sdpa`` of FP8 inputs on ``runtime`` (module docstring); ``variant``: the call's
    ``(window, softcap, sinks)``; ``descales``: ``(q_descale, k_descale, v_descale)``. A call
    without ``out`` whose signature was seen before runs the kept plan (no validation, lookup
    or plan building); the others take the validating path."""
    signature = None
    if out is None:
        try:
            signature = _signature(q, k, v, causal, scale, variant, schedule, descales)
            for family in _warm:
                kept = runtime.plan(("fp8", family.plan_key(signature, k, v)))
                if kept is not None:
                    sinks = variant[2]
                    result = kept.plan.run(runtime, q, k, v, q.get_device(), None,
                                           sinks=None if sinks is None else as_float32(sinks),
                                           descales=kept.factors(descales))
                    if result is not None:
                        return result
                    break  # the plan's own checks failed: validation says why
        except (AttributeError, TypeError):  # not torch tensors, unhashable: validation says
            signature = None
    return _validated(runtime, q, k, v, causal, scale, variant, schedule, out, descales,
                      signature)


def _validated(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any, scale: Any,
               variant: tuple, schedule: Any, out: Any, descales: tuple,
               signature: tuple | None) -> Any:
    """The validating path: check, choose the family, resolve, build (and keep, with a
    ``signature``) the plan, launch."""
    _check_inputs(q, k, v, descales)
    window, softcap, sinks = variant
    problem, kind = problem_of_arrays(q, k, v, causal, scale, window, softcap, sinks,
                                      fp8=True)
    logits = None if sinks is None else sink_logits(sinks, problem.heads_q, q, kind)
    factors = fp8_descales(descales, problem, q)
    if out is not None:
        check_out(out, q, k, v, problem, kind)
    check_cuda((("q", q), ("k", k), ("v", v)), kind)  # last: a wrong argument is named first
    device_index = q.device.index
    arch = _device.device_info(device_index).arch
    if schedule is None:
        family = choose_family(arch, problem)  # the family that declares the dtype
        schedule = runtime.resolution(family, family.plan_problem(problem),
                                      device_index).schedule
    else:
        family = family_for_schedule(schedule)
        if not family.accepts(arch, problem):
            raise UnsupportedProblemError(family.why_accepted(arch, problem))
    plan = family.fp8_plan(Call.of(problem, scale, causal, window), schedule, device_index,
                           q, k, v, out)
    result = plan.run(runtime, q, k, v, device_index, out, sinks=logits, descales=factors)
    if result is None:  # the plan's own checks of the arrays failed (validated above)
        raise KernelArgumentError(f"the {family.name} family could not launch "
                                  f"{problem.describe()} on these arrays")
    if signature is not None:
        ones = next((f for f, d in zip(factors, descales) if d is None), None)
        runtime.keep_plan(("fp8", family.plan_key(signature, k, v)),
                          _Kept(plan, (problem.batch, problem.heads_kv), ones, descales))
        if family not in _warm:
            _warm.append(family)
    return result
