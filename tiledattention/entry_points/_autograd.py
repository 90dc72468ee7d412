"""Autograd for attention on torch tensors: the torch custom ops ``tiledattention::sdpa_fwd_lse``
(the forward that also keeps each row's log-sum-exp) and ``tiledattention::sdpa_bwd`` (dQ, dK,
dV), their fake implementations for tracing, and the backward formula that joins them.

``tiledattention.sdpa`` imports this module on its first call with inputs that require grad (so
``import tiledattention`` stays free of torch); ``tiledattention.integrations`` imports it to
build its ops on these. Being custom ops, both are opaque to ``torch.compile`` and
``torch.export``: a compiled training step traces the forward and the backward through them
without running a kernel while tracing.

An eager call (plain tensors, no ``torch.compile`` tracing, no dispatch mode such as a
``make_fx`` tracer) takes the same forward and backward formula through a
``torch.autograd.Function`` instead: the custom ops' dispatch cost 200-300 µs of host time per
call on an H200, more than the kernels of a small training step
(``docs/records/benchmarks/backward/host-time.md``). What runs is the same either way.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import torch

from . import _training
from ..core._dispatch import family_for_schedule
from ..core._family import get_family
from ..core._problem import BOTTOM_RIGHT, causal_flags, row_stat_rows, variant_args
from ..core._runtime import runtime
from ..errors import InputTypeError, InputValueError, UnsupportedOperationError

__all__ = ["FWD_LSE_OP_NAME", "BWD_OP_NAME", "sdpa_fwd_lse", "sdpa_bwd", "grad_enabled",
           "needs_grad", "sdpa", "attention_backward", "check_shapes", "check_flags",
           "sink_grad", "sink_grad_from_rows", "attention_grads", "variant_kwargs"]

#: ``torch.ops.tiledattention.sdpa_fwd_lse``: ``(out, lse)``; ``out`` is differentiable.
FWD_LSE_OP_NAME = "tiledattention::sdpa_fwd_lse"
#: ``torch.ops.tiledattention.sdpa_bwd``: ``(dq, dk, dv)``.
BWD_OP_NAME = "tiledattention::sdpa_bwd"


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The shape checks that tracing can do (the kernel checks the rest when it runs)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise InputValueError(
                f"{name} must have 4 dims [batch, heads, seqlen, head_dim]; got shape "
                f"{tuple(x.shape)}"
            )
    if tuple(v.shape) != tuple(k.shape):
        raise InputValueError(f"v must have the shape of k {tuple(k.shape)}; got {tuple(v.shape)}")


def check_flags(causal: bool, bottom_right: bool) -> None:
    if bottom_right and not causal:
        raise InputValueError("bottom_right=True needs causal=True (it aligns the causal mask "
                              "and the window); got causal=False")


def _causal_arg(causal: bool, bottom_right: bool) -> bool | str:
    """The ``causal=`` argument of the runtime's functions for the ops' two flags."""
    return BOTTOM_RIGHT if bottom_right else causal


def _variant(window_left: int, window_right: int, softcap: float,
             sinks: Optional[torch.Tensor]) -> tuple[Any, Any, Any]:
    """The runtime's ``(window, softcap, sinks)`` for the ops' arguments."""
    found = variant_kwargs(window_left, window_right, softcap, sinks)
    return found.get("window"), found.get("softcap"), found.get("sinks")


def variant_kwargs(window_left: int, window_right: int, softcap: float,
                   sinks: Optional[torch.Tensor]) -> dict[str, Any]:
    """The runtime's variant keywords for the ops' arguments (left out when unset)."""
    found: dict[str, Any] = {}
    if window_left != -1 or window_right != -1:
        found["window"] = (window_left, window_right)
    if softcap:
        found["softcap"] = softcap
    if sinks is not None:
        found["sinks"] = sinks
    return found


def schedule_json(schedule: Any) -> str:
    """An explicit schedule as the ops' ``schedule`` argument: its family and its fields."""
    return json.dumps({"family": family_for_schedule(schedule, "sdpa_with_lse").name,
                       "schedule": schedule.to_dict()}, sort_keys=True)


