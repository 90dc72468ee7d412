"""Compile-only builds of the backward kernels for any architecture, on a machine without a GPU:
the same kernel objects and constants the launcher uses, for arrays laid out the way the
runtime passes them (contiguous q, k, v, out, dO and gradients; the row statistics as
``[B, H_q, S_q]`` views of padded storage). A ragged problem compiles for packed sequences
(``varlen_attn``'s layout): ``[1, H, tokens, D]`` views of contiguous ``[tokens, H, D]``
tensors with ``tokens = batch * seqlen``, contiguous float32 ``[1, H_q, tokens]`` statistics
and the int32 ``[4, batch]`` ranges (``work_table``: the dQ and dK/dV kernels that walk a work
table, ``Work``, instead of a grid)."""

from __future__ import annotations

import dataclasses

from ...core._compile import (CompileResult, array_constraint, attention_constraints,
                              export_cubin, row_stat_constraint)
from ...core._lazy import lazy_module
from ...core._problem import Problem
from ._launch import (DELTA_PARAMETERS, DKDV_PARAMETERS, DQ_ACCUM, DQ_PARAMETERS,
                      DQ_SCALE_PARAMETERS, PROLOGUE_PARAMETERS, RANGES, SUM_PARAMETERS,
                      VARIANT_VALUES, WORK, delta_constants, delta_kernel, dkdv_constants,
                      dkdv_kernel, dq_constants, dq_kernel, dq_query_rows, dq_scale_constants,
                      dq_scale_kernel, has_variants, normalise, prologue_constants,
                      prologue_kernel, sum_constants, sum_kernel)
from ._schedule import BackwardSchedule

ct = lazy_module("cuda.tile", globals(), "ct")
ctc = lazy_module("cuda.tile.compilation", globals(), "ctc")

__all__ = ["compile_backward", "compile_prologue"]


