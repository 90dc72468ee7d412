"""The backward family's ragged batches (``Problem.ragged``: sequences of their own lengths, given
per call as int32 ``[4, sequences]`` ranges) on the CPU: compile-only builds of both kernels for
packed sequences on several architectures, the normaliser's one-tile-per-CTA schedule (no
splits, no work orders), the kernels' ``Ranges`` placed by name (a zero-byte
placeholder outside a ragged call), the ragged grids, and the launch-argument builder's refusals.

Whether the kernels' gradients are right (sliced views, empty ranges, TMA on slices) is for the
GPU tests; here only what runs without a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest

from tiledattention import BACKWARD, BackwardSchedule, Problem
from tiledattention.core._work_table import work_items
from tiledattention.kernels.backward._launch import (DKDV_PARAMETERS, DQ_ACCUM, DQ_PARAMETERS,
                                                     RANGES, UNUSED, VARIANT_VALUES, WORK,
                                                     dkdv_constants, dq_constants, has_variants,
                                                     kernel_args, launch, launch_ragged,
                                                     launches, normalise, ragged_grids,
                                                     scratch_shapes)
from tiledattention.errors import KernelArgumentError, UnsupportedProblemError
from tiledattention.tooling import text_digest

from .test_backward_variants import _digests

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")


def _problem(sq=512, sk=512, causal=True, bottom_right=True, left=-1, right=-1, softcap=0.0,
             hq=8, hkv=2, d=96, batch=8, ragged=True) -> Problem:
    return Problem(batch=batch, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype="bf16", causal=causal, bottom_right=bottom_right, window_left=left,
                   window_right=right, softcap=softcap, ragged=ragged)


#: a bucket of packed causal sequences (bottom-right per sequence), grouped heads, D 96
RAGGED = _problem()
#: not causal, multi-head, D 64
RAGGED_FULL = _problem(causal=False, bottom_right=False, hq=4, hkv=4, d=64, sk=1024)
#: a causal left window and a softcap over a ragged batch
RAGGED_WINDOW = _problem(left=127, softcap=30.0, d=64)


class _Ranges:
    """What the launcher reads of a ranges array: its shape and dtype."""

    def __init__(self, sequences: int, dtype: str = "int32") -> None:
        self.shape = (4, sequences)
        self.dtype = dtype


_ARRAYS = tuple(object() for _ in range(10))  # q, k, v, out, dO, lse, delta, dq, dk, dv


def _packed_ranges(lens):
    """The int32 ``[4, sequences]`` ranges (CPU) of self-attention sequences packed end to
    end."""
    import torch

    ends = torch.tensor([0] + lens).cumsum(0)
    return torch.stack((ends[:-1], ends[1:], ends[:-1], ends[1:])).to(torch.int32)


def _prologue_and_rest(calls):
    """The recorded ``ct.launch`` calls split into the backward's prologue (its arguments by
    parameter name; None where it did not launch; at most one) and the others' ``(grid,
    kernel, args)``."""
    from tiledattention.kernels.backward._launch import PROLOGUE_PARAMETERS, prologue_kernel

    prologues = [(grid, dict(zip(PROLOGUE_PARAMETERS.names, args)))
                 for _, grid, kernel, args in calls if kernel is prologue_kernel()]
    assert len(prologues) <= 1
    rest = [(grid, kernel, args) for _, grid, kernel, args in calls
            if kernel is not prologue_kernel()]
    return (prologues or [None])[0], rest


# -- compile-only builds (the variants' tests' builder and cache) --------------------------------
@pytest.mark.parametrize("arch", ARCHES)
def test_ragged_problem_compiles_both_kernels_for_each_architecture(arch):
    """Packed sequences (the compile-only layout): the dK/dV kernel and the dQ kernel, and no
    partials' sum (a ragged schedule never splits)."""
    assert len(_digests(RAGGED, arch=arch)) == 2


