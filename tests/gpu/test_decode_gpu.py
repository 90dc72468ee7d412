"""The split-KV decode family on the GPU, through ``tiledattention.sdpa`` (dispatch, lookup,
bucketed plans) and through the family's own case (explicit schedules).

- correctness against the float32 reference (relative L2 <= ``DECODE.tolerance``: bf16 1e-2,
  fp16 5e-3) over a pairwise-covering set of S_q, S_k, GQA group, head dim, causal alignment
  and dtype; each case through ``sdpa`` (first call, then the plan fast path with a shorter,
  strided K/V of the same bucket) and through explicit schedules (the sm_90 default, a
  three-split PDL schedule with transposed K loads, a block merge, and both folding each key
  tile as slices of its keys); bottom-right rows that see no key must be
  exact zeros;
- CuPy inputs (contiguous and a head slice), CUDA graph capture and replay with new inputs;
- the decode-loop host path: one plan per K/V-length bucket, not per length (sizes bounded, host
  time of a growing loop close to a fixed-length loop), also for a new ``torch.cat`` cache per
  step;
- dispatch (``explain``) and explicit families agreeing; bad input raising the package's errors
  before anything launches, on the first call and on the warmed fast path.

Explicit-schedule runs write into a NaN-poisoned buffer (``DecodeCase.error``); ``sdpa`` allocates
its own output, so its caching-allocator block is NaN-filled just before the call (best effort)
and the output must be finite.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import pytest
import torch

import tiledattention
from tiledattention import (DECODE, FORWARD, DecodeSchedule, InputTypeError, InputValueError,
                            Problem, problem_from_arrays)
from tiledattention.core._compile import SM_COUNTS
from tiledattention.core._reference import attention_reference
from tiledattention.kernels.decode import length_bucket

from ..decode_cases import CASES, Combo
from ._reference import rel_l2

gpu = pytest.mark.gpu

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: ``causal=`` argument per alignment name
_ALIGN_ARGS = {"none": False, "top_left": "top_left", "bottom_right": "bottom_right"}

# the pairwise-covering case set (CASES, Combo) is tests/decode_cases.py, checked without a GPU
# by tests/cpu/test_gpu_case_sets.py

#: the second explicit schedule: three splits merged by a programmatic dependent launch,
#: 64-key steps, K loaded transposed
SPLIT3_PDL = DecodeSchedule(splits=3, combine="pdl", tile_n=64, k_transposed=True)


# -------------------------------------------------------------------------------- helpers

def _poison_next_alloc(shape, dtype) -> None:
    """Leave a NaN-filled block of this size at the top of the caching allocator's free list, so
    the output ``sdpa`` allocates next (``torch.empty``) most likely starts as NaN."""
    torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def expected(q, k, v, causal=False, scale=None):
    problem, _ = problem_from_arrays(q, k, v, causal, scale)
    return attention_reference(q, k, v, problem, scale), problem


def blind_rows(problem: Problem) -> int:
    """Query rows that see no key (bottom-right with S_q > S_k)."""
    return max(0, -problem.causal_offset) if problem.causal else 0


def assert_output(out, ref, problem: Problem, label: str) -> None:
    assert tuple(out.shape) == tuple(ref.shape), label
    assert out.dtype == _DTYPES[problem.dtype], label
    assert torch.isfinite(out).all(), f"non-finite output ({label})"
    err = rel_l2(out, ref)
    assert err <= DECODE.tolerance(problem), f"rel L2 {err:.2e} ({label})"
    blind = blind_rows(problem)
    if blind:
        assert torch.count_nonzero(out[:, :, :blind]).item() == 0, \
            f"rows that see no key are not zero ({label})"


def sdpa_checked(q, k, v, causal, problem: Problem, ref, label: str, schedule=None):
    _poison_next_alloc(ref.shape, q.dtype)
    out = tiledattention.sdpa(q, k, v, causal=causal, schedule=schedule)
    assert isinstance(out, torch.Tensor)
    assert_output(out, ref, problem, label)
    return out


def _release() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # 8 workers share the GPU: do not keep the reference's peak


# ------------------------------------------------------------------ 1. pairwise correctness

@gpu
@pytest.mark.parametrize("combo", CASES, ids=[c.id for c in CASES])
def test_pairwise_correctness(combo: Combo):
    problem = combo.problem()
    causal = _ALIGN_ARGS[combo.align]
    case = DECODE.case(problem, torch.cuda.current_device())
    tol = DECODE.tolerance(problem)
    try:
        assert torch.isfinite(case.reference).all()

        # dispatch + lookup (S_q = 64 may run the forward), first call: the validating path
        sdpa_checked(case.q, case.k, case.v, causal, problem, case.reference, "sdpa")

        # the decode family explicitly, into a NaN-poisoned buffer, and the same schedule
        # through sdpa
        default = DECODE.default_schedule("sm_90", problem)
        schedules = {"default": default, "split3_pdl": SPLIT3_PDL,
                     # every split merged from one tile (the default's splits, if any)
                     "block": (default if default.splits > 1 else SPLIT3_PDL).replace(
                         combine="block"),
                     # each key tile folded as slices of its keys, merged after the walk
                     "sliced": default.replace(key_slices=4),
                     "sliced_split3": SPLIT3_PDL.replace(key_slices=2, exp2=False),
                     # the merges compiled for four CTAs an SM
                     "merge_occ4": SPLIT3_PDL.replace(merge_occupancy=4),
                     "block_occ4": SPLIT3_PDL.replace(combine="block_pdl", merge_occupancy=4)}
        for name, schedule in schedules.items():
            err = case.error(case.launcher(schedule))
            assert err <= tol, f"rel L2 {err:.2e} ({name}: {schedule.describe()})"
            blind = blind_rows(problem)
            if blind:
                assert torch.count_nonzero(case.out[:, :, :blind]).item() == 0, name
            sdpa_checked(case.q, case.k, case.v, causal, problem, case.reference,
                         f"sdpa {name}", schedule=schedule)

        # the plan fast path: a shorter K/V of the same length bucket, as strided views (the
        # decode plan was kept for the bucket; the offset must follow the real length)
        if combo.sk > 3 and length_bucket(combo.sk - 3) == length_bucket(combo.sk):
            short = combo.sk - 3
            k2, v2 = case.k[:, :, :short], case.v[:, :, :short]
            ref2, problem2 = expected(case.q, k2, v2, causal)
            for schedule in (None, SPLIT3_PDL):
                sdpa_checked(case.q, k2, v2, causal, problem2, ref2,
                             f"sdpa fast path S_k {short} schedule {schedule}", schedule=schedule)
            del ref2
    finally:
        del case
        _release()


@gpu
@pytest.mark.parametrize("shape, splits", [((1, 8, 1, 50000, 64), 64), ((1, 64, 1, 16384, 128), 16),
                                           ((2, 16, 2, 9001, 128), 37)],
                         ids=["mqa-d64-64-splits", "mqa-64-row-tiles", "odd-37-splits"])
def test_block_merge_of_many_splits(shape, splits):
    """``combine="block"``: all of a row's splits merged from one tile (64 splits of 16-row
    tiles, 16 of 64-row tiles, 37 padded to 64), as the stepping merge and the reference, and
    compiled for four CTAs an SM as with no kernel option."""
    b, hq, hkv, sk, d = shape
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype="bf16", causal=False)
    case = DECODE.case(problem, torch.cuda.current_device())
    try:
        schedule = DECODE.default_schedule("sm_90", problem).replace(splits=splits)
        outs = {}
        for combine, occupancy in (("block", None), ("kernel", None), ("block", 4)):
            err = case.error(case.launcher(schedule.replace(combine=combine,
                                                            merge_occupancy=occupancy)))
            assert err <= DECODE.tolerance(problem), (combine, occupancy, err)
            outs[combine, occupancy] = case.out.clone()
        # the same partials, merged alike (and alike again at four CTAs an SM)
        assert rel_l2(outs["block", None], outs["kernel", None]) < 1e-3
        assert rel_l2(outs["block", 4], outs["block", None]) < 1e-6
    finally:
        del case
        _release()


def _as_close_as(problem, schedule, other) -> None:
    """``schedule`` and ``other`` both within the family's tolerance of the float32 reference on
    ``problem`` (NaN-poisoned outputs), ``schedule`` no farther than ``other`` beyond its
    rounding (1.25x, plus 1e-4)."""
    case = DECODE.case(problem, torch.cuda.current_device())
    try:
        errs = {}
        for name, s in (("schedule", schedule), ("other", other)):
            errs[name] = case.error(case.launcher(s))
            assert errs[name] <= DECODE.tolerance(problem), (name, s.describe(), errs[name])
        assert errs["schedule"] <= 1.25 * errs["other"] + 1e-4, errs
    finally:
        del case
        _release()


def _one_query(b, hq, hkv, sk, d, dtype, sinks, window) -> Problem:
    """A decode step of one query row a head over ``sk`` keys; with ``window``, a causal
    sliding window of that many keys at the cache's end."""
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype=dtype, causal=False, sinks=sinks)
    if window:
        problem = dataclasses.replace(problem, causal=True, bottom_right=True,
                                      window_left=window - 1, window_right=0)
    return problem


