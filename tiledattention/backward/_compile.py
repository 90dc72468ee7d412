"""Compile-only builds of the backward kernels for any architecture, on a machine without a GPU:
the same kernel objects and constants the launcher uses, for arrays laid out the way the
runtime passes them (contiguous q, k, v, out, dO and gradients; the row statistics as
``[B, H_q, S_q]`` views of padded storage)."""

from __future__ import annotations

import dataclasses

from .._compile import CompileResult, array_constraint, export_cubin
from .._lazy import lazy_module
from .._problem import Problem
from ._launch import (DKDV_PARAMETERS, DQ_PARAMETERS, PREP_PARAMETERS, SUM_PARAMETERS,
                      dkdv_constants, dkdv_kernel, dq_constants, dq_kernel, helper_kernel,
                      normalise, prep_constants, row_stat_shape, sum_constants)
from ._schedule import BackwardSchedule

ct = lazy_module("cuda.tile", globals(), "ct")
ctc = lazy_module("cuda.tile.compilation", globals(), "ctc")

__all__ = ["compile_backward"]


def compile_backward(problem: Problem, schedule: BackwardSchedule, arch: str) -> CompileResult:
    """Compile the kernels ``normalise(problem, schedule)`` launches for ``arch``; raise
    :class:`CompileError`. The result is the dK/dV kernel's cubin (the largest, whose shared
    memory decides feasibility), with the others' (the dQ kernel's, or with ``dq_atomic`` the
    prep and sum kernels'; the partials' sum kernel with ``dkdv_splits > 1``) in
    ``other_cubins``; ``seconds`` counts every build."""
    s = normalise(problem, schedule)
    p = problem
    q_like = array_constraint(p.dtype, (p.batch, p.heads_q, p.seqlen_q, p.head_dim))
    kv_like = array_constraint(p.dtype, (p.batch, p.heads_kv, p.seqlen_k, p.head_dim))
    q_acc = array_constraint("fp32", (p.batch, p.heads_q, p.seqlen_q, p.head_dim))
    kv_parts = array_constraint("fp32", (s.dkdv_splits * p.batch, p.heads_kv, p.seqlen_k,
                                         p.head_dim))
    b, h, padded = row_stat_shape(p)
    stat = array_constraint("fp32", (b, h, p.seqlen_q), (h * padded, padded, 1))
    scale = ctc.ScalarConstraint(ct.float32)
    count = ctc.ScalarConstraint(ct.int32)
    label = f"backward {s.describe()}"
    grads_out = kv_parts if s.dkdv_splits > 1 else kv_like
    dkdv = export_cubin(
        dkdv_kernel(s),
        DKDV_PARAMETERS.ordered({"Q": q_like, "K": kv_like, "V": kv_like, "dO": q_like,
                                 "Lse": stat, "Delta": stat, "dK": grads_out, "dV": grads_out,
                                 "dQacc": q_acc if s.dq_atomic else q_like,
                                 "qk_scale": scale, "heads_kv": count, "group": count},
                                dkdv_constants(p, s)), arch, label + " (dK/dV)")
    others = []
    if s.dq_atomic:
        others.append(export_cubin(
            helper_kernel("prep"),
            PREP_PARAMETERS.ordered({"Out": q_like, "dO": q_like, "Delta": stat,
                                     "dQacc": q_acc, "heads_q": count}, prep_constants(p)),
            arch, label + " (prep)"))
        others.append(export_cubin(
            helper_kernel("sum"),
            SUM_PARAMETERS.ordered({"Parts": q_acc, "Grad": q_like, "factor": scale},
                                   sum_constants(p, 1)), arch, label + " (dQ sum)"))
    else:
        others.append(export_cubin(
            dq_kernel(s),
            DQ_PARAMETERS.ordered({"Q": q_like, "K": kv_like, "V": kv_like, "Out": q_like,
                                   "dO": q_like, "Lse": stat, "Delta": stat, "dQ": q_like,
                                   "qk_scale": scale, "heads_q": count, "group": count},
                                  dq_constants(p, s)), arch, label + " (dQ)"))
    if s.dkdv_splits > 1:
        others.append(export_cubin(
            helper_kernel("sum"),
            SUM_PARAMETERS.ordered({"Parts": kv_parts, "Grad": kv_like, "factor": scale},
                                   sum_constants(p, s.dkdv_splits)), arch,
            label + " (dK/dV sum)"))
    return dataclasses.replace(dkdv, seconds=dkdv.seconds + sum(o.seconds for o in others),
                               other_cubins=tuple(o.cubin for o in others))