@pytest.mark.parametrize("arch", ARCHES)
def test_the_kernels_that_walk_work_tables_compile_for_each_architecture(arch):
    """A skewed ragged call's dQ and dK/dV kernels over work tables (``WORK_TABLE``): other
    code than over grids, for a causal grouped bucket and (on sm_90: on sm_100 these builds
    took over a minute of CI's time) a windowed softcapped one."""
    from tiledattention.kernels.backward._compile import compile_backward

    for problem in (RAGGED, RAGGED_WINDOW) if arch == "sm_90" else (RAGGED,):
        s = BACKWARD.default_schedule(arch, problem)
        result = compile_backward(problem, s, arch, work_table=True)
        tables = tuple(text_digest(c) for c in (result.cubin, *result.other_cubins))
        assert len(tables) == 2 and set(tables).isdisjoint(_digests(problem, s, arch))


@pytest.mark.parametrize("arch", ARCHES)
def test_a_one_pass_ragged_backward_compiles_for_each_architecture(arch):
    """One-pass over a work table of key tiles: the dK/dV kernel adding each sequence's dQ
    shares into its rows of the accumulator, the delta and dQ-scale kernels; on sm_90 (also for
    a causal grouped bucket of a two-part head dim) the dK/dV kernel is other code than the
    padded batch's one-pass kernel."""
    from tiledattention.kernels.backward._compile import compile_backward

    for problem in (RAGGED_FULL, RAGGED) if arch == "sm_90" else (RAGGED_FULL,):
        s = normalise(problem, BACKWARD.default_schedule(arch, problem).replace(
            dq_mode="atomic"))
        assert s.dq_mode == "atomic"
        result = compile_backward(problem, s, arch, work_table=True)
        assert len(result.other_cubins) == 2  # delta, dQ scale
        if arch == "sm_90":  # one architecture: CI's time
            plain = dataclasses.replace(problem, ragged=False)
            padded = compile_backward(plain, normalise(plain, s), arch)
            assert text_digest(result.cubin) != text_digest(padded.cubin)


def test_on_sm_90_a_packed_backward_reads_its_rows_through_the_arrays_descriptors(tmp_path):
    """The packed dQ and dK/dV kernels load each sequence's rows by row from the uncut arrays
    (whose TMA descriptors the launch makes) and cut a slice only for the tile that runs past
    the sequence (two loads from cuts, each a descriptor the kernel builds: ``UTMACCTL.IV``)
    and for the stores (without TMA). Each slice read by TMA costs a CTA a descriptor built in
    the kernel; cut every array per sequence, as before 2026-12-04, and each kernel builds six."""
    from tiledattention.core._problem import head_dim_parts
    from tiledattention.kernels.backward._compile import compile_backward

    from .test_backward_atomic import _sass

    for problem in (RAGGED_FULL, RAGGED):
        s = BACKWARD.default_schedule("sm_90", problem)
        result = compile_backward(problem, s, "sm_90", work_table=True)
        for name, cubin in (("dK/dV", result.cubin), ("dQ", result.other_cubins[0])):
            sass = _sass(cubin, tmp_path / "kernel.cubin")
            assert "UTMALDG" in sass, name
            parts = 2 if head_dim_parts(problem.head_dim, s.split_d)[1] else 1
            assert sass.count("UTMACCTL.IV") <= 2 * parts, (problem.describe(), name)


@pytest.mark.parametrize("problem", [RAGGED_FULL, RAGGED_WINDOW], ids=["full-mha-d64",
                                                                       "window-softcap"])
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_ragged_variants_compile(problem, arch):
    assert len(_digests(problem, arch=arch)) == 2


def test_ragged_reaches_both_kernels_code():
    """The same schedule compiles to other code for a ragged bucket than for the padded batch
    of its shape (the sequences' ranges, the packed layout, the per-sequence lengths)."""
    plain = dataclasses.replace(RAGGED, ragged=False)
    s = normalise(RAGGED, BACKWARD.default_schedule("sm_90", RAGGED))
    ragged, base = _digests(RAGGED, s), _digests(plain, normalise(plain, s))
    assert ragged[0] != base[0] and ragged[1] != base[1]