@gpu
@pytest.mark.parametrize("shape", [(10, 32, 8, 7001, 128, "fp16"), (70, 16, 1, 3333, 64, "bf16"),
                                   (6, 64, 8, 9999, 128, "bf16")],
                         ids=["80-rows", "70-rows-d64", "48-rows"])
def test_rows_short_of_the_sms_split_for_two_ctas_an_sm(shape):
    """The default of a batch whose rows leave a third of the SMs idle at one split, or a fifth
    at the cache rule's two (as many splits as two CTAs an SM hold, the block merge as a
    dependent launch): as close to the float32 reference as one split (bf16 outputs of the two
    differ by their rounding, 2.3e-03 relative L2)."""
    b, hq, hkv, sk, d, dtype = shape
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype=dtype, causal=False)
    default = DECODE.default_schedule("sm_90", problem)
    assert (default.splits, default.occupancy) == (2 * 132 // (b * hkv), 2)
    # the splits' float32 partials merge without adding error beyond the output's rounding
    _as_close_as(problem, default, default.replace(splits=1, occupancy=1, combine="block"))


@gpu
@pytest.mark.parametrize("shape", [(3, 56, 8, 60001, 64, "bf16", False, 10),
                                   (2, 32, 4, 80003, 48, "fp16", True, 32),
                                   (9, 28, 7, 30011, 64, "bf16", False, 4)],
                         ids=["24-rows", "8-rows-d48-sinks-fp16", "63-rows"])
def test_short_heads_over_long_caches_split_twice_for_two_ctas_an_sm(shape):
    """The default of D <= 64 rows the cache rule would split for one CTA an SM (twice its
    splits at two CTAs an SM, 256-key steps, NaN-poisoned output): as close to the float32
    reference as one split, over caches of odd lengths."""
    b, hq, hkv, sk, d, dtype, sinks, splits = shape
    problem = _one_query(b, hq, hkv, sk, d, dtype, sinks, 0)
    default = DECODE.default_schedule("sm_90", problem)
    assert (default.splits, default.occupancy, default.tile_n) == (splits, 2, 256)
    _as_close_as(problem, default, default.replace(splits=1, occupancy=1, combine="block"))


@gpu
@pytest.mark.parametrize("shape", [(1, 64, 8, 100003, 128, "bf16", True),
                                   (5, 28, 4, 77777, 128, "fp16", False)],
                         ids=["8-rows-sinks", "20-rows-fp16"])
def test_d128_splits_over_long_caches_load_keys_three_steps_ahead(shape):
    """The default of D 128 splits at one CTA an SM over 32768+ keys (keys loaded three steps
    ahead, values two, NaN-poisoned output): as close to the float32 reference as two ahead."""
    b, hq, hkv, sk, d, dtype, sinks = shape
    problem = _one_query(b, hq, hkv, sk, d, dtype, sinks, 0)
    default = DECODE.default_schedule("sm_90", problem)
    assert (default.k_latency, default.v_latency, default.occupancy) == (3, 2, 1)
    assert default.splits > 1
    _as_close_as(problem, default, default.replace(k_latency=2))


@gpu
@pytest.mark.parametrize("shape", [(96, 8, 1, 10761, "fp16", True, 4),
                                   (101, 8, 1, 12001, "bf16", False, 3),
                                   (23, 32, 4, 45003, "bf16", False, 4)],
                         ids=["96-rows-sinks-fp16", "101-rows", "92-rows"])
def test_d128_rows_short_of_the_sms_split_for_a_wave_of_three_ctas(shape):
    """The default of 89-102 rows at D 128 over 10000+ keys (3 x SMs // rows splits at three
    CTAs an SM, 64-key steps, NaN-poisoned output): as close to the float32 reference as the
    one split of 256-key steps it replaced, over caches of odd lengths."""
    b, hq, hkv, sk, dtype, sinks, splits = shape
    problem = _one_query(b, hq, hkv, sk, 128, dtype, sinks, 0)
    default = DECODE.default_schedule("sm_90", problem)
    assert (default.splits, default.occupancy, default.tile_n) == (splits, 3, 64)
    _as_close_as(problem, default, default.replace(splits=1, occupancy=1, tile_n=256, k_latency=1,
                                                   v_latency=1, combine="kernel"))


@gpu
@pytest.mark.parametrize("shape", [(9, 64, 8, 25003, "bf16", False, 7),
                                   (25, 8, 2, 35001, "fp16", True, 10),
                                   (3, 48, 16, 20011, "bf16", False, 11)],
                         ids=["72-rows", "50-rows-sinks-fp16", "48-rows-group-3"])
def test_d128_fill_splits_run_one_wave_of_four_ctas(shape):
    """The default of D 128 rows the fill rules split for two CTAs an SM, over 4000+ keys (4 x
    SMs // rows splits at four CTAs an SM, 32-key steps, loads four ahead, NaN-poisoned
    output): as close to the float32 reference as the two-CTA splits it replaced, over caches
    of odd lengths."""
    b, hq, hkv, sk, dtype, sinks, splits = shape
    problem = _one_query(b, hq, hkv, sk, 128, dtype, sinks, 0)
    default = DECODE.default_schedule("sm_90", problem)
    assert (default.splits, default.occupancy, default.tile_n, default.k_latency) == (
        splits, 4, 32, 4)
    rows = b * hkv
    _as_close_as(problem, default, default.replace(splits=2 * 132 // rows, occupancy=2,
                                                   tile_n=128, k_latency=2, v_latency=2))


@gpu
@pytest.mark.parametrize("shape", [(25, 40, 8, 3267, 64, "bf16", False),
                                   (26, 40, 8, 4401, 48, "fp16", True),
                                   (240, 8, 1, 5999, 64, "bf16", False)],
                         ids=["200-rows", "208-rows-d48-sinks-fp16", "240-rows-mqa"])
def test_short_heads_within_a_wave_of_two_over_mid_caches_run_three_ctas(shape):
    """The default of D 33-64 rows within a wave of two CTAs an SM (199-264) over 3000-5999
    keys (one split at three CTAs an SM, 128-key steps, NaN-poisoned output): as close to the
    float32 reference as the 256-key steps at two CTAs an SM it replaced, odd lengths."""
    b, hq, hkv, sk, d, dtype, sinks = shape
    problem = _one_query(b, hq, hkv, sk, d, dtype, sinks, 0)
    default = DECODE.default_schedule("sm_90", problem)
    assert (default.splits, default.occupancy, default.tile_n) == (1, 3, 128)
    _as_close_as(problem, default, default.replace(occupancy=2, tile_n=256))


@gpu
@pytest.mark.parametrize("shape", [(12, 32, 8, 901, 64, "bf16", False),
                                   (29, 16, 4, 1337, 48, "fp16", True),
                                   (121, 8, 1, 2047, 64, "bf16", False)],
                         ids=["96-rows", "116-rows-d48-sinks-fp16", "121-rows-mqa"])
def test_short_head_caches_alone_on_their_sms_walk_256_key_steps(shape):
    """The default of D 33-64 rows alone on their SMs over 900-2047 keys (one split, 256-key
    steps, NaN-poisoned output): as close to the float32 reference as the 128-key steps it
    replaced, odd lengths."""
    b, hq, hkv, sk, d, dtype, sinks = shape
    problem = _one_query(b, hq, hkv, sk, d, dtype, sinks, 0)
    default = DECODE.default_schedule("sm_90", problem)
    assert (default.splits, default.occupancy, default.tile_n) == (1, 1, 256)
    _as_close_as(problem, default, default.replace(tile_n=128))


@gpu
@pytest.mark.parametrize("shape", [(23, 16, 4, 5001, 128, "bf16", False),
                                   (6, 16, 16, 4099, 96, "fp16", False),
                                   (33, 12, 3, 7777, 128, "bf16", True)],
                         ids=["92-rows", "96-rows-d96-fp16", "99-rows-sinks"])
def test_rows_alone_on_their_sms_walk_256_key_steps(shape):
    """The default of 89-102 rows (256-key steps, loads one ahead, one split, NaN-poisoned
    output): as close to the float32 reference as the 128-key steps it replaced, over caches of
    odd lengths whose last step is mostly past the keys."""
    b, hq, hkv, sk, d, dtype, sinks = shape
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype=dtype, causal=False, sinks=sinks)
    default = DECODE.default_schedule("sm_90", problem)
    assert (default.tile_n, default.k_latency, default.v_latency, default.splits) == (256, 1, 1, 1)
    _as_close_as(problem, default, default.replace(tile_n=128, k_latency=2, v_latency=2))


