"""Compile-only builds of the decode kernels for any architecture, on a machine without a GPU:
the same kernel objects and constants the launcher uses, for arrays laid out the way ``sdpa``
passes them (q and out as ``[B, H', G', S_q, D]`` views of contiguous tensors; with sinks a
contiguous float32 ``[H_q]`` array, else the int32 placeholder; a paged cache as contiguous
page pools with an int32 block table; an FP8 cache with float32 ``[B, H_kv]`` descales)."""

from __future__ import annotations

import dataclasses

from ...core._compile import CompileResult, array_constraint, export_cubin
from ...core._lazy import lazy_module
from ...core._problem import Problem
from ._flat import flat_scratch_shapes
from ._launch import (COMBINE_PARAMETERS, ORDER_CHUNK, SPLIT_PARAMETERS, combine_constants,
                      combine_kernel, launches, layout, normalise, order_kernel, split_constants,
                      split_kernel, tail_rows)
from ._schedule import DecodeSchedule

ct = lazy_module("cuda.tile", globals(), "ct")
ctc = lazy_module("cuda.tile.compilation", globals(), "ctc")

__all__ = ["compile_decode"]


def compile_decode(problem: Problem, schedule: DecodeSchedule, arch: str) -> CompileResult:
    """Compile the split kernel (and the combine kernel, when there is more than one split) of
    ``normalise(problem, schedule)`` for ``arch``; raise :class:`CompileError`. The result is
    the split kernel's cubin, with the combine kernel's (and a longest-first plan's
    ``decode_order``'s) in ``other_cubins``; ``seconds`` counts every build."""
    schedule = normalise(problem, schedule)
    p, tiles = problem, layout(problem, schedule)
    shape5 = (p.batch, tiles.view_heads, tiles.view_group, p.seqlen_q, p.head_dim)
    contiguous = (p.heads_q * p.seqlen_q * p.head_dim, tiles.view_group * p.seqlen_q * p.head_dim,
                  p.seqlen_q * p.head_dim, p.head_dim, 1)
    q5 = array_constraint(p.dtype, shape5, contiguous)
    kv_dtype = p.kv_dtype or p.dtype  # an FP8 cache: e4m3 K and V
    if p.page_size:  # page pools [pages, page_size, H_kv, D], as many pages as the keys fill
        pages = p.batch * -(-p.seqlen_k // p.page_size)
        kv_shape = (pages, p.page_size, p.heads_kv, p.head_dim)
    else:
        kv_shape = (p.batch, p.heads_kv, p.seqlen_k, p.head_dim)
    k = v = array_constraint(kv_dtype, kv_shape)
    if schedule.flat:
        return _compile_flat(p, schedule, arch, q5, k)
    if p.kv_dtype:  # an FP8 cache's V as the launcher passes it: int16 words of two values
        v = array_constraint("int16", (*kv_shape[:-1], kv_shape[-1] // 2))
    tile_d = split_constants(p, schedule)["TILE_D"]
    merged = tail_rows(p, schedule) or tiles.rows  # the rows of partials
    opart = array_constraint("fp32", (merged, schedule.splits, tiles.tile_m, tile_d))
    lse = array_constraint("fp32", (merged, schedule.splits, tiles.tile_m))
    direct = schedule.splits == 1
    constants = split_constants(p, schedule)
    lengths = array_constraint("int32", (p.batch,))
    # the sink logits, or the placeholder int (what ct.launch makes of a Python int)
    sinks = (array_constraint("fp32", (p.heads_q,)) if p.sinks
             else ctc.ScalarConstraint(ct.int32))
    runtime = {"Q": q5, "K": k, "V": v, "Out": q5,
               "Opart": q5 if direct else opart, "Lse": q5 if direct else lse,
               "qk_scale": ctc.ScalarConstraint(ct.float32),
               "causal_offset": ctc.ScalarConstraint(ct.int32),
               "kv_div": ctc.ScalarConstraint(ct.int32),
               "window_left": ctc.ScalarConstraint(ct.int32),
               "window_right": ctc.ScalarConstraint(ct.int32),
               "softcap": ctc.ScalarConstraint(ct.float32), "Sinks": sinks,
               # a ragged entry's ranges, or the zero-byte placeholder (a constant here:
               # export_cubin's convention takes no tuple; the same machine code)
               "Ranges": (lengths if p.page_size
                          else array_constraint("int32", (4, p.batch)) if p.ragged
                          else ctc.ConstantConstraint(0)),
               # a paged cache's block table, or the placeholder
               "Pages": (array_constraint("int32", (p.batch, -(-p.seqlen_k // p.page_size)))
                         if p.page_size else ctc.ConstantConstraint(0)),
               # the longest-first order of the entries, or the placeholder
               "Order": lengths if constants["ORDERED"] else ctc.ConstantConstraint(0)}
    # an FP8 cache's float32 [B, H_kv] descale factors of K and V, or the placeholders
    runtime["KDescale"] = runtime["VDescale"] = (
        array_constraint("fp32", (p.batch, p.heads_kv)) if p.kv_dtype
        else ctc.ConstantConstraint(0))
    runtime["split_hint"] = ctc.ScalarConstraint(ct.int32)
    label = f"decode {schedule.describe()}"
    result = export_cubin(split_kernel(schedule), SPLIT_PARAMETERS.ordered(runtime, constants),
                          arch, label)
    others = []
    if not direct:
        others.append(export_cubin(
            combine_kernel(schedule),
            COMBINE_PARAMETERS.ordered({"Opart": opart, "Lse": lse, "Out": q5, "Sinks": sinks},
                                       combine_constants(p, schedule)), arch,
            label + " (combine)"))
    if constants["ORDERED"]:
        others.append(export_cubin(order_kernel(), [lengths, lengths, ORDER_CHUNK], arch,
                                   label + " (order)"))
    if not others:
        return result
    return dataclasses.replace(result, seconds=result.seconds + sum(o.seconds for o in others),
                               other_cubins=tuple(o.cubin for o in others))


def _compile_flat(p: Problem, schedule: DecodeSchedule, arch: str, q5: object, kv: object
                  ) -> CompileResult:
    """A flat schedule's split kernel (the result) and its merge (``other_cubins``),
    for a contiguous page pool ``kv`` and block table and the launch's scratch views."""
    from . import _flat_kernel

    flat = launches(p, schedule, None).flat
    opart_shape, _ = flat_scratch_shapes(flat)
    opart = array_constraint("fp32", opart_shape)
    lse = array_constraint("fp32", (opart_shape[0], flat.tile_m))
    cu = array_constraint("int32", (p.batch + 1,))
    lens = array_constraint("int32", (p.batch,))
    table = array_constraint("int32", (p.batch, -(-p.seqlen_k // p.page_size)))
    i32, f32 = ctc.ScalarConstraint(ct.int32), ctc.ScalarConstraint(ct.float32)
    label = f"decode {schedule.describe()}"
    result = export_cubin(flat.split, [q5, q5, kv, kv, opart, lse, cu, lens, table, f32, i32,
                                       *flat.split_constants], arch, label)
    merge = export_cubin(_flat_kernel.flat_merge, [opart, lse, q5, cu, i32,
                                                   *flat.merge_constants], arch,
                         label + " (merge)")
    return dataclasses.replace(result, seconds=result.seconds + merge.seconds,
                               other_cubins=(merge.cubin,))
