"""``tiledattention.sdpa``'s implementation: validate, pick the family, resolve a schedule
(memoised), allocate (or take the caller's ``out``), launch.

The hot path reuses a *plan* (kernel objects, grid, constant arguments) built for an earlier
call with the same signature. A signature holds everything about q and the call that a plan
depends on or that validation judged: q's shape and strides, the dtypes and devices of q, k and
v, ``causal``, ``scale`` (each with its type: ``1 == True == 1.0`` hash alike and the first call
rejects some of them), an explicit schedule and, with ``out=``, out's shape, strides, dtype,
device and ``requires_grad``. Then:

- forward plans are keyed by the signature and K/V's shapes and strides;
- decode plans do not depend on the cache length: they are keyed by the signature, K's batch,
  heads and head dim, and the length's *bucket* (the nearest power of two). In a generation
  loop, where the cache grows by one key per call, every call of a bucket reuses one plan
  (checking only what the key leaves out: K/V's shapes agree and fit the kernel's int32
  indexing); the schedule is looked up once per bucket, for the bucket's power-of-two length.
  A decode key is only looked for when q has no more rows than some decode plan kept so far
  (``_decode_rows``), so a prefill call costs one dict lookup, not two. A multi-split decode
  call's float32 partial buffers are kept by the runtime between calls (``_decode_partials``:
  per device, stream, thread and shapes; at most ``Runtime``'s ``max_workspaces`` sets, freed by
  ``runtime().clear()``).

Torch calls launch on ``torch._C._cuda_getCurrentRawStream(device)``, an int that ``ct.launch``
takes as a raw ``CUstream`` (cuTile's ``parse_stream`` accepts ``int``; it is what
``torch.cuda.current_stream(device).cuda_stream`` holds, without building a ``Stream`` object),
read on every call, so a caller may switch streams between calls.

``out=``: the caller's output buffer, ``[B, H_q, S_q, D]`` with q's dtype and device, last dim
contiguous, other strides free (the kernels store through strided views, as they load q), not
overlapping itself, q, k or v. Its layout is in the signature, so a warm call checks it with the
lookup; the overlap with q, k and v (addresses, not in the signature) is checked on every call.
"""

from __future__ import annotations

from threading import get_ident
from typing import Any, NamedTuple

import cuda.tile as ct

from ._device import device_info
from ._dispatch import choose_family
from ._runtime import Runtime
from .decode import DECODE, DecodeSchedule
from .decode import _launch as decode_launch
from .errors import InputTypeError, InputValueError
from .forward import FORWARD, Problem, Schedule, problem_from_arrays
from .forward._launch import default_scale, grid_for, kernel_args, kernel_for
from .forward._problem import INDEX_LIMIT, _check_reach, causal_flags, padded_head_dim

__all__ = ["sdpa", "length_bucket", "bucket_problem"]

# torch's functions the warm path calls, bound by the first torch call (``_bind_torch``) so that
# ``import tiledattention`` never imports torch and a warm call runs no import statement.
_raw_stream: Any = None  # device index -> torch's current stream there, as an int (CUstream)
_empty_like: Any = None
_empty: Any = None
_float32: Any = None
_current_device: Any = None  # () -> the current CUDA device's index
_capturing: Any = None  # () -> whether the current device's current stream is capturing

#: The most query rows of any decode plan kept (in any runtime): a call with more rows cannot
#: have a decode plan (q's shape is in the key), so it skips the decode lookup.
_decode_rows = 0


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
    like: bool = False  # q is contiguous: allocate out with torch.empty_like(q), the cheapest
    spans: tuple[int, int, int, int] | None = None  # bytes of q, k, v, out (calls with out=)


class _DecodePlan(NamedTuple):
    out_shape: tuple[int, int, int, int]
    launches: Any  # decode._launch.Launches
    partial_shapes: Any  # ((Opart shape), (Lse shape)), or None with one split
    bottom_right: bool  # the causal offset is S_k - S_q (else 0)
    tile_d: int
    like: bool = False  # as in _ForwardPlan
    spans: tuple[int, int, int] | None = None  # bytes of q and out, item size (with out=)


def _bind_torch() -> None:
    """Bind the torch functions the warm path calls (once; a test may have bound its own
    ``_raw_stream``, ``_current_device`` and ``_capturing``)."""
    global _raw_stream, _empty_like, _empty, _float32, _current_device, _capturing
    if _empty_like is not None:
        return
    import torch

    if _raw_stream is None:
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None:  # a torch without it: the Stream object's handle, the same int
            def raw(device: int) -> int:
                return torch.cuda.current_stream(device).cuda_stream
        _raw_stream = raw
    if _current_device is None:
        _current_device = torch.cuda.current_device
    if _capturing is None:
        _capturing = torch.cuda.is_current_stream_capturing
    _empty, _float32 = torch.empty, torch.float32
    _empty_like = torch.empty_like


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