@gpu
@pytest.mark.parametrize("shape", [(23, 32, 8, 6007, 128, "bf16", False, 0, 3, 64),
                                   (45, 16, 4, 3501, 128, "fp16", False, 0, 3, 64),
                                   (43, 32, 8, 4099, 128, "bf16", True, 0, 3, 64),
                                   (118, 16, 4, 3017, 128, "fp16", False, 0, 4, 32),
                                   (61, 32, 8, 3001, 128, "bf16", True, 0, 4, 32),
                                   (76, 32, 8, 3119, 128, "bf16", False, 0, 3, 64),
                                   (87, 16, 4, 3203, 64, "fp16", False, 0, 3, 128),
                                   (49, 32, 8, 3077, 96, "bf16", True, 0, 3, 64),
                                   (79, 16, 8, 3001, 80, "bf16", False, 0, 3, 64),
                                   (61, 32, 8, 9001, 128, "bf16", False, 3001, 4, 32),
                                   (44, 16, 8, 7777, 64, "fp16", False, 4095, 3, 128),
                                   (31, 32, 8, 1777, 64, "bf16", True, 0, 3, 128),
                                   (43, 40, 10, 997, 48, "fp16", False, 0, 4, 128)],
                         ids=["184-rows", "180-rows-fp16", "344-rows-sinks", "472-rows-fp16",
                              "488-rows-sinks", "608-rows", "348-rows-d64-fp16",
                              "392-rows-d96-sinks", "632-rows-d80", "488-rows-window",
                              "352-rows-d64-window-fp16", "248-rows-short-sinks",
                              "430-rows-short-d48"])
