"""The ``tiledattention::sdpa_fwd`` torch custom op: opaque to ``torch.compile`` / ``torch.export``.

The op's implementation calls :func:`tiledattention.sdpa` (which validates its inputs and raises a
clear error for anything the kernel cannot run, e.g. CPU tensors); the fake implementation gives
the output's shape, dtype and layout so tracing never runs the kernel. The kernel is forward-only:
backward through the op raises instead of returning wrong gradients.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import InputValueError, UnsupportedOperationError
from ..forward._problem import BOTTOM_RIGHT, causal_flags

__all__ = ["OP_NAME", "attention", "sdpa_fwd"]

#: Qualified name of the op: ``torch.ops.tiledattention.sdpa_fwd``.
OP_NAME = "tiledattention::sdpa_fwd"

_FORWARD_ONLY = (
    "tiledattention.sdpa_fwd is forward-only: the tiledattention kernel has no backward pass. "
    "Run it under torch.no_grad() / torch.inference_mode(), detach its inputs, or use "
    "torch.nn.functional.scaled_dot_product_attention for training (the router "
    "tiledattention.integrations.sdpa_kernel() does this for inputs that require grad)."
)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The shape checks that tracing can do (the kernel checks the rest when it runs)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise InputValueError(
                f"{name} must have 4 dims [batch, heads, seqlen, head_dim]; got shape "
                f"{tuple(x.shape)}"
            )
    if tuple(v.shape) != tuple(k.shape):
        raise InputValueError(f"v must have the shape of k {tuple(k.shape)}; got {tuple(v.shape)}")


def _check_flags(causal: bool, bottom_right: bool) -> None:
    if bottom_right and not causal:
        raise InputValueError("bottom_right=True needs causal=True (it aligns the causal mask); "
                              "got causal=False")


# No device_types: the op runs wherever tiledattention.sdpa accepts the tensors (CUDA), and for
# anything else the runtime's validation names the problem ("q must be a CUDA tensor; ...").
@torch.library.custom_op(OP_NAME, mutates_args=())
def sdpa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
             scale: Optional[float], bottom_right: bool = False) -> torch.Tensor:
    """Attention of ``q [B, H_q, S_q, D]`` over ``k, v [B, H_kv, S_k, D]``: ``[B, H_q, S_q, D]``.
    ``bottom_right`` (with ``causal``) aligns the causal mask to the bottom-right corner."""
    import tiledattention  # looked up per call, so tests can substitute a reference

    _check_shapes(q, k, v)
    _check_flags(causal, bottom_right)
    return tiledattention.sdpa(q, k, v, BOTTOM_RIGHT if bottom_right else causal, scale)


@sdpa_fwd.register_fake
def _sdpa_fwd_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                   scale: Optional[float], bottom_right: bool = False) -> torch.Tensor:
    _check_shapes(q, k, v)
    _check_flags(causal, bottom_right)
    b, hq, sq, d = q.shape
    return q.new_empty((b, hq, sq, d))  # contiguous, dtype and device of q


def _setup_context(ctx, inputs, output) -> None:
    pass


def _backward(ctx, grad_output):
    raise UnsupportedOperationError(_FORWARD_ONLY)


sdpa_fwd.register_autograd(_backward, setup_context=_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool | str = False,
              scale: float | None = None) -> torch.Tensor:
    """``tiledattention.sdpa`` as the traceable op ``torch.ops.tiledattention.sdpa_fwd``.

    Same contract as :func:`tiledattention.sdpa` (``[B, H, S, D]`` in and out, bf16/fp16 CUDA
    tensors, grouped-query ``k, v`` with fewer heads); usable inside
    ``torch.compile(fullgraph=True)`` and ``torch.export``. Forward only: backward raises.
    ``causal``: ``False``, ``True`` or ``"top_left"`` (torch's ``is_causal``: query ``i`` sees
    keys ``0..i``), or ``"bottom_right"`` (torch's ``causal_lower_right``: keys
    ``0..i + S_k - S_q``; a row that sees no key, possible when ``S_q > S_k``, is zero).
    """
    if isinstance(scale, int) and not isinstance(scale, bool):
        scale = float(scale)
    if not isinstance(causal, str):
        return torch.ops.tiledattention.sdpa_fwd(q, k, v, bool(causal), scale)
    is_causal, bottom_right = causal_flags(causal)  # raises for any other string
    return torch.ops.tiledattention.sdpa_fwd(q, k, v, is_causal, scale, bottom_right)
