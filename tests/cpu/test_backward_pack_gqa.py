"""A K/V group's query heads packed into one tile of the backward's dQ kernel
(``BackwardSchedule.dq_pack_gqa``), on the CPU: where it runs, the kernel constant, the grids
and the ragged work tables' tiles, the search space, the dict form, and compiles for every
architecture (the GPU checks the numbers: ``tests/gpu/test_backward_pack_gqa_gpu.py``)."""

from __future__ import annotations

import pytest

from search_spaces import BACKWARD_SPACE, space_for
from tiledattention import BACKWARD, BackwardSchedule, Problem
from tiledattention.kernels.backward._launch import (dq_constants, dq_packed_heads,
                                                     dq_query_rows, launches, normalise,
                                                     ragged_grids)

ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")
PACKED = BackwardSchedule(dq_tile_m=64, dq_tile_n=64, dq_pack_gqa=True)


def _problem(hq=32, hkv=8, sq=300, sk=300, d=128, **kw) -> Problem:
    return Problem(batch=2, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=kw.pop("dtype", "bf16"), causal=kw.pop("causal", True), **kw)


@pytest.mark.parametrize("hq, hkv, tile_m, mode, packs", [
    (32, 8, 64, "kernel", True), (16, 1, 64, "kernel", True), (8, 4, 64, "kernel", True),
    (8, 8, 64, "kernel", False),  # no group
    (28, 4, 64, "kernel", False),  # a group of 7: not a power of two
    (64, 1, 32, "kernel", False),  # 64 heads do not fit 32 rows
    (32, 8, 64, "atomic", False),  # one pass: no dQ kernel
])
def test_a_dq_tile_packs_a_group_that_is_a_power_of_two_it_can_hold(hq, hkv, tile_m, mode,
                                                                     packs):
    problem = _problem(hq, hkv)
    schedule = PACKED.replace(dq_tile_m=tile_m, dq_mode=mode)
    normal = normalise(problem, schedule)
    assert normal.dq_pack_gqa is packs  # else: runs unpacked
    assert normalise(problem, normal) == normal
    assert dq_packed_heads(problem, normal) == (hq // hkv if packs else 1)
    assert dq_query_rows(problem, normal) == normal.dq_tile_m // dq_packed_heads(problem, normal)
    assert dq_constants(problem, schedule)["PACK"] == dq_packed_heads(problem, normal)
    assert dq_constants(problem, schedule.replace(dq_pack_gqa=False))["PACK"] == 1


def test_the_grid_counts_positions_per_tile_and_groups_per_batch_entry():
    problem = _problem(32, 8, sq=300)  # a group of 4: 16 positions a 64-row tile
    packed = launches(problem, PACKED, 0.1)
    plain = launches(problem, PACKED.replace(dq_pack_gqa=False), 0.1)
    assert packed.dq_grid == (19, 2 * 8, 1) and packed.tiles[0] == 16  # ceil(300 / 16)
    assert plain.dq_grid == (5, 2 * 32, 1) and plain.tiles[0] == 64
    assert packed.dkdv_grid == plain.dkdv_grid  # the dK/dV kernel is not packed
    tile_major = launches(problem, PACKED.replace(tile_major=True), 0.1)
    assert tile_major.dq_grid == (2 * 8, 19, 1)


def test_few_queries_keep_a_packed_tile_of_the_group():
    # 24 queries: unpacked the dQ tile is capped at 32 rows; packed a tile may hold 4 heads of
    # up to 32 positions
    problem = _problem(32, 8, sq=24, sk=2048, bottom_right=True)
    assert normalise(problem, PACKED.replace(dq_tile_m=128, dq_pack_gqa=False)).dq_tile_m == 32
    packed = normalise(problem, PACKED.replace(dq_tile_m=128))
    assert packed.dq_tile_m == 128 and dq_query_rows(problem, packed) == 32


def test_a_ragged_call_tiles_its_sequences_by_positions_and_groups():
    problem = _problem(16, 1, sq=512, ragged=True)  # 16 heads: 4 positions a 64-row tile
    dq_grid, dkdv_grid = ragged_grids(problem, PACKED, 8, 500, 500)
    assert dq_grid == (-(-500 // 4), 8 * 1, 1)
    plain, _ = ragged_grids(problem, PACKED.replace(dq_pack_gqa=False), 8, 500, 500)
    assert plain == (-(-500 // 64), 8 * 16, 1)
    plan = launches(problem, PACKED, 0.1)
    assert plan.tiles[0] == 4 and plan.dq_heads == 1  # what the dQ work table counts


def test_the_search_space_has_the_dimension_only_where_a_group_packs():
    for problem, has in ((_problem(32, 8), True), (_problem(8, 8), False),
                         (_problem(28, 4), False)):
        space = BACKWARD_SPACE.restrict(space_for(BACKWARD.name, "sm_90"), problem)
        assert ("dq_pack_gqa" in space.choices) is has


def test_the_dict_form_leaves_the_field_out_at_its_default():
    assert "dq_pack_gqa" not in BackwardSchedule().to_dict()
    assert BackwardSchedule.from_dict(PACKED.to_dict()) == PACKED
    assert "pack-gqa" in PACKED.describe()


# every architecture for one problem; the variants (a mask of the other alignment, a window,
# a head dim of two parts, a ragged batch's work tables) for sm_90 (CI time: each build is three
# kernels)
@pytest.mark.parametrize("arch, case", [
    *((arch, dict(hq=32, hkv=8, sq=300, sk=300)) for arch in ARCHS),
    ("sm_90", dict(hq=16, hkv=1, sq=77, sk=1000, d=64, bottom_right=True)),
    ("sm_90", dict(hq=8, hkv=2, sq=500, sk=500, d=96, causal=False, window_left=100,
                   window_right=20)),
    ("sm_90", dict(hq=32, hkv=8, sq=1024, sk=1024, ragged=True)),
], ids=[*(f"gqa4-{a}" for a in ARCHS), "mqa16-d64-bottom-right", "window-d96", "ragged"])
def test_packed_dq_tiles_compile_for_every_architecture(arch, case):
    problem = _problem(**case)
    schedule = BACKWARD.default_schedule(arch, problem).replace(dq_pack_gqa=True,
                                                                dq_mode="kernel")
    assert normalise(problem, schedule).dq_pack_gqa
    result = BACKWARD.compile(problem, schedule, arch)
    assert result.cubins and all(len(c) > 0 for c in result.cubins)


@pytest.mark.parametrize("case, packs", [
    (dict(hq=32, hkv=8, sq=512, ragged=True), True),  # a packed batch of short sequences
    (dict(hq=16, hkv=1, sq=256, ragged=True), True),
    (dict(hq=16, hkv=4, sq=512, d=64, causal=False, ragged=True), True),
    (dict(hq=32, hkv=8, sq=1024, ragged=True), False),  # longer sequences: 0.93-1.03x
    (dict(hq=32, hkv=8, sq=4096, ragged=True), False),
    (dict(hq=32, hkv=8, sq=512), False),  # dense calls: 0.93-1.00x
    (dict(hq=32, hkv=32, sq=512, ragged=True), False),  # no group
    (dict(hq=28, hkv=4, sq=512, ragged=True), False),  # 7
])
def test_the_hopper_default_packs_packed_batches_of_short_sequences(case, packs):
    problem = _problem(**case)
    schedule = BACKWARD.default_schedule("sm_90", problem)
    assert schedule.dq_pack_gqa is packs
    assert dq_packed_heads(problem, schedule) == (problem.group_size if packs else 1)
    for arch in ("sm_100", "sm_120"):  # not measured there
        assert not BACKWARD.default_schedule(arch, problem).dq_pack_gqa