def test_rows_at_three_or_four_ctas_an_sm_walk_short_key_steps(shape):
    """The default of 172-264, 331-396 and 581-660 rows at D 128 (one split at three CTAs an
    SM, 64-key steps), of 397-495 (four CTAs, 32-key steps), of 331-396 and 581-660 rows at
    D 64 (128-key steps) and D 65-127 (64-key steps), and short caches at D 33-64 (133-528
    rows, three or four CTAs, 128-key steps), NaN-poisoned output: as close to the float32
    reference as the two-CTA form with steps twice as long that they replaced (four times
    for 32-key steps), over caches of odd lengths; two of them windows (``window`` keys, odd,
    at the end of a longer cache)."""
    b, hq, hkv, sk, d, dtype, sinks, window, occupancy, step = shape
    problem = _one_query(b, hq, hkv, sk, d, dtype, sinks, window)
    default = DECODE.default_schedule("sm_90", problem)
    assert (default.splits, default.occupancy, default.tile_n) == (1, occupancy, step)
    _as_close_as(problem, default, default.replace(occupancy=2, tile_n=max(128, 2 * step),
                                                   k_latency=2, v_latency=2))


@gpu
@pytest.mark.parametrize("shape", [(67, 16, 8, 4001, 64, "bf16", False, 0, 8, 8),
                                   (69, 64, 8, 3503, 64, "fp16", True, 0, 24, 8),
                                   (71, 16, 8, 6007, 96, "bf16", False, 0, 40, 6),
                                   (570, 4, 1, 3001, 64, "bf16", True, 0, 42, 6),
                                   (110, 64, 8, 4003, 48, "fp16", False, 0, 88, 3),
                                   (70, 32, 8, 16001, 64, "bf16", False, 4095, 32, 8),
                                   (105, 32, 8, 9001, 96, "fp16", True, 3501, 48, 5),
                                   (13, 12, 12, 7001, 128, "bf16", True, 0, 24, 5),
                                   (153, 8, 1, 10001, 64, "fp16", False, 0, 21, 6)],
                         ids=["536-rows-d64", "552-rows-sinks-fp16", "568-rows-d96",
                              "570-rows-mqa-sinks", "880-rows-d48-fp16", "560-rows-window",
                              "840-rows-d96-window-sinks", "156-rows-d128-sinks",
                              "153-rows-mqa-fp16"])
