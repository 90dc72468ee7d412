"""``tiledattention.sdpa``'s implementation: validate, choose the family, resolve a schedule
(memoised), plan, launch. Nothing here names a family: the registered families that serve
"sdpa" decide by their dispatch predicates (``choose_family``), and each builds its own launch
plan (``Family.plan``, of the call: its ``Problem`` with the variant, its scale and the
caller's mask, one ``Call`` value).

The hot path reuses a *plan* (``tiledattention.Plan``: kernel objects, grids, constant
arguments) built for an earlier call with the same key. A key holds the call's *signature*:
everything about q and the call that a plan depends on or that validation judged: q's shape and
strides, the dtypes and devices of q, k and v, ``causal``, ``scale`` (each with its type: ``1 ==
True == 1.0`` hash alike and the first call rejects some of them), the variant arguments
(``window``, ``softcap``, the sinks' shape, strides, dtype and device), an explicit schedule and,
with ``out=``, out's shape, strides, dtype, device and ``requires_grad``; and what the family's
``plan_key`` adds for K and V (the forward: their shapes and strides; decode: a band of cache
lengths, so a generation loop reuses one plan). A family's keys are only looked for when q has
no more rows than one of its kept plans (``_warm``), so a call costs one dict lookup per family
that could have a plan for it.

``out=``: the caller's output buffer, ``[B, H_q, S_q, D]`` with q's dtype and device, last dim
contiguous, other strides free (the kernels store through strided views, as they load q), not
overlapping itself, q, k or v. Its layout is in the signature, so a warm call checks it with the
lookup; the overlap with q, k and v (addresses, not in the signature) is checked on every call.
"""

from __future__ import annotations

from typing import Any

from ..core import _device
from ..core import _plans as hot
from ..core._call import Call
from ..core._dispatch import choose_family, family_for_schedule
from ..core._dtypes import element, torch_dtype
from ..core._problem import (Problem, check_cuda, check_reach, padded_head_dim, problem_of_arrays,
                             sink_logits)
from ..core._runtime import Runtime
from ..errors import InputTypeError, InputValueError

__all__ = ["sdpa", "as_float32", "check_out"]

#: The families whose plans were kept (in any runtime), in dispatch order, each with the most
#: query rows of its kept plans: a call with more rows cannot have a plan of that family (q's
#: shape is in the key), so it skips that family's lookup.
_warm: list[tuple[Any, int]] = []


def _keep_warm(family: Any, rows: int) -> None:
    global _warm
    found = dict(_warm)
    if found.get(family, 0) >= rows:
        return
    found[family] = rows
    _warm = sorted(found.items(), key=lambda item: -item[0].dispatch_priority)


def sdpa(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any = False,
         scale: float | None = None, *, window: Any = None, softcap: Any = None,
         sinks: Any = None, schedule: Any = None, out: Any = None,
         keep_scratch: bool = True) -> Any:
    """``tiledattention.sdpa`` on ``runtime`` (see there); ``out``: the caller's output."""
    scratch = runtime if keep_scratch else None  # where a plan keeps its scratch buffers
    family = None
    if schedule is not None:
        family = family_for_schedule(schedule)
    try:  # the signature of a torch call; anything else takes the general path
        q_shape = q.shape
        device = q.get_device()
        signature = (q_shape, q.stride(), q.dtype, device, k.dtype, k.get_device(), v.dtype,
                     v.get_device(), causal, causal.__class__, scale, scale.__class__, schedule)
        if window is not None or softcap is not None or sinks is not None:
            # the variant's values and types (a float softcap and an int one hash alike), and
            # the sinks' layout (the plan reads them as float32 [H_q] on q's device)
            signature = (signature, window, window.__class__, softcap, softcap.__class__,
                         None if sinks is None else (sinks.shape, sinks.stride(), sinks.dtype,
                                                     sinks.get_device()))
        if out is not None:
            signature = (signature, out.shape, out.stride(), out.dtype, out.get_device(),
                         out.requires_grad)
        rows = q_shape[2]
        plan = None
        for warm, most in _warm:
            if rows <= most:
                plan = runtime.plan(warm.plan_key(signature, k, v))
                if plan is not None:
                    break
    except (AttributeError, TypeError, IndexError):  # not torch tensors (CuPy), unhashable
        return _validated_call(runtime, q, k, v, causal, scale, (window, softcap, sinks),
                               schedule, family, out, None, scratch)
    if plan is not None:
        if sinks is None:
            result = plan.run(scratch, q, k, v, device, out)
        else:
            result = plan.run(scratch, q, k, v, device, out, sinks=as_float32(sinks))
        if result is not None:
            return result  # else the plan's checks failed: validation says why
    return _validated_call(runtime, q, k, v, causal, scale, (window, softcap, sinks),
                           schedule, family, out, signature, scratch)


def as_float32(sinks: Any) -> Any:
    """Sink logits as the kernels read them (the key vouched for their shape and device)."""
    return sinks if sinks.dtype is hot.float32 and sinks.is_contiguous() else \
        sinks.detach().float().contiguous()


