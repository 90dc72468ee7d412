"""The split-KV decode family's variants on the CPU (issue 32): sliding windows, logit softcap
and attention sinks. Compile-only builds (one combined variant per architecture, each single
variant on sm_90), the kernels' new parameters and constants, the key walk of a window (a 4096
window over a 131072 cache walks ~4096 keys, and its start follows a growing cache through one
kept plan), the walk against a brute-force visibility check, the bucket problem keeping a window,
``normalise``'s split cap and the windowed defaults."""

from __future__ import annotations

import dataclasses
import random

import pytest

from tiledattention import DECODE, Call, DecodeSchedule, Problem
from tiledattention.kernels.decode import bucket_problem, length_bucket
from tiledattention.kernels.decode._defaults import MIN_KEYS_PER_SPLIT, window_keys
from tiledattention.kernels.decode._launch import (COMBINE_PARAMETERS, NO_SINKS, SPLIT_PARAMETERS,
                                                   combine_constants, key_walk, launches,
                                                   max_key_tiles, split_constants)
from tiledattention.kernels.decode._plan import decode_plan

from .test_decode import exports  # noqa: F401  (the fixture: every export_cubin call)

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")


def _problem(*, batch=1, hq=32, hkv=8, sq=1, sk=4096, d=128, causal=False, bottom_right=False,
             left=-1, right=-1, softcap=0.0, sinks=False, dtype="bf16") -> Problem:
    return Problem(batch=batch, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=dtype, causal=causal, bottom_right=bottom_right, window_left=left,
                   window_right=right, softcap=softcap, sinks=sinks)


#: everything at once: 4 speculative rows, bottom-right, causal + left window, softcap, sinks,
#: group 7 (padded heads), head dim 96, a ragged cache
COMBINED = _problem(batch=2, hq=28, hkv=4, sq=4, sk=3001, d=96, causal=True, bottom_right=True,
                    left=700, softcap=30.0, sinks=True)


# -- compile-only builds ------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHES)
def test_the_combined_variant_compiles(arch, exports):
    schedule = DECODE.default_schedule(arch, COMBINED)
    assert schedule.splits > 1  # split kernel with WINDOW + SOFTCAP, combine with SINKS
    result = DECODE.compile(COMBINED, schedule, arch)
    assert result.cubin[:4] == b"\x7fELF" and result.arch == arch
    assert len(exports) == 2 and "(combine)" in exports[1][2]  # (kernel, arch, label, result)


SINGLE = {
    "window-left-causal-br": (_problem(sq=2, sk=9000, causal=True, bottom_right=True, left=1000),
                              None),
    "window-two-sided-tl": (_problem(sq=3, left=100, right=40), None),
    "window-two-sided-br": (_problem(sq=3, bottom_right=True, left=100, right=1), None),
    "softcap": (_problem(softcap=50.0), None),
    "sinks-combined": (_problem(sinks=True), None),
    "sinks-one-split": (_problem(sinks=True), DecodeSchedule(splits=1, tile_n=64)),
}


@pytest.mark.parametrize("name", SINGLE)
def test_each_variant_compiles_on_sm_90(name, exports):
    problem, schedule = SINGLE[name]
    schedule = schedule or DECODE.default_schedule("sm_90", problem)
    result = DECODE.compile(problem, schedule, "sm_90")
    assert result.cubin[:4] == b"\x7fELF"
    assert len(exports) == (1 if DECODE.normalise(problem, schedule).splits == 1 else 2)


