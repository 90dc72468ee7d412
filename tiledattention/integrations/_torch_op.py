"""The torch custom ops: ``tiledattention::sdpa_fwd`` (the forward) and
``tiledattention::sdpa_ranges_fwd`` (a padded batch's forward within per-entry ranges) here,
and the training pair ``tiledattention::sdpa_fwd_lse`` / ``tiledattention::sdpa_bwd`` from the
core (``tiledattention.entry_points._autograd``, which ``tiledattention.sdpa`` uses too). All
are opaque to ``torch.compile`` / ``torch.export``; all but the ranged one are differentiable.

Each op's implementation calls the runtime (:func:`tiledattention.sdpa`, ``sdpa_with_lse``,
``sdpa_backward``), which validates its inputs and raises a clear error for anything the kernel
cannot run (e.g. CPU tensors); the fake implementations give the outputs' shapes, dtypes and
layouts so tracing never runs a kernel.

:func:`attention` runs ``sdpa_fwd`` when no gradient is needed (nothing is kept for a backward
pass), and ``sdpa_fwd_lse`` when one is (grad mode on and an input requires grad): its backward
uses the log-sum-exp that forward stored. An eager call that nothing traces (``eager``) skips
the ops' dispatch: without a gradient it runs what ``sdpa_fwd`` runs directly, with one it takes
``sdpa_fwd_lse``'s eager route (``entry_points/_autograd.py``). The dispatch costs host time: a
decode step on the H100 machine took 101 µs per call dispatched, 78 µs without
(``docs/lookup.md``).
``sdpa_fwd`` is differentiable too, for graphs that call it directly (an exported one, say): its
backward first re-runs the forward with ``sdpa_fwd_lse`` to get the log-sum-exp, one extra
forward pass.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..entry_points._autograd import (BWD_OP_NAME, FWD_LSE_OP_NAME, attention_grads,
                                      check_flags, check_shapes, eager, eager_forward_lse,
                                      sdpa_bwd, sdpa_fwd_lse, variant_kwargs)
from ..core._problem import BOTTOM_RIGHT, causal_flags, variant_args
from ..entry_points._varlen import check_ranges
from ..errors import InputTypeError

__all__ = ["OP_NAME", "FWD_LSE_OP_NAME", "BWD_OP_NAME", "RANGES_OP_NAME", "attention",
           "autocast_inputs", "ranged_attention", "sdpa_fwd", "sdpa_fwd_lse", "sdpa_bwd",
           "sdpa_ranges_fwd"]

#: Qualified name of the forward op: ``torch.ops.tiledattention.sdpa_fwd``.
OP_NAME = "tiledattention::sdpa_fwd"


# No device_types: the op runs wherever tiledattention.sdpa accepts the tensors (CUDA), and for
# anything else the runtime's validation names the problem ("q must be a CUDA tensor; ...").
@torch.library.custom_op(OP_NAME, mutates_args=())
def sdpa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
             scale: Optional[float], bottom_right: bool = False, window_left: int = -1,
             window_right: int = -1, softcap: float = 0.0,
             sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention of ``q [B, H_q, S_q, D]`` over ``k, v [B, H_kv, S_k, D]``: ``[B, H_q, S_q, D]``.
    ``bottom_right`` aligns the causal mask and the window to the bottom-right corner; the
    window, softcap and sinks as ``tiledattention.sdpa`` takes them (``-1, -1, 0.0, None``:
    none)."""
    # grad mode is off inside an op's implementation: this is sdpa's plain forward. The op
    # runs inside compiled graphs, whose CUDA graph trees route its first calls' allocations
    # into the graph's pool and refuse any that outlives the call: no kept scratch buffers.
    return _sdpa_fwd_impl(q, k, v, causal, scale, bottom_right,
                          variant_kwargs(window_left, window_right, softcap, sinks),
                          keep_scratch=False)


def _sdpa_fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: Optional[float], bottom_right: bool, variant: dict, *,
                   keep_scratch: bool) -> torch.Tensor:
    """What ``sdpa_fwd`` computes, without the op (no gradient is recorded); ``variant``: the
    runtime's variant keywords."""
    import tiledattention  # looked up per call, so tests can substitute a reference

    check_shapes(q, k, v)
    check_flags(causal, bottom_right)
    return tiledattention.sdpa(q, k, v, BOTTOM_RIGHT if bottom_right else causal, scale,
                               keep_scratch=keep_scratch, **variant)


@sdpa_fwd.register_fake
def _sdpa_fwd_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: Optional[float], bottom_right: bool = False, window_left: int = -1,
                   window_right: int = -1, softcap: float = 0.0,
                   sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    check_shapes(q, k, v)
    check_flags(causal, bottom_right)
    b, hq, sq, d = q.shape
    return q.new_empty((b, hq, sq, d))  # contiguous, dtype and device of q


