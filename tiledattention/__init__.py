"""tiledattention: cuTile attention kernels whose schedules are tuned per GPU.

``sdpa(q, k, v, causal=False, scale=None)`` computes
``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``
(with ``enable_gqa`` semantics for grouped-query inputs) using the best known schedule for the
shape on this GPU; ``explain`` says which schedule that is and why. Each kernel template is a
:class:`Family` (``families()``; the prefill forward is ``"forward"``) that the tuner, the schedule
database and the lookup serve alike.
"""

from __future__ import annotations

from typing import Any

from .core._compile import ARCHITECTURES, CompileResult
from .core._device import DeviceInfo, device_info, local_devices
from .core._family import Case, Family, families, get_family, register_family, unregister_family
from .core._lookup import Resolution, shipped_table
from .core._settings import database_location
from .errors import (CompileError, InputTypeError, InputValueError, KernelArgumentError,
                     LaunchOutOfMemoryError, ScheduleDatabaseError, ScheduleError,
                     TiledAttentionError, UnknownFamilyError, UnsupportedOperationError,
                     UnsupportedProblemError)
from .core._problem import (BOTTOM_RIGHT, DTYPES, SUPPORTED_HEAD_DIMS, TOP_LEFT, Problem,
                            problem_from_arrays)
from .core._call import Call
from .core._plans import Plan
from .core._dispatch import choose_family, explain_choice, family_for_schedule
from .entry_points._sdpa import sdpa as _run_sdpa
from .kernels.forward import FORWARD, Schedule, compile_schedule
from .kernels.decode import DECODE, DecodeSchedule, DispatchRule, compile_decode, dispatch_rule
from .kernels.backward import BACKWARD, BackwardSchedule, compile_backward
from .core import _runtime
from .entry_points import _fp8, _training
from .entry_points._paged_order import PagedOrder
from . import tooling
from .core._runtime import open_database, runtime, use_database

# What users call: the entry points, the problem and schedule types, the families and their
# registry, device and database selection, the errors. Tools build on ``tiledattention.tooling``.
__all__ = [
    # entry points
    "sdpa", "sdpa_with_lse", "sdpa_backward", "varlen_attn", "paged_attention", "PagedOrder",
    "explain",
    "explain_varlen", "explain_paged",
    "runtime", "use_database",
    "open_database", "database_location",
    # problems and schedules
    "Problem", "problem_from_arrays", "BOTTOM_RIGHT", "TOP_LEFT", "DTYPES", "SUPPORTED_HEAD_DIMS",
    "Schedule", "DecodeSchedule", "BackwardSchedule", "Resolution",
    # families
    "Family", "Case", "Plan", "Call", "FORWARD", "DECODE", "BACKWARD", "families", "get_family",
    "register_family", "unregister_family", "choose_family", "explain_choice",
    "family_for_schedule", "DispatchRule", "dispatch_rule", "shipped_table",
    # compiling and devices
    "ARCHITECTURES", "CompileResult", "compile_schedule", "compile_decode", "compile_backward",
    "DeviceInfo", "device_info", "local_devices",
    # errors
    "TiledAttentionError", "InputTypeError", "InputValueError", "UnsupportedProblemError",
    "UnsupportedOperationError", "UnknownFamilyError", "ScheduleError", "ScheduleDatabaseError",
    "CompileError", "KernelArgumentError", "LaunchOutOfMemoryError",
    # the tools' module
    "tooling",
]