# -- parameters and constants -------------------------------------------------------------------
def test_new_runtime_parameters_come_last():
    split_runtime = [n for n in SPLIT_PARAMETERS.names if n in SPLIT_PARAMETERS.runtime]
    assert split_runtime == ["Q", "K", "V", "Out", "Opart", "Lse", "qk_scale", "causal_offset",
                             "kv_div", "window_left", "window_right", "softcap", "Sinks", "Ranges",
                             "Pages", "KDescale", "VDescale", "split_hint", "Order"]
    combine_runtime = [n for n in COMBINE_PARAMETERS.names if n in COMBINE_PARAMETERS.runtime]
    assert combine_runtime == ["Opart", "Lse", "Out", "Sinks"]
    # the constants follow every runtime value (launch appends them as a tail)
    for params in (SPLIT_PARAMETERS, COMBINE_PARAMETERS):
        kinds = [n in params.constants for n in params.names]
        assert kinds == sorted(kinds)
    assert NO_SINKS == 0


@pytest.mark.parametrize("splits", [1, 4])
def test_constants_follow_the_variant(splits):
    schedule = DecodeSchedule(splits=splits)
    plain = _problem()
    assert {k: split_constants(plain, schedule)[k] for k in ("WINDOW", "SOFTCAP", "SINKS")} == \
        {"WINDOW": False, "SOFTCAP": False, "SINKS": False}
    assert combine_constants(plain, schedule)["SINKS"] is False
    c = split_constants(COMBINED, schedule)
    assert (c["WINDOW"], c["SOFTCAP"]) == (True, True)
    # the sink joins the denominator once: in the single split, else in the combine
    assert c["SINKS"] is (splits == 1)
    assert combine_constants(COMBINED, schedule)["SINKS"] is True
    plan = launches(COMBINED, schedule, None)
    assert plan.variant == (700, -1, 30.0, True)


# -- the window's key walk ----------------------------------------------------------------------
LONG = _problem(sk=131072, causal=True, bottom_right=True, left=4096)


def _walked_keys(plan, sq, sk, offset) -> list[tuple[int, int]]:
    """Per query tile, the keys [first, last) its splits walk together (tile-aligned)."""
    spans = []
    for walk in key_walk(plan, sq, sk, offset):
        busy = [(a, b) for a, b in walk if b > a]
        # the splits cut one contiguous range into consecutive pieces
        assert all(busy[i][1] == busy[i + 1][0] for i in range(len(busy) - 1))
        spans.append((busy[0][0] * plan.tile_n, busy[-1][1] * plan.tile_n) if busy else (0, 0))
    return spans