# -- the validating path -----------------------------------------------------------------------
def _layout(x: Any, kind: str) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    """(shape, strides in elements, item size in bytes, address of element 0)."""
    if kind == "torch":
        return tuple(x.shape), tuple(x.stride()), x.element_size(), x.data_ptr()
    item = x.itemsize
    return tuple(x.shape), tuple(s // item for s in x.strides), item, x.data.ptr


def _byte_range(shape: tuple, strides: tuple, item: int, ptr: int) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` an array's elements lie in (strides may be negative: CuPy)."""
    lo = hi = 0
    for n, s in zip(shape, strides):
        if n > 1:
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
    return ptr + lo * item, ptr + (hi + 1) * item


def _self_overlapping(shape: tuple, strides: tuple) -> bool:
    """Whether two indices of this layout may share an element. Dims taken by increasing
    stride: each stride must clear the extent of the dims inside it (every layout torch or
    CuPy makes without expanding or as_strided passes)."""
    extent = 1
    for stride, n in sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1):
        if stride < extent:
            return True
        extent += stride * (n - 1)
    return False


def check_out(out: Any, q: Any, k: Any, v: Any, problem: Problem, kind: str) -> None:
    """Raise an InputTypeError / InputValueError naming ``out`` unless the kernels can write
    the result of ``problem`` into it."""
    if kind == "torch":
        import torch

        if not isinstance(out, torch.Tensor):
            raise InputTypeError(
                f"out must be a torch.Tensor like q; got {type(out).__name__}")
    else:
        import cupy

        if not isinstance(out, cupy.ndarray):
            raise InputTypeError(
                f"out must be a cupy.ndarray like q; got {type(out).__name__}")
    expected = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
    if tuple(out.shape) != expected:
        raise InputValueError(f"out must have q's shape [B, H_q, S_q, D] = {expected}; got "
                              f"{tuple(out.shape)}")
    output = element(problem.dtype).output_name
    if output != problem.dtype:  # FP8 inputs: the output's dtype is its own (bf16)
        if kind != "torch" or out.dtype != torch_dtype(output):
            raise InputTypeError(f"out must have the output's dtype {torch_dtype(output)} for "
                                 f"{q.dtype} inputs; got {out.dtype}")
    elif out.dtype != q.dtype:
        raise InputTypeError(f"out must have q's dtype {q.dtype}; got {out.dtype}")
    if kind == "torch":
        if out.device != q.device:
            raise InputValueError(f"out must be on q's device {q.device}; got a tensor on "
                                  f"{out.device}")
        if out.requires_grad:
            raise InputValueError(
                "out must not require grad (the kernel writes it outside autograd); got "
                "requires_grad=True: pass a tensor that does not, e.g. out.detach()")
    elif out.device.id != q.device.id:
        raise InputValueError(f"out must be on q's device cuda:{q.device.id}; got an array on "
                              f"cuda:{out.device.id}")
    shape, strides, item, ptr = _layout(out, kind)
    if strides[3] != 1:
        raise InputValueError(
            f"out must be contiguous in its last dim (head_dim); got strides {strides}")
    if _self_overlapping(shape, strides):
        raise InputValueError(
            f"out must not overlap itself (each element its own memory); got shape {shape}, "
            f"strides {strides}")
    check_reach("out", out, kind, padded_head_dim(problem.head_dim))
    lo, hi = _byte_range(shape, strides, item, ptr)
    for name, x in (("q", q), ("k", k), ("v", v)):
        x_lo, x_hi = _byte_range(*_layout(x, kind))
        if lo < x_hi and x_lo < hi:
            raise InputValueError(
                f"out must not overlap {name} (the kernels read {name} while writing out); got "
                f"out in bytes [{lo:#x}, {hi:#x}) and {name} in [{x_lo:#x}, {x_hi:#x}): pass "
                f"a separate buffer")


def _validated_call(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any, scale: Any,
                    variant: tuple, schedule: Any, family: Any, out: Any,
                    signature: tuple | None, scratch: Runtime | None) -> Any:
    """The general path: validate, choose the family (``family``: the explicit schedule's),
    resolve, build (and keep) the plan, launch. ``variant``: the call's ``(window, softcap,
    sinks)``; ``signature``: the warm path's signature of a torch call (``None``: none, keep
    no plan); ``scratch``: where the launch keeps scratch buffers between calls (``None``:
    nowhere)."""
    window, softcap, sinks = variant
    problem, kind = problem_of_arrays(q, k, v, causal, scale, window, softcap, sinks)
    logits = None if sinks is None else sink_logits(sinks, problem.heads_q, q, kind)
    if out is not None:
        check_out(out, q, k, v, problem, kind)
    check_cuda((("q", q), ("k", k), ("v", v)), kind)  # last: a wrong argument is named first
    device_index = q.device.index if kind == "torch" else q.device.id
    if family is None:
        family = choose_family(_device.device_info(device_index).arch, problem)
        schedule = runtime.resolution(family, family.plan_problem(problem),
                                      device_index).schedule
    else:
        family.check_dtype(problem)  # an explicit schedule's family: a dtype it declares
    # the call with the caller's own mask (validated): a plan kept for a band of cache lengths
    # needs an alignment or a window side the problem's canonical form drops at this length
    plan = family.plan(Call.of(problem, scale, causal, window), schedule, device_index)
    if kind != "torch":
        if logits is None:
            return plan.run_cupy(q, k, v, out, problem)
        return plan.run_cupy(q, k, v, out, problem, sinks=logits)
    hot.bind_torch()
    plan = plan.for_torch(q, out, k, v)
    if signature is not None:
        runtime.keep_plan(family.plan_key(signature, k, v), plan)
        _keep_warm(family, problem.seqlen_q)
    if logits is None:
        return plan.run(scratch, q, k, v, device_index, out)  # validated: not None
    return plan.run(scratch, q, k, v, device_index, out, sinks=logits)
