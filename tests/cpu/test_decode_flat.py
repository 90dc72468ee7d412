"""The flat paged decode on the CPU (``DecodeSchedule.flat``): where it applies and is the
default, what normalising a flat schedule keeps, its walk (even shares, every key tile once,
a slot per cut row and CTA) and its compiles for every architecture."""

from __future__ import annotations

import random

import pytest

from tiledattention import DECODE, DecodeSchedule, Problem
from tiledattention.kernels.decode import flat_applies
from tiledattention.kernels.decode._defaults import (FLAT_MAX_KEYS, FLAT_MIN_ROWS,
                                                     FLAT_ONE_LOOP_LATENCY, SMALL_PAGE_LATENCY)
from tiledattention.kernels.decode._flat import flat_scratch_shapes, flat_walk, one_loop
from tiledattention.kernels.decode._launch import launches, normalise

ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")


def _paged(**fields) -> Problem:
    base = dict(batch=24, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=6000, head_dim=128,
                dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=16)
    return Problem(**{**base, **fields})


def test_the_default_walks_flat_over_small_pages_of_several_short_caches_on_hopper():
    assert DECODE.default_schedule("sm_90", _paged()).flat
    assert DECODE.default_schedule("sm_90", _paged(seqlen_k=FLAT_MAX_KEYS)).flat
    for other in (_paged(seqlen_k=FLAT_MAX_KEYS + 1), _paged(page_size=64), _paged(batch=1),
                  _paged(window_left=1000), _paged(kv_dtype="e4m3")):
        assert not DECODE.default_schedule("sm_90", other).flat, other.describe()
    for arch in ("sm_80", "sm_100", "sm_120"):  # measured on Hopper only
        assert not DECODE.default_schedule(arch, _paged()).flat


