"""PyTorch and Hugging Face integration for tiledattention (imported on demand, not by
``import tiledattention``).

Importing this package registers the torch custom ops ``torch.ops.tiledattention.sdpa_fwd``
(the forward), ``sdpa_fwd_lse`` (the forward that keeps each row's log-sum-exp), ``sdpa_bwd``
(dq, dk, dv) and ``sdpa_ranges_fwd`` (a padded batch's forward within per-entry ranges):
traceable by ``torch.compile(fullgraph=True)`` and ``torch.export``, the first three with
autograd formulas, so a compiled training step traces the forward and the backward.

- :func:`attention` — ``tiledattention.sdpa`` through those ops, differentiable.
- :func:`ranged_attention` — ``tiledattention.sdpa(..., ranges=)`` through ``sdpa_ranges_fwd``
  (inference: the ranges stay on the device, so compiled and CUDA graphs hold the call).
- :func:`sdpa_kernel` / :func:`enable` / :func:`disable` — route
  ``torch.nn.functional.scaled_dot_product_attention`` calls tiledattention supports to it (also
  calls that require grad), the rest (masks, dropout, CPU, fp32, ...) to PyTorch unchanged;
  :func:`route_decision` is the policy, :func:`router_stats` counts where calls went.
- :class:`PaddingMask` / :func:`padding_mask` — a padded batch's ``attn_mask`` that carries each
  entry's ranges, so the router runs it as ``tiledattention.sdpa(..., ranges=)`` (no autograd)
  and torch's function, called directly, as the boolean mask it stands for.
- :func:`register_hf` — ``attn_implementation="tiledattention"`` for transformers models.
"""

from __future__ import annotations

from ._hf import ATTN_IMPLEMENTATION, hf_stats, register_hf, reset_hf_stats
from ._padding import PaddingMask, padding_mask
from ._router import (
    FALLBACK_REASONS,
    RouterStats,
    disable,
    enable,
    is_enabled,
    reset_router_stats,
    route_decision,
    router_stats,
    sdpa_kernel,
)
from ._torch_op import (BWD_OP_NAME, FWD_LSE_OP_NAME, OP_NAME, RANGES_OP_NAME, attention,
                        ranged_attention)

__all__ = [
    "ATTN_IMPLEMENTATION", "BWD_OP_NAME", "FALLBACK_REASONS", "FWD_LSE_OP_NAME", "OP_NAME",
    "PaddingMask", "RANGES_OP_NAME", "RouterStats", "attention", "disable", "enable",
    "hf_stats", "is_enabled", "padding_mask", "ranged_attention", "register_hf",
    "reset_hf_stats", "reset_router_stats", "route_decision", "router_stats", "sdpa_kernel",
]
