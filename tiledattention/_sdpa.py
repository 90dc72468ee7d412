"""``tiledattention.sdpa``'s implementation: validate, pick the family, resolve a schedule
(memoised), allocate, launch.

The hot path reuses a *plan* (kernel objects, grid, constant arguments) built for an earlier
call with the same signature:

- forward plans are keyed by everything about the tensors (shapes, dtypes, devices, strides),
  ``causal``, ``scale`` and an explicit schedule;
- decode plans do not depend on the cache length: they are keyed by the same things less K/V's
  length and strides, plus the length's *bucket* (the nearest power of two). In a generation
  loop, where the cache grows by one key per call, every call of a bucket reuses one plan
  (checking only what the key leaves out: K/V's shapes agree and fit the kernel's int32
  indexing); the schedule is looked up once per bucket, for the bucket's power-of-two length.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cuda.tile as ct

from ._device import device_info
from ._dispatch import choose_family
from ._runtime import Runtime
from .decode import DECODE, DecodeSchedule
from .decode import _launch as decode_launch
from .errors import InputTypeError
from .forward import FORWARD, Problem, Schedule, problem_from_arrays
from .forward._launch import default_scale, grid_for, kernel_args, kernel_for
from .forward._problem import INDEX_LIMIT, causal_flags, padded_head_dim

__all__ = ["sdpa", "length_bucket", "bucket_problem"]


def length_bucket(seqlen_k: int) -> int:
    """The exponent of the power of two nearest ``seqlen_k`` (in log scale): lengths in
    ``[2^(n-1/2), 2^(n+1/2))`` share bucket ``n``."""
    if seqlen_k < 1:
        return -1  # no plan is kept for it: the validating path rejects the empty cache
    n = seqlen_k.bit_length() - 1  # 2^n <= seqlen_k < 2^(n+1)
    return n + 1 if seqlen_k * seqlen_k >= 2 << (2 * n) else n


def bucket_problem(problem: Problem) -> Problem:
    """``problem`` with ``seqlen_k`` at its bucket's power of two (the problem a decode plan is
    resolved for); ``problem`` itself where that length is not a valid problem."""
    length = 1 << length_bucket(problem.seqlen_k)
    if length == problem.seqlen_k:
        return problem
    fields = problem.to_dict()
    fields["seqlen_k"] = length
    try:
        return Problem.from_dict(fields)
    except ValueError:  # e.g. the rounded-up length passes the int32 index limit
        return problem


class _ForwardPlan(NamedTuple):
    out_shape: tuple[int, int, int, int]
    grid: tuple[int, int, int]
    kernel: Any
    scalars: tuple  # the launch arguments after q, k, v, out


class _DecodePlan(NamedTuple):
    out_shape: tuple[int, int, int, int]
    launches: Any  # decode._launch.Launches
    partial_shapes: Any  # ((Opart shape), (Lse shape)), or None with one split
    bottom_right: bool  # the causal offset is S_k - S_q (else 0)
    tile_d: int


def _forward_plan(runtime: Runtime, problem: Problem, device_index: int, scale: float | None,
                  schedule: Schedule | None) -> _ForwardPlan:
    if schedule is None:
        schedule = runtime.resolution(FORWARD, problem, device_index).schedule
    schedule = FORWARD.normalise(problem, schedule)
    scale = default_scale(problem) if scale is None else float(scale)
    return _ForwardPlan(
        out_shape=(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
        grid=grid_for(problem, schedule, device_info(device_index).sm_count),
        kernel=kernel_for(schedule),
        # everything after the four arrays, in the one order kernel_args defines
        scalars=kernel_args(None, None, None, None, problem, schedule, scale)[4:],
    )


def _decode_plan(runtime: Runtime, problem: Problem, device_index: int, scale: float | None,
                 schedule: DecodeSchedule | None, bottom_right: bool) -> _DecodePlan:
    """The plan for every length of ``problem``'s bucket (``problem`` has the bucket's length;
    ``bottom_right`` is the caller's alignment, which the bucket's canonical form may drop)."""
    if schedule is None:
        schedule = runtime.resolution(DECODE, problem, device_index).schedule
    plan = decode_launch.launches(problem, schedule, scale)
    return _DecodePlan(
        out_shape=(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
        launches=plan,
        partial_shapes=decode_launch.partial_shapes(plan) if plan.combine is not None else None,
        bottom_right=bottom_right, tile_d=padded_head_dim(problem.head_dim))


def _reach(x: Any, tile_d: int) -> int:
    """The furthest element offset the kernel forms in torch tensor ``x`` (plus one)."""
    shape, strides = x.shape, x.stride()
    return ((shape[0] - 1) * abs(strides[0]) + (shape[1] - 1) * abs(strides[1])
            + (shape[2] - 1) * abs(strides[2]) + tile_d)


def _run_decode(plan: _DecodePlan, q: Any, k: Any, v: Any, device: int) -> Any:
    """Launch a decode plan on torch tensors whose key matched it; ``None`` when K/V fall
    outside what the key guarantees (the caller then takes the validating path)."""
    import torch

    seqlen_k = k.shape[2]
    if (v.shape != k.shape or k.stride(3) != 1 or v.stride(3) != 1
            or k.shape[0] * k.shape[1] * seqlen_k * plan.tile_d > INDEX_LIMIT
            or _reach(k, plan.tile_d) > INDEX_LIMIT or _reach(v, plan.tile_d) > INDEX_LIMIT):
        return None
    out = q.new_empty(plan.out_shape)
    partials = None
    if plan.partial_shapes is not None:
        opart, lse = plan.partial_shapes
        partials = (torch.empty(opart, dtype=torch.float32, device=q.device),
                    torch.empty(lse, dtype=torch.float32, device=q.device))
    offset = seqlen_k - plan.out_shape[2] if plan.bottom_right else 0
    decode_launch.launch(torch.cuda.current_stream(device), plan.launches, q, k, v, out, offset,
                         partials)
    return out


def sdpa(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any = False,
         scale: float | None = None, *, schedule: Any = None) -> Any:
    """``tiledattention.sdpa`` on ``runtime`` (see there)."""
    if schedule is not None and not isinstance(schedule, (Schedule, DecodeSchedule)):
        raise InputTypeError(
            f"schedule must be a tiledattention.Schedule, a tiledattention.DecodeSchedule or "
            f"None; got {type(schedule).__name__}")
    try:  # the signature of a torch call; anything else takes the general path
        seqlen_k = k.shape[2]
        device = q.get_device()
        # the types too: 1 == True == 1.0 hash alike, and the first call rejects some of them
        head = (q.shape, q.stride(), k.shape[0], k.shape[1], k.shape[3], q.dtype, k.dtype,
                v.dtype, device, k.get_device(), v.get_device(), causal, causal.__class__, scale,
                scale.__class__, schedule)
        decode_key = (head, length_bucket(seqlen_k))
        plan = runtime.plan(decode_key)
        if plan is not None:
            out = _run_decode(plan, q, k, v, device)
            if out is not None:
                return out
        forward_key = (head, seqlen_k, v.shape, k.stride(), v.stride())
        plan = runtime.plan(forward_key)
    except (AttributeError, TypeError):  # not torch tensors (CuPy), or unhashable arguments
        decode_key, forward_key, plan = None, None, None
    if plan is not None:
        import torch

        out = q.new_empty(plan.out_shape)
        ct.launch(torch.cuda.current_stream(device), plan.grid, plan.kernel,
                  (q, k, v, out, *plan.scalars))
        return out
    return _validated_call(runtime, q, k, v, causal, scale, schedule, decode_key, forward_key)


def _validated_call(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any, scale: Any,
                    schedule: Any, decode_key: Any, forward_key: Any) -> Any:
    """The general path: validate, choose the family, build (and keep) the plan, launch."""
    problem, kind = problem_from_arrays(q, k, v, causal, scale)
    device_index = q.device.index if kind == "torch" else q.device.id
    if schedule is None:
        family = choose_family(device_info(device_index).arch, bucket_problem(problem))
    else:
        family = DECODE if isinstance(schedule, DecodeSchedule) else FORWARD
    if family is DECODE:
        plan = _decode_plan(runtime, bucket_problem(problem), device_index, scale, schedule,
                            causal_flags(causal)[1])
        if kind == "torch":
            if decode_key is not None:
                runtime.keep_plan(decode_key, plan)
            return _run_decode(plan, q, k, v, device_index)  # never None: validated above
        import cupy

        with cupy.cuda.Device(device_index):
            out = cupy.empty(plan.out_shape, dtype=q.dtype)
            partials = None
            if plan.partial_shapes is not None:
                partials = tuple(cupy.empty(s, dtype=cupy.float32) for s in plan.partial_shapes)
            decode_launch.launch(cupy.cuda.get_current_stream(), plan.launches, q, k, v, out,
                                 problem.causal_offset, partials)
        return out

    plan = _forward_plan(runtime, problem, device_index, scale, schedule)
    if kind == "torch":
        import torch

        if forward_key is not None:
            runtime.keep_plan(forward_key, plan)
        out = torch.empty(plan.out_shape, dtype=q.dtype, device=q.device)
        stream = torch.cuda.current_stream(q.device)
    else:
        import cupy

        with cupy.cuda.Device(device_index):
            out = cupy.empty(plan.out_shape, dtype=q.dtype)
            stream = cupy.cuda.get_current_stream()
    ct.launch(stream, plan.grid, plan.kernel, (q, k, v, out, *plan.scalars))
    return out
