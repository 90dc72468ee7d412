"""The backward family's variants (sliding windows, softcap, sinks) on the CPU: the windowed walks
of both kernels against a brute-force mask, split counts and work orders under a window,
constants and launch-time values placed by name, defaults for windowed problems, and
compile-only builds for several architectures (plain problems keep their kernels and code).

Alignment: ``bottom_right`` shifts the causal mask and the window alike (row ``i``'s diagonal is
key ``i + S_k - S_q``); without it the diagonal of row ``i`` is key ``i``.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from tiledattention import BACKWARD, BackwardSchedule, Problem
from tiledattention.kernels.backward._defaults import WINDOW_TILE_FLOOR, heaviest_last
from tiledattention.kernels.backward._kernel import _window
from tiledattention.kernels.backward._launch import (DKDV_PARAMETERS, DQ_PARAMETERS, UNUSED,
                                                     VARIANT_VALUES, dkdv_constants, dkdv_walk,
                                                     dq_constants, dq_walk, has_variants, launches,
                                                     normalise, reach, unequal_walks)
from tiledattention.kernel_core.bounds import dkdv_window_query_tiles, dq_window_key_tiles
from tiledattention.tooling import text_digest

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")


def _problem(sq=333, sk=1000, causal=False, bottom_right=False, left=-1, right=-1, softcap=0.0,
             sinks=False, hq=8, hkv=2, d=96, dtype="bf16", batch=2) -> Problem:
    return Problem(batch=batch, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=dtype, causal=causal, bottom_right=bottom_right, window_left=left,
                   window_right=right, softcap=softcap, sinks=sinks)


#: every variant together: a left window over the bottom-right causal mask, softcap and sinks
COMBINED = _problem(causal=True, bottom_right=True, left=100, softcap=30.0, sinks=True)
SINGLE = {
    "left-window": _problem(left=100),
    "right-window": _problem(right=60),
    "two-sided-window": _problem(left=70, right=30),
    "causal-window-bottom-right": _problem(causal=True, bottom_right=True, left=100),
    "softcap": _problem(softcap=20.0),
    "sinks": _problem(sinks=True),
}


def _sees(p: Problem, i: int, j: int) -> bool:
    """The spec's rule, written out: query row ``i`` sees key ``j``."""
    off = p.causal_offset
    return (0 <= j < p.seqlen_k and (not p.causal or j <= i + off)
            and (p.window_left < 0 or j >= i + off - p.window_left)
            and (p.window_right < 0 or j <= i + off + p.window_right))


def _random_problems(count: int, seed: int) -> list[Problem]:
    """Small problems over both alignments, S_q <, = and > S_k, every window shape."""
    rng = random.Random(seed)
    problems = []
    while len(problems) < count:
        sq, sk = rng.choice((1, 5, 17, 64, 100, 130, 257)), rng.choice((1, 7, 33, 64, 120, 300))
        causal = rng.random() < 0.5
        left = rng.choice((-1, 0, 1, 5, 31, 64, 100))
        right = -1 if causal else rng.choice((-1, 0, 2, 17, 64))
        bottom_right = rng.random() < 0.5 and (causal or left >= 0 or right >= 0)
        p = _problem(sq=sq, sk=sk, causal=causal, bottom_right=bottom_right, left=left,
                     right=right, hq=1, hkv=1, d=64, batch=1)
        if p.windowed:  # canonical form may have dropped a window that binds nothing
            problems.append(p)
    return problems


PROBLEMS = _random_problems(60, 32)
TILES = ((16, 16), (16, 64), (64, 16), (32, 32), (64, 128))