def test_a_4096_window_over_a_131072_cache_walks_only_the_window():
    schedule = DECODE.default_schedule("sm_90", LONG)
    assert LONG.key_span(0, 0) == (131072 - 4097, 131072)
    assert window_keys(LONG) == 4097
    # the splits come from the window's 4097 keys (16 of >= 256 keys), not from 131072
    assert schedule.splits == min(4097 // MIN_KEYS_PER_SPLIT, 132 // 8)
    plan = launches(LONG, schedule, None)
    [(first, last)] = _walked_keys(plan, 1, 131072, 131071)
    assert first <= 131072 - 4097 < first + plan.tile_n and last == 131072
    assert last - first <= 4097 + plan.tile_n  # ~4096 keys read, not 131072
    # the longest split walks as few tiles as any split of the window's tiles can
    busy = [b - a for a, b in key_walk(plan, 1, 131072, 131071)[0]]
    assert max(busy) == -(-sum(busy) // schedule.splits) <= 3
    # without the window the same schedule walks the whole cache
    plain = launches(_problem(sk=131072), schedule, None)
    assert _walked_keys(plain, 1, 131072, 0) == [(0, 131072)]


def test_one_plan_follows_a_growing_cache():
    """A plan kept for the bucket of its first length: at every later length of the bucket its
    walk starts at the new length minus the window (the causal offset is a launch-time value)."""
    first = 100_000
    problem = _problem(sk=first, causal=True, bottom_right=True, left=4096)
    plan = decode_plan(Call.of(problem, causal="bottom_right"),
                       DECODE.default_schedule("sm_90", problem), 0)
    assert plan.bottom_right
    bucket = length_bucket(first)
    for length in (first, first + 1, first + 777, first + 20_000):
        assert length_bucket(length) == bucket  # the plan the warm path would reuse
        offset = length - 1  # what DecodePlan.run passes: S_k - S_q
        [(lo, hi)] = _walked_keys(plan.launches, 1, length, offset)
        want_lo = length - 4097
        assert lo <= want_lo < lo + plan.launches.tile_n and hi >= length
        assert hi - length < plan.launches.tile_n


def test_a_call_window_the_problem_dropped_stays_in_the_plan():
    """At 3000 keys a 4096 window binds nothing, so the problem drops it; a plan given the
    call's window keeps it for the longer caches of the bucket (5000 keys: 4097 walked)."""
    problem = _problem(sk=3000, causal=True, bottom_right=True, left=4096)
    assert not problem.windowed
    schedule = DECODE.default_schedule("sm_90", problem)
    plan = decode_plan(Call.of(problem, causal="bottom_right", window=(4096, -1)), schedule, 0)
    assert plan.launches.variant.windowed
    assert length_bucket(5000) == length_bucket(3000)
    [(lo, hi)] = _walked_keys(plan.launches, 1, 5000, 4999)
    assert lo <= 5000 - 4097 < lo + plan.launches.tile_n
    # the problem's own plan has no window: it must not serve that call (the caller passes
    # the call's window, or keys plans so)
    own = decode_plan(Call.of(problem, causal="bottom_right"), schedule, 0)
    assert not own.launches.variant.windowed


def _visible(problem: Problem, row: int, key: int) -> bool:
    """The spec's visibility rule, written out."""
    off = problem.causal_offset
    return (key < problem.seqlen_k and (not problem.causal or key <= row + off)
            and (problem.window_left < 0 or key >= row + off - problem.window_left)
            and (problem.window_right < 0 or key <= row + off + problem.window_right))


def _random_problems(count: int):
    rng = random.Random(32)
    for _ in range(count):
        sq = rng.choice([1, 2, 3, 4, 5, 8, 13, 16, 17])
        sk = rng.choice([1, 5, 17, 63, 64, 65, 200, 257, 777])
        causal = rng.random() < 0.5
        left = rng.choice([-1, 0, 1, 7, 64, 100, 300])
        right = rng.choice([-1, 0, 1, 3, 50])
        br = rng.random() < 0.6
        try:
            p = _problem(hq=8, hkv=rng.choice([1, 2, 8]), sq=sq, sk=sk, causal=causal,
                         bottom_right=br, left=left, right=right)
        except ValueError:  # bottom_right without a mask
            continue
        schedule = DecodeSchedule(splits=rng.choice([1, 2, 3, 5, 16]),
                                  tile_n=rng.choice([16, 32, 64]),
                                  tile_m=rng.choice([16, 32, 64]))
        yield p, schedule


@pytest.mark.parametrize("case", range(6))
def test_the_walk_covers_exactly_the_visible_tiles(case):
    """Against brute force over 60 random problems per case: each query tile's splits walk
    every key tile that holds a key one of its rows sees, and no tile that holds none (the
    walk's span is the union of its rows' ranges, and ``problem.key_span`` over the call's rows
    holds every tile's)."""
    problems = list(_random_problems(360))[case * 60:(case + 1) * 60]
    for problem, schedule in problems:
        plan = launches(problem, schedule, None)
        t_n, t_s = plan.tile_n, plan.tiles.tile_s
        span_lo, span_hi = problem.key_span(0, problem.seqlen_q - 1)
        for q_tile, walk in enumerate(key_walk(plan, problem.seqlen_q, problem.seqlen_k,
                                               problem.causal_offset)):
            walked = set()
            for a, b in walk:
                walked.update(range(a, b))
            rows = range(q_tile * t_s, min((q_tile + 1) * t_s, problem.seqlen_q))
            needed = {key // t_n for row in rows for key in range(problem.seqlen_k)
                      if _visible(problem, row, key)}
            label = f"{problem.describe()} {schedule.describe()} q_tile {q_tile}"
            assert walked == needed, label
            assert all(span_lo // t_n <= t < -(-span_hi // t_n) for t in walked), label


# -- plans over a band of cache lengths ---------------------------------------------------------
def test_the_bucket_problem_keeps_a_window_that_binds():
    # 5000 keys, window 4096: binds; at the bucket's 4096 keys it would not (dropped)
    problem = _problem(sk=5000, causal=True, bottom_right=True, left=4096)
    assert problem.windowed
    assert bucket_problem(problem) is problem
    # a window that binds at the bucket's length too: the bucketed problem, window kept
    small = _problem(sk=5000, causal=True, bottom_right=True, left=128, softcap=10.0,
                     sinks=True)
    bucketed = bucket_problem(small)
    assert bucketed.seqlen_k == 4096 and (bucketed.window_left, bucketed.softcap,
                                          bucketed.sinks) == (128, 10.0, True)
    # plain problems as before
    assert bucket_problem(_problem(sk=5000)).seqlen_k == 4096


# -- normalise and the defaults -----------------------------------------------------------------
def test_normalise_caps_splits_at_the_tiles_a_window_can_touch():
    problem = _problem(causal=True, bottom_right=True, left=127)  # 128 keys per row
    schedule = DecodeSchedule(splits=16, tile_n=64)
    assert max_key_tiles(problem, schedule) == 3  # 128 keys at any alignment: 2 or 3 tiles
    normal = DECODE.normalise(problem, schedule)
    assert normal.splits == 3 and DECODE.normalise(problem, normal) == normal
    # one split left: the combine setting no longer matters either
    one = DECODE.normalise(_problem(causal=True, bottom_right=True, left=0),
                           DecodeSchedule(splits=8, combine="pdl", tile_n=64))
    assert (one.splits, one.combine) == (1, "kernel")
    # bottom-right, the cache's end bounds the right side: S_q + left keys at most
    assert max_key_tiles(_problem(left=127, bottom_right=True), schedule) == 3
    # top-left with the right side unbounded: the walk grows with the cache, no cap
    assert max_key_tiles(_problem(sq=4, left=127), schedule) is None
    assert DECODE.normalise(_problem(), schedule).splits == 16


def test_normalise_keeps_the_launches_of_a_capped_schedule():
    """The capped schedule walks the same key tiles: more splits than tiles only add empty
    CTAs."""
    for problem, schedule in _random_problems(200):
        normal = DECODE.normalise(problem, schedule)
        if normal.splits == schedule.splits:
            continue
        # the schedule's own split count (launches would normalise it away)
        wide = launches(problem, schedule, None)._replace(splits=schedule.splits)
        narrow = launches(problem, normal, None)
        for sk in (problem.seqlen_k, problem.seqlen_k + 37, 5 * problem.seqlen_k):
            offset = sk - problem.seqlen_q if problem.bottom_right else 0
            assert [sorted(w for w in walk if w[1] > w[0])
                    for walk in key_walk(wide, problem.seqlen_q, sk, offset)] == \
                [sorted(w for w in walk if w[1] > w[0])
                 for walk in key_walk(narrow, problem.seqlen_q, sk, offset)]


@pytest.mark.parametrize("batch, left, tile_n, splits, occupancy", [
    (1, 4096, 128, 16, 1), (1, 1023, 128, 4, 1), (1, 511, 128, 1, 1), (1, 127, 128, 1, 1),
    (1, 31, 32, 1, 1), (1, 32, 64, 1, 1), (8, 4096, 128, 2, 1), (2, 4096, 128, 8, 1),
    (4, 4096, 128, 4, 1), (10, 4096, 128, 3, 2), (20, 2047, 128, 1, 2), (10, 511, 128, 1, 1)])
def test_windowed_defaults(batch, left, tile_n, splits, occupancy, monkeypatch):
    """A window over a contiguous cache splits as a cache of the window's keys would (B 1, 2,
    4 and 8 over 8 K/V heads: 8, 16, 32 and 64 CTAs a split, 132 // CTAs splits; 80 rows: three
    at two CTAs an SM; 160 rows: one at two an SM), but not a window of 512 keys or fewer; key
    steps no longer than the power of two holding the window's keys (at least 32). (On an
    H200, 1.02-1.53x the one CTA an SM and one split windows took before on six calls.) The
    fill rules' four-CTA form, measured on caches without a window, is not for windows."""
    from tiledattention.kernels.decode import _defaults

    problem = _problem(batch=batch, sk=65536, causal=True, bottom_right=True, left=left)
    schedule = DECODE.default_schedule("sm_90", problem)
    assert (schedule.tile_n, schedule.splits, schedule.occupancy) == (tile_n, splits, occupancy)
    assert DECODE.normalise(problem, schedule).splits == splits
    flat = _problem(batch=batch, sk=left + 1)  # the same rows over a cache of the window's keys
    monkeypatch.setattr(_defaults, "FILL_FOURTH_CTA_MIN_KEYS", 1 << 30)
    same = DECODE.default_schedule("sm_90", flat)
    if left + 1 > 512:
        assert (same.splits, same.occupancy) == (splits, occupancy)


def test_a_capped_wide_window_splits_two_fold_at_one_cta_an_sm():
    """A softcap above D 128 (Gemma 2's local layers: D 256, softcap 50, a 4096 window) keeps
    one CTA an SM (its split kernel keeps stack on sm_90, more at two) and no fill split, but a
    window over a contiguous cache splits as a cache of its keys would, where that doubles its
    CTAs too (H200: 1.52-2.29x one split at 36-64 rows on nine calls), not where one split fills
    the SMs (96 rows: two splits 0.88x); a paged one keeps ``WINDOW_SPLIT_MIN_GAIN``'s
    four-fold bound (not measured)."""
    gemma = _problem(batch=8, hq=16, hkv=8, d=256, sk=8192, causal=True, bottom_right=True,
                     left=4095, softcap=50.0)
    schedule = DECODE.default_schedule("sm_90", gemma)  # 64 rows
    assert (schedule.splits, schedule.occupancy) == (2, 1)
    five = DECODE.default_schedule("sm_90", dataclasses.replace(gemma, batch=5))  # 40 rows
    assert (five.splits, five.occupancy) == (3, 1)
    full = DECODE.default_schedule("sm_90", dataclasses.replace(gemma, batch=12))  # 96 rows
    assert (full.splits, full.occupancy) == (1, 1)
    paged = dataclasses.replace(gemma, seqlen_k=131072, ragged=True, page_size=256)
    assert DECODE.default_schedule("sm_90", paged).splits == 1
    unwindowed = _problem(batch=10, hq=16, hkv=8, d=256, sk=8192, softcap=50.0)  # 80 rows
    schedule = DECODE.default_schedule("sm_90", unwindowed)
    assert (schedule.splits, schedule.occupancy) == (1, 1)
    plain = DECODE.default_schedule("sm_90", _problem(batch=10, hq=16, hkv=8, d=256, sk=8192))
    assert (plain.splits, plain.occupancy) == (3, 2)


def test_a_paged_window_keeps_one_cta_an_sm_and_four_fold_splits():
    """A window over a paged cache (not measured at two CTAs an SM) keeps one CTA an SM and
    splits only where that multiplies its CTAs four-fold."""
    paged = dataclasses.replace(_problem(batch=8, sk=131072, causal=True, bottom_right=True,
                                         left=4096), ragged=True, page_size=256)
    schedule = DECODE.default_schedule("sm_90", paged)
    assert (schedule.splits, schedule.occupancy) == (1, 1)
    wide = dataclasses.replace(paged, batch=20)  # 160 rows: a contiguous window takes two an SM
    assert DECODE.default_schedule("sm_90", wide).occupancy == 1
