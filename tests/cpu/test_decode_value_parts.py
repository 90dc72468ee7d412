"""``DecodeSchedule.value_parts`` on the CPU: validation, the dict and key of a schedule without
parts unchanged, ``normalise``'s bounds, the grid and constants, the search space, compiles with
every variant for every architecture."""
from __future__ import annotations

import dataclasses

import pytest

import search_spaces
from tiledattention import DECODE, DecodeSchedule, Problem, ScheduleError
from tiledattention.kernels.decode._launch import launches, split_constants
from tiledattention.tooling import text_digest

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")
BASE = DecodeSchedule(tile_n=128, k_latency=2, v_latency=2)
#: 80 rows over a short cache
ROWS = Problem(batch=10, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=1201, head_dim=128,
               dtype="bf16", causal=False)
#: every variant at once, a head dim of 96 (padded to 128: four parts would leave the last
#: nothing but padding; two are kept)
VARIANT = Problem(batch=3, heads_q=28, heads_kv=4, seqlen_q=3, seqlen_k=2999, head_dim=96,
                  dtype="fp16", causal=True, bottom_right=True, window_left=700,
                  softcap=30.0, sinks=True)
PAGED = Problem(batch=5, heads_q=16, heads_kv=2, seqlen_q=1, seqlen_k=3000, head_dim=64,
                dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=16)


@pytest.mark.parametrize("value", [0, 3, 8, True, 2.0])
def test_validation_names_the_field(value):
    with pytest.raises(ScheduleError, match=r"DecodeSchedule\.value_parts must be"):
        DecodeSchedule(value_parts=value)


def test_a_schedule_without_parts_keeps_its_dict_and_key():
    plain = BASE.to_dict()
    assert "value_parts" not in plain
    assert DecodeSchedule.from_dict(plain) == BASE  # a row stored before the field
    parted = BASE.replace(value_parts=2)
    assert parted.to_dict() == {**plain, "value_parts": 2}
    assert DecodeSchedule.from_dict(parted.to_dict()) == parted and parted.key != BASE.key
    assert parted.describe() == "split1 n128 m16 occ1 vp2 lat(K2,V2)"


@pytest.mark.parametrize("head_dim, asked, kept", [(128, 4, 4), (64, 4, 4), (32, 4, 2),
                                                   (96, 4, 2), (40, 4, 2), (72, 4, 2)])
def test_normalise_keeps_parts_of_16_columns_that_hold_some_of_the_head_dim(head_dim, asked, kept):
    problem = dataclasses.replace(ROWS, head_dim=head_dim)
    schedule = DECODE.normalise(problem, BASE.replace(value_parts=asked))
    assert schedule.value_parts == kept
    assert DECODE.normalise(problem, schedule) == schedule
    assert split_constants(problem, schedule)["VALUE_PARTS"] == kept


def test_parts_multiply_the_split_grid_and_leave_the_merge_alone():
    for splits in (1, 3):
        one = launches(ROWS, BASE.replace(splits=splits, combine="block"), None)
        two = launches(ROWS, BASE.replace(splits=splits, combine="block", value_parts=2), None)
        assert two.split_grid == (2 * one.split_grid[0], *one.split_grid[1:]) == (160, splits, 1)
        assert two.combine_grid == one.combine_grid  # the partials hold every column
        assert (two.combine is None) == (splits == 1)


def test_an_fp8_cache_a_flat_walk_a_tail_and_an_order_keep_whole_rows():
    fp8 = dataclasses.replace(ROWS, kv_dtype="e4m3")
    assert DECODE.normalise(fp8, BASE.replace(value_parts=2)).value_parts == 1
    flat = DecodeSchedule(flat=True, tile_n=64, value_parts=2)
    assert DECODE.normalise(PAGED, flat).value_parts == 1
    assert DECODE.normalise(PAGED, flat.replace(flat=False)).value_parts == 2
    ordered = DecodeSchedule(tile_n=64, splits=2, longest_first=True, value_parts=2)
    assert DECODE.normalise(PAGED, ordered).value_parts == 1
    big = dataclasses.replace(ROWS, batch=40)  # 320 rows: some past whole waves
    tail = BASE.replace(splits=3, tail_rows=40, value_parts=2)
    kept = DECODE.normalise(big, tail)
    assert kept.tail_rows and kept.value_parts == 1
    assert DECODE.normalise(big, tail.replace(tail_rows=0)).value_parts == 2


def test_the_full_space_searches_parts_but_for_an_fp8_cache():
    full = search_spaces.space_for("decode", "sm_90", "full")
    restrict = search_spaces.DECODE_SPACE.restrict
    assert restrict(full, ROWS).choices["value_parts"] == (1, 2, 4)
    assert "value_parts" not in restrict(full,
                                         dataclasses.replace(ROWS, kv_dtype="e4m3")).choices


def test_parts_reach_the_compiled_code_and_a_capped_count_compiles_alike():
    def digest(problem, schedule):
        return text_digest(DECODE.compile(problem, schedule, "sm_90").cubin)

    assert len({digest(ROWS, BASE.replace(value_parts=n)) for n in (1, 2, 4)}) == 3
    narrow = dataclasses.replace(ROWS, head_dim=32)  # two parts of 16 columns at most
    assert digest(narrow, BASE.replace(value_parts=4)) == digest(narrow,
                                                                 BASE.replace(value_parts=2))


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("problem, schedule", [
    (VARIANT, BASE.replace(value_parts=4)),
    (VARIANT, BASE.replace(splits=3, combine="block_pdl", value_parts=2, key_slices=2,
                           k_transposed=True, exp2=False)),
    (PAGED, BASE.replace(tile_n=64, splits=4, balanced=True, value_parts=2))],
    ids=["variant-one-split", "variant-sliced-kt-exp", "paged16-balanced"])
def test_parted_walks_compile(arch, problem, schedule):
    result = DECODE.compile(problem, schedule, arch)
    assert result.cubin[:4] == b"\x7fELF" and result.arch == arch
