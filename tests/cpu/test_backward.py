"""The backward family on the CPU: compile-only builds of both kernels (and of the forward that
stores log-sum-exps) for several architectures, schedule dimensions reaching the compiled code,
the schedule type, normalisation, the per-architecture defaults, kernel arguments placed by
name, and the training entry points' input checks."""

from __future__ import annotations

import dataclasses

import pytest

import tiledattention
from tiledattention import (BACKWARD, FORWARD, BackwardSchedule, DeviceInfo, InputTypeError,
                            InputValueError, Problem, ScheduleError)
from tiledattention.tooling import codecs, text_digest
from tiledattention.kernels.backward._family import BACKWARD_FLOP_RATIO
from tiledattention.core._problem import ROW_STAT_ALIGN
from tiledattention.kernels.backward._launch import (DKDV_PARAMETERS, DQ_PARAMETERS, SUM_PARAMETERS,
                                                     SUM_TILE, dkdv_constants, dq_constants,
                                                     launches, normalise, scratch_shapes,
                                                     sum_constants)
from tiledattention.kernels.backward._schedule import BACKWARD_SCHEDULE_FORMAT

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")

#: GQA 8/2, ragged lengths with S_q != S_k, D padded to 128, bottom-right causal
ODD = Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=333, seqlen_k=1000, head_dim=96,
              dtype="bf16", causal=True, bottom_right=True)
PLAIN = Problem(batch=1, heads_q=4, heads_kv=4, seqlen_q=512, seqlen_k=512, head_dim=64,
                dtype="fp16", causal=False)

_BUILT: dict = {}


def _build(problem: Problem, schedule: BackwardSchedule, arch: str = "sm_90"):
    key = (problem, schedule, arch)
    if key not in _BUILT:
        _BUILT[key] = BACKWARD.compile(problem, schedule, arch)
    return _BUILT[key]


def _digests(result) -> tuple[str, ...]:
    return (text_digest(result.cubin),) + tuple(text_digest(c) for c in result.other_cubins)


# -- compile-only builds ------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHES)
def test_default_schedule_compiles_for_each_architecture(arch):
    schedule = BACKWARD.default_schedule(arch, ODD)
    result = _build(ODD, schedule, arch)
    assert result.arch == arch and result.cubin[:4] == b"\x7fELF"
    assert schedule.dkdv_splits > 1  # a small grid: the walk is split, the partials summed
    assert len(result.other_cubins) == 2  # the dQ kernel, the partials' sum
    assert all(c[:4] == b"\x7fELF" for c in result.other_cubins)
    assert result.shared_bytes and result.shared_bytes > 0


@pytest.mark.parametrize("field, value", [
    ("dkdv_tile_n", 128), ("dkdv_tile_m", 32), ("dkdv_occupancy", 2), ("dkdv_worker_warps", 8),
    ("q_latency", 2), ("dq_tile_m", 128), ("dq_tile_n", 32), ("dq_occupancy", 2),
    ("dq_worker_warps", 8), ("kv_latency", 2)])
def test_every_dimension_reaches_the_compiled_code(field, value):
    """Each field changes the .text of the kernel it belongs to (and only that one)."""
    base = BackwardSchedule()
    changed = base.replace(**{field: value})
    a, b = _digests(_build(PLAIN, base)), _digests(_build(PLAIN, changed))
    dkdv_field = field.startswith("dkdv") or field == "q_latency"
    assert (a[0] != b[0]) == dkdv_field
    assert (a[1] != b[1]) == (not dkdv_field)


def test_splits_and_the_causal_dq_order_reach_their_kernels():
    """dK/dV splits change the dK/dV kernel and add the partials' sum; the dQ order changes
    the dQ kernel alone."""
    base = BackwardSchedule()
    one = _digests(_build(ODD, base))
    split = _digests(_build(ODD, base.replace(dkdv_splits=4)))
    heavy = _digests(_build(ODD, base.replace(dq_heavy_first=True)))
    assert len(one) == 2 and len(split) == 3 and len(heavy) == 2
    assert split[0] != one[0] and split[1] == one[1]
    assert heavy[0] == one[0] and heavy[1] != one[1]


def test_causal_alignments_compile_to_different_code():
    top = dataclasses.replace(ODD, bottom_right=False)
    free = dataclasses.replace(ODD, causal=False, bottom_right=False)
    s = BackwardSchedule()
    digests = {_digests(_build(p, s)) for p in (ODD, top, free)}
    assert len(digests) == 3