# -- the windowed walks, against brute force -----------------------------------------------------
@pytest.mark.parametrize("tile_m, tile_n", TILES)
def test_dq_walk_visits_exactly_the_key_tiles_its_rows_see(tile_m, tile_n):
    """Key tiles outside [lo, hi) hold no key the query tile's rows see, the first and last
    visited hold one, and tiles of [full_from, full_to) are seen whole by every row."""
    for p in PROBLEMS:
        left, right = _window(p.window_left, p.window_right, p.seqlen_q + p.seqlen_k,
                              p.causal)
        assert (left, right) == reach(p)
        longest = 0
        for t in range(-(-p.seqlen_q // tile_m)):
            first_row, last_row = t * tile_m, min(t * tile_m + tile_m, p.seqlen_q) - 1
            lo, full_from, full_to, hi = dq_window_key_tiles(
                first_row, last_row, p.causal_offset, left, right, p.seqlen_k, tile_n)
            assert lo <= full_from <= full_to <= hi
            rows = range(first_row, last_row + 1)
            tiles = -(-p.seqlen_k // tile_n)
            seen = [any(_sees(p, i, j) for i in rows for j in range(c * tile_n, c * tile_n
                                                                   + tile_n))
                    for c in range(tiles)]
            assert not any(seen[:lo]) and not any(seen[hi:]), (p.describe(), t)
            if lo < hi:
                assert seen[lo] and seen[hi - 1], (p.describe(), t)
            for c in range(full_from, full_to):
                assert all(_sees(p, i, j) for i in rows for j in range(c * tile_n,
                                                                      c * tile_n + tile_n))
            span = p.key_span(first_row, last_row)
            if span[0] < span[1]:
                assert lo * tile_n <= span[0] and span[1] <= hi * tile_n
            longest = max(longest, hi - lo)
        assert longest <= dq_walk(p, tile_m, tile_n)


@pytest.mark.parametrize("tile_m, tile_n", TILES)
def test_dkdv_walk_visits_exactly_the_query_tiles_that_see_its_keys(tile_m, tile_n):
    """Query tiles outside [first, end) hold no row that sees the key tile, the first and last
    visited hold one, and every row of [full_from, full_to) sees every key of the tile;
    ``dkdv_walk`` bounds every key tile's walk (and is reached)."""
    for p in PROBLEMS:
        left, right = reach(p)
        longest = 0
        for c in range(-(-p.seqlen_k // tile_n)):
            first_key, last_key = c * tile_n, min(c * tile_n + tile_n, p.seqlen_k) - 1
            first, full_from, full_to, end = dkdv_window_query_tiles(
                first_key, last_key, p.causal_offset, left, right, p.seqlen_q, tile_m)
            assert first <= full_from <= full_to <= end <= -(-p.seqlen_q // tile_m)
            keys = range(first_key, last_key + 1)
            tiles = -(-p.seqlen_q // tile_m)
            seen = [any(_sees(p, i, j) for i in range(t * tile_m, min(t * tile_m + tile_m,
                                                                    p.seqlen_q)) for j in keys)
                    for t in range(tiles)]
            assert not any(seen[:first]) and not any(seen[end:]), (p.describe(), c)
            if first < end:
                assert seen[first] and seen[end - 1], (p.describe(), c)
            for t in range(full_from, full_to):  # rows past S_q load as zeros: any mask does
                assert all(_sees(p, i, j) for i in range(t * tile_m, min(t * tile_m + tile_m,
                                                                         p.seqlen_q))
                           for j in keys)
            longest = max(longest, end - first)
        assert longest <= dkdv_walk(p, tile_n, tile_m)


def test_walk_bounds_are_tight_inside_a_long_sequence():
    """With a band of bounded width (both sides bounded, or a left window over the causal
    mask) the bound is the longest walk, met inside a long sequence: no split count is capped
    lower than the walk allows."""
    for left, right, causal, (tile_m, tile_n) in itertools.product(
            (0, 3, 64, 200), (-1, 0, 50), (False, True), TILES):
        if (right >= 0) == causal:  # causal binds the right side; else the window must
            continue
        p = _problem(sq=2000, sk=2100, causal=causal, bottom_right=True, left=left, right=right,
                     hq=1, hkv=1, d=64, batch=1)
        if not p.windowed:
            continue
        l, r = reach(p)
        walks = [dkdv_window_query_tiles(c * tile_n, c * tile_n + tile_n - 1, p.causal_offset,
                                         l, r, p.seqlen_q, tile_m)
                 for c in range(2100 // tile_n)]
        assert max(e - f for f, _, _, e in walks) == dkdv_walk(p, tile_n, tile_m)
        walks = [dq_window_key_tiles(t * tile_m, t * tile_m + tile_m - 1, p.causal_offset, l,
                                     r, p.seqlen_k, tile_n) for t in range(2000 // tile_m)]
        assert max(h - lo for lo, _, _, h in walks) == dq_walk(p, tile_m, tile_n)


def test_walks_without_a_window_are_the_whole_sequence():
    plain = _problem(causal=True, bottom_right=True)
    assert dkdv_walk(plain, 64, 64) == -(-333 // 64)
    assert dq_walk(plain, 64, 64) == -(-1000 // 64)
    assert reach(plain) == (333 + 1000, 0)


# -- normalise, constants, launches -------------------------------------------------------------
def test_splits_are_capped_by_the_windowed_walk():
    """A key tile of 64 keys under a two-sided window of 65 rows is seen by at most 3 query
    tiles of 64: with 4 query heads per K/V head, 12 pairs, so at most 8 splits."""
    p = _problem(sq=4096, sk=4096, left=32, right=32, hq=8, hkv=2)
    s = BackwardSchedule(dkdv_tile_n=64, dkdv_tile_m=64, dkdv_splits=16)
    assert dkdv_walk(p, 64, 64) == 3
    assert normalise(p, s).dkdv_splits == 8
    unwindowed = dataclasses.replace(p, window_left=-1, window_right=-1)
    assert normalise(unwindowed, s).dkdv_splits == 16
    mqa_narrow = _problem(sq=4096, sk=4096, causal=True, left=0, hq=1, hkv=1)
    assert normalise(mqa_narrow, s).dkdv_splits == 1  # one query tile sees each key tile
    assert normalise(p, normalise(p, s)) == normalise(p, s)


@pytest.mark.parametrize("kwargs, orders", [
    (dict(causal=True, left=100), True),  # the causal ramp stays
    (dict(left=100), True),  # later rows see fewer keys
    (dict(right=60), True),  # later rows see more keys
    (dict(left=70, right=30), False),  # a band: every interior walk alike
    (dict(), False),
])
def test_work_orders_only_where_the_walks_differ(kwargs, orders):
    p = _problem(**kwargs)
    assert unequal_walks(p) == orders
    s = normalise(p, BackwardSchedule(dq_heavy_first=True, tile_major=True))
    assert s.dq_heavy_first == orders and s.tile_major == orders


def test_variant_problems_pass_their_values_last():
    s = BackwardSchedule(dkdv_splits=2)
    plan = launches(COMBINED, s, 0.125)
    assert has_variants(COMBINED)
    assert DQ_PARAMETERS.names[11:14] == VARIANT_VALUES
    assert DKDV_PARAMETERS.names[11:14] == VARIANT_VALUES
    assert plan.dq_scalars == (0.125, 8, 4, 100, -1, 30.0,
                               *DQ_PARAMETERS.constant_values(dq_constants(COMBINED, s)))
    assert plan.dkdv_scalars[:6] == (0.125, 2, 4, 100, -1, 30.0)
    for constants in (dq_constants(COMBINED, s), dkdv_constants(COMBINED, s)):
        assert constants["WINDOW"] and constants["SOFTCAP"] and constants["CAUSAL"]
    cap_only = SINGLE["softcap"]
    assert not dq_constants(cap_only, s)["WINDOW"] and dq_constants(cap_only, s)["SOFTCAP"]
    assert launches(cap_only, s, 0.1).dq_scalars[3:6] == (-1, -1, 20.0)  # unused, still passed


def test_plain_and_sink_problems_pass_zero_byte_variant_values():
    """No window, no softcap, no ragged batch: the variants' values are empty tuples (no bytes:
    the parameter space, and the code, of the kernels before the variants) and their constants
    off (sinks change nothing in the backward's kernels: the forward's log-sum-exp holds
    them)."""
    s = BackwardSchedule()
    for p in (_problem(causal=True), SINGLE["sinks"]):
        assert not has_variants(p)
        for constants in (dq_constants(p, s), dkdv_constants(p, s)):
            assert not any(constants[c] for c in ("WINDOW", "SOFTCAP", "RAGGED", "PACKED"))
        plan = launches(p, s, 0.125)
        assert plan.dq_scalars == (0.125, 8, 4, UNUSED, UNUSED, UNUSED,
                                   *DQ_PARAMETERS.constant_values(dq_constants(p, s)))
        assert plan.dkdv_scalars == (0.125, 2, 4, UNUSED, UNUSED, UNUSED,
                                     *DKDV_PARAMETERS.constant_values(dkdv_constants(p, s)))


# -- defaults -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_121"])
def test_defaults_of_windowed_problems(arch):
    """Narrow windows get tiles no larger than the window needs (at least
    ``WINDOW_TILE_FLOOR``), the defaults are normal, work orders follow the walks, and
    windows that leave a side unbounded keep the plain tiles."""
    narrow = _problem(sq=8192, sk=8192, causal=True, left=31, hq=32, hkv=8, d=128)
    wide = dataclasses.replace(narrow, window_left=4000)
    band = _problem(sq=8192, sk=8192, left=16, right=15, hq=32, hkv=8, d=128)
    one_sided = _problem(sq=8192, sk=8192, right=16, hq=32, hkv=8, d=128)
    plain = dataclasses.replace(narrow, window_left=-1)
    for p in (narrow, band):
        s = BACKWARD.default_schedule(arch, p)
        assert max(s.dkdv_tile_n, s.dkdv_tile_m, s.dq_tile_m, s.dq_tile_n) <= WINDOW_TILE_FLOOR
        assert normalise(p, s) == s
    tiles = ("dkdv_tile_n", "dkdv_tile_m", "dq_tile_m", "dq_tile_n")
    for p in (wide, one_sided):
        s, base = BACKWARD.default_schedule(arch, p), BACKWARD.default_schedule(arch, plain)
        assert [getattr(s, n) for n in tiles] == [getattr(base, n) for n in tiles]
    assert BACKWARD.default_schedule(arch, narrow).dq_heavy_first
    assert BACKWARD.default_schedule(arch, one_sided).dq_heavy_first == heaviest_last(one_sided)
    assert not BACKWARD.default_schedule(arch, band).dq_heavy_first
    assert not BACKWARD.default_schedule(arch, band).tile_major
    mqa = _problem(sq=8192, sk=8192, causal=True, left=127, hq=8, hkv=1, d=128, batch=1)
    s = BACKWARD.default_schedule(arch, mqa)
    assert s.dkdv_splits <= 8 * dkdv_walk(mqa, s.dkdv_tile_n, s.dkdv_tile_m)


# -- compile-only builds ------------------------------------------------------------------------
_BUILT: dict = {}


def _digests(problem: Problem, schedule: BackwardSchedule | None = None,
             arch: str = "sm_90") -> tuple[str, ...]:
    schedule = schedule or BACKWARD.default_schedule(arch, problem)
    key = (problem, schedule, arch)
    if key not in _BUILT:
        result = BACKWARD.compile(problem, schedule, arch)
        assert result.cubin[:4] == b"\x7fELF" and result.arch == arch
        _BUILT[key] = tuple(text_digest(c) for c in (result.cubin, *result.other_cubins))
    return _BUILT[key]


@pytest.mark.parametrize("arch", ARCHES)
def test_every_variant_together_compiles_for_each_architecture(arch):
    # split (the default leaves this short windowed walk whole): the partials' sum is built too
    schedule = BACKWARD.default_schedule(arch, COMBINED).replace(dkdv_splits=2)
    assert BACKWARD.normalise(COMBINED, schedule).dkdv_splits == 2
    assert len(_digests(COMBINED, schedule, arch)) == 3


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_each_variant_compiles_and_reaches_the_code(name):
    """Each variant compiles (sm_90, its two-kernel default schedule, split in two); a window
    or a softcap changes both kernels' code, sinks change none (the plain kernels run)."""
    p = SINGLE[name]
    two_kernel = BACKWARD.deterministic_schedule("sm_90", p,
                                                 BACKWARD.default_schedule("sm_90", p))
    s = two_kernel.replace(dkdv_splits=2)
    plain = dataclasses.replace(p, window_left=-1, window_right=-1, softcap=0.0, sinks=False)
    if p.bottom_right and not p.causal:
        plain = dataclasses.replace(plain, bottom_right=False)
    variant, base = _digests(p, s), _digests(plain, normalise(plain, s))
    if name == "sinks":
        assert variant == base
    else:
        assert variant[0] != base[0] and variant[1] != base[1] and variant[2] == base[2]