def _schedule_from_json(text: str) -> Any:
    data = json.loads(text)
    return get_family(data["family"]).schedule_type.from_dict(data["schedule"])


def _row_stat_fake(q: torch.Tensor) -> torch.Tensor:
    """A float32 ``[B, H_q, S_q]`` tensor with the real log-sum-exp's strides: the real one is a
    view of ``[B, H_q, S_q rounded up to ROW_STAT_ALIGN]`` storage, and tracing records strides,
    so the fake must have the real ones."""
    b, hq, sq, _ = q.shape
    padded = row_stat_rows(sq)
    return q.new_empty_strided((b, hq, sq), (hq * padded, padded, 1), dtype=torch.float32)


# -- the forward that keeps the log-sum-exp --------------------------------------------------------
# No device_types (as for tiledattention::sdpa_fwd): the ops run wherever the runtime accepts the
# tensors (CUDA); for anything else its validation names the problem.
@torch.library.custom_op(FWD_LSE_OP_NAME, mutates_args=())
def sdpa_fwd_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 scale: Optional[float], bottom_right: bool = False,
                 schedule: Optional[str] = None, window_left: int = -1, window_right: int = -1,
                 softcap: float = 0.0, sinks: Optional[torch.Tensor] = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``tiledattention.sdpa_with_lse``: ``out [B, H_q, S_q, D]`` (contiguous) and the base-2
    log-sum-exp ``lse`` (float32 ``[B, H_q, S_q]``, a view of row-aligned storage; not
    differentiable). ``schedule``: a schedule of a family serving "sdpa_with_lse" as
    ``schedule_json`` writes it, or ``None`` for the looked-up one. The window, softcap and
    sinks as ``tiledattention.sdpa`` takes them (``-1, -1, 0.0, None``: none)."""
    return _forward_lse(q, k, v, causal, scale, bottom_right, schedule, window_left,
                        window_right, softcap, sinks)


def _forward_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 scale: Optional[float], bottom_right: bool, schedule: Optional[str],
                 window_left: int, window_right: int, softcap: float,
                 sinks: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``tiledattention::sdpa_fwd_lse`` computes (its arguments, in its order)."""
    return _forward_kept(q, k, v, causal, scale, bottom_right, schedule, window_left,
                         window_right, softcap, sinks)[:2]


def _forward_kept(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: Optional[float], bottom_right: bool, schedule: Optional[str],
                  window_left: int, window_right: int, softcap: float,
                  sinks: Optional[torch.Tensor]) -> tuple:
    """:func:`_forward_lse` and the kept call that ran it (``_training.training_forward``):
    ``(out, lse, kept)``."""
    check_shapes(q, k, v)
    check_flags(causal, bottom_right)
    chosen = None if schedule is None else _schedule_from_json(schedule)
    # _training's function is looked up per call, so tests can substitute a reference
    return _training.training_forward(runtime(), q, k, v, _causal_arg(causal, bottom_right),
                                      scale, schedule=chosen,
                                      variant=_variant(window_left, window_right, softcap,
                                                       sinks))


@sdpa_fwd_lse.register_fake
def _sdpa_fwd_lse_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       scale: Optional[float], bottom_right: bool = False,
                       schedule: Optional[str] = None, window_left: int = -1,
                       window_right: int = -1, softcap: float = 0.0,
                       sinks: Optional[torch.Tensor] = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    check_shapes(q, k, v)
    check_flags(causal, bottom_right)
    return q.new_empty(q.shape), _row_stat_fake(q)  # out: contiguous, dtype and device of q