# -- schedule type ------------------------------------------------------------------------------
@pytest.mark.parametrize("field, bad", [
    ("dkdv_tile_n", 48), ("dkdv_tile_m", 512), ("dq_tile_m", 8), ("dq_tile_n", True),
    ("dkdv_occupancy", 0), ("dq_occupancy", 33), ("dkdv_worker_warps", 2),
    ("dq_worker_warps", 16), ("q_latency", 0), ("kv_latency", 11), ("kv_latency", 2.0),
    ("dkdv_splits", 3), ("dkdv_splits", 32), ("dq_heavy_first", 1)])
def test_impossible_fields_are_refused_by_name(field, bad):
    with pytest.raises(ScheduleError, match=field):
        BackwardSchedule(**{field: bad})


def test_schedule_round_trips_and_rejects_unknown_and_newer():
    s = BackwardSchedule(dkdv_tile_n=128, dq_worker_warps=8, q_latency=3)
    data = s.to_dict()
    assert data["format"] == BACKWARD_SCHEDULE_FORMAT
    assert BackwardSchedule.from_dict(data) == s
    assert BackwardSchedule.from_dict(data).key == s.key != BackwardSchedule().key
    with pytest.raises(ScheduleError, match="unknown"):
        BackwardSchedule.from_dict({**data, "tile_x": 1})
    with pytest.raises(ScheduleError, match="newer"):
        BackwardSchedule.from_dict({**data, "format": BACKWARD_SCHEDULE_FORMAT + 1})
    with pytest.raises(ScheduleError, match="mapping"):
        BackwardSchedule.from_dict([1, 2])
    assert "dkdv 128x64" in s.describe() and "w8" in s.describe() and "lat3" in s.describe()


def test_rows_stored_before_splits_read_as_the_unsplit_schedule():
    old = {k: v for k, v in BackwardSchedule(dq_tile_m=128).to_dict().items()
           if k not in ("dkdv_splits", "dq_heavy_first")}
    s = BackwardSchedule.from_dict(old)
    assert s == BackwardSchedule(dq_tile_m=128)
    assert s.dkdv_splits == 1 and not s.dq_heavy_first
    with pytest.raises(ScheduleError, match="dq_tile_n"):
        BackwardSchedule.from_dict({k: v for k, v in old.items() if k != "dq_tile_n"})


def test_describe_names_splits_and_the_dq_order():
    s = BackwardSchedule(dkdv_splits=4, dq_heavy_first=True)
    assert "split4" in s.describe() and "heavy-first" in s.describe()
    assert "split" not in BackwardSchedule().describe()


def test_codec_round_trips_rows_of_the_family():
    codec = codecs()["backward"]
    s = BackwardSchedule(dq_tile_m=128)
    assert codec.decode_schedule(s.to_dict()) == s
    assert codec.decode_problem(ODD.to_dict()) == ODD


# -- normalisation, launches, defaults ----------------------------------------------------------
def test_normalise_caps_tiles_at_the_problem_and_is_idempotent():
    tiny = dataclasses.replace(PLAIN, seqlen_q=7, seqlen_k=40)
    s = BackwardSchedule(dkdv_tile_n=128, dkdv_tile_m=128, dq_tile_m=64, dq_tile_n=256)
    n = normalise(tiny, s)
    assert (n.dkdv_tile_m, n.dq_tile_m) == (16, 16)  # S_q 7: one 16-row tile
    assert (n.dkdv_tile_n, n.dq_tile_n) == (64, 64)  # S_k 40: one 64-key tile
    assert normalise(tiny, n) is n
    assert normalise(PLAIN, BackwardSchedule()) == BackwardSchedule()
    # schedules that normalise alike compile alike
    assert _digests(_build(tiny, s)) == _digests(_build(tiny, n))