def test_last_wave_rows_split_to_fill_it(shape):
    """The default of rows a little past whole waves of two CTAs an SM at D 33-127, or past
    one wave of a CTA an SM (D 128 too): only the last wave's rows split (``tail_rows``), the
    rows before written directly by their own CTAs (with sinks, the split kernel adds theirs
    and the merge the tail's), NaN-poisoned output: as close to the float32 reference as one
    split, over caches of odd lengths (two of them sliding windows at the end of a longer
    cache)."""
    b, hq, hkv, sk, d, dtype, sinks, window, tail, splits = shape
    problem = _one_query(b, hq, hkv, sk, d, dtype, sinks, window)
    default = DECODE.default_schedule("sm_90", problem)
    waves_of_two = b * hkv > 2 * SM_COUNTS["hopper"]  # else past one wave of a CTA an SM
    assert (default.tail_rows, default.splits, default.occupancy) == (tail, splits,
                                                                      1 + waves_of_two)
    _as_close_as(problem, default, default.replace(splits=1, tail_rows=0, combine="block"))
    if not (sinks or window):  # and through sdpa: the lookup's plan, twice (the kept plan)
        case = DECODE.case(problem, torch.cuda.current_device())
        try:
            assert tiledattention.explain(case.q, case.k, case.v).schedule == default
            for label in ("sdpa", "sdpa again"):
                sdpa_checked(case.q, case.k, case.v, False, problem, case.reference, label)
        finally:
            del case
            _release()


