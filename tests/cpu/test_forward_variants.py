"""The forward kernel's variants on the CPU: sliding windows, softcap and sinks.

(a) the launcher's pure logic: constants from the problem, the runtime values (unread ones get
the zero-byte ``UNUSED``), the sinks check, normalisation, the grid; (b) the key tiles a query
tile visits under a window (``kernel_core.bounds.forward_window_key_tiles``, plain integer
arithmetic the kernel runs and this file calls with Python ints) against the visibility rule,
key by key; (c) the plan places the sink logits in the ``Sinks`` slot; (d) the defaults of
windowed problems;
(e) compile-only builds of each variant (sm_80/90/100/120/121) and the machine-code rule: the
compile-only placeholders build the code that ``ct.launch``'s empty tuples build; (f) a
paged cache's tiles in parts walk their masked tiles apart.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import types

import pytest

from tiledattention import FORWARD, Problem
from tiledattention.core._cubin import text_digest
from tiledattention.errors import KernelArgumentError
from tiledattention.kernels.forward._defaults import NARROW_WINDOW, default_schedule, row_keys
from tiledattention.kernels.forward._launch import (NO_LSE, RUNTIME_PARAMETERS, UNUSED, grid_for,
                                                    kernel_args, kernel_constants,
                                                    kernel_parameters, no_effect_flags, normalise,
                                                    ordered_args)
from tiledattention.kernel_core.bounds import forward_window_key_tiles
from tiledattention.kernels.forward._plan import ForwardPlan
from tiledattention.kernels.forward._schedule import Schedule

BASE = Schedule(tile_m=64, tile_n=64)


def _problem(seqlen_q: int = 1000, seqlen_k: int = 1000, causal: bool = False,
             **variant) -> Problem:
    return Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                   head_dim=128, dtype="bf16", causal=causal, **variant)


PLAIN = _problem()
WINDOWED = _problem(window_left=128, window_right=64)
ALL = _problem(seqlen_q=700, causal=True, bottom_right=True, window_left=128, softcap=50.0,
               sinks=True)


# -- (a) launcher logic ----------------------------------------------------------------------------
def test_variant_values_are_the_last_runtime_parameters_after_lse():
    assert RUNTIME_PARAMETERS[-11:] == ("Lse", "window_left", "window_right", "softcap", "Sinks",
                                        "Ranges", "Work", "Pages", "QDescale", "KDescale",
                                        "VDescale")
    names = kernel_parameters()
    assert names[:len(RUNTIME_PARAMETERS)] == RUNTIME_PARAMETERS


@pytest.mark.parametrize("problem, window, softcap, sinks", [
    (PLAIN, False, False, False),
    (WINDOWED, True, False, False),
    (_problem(causal=True, window_left=10), True, False, False),
    (_problem(softcap=30.0), False, True, False),
    (_problem(sinks=True), False, False, True),
    (ALL, True, True, True),
], ids=["plain", "window", "causal_window", "softcap", "sinks", "all"])
def test_constants_follow_the_problem(problem, window, softcap, sinks):
    c = kernel_constants(problem, BASE)
    assert (c["WINDOW"], c["SOFTCAP"], c["SINKS"]) == (window, softcap, sinks)
    assert c["BOTTOM_RIGHT"] is problem.bottom_right and c["CAUSAL"] is problem.causal


def _runtime(args: tuple) -> dict:
    return dict(zip(kernel_parameters(), args))


def test_a_plain_problem_passes_unused_placeholders():
    named = _runtime(kernel_args("q", "k", "v", "o", PLAIN, BASE, 0.125))
    assert UNUSED == ()
    assert named["Lse"] == NO_LSE
    for name in ("window_left", "window_right", "softcap", "Sinks", "Ranges", "Work", "Pages"):
        assert named[name] is UNUSED, name


def test_variant_values_reach_their_parameters():
    sinks = object()  # any array; kernel_args only places it
    named = _runtime(kernel_args("q", "k", "v", "o", ALL, BASE, 0.125, lse="lse", sinks=sinks))
    assert (named["window_left"], named["window_right"]) == (128, -1)
    assert named["softcap"] == 50.0 and isinstance(named["softcap"], float)
    assert named["Sinks"] is sinks and named["Lse"] == "lse"
    assert (named["WINDOW"], named["SOFTCAP"], named["SINKS"], named["STORE_LSE"]) == (
        True, True, True, True)
    # a window without softcap or sinks: only the window values are passed
    named = _runtime(kernel_args("q", "k", "v", "o", WINDOWED, BASE, 0.125))
    assert (named["window_left"], named["window_right"]) == (128, 64)
    assert named["softcap"] is UNUSED and named["Sinks"] is UNUSED


def test_sinks_must_match_the_problem():
    with pytest.raises(KernelArgumentError, match="sinks must be given exactly"):
        kernel_args("q", "k", "v", "o", ALL, BASE, 0.125)
    with pytest.raises(KernelArgumentError, match="sinks must be given exactly"):
        kernel_args("q", "k", "v", "o", PLAIN, BASE, 0.125, sinks="s")


@pytest.mark.parametrize("page_size,parts", [(256, False), (64, True), (16, True)])
def test_a_paged_tile_in_parts_walks_its_masked_tiles_apart(page_size, parts):
    """Over pages smaller than a 128-key tile (its parts a page load each) ``SPLIT_MASKED`` is
    on whatever the schedule says, and normalising drops the then idle flag; a tile of one
    load (pages of 256) walks as its schedule says, as without pages."""
    chunk = _problem(seqlen_q=512, seqlen_k=16384, causal=True, bottom_right=True,
                     ragged=True, page_size=page_size)
    plain, split = Schedule(tile_m=128, tile_n=128), Schedule(tile_m=128, tile_n=128,
                                                              split_masked=True)
    assert kernel_constants(chunk, plain)["SPLIT_MASKED"] is parts
    assert kernel_constants(chunk, split)["SPLIT_MASKED"]
    assert (normalise(chunk, split) == normalise(chunk, plain)) is parts
    unpaged = dataclasses.replace(chunk, page_size=0)
    assert not kernel_constants(unpaged, plain)["SPLIT_MASKED"]
    assert kernel_constants(unpaged, split)["SPLIT_MASKED"]


def test_ordered_args_fills_only_the_values_their_constants_leave_unread():
    runtime = {"Q": 1, "K": 2, "V": 3, "Out": 4, "qk_scale": 0.5, "heads_q": 8, "group": 4}
    args = _runtime(ordered_args(runtime, kernel_constants(PLAIN, BASE)))
    assert [args[n] for n in ("Lse", "window_left", "window_right", "softcap", "Sinks")] == [
        NO_LSE, UNUSED, UNUSED, UNUSED, UNUSED]
    # a windowed problem reads its window: leaving it out is an error, not a placeholder
    with pytest.raises(TypeError, match=r"runtime missing \['window_left', 'window_right'\]"):
        ordered_args(runtime, kernel_constants(WINDOWED, BASE))


def test_normalise_keeps_the_balancing_flags_for_windows():
    flags = BASE.replace(paired_tiles=True, longest_first=True, split_masked=True)
    even_full = _problem(seqlen_q=1024, seqlen_k=1024)
    assert normalise(even_full, flags).key == BASE.key  # full, even: none of them matters
    even_window = dataclasses.replace(even_full, window_left=100)
    kept = normalise(even_window, flags)
    assert kept.paired_tiles and kept.split_masked  # edges clip tiles; edge tiles take a mask
    assert not kept.longest_first  # a pair starts with the longer tile already
    assert normalise(even_window, BASE.replace(longest_first=True)).longest_first
    assert "paired_tiles" in no_effect_flags(even_full, flags)
    assert "paired_tiles" not in no_effect_flags(even_window, flags)
    # one query tile: the pair is the tile itself, window or not
    assert "paired_tiles" in no_effect_flags(_problem(seqlen_q=64, window_left=10), flags)


def test_the_grid_of_a_windowed_problem():
    """One CTA (or work item) per query tile, or per pair with paired tiles, which a window
    keeps (its tiles are unequal near the ends)."""
    tiles = -(-WINDOWED.seqlen_q // 64)  # 16
    heads = WINDOWED.batch * WINDOWED.heads_q
    assert grid_for(WINDOWED, BASE, 132) == (tiles, heads, 1)
    assert grid_for(WINDOWED, BASE.replace(paired_tiles=True), 132) == (tiles // 2, heads, 1)
    assert grid_for(WINDOWED, BASE.replace(persistent=True), 132) == (132, 1, 1)


# -- (b) the key tiles a query tile visits ---------------------------------------------------------
def _visible(problem: Problem, row: int, key: int) -> bool:
    """The spec's rule: query row ``row`` sees key ``key`` (for rows past ``S_q`` too: the
    last query tile's padding rows)."""
    at = row + problem.causal_offset
    return (0 <= key < problem.seqlen_k and (not problem.causal or key <= at)
            and (problem.window_left < 0 or key >= at - problem.window_left)
            and (problem.window_right < 0 or key <= at + problem.window_right))


