"""Decode defaults by device (issue 49): two sm_90 rules hold on an H100 only, by the name the
lookup hands them."""

from __future__ import annotations

import pytest

import db
from tiledattention import DECODE, FORWARD, DeviceInfo, Problem
from tiledattention.kernels.decode._defaults import H100_NAMES, default_decode_schedule
from tiledattention.tooling import Resolver, codecs

H100, H200 = H100_NAMES[0], "NVIDIA H200"
ELSEWHERE = ("", H200)


def device(name):
    return DeviceInfo(index=0, arch="sm_90", name=name, sm_count=132)


def decode(batch, heads_q, heads_kv, keys, head_dim, dtype="bf16", **variant):
    return Problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=1, seqlen_k=keys,
                   head_dim=head_dim, dtype=dtype, causal=variant.pop("causal", False), **variant)


# (batch, H_q, H_kv, keys, D): 67-88 rows, D 96-128, under 4000 keys
SHORT_FILL = [(9, 16, 8, 1601, 128), (3, 28, 28, 2201, 128), (11, 56, 8, 3999, 128),
              (17, 16, 4, 900, 112), (4, 20, 20, 1003, 96), (67, 8, 1, 2500, 128)]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("shape", SHORT_FILL)
def test_an_h100_runs_the_fill_rules_short_caches_unsplit(shape, dtype):
    problem = decode(*shape, dtype=dtype)
    rows = shape[0] * shape[2]
    for name in ELSEWHERE:  # the fill rule's splits
        other = default_decode_schedule("sm_90", problem, name)
        assert (other.splits, other.occupancy) == (2 * 132 // rows, 2), (name, other)
    mine = default_decode_schedule("sm_90", problem, H100)
    assert (mine.splits, mine.occupancy, mine.tile_n) == (1, 1, 128), mine


@pytest.mark.parametrize("problem", [
    decode(11, 36, 6, 2000, 128),  # 66 rows: the cache rule's two splits
    decode(89, 8, 1, 2000, 128),  # past the fill rule
    decode(9, 16, 8, 4000, 128),  # the four-CTA form
    decode(9, 16, 8, 1600, 80),  # lost unsplit
    decode(9, 16, 8, 1600, 128, softcap=30.0),
    decode(9, 16, 8, 1600, 128, causal=True, bottom_right=True, window_left=1000),
    decode(9, 16, 8, 1600, 128, ragged=True, page_size=64),
], ids=lambda p: p.describe())
def test_an_h100_keeps_the_default_past_those_bounds(problem):
    assert default_decode_schedule("sm_90", problem, H100) == \
        default_decode_schedule("sm_90", problem)


@pytest.mark.parametrize("shape", [(9, 16, 16, 3000, 64), (17, 64, 8, 5500, 64),
                                   (20, 56, 8, 4401, 48), (28, 42, 7, 5999, 64)])
def test_an_h100_runs_the_short_cache_form_from_past_the_sms(shape):
    problem = decode(*shape)
    mine = default_decode_schedule("sm_90", problem, H100)
    assert (mine.splits, mine.occupancy, mine.tile_n) == (1, 3, 128), mine
    for name in ELSEWHERE:  # from 199 rows there
        other = default_decode_schedule("sm_90", problem, name)
        assert (other.splits, other.occupancy, other.tile_n) == (1, 2, 256), (name, other)


@pytest.mark.parametrize("arch", ["sm_80", "sm_100", "sm_120"])
def test_other_architectures_ignore_the_name(arch):
    problem = decode(*SHORT_FILL[0])
    assert default_decode_schedule(arch, problem, H100) == default_decode_schedule(arch, problem)


def test_the_lookup_hands_the_devices_name_to_the_default():
    problem = DECODE.plan_problem(decode(9, 16, 8, 1601, 128))  # its 2048-key bucket
    table = db.RowTable([], source="shipped", codecs=codecs())
    lookup = Resolver(open_user=lambda: None, open_shipped=lambda arch: table)
    on_h100, on_h200 = (lookup(DECODE, problem, device(name)) for name in (H100, H200))
    assert on_h100.source == on_h200.source == "default"
    assert (on_h100.schedule.splits, on_h100.schedule.occupancy) == (1, 1)
    assert (on_h200.schedule.splits, on_h200.schedule.occupancy) == (3, 2)


def test_a_family_without_device_rules_answers_its_architectures_default():
    problem = Problem(batch=2, heads_q=16, heads_kv=16, seqlen_q=1000, seqlen_k=1000,
                      head_dim=128, dtype="bf16", causal=True)
    assert FORWARD.device_default(device(H100), problem) == \
        FORWARD.default_schedule("sm_90", problem)