@gpu
@pytest.mark.parametrize("sq,sk", [(2, 1), (7, 3), (16, 1), (64, 40), (16, 15)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_bottom_right_rows_without_keys_are_zero(sq, sk, dtype):
    """S_q > S_k bottom-right: rows 0..S_q-S_k-1 see no key and are exact zeros on every path;
    the rest differ from top-left (so the offset is really applied), and the shared reference
    agrees with a mask built here by hand."""
    problem = Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=sq, seqlen_k=sk, head_dim=128,
                      dtype=dtype, causal=True, bottom_right=True)
    case = DECODE.case(problem, torch.cuda.current_device())
    blind = sq - sk
    assert blind_rows(problem) == blind

    # the reference, by hand: row i sees keys j <= i + sk - sq
    mask = (torch.arange(sk, device="cuda")[None, :]
            <= torch.arange(sq, device="cuda")[:, None] + (sk - sq))
    kf = case.k.float().repeat_interleave(4, 1)
    vf = case.v.float().repeat_interleave(4, 1)
    scores = (case.q.float() @ kf.transpose(-1, -2)) / 128 ** 0.5
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    assert rel_l2(case.reference, probs @ vf) <= 1e-5
    assert torch.count_nonzero(case.reference[:, :, :blind]).item() == 0

    for schedule in (DECODE.default_schedule("sm_90", problem), SPLIT3_PDL,
                     DecodeSchedule(splits=2, tile_n=16)):
        assert case.error(case.launcher(schedule)) <= DECODE.tolerance(problem), schedule
        assert torch.count_nonzero(case.out[:, :, :blind]).item() == 0, schedule
        out = sdpa_checked(case.q, case.k, case.v, "bottom_right", problem, case.reference,
                           f"sdpa {schedule.describe()}", schedule=schedule)
    out = sdpa_checked(case.q, case.k, case.v, "bottom_right", problem, case.reference, "sdpa")
    if sk > 1:  # with one key both alignments give the rows that see it the same answer
        top_left = tiledattention.sdpa(case.q, case.k, case.v, causal=True)
        assert rel_l2(out[:, :, blind:], top_left[:, :, blind:].float()) > \
            10 * DECODE.tolerance(problem)


# ------------------------------------------------------------------------------ 2. CuPy

@gpu
@pytest.mark.parametrize("sq,causal,sliced", [(1, False, False), (1, False, True),
                                              (4, "bottom_right", True)],
                         ids=["s1", "s1-head-slice", "s4-bottom-right-head-slice"])
def test_cupy_inputs(sq, causal, sliced):
    cupy = pytest.importorskip("cupy")
    gen = torch.Generator(device="cuda").manual_seed(21 + sq)
    q_big = torch.randn(2, 16, sq, 128, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(2, 4, 5000, 128, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn_like(k)
    q = q_big[:, :8] if sliced else q_big[:, :8].contiguous()
    assert q.is_contiguous() != sliced
    cq = cupy.from_dlpack(q_big)[:, :8] if sliced else cupy.from_dlpack(q)
    ck, cv = cupy.from_dlpack(k), cupy.from_dlpack(v)
    assert cq.flags.c_contiguous != sliced
    assert tiledattention.explain(cq, ck, cv, causal=causal).family == "decode"

    torch.cuda.synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        out_c = tiledattention.sdpa(cq, ck, cv, causal=causal)
    stream.synchronize()
    assert isinstance(out_c, cupy.ndarray)
    assert out_c.shape == (2, 8, sq, 128) and out_c.dtype == cupy.float16
    out_from_cupy = torch.from_dlpack(out_c)

    out_t = tiledattention.sdpa(q, k, v, causal=causal)
    ref, problem = expected(q, k, v, causal)
    tol = DECODE.tolerance(problem)
    assert_output(out_from_cupy, ref, problem, "cupy")
    assert_output(out_t, ref, problem, "torch")
    assert rel_l2(out_from_cupy, out_t.float()) <= tol


# ------------------------------------------------------------------------- 3. CUDA graphs

GRAPH_CASES = {
    # (B, H_q, H_kv, S_k, D, explicit schedule, expected splits of the resolved schedule)
    "multi-split": (1, 32, 8, 32768, 128, None, "many"),
    "one-split": (32, 32, 8, 1024, 128, None, "one"),
    "explicit-pdl": (2, 32, 8, 8192, 128, DecodeSchedule(splits=4, combine="pdl"), "many"),
}


@gpu
@pytest.mark.parametrize("name", list(GRAPH_CASES))
def test_cuda_graph_capture_and_replay_with_new_inputs(name):
    b, hq, hkv, sk, d, schedule, splits = GRAPH_CASES[name]
    gen = torch.Generator(device="cuda").manual_seed(5)

    def rand(h, s):
        return torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)

    q, k, v = rand(hq, 1), rand(hkv, sk), rand(hkv, sk)
    resolved = schedule
    if schedule is None:
        found = tiledattention.explain(q, k, v)
        assert found.family == "decode", found
        resolved = found.schedule
    assert (resolved.splits > 1) == (splits == "many"), resolved.describe()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile, look up, keep the plan
        for _ in range(3):
            tiledattention.sdpa(q, k, v, schedule=schedule)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tiledattention.sdpa(q, k, v, schedule=schedule)

    for _ in range(2):  # two rounds of new inputs: the graph reads the tensors, not copies
        new_q, new_k, new_v = rand(hq, 1), rand(hkv, sk), rand(hkv, sk)
        q.copy_(new_q)
        k.copy_(new_k)
        v.copy_(new_v)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, problem = expected(new_q, new_k, new_v)
        assert_output(out, ref, problem, f"graph replay ({name})")
    del graph
    _release()


@gpu
def test_kept_scratch_buffers_stay_right_over_many_calls_on_two_streams():
    """The runtime keeps a multi-split call's partial outputs per stream (and thread): calls
    back to back, alternating between two streams that run at once, each return their own
    inputs' result."""
    schedule = DecodeSchedule(splits=7, tile_n=64)
    gen = torch.Generator(device="cuda").manual_seed(11)
    k, v = (torch.randn(2, 8, 3001, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    queries = [torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(24)]
    streams = (torch.cuda.current_stream(), torch.cuda.Stream())
    streams[1].wait_stream(streams[0])
    outs = []
    for i, q in enumerate(queries):
        with torch.cuda.stream(streams[i % 2]):
            outs.append(tiledattention.sdpa(q, k, v, schedule=schedule))
    torch.cuda.synchronize()
    for i, (q, out) in enumerate(zip(queries, outs)):
        ref, problem = expected(q, k, v)
        assert_output(out, ref, problem, f"call {i} on stream {i % 2}")
    _release()


# ------------------------------------------------------- 4. decode loop: plans and host cost

def _loop_inputs(sq, steps, seed=3):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cache_k = torch.randn(1, 8, 4096 + steps, 128, device="cuda", dtype=torch.bfloat16,
                          generator=gen)
    cache_v = torch.randn_like(cache_k)
    q = torch.randn(1, 32, sq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    return q, cache_k, cache_v


@gpu
@pytest.mark.parametrize("sq,causal", [(1, False), (4, "bottom_right")],
                         ids=["s1", "s4-bottom-right"])
def test_decode_loop_keeps_one_plan_per_bucket_and_host_cost(tmp_path, sq, causal):
    tiledattention.use_database(str(tmp_path / "fresh-never-created.sqlite"))
    runtime = tiledattention.runtime()
    assert runtime.sizes() == (0, 0)
    steps, first = 300, 3000
    q, cache_k, cache_v = _loop_inputs(sq, steps)
    growing = list(range(first, first + steps))
    assert len({length_bucket(n) for n in growing}) == 1  # the test's own premise

    samples = {first, first + 1, first + steps // 2, first + steps - 1}
    kept = {}
    for n in growing:  # slices of a preallocated cache, like a static KV cache
        out = tiledattention.sdpa(q, cache_k[:, :, :n], cache_v[:, :, :n], causal=causal)
        if n in samples:
            kept[n] = out
    resolutions, plans = runtime.sizes()
    assert resolutions <= 3 and plans <= 3, runtime.sizes()
    for n, out in kept.items():
        ref, problem = expected(q, cache_k[:, :, :n], cache_v[:, :, :n], causal)
        assert_output(out, ref, problem, f"step S_k {n}")

    def per_call(lengths):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for n in lengths:
            tiledattention.sdpa(q, cache_k[:, :, :n], cache_v[:, :, :n], causal=causal)
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        return elapsed / len(lengths)

    fixed = [first] * steps
    per_call(fixed)  # warm
    grow_times, fixed_times = [], []
    for _ in range(7):  # interleaved, medians: the machine is shared and noisy
        grow_times.append(per_call(growing))
        fixed_times.append(per_call(fixed))
    ratio = statistics.median(grow_times) / statistics.median(fixed_times)
    assert ratio <= 1.5, (f"growing loop {statistics.median(grow_times) * 1e6:.1f} us/call vs "
                          f"fixed {statistics.median(fixed_times) * 1e6:.1f} us/call")
    assert runtime.sizes() == (resolutions, plans)  # timing added nothing


@gpu
def test_decode_loop_with_a_new_cat_cache_each_step_reuses_plans(tmp_path):
    """Like Hugging Face's DynamicCache: every step makes new contiguous K/V by torch.cat (new
    strides each step); the plan is kept per bucket all the same."""
    tiledattention.use_database(str(tmp_path / "fresh-never-created.sqlite"))
    runtime = tiledattention.runtime()
    steps, first = 120, 3000
    q, cache_k, cache_v = _loop_inputs(1, steps, seed=4)
    k, v = cache_k[:, :, :first].contiguous(), cache_v[:, :, :first].contiguous()
    kept = {}
    for step in range(steps):
        k = torch.cat([k, cache_k[:, :, first + step:first + step + 1]], dim=2)
        v = torch.cat([v, cache_v[:, :, first + step:first + step + 1]], dim=2)
        out = tiledattention.sdpa(q, k, v)
        if step in (0, steps - 1):
            kept[step] = (out, k, v)
    resolutions, plans = runtime.sizes()
    assert resolutions <= 3 and plans <= 3, runtime.sizes()
    for step, (out, k, v) in kept.items():
        assert k.shape[2] == first + step + 1
        ref, problem = expected(q, k, v)
        assert_output(out, ref, problem, f"cat step {step}")


# ------------------------------------------------------------------------------ 5. dispatch

@gpu
@pytest.mark.parametrize("causal", [False, "bottom_right"], ids=["full", "bottom-right"])
@pytest.mark.parametrize("sq,family", [(1, "decode"), (1024, "forward")])
def test_explain_family_and_explicit_families_agree(sq, family, causal):
    gen = torch.Generator(device="cuda").manual_seed(sq)
    q = torch.randn(1, 32, sq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    found = tiledattention.explain(q, k, v, causal=causal)
    assert found.family == family, found
    assert isinstance(found.schedule, DecodeSchedule if family == "decode"
                      else tiledattention.Schedule)

    ref, problem = expected(q, k, v, causal)
    out = sdpa_checked(q, k, v, causal, problem, ref, "sdpa")
    # what explain names is what ran: the same schedule forced gives the same bits
    forced = tiledattention.sdpa(q, k, v, causal=causal, schedule=found.schedule)
    assert torch.equal(out, forced)

    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    via_decode = sdpa_checked(q, k, v, causal, problem, ref, "decode family",
                              schedule=DECODE.default_schedule(arch, problem))
    via_forward = sdpa_checked(q, k, v, causal, problem, ref, "forward family",
                               schedule=FORWARD.default_schedule(arch, problem))
    assert rel_l2(via_decode, via_forward.float()) <= DECODE.tolerance(problem)


# -------------------------------------------------------------------------------- 6. errors

@pytest.fixture
def launches(monkeypatch):
    """Counts every cuTile kernel launch (``cuda.tile.launch``, which both families call)."""
    import cuda.tile as ct

    count = [0]
    real = ct.launch

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(ct, "launch", counting)
    return count


def _bad_inputs(q, k, v, cache_v):
    """(label, (q, k, v), expected error) for a valid q, k, v of S_k = k.shape[2] and a cache
    to slice a V of another length in the same bucket from."""
    n = k.shape[2]
    assert length_bucket(n + 1) == length_bucket(n)
    return [
        ("v longer", (q, k, cache_v[:, :, :n + 1]), InputValueError),
        ("k longer", (q, cache_v[:, :, :n + 1], v), InputValueError),
        ("v shorter", (q, k, cache_v[:, :, :n - 1]), InputValueError),
        ("cpu k", (q, k.cpu(), v), InputValueError),
        ("cpu q", (q.cpu(), k, v), InputValueError),
        ("fp32 all", (q.float(), k.float(), v.float()), InputTypeError),
        ("fp32 v", (q, k, v.float()), InputTypeError),
        ("v head_dim", (q, k, cache_v[:, :, :n, :64]), InputValueError),
        ("v last dim strided", (q, k, torch.repeat_interleave(v, 2, dim=3)[..., ::2]),
         InputValueError),
    ]


@gpu
@pytest.mark.parametrize("warm", [False, True], ids=["first-call", "warmed-fast-path"])
def test_bad_input_raises_before_any_launch(launches, warm):
    gen = torch.Generator(device="cuda").manual_seed(8)
    cache_k = torch.randn(1, 8, 3100, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    cache_v = torch.randn_like(cache_k)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = cache_k[:, :, :3000], cache_v[:, :, :3000]  # same strides as the bad slices
    if warm:
        for _ in range(2):  # the second call runs the kept plan
            out = tiledattention.sdpa(q, k, v)
        torch.cuda.synchronize()
        assert launches[0] >= 2  # the counter sees the launches
        ref, problem = expected(q, k, v)
        assert_output(out, ref, problem, "warm call")
    before = launches[0]
    for label, args, error in _bad_inputs(q, k, v, cache_v):
        with pytest.raises(error):
            tiledattention.sdpa(*args)
        assert launches[0] == before, f"{label}: launched before raising"
    # still fine afterwards
    out = tiledattention.sdpa(q, k, v)
    ref, problem = expected(q, k, v)
    assert_output(out, ref, problem, "after the errors")


@gpu
def test_forward_fast_path_checks_v_against_k(launches):
    """The forward's kept plan too: a V sliced from a cache with K's strides but another length
    (or head dim) must raise, not launch."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    cache_k = torch.randn(1, 4, 2100, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    cache_v = torch.randn_like(cache_k)
    q = torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = cache_k[:, :, :2000], cache_v[:, :, :2000]
    assert tiledattention.explain(q, k, v).family == "forward"
    for _ in range(2):
        tiledattention.sdpa(q, k, v)
    torch.cuda.synchronize()
    before = launches[0]
    for label, bad_v in (("v longer", cache_v[:, :, :2001]), ("v shorter", cache_v[:, :, :1999]),
                         ("v head_dim", cache_v[:, :, :2000, :64])):
        assert bad_v.stride() == v.stride()
        with pytest.raises(InputValueError):
            tiledattention.sdpa(q, k, bad_v)
        assert launches[0] == before, f"{label}: launched before raising"


@gpu
@pytest.mark.parametrize("sq", [1, 1024], ids=["decode", "forward"])
def test_fast_path_rejects_what_the_first_call_rejects(sq):
    """``causal=1`` and ``scale=True`` are refused on a first call (InputTypeError); a kept plan
    for ``causal=True`` / ``scale=1.0`` (equal hash, equal ==) must not accept them."""
    gen = torch.Generator(device="cuda").manual_seed(10)
    q = torch.randn(1, 8, sq, 64, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(1, 2, 2048, 64, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn_like(k)
    with pytest.raises(InputTypeError):
        tiledattention.sdpa(q, k, v, causal=1)
    with pytest.raises(InputTypeError):
        tiledattention.sdpa(q, k, v, scale=True)
    tiledattention.sdpa(q, k, v, causal=True)
    tiledattention.sdpa(q, k, v, scale=1.0)
    with pytest.raises(InputTypeError):
        tiledattention.sdpa(q, k, v, causal=1)
    with pytest.raises(InputTypeError):
        tiledattention.sdpa(q, k, v, scale=True)