def sdpa(q: Any, k: Any, v: Any, causal: bool | str = False, scale: float | None = None, *,
         window: tuple[int, int] | None = None, softcap: float | None = None,
         sinks: Any = None, schedule: Schedule | DecodeSchedule | None = None,
         out: Any = None, keep_scratch: bool = True, ranges: Any = None,
         q_descale: Any = None, k_descale: Any = None, v_descale: Any = None) -> Any:
    """Scaled dot-product attention forward, ``[B, H, S, D]`` in and out.

    q: ``[B, H_q, S_q, D]``; k, v: ``[B, H_kv, S_k, D]`` with ``H_q % H_kv == 0`` (grouped-query
    attention without copies). bf16 or fp16 torch tensors on a CUDA device (launch on torch's
    current stream) or CuPy arrays (CuPy's current stream; returns a CuPy array). The last dim
    must be contiguous; other strides are free. ``scale`` defaults to ``1/sqrt(D)``.

    ``causal``: ``False``; ``True`` or ``"top_left"``: query row ``i`` sees keys ``0..i``, like
    torch's ``is_causal``; ``"bottom_right"``: the queries are the last ``S_q`` positions, row
    ``i`` sees keys ``0..i + S_k - S_q`` (torch's ``causal_lower_right``; for chunked prefill
    and speculative decoding). With ``S_q > S_k`` bottom-right, the first ``S_q - S_k`` rows
    see no key and are returned as zeros.

    Variants (every family: prefill, decode and training): ``window=(left, right)``, a sliding
    window in torch's and FlashAttention's convention (``-1``: unbounded; row ``i`` sees keys
    ``i + off - left .. i + off + right``, ``off`` the alignment of ``causal``: 0, or ``S_k -
    S_q`` for ``"bottom_right"``); it composes with ``causal`` (Mistral's and Gemma's local
    layers are ``causal=True, window=(W - 1, 0)``). Key tiles outside every row's window are
    never read, so the work scales with the window. ``softcap=c`` caps the scaled scores at
    ``c * tanh(s / c)`` before the softmax (Gemma 2). ``sinks``: per-query-head sink logits
    ``[H_q]`` (float32, bf16 or fp16, on q's device) that join each row's softmax denominator
    as a key with no value (GPT-OSS); differentiable when they require grad. A row that sees
    no key gives zeros.

    The kernel family follows the shape (:func:`choose_family`: the split-KV decode kernels for
    few query rows, the prefill forward otherwise); ``schedule`` overrides the lookup and, by its
    type, the family. Bad input raises an :class:`InputTypeError` / :class:`InputValueError`
    naming the argument.

    ``out``: write the result into this array and return it, instead of a new contiguous one
    (every call without ``out`` returns a fresh array). It must be what q's library makes (a
    torch tensor or CuPy array), of shape ``[B, H_q, S_q, D]`` with q's dtype and device,
    contiguous in its last dim (other strides are free), not requiring grad, and overlapping
    neither itself nor q, k or v (any shared byte counts); anything else raises before a launch.

    On torch tensors that require grad, with grad mode on, the call is differentiable: it runs
    the forward kernel that also keeps each row's log-sum-exp (``torch.ops.tiledattention.
    sdpa_fwd_lse``, whatever the shape; ``schedule`` may then be a ``Schedule`` only) and
    autograd runs :func:`sdpa_backward`; ``out`` is refused there (autograd's output is its
    own). Any other call stores nothing for a backward pass.

    ``ranges``: a padded batch's valid tokens, an int32 torch tensor ``[4, B]`` on q's device
    whose columns hold each batch entry's query rows ``[ranges[0, b], ranges[1, b])`` and keys
    ``[ranges[2, b], ranges[3, b])`` (left or right padding; nothing is copied). Each entry
    attends only within its ranges, the causal mask and the window aligned within them as
    ``causal`` says (``"bottom_right"``: the valid queries are the last of the valid keys, as
    in a left-padded generation step); rows outside their entry's query range are zeros.
    Runs the prefill forward's kernels, or for few query rows the split-KV decode kernels
    (torch tensors, no autograd, no ``out``); the values are not read on the host (the call
    may be captured in a CUDA graph), so a range past ``S_q`` or ``S_k`` is the caller's
    error.

    ``keep_scratch``: a decode call that splits the cache writes float32 partial results to
    scratch buffers, which by default the runtime keeps and reuses for the next call on the same
    device, stream and thread (two allocations fewer per call). ``False`` allocates this call's
    own, freed with the call: for code that routes allocations into a CUDA graph memory pool
    outside a capture, where a kept buffer would outlive the call inside the pool (the torch op
    ``torch.ops.tiledattention.sdpa_fwd`` passes ``False``, for ``torch.compile``'s
    ``mode="reduce-overhead"``). Under ``torch.cuda.graph`` capture each call allocates its own
    from the graph's pool whatever this says.

    FP8 (Hopper and later): q, k and v ``torch.float8_e4m3fn`` with ``q_descale``,
    ``k_descale``, ``v_descale``, the float32 factors that turn the stored values into the real
    ones (FlashAttention-3's and cuDNN's convention), each ``[B, H_kv]`` or broadcasting to it
    (``[]`` per tensor, ``[1, H_kv]`` per head; a query head takes its K/V head's; ``None``:
    1); the output is bfloat16. ``P·V`` runs in e4m3 by default (P scaled by 2^8 into its
    range; about 2.5% relative L2 error against attention of the dequantised inputs on random
    data), or in bf16 with a schedule's ``pv_wide`` (about 0.2%). Causal masks, windows,
    softcaps, sinks and ``out`` (bf16) as above; no autograd, CuPy arrays or ``ranges``.
    An FP8 K/V cache: bf16 or fp16 q over float8_e4m3fn k and v with ``k_descale`` and
    ``v_descale`` (no ``q_descale``), the output in q's dtype: the decode kernels read the
    cache's bytes and widen each tile (calls of few query rows, as decode dispatch takes them).
    """
    descales = (q_descale, k_descale, v_descale)
    if _fp8.is_fp8_call(q, k, descales):
        if ranges is not None:
            raise UnsupportedOperationError("FP8 attention runs dense [B, H, S, D] calls; got "
                                            "ranges (padded batches run in bf16 or fp16)")
        return _fp8.sdpa_fp8(runtime(), q, k, v, causal, scale, (window, softcap, sinks),
                             schedule, out, descales)
    if ranges is not None:
        from .entry_points import _varlen  # a padded batch: torch tensors only

        return _varlen.padded_forward(runtime(), q, k, v, causal, scale, ranges, window=window,
                                      softcap=softcap, sinks=sinks, schedule=schedule, out=out,
                                      keep_scratch=keep_scratch)
    try:
        grad = q.requires_grad or k.requires_grad or v.requires_grad or (
            sinks is not None and sinks.requires_grad)
    except AttributeError:  # not torch tensors: nothing to differentiate
        grad = False
    if grad:
        # imports torch's op machinery: only calls that may train pay
        from .entry_points import _autograd

        if _autograd.grad_enabled():
            if out is not None:
                raise InputValueError(
                    "out must be None on a differentiable call (q, k or v requires grad and "
                    "grad mode is on): autograd needs an output of its own; got a "
                    f"{type(out).__name__}: drop out=, or call under torch.no_grad()")
            return _autograd.sdpa(q, k, v, causal, scale, window=window, softcap=softcap,
                                  sinks=sinks, schedule=schedule)
    rt = _runtime.current  # the warm path: no call when the runtime exists
    if rt is None:
        rt = runtime()
    return _run_sdpa(rt, q, k, v, causal, scale, window=window, softcap=softcap, sinks=sinks,
                     schedule=schedule, out=out, keep_scratch=keep_scratch)