#: Qualified name of the ranged forward op: ``torch.ops.tiledattention.sdpa_ranges_fwd``.
RANGES_OP_NAME = "tiledattention::sdpa_ranges_fwd"


# Defined and implemented through torch.library's functions rather than ``custom_op``: a
# compiled graph that replays no CUDA graph (default mode, or a step whose shapes change)
# dispatches the op on every call, and ``custom_op``'s Python wrappers cost host time of their
# own (docs/records/benchmarks/paged/issue49/README.md, section 37). No autograd: a call that
# needs a gradient is refused by the runtime (grad mode stays on in this implementation).
torch.library.define(
    RANGES_OP_NAME,
    "(Tensor q, Tensor k, Tensor v, Tensor ranges, float? scale, int window_left=-1, "
    "int window_right=-1, float softcap=0.0, Tensor? sinks=None) -> Tensor")


def sdpa_ranges_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranges: torch.Tensor,
                    scale: Optional[float], window_left: int = -1, window_right: int = -1,
                    softcap: float = 0.0, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A padded batch, each entry within its int32 ``[4, B]`` ranges, bottom-right causal
    (``tiledattention.sdpa(q, k, v, "bottom_right", scale, ranges=ranges)``; rows outside their
    entry's query range are zeros): ``[B, H_q, S_q, D]``. The ranges stay on the device, so a
    compiled graph or a CUDA graph holds the call whatever they say. No autograd (the runtime
    refuses inputs that require grad); no scratch buffers kept (as ``sdpa_fwd``)."""
    import tiledattention  # looked up per call, so tests can substitute a reference

    check_shapes(q, k, v)
    return tiledattention.sdpa(q, k, v, BOTTOM_RIGHT, scale, ranges=ranges, keep_scratch=False,
                               **variant_kwargs(window_left, window_right, softcap, sinks))


torch.library.impl(RANGES_OP_NAME, "CompositeExplicitAutograd", sdpa_ranges_fwd)


def _sdpa_ranges_fwd_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          ranges: torch.Tensor, scale: Optional[float], window_left: int = -1,
                          window_right: int = -1, softcap: float = 0.0,
                          sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    check_shapes(q, k, v)
    check_ranges(q, ranges)
    return q.new_empty(q.shape)


torch.library.register_fake(RANGES_OP_NAME, _sdpa_ranges_fwd_fake)


def ranged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranges: torch.Tensor,
                     scale: float | None = None, *, window: tuple[int, int] | None = None,
                     softcap: float | None = None, sinks: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """``torch.ops.tiledattention.sdpa_ranges_fwd`` with ``tiledattention.sdpa``'s variant
    keywords: a padded batch's forward that ``torch.compile(fullgraph=True)`` traces."""
    left, right, cap = variant_args(window, softcap)
    _check_sinks(sinks)
    return torch.ops.tiledattention.sdpa_ranges_fwd(q, k, v, ranges, scale, left, right, cap,
                                                    sinks)


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    q, k, v, causal, scale, bottom_right, left, right, softcap, sinks = inputs
    ctx.save_for_backward(q, k, v, sinks)  # not the output: the backward re-runs the forward
    ctx.causal, ctx.scale, ctx.bottom_right = causal, scale, bottom_right
    ctx.variant = (left, right, softcap)


def _backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
    q, k, v, sinks = ctx.saved_tensors
    # sdpa_fwd kept no log-sum-exp: recompute the forward with it (its out, not the saved
    # one, so out and lse come from one kernel; the decode kernels may have made the other)
    out, lse = torch.ops.tiledattention.sdpa_fwd_lse(q, k, v, ctx.causal, ctx.scale,
                                                     ctx.bottom_right, None, *ctx.variant,
                                                     sinks)
    dq, dk, dv, dsinks = attention_grads(grad_out, q, k, v, out, lse, sinks,
                                         (ctx.causal, ctx.scale, ctx.bottom_right, *ctx.variant),
                                         sinks is not None and ctx.needs_input_grad[9])
    return dq, dk, dv, None, None, None, None, None, None, dsinks


sdpa_fwd.register_autograd(_backward, setup_context=_setup_context)


def autocast_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q, k, v`` as torch's ``scaled_dot_product_attention`` computes with them: under
    ``torch.autocast`` for their device type (SDPA is on autocast's lower-precision list) cast
    to autocast's dtype, otherwise unchanged. Mixed-precision training (``torch.autocast``,
    transformers' ``bf16=True``) hands attention float32 queries and keys (after the rotary
    embedding) and bf16 values; the cast is differentiable."""
    if not isinstance(q, torch.Tensor):  # not ours to judge: the caller reports it
        return q, k, v
    device_type = "cuda" if q.is_cuda else q.device.type  # is_cuda: ~15x cheaper
    try:
        if not torch.is_autocast_enabled(device_type):
            return q, k, v
    except RuntimeError:  # a device type autocast does not know (meta)
        return q, k, v
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point()
                 and x.dtype != dtype else x for x in (q, k, v))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool | str = False,
              scale: float | None = None, *, window: tuple[int, int] | None = None,
              softcap: float | None = None, sinks: torch.Tensor | None = None
              ) -> torch.Tensor:
    """``tiledattention.sdpa`` as a traceable, differentiable torch op.

    Same contract as :func:`tiledattention.sdpa` (``[B, H, S, D]`` in and out, bf16/fp16 CUDA
    tensors, grouped-query ``k, v`` with fewer heads); usable inside
    ``torch.compile(fullgraph=True)`` and ``torch.export``. Without a gradient to compute it is
    ``torch.ops.tiledattention.sdpa_fwd``; with grad mode on and an input that requires grad it
    is ``torch.ops.tiledattention.sdpa_fwd_lse`` (the forward kernel, also keeping the
    log-sum-exp), whose backward runs ``torch.ops.tiledattention.sdpa_bwd``.
    ``causal``: ``False``, ``True`` or ``"top_left"`` (torch's ``is_causal``: query ``i`` sees
    keys ``0..i``), or ``"bottom_right"`` (torch's ``causal_lower_right``: keys
    ``0..i + S_k - S_q``; a row that sees no key, possible when ``S_q > S_k``, is zero, and so
    are its gradients). ``window``, ``softcap`` and ``sinks`` as :func:`tiledattention.sdpa`
    takes them (the sinks get a gradient when they require one). Under ``torch.autocast`` the
    inputs are cast to its dtype first, as torch's SDPA does (:func:`autocast_inputs`).
    """
    q, k, v = autocast_inputs(q, k, v)
    if isinstance(scale, int) and not isinstance(scale, bool):
        scale = float(scale)
    if isinstance(causal, str):
        is_causal, bottom_right = causal_flags(causal)  # raises for any other string
    else:
        is_causal, bottom_right = bool(causal), False
    if window is not None or softcap is not None or sinks is not None:
        return _variant_attention(q, k, v, is_causal, scale, bottom_right, window, softcap,
                                  sinks)
    # needs_grad(q, k, v) spelled out: called from here, Dynamo reads `torch` through two
    # modules' globals and guards that both are one object with a Python lambda, evaluated on
    # every call of a compiled function (the only Python-level guard it would have)
    # under torch.compile the `not is_compiling()` guards keep Dynamo out of `eager`
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if not torch.compiler.is_compiling() and eager(q, k, v):
            return eager_forward_lse(q, k, v, is_causal, scale, bottom_right, None, -1, -1, 0.0,
                                     None)
        return torch.ops.tiledattention.sdpa_fwd_lse(q, k, v, is_causal, scale, bottom_right)[0]
    if not torch.compiler.is_compiling() and eager(q, k, v):
        return _sdpa_fwd_impl(q, k, v, is_causal, scale, bottom_right, {}, keep_scratch=True)
    if not bottom_right:
        return torch.ops.tiledattention.sdpa_fwd(q, k, v, is_causal, scale)
    return torch.ops.tiledattention.sdpa_fwd(q, k, v, is_causal, scale, bottom_right)


def _check_sinks(sinks: Any) -> None:
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        raise InputTypeError(f"sinks must be a torch.Tensor or None; got {type(sinks).__name__}")


def _variant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                       scale: float | None, bottom_right: bool, window: Any, softcap: Any,
                       sinks: torch.Tensor | None) -> torch.Tensor:
    """:func:`attention` of a call with a window, a softcap or sinks (the same routes, with the
    ops' variant arguments)."""
    left, right, cap = variant_args(window, softcap)
    _check_sinks(sinks)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                    or (sinks is not None and sinks.requires_grad)):
        if not torch.compiler.is_compiling() and eager(q, k, v, sinks):
            return eager_forward_lse(q, k, v, is_causal, scale, bottom_right, None, left, right,
                                     cap, sinks)
        return torch.ops.tiledattention.sdpa_fwd_lse(q, k, v, is_causal, scale, bottom_right,
                                                     None, left, right, cap, sinks)[0]
    if not torch.compiler.is_compiling() and eager(q, k, v):
        return _sdpa_fwd_impl(q, k, v, is_causal, scale, bottom_right,
                              variant_kwargs(left, right, cap, sinks), keep_scratch=True)
    return torch.ops.tiledattention.sdpa_fwd(q, k, v, is_causal, scale, bottom_right, left,
                                             right, cap, sinks)