def _check_tiles(problem: Problem, tile_m: int, tile_n: int) -> None:
    sq, sk = problem.seqlen_q, problem.seqlen_k
    for q_tile in range(-(-sq // tile_m)):
        first_row = q_tile * tile_m + problem.causal_offset
        first, lo, hi, end = forward_window_key_tiles(first_row, sk, problem.window_left,
                                                      problem.window_right, TILE_M=tile_m,
                                                      TILE_N=tile_n, CAUSAL=problem.causal)
        # an empty walk may start past the last key tile (rows whose window lies past S_k)
        assert 0 <= first <= lo <= hi <= end, (q_tile, first, lo, hi, end)
        assert first == end or end <= -(-sk // tile_n), (q_tile, first, end)
        rows = range(q_tile * tile_m, min((q_tile + 1) * tile_m, sq))
        rows_all = range(q_tile * tile_m, (q_tile + 1) * tile_m)  # the kernel's, past S_q too
        for j in range(-(-sk // tile_n)):
            keys = range(j * tile_n, (j + 1) * tile_n)
            seen = any(_visible(problem, r, k) for r in rows for k in keys)
            if seen:  # every key a stored row sees is in a visited tile
                assert first <= j < end, (q_tile, j, first, end)
            if lo <= j < hi:  # unmasked: every row of the tile sees every key of it
                assert all(_visible(problem, r, k) for r in rows_all for k in keys), (q_tile, j)
            if first <= j < end:  # no tile is visited that none of the tile's rows sees
                assert any(_visible(problem, r, k) for r in rows_all for k in keys), (q_tile, j)


WINDOW_CASES = {
    "left_causal": dict(seqlen_q=300, seqlen_k=300, causal=True, window_left=70),
    "left_causal_exact_tile": dict(seqlen_q=256, seqlen_k=256, causal=True, window_left=64),
    "both_sides": dict(seqlen_q=257, seqlen_k=257, window_left=33, window_right=90),
    "right_only": dict(seqlen_q=200, seqlen_k=310, window_right=17),
    "left_only_full": dict(seqlen_q=310, seqlen_k=200, window_left=40),
    "window_of_one": dict(seqlen_q=150, seqlen_k=150, causal=True, window_left=0),
    "one_key_each_side": dict(seqlen_q=150, seqlen_k=150, window_left=1, window_right=1),
    "br_causal_window": dict(seqlen_q=100, seqlen_k=333, causal=True, bottom_right=True,
                             window_left=50),
    "br_more_queries": dict(seqlen_q=333, seqlen_k=100, causal=True, bottom_right=True,
                            window_left=20),
    "br_window_no_causal": dict(seqlen_q=90, seqlen_k=300, bottom_right=True, window_left=40,
                                window_right=10),
    "top_left_more_queries": dict(seqlen_q=400, seqlen_k=130, window_left=30, window_right=5),
}


@pytest.mark.parametrize("tiles", [(64, 64), (64, 128), (128, 64), (32, 32)],
                         ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("case", WINDOW_CASES.values(), ids=WINDOW_CASES.keys())
def test_window_tiles_cover_every_visible_key_and_mask_every_partial_tile(case, tiles):
    problem = _problem(**case)
    assert problem.windowed, "the case must keep a window in canonical form"
    _check_tiles(problem, *tiles)


def test_window_tiles_on_random_problems():
    rng = random.Random(32)
    for _ in range(60):
        sq, sk = rng.randint(1, 300), rng.randint(1, 300)
        causal = rng.random() < 0.5
        variant = dict(window_left=rng.choice([-1, rng.randint(0, 200)]),
                       window_right=-1 if causal else rng.choice([-1, rng.randint(0, 200)]),
                       bottom_right=rng.random() < 0.5 and sq != sk)
        try:
            problem = _problem(seqlen_q=sq, seqlen_k=sk, causal=causal, **variant)
        except ValueError:  # bottom-right with neither mask nor window
            continue
        if problem.windowed:
            _check_tiles(problem, rng.choice([16, 32, 64]), rng.choice([16, 32, 64]))


def test_a_window_visits_tiles_in_proportion_to_its_width():
    """Work scales with the window: 64 query rows with a 128-key window visit at most
    (64 + 128) / 64 + 1 key tiles of 64, whatever the length."""
    long = _problem(seqlen_q=16384, seqlen_k=16384, causal=True, window_left=127)
    for q_tile in (0, 1, 100, 255):
        first, _, _, end = forward_window_key_tiles(q_tile * 64, 16384, 127, -1, TILE_M=64,
                                                    TILE_N=64, CAUSAL=True)
        assert end - first <= 4
    assert long.attended_pairs <= 16384 * 128


# -- (c) the plan carries the sink logits into their slot -----------------------------------------
def _plan(problem: Problem, sinks_at_marker: bool) -> ForwardPlan:
    """A ForwardPlan as ``forward_plan`` builds it, without asking a device for its SMs."""
    from tiledattention.kernels.forward._launch import Slot, kernel_for

    schedule = normalise(problem, BASE)
    marker = Slot("Sinks") if sinks_at_marker else None
    scalars = tuple(kernel_args(None, None, None, None, problem, schedule, 0.1,
                                sinks=marker)[4:])
    return ForwardPlan((1,), grid_for(problem, schedule, 132), kernel_for(schedule), scalars,
                       sinks_at=None if marker is None else scalars.index(marker))


def test_plan_puts_sinks_into_the_sinks_slot(monkeypatch):
    import tiledattention.kernels.forward._plan as plan_module

    launched = []
    monkeypatch.setattr(plan_module._aot, "launch",
                        lambda stream, grid, kernel, args: launched.append(args))
    monkeypatch.setattr(plan_module.hot, "raw_stream", lambda device: 0)
    monkeypatch.setattr(plan_module.hot, "empty_like", lambda q: "out")
    sinks = object()
    plan = _plan(ALL, True)
    plan.like = True
    assert plan.run(None, "q", "k", "v", 0, None, sinks=sinks) == "out"
    named = _runtime(launched[-1])
    assert named["Sinks"] is sinks and named["Q"] == "q" and named["Out"] == "out"
    assert (named["window_left"], named["softcap"]) == (128, 50.0)
    assert launched[-1][4:] == (plan.before_sinks + (sinks,) + plan.after_sinks)
    # a plain plan launches its scalars as they are
    plain = _plan(PLAIN, False)
    plain.like = True
    assert plain.sinks_at is None
    plain.run(None, "q", "k", "v", 0, None)
    assert launched[-1] == ("q", "k", "v", "out") + plain.scalars


# -- (d) defaults ----------------------------------------------------------------------------------
def test_row_keys():
    assert row_keys(PLAIN) == 1000
    assert row_keys(_problem(causal=True)) == 1000
    assert row_keys(_problem(causal=True, window_left=127)) == 128
    assert row_keys(WINDOWED) == 128 + 64 + 1
    assert row_keys(_problem(window_right=5)) == 1000


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_narrow_windows_get_small_tiles(arch):
    for d in (64, 96, 128):
        narrow = dataclasses.replace(_problem(seqlen_q=8192, seqlen_k=8192, causal=True,
                                              window_left=127), head_dim=d)
        s = default_schedule(arch, narrow)
        assert (s.tile_m, s.tile_n) == (64, 64), d
        assert s.split_d == (d == 96)
    wide = _problem(seqlen_q=8192, seqlen_k=8192, causal=True, window_left=NARROW_WINDOW)
    assert default_schedule(arch, wide).tile_n == 128


def test_windows_count_the_keys_a_row_sees_where_defaults_go_by_length():
    long_causal = _problem(seqlen_q=8192, seqlen_k=8192, causal=True)
    assert default_schedule("sm_90", long_causal).num_ctas == 2  # rows see >= 4k keys
    windowed = dataclasses.replace(long_causal, window_left=1023)
    assert default_schedule("sm_90", windowed).num_ctas == 1  # rows see at most 1024
    d64 = dataclasses.replace(PLAIN, head_dim=64, seqlen_q=8192, seqlen_k=8192)
    assert default_schedule("sm_90", d64).tile_n == 128  # full mask beyond 2k keys
    assert default_schedule("sm_90", dataclasses.replace(
        d64, window_left=500, window_right=500)).tile_n == 64  # each row sees 1001


def test_plain_defaults_do_not_change():
    """The variant fields leave the default of a plain problem alone (shipped behaviour), and
    softcap and sinks alone change no default."""
    for problem in (PLAIN, _problem(causal=True), _problem(seqlen_q=8192, seqlen_k=2048,
                                                           causal=True)):
        for arch in ("sm_80", "sm_90", "sm_100", "sm_120"):
            plain = default_schedule(arch, problem)
            assert default_schedule(arch, dataclasses.replace(problem, softcap=20.0,
                                                              sinks=True)) == plain
    top_left = _problem(seqlen_q=8192, seqlen_k=2048, causal=True)
    assert default_schedule("sm_90", top_left).num_ctas == 2  # goes by S_q, as before


# -- (e) compile-only builds -----------------------------------------------------------------------
def _compiles(problem: Problem, arch: str, schedule: Schedule | None = None) -> bytes:
    schedule = FORWARD.default_schedule(arch, problem) if schedule is None else schedule
    result = FORWARD.compile(problem, schedule, arch)
    assert result.cubin[:4] == b"\x7fELF" and result.arch == arch
    return result.cubin


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100", "sm_120", "sm_121"])
def test_all_variants_together_compile(arch):
    _compiles(ALL, arch)


SINGLE = {
    "window_both_sides": WINDOWED,
    "window_left_causal": _problem(causal=True, window_left=300),
    "window_right_only": _problem(seqlen_q=777, window_right=100),
    "window_bottom_right": _problem(seqlen_q=300, seqlen_k=1025, bottom_right=True,
                                    window_left=200, window_right=20),
    "softcap": _problem(causal=True, softcap=30.0),
    "sinks": _problem(sinks=True),
}


@pytest.mark.parametrize("problem", SINGLE.values(), ids=SINGLE.keys())
def test_each_variant_compiles_on_sm_90(problem):
    _compiles(problem, "sm_90")


def test_variants_compile_with_every_loop_arrangement():
    """Split masked loops, sawtooth, persistent paired tiles, natural-log units (no exp2), a
    split head dim: the other paths through the windowed loop, softcap and sinks."""
    problem = dataclasses.replace(ALL, head_dim=96)
    schedule = Schedule(tile_m=64, tile_n=32, split_masked=True, kv_sawtooth=True,
                        persistent=True, paired_tiles=True, split_d=True, exp2=False)
    assert normalise(problem, schedule) == schedule
    _compiles(problem, "sm_90", schedule)


def test_unused_values_compile_as_ct_launch_passes_them():
    """Compile-only builds give the unread variant values a constant (``export_cubin`` uses the
    ``cutile_python_v1`` convention, which takes no tuple); ``ct.launch`` passes the empty
    tuple :data:`UNUSED`. Both take no parameter bytes: the same machine code."""
    import io

    import cuda.tile as ct
    from cuda.tile import compilation as ctc

    from tiledattention.core._compile import array_constraint
    from tiledattention.kernels.forward._launch import kernel_for

    problem = _problem(causal=True)
    schedule = normalise(problem, FORWARD.default_schedule("sm_90", problem))
    ours = text_digest(_compiles(problem, "sm_90", schedule))
    q_like = array_constraint("bf16", (2, 8, 1000, 128))
    kv_like = array_constraint("bf16", (2, 2, 1000, 128))
    runtime = {"Q": q_like, "K": kv_like, "V": kv_like, "Out": q_like,
               "qk_scale": ctc.ScalarConstraint(ct.float32),
               "heads_q": ctc.ScalarConstraint(ct.int32), "group": ctc.ScalarConstraint(ct.int32),
               "Lse": ctc.ScalarConstraint(ct.int32)}
    # what ct.launch makes of UNUSED: an empty tuple, under the v2 calling convention
    runtime.update({name: ctc.TupleConstraint(()) for name in ("window_left", "window_right",
                                                                "softcap", "Sinks")})
    args = ordered_args(runtime, kernel_constants(problem, schedule))
    signature = ctc.KernelSignature(list(args),
                                    calling_convention=ctc.CallingConvention.cutile_python_v2())
    buf = io.BytesIO()
    ctc.export_kernel(kernel_for(schedule), [signature], buf, gpu_code="sm_90",
                      output_format="cubin")
    assert text_digest(buf.getvalue()) == ours


def test_window_values_are_launch_time_values():
    """Two windows of one width class compile one kernel: the values are not constants."""
    a = kernel_constants(_problem(causal=True, window_left=100), BASE)
    b = kernel_constants(_problem(causal=True, window_left=200), BASE)
    c = kernel_constants(_problem(causal=True, softcap=5.0, window_left=7), BASE)
    assert a == b
    assert {k for k in a if a[k] != c[k]} == {"SOFTCAP"}


@pytest.mark.parametrize("problem", [WINDOWED, ALL], ids=["window", "all"])
def test_normalised_variant_schedules_keep_their_constants(problem):
    """Flags that normalise away for a variant problem change no constant (the tuner never
    times one kernel under two names)."""
    for flag in ("paired_tiles", "longest_first", "kv_sawtooth", "split_masked",
                 "unchecked_loads"):
        schedule = BASE.replace(**{flag: True})
        assert kernel_constants(problem, schedule) == kernel_constants(
            problem, normalise(problem, schedule))


def test_every_variant_combination_has_constants():
    for window, softcap, sinks in itertools.product((False, True), repeat=3):
        problem = _problem(causal=True, window_left=50 if window else -1,
                           softcap=4.0 if softcap else 0.0, sinks=sinks)
        c = kernel_constants(problem, BASE)
        assert (c["WINDOW"], c["SOFTCAP"], c["SINKS"]) == (window, softcap, sinks)
