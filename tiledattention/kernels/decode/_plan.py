"""The decode family's launch plan and how ``sdpa`` keeps it: plans do not depend on the cache
length, so one is kept per length *bucket* (the nearest power of two: ``length_bucket``) and
resolved for the bucket's length (``bucket_problem``). In a generation loop, where the cache
grows by one key per call, every call of a bucket reuses one plan (checking only what the key
leaves out: K/V's shapes agree and fit the kernels' int32 indexing), and the schedule is looked
up once per bucket. A sliding window travels with the plan as launch-time values, and the
kernel places each call's key walk from them and that call's causal offset: the window's start
follows the cache as it grows. The window is the caller's (``Call.window``): a problem's
canonical form drops a window side that binds no key at its own length, and a later, longer
call of the bucket may need it.

A multi-split call's float32 partial buffers (a flat walk's and a longest-first call's with the
arrays cut from them) are kept by the runtime between calls
(``_partials``: per device, stream, thread and shapes; at most ``Runtime``'s
``max_workspaces`` sets, freed by ``runtime().clear()``), unless the call says otherwise
(``sdpa(keep_scratch=False)``: the torch op does, since torch.compile's CUDA graph trees run an
op's first calls with its allocations routed into the graph's memory pool and refuse a pool
allocation that outlives the call without being one of its outputs)."""

from __future__ import annotations

from threading import get_ident
from typing import Any

from ...core import _plans as hot
from ...core._plans import Plan, clear_of, contiguous_like, out_spans, reach, span
from ...core._call import Call
from ...core._device import device_info
from ...core._problem import INDEX_LIMIT, Problem, padded_head_dim
from . import _launch
from ._schedule import DecodeSchedule

__all__ = ["DecodePlan", "decode_plan", "length_bucket", "bucket_problem", "decode_plan_key"]


def length_bucket(seqlen_k: int) -> int:
    """The exponent of the power of two nearest ``seqlen_k`` (in log scale): lengths in
    ``[2^(n-1/2), 2^(n+1/2))`` share bucket ``n``."""
    if seqlen_k < 1:
        return -1  # no plan is kept for it: the validating path rejects the empty cache
    n = seqlen_k.bit_length() - 1  # 2^n <= seqlen_k < 2^(n+1)
    return n + 1 if seqlen_k * seqlen_k >= 2 << (2 * n) else n


def bucket_problem(problem: Problem) -> Problem:
    """``problem`` with ``seqlen_k`` at its bucket's power of two (the problem a decode plan is
    resolved for); ``problem`` itself where that length is not a valid problem, or where its
    canonical form would drop a window side that binds at ``problem``'s length (the plan's
    kernels must keep the window)."""
    length = 1 << length_bucket(problem.seqlen_k)
    if length == problem.seqlen_k:
        return problem
    fields = problem.to_dict()
    fields["seqlen_k"] = length
    try:
        bucketed = Problem.from_dict(fields)
    except ValueError:  # e.g. the rounded-up length passes the int32 index limit
        return problem
    if (bucketed.window_left, bucketed.window_right) != (problem.window_left,
                                                         problem.window_right):
        return problem
    return bucketed


def decode_plan_key(signature: tuple, k: Any, v: Any) -> tuple:
    k_shape = k.shape
    return (signature, k_shape[0], k_shape[1], k_shape[3], length_bucket(k_shape[2]))


def _new_scratch(plan: "DecodePlan", q: Any) -> Any:
    return _launch.new_scratch(plan.launches,
                               lambda shape: hot.empty(shape, dtype=hot.float32, device=q.device))


def _partials(runtime: Any, plan: "DecodePlan", q: Any, device: int, stream: int) -> Any:
    """The scratch of a multi-split, flat or longest-first call (``_launch.new_scratch``: float32
    buffers and the arrays cut from them), kept by the runtime per (device, stream,
    thread, shapes): calls in one stream's order reuse them (each call's combine has read them
    before the next call's split kernel writes them), and calls that may overlap in time
    (other streams, other threads) never share them. A stream being captured into a CUDA
    graph gets buffers of its own each call (from the graph's memory pool), as does a call on
    a device other than the current one (whose capture state is not what ``capturing``
    reports), or a call without a ``runtime`` to keep them."""
    if runtime is None or device != hot.current_device() or hot.capturing():
        return _new_scratch(plan, q)
    key = (device, stream, get_ident(), plan.partial_shapes)
    found = runtime.workspace(key)
    if found is None:
        found = _new_scratch(plan, q)
        runtime.keep_workspace(key, found)
    return found