def test_launch_arguments_follow_the_kernels_signatures():
    s = BackwardSchedule(dkdv_tile_n=128, dq_tile_m=32, q_latency=4)
    plan = launches(ODD, s, 0.125)
    assert plan.dq_grid == (-(-333 // 32), 2 * 8, 1)
    assert plan.dkdv_grid == (-(-1000 // 128), 2 * 2, 1)
    # a plain problem's variant values (and Ranges, which kernel_args places) are zero-byte
    assert plan.dq_scalars == (0.125, 8, 4, (), (), (),
                               *DQ_PARAMETERS.constant_values(dq_constants(ODD, s)))
    assert plan.dkdv_scalars == (0.125, 2, 4, (), (), (),
                                 *DKDV_PARAMETERS.constant_values(dkdv_constants(ODD, s)))
    assert DQ_PARAMETERS.names.index("qk_scale") == 8
    assert DKDV_PARAMETERS.names.index("qk_scale") == 8
    assert scratch_shapes(ODD, s) == {}  # the two-kernel schedule needs no scratch
    assert dkdv_constants(ODD, s)["Q_LATENCY"] == 4 and dq_constants(ODD, s)["KV_LATENCY"] == 0
    assert dq_constants(ODD, s)["TILE_D"] == 128 and dq_constants(ODD, s)["BOTTOM_RIGHT"]
    b, h, padded = plan.stat_shape
    assert (b, h) == (2, 8) and padded % ROW_STAT_ALIGN == 0 and 333 <= padded < 333 + 32


def test_normalise_caps_splits_at_the_walk_and_drops_the_order_without_a_mask():
    one = dataclasses.replace(PLAIN, seqlen_q=100)  # group 1, two 64-row query tiles
    assert normalise(one, BackwardSchedule(dkdv_splits=16)).dkdv_splits == 2
    assert normalise(ODD, BackwardSchedule(dkdv_splits=16)).dkdv_splits == 16  # 4 x 6 pairs
    assert normalise(ODD, BackwardSchedule(dkdv_splits=16, dkdv_tile_m=256)).dkdv_splits == 8
    assert not normalise(PLAIN, BackwardSchedule(dq_heavy_first=True)).dq_heavy_first
    assert normalise(ODD, BackwardSchedule(dq_heavy_first=True)).dq_heavy_first


def test_split_launches_and_scratch():
    s = BackwardSchedule(dkdv_splits=4, dq_heavy_first=True)
    plan = launches(ODD, s, 0.125)
    assert plan.splits == 4 and plan.dkdv_grid == (-(-1000 // 64), 2 * 2, 4)
    assert plan.sum_grid == (-(-1000 // SUM_TILE), 2 * 2, 1)
    assert plan.sum_scalars == SUM_PARAMETERS.constant_values(sum_constants(ODD, 4))
    assert dkdv_constants(ODD, s)["SPLITS"] == 4 and dq_constants(ODD, s)["HEAVY_FIRST"]
    assert scratch_shapes(ODD, s) == plan.scratch == {"dk_parts": (8, 2, 1000, 96),
                                                      "dv_parts": (8, 2, 1000, 96)}
    assert launches(ODD, s, 0.125) is plan  # built once per (problem, schedule, scale)


def test_default_splits_fill_the_waves_of_the_generation():
    """Hopper (132 SMs): a grid short of its waves doubles its splits until it fills them;
    a full grid, or one at the waves already, stays unsplit."""
    from tiledattention.kernels.backward._defaults import FILL, WAVES

    mqa = Problem(batch=1, heads_q=8, heads_kv=1, seqlen_q=6144, seqlen_k=6144, head_dim=128,
                  dtype="bf16", causal=True)
    s = BACKWARD.default_schedule("sm_90", mqa)
    ctas = 6144 // s.dkdv_tile_n  # 96 CTAs at occupancy 2
    assert s.dkdv_splits == 8
    assert ctas * s.dkdv_splits >= FILL * WAVES[True] * 132 * 2 > ctas * s.dkdv_splits // 2
    mha = dataclasses.replace(mqa, heads_q=16, heads_kv=16, seqlen_q=8192, seqlen_k=8192,
                              causal=False)
    assert BACKWARD.default_schedule("sm_90", mha).dkdv_splits == 1
    # fewer SMs on the DGX Spark part: fewer splits for the same grid
    assert BACKWARD.default_schedule("sm_121", mqa).dkdv_splits < s.dkdv_splits
    # the device's own SMs: an RTX 5090's 170 (sm_120; the generation's 48), an H200's 132
    rtx = DeviceInfo(index=0, arch="sm_120", name="NVIDIA GeForce RTX 5090", sm_count=170)
    assert (BACKWARD.device_default(rtx, mqa).dkdv_splits
            > BACKWARD.default_schedule("sm_120", mqa).dkdv_splits)
    h200 = DeviceInfo(index=0, arch="sm_90", name="NVIDIA H200", sm_count=132)
    for p in (mqa, mha, ODD, PLAIN):
        assert BACKWARD.device_default(h200, p) == BACKWARD.default_schedule("sm_90", p)


@pytest.mark.parametrize("arch", ARCHES)
def test_defaults_follow_head_dim_and_fit_the_problem(arch):
    for d in (40, 64, 96, 128, 256):
        p = dataclasses.replace(PLAIN, head_dim=d)
        s = BACKWARD.default_schedule(arch, p)
        assert normalise(p, s) == s
    hopper = BACKWARD.default_schedule("sm_90", dataclasses.replace(PLAIN, head_dim=256))
    assert hopper.dkdv_worker_warps == 8  # measured: 3.4x faster at D = 256
    assert BACKWARD.default_schedule("sm_90", PLAIN).dq_occupancy == 2


def test_family_is_registered_with_its_flop_count():
    assert tiledattention.get_family("backward") is BACKWARD
    assert BACKWARD.flops(PLAIN) == BACKWARD_FLOP_RATIO * PLAIN.flops
    assert BACKWARD.tolerance(PLAIN) > 0


# -- training entry points ---------------------------------------------------------------------
def test_training_entry_points_refuse_cpu_tensors_and_bad_arguments():
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 4, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(InputValueError, match="CUDA"):
        tiledattention.sdpa_with_lse(q, q, q)
    with pytest.raises(InputValueError, match="CUDA"):
        tiledattention.sdpa_backward(q, q, q, q, q, torch.zeros(1, 4, 16))
    with pytest.raises(InputTypeError, match="BackwardSchedule"):
        tiledattention.sdpa_backward(q, q, q, q, q, None, schedule=FORWARD.default_schedule(
            "sm_90", PLAIN))
    with pytest.raises(InputTypeError, match="Schedule"):
        tiledattention.sdpa_with_lse(q, q, q, schedule=BackwardSchedule())



def test_family_backward_hands_the_launch_scratch_of_the_schedules_shape(monkeypatch):
    """The family allocates the split partials a schedule needs and none otherwise."""
    torch = pytest.importorskip("torch")
    import tiledattention.kernels.backward._family as family_module

    calls = []
    monkeypatch.setattr(family_module, "launch", lambda *args: calls.append(args))
    q = torch.empty(1)
    for splits in (1, 4):
        s = BACKWARD.default_schedule("sm_90", ODD).replace(dkdv_splits=splits)
        BACKWARD.backward(None, ODD, s, 0.1, q, q, q, q, q, q, q, (q, q, q))
        plan, scratch = calls[-1][1], calls[-1][-1]
        assert plan.splits == splits
        assert {n: tuple(t.shape) for n, t in scratch.items()} == scratch_shapes(ODD, s)
        assert all(t.dtype == torch.float32 for t in scratch.values())


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_121"])
def test_default_splits_keep_their_partials_small(arch):
    """Only grids short of their waves split, so the partials stay under 128 MiB whatever the
    batch, heads, length, head dim or mask; causal dQ grids run heavy first."""
    import itertools
    import math

    worst = 0
    for b, hkv, s, d, causal in itertools.product((1, 4, 16), (1, 2, 8), (1000, 8192, 65536),
                                                  (64, 128, 256), (False, True)):
        try:
            p = Problem(batch=b, heads_q=8 * hkv, heads_kv=hkv, seqlen_q=s, seqlen_k=s,
                        head_dim=d, dtype="bf16", causal=causal)
        except InputValueError:  # past the kernel's int32 indexing
            continue
        sched = BACKWARD.default_schedule(arch, p)
        assert sched.dq_heavy_first == causal and (causal or not sched.tile_major)
        worst = max(worst, sum(math.prod(x) * 4 for x in scratch_shapes(p, sched).values()))
    assert 0 < worst <= 128 << 20


def test_default_launches_tile_major_only_causal_grids_of_few_waves():
    from tiledattention.kernels.backward._defaults import TILE_MAJOR_WAVES

    def default(b, hq, hkv, s, d, causal=True):
        return BACKWARD.default_schedule("sm_90", Problem(
            batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
            dtype="bf16", causal=causal))

    assert default(1, 32, 8, 4096, 128).tile_major  # 64 x 8 CTAs: 1.9 waves
    assert default(1, 8, 1, 6144, 128).tile_major  # 96 x 8 splits: 2.9 waves
    assert not default(1, 8, 8, 16384, 128).tile_major  # 256 x 8: 7.8 waves
    assert not default(16, 16, 16, 1024, 64).tile_major  # 16 x 256: 15.5 waves
    assert not default(1, 32, 8, 4096, 128, causal=False).tile_major
    assert 5.7 < TILE_MAJOR_WAVES < 7.8


def test_tile_major_grids_reach_both_kernels_and_put_the_tiles_last():
    s = BackwardSchedule(dkdv_splits=4, tile_major=True)
    plan = launches(ODD, s, 0.125)
    assert plan.dkdv_grid == (2 * 2 * 4, -(-1000 // 64), 1)
    assert plan.dq_grid == (2 * 8, -(-333 // 64), 1)
    assert dkdv_constants(ODD, s)["TILE_MAJOR"] and dq_constants(ODD, s)["TILE_MAJOR"]
    base = _digests(_build(ODD, BackwardSchedule(dkdv_splits=4)))
    major = _digests(_build(ODD, s))
    assert major[0] != base[0] and major[1] != base[1] and major[2] == base[2]  # sum unchanged
    assert not normalise(PLAIN, BackwardSchedule(tile_major=True)).tile_major  # no causal mask
    assert "tile-major" in s.describe()


def test_tile_major_gives_way_where_the_tiles_exceed_the_grids_second_dimension():
    from tiledattention.kernels.backward._launch import GRID_Y_LIMIT

    s = BackwardSchedule(tile_major=True, dkdv_tile_n=16, dq_tile_m=16)
    fits = dataclasses.replace(ODD, seqlen_q=16 * GRID_Y_LIMIT, seqlen_k=16 * GRID_Y_LIMIT,
                               heads_q=1, heads_kv=1, batch=1, head_dim=32)
    past = dataclasses.replace(fits, seqlen_k=16 * GRID_Y_LIMIT + 1)
    assert normalise(fits, s).tile_major and not normalise(past, s).tile_major
    assert launches(fits, s, 0.1).dkdv_grid[1] == GRID_Y_LIMIT  # the tiles, on the second


def test_splits_give_way_where_the_partials_would_pass_int32_indexing():
    from tiledattention.core._problem import INDEX_LIMIT

    big = Problem(batch=1, heads_q=64, heads_kv=64, seqlen_q=65536, seqlen_k=65536,
                  head_dim=128, dtype="bf16", causal=False)  # K: 2**29 elements
    s = normalise(big, BackwardSchedule(dkdv_splits=16))
    assert s.dkdv_splits == 2 and 2 * 64 * 65536 * 128 <= INDEX_LIMIT < 4 * 64 * 65536 * 128


def test_a_short_walk_stays_unsplit_whatever_its_grid():
    """``SHORT_WALK``: a dK/dV walk of at most 16 (query head, query tile) pairs per key tile
    is not split even where its grid is far short of the waves; a grouped walk of 32 pairs on
    the same grid is."""
    from tiledattention.kernels.backward._defaults import SHORT_WALK, dkdv_splits

    tiny = Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=256, seqlen_k=256, head_dim=64,
                   dtype="bf16", causal=True)  # 2 query tiles of 128 rows: 2 pairs
    s = BACKWARD.default_schedule("sm_90", tiny)
    assert s.dkdv_splits == 1 and dkdv_splits("sm_90", tiny, s) > 1  # the wave rule would
    edge = dataclasses.replace(tiny, heads_q=4, heads_kv=4, seqlen_q=2048, seqlen_k=2048,
                               causal=False)  # 16 query tiles of 128: 16 pairs, 128 CTAs
    e = BACKWARD.default_schedule("sm_90", edge)
    assert SHORT_WALK == 16 and e.dkdv_splits == 1 and dkdv_splits("sm_90", edge, e) > 1
    grouped = dataclasses.replace(tiny, heads_q=8, heads_kv=2, seqlen_q=1024, seqlen_k=1024,
                                  causal=False)  # 4 heads x 8 query tiles: 32 pairs
    assert BACKWARD.default_schedule("sm_90", grouped).dkdv_splits > 1


# -- a head dim of two parts (split_d) ----------------------------------------------------------
def test_split_head_dim_reaches_both_kernels_and_not_the_sum():
    """D 96 as 64 + 32: both kernels' constants and code change, the partials' sum (a
    memory-bound pass over the padded head dim) does not."""
    padded, split = BackwardSchedule(dkdv_splits=2), BackwardSchedule(dkdv_splits=2,
                                                                       split_d=True)
    for constants in (dq_constants, dkdv_constants):
        assert (constants(ODD, padded)["TILE_D"], constants(ODD, padded)["TILE_D2"]) == (128, 0)
        assert (constants(ODD, split)["TILE_D"], constants(ODD, split)["TILE_D2"]) == (64, 32)
    a, b = _digests(_build(ODD, padded)), _digests(_build(ODD, split))
    assert a[0] != b[0] and a[1] != b[1] and a[2] == b[2]


@pytest.mark.parametrize("arch", ARCHES)
def test_split_head_dim_compiles_one_pass_for_each_architecture(arch):
    """D 72 as 64 + 16 (8 columns of the second part zero-filled), the one-pass backward (two
    reduce-add sites), a window and a softcap."""
    problem = dataclasses.replace(ODD, head_dim=72, window_left=100, softcap=30.0)
    schedule = BackwardSchedule(dq_mode="atomic", split_d=True)
    result = _build(problem, schedule, arch)
    assert result.arch == arch and result.cubin[:4] == b"\x7fELF"
    assert dkdv_constants(problem, schedule)["TILE_D2"] == 16


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256, 56, 112, 224])
def test_split_head_dim_is_normalised_away_where_there_are_no_two_parts(head_dim):
    """A power of two has one part; 56, 112 and 224 would take two parts no narrower than the
    padded one (32 + 32 of 64, 64 + 64 of 128, 128 + 128 of 256)."""
    problem = dataclasses.replace(PLAIN, head_dim=head_dim)
    assert not normalise(problem, BackwardSchedule(split_d=True)).split_d
    assert not BACKWARD.default_schedule("sm_90", problem).split_d
    assert dkdv_constants(problem, BackwardSchedule(split_d=True))["TILE_D2"] == 0


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("head_dim, parts", [(40, (32, 16)), (72, (64, 16)), (80, (64, 16)),
                                             (96, (64, 32)), (160, (128, 32)),
                                             (192, (128, 64))])
def test_defaults_split_a_head_dim_of_two_parts_with_their_own_fields(arch, head_dim, parts):
    """Split, the D <= 128 entry's dQ kernel runs one CTA an SM (``SPLIT_FIELDS``: at two it
    spills once split); everything else is the padded default's."""
    problem = dataclasses.replace(ODD, head_dim=head_dim)
    schedule = BACKWARD.default_schedule(arch, problem)
    assert schedule.split_d and "split-d" in schedule.describe()
    assert (dq_constants(problem, schedule)["TILE_D"],
            dq_constants(problem, schedule)["TILE_D2"]) == parts
    padded = BACKWARD.default_schedule(arch, dataclasses.replace(
        problem, head_dim=min(256, 1 << (head_dim - 1).bit_length())))
    own = {64: {}, 128: {"dq_occupancy": 1}, 256: {}}[max(64, 2 * parts[0])]
    assert schedule == padded.replace(split_d=True, **own)
    assert BACKWARD.deterministic_schedule(arch, problem, schedule) == schedule


@pytest.mark.parametrize("head_dim, split", [(72, True), (80, True), (96, True), (160, False),
                                             (192, False)])
def test_capped_scores_split_their_one_pass_backward_below_a_padded_256(head_dim, split):
    """The softcap one-pass default splits a head dim padded to 128 (1.10-1.23x on an H200),
    not one padded to 256 (D 192: 0.94-0.95x), which keeps its Q/dO loads three steps ahead."""
    problem = dataclasses.replace(ODD, head_dim=head_dim, softcap=30.0, seqlen_q=4096,
                                  seqlen_k=4096, bottom_right=False)
    schedule = BACKWARD.default_schedule("sm_90", problem)
    assert schedule.dq_mode == "atomic" and schedule.split_d == split
    if not split:
        assert schedule.q_latency == 3


def test_rows_stored_before_split_d_keep_their_dicts():
    """``split_d`` is left out of the dict form at its default: a row stored before it reads
    back as the padded schedule, and writes the same dict."""
    s = BackwardSchedule(dq_tile_m=128)
    assert "split_d" not in s.to_dict()
    assert BackwardSchedule.from_dict(s.to_dict()) == s and not s.split_d
    split = s.replace(split_d=True)
    assert split.to_dict()["split_d"] is True
    assert BackwardSchedule.from_dict(split.to_dict()) == split
    with pytest.raises(ScheduleError, match="split_d"):
        BackwardSchedule(split_d=1)
