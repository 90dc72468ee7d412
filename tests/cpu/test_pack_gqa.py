"""A K/V group's query heads packed into one forward tile (``Schedule.pack_gqa``), on the CPU:
where it runs, the grid and work tables it launches, the kernel constant, the search space,
the sm_90 default's rule, and compiles for every architecture (the GPU checks the numbers:
``tests/gpu/test_pack_gqa_gpu.py``)."""

from __future__ import annotations

import pytest

from search_spaces import FORWARD_SPACE, space_for
from tiledattention import FORWARD, Problem, Schedule
from tiledattention.kernels.forward._defaults import default_schedule, packs_heads
from tiledattention.kernels.forward._launch import (grid_for, kernel_constants, packable,
                                                    packed_heads, query_rows, ragged_launch)

ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")
PACKED = Schedule(tile_m=64, tile_n=64, pack_gqa=True)


def _problem(hq=32, hkv=8, sq=300, sk=300, d=128, **kw) -> Problem:
    return Problem(batch=2, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=kw.pop("dtype", "bf16"), causal=kw.pop("causal", True), **kw)


@pytest.mark.parametrize("hq, hkv, tile_m, slots", [
    (32, 8, 64, 4), (16, 1, 64, 16), (64, 1, 64, 64), (8, 4, 64, 2),
    (28, 4, 64, 8), (12, 4, 64, 4), (20, 4, 64, 8), (12, 2, 64, 8),  # 7, 3, 5, 6: idle slots
    (56, 1, 64, 64),
    (8, 8, 64, 0),  # no group
    (64, 1, 32, 0),  # 64 heads do not fit 32 rows
    (40, 1, 32, 0),  # nor do 40 (in 64 slots)
])
def test_a_tile_packs_a_group_its_power_of_two_of_slots_can_hold(hq, hkv, tile_m, slots):
    problem = _problem(hq, hkv)
    schedule = Schedule(tile_m=tile_m, pack_gqa=True)
    packs = slots > 0
    assert packable(problem, tile_m, idle_slots=True) is packs
    # the backward's dQ tiles pack powers of two only
    assert packable(problem, tile_m) is (packs and slots == hq // hkv)
    assert FORWARD.normalise(problem, schedule).pack_gqa is packs  # else: runs unpacked
    assert packed_heads(problem, schedule) == (hq // hkv if packs else 1)
    assert query_rows(problem, schedule) == tile_m // max(slots, 1)
    assert kernel_constants(problem, schedule)["PACK"] == packed_heads(problem, schedule)
    assert kernel_constants(problem, schedule.replace(pack_gqa=False))["PACK"] == 1


def test_the_grid_counts_positions_per_tile_and_groups_per_batch_entry():
    problem = _problem(32, 8, sq=300)  # a group of 4: 16 positions a 64-row tile
    assert grid_for(problem, PACKED, 132) == (19, 2 * 8, 1)  # ceil(300 / 16), B x H_kv
    assert grid_for(problem, PACKED.replace(pack_gqa=False), 132) == (5, 2 * 32, 1)
    paired = PACKED.replace(paired_tiles=True)
    assert grid_for(problem, paired, 132) == (10, 16, 1)
    persistent = PACKED.replace(persistent=True, occupancy=2)
    assert grid_for(problem, persistent, 132) == (min(19 * 16, 264), 1, 1)
    seven = _problem(28, 4, sq=300)  # a group of 7 in 8 slots: 8 positions a 64-row tile
    assert grid_for(seven, PACKED, 132) == (38, 2 * 4, 1)


def test_a_ragged_launch_tiles_its_sequences_by_positions_and_groups():
    problem = _problem(16, 1, sq=512, ragged=True)  # 16 heads: 4 positions a 64-row tile
    packed = ragged_launch(problem, PACKED, 0.1, 8, 500, 2000, packed=True, lse=False,
                           sinks=False, pages=False)
    plain = ragged_launch(problem, PACKED.replace(pack_gqa=False), 0.1, 8, 500, 2000,
                          packed=True, lse=False, sinks=False, pages=False)
    for launch, tile, heads in ((packed, 4, 1), (plain, 64, 16)):
        assert launch.tile_m == tile  # the work table's tile: query positions
        if launch.items:  # a work table: one CTA an (item x tile's heads)
            assert launch.grid == (launch.items * heads, 1, 1)
        else:  # the longest sequence's tiles for every (sequence x tile's heads)
            assert launch.grid == (-(-500 // tile), 8 * heads, 1)


def test_the_search_space_has_the_dimension_only_where_a_group_packs():
    for problem, has in ((_problem(32, 8), True), (_problem(8, 8), False),
                         (_problem(28, 4), True)):
        space = FORWARD_SPACE.restrict(space_for(FORWARD.name, "sm_90"), problem)
        assert ("pack_gqa" in space.choices) is has


@pytest.mark.parametrize("case, packs", [
    (dict(hq=32, hkv=8, sq=300, ragged=True), True),  # a packed batch
    (dict(hq=16, hkv=1, sq=3000, ragged=True), True),
    (dict(hq=32, hkv=8, sq=32, sk=4096, bottom_right=True), True),  # verification
    (dict(hq=32, hkv=8, sq=40, sk=4096, bottom_right=True), True),  # 128-row tiles
    (dict(hq=32, hkv=8, sq=128, sk=8192, bottom_right=True), False),  # a whole tile
    (dict(hq=32, hkv=8, sq=2048, sk=2048), False),
    (dict(hq=16, hkv=1, sq=48, sk=2048, d=64, bottom_right=True), False),  # 3/4 of a tile
    (dict(hq=32, hkv=8, sq=24, sk=4096, d=64, bottom_right=True), True),  # at 3 CTAs an SM
    (dict(hq=16, hkv=4, sq=1024, d=64, ragged=True), False),  # 4 CTAs an SM
    (dict(hq=32, hkv=32, sq=300, ragged=True), False),  # no group
    (dict(hq=28, hkv=4, sq=300, sk=3000, ragged=True), True),  # 7 in 8 slots: a chunk
    (dict(hq=28, hkv=4, sq=300, ragged=True), False),  # 7: self-attention
    (dict(hq=20, hkv=4, sq=300, sk=3000, ragged=True), False),  # 5 in 8: too many idle
    (dict(hq=28, hkv=4, sq=32, sk=4096, bottom_right=True), True),  # 7: few queries
    (dict(hq=32, hkv=8, sq=300, ragged=True, page_size=16), False),  # paged: not measured
])
def test_the_hopper_default_packs_packed_batches_and_calls_of_few_queries(case, packs):
    problem = _problem(**case)
    schedule = default_schedule("sm_90", problem)
    assert schedule.pack_gqa is packs
    if packs:  # at most three CTAs an SM
        assert schedule.occupancy <= 3 and packs_heads("sm_90", problem, schedule)
    for arch in ("sm_100", "sm_120"):  # not measured there
        assert not default_schedule(arch, problem).pack_gqa


def test_fp8_keeps_its_default_unpacked():
    problem = _problem(32, 8, sq=32, sk=4096, bottom_right=True, dtype="e4m3")
    assert not default_schedule("sm_90", problem).pack_gqa


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", [
    dict(hq=32, hkv=8, sq=300, sk=300),
    dict(hq=16, hkv=1, sq=77, sk=1000, d=64, bottom_right=True),
    dict(hq=8, hkv=2, sq=500, sk=500, d=96, causal=False, window_left=100, window_right=20),
    dict(hq=8, hkv=4, sq=200, sk=200, sinks=True, softcap=30.0),
    dict(hq=32, hkv=8, sq=1024, sk=1024, ragged=True),
    dict(hq=28, hkv=4, sq=400, sk=3000, bottom_right=True),
    dict(hq=12, hkv=4, sq=300, sk=300, d=96, sinks=True, softcap=30.0),
    dict(hq=20, hkv=4, sq=1024, sk=1024, ragged=True),
], ids=["gqa4", "mqa16-d64-bottom-right", "window-d96", "sinks-softcap", "ragged", "gqa7",
        "gqa3-d96-sinks-softcap", "gqa5-ragged"])
def test_packed_tiles_compile_for_every_architecture(arch, case):
    problem = _problem(**case)
    schedule = FORWARD.default_schedule(arch, problem).replace(pack_gqa=True)
    assert FORWARD.normalise(problem, schedule).pack_gqa
    result = FORWARD.compile(problem, schedule, arch)
    assert result.cubins and all(len(c) > 0 for c in result.cubins)
