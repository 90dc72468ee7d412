"""``DecodeSchedule.merge_occupancy`` on the CPU: the dict and key of a schedule without it
unchanged, ``normalise`` dropping it where nothing merges, the search space, and the option
reaching the merge kernel's compiled code for every architecture."""
from __future__ import annotations

import dataclasses

import pytest

import search_spaces
from tiledattention import DECODE, DecodeSchedule, Problem
from tiledattention.tooling import text_digest

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")
#: the sm_90 default of 80 rows over a short cache (three splits, the block merge)
SPLIT3 = DecodeSchedule(splits=3, combine="block_pdl", tile_n=128, occupancy=2, k_latency=2,
                        v_latency=2)
ROWS = Problem(batch=10, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=1201, head_dim=128,
               dtype="bf16", causal=False)
#: every variant at once (the merge adds the sinks)
VARIANT = Problem(batch=3, heads_q=28, heads_kv=4, seqlen_q=3, seqlen_k=2999, head_dim=96,
                  dtype="fp16", causal=True, bottom_right=True, window_left=700,
                  softcap=30.0, sinks=True)
PAGED = Problem(batch=5, heads_q=16, heads_kv=2, seqlen_q=1, seqlen_k=3000, head_dim=64,
                dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=16)


def test_a_schedule_without_it_keeps_its_dict_and_key():
    plain = SPLIT3.to_dict()
    assert "merge_occupancy" not in plain
    assert DecodeSchedule.from_dict(plain) == SPLIT3  # a row stored before the field
    hinted = SPLIT3.replace(merge_occupancy=4)
    assert hinted.to_dict() == {**plain, "merge_occupancy": 4}
    assert DecodeSchedule.from_dict(hinted.to_dict()) == hinted and hinted.key != SPLIT3.key
    assert hinted.describe() == "split3/block_pdl/occ4 n128 m16 occ2 lat(K2,V2)"


def test_normalise_drops_it_where_nothing_merges():
    assert DECODE.normalise(ROWS, SPLIT3.replace(merge_occupancy=4)).merge_occupancy == 4
    assert DECODE.normalise(ROWS, SPLIT3.replace(splits=1, merge_occupancy=4)) == (
        DECODE.normalise(ROWS, SPLIT3.replace(splits=1)))
    flat = DecodeSchedule(flat=True, splits=4, merge_occupancy=4)  # the flat walk's own merge
    assert DECODE.normalise(PAGED, flat).merge_occupancy is None
    assert DECODE.normalise(PAGED, flat.replace(flat=False)).merge_occupancy == 4


def test_the_full_space_searches_it_where_a_call_can_split():
    full = search_spaces.space_for("decode", "sm_90", "full")
    restrict = search_spaces.DECODE_SPACE.restrict
    assert restrict(full, ROWS).choices["merge_occupancy"] == (None, 2, 4)
    short = dataclasses.replace(ROWS, seqlen_k=100)  # too few keys for two splits
    assert "merge_occupancy" not in restrict(full, short).choices


def _merge(problem, schedule, arch):
    result = DECODE.compile(problem, schedule, arch)
    return result.other_cubins[0], result.resources()[1]


@pytest.mark.parametrize("arch", ("sm_90", "sm_100", "sm_120", "sm_121"))
def test_the_block_merge_fits_the_ctas_asked_without_stack(arch):
    registers = 65536
    plain, alone = _merge(ROWS, SPLIT3, arch)
    assert alone.registers * alone.threads > registers // 2  # one CTA an SM
    for occupancy in (2, 4):
        cubin, asked = _merge(ROWS, SPLIT3.replace(merge_occupancy=occupancy), arch)
        assert asked.registers * asked.threads * occupancy <= registers
        assert asked.stack_bytes == 0 and text_digest(cubin) != text_digest(plain)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("problem, schedule", [
    (VARIANT, SPLIT3.replace(combine="pdl", merge_occupancy=2)),
    (VARIANT, SPLIT3.replace(splits=5, tail_rows=4, merge_occupancy=4)),
    (PAGED, DecodeSchedule(splits=4, tile_n=64, balanced=True, combine="block",
                           merge_occupancy=4))],
    ids=["variant-stepping", "variant-tail-block", "paged16-balanced"])
def test_hinted_merges_compile(arch, problem, schedule):
    result = DECODE.compile(problem, schedule, arch)
    assert len(result.other_cubins) == 1 and result.other_cubins[0][:4] == b"\x7fELF"
