"""Compile-only builds of the backward kernels for any architecture, on a machine without a GPU:
the same kernel objects and constants the launcher uses, for arrays laid out the way the
runtime passes them (contiguous q, k, v, out, dO and gradients; the row statistics as
``[B, H_q, S_q]`` views of padded storage)."""

from __future__ import annotations

import dataclasses

from .._compile import CompileResult, array_constraint, export_cubin
from .._lazy import lazy_module
from .._problem import Problem
from ._launch import (SUM_PARAMETERS, dkdv_constants, dkdv_kernel, dkdv_parameters,
                      dq_constants, dq_kernel, dq_parameters, normalise, row_stat_shape,
                      sum_constants, sum_kernel, uses_variant_kernels)
from ._schedule import BackwardSchedule

ct = lazy_module("cuda.tile", globals(), "ct")
ctc = lazy_module("cuda.tile.compilation", globals(), "ctc")

__all__ = ["compile_backward"]


def compile_backward(problem: Problem, schedule: BackwardSchedule, arch: str) -> CompileResult:
    """Compile the kernels ``normalise(problem, schedule)`` launches for ``arch``; raise
    :class:`CompileError`. The result is the dK/dV kernel's cubin (the largest, whose shared
    memory decides feasibility), with the dQ kernel's (and with ``dkdv_splits > 1`` the
    partials' sum kernel's) in ``other_cubins``; ``seconds`` counts every build."""
    s = normalise(problem, schedule)
    p = problem
    q_like = array_constraint(p.dtype, (p.batch, p.heads_q, p.seqlen_q, p.head_dim))
    kv_like = array_constraint(p.dtype, (p.batch, p.heads_kv, p.seqlen_k, p.head_dim))
    kv_parts = array_constraint("fp32", (s.dkdv_splits * p.batch, p.heads_kv, p.seqlen_k,
                                         p.head_dim))
    b, h, padded = row_stat_shape(p)
    stat = array_constraint("fp32", (b, h, p.seqlen_q), (h * padded, padded, 1))
    scale = ctc.ScalarConstraint(ct.float32)
    count = ctc.ScalarConstraint(ct.int32)
    variant = uses_variant_kernels(p)
    variants = ({"window_left": count, "window_right": count, "softcap": scale} if variant
                else {})  # the variant kernels' launch-time values
    label = f"backward {s.describe()}"
    grads = kv_parts if s.dkdv_splits > 1 else kv_like
    dkdv = export_cubin(
        dkdv_kernel(s, variant),
        dkdv_parameters(p).ordered(
            {"Q": q_like, "K": kv_like, "V": kv_like, "dO": q_like, "Lse": stat,
             "Delta": stat, "dK": grads, "dV": grads, "qk_scale": scale, "heads_kv": count,
             "group": count, **variants}, dkdv_constants(p, s)), arch, label + " (dK/dV)")
    others = [export_cubin(
        dq_kernel(s, variant),
        dq_parameters(p).ordered(
            {"Q": q_like, "K": kv_like, "V": kv_like, "Out": q_like, "dO": q_like,
             "Lse": stat, "Delta": stat, "dQ": q_like, "qk_scale": scale, "heads_q": count,
             "group": count, **variants}, dq_constants(p, s)), arch, label + " (dQ)")]
    if s.dkdv_splits > 1:
        others.append(export_cubin(
            sum_kernel(), SUM_PARAMETERS.ordered({"Parts": kv_parts, "Grad": kv_like},
                                                 sum_constants(p, s.dkdv_splits)),
            arch, label + " (dK/dV sum)"))
    return dataclasses.replace(dkdv, seconds=dkdv.seconds + sum(o.seconds for o in others),
                               other_cubins=tuple(o.cubin for o in others))
