"""Packed variable-length attention on torch tensors (``tiledattention.varlen_attn``), with
torch's ``torch.nn.attention.varlen.varlen_attn`` shapes and semantics: ``query [T_q, H_q, D]``,
``key, value [T_k, H_kv, D]``, int32 cumulative offsets ``cu_seq_q, cu_seq_k [N + 1]`` and the
longest lengths ``max_q, max_k`` (the caller's word: nothing reads the offsets on the host).

Sequence ``i`` is query rows ``cu_seq_q[i]:cu_seq_q[i + 1]`` against keys
``cu_seq_k[i]:cu_seq_k[i + 1]``. Causal masks align per sequence: bottom-right (the queries are
a sequence's last positions; FlashAttention's and torch's varlen convention, and the same as
top-left where a sequence has as many queries as keys) or top-left; a window ``(left, right)``
composes with the same alignment. A call whose queries and keys share one offsets tensor
(``cu_seq_k is cu_seq_q``: self-attention over packed sequences) has as many queries as keys
in every sequence, where the two alignments are one mask: its bucket is the bottom-right one
whichever was asked, the alignment the shipped table's causal ragged rows are keyed by
(``is_causal=True``'s). Rows outside every sequence come out as zeros, and get zero
gradients.

The forward and the backward run the forward and backward families' kernels on ``[1, H,
tokens, D]`` views of the packed tensors, each sequence cut out by its range
(``tiledattention.core._ragged``); the schedules are looked up for the batch's bucket
(``ragged_problem``). Autograd and ``torch.compile`` go through two custom ops,
``tiledattention::varlen_fwd`` and ``tiledattention::varlen_bwd``, with fake implementations.

A repeated call takes a warm path, as ``sdpa``'s does: its *signature* (the five tensors'
shapes, strides, dtypes and devices, whether the offsets are one tensor, ``max_q``, ``max_k``,
the mask, window, scale and ``enable_gqa`` with their types) keys what its first call
validated and resolved (``_Packed``: the bucket's problem, the longest lengths, the scale, each
operation's family and schedule), kept in the runtime beside ``sdpa``'s plans. A warm call
reads the offsets into ranges, allocates and launches. The eager training route's backward
reuses its forward's kept call and ranges.

A padded ``[B, H, S, D]`` batch with per-entry ranges (``tiledattention.sdpa(..., ranges=)``,
:func:`padded_forward`) runs the same forward kernels, each entry cut to its ranges.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import torch

from ..core import _plans as hot
from ..core._device import device_info
from ..core._dispatch import choose_family
from ..core._dtypes import dtype_of
from ..core._problem import (BOTTOM_RIGHT, INDEX_LIMIT, SUPPORTED_HEAD_DIMS, TOP_LEFT,
                             causal_flags, check_attention_tensors, check_cuda, check_reach,
                             default_scale, padded_head_dim, problem_of_arrays, sink_logits,
                             variant_args)
from ..core._ragged import (RaggedLayout, packed_ranges, packed_row_stat,
                            packed_row_stat_length, packed_view, ragged_problem)
from ..core._runtime import Runtime, runtime
from ..core._work_table import GRID_Y_LIMIT
from ..errors import (InputTypeError, InputValueError, UnsupportedOperationError,
                      UnsupportedProblemError)
from ._autograd import eager
from ._ragged_fill import clear_uncovered_rows

__all__ = ["varlen_attn", "varlen_forward", "varlen_backward", "padded_forward",
           "explain_varlen", "check_ranges", "FWD_OP_NAME", "BWD_OP_NAME"]

FWD_OP_NAME = "tiledattention::varlen_fwd"
BWD_OP_NAME = "tiledattention::varlen_bwd"


# -- validation ---------------------------------------------------------------------------------
def _check_packed(query: Any, key: Any, value: Any, enable_gqa: bool) -> str:
    """Check the packed tensors; return the dtype's name."""
    packed = "[tokens, heads, head_dim]"
    check_attention_tensors(("query", "key", "value"), query, key, value, packed, packed)
    d = query.shape[2]
    if key.shape[2] != d:
        raise InputValueError(f"key must have the head_dim of query ({d}); got {key.shape[2]}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise InputValueError(f"head_dim must be a multiple of 8 in 32..256; got {d}")
    _check_grouping(query, key, enable_gqa)
    hq, hkv = query.shape[1], key.shape[1]
    if hq % hkv:
        raise InputValueError(f"query's heads ({hq}) must be a multiple of key's heads ({hkv})")
    return dtype_of("query", query)


def _check_grouping(query: Any, key: Any, enable_gqa: bool) -> None:
    hq, hkv = query.shape[1], key.shape[1]
    if hq != hkv and not enable_gqa:
        raise InputValueError(f"query has {hq} heads and key {hkv}: pass enable_gqa=True for "
                              f"grouped-query attention")


def _check_flags(**flags: Any) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise InputTypeError(f"{name} must be a bool; got {type(value).__name__}")


def _check_offsets(cu_seq_q: Any, cu_seq_k: Any, query: Any, key: Any) -> None:
    for name, cu in (("cu_seq_q", cu_seq_q), ("cu_seq_k", cu_seq_k)):
        if not isinstance(cu, torch.Tensor):
            raise InputTypeError(f"{name} must be an int32 torch.Tensor [sequences + 1]; got "
                                 f"{type(cu).__name__}")
        if cu.dtype not in (torch.int32, torch.int64) or cu.dim() != 1 or cu.shape[0] < 2:
            raise InputValueError(f"{name} must be a 1-dim int32 tensor of at least 2 offsets "
                                  f"[sequences + 1]; got {cu.dtype} of shape {tuple(cu.shape)}")
        if cu.device != query.device:
            raise InputValueError(f"{name} must be on query's device {query.device}; got "
                                  f"{cu.device}")
    if cu_seq_q.shape != cu_seq_k.shape:
        raise InputValueError(f"cu_seq_q and cu_seq_k must have one length (sequences + 1); "
                              f"got {cu_seq_q.shape[0]} and {cu_seq_k.shape[0]}")


def _check_max(name: str, value: Any, tokens: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputTypeError(f"{name} must be an int; got {type(value).__name__}")
    if not 1 <= value <= INDEX_LIMIT:
        raise InputValueError(f"{name} must be at least 1 (the longest sequence's length); got "
                              f"{value}")
    return min(value, tokens)  # no sequence is longer than the tokens


def _alignment(is_causal: Any) -> tuple[bool, bool]:
    """``(causal, bottom_right)`` of ``is_causal``: ``True`` / ``"bottom_right"`` (torch's
    varlen convention), ``"top_left"``, or ``False`` (no mask; a window still aligns
    bottom-right, as FlashAttention's and torch's do)."""
    if is_causal is True or is_causal == BOTTOM_RIGHT:
        return True, True
    if is_causal == TOP_LEFT:
        return True, False
    if is_causal is False:
        return False, True
    raise InputValueError(f"is_causal must be True, False, {BOTTOM_RIGHT!r} or {TOP_LEFT!r}; got "
                          f"{is_causal!r}"[:200])


def _mask_of(is_causal: Any, window_size: Any) -> tuple[bool, bool, int, int]:
    """``(causal, bottom_right, left, right)`` of torch's ``is_causal`` and ``window_size``:
    ``window_size=(-1, 0)`` (and any ``(left, 0)``) is torch's spelling of causal."""
    causal, bottom_right = _alignment(is_causal)
    left, right, _ = variant_args(window_size, None)
    if not causal and right == 0:
        causal, bottom_right = True, True
    return causal, bottom_right, left, right


def _check_scale(scale: Any) -> None:
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise InputTypeError(f"scale must be a float or None; got {type(scale).__name__}")
    if not math.isfinite(scale) or scale <= 0:
        raise InputValueError(f"scale must be a finite positive number; got {scale}")


def _check_grid(sequences: int, heads_q: int) -> None:
    """A padded ragged call's grids (``ranges=``: the forward's, or the split-KV decode
    kernels') hold sequences x query heads in a dimension of at most ``GRID_Y_LIMIT``. (A
    packed call has no such limit: past it its launches walk work tables.)"""
    if sequences * heads_q > GRID_Y_LIMIT:
        raise UnsupportedProblemError(
            f"a padded ragged batch holds at most {GRID_Y_LIMIT} sequences x query heads; got "
            f"{sequences} x {heads_q}: split the batch")


def _prepare(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, scale, window,
             enable_gqa) -> "_Packed":
    """Validate a call; what it judged, as a :class:`_Packed`."""
    dtype = _check_packed(query, key, value, enable_gqa)
    _check_offsets(cu_seq_q, cu_seq_k, query, key)
    longest_q = _check_max("max_q", max_q, query.shape[0])
    longest_k = _check_max("max_k", max_k, key.shape[0])
    causal, bottom_right = _alignment(is_causal)
    left, right, _ = variant_args(window, None)
    _check_scale(scale)
    sequences = cu_seq_q.shape[0] - 1
    # one offsets tensor for both: every sequence has as many queries as keys, where top-left
    # is bottom-right (the module docstring)
    problem = ragged_problem(sequences=sequences, tokens_q=query.shape[0], longest_q=longest_q,
                             longest_k=longest_k, heads_q=query.shape[1],
                             heads_kv=key.shape[1], head_dim=query.shape[2], dtype=dtype,
                             causal=causal, bottom_right=bottom_right or cu_seq_k is cu_seq_q,
                             window=(left, right))
    for name, x in (("query", query), ("key", key), ("value", value)):
        check_reach(name, packed_view(x), "torch", padded_head_dim(problem.head_dim))
    # last: a wrong argument is named even on CPU tensors
    check_cuda((("query", query), ("key", key), ("value", value)), "torch")
    return _Packed(problem, longest_q, longest_k,
                   default_scale(problem) if scale is None else float(scale))


class _Packed:
    """A packed call as its first call of one signature validated it (``_prepare``), kept in
    the runtime by that signature (:func:`_validated`): the bucket's problem, the longest
    lengths, the scale, and the family and schedule each operation resolved on its first
    use. A later call of the signature reads the offsets into ranges and launches."""

    __slots__ = ("problem", "longest_q", "longest_k", "scale", "_resolved")

    def __init__(self, problem: Any, longest_q: int, longest_k: int, scale: float) -> None:
        self.problem = problem
        self.longest_q = longest_q
        self.longest_k = longest_k
        self.scale = scale
        self._resolved: dict[str, tuple[Any, Any]] = {}

    def resolved(self, runtime: Runtime, operation: str, device: int) -> tuple[Any, Any]:
        """``(family, schedule)`` of ``operation`` ("sdpa_with_lse" or "sdpa_backward")."""
        found = self._resolved.get(operation)
        if found is None:
            family = choose_family(device_info(device).arch, self.problem, operation)
            found = (family, runtime.resolution(family, self.problem, device).schedule)
            self._resolved[operation] = found
        return found

    def layout(self, cu_seq_q: Any, cu_seq_k: Any) -> RaggedLayout:
        """The call's ``RaggedLayout``: its offsets as ranges, on their device."""
        return RaggedLayout(packed_ranges(cu_seq_q, cu_seq_k), self.longest_q, self.longest_k,
                            True)


def _signature(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, scale, window,
               enable_gqa) -> tuple | None:
    """The warm-path key of a call on torch tensors: every fact ``_prepare`` judged (the five
    tensors' layouts, whether the offsets are one tensor, the other arguments with their
    types); ``None`` for CuPy arrays or an unhashable argument, which always validate."""
    try:
        key = ("varlen", hot.layouts(query, key, value, cu_seq_q, cu_seq_k),
               cu_seq_k is cu_seq_q, max_q,
               max_q.__class__, max_k, max_k.__class__, is_causal, is_causal.__class__, scale,
               scale.__class__, window, window.__class__, enable_gqa, enable_gqa.__class__)
        hash(key)
        return key
    except (AttributeError, TypeError):
        return None


def _validated(runtime: Runtime, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
               is_causal, scale, window, enable_gqa) -> _Packed:
    """The call's :class:`_Packed`: kept by its signature in ``runtime``, or validated now
    (and kept)."""
    signature = _signature(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal,
                           scale, window, enable_gqa)
    packed = None if signature is None else runtime.plan(signature)
    if packed is None:
        packed = _prepare(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal,
                          scale, window, enable_gqa)
        hot.bind_torch()
        if signature is not None:
            runtime.keep_plan(signature, packed)
    return packed


# -- the runtime's entry points -----------------------------------------------------------------
def varlen_forward(runtime: Runtime, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *,
                   is_causal: Any = False, scale: Optional[float] = None,
                   window: Any = None, enable_gqa: bool = False):
    """``(out, lse)``: the output ``[T_q, H_q, D]`` (rows outside every sequence are zeros) and
    the base-2 log-sum-exp of the scaled scores, float32 ``[1, H_q, T_q]`` (rows outside every
    sequence undefined), for :func:`varlen_backward`."""
    packed = _validated(runtime, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                        is_causal, scale, window, enable_gqa)
    return _run_forward(runtime, query, key, value, packed, packed.layout(cu_seq_q, cu_seq_k))


def _run_forward(runtime: Runtime, query, key, value, packed: _Packed, layout: RaggedLayout):
    """:func:`varlen_forward` of a call ``_prepare`` validated (``packed``), with its
    ``layout``."""
    device = query.get_device()
    family, schedule = packed.resolved(runtime, "sdpa_with_lse", device)
    out = hot.empty_like(query, memory_format=hot.contiguous_format)
    lse = packed_row_stat(query.shape[1], query.shape[0], query.device)
    stream = hot.raw_stream(device)
    out_view = packed_view(out)
    family.forward_with_lse(stream, packed_view(query), packed_view(key), packed_view(value),
                            out_view, lse, packed.problem, schedule, packed.scale, device,
                            ragged=layout)
    clear_uncovered_rows(stream, out_view, layout.ranges, 0)  # tokens of no sequence: zeros
    return out, lse


def varlen_backward(runtime: Runtime, grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k,
                    max_q, max_k, *, is_causal: Any = False, scale: Optional[float] = None,
                    window: Any = None, enable_gqa: bool = False):
    """``(dq, dk, dv)`` of :func:`varlen_forward`'s output given ``grad_out`` (zeros outside
    every sequence)."""
    packed = _validated(runtime, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                        is_causal, scale, window, enable_gqa)
    for name, x in (("grad_out", grad_out), ("out", out)):
        if (not isinstance(x, torch.Tensor) or x.shape != query.shape
                or x.dtype != query.dtype or x.device != query.device):
            raise InputValueError(f"{name} must be a tensor like query {tuple(query.shape)}, "
                                  f"{query.dtype}, {query.device}")
    stat = (1, query.shape[1], query.shape[0])
    if (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != stat
            or lse.dtype != torch.float32 or lse.stride(-1) != 1):
        raise InputValueError(f"lse must be the float32 {list(stat)} log-sum-exp varlen_forward "
                              f"returned")
    return _run_backward(runtime, grad_out, query, key, value, out, lse, packed,
                         packed.layout(cu_seq_q, cu_seq_k))


def _run_backward(runtime: Runtime, grad_out, query, key, value, out, lse, packed: _Packed,
                  layout: RaggedLayout):
    """:func:`varlen_backward` of a call ``_prepare`` validated (``packed``; ``grad_out``,
    ``out`` and ``lse`` as its forward made them), with its ``layout``."""
    device = query.get_device()
    family, schedule = packed.resolved(runtime, "sdpa_backward", device)
    form = hot.contiguous_format
    grads = tuple(hot.empty_like(x, memory_format=form) for x in (query, key, value))
    delta = packed_row_stat(query.shape[1], query.shape[0], query.device)
    grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    stream = hot.raw_stream(device)
    # rows of no sequence get zero gradients: the backward's prologue clears them (packed)
    family.backward(stream, packed.problem, schedule, packed.scale,
                    *(packed_view(x) for x in (query, key, value, out, grad_out)), lse, delta,
                    tuple(packed_view(g) for g in grads), ragged=layout)
    return grads


def explain_varlen(runtime: Runtime, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *,
                   is_causal: Any = False, window: Any = None, enable_gqa: bool = False,
                   training: bool = False, seqused_k: Any = None, block_table: Any = None):
    """The :class:`Resolution` the call's bucket gets (the forward's; with ``training``, the
    backward's); over a paged cache (``seqused_k``, ``block_table``), the paged call's."""
    _check_flags(enable_gqa=enable_gqa, training=training)
    if block_table is not None or seqused_k is not None:
        if training:
            raise UnsupportedOperationError("a paged cache is for inference: it has no "
                                            "autograd (leave training=False)")
        from ._paged import explain_paged
        from ._paged_mixed import explain_packed_paged

        packed, longest_q, longest_k, causal, window = _paged_call(
            query, key, cu_seq_q, max_q, max_k, is_causal, window, enable_gqa, seqused_k,
            block_table)
        if packed:
            return explain_packed_paged(runtime, query, key, value, cu_seq_q, block_table,
                                        seqused_k, longest_q, longest_k, causal=causal,
                                        window=window)
        q4 = query.unflatten(0, (cu_seq_q.shape[0] - 1, longest_q)).transpose(1, 2)
        return explain_paged(runtime, q4, key, value, block_table, seqused_k, causal=causal,
                             window=window, max_k=longest_k)
    problem = _prepare(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, None,
                       window, enable_gqa).problem
    device = query.device.index
    operation = "sdpa_backward" if training else "sdpa_with_lse"
    family = choose_family(device_info(device).arch, problem, operation)
    return runtime.resolution(family, problem, device)


def padded_forward(runtime: Runtime, q, k, v, causal: Any, scale: Optional[float], ranges, *,
                   window: Any = None, softcap: Any = None, sinks: Any = None,
                   schedule: Any = None, out: Any = None, keep_scratch: bool = True):
    """``tiledattention.sdpa(..., ranges=)``: a padded ``[B, H, S, D]`` batch whose entries
    attend within their ranges (an int32 ``[4, B]`` tensor: query starts, query ends, key
    starts, key ends): on the family ``sdpa`` picks for the shape where it takes the ranges
    (the split-KV decode kernels for few query rows, bottom-right), else on the forward
    family's ragged kernels. A decode call without sinks that repeats an earlier one's
    signature (``core._plans.warm_key``) runs the plan that call kept, unvalidated (a static
    cache's decode steps: one signature a step)."""
    key = None
    if sinks is None and schedule is None and out is None:
        try:
            key = hot.warm_key("ranged", (q, k, v, ranges), causal, scale, window, softcap)
            plan = runtime.plan(key)
        except (AttributeError, TypeError):  # not torch tensors; an unhashable argument
            key = plan = None
        if plan is not None:
            result = plan.run(runtime if keep_scratch else None, q, k, v, q.get_device(), None,
                              ranges=ranges)
            if result is not None:
                return result  # else the plan's checks refused the arrays: validation says
    if not isinstance(q, torch.Tensor):
        raise InputTypeError(f"ranges= takes torch tensors; got q of type "
                             f"{type(q).__module__}.{type(q).__name__}")
    check_ranges(q, ranges)
    problem, kind = problem_of_arrays(q, k, v, causal, scale, window, softcap, sinks)
    _check_grid(problem.batch, problem.heads_q)
    if schedule is not None or out is not None:
        raise InputValueError("ranges= takes no schedule= or out= (the lookup picks the ragged "
                              "schedule; the output is new); got "
                              + ("schedule" if schedule is not None else "out"))
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise UnsupportedOperationError(
            "ranges= has no autograd: for training on sequences of their own lengths, pack "
            "them and call tiledattention.varlen_attn")
    logits = None if sinks is None else sink_logits(sinks, problem.heads_q, q, kind)
    check_cuda((("q", q), ("k", k), ("v", v)), kind)  # last: a wrong argument is named first
    # the call's own alignment and window: the canonical form judged them at S_q and S_k,
    # and each entry's ranges have lengths of their own
    is_causal, bottom_right = causal_flags(causal)
    bucket = ragged_problem(sequences=problem.batch, tokens_q=problem.batch * problem.seqlen_q,
                            longest_q=problem.seqlen_q, longest_k=problem.seqlen_k,
                            heads_q=problem.heads_q, heads_kv=problem.heads_kv,
                            head_dim=problem.head_dim, dtype=problem.dtype, causal=is_causal,
                            bottom_right=bottom_right,
                            window=variant_args(window, None)[:2], softcap=problem.softcap,
                            sinks=problem.sinks)
    device = q.device.index
    arch = device_info(device).arch
    family = choose_family(arch, bucket, "sdpa_with_lse")
    # few query rows: the family sdpa picks for the padded shape itself (the split-KV decode
    # kernels, which take the ranges as launch values) where it is not the forward
    shape = dataclasses.replace(bucket, batch=problem.batch, seqlen_q=problem.seqlen_q,
                                seqlen_k=problem.seqlen_k)
    rows = choose_family(arch, shape)
    if rows is not family:
        plan = hot.kept_plan(runtime, "ranges", rows, shape, device, scale, causal, q, k, v)
        result = plan.run(runtime if keep_scratch else None, q, k, v, device, None,
                          sinks=logits, ranges=ranges)
        if result is not None:
            if key is not None:
                runtime.keep_plan(key, plan)
            return result  # else the plan's checks refused the arrays: the forward runs it
    chosen = runtime.resolution(family, bucket, device).schedule
    result = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    layout = RaggedLayout(ranges, problem.seqlen_q, problem.seqlen_k, False)
    family.forward_with_lse(torch.cuda.current_stream(q.device), q, k, v, result, None, bucket,
                            chosen, default_scale(problem) if scale is None else float(scale),
                            device, sinks=logits, ragged=layout)
    return result


def check_ranges(q: torch.Tensor, ranges: Any) -> None:
    """``ranges`` is an int32 ``[4, B]`` tensor on q's device, else an ``InputValueError``
    (what tracing can check: the values stay on the device)."""
    if q.dim() != 4:
        return  # q's own check names q's shape
    batch = q.shape[0]
    if (not isinstance(ranges, torch.Tensor) or ranges.dtype != torch.int32
            or tuple(ranges.shape) != (4, batch) or ranges.device != q.device):
        raise InputValueError(
            f"ranges must be an int32 tensor [4, B] = [4, {batch}] on {q.device} (query "
            f"starts, query ends, key starts, key ends); got "
            + (f"{ranges.dtype} {tuple(ranges.shape)} on {ranges.device}"
               if isinstance(ranges, torch.Tensor) else type(ranges).__name__))


# -- custom ops: autograd and torch.compile ----------------------------------------------------
def _window_of(window_left: int, window_right: int) -> Any:
    return None if (window_left, window_right) == (-1, -1) else (window_left, window_right)


def _is_causal(causal: bool, bottom_right: bool) -> Any:
    """The ``is_causal`` argument of the ops' two flags (a window without ``causal`` aligns
    bottom-right)."""
    return (BOTTOM_RIGHT if bottom_right else TOP_LEFT) if causal else False


@torch.library.custom_op(FWD_OP_NAME, mutates_args=())
def varlen_fwd(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               cu_seq_q: torch.Tensor, cu_seq_k: torch.Tensor, max_q: int, max_k: int,
               causal: bool, bottom_right: bool, scale: Optional[float], window_left: int,
               window_right: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``varlen_forward``: ``(out [T_q, H_q, D], lse [1, H_q, T_q])``."""
    return varlen_forward(runtime(), query, key, value, cu_seq_q, cu_seq_k,
                          max_q, max_k, is_causal=_is_causal(causal, bottom_right), scale=scale,
                          window=_window_of(window_left, window_right),
                          enable_gqa=query.shape[1] != key.shape[1])


@varlen_fwd.register_fake
def _varlen_fwd_fake(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal, bottom_right,
                     scale, window_left, window_right):
    tokens, heads = query.shape[0], query.shape[1]
    padded = packed_row_stat_length(tokens)
    lse = query.new_empty_strided((1, heads, tokens), (heads * padded, padded, 1),
                                  dtype=torch.float32)
    return torch.empty_like(query, memory_format=torch.contiguous_format), lse


@torch.library.custom_op(BWD_OP_NAME, mutates_args=())
def varlen_bwd(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
               cu_seq_q: torch.Tensor, cu_seq_k: torch.Tensor, max_q: int, max_k: int,
               causal: bool, bottom_right: bool, scale: Optional[float], window_left: int,
               window_right: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``varlen_backward``: ``(dq, dk, dv)``."""
    return varlen_backward(runtime(), grad_out, query, key, value, out, lse,
                           cu_seq_q, cu_seq_k, max_q, max_k,
                           is_causal=_is_causal(causal, bottom_right), scale=scale,
                           window=_window_of(window_left, window_right),
                           enable_gqa=query.shape[1] != key.shape[1])


@varlen_bwd.register_fake
def _varlen_bwd_fake(grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k,
                     causal, bottom_right, scale, window_left, window_right):
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device)
                 for x in (query, key, value))


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    query, key, value, cu_seq_q, cu_seq_k = inputs[:5]
    ctx.save_for_backward(query, key, value, output[0], output[1], cu_seq_q, cu_seq_k)
    ctx.args = inputs[5:]


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_lse: Any) -> tuple:
    query, key, value, out, lse, cu_seq_q, cu_seq_k = ctx.saved_tensors
    dq, dk, dv = varlen_bwd(grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k,
                            *ctx.args)
    return (dq, dk, dv) + (None,) * (2 + len(ctx.args))