def _span(shape: Any, strides: Any) -> int:
    """Elements from a torch tensor's first element to its last, plus one (strides >= 0)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def _reach(shape: Any, strides: Any, tile_d: int) -> int:
    """The furthest element offset the kernel forms in a ``[B, H, S, D]`` torch tensor of this
    layout (plus one): its last row's start plus the padded head dim it loads."""
    return ((shape[0] - 1) * strides[0] + (shape[1] - 1) * strides[1]
            + (shape[2] - 1) * strides[2] + tile_d)


def _clear_of(out: Any, out_bytes: int, q: Any, q_bytes: int, k: Any, k_bytes: int, v: Any,
              v_bytes: int) -> bool:
    """Whether torch tensor ``out`` shares no byte with q, k or v (each spanning so many
    bytes from its first element)."""
    o = out.data_ptr()
    end = o + out_bytes
    p = q.data_ptr()
    if p < end and o < p + q_bytes:
        return False
    p = k.data_ptr()
    if p < end and o < p + k_bytes:
        return False
    p = v.data_ptr()
    return not (p < end and o < p + v_bytes)


def _new_partials(shapes: Any, device: Any) -> tuple[Any, Any]:
    opart, lse = shapes
    return _empty(opart, dtype=_float32, device=device), _empty(lse, dtype=_float32, device=device)


def _decode_partials(runtime: Runtime, shapes: Any, q: Any, device: int, stream: int) -> Any:
    """The float32 (Opart, Lse) scratch buffers of a multi-split decode call, kept by the
    runtime per (device, stream, thread, shapes): calls in one stream's order reuse them (each
    call's combine has read them before the next call's split kernel writes them), and calls
    that may overlap in time (other streams, other threads) never share them. A stream being
    captured into a CUDA graph gets buffers of its own each call (from the graph's memory pool,
    as before), as does a call on a device other than the current one (whose capture state is
    not what ``_capturing`` reports)."""
    if device != _current_device() or _capturing():
        return _new_partials(shapes, q.device)
    key = (device, stream, get_ident(), shapes)
    found = runtime.workspace(key)
    if found is None:
        found = _new_partials(shapes, q.device)
        runtime.keep_workspace(key, found)
    return found


def _run_decode(runtime: Runtime, plan: _DecodePlan, q: Any, k: Any, v: Any, device: int,
                out: Any) -> Any:
    """Launch a decode plan on torch tensors whose key matched it; ``None`` when K/V fall
    outside what the key guarantees, or ``out`` overlaps q, k or v (the caller then takes the
    validating path, which says what is wrong)."""
    k_shape, k_strides, v_strides = k.shape, k.stride(), v.stride()
    tile_d = plan.tile_d
    if (v.shape != k_shape or k_strides[3] != 1 or v_strides[3] != 1
            or k_shape[0] * k_shape[1] * k_shape[2] * tile_d > INDEX_LIMIT
            or _reach(k_shape, k_strides, tile_d) > INDEX_LIMIT
            or _reach(k_shape, v_strides, tile_d) > INDEX_LIMIT):
        return None
    if out is None:
        out = _empty_like(q) if plan.like else q.new_empty(plan.out_shape)
    else:
        q_bytes, out_bytes, item = plan.spans
        if not _clear_of(out, out_bytes, q, q_bytes, k, _span(k_shape, k_strides) * item,
                         v, _span(k_shape, v_strides) * item):
            return None
    stream = _raw_stream(device)
    partials = None
    if plan.partial_shapes is not None:
        partials = _decode_partials(runtime, plan.partial_shapes, q, device, stream)
    offset = k_shape[2] - plan.out_shape[2] if plan.bottom_right else 0
    decode_launch.launch(stream, plan.launches, q, k, v, out, offset, partials)
    return out


def _decode_key(signature: tuple, k_shape: Any) -> tuple:
    return (signature, k_shape[0], k_shape[1], k_shape[3], length_bucket(k_shape[2]))


def _forward_key(signature: tuple, k: Any, v: Any) -> tuple:
    return (signature, k.shape, k.stride(), v.shape, v.stride())


def sdpa(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any = False,
         scale: float | None = None, *, schedule: Any = None, out: Any = None) -> Any:
    """``tiledattention.sdpa`` on ``runtime`` (see there); ``out``: the caller's output."""
    if schedule is not None and not isinstance(schedule, (Schedule, DecodeSchedule)):
        raise InputTypeError(
            f"schedule must be a tiledattention.Schedule, a tiledattention.DecodeSchedule or "
            f"None; got {type(schedule).__name__}")
    try:  # the signature of a torch call; anything else takes the general path
        q_shape = q.shape
        device = q.get_device()
        signature = (q_shape, q.stride(), q.dtype, device, k.dtype, k.get_device(), v.dtype,
                     v.get_device(), causal, causal.__class__, scale, scale.__class__, schedule)
        if out is not None:
            signature = (signature, out.shape, out.stride(), out.dtype, out.get_device(),
                         out.requires_grad)
        plan = None
        if q_shape[2] <= _decode_rows:
            plan = runtime.plan(_decode_key(signature, k.shape))
    except (AttributeError, TypeError, IndexError):  # not torch tensors (CuPy), unhashable
        return _validated_call(runtime, q, k, v, causal, scale, schedule, out, None)
    if plan is not None:
        result = _run_decode(runtime, plan, q, k, v, device, out)
        if result is not None:
            return result
    try:
        plan = runtime.plan(_forward_key(signature, k, v))
    except (AttributeError, TypeError, IndexError):
        plan = None
    if plan is not None:
        out_shape, grid, kernel, scalars, like, spans = plan
        if out is None:
            out = _empty_like(q) if like else q.new_empty(out_shape)
        elif not _clear_of(out, spans[3], q, spans[0], k, spans[1], v, spans[2]):
            return _validated_call(runtime, q, k, v, causal, scale, schedule, out, signature)
        ct.launch(_raw_stream(device), grid, kernel, (q, k, v, out) + scalars)
        return out
    return _validated_call(runtime, q, k, v, causal, scale, schedule, out, signature)


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


