"""``DecodeSchedule.merge_occupancy`` on the CPU: ``normalise`` dropping it where nothing
merges, the search space, and the option reaching the merge kernel's compiled code for every
architecture."""
from __future__ import annotations

import dataclasses

import pytest

import search_spaces
from tiledattention import DECODE, DecodeSchedule
from tiledattention.tooling import text_digest

# 80 rows over a short cache; every variant at once (the merge adds the sinks); a paged batch
from .test_decode_key_slices import ARCHES, PAGED, ROWS, VARIANT

#: the sm_90 default of 80 rows over a short cache (three splits, the block merge)
SPLIT3 = DecodeSchedule(splits=3, combine="block_pdl", tile_n=128, occupancy=2, k_latency=2,
                        v_latency=2)


def test_describe_names_it_after_the_merge():  # the dict and key: test_decode.py
    described = SPLIT3.replace(merge_occupancy=4).describe()
    assert described == "split3/block_pdl/occ4 n128 m16 occ2 lat(K2,V2)"


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