def test_the_ranges_placeholder_compiles_as_ct_launch_passes_it():
    """Outside a ragged call the compile-only build gives ``Ranges`` a zero-byte constant
    (``export_cubin``'s ``cutile_python_v1`` convention takes no tuple) and ``ct.launch`` the
    empty tuple :data:`UNUSED` (its JIT compiling the signature length-free, as the build
    does): the same machine code for both kernels (with ``restamp``'s
    old-against-new check, the windowed and softcapped problems' code stays what it was)."""
    import io

    import cuda.tile as ct
    from cuda.tile import compilation as ctc

    from tiledattention.core._bundles import any_length
    from tiledattention.core._compile import array_constraint
    from tiledattention.core._problem import row_stat_shape
    from tiledattention.kernels.backward._launch import dkdv_kernel, dq_kernel

    p = dataclasses.replace(RAGGED_WINDOW, ragged=False)
    s = normalise(p, BACKWARD.default_schedule("sm_90", p).replace(dkdv_splits=1))
    ours = _digests(p, s)
    q_like = array_constraint("bf16", (p.batch, p.heads_q, p.seqlen_q, p.head_dim))
    kv_like = array_constraint("bf16", (p.batch, p.heads_kv, p.seqlen_k, p.head_dim))
    b, h, padded = row_stat_shape(p)
    stat = array_constraint("fp32", (b, h, p.seqlen_q), (h * padded, padded, 1))
    scalars = {"qk_scale": ctc.ScalarConstraint(ct.float32), "group": ctc.ScalarConstraint(
        ct.int32), "window_left": ctc.ScalarConstraint(ct.int32),
        "window_right": ctc.ScalarConstraint(ct.int32),
        "softcap": ctc.ScalarConstraint(ct.float32), RANGES: ctc.TupleConstraint(()),
        WORK: ctc.TupleConstraint(())}
    builds = (
        (dkdv_kernel(s), DKDV_PARAMETERS.ordered(
            {"Q": q_like, "K": kv_like, "V": kv_like, "dO": q_like, "Lse": stat, "Delta": stat,
             "dK": kv_like, "dV": kv_like, "heads_kv": ctc.ScalarConstraint(ct.int32),
             DQ_ACCUM: ctc.TupleConstraint(()), **scalars}, dkdv_constants(p, s))),
        (dq_kernel(s), DQ_PARAMETERS.ordered(
            {"Q": q_like, "K": kv_like, "V": kv_like, "Out": q_like, "dO": q_like, "Lse": stat,
             "Delta": stat, "dQ": q_like, "heads_q": ctc.ScalarConstraint(ct.int32),
             **scalars}, dq_constants(p, s))))
    for (kernel, args), digest in zip(builds, ours, strict=True):
        # (as a launch's JIT compiles it: without the length assumptions, core._aot)
        signature = ctc.KernelSignature(
            [any_length(a) for a in args],
            calling_convention=ctc.CallingConvention.cutile_python_v2())
        buf = io.BytesIO()
        ctc.export_kernel(kernel, [signature], buf, gpu_code="sm_90", output_format="cubin")
        assert text_digest(buf.getvalue()) == digest


# -- normalise and defaults ---------------------------------------------------------------------
def test_normalise_drops_work_orders_for_ragged_problems_only():
    """Work orders assume every batch entry has the bucket's whole length: a ragged problem
    gets their canonical values (its work tables order its tiles); the padded batch of its
    shape keeps them. Splits share each sequence's own walk: both keep them."""
    s = BackwardSchedule(dkdv_splits=8, dq_heavy_first=True, tile_major=True)
    plain = dataclasses.replace(RAGGED, ragged=False)
    kept = normalise(plain, s)
    assert (kept.dkdv_splits, kept.dq_heavy_first, kept.tile_major) == (8, True, True)
    n = normalise(RAGGED, s)
    assert (n.dkdv_splits, n.dq_heavy_first, n.tile_major) == (8, False, False)
    assert normalise(RAGGED, n) == n
    # the rest of the schedule is left as it was
    assert dataclasses.replace(n, dq_heavy_first=True, tile_major=True) == s
    assert not dkdv_constants(RAGGED, s)["TILE_MAJOR"] and dkdv_constants(RAGGED, s)["SPLITS"] == 8
    assert not dq_constants(RAGGED, s)["HEAVY_FIRST"]
    assert scratch_shapes(RAGGED, s) == {}  # a ragged launch's partials: ragged_parts_shape


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_121"])
def test_ragged_defaults_are_normal_and_unsplit(arch):
    """A small multi-query bucket whose padded batch the default would split and order."""
    mqa = _problem(hq=8, hkv=1, d=128, batch=1, sq=4096, sk=4096)
    plain = dataclasses.replace(mqa, ragged=False)
    padded = BACKWARD.default_schedule(arch, plain)
    assert padded.dkdv_splits > 1 and padded.dq_heavy_first
    s = BACKWARD.default_schedule(arch, mqa)
    assert normalise(mqa, s) == s
    assert (s.dkdv_splits, s.dq_heavy_first, s.tile_major) == (1, False, False)