class DecodePlan(Plan):
    __slots__ = ("out_shape", "launches", "partial_shapes", "bottom_right", "tile_d", "like",
                 "spans")

    def __init__(self, out_shape: tuple, launches: Any, partial_shapes: Any, bottom_right: bool,
                 tile_d: int, like: bool = False, spans: tuple | None = None) -> None:
        self.out_shape = out_shape
        self.launches = launches  # decode._launch.Launches
        self.partial_shapes = partial_shapes  # _launch.partial_shapes; None: no scratch
        self.bottom_right = bottom_right  # the causal offset is S_k - S_q (else 0)
        self.tile_d = tile_d
        self.like = like  # as in ForwardPlan
        self.spans = spans  # bytes of q and out, item size (with out=; K/V's are per call)

    def for_torch(self, q: Any, out: Any, k: Any, v: Any) -> "DecodePlan":
        return DecodePlan(self.out_shape, self.launches, self.partial_shapes, self.bottom_right,
                          self.tile_d, contiguous_like(q), out_spans(q, out))

    def run(self, runtime: Any, q: Any, k: Any, v: Any, device: int, out: Any,
            sinks: Any = None, ranges: Any = None, pages: Any = None,
            descales: tuple = (), order: Any = None) -> Any:
        """As :meth:`Plan.run`; ``sinks``: the call's float32 contiguous ``[H_q]`` sink logits
        (validated by the caller) when the plan's problem has sinks; ``ranges``: a ragged
        plan's int32 ``[4, B]`` query and key ranges; ``pages``: a paged plan's int32 block
        table (``k`` and ``v`` then page pools; both validated by the caller); ``descales``:
        an FP8 cache's float32 ``[B, H_kv]`` factors of q, k and v (``Problem.kv_dtype``:
        q's is unused); ``order``: a paged plan's entries ranked by the caller
        (``tiledattention.PagedOrder``'s entries; ``_launch.launch``)."""
        k_shape, k_strides, v_strides = k.shape, k.stride(), v.stride()
        tile_d = self.tile_d
        if (v.shape != k_shape or k_strides[3] != 1 or v_strides[3] != 1
                or k_shape[0] * k_shape[1] * k_shape[2] * tile_d > INDEX_LIMIT
                or reach(k_shape, k_strides, tile_d) > INDEX_LIMIT
                or reach(k_shape, v_strides, tile_d) > INDEX_LIMIT):
            return None
        if out is None:
            out = hot.empty_like(q) if self.like else q.new_empty(self.out_shape)
        else:
            q_bytes, out_bytes, item = self.spans
            if k.dtype is not q.dtype:  # an FP8 cache: K and V elements have sizes of their own
                item = k.element_size()
            if not clear_of(out, out_bytes, q, q_bytes, k, span(k_shape, k_strides) * item,
                            v, span(k_shape, v_strides) * item):
                return None
        stream = hot.raw_stream(device)
        partials = None
        if self.partial_shapes is not None:
            partials = _partials(runtime, self, q, device, stream)
        offset = k_shape[2] - self.out_shape[2] if self.bottom_right else 0
        _launch.launch(stream, self.launches, q, k, v, out, offset, partials, sinks, ranges,
                       pages, descales[1:] or None, order)
        return out

    def run_cupy(self, q: Any, k: Any, v: Any, out: Any, problem: Problem,
                 sinks: Any = None) -> Any:
        import cupy

        with cupy.cuda.Device(q.device.id):
            if out is None:
                out = cupy.empty(self.out_shape, dtype=q.dtype)
            partials = _launch.new_scratch(self.launches,
                                           lambda shape: cupy.empty(shape, dtype=cupy.float32))
            offset = problem.seqlen_k - problem.seqlen_q if self.bottom_right else 0
            _launch.launch(cupy.cuda.get_current_stream(), self.launches, q, k, v, out,
                           offset, partials, sinks)
        return out


def flat_sms(schedule: DecodeSchedule, device_index: int) -> int:
    """The SMs of device ``device_index`` for a flat schedule's wave (the device is asked
    only then); ``_launch.DEFAULT_SMS`` otherwise, which no other launch depends on."""
    if not schedule.flat:
        return _launch.DEFAULT_SMS
    return device_info(device_index).sm_count


def decode_plan(call: Call, schedule: DecodeSchedule, device_index: int) -> DecodePlan:
    """The plan for every length of ``call``'s problem's bucket (resolved for the bucket's
    length). The caller's alignment and window (``call.bottom_right``, ``call.window``) decide
    the causal offset and the key walk: the problem's canonical form drops bottom-right where
    it equals top-left (S_q == S_k) or masks nothing, and a window side that binds no key at
    this length, and a later call of the bucket may have another length."""
    problem = call.problem
    launches = _launch.launches(bucket_problem(problem), schedule, call.scale, call.window,
                                sms=flat_sms(schedule, device_index))
    return DecodePlan(
        out_shape=(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim),
        launches=launches,
        partial_shapes=(_launch.partial_shapes(launches) if launches.scratch
                        else None),
        bottom_right=call.bottom_right,
        tile_d=padded_head_dim(problem.head_dim))