varlen_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerVarlen(torch.autograd.Function):
    """``tiledattention::varlen_fwd`` with its autograd formula, for eager calls (as
    ``_autograd``'s eager route: the ops' dispatch costs more host time than a batch of short
    sequences' kernels): the tensors and one tuple of the other arguments in, ``out`` alone
    out; the backward reuses what the forward validated and read (the kept call, the ranges)."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                cu_seq_q: torch.Tensor, cu_seq_k: torch.Tensor, call: tuple) -> torch.Tensor:
        max_q, max_k, causal, bottom_right, scale, left, right = call
        packed = _validated(runtime(), query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                            _is_causal(causal, bottom_right), scale, _window_of(left, right),
                            query.shape[1] != key.shape[1])
        layout = packed.layout(cu_seq_q, cu_seq_k)
        out, lse = _run_forward(runtime(), query, key, value, packed, layout)
        ctx.save_for_backward(query, key, value, out)
        ctx.lse, ctx.packed, ctx.layout = lse, packed, layout
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        query, key, value, out = ctx.saved_tensors
        grads = _run_backward(runtime(), grad_out, query, key, value, out, ctx.lse, ctx.packed,
                              ctx.layout)
        return (*grads, None, None, None)


def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal: Any = False,
                scale: Optional[float] = None, window_size: Any = (-1, -1),
                enable_gqa: bool = False, seqused_k: Any = None,
                block_table: Any = None) -> torch.Tensor:
    """``tiledattention.varlen_attn`` (see there)."""
    _check_flags(enable_gqa=enable_gqa)
    if block_table is not None or seqused_k is not None:
        return _paged_varlen(query, key, value, cu_seq_q, max_q, max_k, is_causal, scale,
                             window_size, enable_gqa, seqused_k, block_table)
    if _is_cupy(query):
        return _cupy_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                                 is_causal=is_causal, scale=scale, window_size=window_size,
                                 enable_gqa=enable_gqa)
    causal, bottom_right, left, right = _mask_of(is_causal, window_size)
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in (query, key, value)):
        if (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor)
                and query.dim() == key.dim() == 3):  # the ops take grouped heads as given
            _check_grouping(query, key, enable_gqa)
        if eager(query, key, value, cu_seq_q, cu_seq_k):
            return _EagerVarlen.apply(query, key, value, cu_seq_q, cu_seq_k,
                                      (max_q, max_k, causal, bottom_right, scale, left, right))
        out, _ = varlen_fwd(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal,
                            bottom_right, scale, left, right)
        return out
    out, _ = varlen_forward(runtime(), query, key, value, cu_seq_q, cu_seq_k,
                            max_q, max_k, is_causal=_is_causal(causal, bottom_right),
                            scale=scale, window=_window_of(left, right), enable_gqa=enable_gqa)
    return out


# -- CuPy ----------------------------------------------------------------------------------------
def _is_cupy(x: Any) -> bool:
    return type(x).__module__.startswith("cupy")


def _cupy_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **kwargs):
    """:func:`varlen_attn` on CuPy arrays (all five; float16, as CuPy has no bfloat16): torch
    views of the same memory (DLPack, no copy), run on CuPy's current stream; the output is a
    CuPy array. Forward only (CuPy has no autograd)."""
    import cupy

    arrays = {"query": query, "key": key, "value": value, "cu_seq_q": cu_seq_q,
              "cu_seq_k": cu_seq_k}
    for name, x in arrays.items():
        if not isinstance(x, cupy.ndarray):
            raise InputTypeError(f"{name} must be a cupy.ndarray like query; got "
                                 f"{type(x).__name__} (pass all of them as CuPy arrays or all "
                                 f"as torch tensors)")
    stream = cupy.cuda.get_current_stream()
    with torch.cuda.device(query.device.id):
        # CuPy's default stream is CUDA's legacy null stream, which is torch's default one
        torch_stream = (torch.cuda.default_stream() if stream.ptr == 0
                        else torch.cuda.ExternalStream(stream.ptr))
        with torch.cuda.stream(torch_stream):
            tensors = {name: torch.from_dlpack(x) for name, x in arrays.items()}
            out = varlen_attn(*tensors.values(), max_q, max_k, **kwargs)
    return cupy.from_dlpack(out)


# -- a paged cache ------------------------------------------------------------------------------
def _paged_varlen(query, key, value, cu_seq_q, max_q, max_k, is_causal, scale, window_size,
                  enable_gqa, seqused_k, block_table):
    """:func:`varlen_attn` over a paged cache: sequences of one query count (``T = N *
    max_q``: decode, speculative and equal chunked-prefill steps) as a ``[N, H_q, max_q, D]``
    view for ``tiledattention.paged_attention``; sequences of their own query counts (a
    mixed step, by ``cu_seq_q``) packed, on the forward's ragged kernel."""
    from ._paged import paged_attention  # (imports torch ops)
    from ._paged_mixed import packed_paged_attention

    packed, longest_q, longest_k, causal, window = _paged_call(
        query, key, cu_seq_q, max_q, max_k, is_causal, window_size, enable_gqa, seqused_k,
        block_table)
    if packed:
        return packed_paged_attention(query, key, value, cu_seq_q, block_table, seqused_k,
                                      longest_q, longest_k, causal=causal, scale=scale,
                                      window=window)
    q4 = query.unflatten(0, (cu_seq_q.shape[0] - 1, longest_q)).transpose(1, 2)
    out = paged_attention(q4, key, value, block_table, seqused_k, causal=causal, scale=scale,
                          window=window, max_k=longest_k)
    return out.transpose(1, 2).reshape(query.shape)