# -- constants, parameters and arguments ---------------------------------------------------------
def test_ragged_problems_pass_their_ranges_last():
    assert has_variants(RAGGED) and has_variants(RAGGED_FULL)
    for params in (DQ_PARAMETERS, DKDV_PARAMETERS):
        assert params.names[11:14] == VARIANT_VALUES and params.names[14:16] == (RANGES, WORK)
        assert {"RAGGED", "PACKED", "WORK_TABLE"} <= params.constants
    s = BackwardSchedule()
    for constants in (dq_constants(RAGGED, s), dkdv_constants(RAGGED, s)):
        assert constants["RAGGED"] and not constants["PACKED"]
        assert not constants["WINDOW"] and not constants["SOFTCAP"]
    assert dq_constants(RAGGED, s, packed=True)["PACKED"]
    assert dkdv_constants(RAGGED, s, packed=True)["PACKED"]
    windowed = dataclasses.replace(RAGGED_WINDOW, ragged=False)
    assert not dq_constants(windowed, s, packed=True)["PACKED"]  # packed needs a ragged batch
    assert not dq_constants(windowed, s)["RAGGED"]


@pytest.mark.parametrize("tables", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("packed", [False, True])
def test_kernel_args_put_the_ranges_in_place(packed, tables):
    """The ragged launch's arguments are the kernels' signatures filled by name, the
    call's ranges at ``Ranges``, each kernel's work table (or the placeholder) at ``Work``,
    ``PACKED`` as the call's layout and ``WORK_TABLE`` where a table is given."""
    s = BackwardSchedule(dkdv_tile_n=128, dq_tile_m=32)
    plan = launches(RAGGED_WINDOW, s, 0.125)
    ranges = _Ranges(5)
    work = tuple(_Ranges(7) if t else None for t in tables)
    q, k, v, out, do, lse, delta, dq, dk, dv = _ARRAYS
    dq_args, dkdv_args = kernel_args(plan, *_ARRAYS, ranges, packed=packed, work=work)
    values = {"qk_scale": 0.125, "group": 4, "window_left": 127, "window_right": -1,
              "softcap": 30.0, RANGES: ranges}
    dq_table, dkdv_table = (UNUSED if w is None else w for w in work)
    expected_dq = DQ_PARAMETERS.ordered(
        {"Q": q, "K": k, "V": v, "Out": out, "dO": do, "Lse": lse, "Delta": delta, "dQ": dq,
         "heads_q": 8, WORK: dq_table, **values},
        dq_constants(RAGGED_WINDOW, s, packed=packed, work_table=tables[0]))
    expected_dkdv = DKDV_PARAMETERS.ordered(
        {"Q": q, "K": k, "V": v, "dO": do, "Lse": lse, "Delta": delta, "dK": dk, "dV": dv,
         "heads_kv": 2, DQ_ACCUM: UNUSED, WORK: dkdv_table, **values},
        dkdv_constants(RAGGED_WINDOW, s, packed=packed, work_table=tables[1]))
    for got, want in ((dq_args, expected_dq), (dkdv_args, expected_dkdv)):
        assert len(got) == len(want) and all(a is b or a == b for a, b in zip(got, want))
    assert dq_args[DQ_PARAMETERS.names.index(RANGES)] is ranges
    assert dq_args[DQ_PARAMETERS.names.index("WORK_TABLE")] is tables[0]
    assert dkdv_args[DKDV_PARAMETERS.names.index("WORK_TABLE")] is tables[1]


def test_other_variant_problems_pass_the_zero_byte_placeholder():
    """A windowed batch that is not ragged passes ``Ranges`` an empty tuple (no bytes of the
    parameter space: its code stays as before); plain problems pass one for every variant
    value too."""
    windowed = dataclasses.replace(RAGGED_WINDOW, ragged=False)
    plan = launches(windowed, BackwardSchedule(), 0.1)
    dq_args, dkdv_args = kernel_args(plan, *_ARRAYS)
    at = DQ_PARAMETERS.names.index(RANGES)
    assert dq_args[at] == UNUSED == () and dkdv_args[at] == ()
    assert len(dq_args) == len(DQ_PARAMETERS.names)
    plain = dataclasses.replace(windowed, window_left=-1, softcap=0.0)
    plan = launches(plain, BackwardSchedule(), 0.1)
    dq_args, dkdv_args = kernel_args(plan, *_ARRAYS)
    assert dq_args[8:16] == (0.1, 8, 4, UNUSED, UNUSED, UNUSED, UNUSED, UNUSED)
    assert dq_args[16:] == plan.dq_scalars[6:]
    assert dkdv_args[:8] == (*_ARRAYS[:3], _ARRAYS[4], _ARRAYS[5], _ARRAYS[6], _ARRAYS[8],
                             _ARRAYS[9])
    assert dkdv_args[11:17] == (UNUSED,) * 6


def test_kernel_args_refuse_ranges_where_they_do_not_belong():
    """``ranges`` exactly for a ragged problem, ``packed`` only with them, and the ranges an
    int32 ``[4, sequences]`` array: :class:`KernelArgumentError` otherwise, before anything is
    launched."""
    ragged_plan = launches(RAGGED, BackwardSchedule(), 0.1)
    with pytest.raises(KernelArgumentError, match="ranges must be given"):
        kernel_args(ragged_plan, *_ARRAYS)
    with pytest.raises(KernelArgumentError, match="ranges must be given"):
        launch(None, ragged_plan, *_ARRAYS)  # the padded launcher cannot run a ragged plan
    for plain in (dataclasses.replace(RAGGED, ragged=False),
                  dataclasses.replace(RAGGED_WINDOW, ragged=False)):
        plan = launches(plain, BackwardSchedule(), 0.1)
        with pytest.raises(KernelArgumentError, match="ranges must be given"):
            kernel_args(plan, *_ARRAYS, _Ranges(8))
        with pytest.raises(KernelArgumentError, match="ranges must be given"):
            launch_ragged(None, plan, *_ARRAYS, _Ranges(8), 512, 512, packed=False)
        with pytest.raises(KernelArgumentError, match="packed"):
            kernel_args(plan, *_ARRAYS, packed=True)
        with pytest.raises(KernelArgumentError, match="work"):
            kernel_args(plan, *_ARRAYS, work=(None, _Ranges(3)))
    for bad in (_Ranges(8, "int64"), type("Flat", (), {"shape": (32,), "dtype": "int32"})()):
        with pytest.raises(KernelArgumentError, match=r"int32 \[4, sequences\]"):
            kernel_args(ragged_plan, *_ARRAYS, bad)


# -- grids ----------------------------------------------------------------------------------------
def test_ragged_grids_cover_the_longest_sequence_for_every_sequence_and_head():
    s = BackwardSchedule(dq_tile_m=128, dkdv_tile_n=64, dkdv_splits=4, tile_major=True)
    dq_grid, dkdv_grid = ragged_grids(RAGGED, s, 13, 300, 1000)
    assert dq_grid == (-(-300 // 128), 13 * 8, 1)
    assert dkdv_grid == (-(-1000 // 64), 13 * 2, 4)  # splits on the third axis, not tile-major
    tiny = ragged_grids(RAGGED, s, 3, 0, 0)  # empty sequences: one idle CTA a (sequence, head)
    assert tiny == ((1, 3 * 8, 1), (1, 3 * 2, 4))
    # the tiles are the normalised schedule's: a bucket of 16 rows runs 16-row tiles
    short = dataclasses.replace(RAGGED, seqlen_q=16, seqlen_k=16)
    assert ragged_grids(short, s, 2, 16, 16) == ((1, 16, 1), (1, 4, 4))
    plan = launches(RAGGED, s, 0.1)
    assert plan.tiles == (128, 64) and plan.splits == 4 and plan.scratch == {}


def test_ragged_grids_refuse_what_no_grid_takes():
    with pytest.raises(UnsupportedProblemError, match="second dimension"):
        ragged_grids(RAGGED, BackwardSchedule(), 65536 // 8 + 1, 512, 512)
    for bad in (-1, 2.5, True):
        with pytest.raises(KernelArgumentError, match="longest_q"):
            ragged_grids(RAGGED, BackwardSchedule(), 4, bad, 512)


@pytest.mark.parametrize("least", [None, 8192, 1 << 62])
def test_a_ragged_backward_walks_work_tables(monkeypatch, least):
    """Each kernel's launch is 1-D over (work item x head) and takes a table built first on
    the same stream (query tiles for dQ, key tiles for dK/dV), whatever the lengths (the
    backward's threshold, 0); where a threshold keeps a kernel on its grid (``least``), the
    grid of the longest sequence's tiles for every sequence."""
    import cuda.tile
    import torch

    from tiledattention.core import _work_table

    assert _work_table.BACKWARD_TABLE_MIN_IDLE_CTAS == 0
    if least is not None:
        monkeypatch.setattr(_work_table, "BACKWARD_TABLE_MIN_IDLE_CTAS", least)
    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    problem = _problem(hq=28, hkv=4, d=128, sq=16384, sk=16384)
    plan = launches(problem, BackwardSchedule(dq_tile_m=128, dkdv_tile_n=128), 0.1)
    for lens, idle in (([12000] + [300] * 40, (True, True)), ([1024] * 16, (False, False)),
                       ([4096] + [100] * 20, (True, False))):
        tokens = sum(lens)
        q = torch.empty(1, 28, tokens, 128, dtype=torch.bfloat16)
        k = torch.empty(1, 4, tokens, 128, dtype=torch.bfloat16)
        ranges = _packed_ranges(lens)
        arrays = (q, k, k, q, q, None, None, q, k, k)
        launch_ragged("stream", plan, *arrays, ranges, max(lens), max(lens), packed=True)
        prologue, rest = _prologue_and_rest(calls)
        grids = [grid for grid, _, _ in rest]
        calls.clear()
        # idle: whether at least 8192 CTAs of the kernel's grid would idle
        tables = tuple({None: True, 8192: i, 1 << 62: False}[least] for i in idle)
        for kernel, heads in enumerate((28, 4)):
            if tables[kernel]:
                items = work_items(sequences=len(lens), longest=max(lens), rows=tokens,
                                   tile=128)
                assert grids[kernel] == (items * heads, 1, 1)
            else:
                assert grids[kernel] == (-(-max(lens) // 128), len(lens) * heads, 1)
        # one prologue launch fills the tables asked for and clears the packed gradients' rows
        grid, named = prologue
        assert grid == (len(lens) + 1, 3, 1) and len(grids) == 2
        assert (named["QUERY_TABLE"], named["KEY_TABLE"], named["CLEAR"]) == (*tables, True)
        assert named["dQ"] is q and named["dK"] is k and named["dV"] is k
        assert [isinstance(named[w], torch.Tensor) for w in ("WorkQ", "WorkK")] == list(tables)


def test_more_sequences_than_a_grid_dimension_holds_walk_tables(monkeypatch):
    """Sequences x heads past a grid's second dimension: a kernel walks a table whatever the
    threshold (its grid would not launch; the grids themselves are refused), the other kernel
    keeps a grid that fits (4200 sequences x 4 K/V heads)."""
    import cuda.tile
    import torch

    from tiledattention.core import _work_table

    monkeypatch.setattr(_work_table, "BACKWARD_TABLE_MIN_IDLE_CTAS", 1 << 62)
    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    lens = [3, 17] * 2100  # 4200 sequences x 16 query heads > 65535
    problem = _problem(hq=16, hkv=4, d=64, sq=32, sk=32, batch=4096)
    s = BackwardSchedule(dq_tile_m=64, dkdv_tile_n=64)
    with pytest.raises(UnsupportedProblemError, match="second dimension"):
        ragged_grids(problem, s, len(lens), 17, 17)
    tokens = sum(lens)
    q = torch.empty(1, 16, tokens, 64, dtype=torch.bfloat16)
    k = torch.empty(1, 4, tokens, 64, dtype=torch.bfloat16)
    ranges = _packed_ranges(lens)
    launch_ragged("stream", launches(problem, s, 0.1), q, k, k, q, q, None, None, q, k, k,
                  ranges, 17, 17, packed=True)
    prologue, rest = _prologue_and_rest(calls)
    assert [grid for grid, _, _ in rest] == [(len(lens) * 16, 1, 1), (1, len(lens) * 4, 1)]
    assert (prologue[1]["QUERY_TABLE"], prologue[1]["KEY_TABLE"]) == (True, False)


@pytest.mark.parametrize("packed", [True, False])
def test_a_one_pass_ragged_backward_launches_its_row_kernels_over_every_row(monkeypatch, packed):
    """One-pass: the delta kernel over every row of the call's arrays (all tokens of a packed
    batch, every entry's rows of a padded one), the dK/dV kernel over its work table with the
    accumulator, the dQ-scale kernel over the rows again; no dQ kernel and no table of query
    tiles. The accumulator is required exactly for a one-pass plan."""
    import cuda.tile
    import torch

    from tiledattention.kernels.backward._launch import (DELTA_TILE, SUM_TILE, delta_kernel,
                                                         dq_scale_kernel)

    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    problem = _problem(hq=8, hkv=2, d=64, sq=512, sk=512)
    s = BackwardSchedule(dq_mode="atomic", dkdv_tile_n=64, dkdv_tile_m=64)
    plan = launches(problem, s, 0.1)
    lens = [300, 17, 512, 5]
    if packed:
        entries, rows, ranges = 1, sum(lens), _packed_ranges(lens)
    else:
        entries, rows = len(lens), max(lens)
        ranges = torch.tensor([[0] * 4, lens, [0] * 4, lens], dtype=torch.int32)
    q = torch.empty(entries, 8, rows, 64, dtype=torch.bfloat16)
    k = torch.empty(entries, 2, rows, 64, dtype=torch.bfloat16)
    accum = torch.empty(q.shape, dtype=torch.float32)
    arrays = (q, k, k, q, q, None, "delta", "dq", k, k)
    with pytest.raises(KernelArgumentError, match="dq_accum"):
        launch_ragged("stream", plan, *arrays, ranges, 512, 512, packed=packed)
    launch_ragged("stream", plan, *arrays, ranges, 512, 512, packed=packed, dq_accum=accum)
    prologue, launched = _prologue_and_rest(calls)
    assert not prologue[1]["QUERY_TABLE"] and prologue[1]["WorkQ"] == ()  # key tiles' only
    assert prologue[1]["CLEAR"] == packed  # a padded batch's rows are not cleared
    assert [kernel for _, kernel, _ in launched] == [delta_kernel(), plan.dkdv,
                                                     dq_scale_kernel()]
    assert launched[0][0] == (-(-rows // DELTA_TILE), entries * 8, 1)
    assert launched[0][2][:4] == (q, q, "delta", accum)
    assert launched[2][0] == (-(-rows // SUM_TILE), entries * 8, 1)
    assert launched[2][2][:3] == (accum, "dq", 0.1)
    dkdv_args = launched[1][2]
    assert any(a is accum for a in dkdv_args) and any(a is ranges for a in dkdv_args)
    plain = launches(problem, s.replace(dq_mode="kernel"), 0.1)
    with pytest.raises(KernelArgumentError, match="dq_accum"):
        launch_ragged("stream", plain, *arrays, ranges, 512, 512, packed=packed,
                      dq_accum=accum)


# -- the family ----------------------------------------------------------------------------------
def test_family_backward_launches_a_ragged_call_with_its_layout(monkeypatch):
    """``Family.backward(..., ragged=layout)`` hands the layout's ranges, longest counts and
    packing to ``launch_ragged`` (no scratch); without a layout the padded launcher runs."""
    import tiledattention.kernels.backward._family as family_module
    from tiledattention.core._ragged import RaggedLayout

    calls = []
    monkeypatch.setattr(family_module, "launch_ragged",
                        lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.setattr(family_module, "launch", lambda *args: calls.append((args, None)))
    ranges = _Ranges(6)
    s = BACKWARD.default_schedule("sm_90", RAGGED)
    BACKWARD.backward("stream", RAGGED, s, 0.1, *_ARRAYS[:7], _ARRAYS[7:],
                      ragged=RaggedLayout(ranges, 300, 400, True))
    args, kwargs = calls[-1]
    assert args[0] == "stream" and args[1] is launches(RAGGED, s, 0.1)
    assert args[2:12] == _ARRAYS and args[12:] == (ranges, 300, 400)
    # a two-kernel default: no accumulator; one split: no partials
    assert kwargs == {"packed": True, "dq_accum": None, "parts": None}


@pytest.mark.parametrize("least", [None, 1 << 62], ids=["tables", "grids"])
def test_a_split_ragged_backward_writes_partials_and_sums_them(monkeypatch, least):
    """With dK/dV splits a ragged launch runs each (sequence x K/V head)'s key tile as that
    many CTAs (a work table's items x heads x splits, or the grid's third axis), hands the
    dK/dV kernel the partials, then sums each into its gradient over every row of ``k``'s
    view; the partials are required exactly for a split plan, checked before any launch."""
    import cuda.tile
    import torch

    from tiledattention.core import _work_table
    from tiledattention.kernels.backward._launch import SUM_TILE, ragged_parts_shape, sum_kernel

    if least is not None:
        monkeypatch.setattr(_work_table, "BACKWARD_TABLE_MIN_IDLE_CTAS", least)
    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    lens = [3000] + [100] * 39
    problem = _problem(hq=16, hkv=1, d=128, sq=4096, sk=4096)
    plan = launches(problem, BackwardSchedule(dq_tile_m=128, dkdv_tile_n=64, dkdv_splits=4), 0.1)
    assert plan.splits == 4
    tokens = sum(lens)
    q = torch.empty(1, 16, tokens, 128, dtype=torch.bfloat16)
    k = torch.empty(1, 1, tokens, 128, dtype=torch.bfloat16)
    dk, dv = torch.empty_like(k), torch.empty_like(k)
    ranges = _packed_ranges(lens)
    args = (q, k, k, q, q, None, None, q, dk, dv, ranges, max(lens), max(lens))
    with pytest.raises(KernelArgumentError, match="parts"):
        launch_ragged("stream", plan, *args, packed=True)
    assert not calls
    assert ragged_parts_shape(plan, k) == (4, 1, tokens, 128)
    parts = tuple(torch.zeros(ragged_parts_shape(plan, k)) for _ in range(2))
    launch_ragged("stream", plan, *args, packed=True, parts=parts)
    _, rest = _prologue_and_rest(calls)
    dkdv_grid, _, dkdv_args = rest[1]
    assert dkdv_args[6] is parts[0] and dkdv_args[7] is parts[1]  # the kernel writes partials
    if least is None:  # a work table: items x K/V heads x splits
        items = work_items(sequences=len(lens), longest=max(lens), rows=tokens, tile=64)
        assert dkdv_grid == (items * 1 * 4, 1, 1)
    else:  # the longest sequence's key tiles x (sequences x K/V heads) x splits
        assert dkdv_grid == (-(-max(lens) // 64), len(lens), 4)
    sums = [(grid, args) for _, grid, kernel, args in calls if kernel is sum_kernel()]
    assert [args[:2] for _, args in sums] == [(parts[0], dk), (parts[1], dv)]
    assert all(grid == (-(-tokens // SUM_TILE), 1, 1) for grid, _ in sums)
    with pytest.raises(KernelArgumentError, match="parts"):  # one split: none to give
        launch_ragged("stream", launches(problem, BackwardSchedule(), 0.1), *args, packed=True,
                      parts=parts)