def sdpa_with_lse(q: Any, k: Any, v: Any, causal: bool | str = False,
                  scale: float | None = None, *, window: tuple[int, int] | None = None,
                  softcap: float | None = None, sinks: Any = None,
                  schedule: Schedule | None = None) -> tuple[Any, Any]:
    """The forward a backward pass will follow: ``(out, lse)``.

    Takes what :func:`sdpa` takes (torch tensors only) and runs the forward kernel with the
    forward's schedule for the shape (``schedule`` overrides it); ``lse`` holds each query row's
    log-sum-exp of the scaled scores in base 2, float32 ``[B, H_q, S_q]`` (``+inf`` for a row that
    sees no key; with sinks, the sink's term is in it). Pass both to :func:`sdpa_backward`,
    with the same variant arguments (``window``, ``softcap``, ``sinks``: see :func:`sdpa`).
    Code that needs no gradient should call :func:`sdpa`, which stores no log-sum-exp.
    """
    return _training.sdpa_with_lse(runtime(), q, k, v, causal, scale, schedule=schedule,
                                   variant=(window, softcap, sinks))


def sdpa_backward(grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                  causal: bool | str = False, scale: float | None = None, *,
                  window: tuple[int, int] | None = None, softcap: float | None = None,
                  sinks: Any = None, schedule: BackwardSchedule | None = None,
                  grads: tuple[Any, Any, Any] | None = None,
                  deterministic: bool = False) -> tuple[Any, Any, Any]:
    """The gradients ``(dq, dk, dv)`` of :func:`sdpa_with_lse`'s ``out`` given ``grad_out``
    (dL/d out, shaped like ``out``), with the same ``q, k, v, causal, scale`` and variant
    arguments. The sinks' own gradient is not among these (autograd computes it from ``lse``:
    ``tiledattention.entry_points._autograd.sink_grad``).

    Grouped-query ``k, v`` get gradients of their own shape (summed over the group in the
    kernel, never expanded). Runs the backward family's schedule for the shape (``schedule``
    overrides it); ``grads`` are optional contiguous output buffers like ``q, k, v``. Extra
    memory: one float32 ``[B, H_q, S_q]`` array, and for a schedule that splits the dK/dV walk
    over ``n`` CTAs (``dkdv_splits``; grouped heads at small batch) float32 partials of dK and
    dV, ``n`` of each. A schedule with ``dq_mode="atomic"`` (the one-pass backward) adds dQ
    into a float32 accumulator (one more float32 array like q) in no fixed order, so dQ may
    differ in its last bits run to run; ``deterministic=True``, or
    ``torch.use_deterministic_algorithms(True)``, runs dQ with the dQ kernel instead, and the
    gradients are then bitwise identical run to run. Most users want autograd instead:
    ``tiledattention.sdpa`` on tensors that require grad, or
    ``tiledattention.integrations.attention``.
    """
    return _training.sdpa_backward(runtime(), grad_out, q, k, v, out, lse, causal, scale,
                                   schedule=schedule, grads=grads,
                                   variant=(window, softcap, sinks), deterministic=deterministic)