def _paged_call(query, key, cu_seq_q, max_q, max_k, is_causal, window_size, enable_gqa,
                seqused_k, block_table) -> tuple:
    """Check what :func:`_paged_varlen` reads itself; ``(packed, longest_q, longest_k,
    causal, window)``: whether the sequences have query counts of their own, the longest
    counts, and the mask as ``paged_attention`` takes it."""
    if block_table is None or seqused_k is None:
        raise InputValueError(f"a paged cache takes block_table and seqused_k together; got "
                              f"only {'seqused_k' if block_table is None else 'block_table'}")
    if not isinstance(query, torch.Tensor) or query.dim() != 3:
        raise InputValueError(f"query must be a torch.Tensor [tokens, heads, head_dim]; got "
                              f"{getattr(query, 'shape', type(query).__name__)}")
    if not isinstance(cu_seq_q, torch.Tensor) or cu_seq_q.dim() != 1:
        raise InputValueError(f"cu_seq_q must be a 1-dim int32 tensor [sequences + 1]; got "
                              f"{type(cu_seq_q).__name__}")
    sequences = cu_seq_q.shape[0] - 1
    longest_q = _check_max("max_q", max_q, query.shape[0])
    if not isinstance(block_table, torch.Tensor) or block_table.shape[:1] != (sequences,):
        raise InputValueError(f"block_table must be an int32 tensor [sequences, max_pages] = "
                              f"[{sequences}, ...]; got "
                              f"{getattr(block_table, 'shape', type(block_table).__name__)}")
    if not isinstance(key, torch.Tensor):
        raise InputTypeError(f"key must be a torch.Tensor like query; got {type(key).__name__}")
    if key.dim() == 4 and query.shape[1] != key.shape[2] and not enable_gqa:
        raise InputValueError(f"query has {query.shape[1]} heads and key {key.shape[2]}: pass "
                              f"enable_gqa=True for grouped-query heads")
    causal, bottom_right, left, right = _mask_of(is_causal, window_size)
    alignment = (BOTTOM_RIGHT if bottom_right else TOP_LEFT) if causal else False
    window = None if (left, right) == (-1, -1) else (left, right)
    longest_k = _check_max("max_k", max_k, INDEX_LIMIT)
    packed = query.shape[0] != sequences * longest_q  # query counts of their own
    return packed, longest_q, longest_k, alignment, window
