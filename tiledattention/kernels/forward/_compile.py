"""Compile-only builds of the forward kernel: a schedule's cubin for any architecture, on a
machine without a GPU (``tiledtune search --compile-only``, the CI checks). It compiles the same
kernel object and constants the launcher uses, for arrays laid out the way ``sdpa`` passes them
(last dim contiguous, 16-byte aligned rows; a contiguous float32 ``[H_q]`` array of sink logits
for a problem with sinks; for FP8 inputs a bf16 output, V as ``[B, H_kv, D, S_k]`` and float32
``[B, H_kv]`` descale factors), via ``tiledattention.core._compile.export_cubin``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ...core._compile import (CompileResult, array_constraint, attention_constraints,
                              export_cubin, row_stat_constraint)
from ...core._dtypes import element
from ...core._lazy import lazy_module
from ._launch import kernel_constants, kernel_for, ordered_args, transposed_value_strides
from ...core._problem import Problem
from ._schedule import Schedule

ct = lazy_module("cuda.tile", globals(), "ct")
ctc = lazy_module("cuda.tile.compilation", globals(), "ctc")

__all__ = ["compile_schedule"]


def compile_schedule(problem: Problem, schedule: Schedule, arch: str, *,
                     store_lse: bool | None = False,
                     work_table: bool | None = False) -> CompileResult:
    """Compile ``schedule`` for ``problem`` into a cubin for ``arch``; raise :class:`CompileError`.

    The constants are ``kernel_constants(problem, schedule)``, so ``schedule`` and
    ``normalise(problem, schedule)`` give the same cubin. A ragged problem compiles for packed
    sequences (``varlen_attn``'s layout). ``store_lse`` / ``work_table`` None builds both
    values of that constant (``work_table`` for a ragged problem only); the result is the
    first build's, the others in ``other_cubins``."""
    builds = [_export(problem, kernel_for(schedule),
                      kernel_constants(problem, schedule, store_lse=lse, packed=problem.ragged,
                                       work_table=table), arch, schedule.describe())
              for lse in ((False, True) if store_lse is None else (store_lse,))
              for table in ((False, True) if work_table is None and problem.ragged
                            else (bool(work_table),))]
    return dataclasses.replace(builds[0], seconds=sum(b.seconds for b in builds),
                               other_cubins=tuple(b.cubin for b in builds[1:]))


def _export(problem: Problem, kernel: ct.kernel, constants: Mapping[str, Any], arch: str,
            label: str) -> CompileResult:
    """Compile ``kernel`` with these named constants (exactly the kernel's ``ct.Constant``
    parameters) for ``problem``'s arrays (contiguous, as ``sdpa`` allocates them) into a cubin
    for ``arch``. ``label`` names the build in errors. Tests use it to compile constants that
    no normalised schedule produces."""
    p = problem
    q_like, kv_like = attention_constraints(p, bool(constants.get("PACKED")))
    if p.page_size:  # page pools [pages, page_size, H_kv, D], as many pages as the keys fill
        pages = p.batch * -(-p.seqlen_k // p.page_size)
        kv_like = array_constraint(p.dtype, (pages, p.page_size, p.heads_kv, p.head_dim))
    out_like = q_like
    v_like = kv_like
    if constants.get("FP8"):  # e4m3 inputs: a bf16 output, V as [B, H_kv, D, S_k], descales
        out_like = array_constraint(element(p.dtype).output_name,
                                    (p.batch, p.heads_q, p.seqlen_q, p.head_dim))
        v_like = array_constraint(p.dtype, (p.batch, p.heads_kv, p.head_dim, p.seqlen_k),
                                  transposed_value_strides(p.batch, p.heads_kv, p.head_dim,
                                                           p.seqlen_k))
    runtime = {"Q": q_like, "K": kv_like, "V": v_like, "Out": out_like,
               "qk_scale": ctc.ScalarConstraint(ct.float32),
               "heads_q": ctc.ScalarConstraint(ct.int32), "group": ctc.ScalarConstraint(ct.int32)}
    # the variants' values where their constants read them (ordered_args fills in the others)
    if constants.get("WINDOW"):
        runtime["window_left"] = runtime["window_right"] = ctc.ScalarConstraint(ct.int32)
    if constants.get("SOFTCAP"):
        runtime["softcap"] = ctc.ScalarConstraint(ct.float32)
    if constants.get("STORE_LSE"):  # the float32 log-sum-exps
        runtime["Lse"] = row_stat_constraint(p, bool(constants.get("PACKED")))
    if constants.get("SINKS"):  # the [H_q] float32 sink logits
        runtime["Sinks"] = array_constraint("fp32", (p.heads_q,))
    if constants.get("RAGGED"):  # the int32 [4, sequences] query and key ranges
        runtime["Ranges"] = array_constraint("int32", (4, p.batch))
    if constants.get("PAGED"):  # the block table
        runtime["Pages"] = array_constraint("int32", (p.batch, -(-p.seqlen_k // p.page_size)))
    if constants.get("FP8"):  # float32 [B, H_kv] descale factors of q, k and v
        runtime["QDescale"] = runtime["KDescale"] = runtime["VDescale"] = array_constraint(
            "fp32", (p.batch, p.heads_kv))
    if constants.get("WORK_TABLE"):  # the int32 [2, items] work table of a skewed ragged call
        items = p.batch * -(-p.seqlen_q // constants["TILE_M"])
        runtime["Work"] = array_constraint("int32", (2, items))
    return export_cubin(kernel, ordered_args(runtime, constants), arch, label)