def _table_constraint(problem: Problem, length: int, tile: int):
    """A work table (int32 ``[2, items]``) of ``tile``-row tiles of ``problem.batch``
    sequences of ``length`` rows each."""
    return array_constraint("int32", (2, problem.batch * -(-length // tile)))


def compile_backward(problem: Problem, schedule: BackwardSchedule, arch: str, *,
                     work_table: bool = False) -> CompileResult:
    """Compile the kernels ``normalise(problem, schedule)`` launches for ``arch``; raise
    :class:`CompileError`. The result is the dK/dV kernel's cubin (the largest, whose shared
    memory decides feasibility), with the dQ kernel's (one-pass, ``dq_mode="atomic"``: the
    delta and dQ-scale kernels') and with ``dkdv_splits > 1`` the partials' sum kernel's in
    ``other_cubins``; ``seconds`` counts every build. ``work_table`` (a ragged problem): the
    dQ and dK/dV kernels that walk work tables (``WORK_TABLE``)."""
    s = normalise(problem, schedule)
    p = problem
    packed = p.ragged
    q_like, kv_like = attention_constraints(p, packed)  # packed: [1, H, tokens, D] views
    stat = row_stat_constraint(p, packed)
    # the float32 dK/dV partials: [splits * B, H_kv, S_k, D], packed [splits, H_kv, tokens, D]
    entries, rows = (1, p.batch * p.seqlen_k) if packed else (p.batch, p.seqlen_k)
    kv_parts = array_constraint("fp32", (s.dkdv_splits * entries, p.heads_kv, rows,
                                         p.head_dim))
    scale = ctc.ScalarConstraint(ct.float32)
    count = ctc.ScalarConstraint(ct.int32)
    # the variants' launch-time values, or where the launch passes an empty tuple a zero-byte
    # constant (cuda.tile.compilation takes no tuple); Ranges: the int32 [4, sequences]
    # ranges of a ragged call
    variants = ({"window_left": count, "window_right": count, "softcap": scale}
                if has_variants(p) else dict.fromkeys(VARIANT_VALUES, ctc.ConstantConstraint(0)))
    variants[RANGES] = (array_constraint("int32", (4, p.batch)) if p.ragged
                        else ctc.ConstantConstraint(0))
    table = work_table and p.ragged
    # a work table (int32 [2, items]) of query tiles for the dQ kernel, of key tiles for the
    # dK/dV kernel, or the zero-byte constant
    dq_variants, dkdv_variants = (
        {**variants, WORK: (_table_constraint(p, length, tile)
                            if table else ctc.ConstantConstraint(0))}
        for length, tile in ((p.seqlen_q, dq_query_rows(p, s)), (p.seqlen_k, s.dkdv_tile_n)))
    one_pass = s.dq_mode == "atomic"
    # the one-pass backward's float32 dQ accumulator (contiguous, shaped like q's view: packed
    # [1, H_q, tokens, D]), else the zero-byte constant the launch's empty tuple stands for
    rows = (1, p.batch * p.seqlen_q) if packed else (p.batch, p.seqlen_q)
    accum = (array_constraint("fp32", (rows[0], p.heads_q, rows[1], p.head_dim)) if one_pass
             else ctc.ConstantConstraint(0))
    label = f"backward {s.describe()}"
    grads = kv_parts if s.dkdv_splits > 1 else kv_like
    dkdv = export_cubin(
        dkdv_kernel(s),
        DKDV_PARAMETERS.ordered(
            {"Q": q_like, "K": kv_like, "V": kv_like, "dO": q_like, "Lse": stat,
             "Delta": stat, "dK": grads, "dV": grads, "qk_scale": scale, "heads_kv": count,
             "group": count, **dkdv_variants, DQ_ACCUM: accum},
            dkdv_constants(p, s, packed=packed, work_table=table)),
        arch, label + " (dK/dV)")
    if one_pass:
        others = [export_cubin(delta_kernel(), DELTA_PARAMETERS.ordered(
                      {"Out": q_like, "dO": q_like, "Delta": stat, "dQacc": accum},
                      delta_constants(p)), arch, label + " (delta)"),
                  export_cubin(dq_scale_kernel(), DQ_SCALE_PARAMETERS.ordered(
                      {"dQacc": accum, "dQ": q_like, "qk_scale": scale},
                      dq_scale_constants(p)), arch, label + " (dQ scale)")]
    else:
        others = [export_cubin(
            dq_kernel(s),
            DQ_PARAMETERS.ordered(
                {"Q": q_like, "K": kv_like, "V": kv_like, "Out": q_like, "dO": q_like,
                 "Lse": stat, "Delta": stat, "dQ": q_like, "qk_scale": scale, "heads_q": count,
                 "group": count, **dq_variants},
                dq_constants(p, s, packed=packed, work_table=table)), arch,
            label + " (dQ)")]
    if s.dkdv_splits > 1:
        others.append(export_cubin(
            sum_kernel(), SUM_PARAMETERS.ordered({"Parts": kv_parts, "Grad": kv_like},
                                                 sum_constants(p, s.dkdv_splits)),
            arch, label + " (dK/dV sum)"))
    return dataclasses.replace(dkdv, seconds=dkdv.seconds + sum(o.seconds for o in others),
                               other_cubins=tuple(o.cubin for o in others))



def compile_prologue(problem: Problem, schedule: BackwardSchedule, arch: str) -> CompileResult:
    """Compile (only) the prologue a packed backward of ragged ``problem`` launches on ``arch``
    (``backward_prologue``: the dK/dV kernel's work table, the dQ kernel's unless one-pass, and
    the clears of the gradients' uncovered rows), for ``tiledtune aot`` (under
    ``capturing``)."""
    s = normalise(problem, schedule)
    p = problem
    query_table = s.dq_mode != "atomic"
    q_like, kv_like = attention_constraints(p, True)
    tiles = (dq_query_rows(p, s), s.dkdv_tile_n)
    return export_cubin(
        prologue_kernel(),
        PROLOGUE_PARAMETERS.ordered(
            {"Ranges": array_constraint("int32", (4, p.batch)),
             "WorkQ": (_table_constraint(p, p.seqlen_q, tiles[0]) if query_table
                       else ctc.ConstantConstraint(0)),
             "WorkK": _table_constraint(p, p.seqlen_k, tiles[1]),
             "dQ": q_like, "dK": kv_like, "dV": kv_like},
            prologue_constants(p, tiles, query_table=query_table, key_table=True, clear=True)),
        arch, f"backward prologue {s.describe()}")