def varlen_attn(query: Any, key: Any, value: Any, cu_seq_q: Any, cu_seq_k: Any, max_q: int,
                max_k: int, *, is_causal: bool | str = False, scale: float | None = None,
                window_size: tuple[int, int] = (-1, -1), enable_gqa: bool = False,
                seqused_k: Any = None, block_table: Any = None) -> Any:
    """Attention over packed variable-length sequences, with the shapes and semantics of
    torch's ``torch.nn.attention.varlen.varlen_attn``: ``query [T_q, H_q, D]``, ``key, value
    [T_k, H_kv, D]`` (torch tensors on a GPU, bf16 or fp16), int32 cumulative offsets
    ``cu_seq_q, cu_seq_k [N + 1]`` (sequence ``i`` is query rows ``cu_seq_q[i]:cu_seq_q[i +
    1]`` against keys ``cu_seq_k[i]:cu_seq_k[i + 1]``), and ``max_q``, ``max_k`` at least the
    longest sequence's query and key counts (as torch, nothing checks them against the offsets
    on the host: a smaller value leaves rows of the longer sequences unwritten).

    ``is_causal``: ``True`` masks each sequence causally, aligned bottom-right (a sequence's
    queries are its last positions: FlashAttention's and torch's varlen convention, the same as
    top-left where a sequence has as many queries as keys); ``"top_left"`` aligns top-left.
    ``window_size=(left, right)``: a sliding window per sequence (-1 unbounded), aligned
    bottom-right unless ``is_causal="top_left"`` (as FlashAttention's and torch's windows are);
    ``(-1, 0)`` is causal, as in torch. ``enable_gqa``: allow ``H_q`` a multiple of
    ``H_kv``. Rows outside every sequence come out as zeros.

    Differentiable (``query``, ``key``, ``value``; rows and keys outside every sequence get
    zero gradients) and traceable by ``torch.compile`` (custom ops
    ``tiledattention::varlen_fwd`` / ``varlen_bwd``). No copy is made of the packed tensors:
    the kernels cut each sequence out of them. Schedules are looked up per bucket of the
    batch's longest lengths and token count, so new batches reuse kernels and lookups.

    CuPy arrays (all five, float16; forward only) run on CuPy's current stream and give a CuPy
    array.

    A paged cache, as torch's: ``block_table`` (int32 ``[N, max_pages]``) with ``seqused_k``
    (int32 ``[N]``), ``key`` and ``value`` then ``[pages, page_size, H_kv, D]`` pools and
    ``cu_seq_k`` unused (it may be ``None``); inference only. A sequence's queries are the last
    positions of its ``seqused_k`` keys (causal masks and windows align bottom-right). Where
    every sequence has ``max_q`` queries (``T_q = N * max_q``: decode, speculative and equal
    chunked-prefill steps; ``cu_seq_q`` is then not read) this is :func:`paged_attention` on
    a ``[N, H_q, max_q, D]`` view; sequences of their own query counts (a serving engine's
    mixed step: prefill chunks beside decode tokens, by ``cu_seq_q``) run their one-query
    sequences as a decode step (split-KV) and the others packed on the prefill kernel, which
    reads pages of a whole key tile in place (of half of one for few query rows) and gathers
    smaller ones into one packed copy first. Traceable by ``torch.compile`` (custom op
    ``tiledattention::paged_varlen``) and capturable in a CUDA graph (nothing is read on the
    host).
    """
    from .entry_points import _varlen

    return _varlen.varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                               is_causal=is_causal, scale=scale, window_size=window_size,
                               enable_gqa=enable_gqa, seqused_k=seqused_k,
                               block_table=block_table)