# -- the backward ------------------------------------------------------------------------------------
@torch.library.custom_op(BWD_OP_NAME, mutates_args=())
def sdpa_bwd(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: Optional[float],
             bottom_right: bool = False, window_left: int = -1, window_right: int = -1,
             softcap: float = 0.0, sinks: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tiledattention.sdpa_backward``: ``(dq, dk, dv)``, contiguous, shaped like ``q, k, v``
    (grouped-query ``dk, dv`` summed over each group in the kernel). The sinks' own gradient
    is :func:`sink_grad`'s."""
    return _backward(grad_out, q, k, v, out, lse, causal, scale, bottom_right, window_left,
                     window_right, softcap, sinks)


def _backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: Optional[float],
              bottom_right: bool, window_left: int, window_right: int, softcap: float,
              sinks: Optional[torch.Tensor], *, with_row_sums: bool = False) -> tuple:
    """What ``tiledattention::sdpa_bwd`` computes (its arguments, in its order); with
    ``with_row_sums`` the kernels' row sums ``delta`` too, fourth (:func:`sink_grad_from_rows`)."""
    check_shapes(q, k, v)
    check_flags(causal, bottom_right)
    return _training.sdpa_backward(runtime(), grad_out, q, k, v, out, lse,
                                   _causal_arg(causal, bottom_right), scale,
                                   variant=_variant(window_left, window_right, softcap, sinks),
                                   with_row_sums=with_row_sums)