def _check_out(out: Any, q: Any, k: Any, v: Any, problem: Problem, kind: str) -> None:
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
    if out.dtype != q.dtype:
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
    _check_reach("out", out, kind, padded_head_dim(problem.head_dim))
    lo, hi = _byte_range(shape, strides, item, ptr)
    for name, x in (("q", q), ("k", k), ("v", v)):
        x_lo, x_hi = _byte_range(*_layout(x, kind))
        if lo < x_hi and x_lo < hi:
            raise InputValueError(
                f"out must not overlap {name} (the kernels read {name} while writing out); got "
                f"out in bytes [{lo:#x}, {hi:#x}) and {name} in [{x_lo:#x}, {x_hi:#x}): pass "
                f"a separate buffer")


def _validated_call(runtime: Runtime, q: Any, k: Any, v: Any, causal: Any, scale: Any,
                    schedule: Any, out: Any, signature: tuple | None) -> Any:
    """The general path: validate, choose the family, build (and keep) the plan, launch.
    ``signature``: the warm path's signature of a torch call (``None``: none, keep no plan)."""
    global _decode_rows
    problem, kind = problem_from_arrays(q, k, v, causal, scale)
    if out is not None:
        _check_out(out, q, k, v, problem, kind)
    device_index = q.device.index if kind == "torch" else q.device.id
    if schedule is None:
        family = choose_family(device_info(device_index).arch, bucket_problem(problem))
    else:
        family = DECODE if isinstance(schedule, DecodeSchedule) else FORWARD
    if family is DECODE:
        plan = _decode_plan(runtime, bucket_problem(problem), device_index, scale, schedule,
                            causal_flags(causal)[1])
        if kind == "torch":
            _bind_torch()
            plan = _for_torch(plan, q, out)
            if signature is not None:
                runtime.keep_plan(_decode_key(signature, k.shape), plan)
                _decode_rows = max(_decode_rows, problem.seqlen_q)
            return _run_decode(runtime, plan, q, k, v, device_index, out)  # validated: not None
        import cupy

        with cupy.cuda.Device(device_index):
            if out is None:
                out = cupy.empty(plan.out_shape, dtype=q.dtype)
            partials = None
            if plan.partial_shapes is not None:
                partials = tuple(cupy.empty(s, dtype=cupy.float32) for s in plan.partial_shapes)
            decode_launch.launch(cupy.cuda.get_current_stream(), plan.launches, q, k, v, out,
                                 problem.causal_offset, partials)
        return out

    plan = _forward_plan(runtime, problem, device_index, scale, schedule)
    if kind == "torch":
        _bind_torch()
        plan = _for_torch(plan, q, out, k, v)
        if signature is not None:
            runtime.keep_plan(_forward_key(signature, k, v), plan)
        if out is None:
            out = _empty_like(q) if plan.like else q.new_empty(plan.out_shape)
        stream = _raw_stream(device_index)
    else:
        import cupy

        with cupy.cuda.Device(device_index):
            if out is None:
                out = cupy.empty(plan.out_shape, dtype=q.dtype)
            stream = cupy.cuda.get_current_stream()
    ct.launch(stream, plan.grid, plan.kernel, (q, k, v, out) + plan.scalars)
    return out


def _for_torch(plan: Any, q: Any, out: Any, k: Any = None, v: Any = None) -> Any:
    """``plan`` with what a warm torch call needs besides: whether ``torch.empty_like(q)`` is
    the contiguous output (q's strides are the contiguous ones; size-1 dims included, since
    empty_like copies them), and with ``out=`` the byte spans the overlap check compares (k
    and v's for a forward plan only: a decode key leaves their strides out)."""
    shape, strides = tuple(q.shape), tuple(q.stride())
    contiguous, step = [], 1
    for n in reversed(shape):
        contiguous.append(step)
        step *= n
    like = strides == tuple(reversed(contiguous))
    spans = None
    if out is not None:
        item = q.element_size()
        q_bytes = _span(shape, strides) * item
        out_bytes = _span(out.shape, out.stride()) * item
        if k is None:
            spans = (q_bytes, out_bytes, item)
        else:
            spans = (q_bytes, _span(k.shape, k.stride()) * item,
                     _span(v.shape, v.stride()) * item, out_bytes)
    return plan._replace(like=like, spans=spans)