def paged_attention(q: Any, k_pages: Any, v_pages: Any, block_table: Any, seqused_k: Any, *,
                    causal: bool | str = True, scale: float | None = None,
                    window: tuple[int, int] | None = None, softcap: float | None = None,
                    sinks: Any = None, max_k: int | None = None, k_descale: Any = None,
                    v_descale: Any = None, order: Any = None) -> Any:
    """Attention of ``q [B, H_q, S_q, D]`` over a paged K/V cache, the layout serving engines
    keep: ``k_pages, v_pages [pages, page_size, H_kv, D]`` pools (a page size not a multiple
    of 16 runs over a copy in pages of 256 keys, ``docs/usage.md``),
    an int32 ``block_table [B, max_pages]`` naming each entry's pages in order, and int32
    ``seqused_k [B]``, each entry's valid keys. Entry ``b``'s queries are the last ``S_q``
    positions of its ``seqused_k[b]`` keys (a decode step, speculative tokens, a chunk of a
    prefill): ``causal=True`` masks them bottom-right, as do windows. ``max_k``: at least the
    longest ``seqused_k`` (a hint for the lookup, and the cache whose share each split takes
    under a balanced schedule, ``DecodeSchedule.balanced``; default the block table's capacity:
    pass it where the table is sized for caches much longer than the batch's).

    A decode step reads pages of a multiple of 16 keys in place, and nothing is read on the host: a
    step is capturable in a CUDA graph and replays with new lengths and block tables. Inference only
    (no autograd); torch tensors on a GPU, bf16 or fp16; ``torch.compile`` traces it (custom op
    ``tiledattention::paged_attention``). ``varlen_attn(..., block_table=, seqused_k=)`` is the
    same call in torch's packed convention.

    An FP8 cache (Hopper and later): ``torch.float8_e4m3fn`` pools under bf16 or fp16 ``q``,
    with ``k_descale`` and ``v_descale``, the float32 factors that turn the stored values into
    the real ones (``[B, H_kv]``, or broadcasting to it: ``[]``, ``[B, 1]``, ``[1, H_kv]``;
    ``None`` is 1); the output in q's dtype. Decode steps read the pages in place and widen
    each tile; a long query run (chunked prefill) copies the pages its entries read,
    dequantised. A long query run's output has q's strides (a transposed view of packed rows
    gets one back, no copy); a decode step's is contiguous.

    ``order``: a :class:`PagedOrder` of this batch (``PagedOrder(seqused_k)``, made once a
    decode step for all its layers). Where the schedule takes the entries longest cache
    first (a paged batch whose CTAs pass a wave), the call reads that order instead of
    ranking the key counts itself (a launch fewer); elsewhere it is not read. Any order of
    the entries gives the same output, so one ranked from earlier lengths is still right.
    Not passed on while ``torch.compile`` traces (each call ranks for itself there).
    """
    from .entry_points import _paged

    return _paged.paged_attention(q, k_pages, v_pages, block_table, seqused_k, causal=causal,
                                  scale=scale, window=window, softcap=softcap, sinks=sinks,
                                  max_k=max_k, k_descale=k_descale, v_descale=v_descale,
                                  order=order)


