"""``DecodeSchedule.key_slices`` on the CPU: validation, ``normalise``'s bound, the search
space, compiles with every variant (the dict and key of a schedule without slices:
``test_decode.py``)."""
from __future__ import annotations

import dataclasses

import pytest

import search_spaces
from tiledattention import DECODE, DecodeSchedule, Problem, ScheduleError
from tiledattention.kernels.decode._launch import split_constants
from tiledattention.tooling import text_digest

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")
BASE = DecodeSchedule(tile_n=128, k_latency=2, v_latency=2)
#: 80 rows over a short cache
ROWS = Problem(batch=10, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=1201, head_dim=128,
               dtype="bf16", causal=False)
#: every variant at once
VARIANT = Problem(batch=3, heads_q=28, heads_kv=4, seqlen_q=3, seqlen_k=2999, head_dim=96,
                  dtype="fp16", causal=True, bottom_right=True, window_left=700,
                  softcap=30.0, sinks=True)
PAGED = Problem(batch=5, heads_q=16, heads_kv=2, seqlen_q=1, seqlen_k=3000, head_dim=64,
                dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=16)


@pytest.mark.parametrize("value", [0, 3, 16, True, 4.0])
def test_validation_names_the_field(value):
    with pytest.raises(ScheduleError, match=r"DecodeSchedule\.key_slices must be"):
        DecodeSchedule(key_slices=value)


def test_describe_names_the_slices():  # the dict and key: test_decode.py
    assert BASE.replace(key_slices=4).describe() == "split1 n128 m16 occ1 ks4 lat(K2,V2)"


@pytest.mark.parametrize("tile_n, asked, kept", [(16, 2, 1), (32, 8, 2), (64, 8, 4),
                                                  (128, 8, 8), (256, 4, 4)])
def test_normalise_keeps_slices_of_at_least_16_keys(tile_n, asked, kept):
    schedule = DECODE.normalise(ROWS, BASE.replace(tile_n=tile_n, key_slices=asked))
    assert schedule.key_slices == kept
    assert DECODE.normalise(ROWS, schedule) == schedule
    assert split_constants(ROWS, schedule)["KEY_SLICES"] == kept


def test_an_fp8_cache_and_a_flat_walk_fold_whole_tiles():
    fp8 = dataclasses.replace(ROWS, kv_dtype="e4m3")
    assert DECODE.normalise(fp8, BASE.replace(key_slices=4)).key_slices == 1
    flat = DecodeSchedule(flat=True, tile_n=64, key_slices=4)
    assert DECODE.normalise(PAGED, flat).key_slices == 1
    assert DECODE.normalise(PAGED, flat.replace(flat=False)).key_slices == 4


def test_the_full_space_searches_slices_but_for_an_fp8_cache():
    full = search_spaces.space_for("decode", "sm_90", "full")
    restrict = search_spaces.DECODE_SPACE.restrict
    assert restrict(full, ROWS).choices["key_slices"] == (1, 2, 4)
    assert "key_slices" not in restrict(full, dataclasses.replace(ROWS, kv_dtype="e4m3")).choices


def test_slices_reach_the_compiled_code_and_a_capped_count_compiles_alike():
    def digest(schedule):
        return text_digest(DECODE.compile(ROWS, schedule, "sm_90").cubin)

    assert len({digest(BASE.replace(key_slices=w)) for w in (1, 2, 4)}) == 3
    capped = BASE.replace(tile_n=32, key_slices=8)  # two slices of 16
    assert digest(capped) == digest(capped.replace(key_slices=2))


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("problem, schedule", [
    (VARIANT, BASE.replace(key_slices=4)),
    (VARIANT, BASE.replace(splits=3, tail_rows=4, combine="block_pdl", key_slices=2,
                           k_transposed=True, exp2=False)),
    (PAGED, BASE.replace(tile_n=64, splits=4, balanced=True, key_slices=4))],
    ids=["variant-one-split", "variant-tail-kt-exp", "paged16-balanced"])
def test_sliced_walks_compile(arch, problem, schedule):
    result = DECODE.compile(problem, schedule, arch)
    assert result.cubin[:4] == b"\x7fELF" and result.arch == arch