@sdpa_bwd.register_fake
def _sdpa_bwd_fake(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: Optional[float],
                   bottom_right: bool = False, window_left: int = -1, window_right: int = -1,
                   softcap: float = 0.0, sinks: Optional[torch.Tensor] = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_shapes(q, k, v)
    check_flags(causal, bottom_right)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def sink_grad(grad_out: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
              sinks: torch.Tensor) -> torch.Tensor:
    """The gradient of the sink logits ``[H_q]``: each row's sink takes probability
    ``p = exp(sink - LSE)`` (``lse`` is base 2) and gives no value, so ``d sink_h = -sum over
    batch and rows of p * delta`` with ``delta = sum_d dO * O``, as the keys' ``dS`` has it.
    In torch (a reduction over ``[B, H_q, S_q]``), in the sinks' dtype. An eager call reads
    ``delta`` from the backward kernels instead (:func:`sink_grad_from_rows`)."""
    return sink_grad_from_rows((grad_out.float() * out.float()).sum(dim=-1), lse, sinks)


def sink_grad_from_rows(delta: torch.Tensor, lse: torch.Tensor,
                        sinks: torch.Tensor) -> torch.Tensor:
    """:func:`sink_grad` given the float32 row sums ``delta = sum_d dO * O`` ``[B, H_q, S_q]``
    (the backward kernels compute them: one pass over dO and O fewer)."""
    log2_e = 1.4426950408889634
    p = torch.exp2(sinks.float().view(1, -1, 1) * log2_e - lse)  # lse +inf: p = 0
    return (-(p * delta).sum(dim=(0, 2))).to(sinks.dtype)


def _dense_grad(grad_out: torch.Tensor) -> torch.Tensor:
    """``grad_out`` as the kernel reads it. Autograd hands over whatever strides the graph made:
    an expanded gradient (of ``out.sum()``, or of a product with a broadcast weight) has zero
    strides, which are copied to a dense tensor here; other strides with a contiguous last dim
    go to the kernel as they are (``sdpa_backward`` copies the rest)."""
    if any(st == 0 and n > 1 for n, st in zip(grad_out.shape, grad_out.stride())):
        return grad_out.contiguous()
    return grad_out


def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, causal: bool,
                       scale: Optional[float], bottom_right: bool, window_left: int = -1,
                       window_right: int = -1, softcap: float = 0.0,
                       sinks: Optional[torch.Tensor] = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` through ``tiledattention::sdpa_bwd`` (traceable: the backward formula
    of both forward ops), or, on plain tensors outside any tracing, its implementation called
    directly."""
    grad_out = _dense_grad(grad_out)
    run = _backward if eager(grad_out, q, k, v, out, lse) else torch.ops.tiledattention.sdpa_bwd
    return run(grad_out, q, k, v, out, lse, causal, scale, bottom_right, window_left,
               window_right, softcap, sinks)


def _fwd_lse_setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, causal, scale, bottom_right, _schedule, left, right, softcap, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks)
    ctx.flags = (causal, scale, bottom_right, left, right, softcap)
    ctx.mark_non_differentiable(lse)


def attention_grads(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    sinks: Optional[torch.Tensor], flags: tuple, sinks_grad: bool) -> tuple:
    """The backward formula of the forward that keeps the log-sum-exp: ``(dq, dk, dv,
    dsinks)``; ``flags``: the forward's ``(causal, scale, bottom_right, window_left,
    window_right, softcap)``; ``sinks_grad``: whether the sinks (given) need theirs. An eager
    call takes the sinks' gradient from the backward kernels' row sums; a traced one
    (``torch.compile``, fake tensors) from ``dO`` and ``O`` in torch (:func:`sink_grad`)."""
    if sinks_grad and eager(grad_out, q, k, v, out, lse, sinks):  # delta from the kernels
        dq, dk, dv, delta = _backward(_dense_grad(grad_out), q, k, v, out, lse, *flags, sinks,
                                      with_row_sums=True)
        return dq, dk, dv, sink_grad_from_rows(delta, lse, sinks)
    dq, dk, dv = attention_backward(grad_out, q, k, v, out, lse, *flags, sinks)
    return dq, dk, dv, sink_grad(grad_out, out, lse, sinks) if sinks_grad else None


def _fwd_lse_backward(ctx: Any, grad_out: torch.Tensor, _grad_lse: Any) -> tuple:
    q, k, v, out, lse, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = attention_grads(grad_out, q, k, v, out, lse, sinks, ctx.flags,
                                sinks is not None and ctx.needs_input_grad[10])
    return dq, dk, dv, None, None, None, None, None, None, None, dsinks


sdpa_fwd_lse.register_autograd(_fwd_lse_backward, setup_context=_fwd_lse_setup_context)


def eager(*tensors: Any) -> bool:
    """Whether a call on these tensors runs eagerly, with nothing recording it: no
    ``torch.compile`` tracing (asked first: under Dynamo the rest is never traced), plain
    ``torch.Tensor`` objects (no fake, functional or other subclass) with data (not on the meta
    device, which the ops' fake implementations serve), no dispatch mode (``make_fx``,
    ``torch.export``, FLOP counters), no functorch transform and no ``torch.jit`` trace. Then the
    ops' implementations may be called directly: nothing would see the op, and its dispatch
    costs host time."""
    if torch.compiler.is_compiling():
        return False
    for x in tensors:
        if x is not None and (type(x) is not torch.Tensor or x.is_meta):
            return False
    return not (torch._C._len_torch_dispatch_stack()
                or torch._C._are_functorch_transforms_active() or torch._C._is_tracing())


class _EagerForwardLse(torch.autograd.Function):
    """``tiledattention::sdpa_fwd_lse`` with its autograd formula, for eager calls: the same
    forward and backward formula without the op's dispatch, and leaner for autograd's engine,
    whose cost grows with a node's inputs and outputs: the tensors and one tuple of the other
    arguments in, ``out`` alone out (the log-sum-exp rides on ``ctx``; nothing outside sees it
    to change it). A ``forward`` taking ``ctx``, not a separate ``setup_context``: with one,
    ``apply`` binds the arguments through ``inspect.signature`` on every call."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                sinks: Optional[torch.Tensor], call: tuple) -> torch.Tensor:
        causal, scale, bottom_right, schedule, left, right, softcap = call
        out, lse, kept = _forward_kept(q, k, v, causal, scale, bottom_right, schedule, left,
                                       right, softcap, sinks)
        ctx.save_for_backward(q, k, v, out, sinks)
        ctx.lse, ctx.kept = lse, kept
        ctx.flags = (causal, scale, bottom_right, left, right, softcap)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        q, k, v, out, sinks = ctx.saved_tensors
        kept = ctx.kept
        # the forward's kept call knows its backward once one has run: launch it directly
        # where nothing traces and dO is laid out as the output (sinks take the general path:
        # their gradient reads the kernels' row sums). The saved tensors are plain (the forward
        # took the eager route): only dO can come from a tracer.
        if (kept is not None and sinks is None and grad_out.stride() == out.stride()
                and eager(grad_out)):
            if kept.backward_plan is None:
                causal, scale, bottom_right, left, right, softcap = ctx.flags
                kept.backward_plan = _training.backward_plan(
                    runtime(), grad_out, q, k, v, out, ctx.lse,
                    _causal_arg(causal, bottom_right), scale,
                    variant=_variant(left, right, softcap, None))
            return (*kept.backward_plan.backward(grad_out, q, k, v, out, ctx.lse, None),
                    None, None)
        return (*attention_grads(grad_out, q, k, v, out, ctx.lse, sinks, ctx.flags,
                        sinks is not None and ctx.needs_input_grad[3]), None)


def eager_forward_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                      scale: Optional[float], bottom_right: bool, schedule: Optional[str],
                      window_left: int, window_right: int, softcap: float,
                      sinks: Optional[torch.Tensor]) -> torch.Tensor:
    """``tiledattention::sdpa_fwd_lse(...)[0]`` (its arguments, in its order) through the eager
    route, for a call :func:`eager` admits."""
    return _EagerForwardLse.apply(q, k, v, sinks, (causal, scale, bottom_right, schedule,
                                                   window_left, window_right, softcap))


# -- tiledattention.sdpa on inputs that require grad ----------------------------------------------
def grad_enabled() -> bool:
    """Whether autograd records operations now (not under ``torch.no_grad()`` /
    ``torch.inference_mode()``)."""
    return torch.is_grad_enabled()


def needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               sinks: Optional[torch.Tensor] = None) -> bool:
    """Whether an attention call on these tensors must be differentiable."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                        or (sinks is not None and sinks.requires_grad))


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: Any = False,
         scale: Any = None, *, window: Any = None, softcap: Any = None, sinks: Any = None,
         schedule: Any = None) -> torch.Tensor:
    """``tiledattention.sdpa`` for torch tensors that require grad (grad mode on): the output of
    ``tiledattention::sdpa_fwd_lse``, whose backward runs ``tiledattention::sdpa_bwd``.

    Always a family that keeps the log-sum-exp ("sdpa_with_lse": the prefill forward, whatever
    the shape); ``schedule`` may be one of its schedules (the backward's is looked up).
    """
    is_causal, bottom_right = causal_flags(causal)  # raises for anything else
    left, right, cap = variant_args(window, softcap)
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        raise InputTypeError(f"sinks must be a torch.Tensor like q, or None; got "
                             f"{type(sinks).__name__}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise InputTypeError(f"scale must be a float or None; got {type(scale).__name__}")
        scale = float(scale)
    chosen = None
    if schedule is not None:
        family_for_schedule(schedule)  # not a schedule sdpa takes: sdpa's InputTypeError
        try:
            chosen = schedule_json(schedule)
        except InputTypeError as exc:  # a schedule of a family that keeps no log-sum-exp
            raise UnsupportedOperationError(
                f"these inputs require grad, so the call keeps the log-sum-exp for a backward "
                f"pass: {exc} (or call under torch.no_grad() / with detached inputs)") from None
    if eager(q, k, v, sinks):
        return eager_forward_lse(q, k, v, is_causal, scale, bottom_right, chosen, left, right,
                                 cap, sinks)
    return torch.ops.tiledattention.sdpa_fwd_lse(q, k, v, is_causal, scale, bottom_right,
                                                 chosen, left, right, cap, sinks)[0]