def explain_paged(q: Any, k_pages: Any, v_pages: Any, block_table: Any, seqused_k: Any, *,
                  causal: bool | str = True, window: tuple[int, int] | None = None,
                  softcap: float | None = None, sinks: Any = None,
                  max_k: int | None = None) -> Resolution:
    """The schedule :func:`paged_attention` would run for these arguments, the family and which
    lookup step chose it, for the call's bucket (``Problem.page_size``: the batch, query count
    and longest cache rounded up to powers of two, the page size exact)."""
    from .entry_points import _paged

    return _paged.explain_paged(runtime(), q, k_pages, v_pages, block_table, seqused_k,
                                causal=causal, window=window, softcap=softcap, sinks=sinks,
                                max_k=max_k)


def explain_varlen(query: Any, key: Any, value: Any, cu_seq_q: Any, cu_seq_k: Any, max_q: int,
                   max_k: int, *, is_causal: bool | str = False,
                   window_size: tuple[int, int] = (-1, -1), enable_gqa: bool = False,
                   training: bool = False, seqused_k: Any = None,
                   block_table: Any = None) -> Resolution:
    """The schedule :func:`varlen_attn` would run for these arguments (its forward's, or with
    ``training`` its backward's), the family and which lookup step chose it. It is looked up
    for the batch's bucket (``Problem.ragged``: the longest lengths and the token count rounded
    up to powers of two), which every batch of that profile shares; over a paged cache
    (``seqused_k``, ``block_table``), for the paged call's bucket."""
    from .entry_points import _varlen

    return _varlen.explain_varlen(runtime(), query, key, value, cu_seq_q, cu_seq_k, max_q,
                                  max_k, is_causal=is_causal, window=window_size,
                                  enable_gqa=enable_gqa, training=training,
                                  seqused_k=seqused_k, block_table=block_table)


def explain(q: Any, k: Any, v: Any, causal: bool | str = False, *,
            window: tuple[int, int] | None = None, softcap: float | None = None,
            sinks: Any = None) -> Resolution:
    """The schedule ``sdpa(q, k, v, causal, window=, softcap=, sinks=)`` would run, its family
    (``Resolution.family``) and which lookup step chose it."""
    problem, kind = problem_from_arrays(q, k, v, causal, None, window, softcap, sinks,
                                        fp8=True)
    device_index = q.device.index if kind == "torch" else q.device.id
    family = choose_family(device_info(device_index).arch, problem)
    return runtime().resolution(family, family.plan_problem(problem), device_index)