def test_a_batch_of_few_rows_keeps_the_split_rule():
    """Rows are entries x K/V heads here (one query row a step): below FLAT_MIN_ROWS the split
    rule."""
    assert DECODE.default_schedule("sm_90", _paged(batch=FLAT_MIN_ROWS // 8)).flat
    assert not DECODE.default_schedule("sm_90", _paged(batch=FLAT_MIN_ROWS // 8 - 1)).flat
    assert not DECODE.default_schedule("sm_90", _paged(heads_q=8, heads_kv=1, batch=10)).flat
    assert DECODE.default_schedule("sm_90", _paged(head_dim=96)).flat


def test_a_short_bf16_head_walks_in_one_loop_with_loads_two_ahead():
    """At D <= 64 a bf16 cache's split kernel walks its key tiles in one loop (ONE_LOOP, the
    last split constant) and loads two steps ahead; fp16 and longer heads keep two loops and
    four."""
    def walk(**fields):
        problem = _paged(**fields)
        schedule = DECODE.default_schedule("sm_90", problem)
        plan = launches(problem, schedule, None, sms=132)
        assert schedule.flat and plan.flat is not None, problem.describe()
        return plan.flat.split_constants[-1], (schedule.k_latency, schedule.v_latency)

    for d in (32, 64):
        assert walk(head_dim=d) == (True, (FLAT_ONE_LOOP_LATENCY, FLAT_ONE_LOOP_LATENCY)), d
    assert walk(head_dim=64, dtype="fp16") == (False, (SMALL_PAGE_LATENCY, SMALL_PAGE_LATENCY))
    assert walk(head_dim=128) == (False, (SMALL_PAGE_LATENCY, SMALL_PAGE_LATENCY))
    assert one_loop("bf16", 64) and not one_loop("bf16", 128) and not one_loop("fp16", 64)


def test_the_sm_90_one_loop_walk_keeps_no_stack():
    """Why ONE_LOOP: tileiras 13.4 gives the bf16 D 64 split kernel with two loops 96-344
    bytes of stack (local-memory spills) on sm_90; with one loop, loads two ahead, none."""
    problem = _paged(batch=16, head_dim=64, seqlen_k=4000)
    schedule = DECODE.default_schedule("sm_90", problem)
    split, _ = DECODE.compile(problem, schedule, "sm_90").resources()
    assert split.stack_bytes == 0, split


def test_the_offsets_tile_is_at_least_32_wide():
    """A tile of 16 or fewer left the sm_90 split kernel with stack (and spills) at D 128."""
    for batch, want in ((2, 32), (15, 32), (16, 32), (31, 32), (32, 64), (300, 512)):
        plan = launches(_paged(batch=batch), DecodeSchedule(flat=True, tile_n=64, occupancy=2),
                        None, sms=132)
        assert plan.flat.b_pad == want and want in plan.flat.split_constants, batch


def test_normalise_keeps_flat_only_where_it_applies_and_drops_the_splits_then():
    flat = DecodeSchedule(flat=True, splits=12, combine="block_pdl", balanced=True)
    kept = normalise(_paged(), flat)
    assert kept.flat and kept.splits == 1 and not kept.balanced
    assert kept.combine == DecodeSchedule().combine and normalise(_paged(), kept) == kept
    for problem in (_paged(softcap=30.0), _paged(kv_dtype="e4m3"), _paged(window_left=64),
                    _paged(page_size=0)):
        assert not flat_applies(problem)
        assert not normalise(problem, flat).flat, problem.describe()
    assert "flat" in kept.describe() and "split" not in kept.describe()


def test_a_flat_plan_needs_scratch_and_a_call_with_a_window_runs_one_split_without_a_merge():
    schedule = DecodeSchedule(flat=True, tile_n=64, occupancy=2)
    plan = launches(_paged(), schedule, None, sms=132)
    assert plan.flat is not None and plan.flat.ctas == 264 and plan.scratch
    windowed = launches(_paged(), schedule, None, window=(100, 0))
    assert windowed.flat is None and windowed.combine is None and not windowed.scratch


def test_a_flat_schedule_round_trips_and_an_unflat_one_keeps_its_old_dict():
    flat = DecodeSchedule(flat=True, tile_n=64, occupancy=2)
    assert DecodeSchedule.from_dict(flat.to_dict()) == flat
    assert "flat" not in DecodeSchedule(tile_n=64).to_dict()


@pytest.mark.parametrize("seed", range(40))
def test_the_walk_shares_items_evenly_and_covers_every_key_tile_once(seed):
    """Random batches (lengths of 0 keys up, cut at the block table's keys; 1-64 CTAs): every
    CTA takes at most ``ceil(total / CTAs)`` items, each row's key tiles are walked exactly
    once in order, a row one CTA walks whole is written by it, and a cut row's segments land
    in distinct slots below ``rows + CTAs`` that the merge reads, in order, and no other."""
    rng = random.Random(seed)
    batch = rng.randint(1, 30)
    lengths = [rng.choice((0, 1, 16, 17, 63, 64, 65, rng.randint(0, 9000))) for _ in range(batch)]
    problem = _paged(batch=batch, heads_q=rng.choice((8, 32)), heads_kv=rng.choice((1, 2, 8)),
                     seqlen_q=rng.choice((1, 1, 3)), seqlen_k=9000)
    schedule = DecodeSchedule(flat=True, tile_n=rng.choice((32, 64)), occupancy=2)
    flat = launches(problem, schedule, None, sms=rng.randint(1, 32)).flat
    cap = 8000
    walks, merged = flat_walk(flat, lengths, keys_cap=cap)
    tiles = [-(-min(n, cap) // flat.tile_n) for n in lengths]
    per = -(-sum(tiles) * flat.rows_per_entry // flat.ctas)
    seen = {}
    for cta, segments in enumerate(walks):
        assert sum(stop - start for _, start, stop, _ in segments) <= per
        for row, start, stop, whole in segments:
            seen.setdefault(row, []).append((start, stop, whole, row + cta))
    slots = set()
    for row in range(flat.rows):
        need = tiles[row // flat.rows_per_entry]
        parts = [p for p in seen.get(row, []) if p[1] > p[0]]  # (an empty row: none)
        bounds = [0] + [stop for _, stop, _, _ in parts]
        assert [p[:2] for p in parts] == list(zip(bounds, bounds[1:])) and bounds[-1] == need
        if len(parts) == 1:
            assert parts[0][2] and merged[row] == []  # written whole
        elif parts:
            assert not any(p[2] for p in parts)
            assert merged[row] == [p[3] for p in parts]
            assert not slots & set(merged[row])
            slots |= set(merged[row])
    assert all(slot < flat.rows + flat.ctas for slot in slots)
    opart, tail = flat_scratch_shapes(flat)
    assert opart[0] == flat.rows + flat.ctas and tail == (opart[0] * flat.tile_m + batch + 1,)


def _warm_flat_calls(monkeypatch, calls: int, capturing: bool = False) -> list:
    """The arrays of ``calls`` warm calls of a kept flat plan (B5 H8/2 over pages of 16, the
    launches recorded, not run; CPU tensors): per call, each launch's arguments."""
    import torch

    from tiledattention.core import _aot
    from tiledattention.core import _plans as hot
    from tiledattention.core._runtime import Runtime
    from tiledattention.kernels.decode._launch import partial_shapes
    from tiledattention.kernels.decode._plan import DecodePlan

    hot.bind_torch()
    monkeypatch.setattr(hot, "raw_stream", lambda device: 0)
    monkeypatch.setattr(hot, "current_device", lambda: 0)
    monkeypatch.setattr(hot, "capturing", lambda: capturing)
    launched = []
    monkeypatch.setattr(_aot, "launch", lambda stream, grid, kernel, args, **kw:
                        launched.append(args))
    problem = _paged(batch=5, heads_q=8, heads_kv=2, seqlen_k=700, head_dim=64)
    plan = launches(problem, DecodeSchedule(flat=True, tile_n=64, occupancy=2), None, sms=4)
    decode = DecodePlan(out_shape=(5, 8, 1, 64), launches=plan,
                        partial_shapes=partial_shapes(plan), bottom_right=True, tile_d=64)
    q = torch.randn(5, 8, 1, 64).to(torch.bfloat16)
    pool = torch.randn(5 * 44, 16, 2, 64).to(torch.bfloat16)
    table = torch.arange(5 * 44, dtype=torch.int32).reshape(5, 44)
    lens = torch.tensor([700, 1, 64, 300, 17], dtype=torch.int32)
    runtime = Runtime(resolve=None)  # the plan is given: nothing to look up
    per_call = []
    for _ in range(calls):
        launched.clear()
        assert decode.run(runtime, q, pool, pool, 0, None, ranges=lens, pages=table) is not None
        per_call.append(list(launched))
    return plan.flat, per_call


def test_a_kept_flat_scratch_is_cut_once_into_the_arrays_both_kernels_take(monkeypatch):
    """The flat kernels' log-sum-exps ``[slots, TILE_M]`` and int32 offsets ``[B + 1]`` are the
    tail buffer's bytes, in order; a warm call passes the very arrays the first call cut (no
    view ops a call), and the merge reads the split kernel's."""
    import torch

    flat, (first, second) = _warm_flat_calls(monkeypatch, 2)
    slots = flat.rows + flat.ctas
    (split, merge), (split_again, merge_again) = first, second
    opart, lse, cu = split[4:7]  # the split kernel's (q, out, k, v, Opart, Lse, Cu, ...)
    assert opart.shape == (slots, flat.tile_m, flat.tile_d) and opart.dtype == torch.float32
    assert lse.shape == (slots, flat.tile_m) and lse.dtype == torch.float32
    assert cu.shape == (6,) and cu.dtype == torch.int32
    assert cu.data_ptr() == lse.data_ptr() + lse.numel() * 4  # the offsets right after
    assert cu.untyped_storage().data_ptr() == lse.untyped_storage().data_ptr()
    assert merge[0] is opart and merge[1] is lse and merge[3] is cu  # (Opart, Lse, out, Cu, ..)
    assert all(a is b for a, b in zip(split[4:7], split_again[4:7]))
    assert merge_again[0] is opart and merge_again[1] is lse and merge_again[3] is cu


def test_a_captured_flat_call_cuts_scratch_of_its_own(monkeypatch):
    """A call being captured into a CUDA graph gets buffers of its own each call (the graph's
    pool), cut as a kept set is."""
    flat, (first, second) = _warm_flat_calls(monkeypatch, 2, capturing=True)
    assert first[0][4] is not second[0][4] and first[0][5] is not second[0][5]
    assert first[0][5].shape == (flat.rows + flat.ctas, flat.tile_m)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head_dim", [96, 64])  # two loops; one (bf16 at D <= 64)
def test_a_flat_schedule_compiles_its_two_kernels(arch, head_dim):
    problem = _paged(batch=9, heads_q=28, heads_kv=4, head_dim=head_dim)
    result = DECODE.compile(problem, DecodeSchedule(flat=True, tile_n=64, occupancy=2), arch)
    assert result.cubin_size > 0 and len(result.other_cubins) == 1
