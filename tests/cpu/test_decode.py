"""The split-KV decode family on the CPU: compile-only builds for several architectures, every
schedule dimension reaching the compiled code (sm_90 ``.text`` digests), the schedule type, the
query-row layout, normalisation, the per-architecture defaults, the dispatch rule, the cache
length buckets of the decode plans, bottom-right problems, the runtime's bounds, the search
space and a simulated search, and kernel arguments placed by name."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

import db
import search_spaces
import tiledattention
from tiledattention import tooling
from tiledattention import (DECODE, FORWARD, DecodeSchedule, DeviceInfo, InputValueError,
                            KernelArgumentError, Problem, ScheduleError, UnsupportedProblemError,
                            shipped_table)
from tiledattention.tooling import Resolver, Runtime, codecs, text_digest
from tiledattention.kernels.decode import (DISPATCH_RULES, DispatchRule, bucket_problem,
                                           dispatch_rule, length_bucket)
from tiledattention.core._signature import KernelParameters
from tiledattention.kernels.decode import _compile as decode_compile
from tiledattention.kernels.decode import layout
from tiledattention.core._compile import SM_COUNTS
from tiledattention.kernels.decode._defaults import MIN_KEYS_PER_SPLIT
from tiledattention.kernels.decode._kernel import decode_combine
from tiledattention.kernels.decode._launch import (COMBINE_PARAMETERS, SPLIT_PARAMETERS,
                                                   combine_constants, combine_kernel, key_walk,
                                                   launches, normalise, partial_shapes,
                                                   split_constants, split_kernel)
from tiledattention.kernels.decode._schedule import DECODE_SCHEDULE_FORMAT, MAX_SPLITS
from tuner.cli import main

ARCHES = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")

#: group 7 (not a power of two), 3 query positions, a ragged cache, D padded to 128, bottom-right
ODD = Problem(batch=2, heads_q=28, heads_kv=4, seqlen_q=3, seqlen_k=777, head_dim=96,
              dtype="bf16", causal=True, bottom_right=True)
#: Llama-style single-token decode against a long cache: the default splits it 16 ways on sm_90
TOKEN = Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=32768, head_dim=128,
                dtype="bf16", causal=False)


def _problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=4096, head_dim=64,
             dtype="bf16", causal=False, bottom_right=False) -> Problem:
    return Problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q,
                   seqlen_k=seqlen_k, head_dim=head_dim, dtype=dtype, causal=causal,
                   bottom_right=bottom_right)


# -- compile-only builds ------------------------------------------------------------------------
_BUILT: dict = {}


def _build(problem: Problem, schedule: DecodeSchedule, arch: str = "sm_90"):
    """``DECODE.compile``, kept for the module: several tests compare the same builds."""
    key = (problem, schedule, arch)
    if key not in _BUILT:
        _BUILT[key] = DECODE.compile(problem, schedule, arch)
    return _BUILT[key]


def _digest(problem: Problem, schedule: DecodeSchedule, arch: str = "sm_90") -> str:
    return text_digest(_build(problem, schedule, arch).cubin)


@pytest.fixture
def exports(monkeypatch):
    """Every ``export_cubin`` call of ``compile_decode``: (kernel, arch, label, result)."""
    calls = []
    real = decode_compile.export_cubin

    def spy(kernel, args, arch, label):
        result = real(kernel, args, arch, label)
        calls.append((kernel, arch, label, result))
        return result

    monkeypatch.setattr(decode_compile, "export_cubin", spy)
    return calls


@pytest.mark.parametrize("arch", ARCHES)
def test_default_schedule_compiles_for_an_odd_problem(arch, exports):
    schedule = DECODE.default_schedule(arch, ODD)
    assert schedule.splits == 777 // MIN_KEYS_PER_SPLIT  # 777 keys: three splits of >= 256
    tiles = layout(ODD, schedule)
    assert (tiles.view_group, tiles.tile_g, tiles.tile_s) == (7, 8, 4)
    result = DECODE.compile(ODD, schedule, arch)
    assert result.cubin[:4] == b"\x7fELF" and result.arch == arch
    # several splits: the split kernel and the combine kernel are both built
    assert [(k, a) for k, a, _, _ in exports] == [(split_kernel(schedule), arch),
                                                  (combine_kernel(schedule), arch)]
    _BUILT[ODD, schedule, arch] = result


@pytest.mark.parametrize("arch, combine", [("sm_90", "kernel"), ("sm_90", "pdl"),
                                           ("sm_121", "pdl"), ("sm_90", "block"),
                                           ("sm_90", "block_pdl"), ("sm_120", "block_pdl"),
                                           ("sm_80", "block"), ("sm_100", "block"),
                                           ("sm_120", "block"), ("sm_121", "block")])
def test_several_splits_compile_the_split_and_the_combine_kernel(arch, combine, exports):
    default = DECODE.default_schedule("sm_90", TOKEN)
    assert default.splits == 16 and default.combine == "block_pdl"
    schedule = default.replace(combine=combine)
    result = DECODE.compile(TOKEN, schedule, arch)
    assert result.cubin[:4] == b"\x7fELF" and result.arch == arch
    assert [(kernel is decode_combine, a) for kernel, a, _, _ in exports] == [(False, arch),
                                                                              (True, arch)]
    split, combined = exports[0][3], exports[1][3]
    assert "(combine)" in exports[1][2] and "split16/" + combine in exports[0][2]
    assert result.cubin == split.cubin  # the result is the split kernel's cubin ...
    assert combined.cubin[:4] == b"\x7fELF" and combined.cubin != split.cubin
    assert result.seconds == pytest.approx(split.seconds + combined.seconds)  # ... timed as both
    _BUILT[TOKEN, schedule, arch] = result


# -- every dimension reaches the compiled code (sm_90 .text digests) ---------------------------
GQA = _problem()  # S_q = 1, group 4: every split-kernel dimension applies
BASE = DecodeSchedule(tile_n=64)  # one split: one kernel per build
ROWS = _problem(seqlen_q=16, causal=True, bottom_right=True)  # several query positions per tile

#: a paged batch of ten caches (the family's case: mixed lengths up to 1000 keys)
PAGED = Problem(batch=10, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=1000, head_dim=128,
                dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=64)

DIFFERENT = {
    "tile_n": (GQA, BASE, BASE.replace(tile_n=128)),
    "k_latency": (GQA, BASE, BASE.replace(k_latency=2)),
    "v_latency": (GQA, BASE, BASE.replace(v_latency=2)),
    "exp2": (GQA, BASE, BASE.replace(exp2=False)),
    "k_transposed": (GQA, BASE, BASE.replace(k_transposed=True)),
    "occupancy": (GQA, BASE, BASE.replace(occupancy=2)),
    "num_worker_warps": (GQA, BASE, BASE.replace(num_worker_warps=8)),
    # 4 heads x 4 positions against 1 head x 16 positions
    "pack_heads": (ROWS, BASE, BASE.replace(pack_heads=False)),
    "tile_m": (ROWS, BASE, BASE.replace(tile_m=64)),
    # the split kernel signals its dependent launch with PDL
    "combine": (TOKEN, DECODE.default_schedule("sm_90", TOKEN).replace(combine="block"),
                DECODE.default_schedule("sm_90", TOKEN).replace(combine="block_pdl")),
    # a paged batch's splits as long as its longest cache's
    "balanced": (PAGED, DecodeSchedule(splits=4), DecodeSchedule(splits=4, balanced=True)),
}


@pytest.mark.parametrize("problem, a, b", DIFFERENT.values(), ids=DIFFERENT.keys())
def test_each_dimension_changes_the_split_kernels_code(problem, a, b):
    assert DECODE.normalise(problem, a) == a and DECODE.normalise(problem, b) == b
    assert a.key != b.key
    assert _digest(problem, a) != _digest(problem, b)


def test_pack_heads_at_one_position_changes_the_launch_not_the_code():
    """At S_q = 1 both ways fill a 16-row tile (4 heads + 12 padded, or 1 head + 15): the same
    kernel, launched on 8 rows of packed heads or 32 single heads that divide to their K/V head."""
    packed, single = BASE, BASE.replace(pack_heads=False)
    assert DECODE.normalise(GQA, single) == single
    one, other = launches(GQA, packed, None), launches(GQA, single, None)
    assert (one.split_grid, one.tiles.kv_div) == ((8, 1, 1), 1)
    assert (other.split_grid, other.tiles.kv_div) == ((32, 1, 1), 4)
    assert one.split_constants == other.split_constants
    assert _digest(GQA, packed) == _digest(GQA, single)


SAME = {
    "combine_with_one_split": (GQA, BASE, BASE.replace(combine="pdl")),
    # S_q = 1, group 8: 8 heads padded to a 16-row tile either way
    "tile_m_one_position": (_problem(heads_q=64), BASE, BASE.replace(tile_m=64)),
}


@pytest.mark.parametrize("problem, a, b", SAME.values(), ids=SAME.keys())
def test_schedules_with_one_normalised_value_compile_the_same_code(problem, a, b):
    assert a != b
    assert DECODE.normalise(problem, a) == DECODE.normalise(problem, b)
    # not only normalise's doing: the kernel sees the same constants un-normalised too
    assert split_constants(problem, a) == split_constants(problem, b)
    assert layout(problem, a) == layout(problem, b)
    assert _digest(problem, a) == _digest(problem, b)


# -- DecodeSchedule ------------------------------------------------------------------------------
TOGGLED = DecodeSchedule(splits=16, combine="pdl", merge_occupancy=4, balanced=True,
                         tail_rows=5, flat=True, longest_first=True, tile_n=256, tile_m=128,
                         key_slices=8, pack_heads=False, occupancy=2, num_worker_warps=8,
                         k_latency=3, v_latency=10, k_transposed=True, exp2=False)


@pytest.mark.parametrize("field, value, message", [
    ("splits", 0, "DecodeSchedule.splits must be in 1..256"),
    ("splits", 257, "DecodeSchedule.splits must be in 1..256"),
    ("splits", True, "DecodeSchedule.splits must be an int"),
    ("splits", 2.0, "DecodeSchedule.splits must be an int"),
    ("combine", "x", "DecodeSchedule.combine must be one of"),
    ("tail_rows", -1, "DecodeSchedule.tail_rows must be in 0..1048576"),
    ("tail_rows", 1.5, "DecodeSchedule.tail_rows must be an int"),
    ("tile_n", 48, "DecodeSchedule.tile_n must be one of"),
    ("tile_n", 512, "DecodeSchedule.tile_n must be one of"),
    ("tile_m", 8, "DecodeSchedule.tile_m must be one of"),
    ("tile_m", 256, "DecodeSchedule.tile_m must be one of"),
    ("occupancy", 0, "DecodeSchedule.occupancy must be in 1..32"),
    ("occupancy", 33, "DecodeSchedule.occupancy must be in 1..32"),
    ("merge_occupancy", 0, "DecodeSchedule.merge_occupancy must be in 1..32 or None"),
    ("merge_occupancy", 33, "DecodeSchedule.merge_occupancy must be in 1..32 or None"),
    ("merge_occupancy", True, "DecodeSchedule.merge_occupancy must be an int"),
    ("merge_occupancy", 4.0, "DecodeSchedule.merge_occupancy must be an int"),
    ("num_worker_warps", 2, "DecodeSchedule.num_worker_warps must be one of"),
    ("k_latency", 0, "DecodeSchedule.k_latency must be in 1..10"),
    ("v_latency", 11, "DecodeSchedule.v_latency must be in 1..10"),
    ("pack_heads", 1, "DecodeSchedule.pack_heads must be a bool"),
    ("k_transposed", 0, "DecodeSchedule.k_transposed must be a bool"),
    ("exp2", 1, "DecodeSchedule.exp2 must be a bool"),
])
def test_validation_names_the_field(field, value, message):
    with pytest.raises(ScheduleError, match=message.replace(".", r"\.")):
        DecodeSchedule(**{field: value})
    with pytest.raises(ScheduleError, match=message.replace(".", r"\.")):
        DecodeSchedule().replace(**{field: value})


def test_every_extreme_value_is_accepted():
    for splits in (1, MAX_SPLITS):
        DecodeSchedule(splits=splits)
    for n, m in itertools.product((16, 32, 64, 128, 256), (16, 32, 64, 128)):
        DecodeSchedule(tile_n=n, tile_m=m)
    DecodeSchedule(num_worker_warps=4, k_latency=1, v_latency=10, occupancy=32)


@pytest.mark.parametrize("schedule", [DecodeSchedule(), TOGGLED], ids=["default", "toggled"])
def test_round_trip_through_dict_json_and_the_family_codec(schedule):
    data = schedule.to_dict()
    assert data["format"] == DECODE_SCHEDULE_FORMAT == 1
    assert DecodeSchedule.from_dict(data) == schedule
    assert DecodeSchedule.from_dict(dict(reversed(list(data.items())))) == schedule
    assert DecodeSchedule.from_dict({k: v for k, v in data.items() if k != "format"}) == schedule
    assert DECODE.schedule_type is DecodeSchedule
    assert DECODE.codec().schedule(data) == schedule
    assert DECODE.codec().schedule(schedule.to_json()) == schedule


#: a value off the default of each field a schedule leaves out of its dict at the default
OMITTED = {"balanced": True, "tail_rows": 5, "flat": True, "longest_first": True,
           "key_slices": 4, "merge_occupancy": 4}


@pytest.mark.parametrize("name", list(OMITTED))
def test_a_field_added_since_keeps_the_dict_and_key_of_a_schedule_not_using_it(name):
    assert set(OMITTED) == set(DecodeSchedule.OMITTED_AT_DEFAULT)
    base = DecodeSchedule(splits=3, tile_n=128, k_latency=2, v_latency=2)
    plain = base.to_dict()
    assert name not in plain  # a row stored before the field: the same dict and key
    using = base.replace(**{name: OMITTED[name]})
    assert using.to_dict() == {**plain, name: OMITTED[name]} and using.key != base.key
    assert DecodeSchedule.from_dict(using.to_dict()) == using


def test_from_dict_rejects_unknown_fields_newer_formats_and_non_mappings():
    data = DecodeSchedule().to_dict()
    with pytest.raises(ScheduleError, match=r"unknown decode schedule field\(s\) \['tile_k'\]"):
        DecodeSchedule.from_dict({**data, "tile_k": 64})
    for version in (DECODE_SCHEDULE_FORMAT + 1, "1", None):
        with pytest.raises(ScheduleError, match="newer than this tiledattention understands"):
            DecodeSchedule.from_dict({**data, "format": version})
    with pytest.raises(ScheduleError, match="must be a mapping; got list"):
        DecodeSchedule.from_dict([("splits", 2)])
    with pytest.raises(ScheduleError, match="DecodeSchedule.splits"):
        DecodeSchedule.from_dict({**data, "splits": 0})


def test_key_is_stable_and_distinguishes_every_field():
    # pinned: keys name trials in studies and rows; a changed dict form must be deliberate
    assert DecodeSchedule().key == DecodeSchedule().key == "246e1f6d8f28"
    assert len(TOGGLED.key) == 12 and int(TOGGLED.key, 16) >= 0
    keys = {DecodeSchedule().key}
    toggled = [f.name for f in dataclasses.fields(DecodeSchedule)]
    for name in toggled:
        keys.add(DecodeSchedule().replace(**{name: getattr(TOGGLED, name)}).key)
    assert len(keys) == 1 + len(toggled)  # TOGGLED changes every field; each changes the key


def test_describe():
    assert DecodeSchedule().describe() == "split1 n64 m16 occ1"
    assert DecodeSchedule(splits=16, combine="pdl", tile_n=128, occupancy=2, k_latency=2,
                          v_latency=2).describe() == "split16/pdl n128 m16 occ2 lat(K2,V2)"
    assert DecodeSchedule(splits=1, combine="pdl").describe() == "split1 n64 m16 occ1"
    assert TOGGLED.describe() == "flat n256 m128 occ2 unpacked ks8 w8 lat(K3,V10) Kt exp"
    assert TOGGLED.replace(flat=False).describe() == (
        "split16/pdl/occ4/bal/tail5/longest n256 m128 occ2 unpacked ks8 w8 lat(K3,V10) Kt exp")
    assert DecodeSchedule(v_latency=3).describe().endswith("lat(K-,V3)")


# -- layout -------------------------------------------------------------------------------------
def test_group_of_four_at_one_position_is_padded_to_sixteen_rows():
    tiles = layout(_problem(batch=3), DecodeSchedule())
    assert tiles == (8, 4, 1, 16, 1, 1, 24)  # heads 4 padded to a 16-row tile
    assert (tiles.view_heads, tiles.view_group, tiles.kv_div) == (8, 4, 1)
    assert (tiles.tile_g, tiles.tile_s, tiles.tile_m, tiles.rows) == (16, 1, 16, 24)


def test_group_of_seven_packs_into_eight_heads_by_as_many_positions_as_fit():
    assert layout(ODD, DecodeSchedule(tile_m=32))[:7] == (4, 7, 1, 8, 4, 1, 8)
    assert layout(ODD, DecodeSchedule(tile_m=16)) == (4, 7, 1, 8, 2, 2, 2 * 4 * 2)
    assert layout(ODD, DecodeSchedule(tile_m=128)).tile_s == 4  # never past S_q's power of two
    assert layout(ODD, DecodeSchedule(tile_m=16)).tile_m == 16


def test_unpacked_heads_get_one_head_per_tile_and_divide_to_their_kv_head():
    tiles = layout(ODD, DecodeSchedule(pack_heads=False, tile_m=16))
    assert (tiles.view_heads, tiles.view_group, tiles.kv_div) == (28, 1, 7)
    assert (tiles.tile_g, tiles.tile_s, tiles.q_tiles, tiles.rows) == (4, 4, 1, 2 * 28)
    one = layout(_problem(), DecodeSchedule(pack_heads=False))
    assert (one.view_heads, one.view_group, one.kv_div, one.tile_g, one.tile_s) == (32, 1, 4,
                                                                                    16, 1)


def test_many_positions_make_several_query_tiles():
    p = _problem(batch=2, seqlen_q=100)
    tiles = layout(p, DecodeSchedule(tile_m=64))
    assert (tiles.tile_g, tiles.tile_s, tiles.q_tiles, tiles.rows) == (4, 16, 7, 2 * 8 * 7)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def test_layout_invariants_over_many_problems_and_schedules():
    rng = random.Random(7)
    for _ in range(3000):
        heads_kv = rng.choice((1, 2, 8))
        p = _problem(batch=rng.choice((1, 3)), heads_kv=heads_kv,
                     heads_q=heads_kv * rng.choice((1, 2, 3, 4, 7, 8, 16, 32, 64)),
                     seqlen_q=rng.choice((1, 2, 3, 5, 16, 17, 100, 1000)))
        s = DecodeSchedule(tile_m=rng.choice((16, 32, 64, 128)),
                           pack_heads=rng.random() < 0.7)
        t = layout(p, s)
        assert t.tile_m == t.tile_g * t.tile_s >= 16
        assert _pow2(t.tile_g) and _pow2(t.tile_s) and t.tile_g >= t.view_group
        assert t.tile_s <= 1 << (p.seqlen_q - 1).bit_length()
        assert (t.q_tiles - 1) * t.tile_s < p.seqlen_q <= t.q_tiles * t.tile_s
        assert t.rows == p.batch * t.view_heads * t.q_tiles
        assert t.view_heads * t.view_group == p.heads_q
        # view head h reads K/V head h // kv_div: every K/V head, each by a whole group
        assert {h // t.kv_div for h in range(t.view_heads)} == set(range(p.heads_kv))
        assert t.view_heads // p.heads_kv * t.view_group == p.group_size
        # no more rows than asked for, unless one position of the packed heads needs more
        assert t.tile_m <= max(s.tile_m, t.tile_g, 16)


# -- normalise ----------------------------------------------------------------------------------
def _random_schedules(rng: random.Random, count: int) -> list[DecodeSchedule]:
    return [DecodeSchedule(splits=rng.choice((1, 1, 2, 3, 16)), combine=rng.choice(("kernel",
                                                                                   "pdl")),
                           tile_n=rng.choice((64, 128)), tile_m=rng.choice((16, 32, 64, 128)),
                           pack_heads=rng.random() < 0.5, occupancy=rng.choice((1, 2)),
                           k_latency=rng.choice((None, 2)), k_transposed=rng.random() < 0.5,
                           balanced=rng.random() < 0.5)
            for _ in range(count)]


NORMALISE_PROBLEMS = {
    "token_gqa": _problem(),
    "token_mqa": _problem(heads_q=32, heads_kv=1),
    "odd": ODD,
    "rows": ROWS,
    "long_q": _problem(seqlen_q=200, heads_q=8),
}


@pytest.mark.parametrize("problem", NORMALISE_PROBLEMS.values(), ids=NORMALISE_PROBLEMS.keys())
def test_normalise_is_idempotent_and_keeps_what_the_kernels_see(problem):
    canonical = DecodeSchedule()
    changed_somewhere = set()
    for s in _random_schedules(random.Random(11), 300):
        n = DECODE.normalise(problem, s)
        assert DECODE.normalise(problem, n) == n
        changed = {f.name for f in dataclasses.fields(s) if getattr(n, f.name) != getattr(s,
                                                                                    f.name)}
        assert changed <= {"combine", "tile_m", "pack_heads", "balanced"}
        assert not n.balanced  # none of these is a ragged batch
        if not changed:
            assert n is s
        changed_somewhere |= changed
        # combine: canonical exactly when there is one split
        assert (n.combine == canonical.combine) if s.splits == 1 else (n.combine == s.combine)
        # tile_m: the smallest value that tiles the rows the same way
        alike = [m for m in (16, 32, 64, 128)
                 if layout(problem, s.replace(tile_m=m)) == layout(problem, s)]
        assert n.tile_m == alike[0]
        # what is launched is unchanged
        assert layout(problem, n) == layout(problem, s)
        assert split_constants(problem, n) == split_constants(problem, s)
        if s.splits > 1:
            assert combine_constants(problem, n) == combine_constants(problem, s)
        assert launches(problem, s, None) == launches(problem, n, None)
    assert "combine" in changed_somewhere


def test_normalise_on_hand_picked_cases():
    one = DecodeSchedule(combine="pdl", tile_m=64)
    assert DECODE.normalise(_problem(), one) == DecodeSchedule()  # S_q = 1: m64 tiles as m16
    assert DECODE.normalise(ROWS, one) == DecodeSchedule(tile_m=64)  # 16 positions: it does not
    several = DecodeSchedule(splits=4, combine="pdl")
    assert DECODE.normalise(_problem(), several) is several


@pytest.mark.parametrize("problem, a, b", [
    (_problem(heads_q=8, heads_kv=8), DecodeSchedule(), DecodeSchedule(pack_heads=False)),
    (_problem(heads_q=64, seqlen_q=4), DecodeSchedule(tile_m=32), DecodeSchedule(tile_m=64)),
], ids=["pack_heads_mha", "tile_m_32_64"])
def test_schedules_whose_launches_are_identical_normalise_to_one_schedule(problem, a, b):
    assert layout(problem, a) == layout(problem, b)
    assert split_constants(problem, a) == split_constants(problem, b)
    assert launches(problem, a, None) == launches(problem, b, None)
    assert DECODE.normalise(problem, a) == DECODE.normalise(problem, b)


# -- defaults -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100", "sm_120"])
@pytest.mark.parametrize("problem", [ODD, TOKEN, _problem(head_dim=256, seqlen_q=16)],
                         ids=["odd", "token", "d256_q16"])
def test_defaults_validate_and_are_normalised(arch, problem):
    s = DECODE.default_schedule(arch, problem)
    assert s.validate() is s
    assert DECODE.normalise(problem, s) == s
    # keys three steps ahead for a D 128 split alone on its SM over 32k+ keys (Hopper)
    k_latency = 3 if arch == "sm_90" and problem is TOKEN else 2
    assert s.pack_heads and (s.k_latency, s.v_latency) == (k_latency, 2)
    # one split: no merge; on Hopper up to D 128 the block merge as a dependent launch
    merge = "block_pdl" if arch == "sm_90" and problem.head_dim <= 128 else "block"
    assert s.combine == (merge if s.splits > 1 else "kernel")
    assert s.tile_n == (64 if problem.head_dim > 128 else 128)
    # the packed group's rows fit one tile, up to 128 rows
    tiles = layout(problem, s)
    assert tiles.q_tiles == 1 or tiles.tile_m == 128


@pytest.mark.parametrize("arch, splits", [("sm_90", 16), ("sm_100", 18), ("sm_120", 6),
                                          ("sm_121", 6), ("sm_80", 13), ("sm_89", 16)])
def test_default_splits_fill_one_wave(arch, splits):
    assert DECODE.default_schedule(arch, TOKEN).splits == splits  # 8 CTAs per split


def test_the_device_default_counts_the_devices_own_sms():
    """An RTX 5090 (sm_120, 170 SMs) splits for its SMs, not the generation's 48; an H100 or
    H200 (132) runs what sm_90's default runs; no SM count known: the generation's."""
    rtx = DeviceInfo(index=0, arch="sm_120", name="NVIDIA GeForce RTX 5090", sm_count=170)
    assert DECODE.device_default(rtx, TOKEN).splits == 170 // 8  # 8 CTAs a split
    unknown = dataclasses.replace(rtx, sm_count=0)
    assert DECODE.device_default(unknown, TOKEN) == DECODE.default_schedule("sm_120", TOKEN)
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        hopper = DeviceInfo(index=0, arch="sm_90", name=name, sm_count=SM_COUNTS["hopper"])
        for b, sk, d in itertools.product((1, 10, 20, 40, 90), (1201, 8192, 20000), (64, 128)):
            p = _problem(batch=b, seqlen_k=sk, head_dim=d)
            assert DECODE.device_default(hopper, p) == DECODE.device_default(
                dataclasses.replace(hopper, sm_count=0), p)


def test_a_default_split_that_fills_the_gpu_runs_two_ctas_an_sm():
    """At least a CTA per SM from one split runs occupancy 2 (on an H200 at 144-768 CTAs:
    1.01-1.57x at 8 of 9 batches, 0.98x at one), windows over a contiguous cache as well; fewer
    CTAs, and windows over a paged cache (not measured), keep one an SM."""
    full = DECODE.default_schedule("sm_90", _problem(batch=20, seqlen_k=3000, head_dim=128))
    assert (full.splits, full.occupancy, full.k_latency, full.tile_n) == (1, 2, 2, 128)  # 160
    # (172-264 rows at D 128 run three CTAs an SM: the three-CTA rule's test below)
    fewer = DECODE.default_schedule("sm_90", _problem(batch=12, seqlen_k=8192,
                                                      head_dim=128))  # 96 CTAs
    assert (fewer.splits, fewer.occupancy) == (1, 1)
    assert DECODE.default_schedule("sm_90", TOKEN).occupancy == 1  # 16 splits of 8 CTAs
    wide = _problem(batch=64, seqlen_k=3000)  # 512 CTAs: a CTA per SM everywhere
    assert DECODE.default_schedule("sm_100", wide).occupancy == 2  # 228 KB an SM, as Hopper
    for arch in ("sm_80", "sm_120"):  # less shared memory an SM: one CTA
        assert DECODE.default_schedule(arch, wide).occupancy == 1
    windowed = dataclasses.replace(wide, causal=True, bottom_right=True, window_left=1000,
                                   window_right=0)  # a contiguous cache's window: as its keys
    assert DECODE.default_schedule("sm_90", windowed).occupancy == 2
    paged_window = dataclasses.replace(windowed, ragged=True, page_size=256)
    assert DECODE.default_schedule("sm_90", paged_window).occupancy == 1


def test_rows_leaving_a_third_of_the_sms_idle_split_for_two_ctas_an_sm():
    """A contiguous 16-bit cache whose rows leave more than a third of the SMs idle at one
    split (and fewer than one split a CTA an SM would fill) splits for two CTAs an SM (on an
    H200 1.12-1.57x at 68-88 rows on nine of ten calls); 96 rows keep one split at one an SM
    (unless they walk 256-key steps: 1.04-1.24x at 96-120 rows), as do generations that fit
    one CTA an SM; a window over a contiguous cache counts its keys as such a cache."""
    from tiledattention.kernels.decode._defaults import FILL_MAX_ROWS_SHARE, FULL_GPU_OCCUPANCY

    assert FILL_MAX_ROWS_SHARE * 132 >= 88
    # (caches short of FILL_FOURTH_CTA_MIN_KEYS: longer ones split for four CTAs an SM)
    for batch, splits in ((9, 3), (11, 3), (10, 3)):  # 72, 88 and 80 rows of H 32/8
        s = DECODE.default_schedule("sm_90", _problem(batch=batch, seqlen_k=3500,
                                                      head_dim=128))
        assert (s.splits, s.occupancy, s.combine) == (splits, FULL_GPU_OCCUPANCY, "block_pdl")
        assert s.splits * batch * 8 <= FULL_GPU_OCCUPANCY * 132  # every CTA resident at once
    short = DECODE.default_schedule("sm_90", _problem(batch=10, seqlen_k=300,
                                                      head_dim=128))  # too short to split
    assert (short.splits, short.occupancy) == (1, 1)
    one = DECODE.default_schedule("sm_90", _problem(batch=12, seqlen_k=9000,
                                                    head_dim=128))  # 96 rows (a short cache)
    assert (one.splits, one.occupancy) == (1, 1)
    two = DECODE.default_schedule("sm_90", _problem(batch=6, seqlen_k=3500,
                                                    head_dim=128))  # 48 rows: the rule's two
    # splits fill 96 SMs, a fifth or more idle (FILL_MAX_CTAS_SHARE): two CTAs an SM too
    assert (two.splits, two.occupancy) == (5, FULL_GPU_OCCUPANCY)
    # 256-key steps (D 64, 2k keys or more): any idle SM; two splits of 96-128 rows
    for batch in (12, 16):
        s = DECODE.default_schedule("sm_90", _problem(batch=batch, heads_q=64, seqlen_k=6000))
        assert (s.tile_n, s.splits, s.occupancy) == (256, 2, FULL_GPU_OCCUPANCY)
    short = DECODE.default_schedule("sm_90", _problem(batch=12, heads_q=64, seqlen_k=1500))
    assert (short.splits, short.occupancy) == (1, 1)  # unsplit short of 2k keys
    windowed = dataclasses.replace(_problem(batch=10, seqlen_k=12000, head_dim=128),
                                   causal=True, bottom_right=True, window_left=7999,
                                   window_right=0)  # 80 rows over a window of 8000 keys
    window_default = DECODE.default_schedule("sm_90", windowed)
    assert (window_default.splits, window_default.occupancy) == (3, FULL_GPU_OCCUPANCY)
    assert DECODE.default_schedule("sm_80", _problem(batch=10, seqlen_k=12000)).splits == 1


def test_the_cache_rules_splits_short_of_the_sms_split_for_two_ctas_an_sm():
    """Where the cache rule's two or more splits fill at most ``FILL_MAX_CTAS_SHARE`` of the
    SMs at one CTA an SM (45-51 rows at two splits, 34 at three on an H200), the call splits for
    two CTAs an SM (1.03-1.07x on six held-out calls); 52-66 rows, 33 rows (four splits fill
    the SMs), D 256, windows and Ampere keep the rule's splits."""
    from tiledattention.kernels.decode._defaults import FILL_MAX_CTAS_SHARE, FULL_GPU_OCCUPANCY

    assert 102 <= FILL_MAX_CTAS_SHARE * 132 < 104
    for batch in (45, 48, 51, 34):  # multi-query rows: one a batch entry
        s = DECODE.default_schedule("sm_90", _problem(batch=batch, heads_q=8, heads_kv=1,
                                                      seqlen_k=3500, head_dim=128))
        assert (s.splits, s.occupancy) == (FULL_GPU_OCCUPANCY * 132 // batch,
                                           FULL_GPU_OCCUPANCY), (batch, s)
    for batch in (52, 66, 33):
        s = DECODE.default_schedule("sm_90", _problem(batch=batch, heads_q=8, heads_kv=1,
                                                      seqlen_k=3500, head_dim=128))
        assert (s.splits, s.occupancy) == (132 // batch, 1), (batch, s)
    base = _problem(batch=6, heads_q=64, heads_kv=8, seqlen_k=3500, head_dim=128)  # 48 rows
    assert DECODE.default_schedule("sm_90", base).occupancy == FULL_GPU_OCCUPANCY
    for p in (dataclasses.replace(base, head_dim=256),  # (an FP8 cache has a rule of its own)
              dataclasses.replace(base, seqlen_k=12000, causal=True, bottom_right=True,
                                  window_left=8000, window_right=0)):
        s = DECODE.default_schedule("sm_90", p)
        assert s.splits != FULL_GPU_OCCUPANCY * 132 // 48, (p, s)
    assert DECODE.default_schedule("sm_80", base).occupancy == 1


def test_d128_fill_splits_run_one_wave_of_four_ctas_an_sm(monkeypatch):
    """Hopper, D 128, 16-row tiles, a contiguous 16-bit cache of ``FILL_FOURTH_CTA_MIN_KEYS``
    keys or more that the fill rules split for two CTAs an SM (34, 45-51 and 67-88 rows):
    4 x SMs // rows splits at four CTAs an SM, 32-key steps, loads four ahead, merged as a
    dependent, no stack, where each split takes ``FILL_FOURTH_CTA_SPLIT_KEYS`` keys or more,
    twice that past ``FILL_FOURTH_CTA_FEW_SPLITS`` splits (34-51 rows; H100 and H200, sections
    55-56 of the issue-49 record). Shorter caches or splits, rows the cache rule's splits fill
    (52-66, 96), D 96 and 64, windows, softcaps, paged and FP8 caches and the other
    generations keep theirs."""
    from tiledattention.kernels.decode import _defaults
    from tiledattention.kernels.decode._defaults import (FILL_FOURTH_CTA_FEW_SPLITS,
                                                         FILL_FOURTH_CTA_MIN_KEYS,
                                                         FILL_FOURTH_CTA_SPLIT_KEYS,
                                                         FOURTH_CTA_LATENCY,
                                                         FOURTH_CTA_OCCUPANCY, FOURTH_CTA_STEP)

    assert (FILL_FOURTH_CTA_MIN_KEYS, FILL_FOURTH_CTA_SPLIT_KEYS) == (4000, 512)
    assert (FILL_FOURTH_CTA_FEW_SPLITS, FOURTH_CTA_STEP, FOURTH_CTA_LATENCY) == (8, 32, 4)
    for batch, heads_q, heads_kv, keys, dtype, rows in (
            (9, 64, 8, 43094, "bf16", 72), (10, 32, 8, FILL_FOURTH_CTA_MIN_KEYS, "bf16", 80),
            (25, 8, 2, 35000, "fp16", 50), (34, 8, 1, 15 * 1024, "bf16", 34),
            (67, 8, 1, 7 * 512 + 500, "bf16", 67), (48, 8, 1, 11 * 1024, "fp16", 48),
            (88, 8, 1, 12000, "fp16", 88), (3, 48, 16, 20000, "bf16", 48)):
        p = _problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_k=keys,
                     head_dim=128, dtype=dtype)
        s = DECODE.default_schedule("sm_90", p)
        assert (s.splits, s.occupancy, s.tile_n, s.k_latency, s.v_latency, s.combine) == (
            4 * 132 // rows, FOURTH_CTA_OCCUPANCY, 32, 4, 4, "block_pdl"), (p.describe(), s)
    split = _build(p, s).resources()[0]  # the split kernel
    assert split.stack_bytes == 0 and FOURTH_CTA_OCCUPANCY * split.shared_bytes <= 228 * 1024
    base = _problem(batch=9, heads_q=64, heads_kv=8, seqlen_k=25000, head_dim=128)
    # 80 rows: split for two CTAs an SM on sm_100's 148 SMs too
    hopper = (dataclasses.replace(base, seqlen_k=FILL_FOURTH_CTA_MIN_KEYS - 1),
              _problem(batch=34, heads_q=8, heads_kv=1, seqlen_k=15 * 1024 - 1, head_dim=128),
              _problem(batch=48, heads_q=8, heads_kv=1, seqlen_k=11 * 1024 - 1, head_dim=128),
              dataclasses.replace(base, head_dim=96), dataclasses.replace(base, head_dim=64),
              dataclasses.replace(base, batch=7), dataclasses.replace(base, batch=12),
              _window(base, 20000), *_outside_the_wave_rules(base)[2:])
    others = [(arch, p) for arch in ("sm_80", "sm_100", "sm_120")
              for p in (base, dataclasses.replace(base, batch=10, heads_q=32))]
    others += [("sm_90", p) for p in hopper]
    kept = [DECODE.default_schedule(arch, p) for arch, p in others]
    assert all(s.occupancy != FOURTH_CTA_OCCUPANCY for s in kept), kept
    monkeypatch.setattr(_defaults, "FILL_FOURTH_CTA_MIN_KEYS", 1 << 30)  # the rule off
    assert kept == [DECODE.default_schedule(arch, p) for arch, p in others]
    assert DECODE.default_schedule("sm_90", base).occupancy == 2


def _window(base: Problem, keys: int) -> Problem:
    """``base`` with a sliding window of ``keys`` keys at the cache's end."""
    return dataclasses.replace(base, causal=True, bottom_right=True, window_left=keys - 1,
                               window_right=0)


def _outside_the_wave_rules(base: Problem, window: bool = True) -> tuple:
    """``base`` as the calls the one-split wave rules leave as they were: a cache shorter than
    ``PART_WAVE_MIN_KEYS``, a softcap, a paged cache, an FP8 cache, and a window (with
    ``window`` False, for the occupancy rules, which take windows: a window of fewer keys than
    ``PART_WAVE_MIN_KEYS`` and a window with a softcap)."""
    from tiledattention.kernels.decode._defaults import PART_WAVE_MIN_KEYS

    windows = ((_window(base, 4001),) if window
               else (_window(base, PART_WAVE_MIN_KEYS - 1),
                     dataclasses.replace(_window(base, 4001), softcap=30.0)))
    return (dataclasses.replace(base, seqlen_k=PART_WAVE_MIN_KEYS - 1), *windows,
            dataclasses.replace(base, softcap=30.0),
            dataclasses.replace(base, causal=True, bottom_right=True, ragged=True, page_size=64),
            dataclasses.replace(base, kv_dtype="e4m3"))


def _default_fits_without_stack(problem: Problem, ctas: int) -> None:
    """The sm_90 default's split kernel for ``problem``, compiled on the CPU, keeps no stack
    and fits ``ctas`` CTAs an SM in shared memory (tileiras keeps the stages they can hold)."""
    (split,) = DECODE.compile(problem, DECODE.default_schedule("sm_90", problem),
                              "sm_90").resources()
    assert split.stack_bytes == 0 and ctas * split.shared_bytes <= 228 * 1024, split


def test_rows_just_past_a_wave_of_two_ctas_an_sm_split_in_three():
    """Rows past one wave of two CTAs an SM by at most ``PART_WAVE_MAX_SHARE`` of it (265-330
    on an H200) over a contiguous 16-bit cache of ``PART_WAVE_MIN_KEYS`` keys or more take
    ``PART_WAVE_SPLITS`` splits (1.004-1.142x one on eight held-out calls); a whole wave (264
    rows) and 352 keep one split (at three CTAs an SM: the next test's rule); 512 rows, 400 at
    D 96, short caches, D 256, windows, softcaps, paged and FP8 caches one split at two CTAs an
    SM."""
    from tiledattention.kernels.decode._defaults import (FULL_GPU_OCCUPANCY,
                                                         PART_WAVE_MAX_SHARE, PART_WAVE_SPLITS)

    assert PART_WAVE_SPLITS == 3 and 330 <= PART_WAVE_MAX_SHARE * 264 < 352
    for batch in (34, 36, 41):  # 272, 288 and 328 rows of H 32/8
        for head_dim in (64, 96, 128):
            s = DECODE.default_schedule("sm_90", _problem(batch=batch, seqlen_k=5000,
                                                          head_dim=head_dim))
            assert (s.splits, s.occupancy, s.combine) == (3, FULL_GPU_OCCUPANCY,
                                                          "block_pdl"), (batch, head_dim, s)
    base = _problem(batch=34, seqlen_k=5000, head_dim=128)
    for p in (_problem(batch=64, seqlen_k=5000, head_dim=128),  # 512 rows
              _problem(batch=50, seqlen_k=5000, head_dim=96),  # 400 rows at D 96
              dataclasses.replace(base, head_dim=256),
              *_outside_the_wave_rules(base)):
        s = DECODE.default_schedule("sm_90", p)
        assert s.splits == 1 and s.occupancy == FULL_GPU_OCCUPANCY, (p.describe(), s)
    for batch in (33, 44):  # 264 rows (one whole wave) and 352: one split, three CTAs an SM
        s = DECODE.default_schedule("sm_90", _problem(batch=batch, seqlen_k=5000, head_dim=128))
        assert s.splits == 1, (batch, s)
    assert DECODE.default_schedule("sm_80", base).splits == 1  # one CTA an SM: no such wave


def test_short_heads_split_for_one_cta_an_sm_take_twice_the_splits_at_two(monkeypatch):
    """Hopper, D <= 64 over a contiguous 16-bit cache of ``SHORT_HEAD_SPLIT_MIN_KEYS`` keys or
    more: where the cache rule splits for one CTA an SM (8 rows or more), twice the splits at
    two CTAs an SM (section 53 of the issue-49 record). D 128, shorter caches, fewer rows,
    windows, softcaps, paged and FP8 caches and other generations keep their schedules."""
    from tiledattention.kernels.decode import _defaults
    from tiledattention.kernels.decode._defaults import (FULL_GPU_OCCUPANCY,
                                                         SHORT_HEAD_SPLIT_MIN_KEYS,
                                                         SHORT_HEAD_SPLIT_MIN_ROWS)

    assert (SHORT_HEAD_SPLIT_MIN_KEYS, SHORT_HEAD_SPLIT_MIN_ROWS) == (9000, 8)
    for (b, hq, hkv, keys, d), splits in (((16, 28, 4, 10293, 64), 4), ((4, 24, 3, 58109, 64), 22),
                                          ((1, 64, 8, 131072, 64), 32),
                                          ((2, 32, 4, SHORT_HEAD_SPLIT_MIN_KEYS, 48), 32)):
        p = _problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_k=keys, head_dim=d)
        s = DECODE.default_schedule("sm_90", p)
        assert (s.splits, s.occupancy, s.combine) == (splits, FULL_GPU_OCCUPANCY, "block_pdl"), (
            p.describe(), s)
    base = _problem(batch=16, heads_q=28, heads_kv=4, seqlen_k=30000, head_dim=64)
    others = [(arch, base) for arch in ("sm_80", "sm_100", "sm_120")] + [
        ("sm_90", p) for p in (dataclasses.replace(base, head_dim=128),
                               *_outside_the_wave_rules(base)[1:])]
    for p, splits in ((dataclasses.replace(base, seqlen_k=SHORT_HEAD_SPLIT_MIN_KEYS - 1), 2),
                      (dataclasses.replace(base, batch=3, heads_q=24, heads_kv=2), 22)):  # 6 rows
        s = DECODE.default_schedule("sm_90", p)
        assert (s.splits, s.occupancy) == (splits, 1), (p.describe(), s)
    kept = [DECODE.default_schedule(arch, p) for arch, p in others]
    monkeypatch.setattr(_defaults, "SHORT_HEAD_SPLIT_MIN_KEYS", 1 << 30)  # the rule off
    assert kept == [DECODE.default_schedule(arch, p) for arch, p in others]
    assert DECODE.default_schedule("sm_90", base).occupancy == 1


def test_d128_splits_over_long_caches_load_keys_three_steps_ahead(monkeypatch):
    """Hopper, D 128 split at one CTA an SM over a contiguous 16-bit cache of
    ``LONG_SPLIT_MIN_KEYS`` keys or more: keys loaded ``LONG_SPLIT_K_LATENCY`` steps ahead,
    values two, no stack (section 54 of the issue-49 record). Shorter caches, D 96, one split,
    two CTAs an SM, windows, softcaps, paged and FP8 caches and other generations keep theirs."""
    from tiledattention.kernels.decode import _defaults
    from tiledattention.kernels.decode._defaults import LONG_SPLIT_K_LATENCY, LONG_SPLIT_MIN_KEYS

    assert (LONG_SPLIT_K_LATENCY, LONG_SPLIT_MIN_KEYS) == (3, 32768)
    for b, hq, hkv, keys in ((4, 32, 8, 65792), (14, 16, 4, 70000), (1, 64, 8, LONG_SPLIT_MIN_KEYS)):
        p = _problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_k=keys, head_dim=128)
        s = DECODE.default_schedule("sm_90", p)
        assert (s.k_latency, s.v_latency, s.occupancy, s.splits > 1) == (3, 2, 1, True), s
    assert _build(p, s).resources()[0].stack_bytes == 0  # the split kernel
    base = _problem(batch=4, heads_q=32, heads_kv=8, seqlen_k=65792, head_dim=128)
    others = [(arch, base) for arch in ("sm_80", "sm_100", "sm_120")] + [("sm_90", p) for p in (
        dataclasses.replace(base, seqlen_k=LONG_SPLIT_MIN_KEYS - 1),
        dataclasses.replace(base, head_dim=96), _problem(7, 64, 16, seqlen_k=60000, head_dim=128),
        _problem(6, 32, 8, seqlen_k=60000, head_dim=128), *_outside_the_wave_rules(base)[1:])]
    kept = [DECODE.default_schedule(arch, p) for arch, p in others]
    assert all(s.k_latency != 3 for s in kept), kept
    monkeypatch.setattr(_defaults, "LONG_SPLIT_MIN_KEYS", 1 << 30)  # the rule off
    assert kept == [DECODE.default_schedule(arch, p) for arch, p in others]
    assert DECODE.default_schedule("sm_90", base).k_latency == 2


def test_rows_just_past_the_sms_run_one_wave_and_split_the_rest():
    """Hopper, D <= 128: rows past the SMs by at most ``PART_FILL_MAX_ROWS_SHARE`` of them
    (133-198; at D 128 short of the three-CTA band, 133-171) over a contiguous 16-bit cache of
    ``PART_FILL_MIN_KEYS`` keys or more run one wave of a CTA an SM unsplit and split the rows
    past it (in whole batch entries) to fill a second, merged as a dependent (1.025-1.084x on
    six held-out calls, H100). A tail whose splits fill fewer than half the SMs, or that
    whole entries round up past twice the rows past the SMs, and 32-row tiles keep the rule
    before: ``PART_FILL_SPLITS`` splits at two CTAs an SM below D 128, one split at D 128.
    132 rows, the bands' ends, short caches, windows, softcaps, paged and FP8 caches and
    other generations keep their schedules."""
    from tiledattention.kernels.decode._defaults import (FULL_GPU_OCCUPANCY,
                                                         PART_FILL_MAX_ROWS_SHARE,
                                                         PART_FILL_MIN_KEYS, PART_FILL_SPLITS)

    assert PART_FILL_SPLITS == 3 and 198 <= PART_FILL_MAX_ROWS_SHARE * 132 < 200
    # (batch, heads_q, heads_kv, keys, head dim) -> (tail rows, splits)
    for (b, hq, hkv, keys, d), want in (((12, 12, 12, 21851, 128), (12, 8)),
                                        ((150, 8, 1, PART_FILL_MIN_KEYS, 128), (18, 7)),
                                        ((13, 12, 12, 33000, 128), (24, 5)),
                                        ((171, 8, 1, 9000, 128), (39, 3)),
                                        ((17, 40, 10, 9000, 80), (40, 3)),
                                        ((46, 24, 4, 8000, 64), (52, 2)),
                                        ((198, 8, 1, 12000, 96), (66, 2)),
                                        ((145, 16, 1, 8000, 48), (13, 8))):
        p = _problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_k=keys, head_dim=d)
        s = DECODE.default_schedule("sm_90", p)
        assert ((s.tail_rows, s.splits), s.occupancy, s.combine) == (want, 1, "block_pdl"), (
            p.describe(), s)
    before = {64: (PART_FILL_SPLITS, FULL_GPU_OCCUPANCY), 128: (1, FULL_GPU_OCCUPANCY)}
    for b, hq, hkv in ((35, 16, 4), (34, 32, 4), (3, 48, 48), (1, 144, 144), (7, 40, 20),
                       (150, 32, 1)):
        for d in before:  # 4-8 rows past in 8 splits; tails rounded up; 32-row tiles
            p = _problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_k=30000, head_dim=d)
            s = DECODE.default_schedule("sm_90", p)
            assert (s.tail_rows, (s.splits, s.occupancy)) == (0, before[d]), (p.describe(), s)
    base = _problem(batch=18, heads_q=64, heads_kv=8, seqlen_k=30000, head_dim=64)
    for p in (dataclasses.replace(base, batch=25),  # 200 rows
              dataclasses.replace(base, batch=22, head_dim=128),  # 176: three CTAs an SM
              dataclasses.replace(base, batch=33, heads_q=128, heads_kv=4),  # 132
              dataclasses.replace(base, seqlen_k=PART_FILL_MIN_KEYS - 1),
              *_outside_the_wave_rules(base)[1:]):
        assert DECODE.default_schedule("sm_90", p).tail_rows == 0, p.describe()
    for arch in ("sm_80", "sm_100", "sm_120"):
        assert DECODE.default_schedule(arch, base).tail_rows == 0, arch


def test_short_caches_at_short_heads_past_the_sms_run_three_or_four_ctas_an_sm():
    """Hopper, D 33-64, a contiguous 16-bit cache of ``SHORT_CACHE_MIN_KEYS`` up to
    ``PART_WAVE_MIN_KEYS`` keys (within a wave of two CTAs an SM past
    ``SHORT_CACHE_WAVE_MIN_ROWS_SHARE`` of the SMs, 199-264 rows, up to
    ``SHORT_CACHE_WAVE_MAX_KEYS``; no window or softcap), rows past the SMs: one split, 128-key
    steps, no stack, three CTAs an SM to a wave of three (133-396 rows), four to a wave of four
    (397-528). 132 and 529 rows, D 128 or 32, other caches, windows, softcaps, pages, FP8
    caches and the other generations keep their schedules."""
    from tiledattention.kernels.decode._defaults import (FOURTH_CTA_OCCUPANCY, PART_WAVE_MIN_KEYS,
                                                         SHORT_CACHE_MIN_KEYS,
                                                         SHORT_CACHE_WAVE_MAX_KEYS,
                                                         THIRD_CTA_OCCUPANCY)

    assert (THIRD_CTA_OCCUPANCY, FOURTH_CTA_OCCUPANCY) == (3, 4)
    for batch, heads_q, heads_kv, head_dim, keys, dtype, ctas in (
            (133, 8, 1, 64, SHORT_CACHE_MIN_KEYS, "bf16", 3), (24, 32, 8, 64, 1098, "fp16", 3),
            (75, 16, 4, 48, 2000, "bf16", 3), (33, 48, 12, 64, PART_WAVE_MIN_KEYS - 1, "fp16", 3),
            (397, 8, 1, 64, 1000, "bf16", 4), (200, 14, 2, 64, 950, "fp16", 4),
            (44, 36, 12, 48, 2999, "bf16", 4), (528, 8, 1, 64, 800, "fp16", 4),
            # within a wave of two CTAs an SM, caches up to SHORT_CACHE_WAVE_MAX_KEYS
            (25, 40, 8, 64, 3266, "bf16", 3), (199, 8, 1, 48, 4400, "fp16", 3),
            (264, 8, 1, 64, 5999, "bf16", 3)):
        p = _problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_k=keys,
                     head_dim=head_dim, dtype=dtype)
        s = DECODE.default_schedule("sm_90", p)
        assert (s.splits, s.occupancy, s.tile_n) == (1, ctas, 128), (p.describe(), s)
    base = _problem(batch=192, heads_q=8, heads_kv=1, seqlen_k=1500, head_dim=64)
    _default_fits_without_stack(base, 3)
    _default_fits_without_stack(dataclasses.replace(base, batch=500), 4)
    for p in (dataclasses.replace(base, batch=132), dataclasses.replace(base, batch=529),
              dataclasses.replace(base, head_dim=128), dataclasses.replace(base, head_dim=32),
              dataclasses.replace(base, seqlen_k=SHORT_CACHE_MIN_KEYS - 1),
              dataclasses.replace(base, seqlen_k=SHORT_CACHE_WAVE_MAX_KEYS),
              dataclasses.replace(base, batch=198, seqlen_k=PART_WAVE_MIN_KEYS),
              dataclasses.replace(base, batch=265, seqlen_k=PART_WAVE_MIN_KEYS),
              dataclasses.replace(base, batch=500, seqlen_k=PART_WAVE_MIN_KEYS),
              dataclasses.replace(base, seqlen_k=PART_WAVE_MIN_KEYS, head_dim=96),
              _window(base, 1000),
              *_outside_the_wave_rules(base)[2:]):
        assert DECODE.default_schedule("sm_90", p).occupancy not in (3, 4), p.describe()
    for arch in ("sm_80", "sm_100", "sm_120"):
        assert DECODE.default_schedule(arch, base).occupancy != 3, arch


def test_rows_short_of_a_wave_or_within_a_third_cta_run_three_ctas_an_sm():
    """One split at two CTAs an SM over a contiguous 16-bit cache of at least
    ``PART_WAVE_MIN_KEYS`` keys at D 128 (16-row tiles, no window or softcap) whose rows fill
    between ``THIRD_CTA_MIN_ROWS_SHARE`` of the SMs and two CTAs each (172-264 on an H200), or
    fit three CTAs an SM past the three-split rule's rows (331-396), runs three CTAs an SM
    with 64-key steps, loads two ahead (1.035-1.196x the two-CTA default on ten held-out calls);
    160 rows, 397-580 and 661 and more (the next test's), the three-split rule's rows, short
    caches, D 64 and 96, short or capped windows, softcaps, pages, FP8 caches and the other
    generations keep their schedules (windows of enough keys: the window test below)."""
    from tiledattention.kernels.decode._defaults import (THIRD_CTA_MIN_ROWS_SHARE,
                                                         THIRD_CTA_OCCUPANCY, THIRD_CTA_STEP)

    assert 160 < THIRD_CTA_MIN_ROWS_SHARE * 132 <= 176
    # 176, 264, 196 (multi-query), 232 (one query head a K/V head), 352, 360 and 392 rows
    for batch, heads_q, heads_kv in ((22, 32, 8), (33, 32, 8), (196, 8, 1), (29, 8, 8),
                                     (44, 32, 8), (45, 32, 8), (49, 32, 8)):
        for dtype in ("bf16", "fp16"):
            p = _problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_k=5000,
                         head_dim=128, dtype=dtype)
            s = DECODE.default_schedule("sm_90", p)
            assert (s.splits, s.occupancy, s.tile_n, s.k_latency, s.v_latency) == (
                1, THIRD_CTA_OCCUPANCY, THIRD_CTA_STEP, 2, 2), (p.describe(), s)
    base = _problem(batch=24, seqlen_k=5000, head_dim=128)  # 192 rows
    assert DECODE.default_schedule("sm_90", base).occupancy == THIRD_CTA_OCCUPANCY
    for p in (_problem(batch=20, seqlen_k=5000, head_dim=128),  # 160 rows
              _problem(batch=50, seqlen_k=5000, head_dim=128),  # 400 rows
              _problem(batch=68, seqlen_k=5000, head_dim=128),  # 544 rows
              _problem(batch=88, seqlen_k=5000, head_dim=128),  # 704 rows
              _problem(batch=36, seqlen_k=5000, head_dim=128),  # 288 rows: three splits
              # (D 64 short of 6000 keys: the short-cache rule's three CTAs, 128-key steps)
              dataclasses.replace(base, head_dim=64, seqlen_k=6000),
              dataclasses.replace(base, head_dim=96),
              dataclasses.replace(base, seqlen_q=8),  # 32-row tiles
              *_outside_the_wave_rules(base, window=False)):
        s = DECODE.default_schedule("sm_90", p)
        assert s.occupancy != THIRD_CTA_OCCUPANCY, (p.describe(), s)
    wide = _problem(batch=30, seqlen_k=5000, head_dim=128)  # 240 rows: in the band on sm_100 too
    for arch in ("sm_80", "sm_100", "sm_120"):
        for p in (base, wide):
            assert DECODE.default_schedule(arch, p).occupancy != THIRD_CTA_OCCUPANCY, arch
    # three CTAs an SM fit without stack on sm_90
    _default_fits_without_stack(base, THIRD_CTA_OCCUPANCY)


def test_rows_past_a_wave_of_three_run_four_ctas_or_a_second_wave_of_three():
    """Past a wave of three CTAs an SM the same calls (one split at D 128 over a contiguous
    16-bit cache of ``PART_WAVE_MIN_KEYS`` keys or more) run one wave of four CTAs an SM with
    32-key steps, loads four ahead, up to ``FOURTH_CTA_MAX_ROWS_SHARE`` of the SMs (397-495 on
    an H200: 1.022-1.039x on five held-out calls); from ``THIRD_CTA_SECOND_WAVE_ROWS_SHARES``
    (581-660: a third wave of two at most half full) three CTAs an SM again (1.047-1.096x on
    four). 496-580 rows (two waves of two and a few CTAs: 0.963x at 544), 661 and more, four
    CTAs' rows at D 64 and 96, short or capped windows, softcaps, pages, FP8 caches and the
    other generations keep two CTAs an SM."""
    from tiledattention.kernels.decode._defaults import (
        FOURTH_CTA_LATENCY, FOURTH_CTA_MAX_ROWS_SHARE, FOURTH_CTA_OCCUPANCY, FOURTH_CTA_STEP,
        FULL_GPU_OCCUPANCY, THIRD_CTA_OCCUPANCY, THIRD_CTA_SECOND_WAVE_ROWS_SHARES,
        THIRD_CTA_STEP)

    assert 488 <= FOURTH_CTA_MAX_ROWS_SHARE * 132 < 512
    low, high = THIRD_CTA_SECOND_WAVE_ROWS_SHARES
    assert 568 <= low * 132 < 584 and high * 132 == 660
    four = (1, FOURTH_CTA_OCCUPANCY, FOURTH_CTA_STEP, FOURTH_CTA_LATENCY, FOURTH_CTA_LATENCY)
    three = (1, THIRD_CTA_OCCUPANCY, THIRD_CTA_STEP, 2, 2)
    assert four == (1, 4, 32, 4, 4)
    # 400, 440 and 488 rows of H 32/8, 472 multi-query, 462 of groups of 7; 584, 600 and 656
    # rows, 620 multi-query
    for batch, heads_q, heads_kv, want in ((50, 32, 8, four), (55, 32, 8, four),
                                           (61, 32, 8, four), (472, 8, 1, four),
                                           (66, 49, 7, four), (73, 32, 8, three),
                                           (75, 32, 8, three), (82, 32, 8, three),
                                           (620, 8, 1, three)):
        for dtype in ("bf16", "fp16"):
            p = _problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_k=5000,
                         head_dim=128, dtype=dtype)
            s = DECODE.default_schedule("sm_90", p)
            assert (s.splits, s.occupancy, s.tile_n, s.k_latency, s.v_latency) == want, (
                p.describe(), s)
    four_base = _problem(batch=55, seqlen_k=5000, head_dim=128)  # 440 rows
    three_base = _problem(batch=75, seqlen_k=5000, head_dim=128)  # 600 rows
    for p in (_problem(batch=62, seqlen_k=5000, head_dim=128),  # 496 rows
              _problem(batch=66, seqlen_k=5000, head_dim=128),  # 528 rows: two waves of two
              _problem(batch=68, seqlen_k=5000, head_dim=128),  # 544
              _problem(batch=71, seqlen_k=5000, head_dim=128),  # 568
              _problem(batch=83, seqlen_k=5000, head_dim=128),  # 664
              _problem(batch=99, seqlen_k=5000, head_dim=128),  # 792
              *(dataclasses.replace(four_base, head_dim=d) for d in (64, 96)),
              *_outside_the_wave_rules(four_base, window=False),
              *_outside_the_wave_rules(three_base, window=False)):
        s = DECODE.default_schedule("sm_90", p)
        assert s.occupancy in (1, FULL_GPU_OCCUPANCY) and s.tile_n != 32, (p.describe(), s)
    for arch in ("sm_80", "sm_100", "sm_120"):
        for p in (four_base, three_base):
            assert DECODE.default_schedule(arch, p).occupancy in (1, FULL_GPU_OCCUPANCY), arch
    # four CTAs an SM fit without stack on sm_90
    _default_fits_without_stack(four_base, FOURTH_CTA_OCCUPANCY)


def test_shorter_heads_run_three_ctas_an_sm_past_a_wave_of_two():
    """At D 33-127 the three-CTA rule's rows past the three-split rule's (331-396 on an H200)
    and past two waves of two (581-660) run three CTAs an SM, with
    ``THIRD_CTA_SHORT_HEAD_STEP``-key steps at D <= 64 and 64-key steps above (1.150-1.256x and
    1.030-1.090x on ten held-out calls); their rows short of a wave of two (172-264: 0.91-1.06x
    held out), four CTAs' rows, D 32 and below, D 129 and above, caches too short for the
    short-cache rule (its own test), short or capped windows, softcaps, pages, FP8 caches and
    the other generations keep their schedules."""
    from tiledattention.kernels.decode._defaults import (FULL_GPU_OCCUPANCY, SHORT_CACHE_MIN_KEYS,
                                                         SHORT_HEAD_DIM, THIRD_CTA_OCCUPANCY,
                                                         THIRD_CTA_SHORT_HEAD_STEP,
                                                         THIRD_CTA_STEP)

    assert THIRD_CTA_SHORT_HEAD_STEP == 128 and SHORT_HEAD_DIM == 64
    # 344 rows (H 16/4), 392 (H 32/8) and 600 (H 32/8), 640 multi-query
    for batch, heads_q, heads_kv in ((86, 16, 4), (49, 32, 8), (75, 32, 8), (640, 8, 1)):
        for head_dim, step in ((48, 128), (64, 128), (80, 64), (96, 64), (112, 64)):
            p = _problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_k=5000,
                         head_dim=head_dim, dtype="fp16" if batch % 2 else "bf16")
            s = DECODE.default_schedule("sm_90", p)
            assert (s.splits, s.occupancy, s.tile_n, s.k_latency, s.v_latency) == (
                1, THIRD_CTA_OCCUPANCY, step, 2, 2), (p.describe(), s)
    assert THIRD_CTA_STEP == 64
    base = _problem(batch=45, seqlen_k=5000, head_dim=64)  # 360 rows
    for p in (_problem(batch=27, seqlen_k=6000, head_dim=64),  # 216 rows (shorter: short-cache)
              _problem(batch=30, seqlen_k=5000, head_dim=96),  # 240 rows
              _problem(batch=55, seqlen_k=5000, head_dim=96),  # 440 rows
              _problem(batch=55, seqlen_k=5000, head_dim=64),
              _problem(batch=68, seqlen_k=5000, head_dim=64),  # 544 rows
              _problem(batch=88, seqlen_k=5000, head_dim=96),  # 704 rows
              dataclasses.replace(base, head_dim=32),
              dataclasses.replace(base, head_dim=160),
              dataclasses.replace(base, head_dim=256),
              # a shorter cache at D 64 takes the short-cache rule down to SHORT_CACHE_MIN_KEYS
              dataclasses.replace(base, seqlen_k=SHORT_CACHE_MIN_KEYS - 1),
              *_outside_the_wave_rules(base, window=False)[1:]):
        s = DECODE.default_schedule("sm_90", p)
        assert s.occupancy in (1, FULL_GPU_OCCUPANCY), (p.describe(), s)
    for arch in ("sm_80", "sm_100", "sm_120"):
        assert DECODE.default_schedule(arch, base).occupancy in (1, FULL_GPU_OCCUPANCY), arch
    # three CTAs an SM fit without stack on sm_90 with 128-key steps at D 64
    _default_fits_without_stack(base, THIRD_CTA_OCCUPANCY)


def test_windows_over_a_contiguous_cache_take_the_occupancy_bands():
    """A sliding window of at least ``PART_WAVE_MIN_KEYS`` keys over a longer contiguous cache
    (no softcap) takes the three- and four-CTA bands as a cache of the window's keys does
    (1.021-1.216x on ten calls of 192-640 rows, D 64 and 128); its rows counted as a cache's,
    its keys the window's: a window of fewer keys over the same cache keeps two CTAs an SM."""
    from tiledattention.kernels.decode._defaults import PART_WAVE_MIN_KEYS

    # 192 and 352 rows (three CTAs), 440 (four), 600 (three), D 64 at 360 (three, 128 keys)
    for batch, head_dim, want in ((24, 128, (3, 64, 2)), (44, 128, (3, 64, 2)),
                                  (55, 128, (4, 32, 4)), (75, 128, (3, 64, 2)),
                                  (45, 64, (3, 128, 2))):
        for cache in (8192, 20000):
            p = _window(_problem(batch=batch, seqlen_k=cache, head_dim=head_dim), 4096)
            s = DECODE.default_schedule("sm_90", p)
            assert (s.splits, s.occupancy, s.tile_n, s.k_latency) == (1, *want), (
                p.describe(), s)
            unwindowed = DECODE.default_schedule("sm_90", _problem(
                batch=batch, seqlen_k=4096, head_dim=head_dim))
            assert (s.occupancy, s.tile_n) == (unwindowed.occupancy, unwindowed.tile_n)
            short = _window(_problem(batch=batch, seqlen_k=cache, head_dim=head_dim),
                            PART_WAVE_MIN_KEYS - 1)
            assert DECODE.default_schedule("sm_90", short).occupancy == 2, short.describe()


def test_last_wave_rows_split_to_fill_it_at_head_dims_below_128():
    """One split at two CTAs an SM at D 33-127 whose rows pass whole waves of two (264 rows a
    wave on an H200) by at most ``TAIL_MAX_WAVE_SHARE`` of a wave splits only those last rows,
    in as many splits as fill the wave (2-8): 1.023-1.148x one split on ten held-out calls. A
    whole number of waves, a larger remainder, the three-CTA bands, D 128 and D 32, short
    caches, softcaps, paged and FP8 caches, and Ampere keep their schedules; a window of 3000
    keys or more takes it as a cache of its keys."""
    from tiledattention.kernels.decode._defaults import TAIL_MAX_SPLITS, TAIL_MAX_WAVE_SHARE

    assert TAIL_MAX_SPLITS == 8 and 105 <= TAIL_MAX_WAVE_SHARE * 264 < 106
    # (rows, head_dim, rows past whole waves, splits): rows = batch x 8 K/V heads
    for rows, head_dim, tail, splits in ((536, 64, 8, 8), (552, 48, 24, 8), (568, 96, 40, 6),
                                         (576, 80, 48, 5), (896, 64, 104, 2),
                                         (800, 96, 8, 8), (1072, 64, 16, 8)):
        p = _problem(batch=rows // 8, seqlen_k=5000, head_dim=head_dim)
        s = DECODE.default_schedule("sm_90", p)
        assert (s.splits, s.tail_rows, s.occupancy, s.combine, s.tile_n) == (
            splits, tail, 2, "block_pdl", 256 if head_dim <= 64 else 128), (rows, head_dim, s)
        plan = launches(p, s, None)
        whole = rows - tail
        assert plan.split_grid == (whole + tail * splits, 1, 1), plan.split_grid
        assert (plan.whole_rows, plan.whole_batches, plan.combine_grid[0]) == (
            whole, whole // 8, tail)
        tile_d = 64 if head_dim <= 64 else 128
        assert partial_shapes(plan) == ((tail, splits, 16, tile_d), (tail * splits * 16,))
        windowed = _window(_problem(batch=rows // 8, seqlen_k=20000, head_dim=head_dim), 4096)
        assert DECODE.default_schedule("sm_90", windowed).tail_rows == tail, windowed.describe()
    # whole batch entries: 800 rows of 16 K/V heads pass three waves by 8, half an entry
    s = DECODE.default_schedule("sm_90", _problem(batch=50, heads_kv=16, seqlen_k=5000))
    assert (s.tail_rows, s.splits) == (16, 8), s
    # 528 (two whole waves), 640 (three CTAs an SM), 688 (160 past), 600 at D 32 and D 128
    for rows, head_dim in ((528, 64), (640, 64), (688, 96), (544, 32), (544, 128), (800, 128)):
        s = DECODE.default_schedule("sm_90", _problem(batch=rows // 8, seqlen_k=5000,
                                                      head_dim=head_dim))
        assert s.tail_rows == 0 and s.splits == 1, (rows, head_dim, s)
    base = _problem(batch=67, seqlen_k=5000, head_dim=64)  # 536 rows
    for p in _outside_the_wave_rules(base, window=False):
        assert DECODE.default_schedule("sm_90", p).tail_rows == 0, p.describe()
    for arch in ("sm_80", "sm_100", "sm_120"):
        assert DECODE.default_schedule(arch, base).tail_rows == 0, arch


def test_only_the_tail_rows_split_and_their_partials_alone_are_kept():
    """``tail_rows``: normalised away with one split, when it covers every row, and for a
    ragged batch (not measured); its CTAs a one-dimensional grid of the whole rows and the
    tail's splits; the kernels carry it as ``TAIL`` (with sinks, the split kernel adds those of
    the unsplit rows: ``SINKS``); it compiles for every architecture."""
    p = _problem(batch=67, seqlen_k=5000, head_dim=64)  # 536 rows
    tail = DecodeSchedule(splits=4, tail_rows=8, occupancy=2, combine="block_pdl", tile_n=256)
    assert normalise(p, tail) == tail
    assert normalise(p, tail.replace(splits=1)).tail_rows == 0
    assert normalise(p, tail.replace(tail_rows=536)) == tail.replace(tail_rows=0)
    assert normalise(p, tail.replace(tail_rows=529)) == tail.replace(tail_rows=0)
    assert normalise(p, tail.replace(tail_rows=3)).tail_rows == 8  # whole entries of 8 rows
    paged = dataclasses.replace(p, causal=True, bottom_right=True, ragged=True, page_size=64)
    assert normalise(paged, tail).tail_rows == 0
    assert split_constants(p, tail)["TAIL"] and not split_constants(p, tail)["DIRECT"]
    assert not split_constants(p, tail.replace(tail_rows=0))["TAIL"]
    sinks = dataclasses.replace(p, sinks=True)
    assert split_constants(sinks, tail)["SINKS"] and combine_constants(sinks, tail)["SINKS"]
    assert not split_constants(sinks, tail.replace(tail_rows=0))["SINKS"]
    for arch in ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121"):
        result = DECODE.compile(sinks, tail, arch)
        assert result.cubin[:4] == b"\x7fELF" and len(result.other_cubins) == 1, arch
    assert _digest(p, tail) != _digest(p, tail.replace(tail_rows=0))


def test_rows_alone_on_their_sms_walk_256_key_steps_one_load_ahead():
    """Rows above the fill rule's share up to ``DEEP_STEP_MAX_ROWS_SHARE`` of the SMs (89-102
    on an H200: one split, each CTA alone on its SM) over a contiguous 16-bit cache of at least
    ``DEEP_STEP_MIN_KEYS`` keys at D 65-128 walk 256-key steps with loads one ahead (1.00-1.07x
    on 15 calls); the rest (below) keep their schedules. On Hopper at D 128 over
    ``DEEP_STEP_SPLIT_MIN_KEYS`` keys: one wave of three CTAs an SM (1.007-1.141x, H100)."""
    from tiledattention.kernels.decode._defaults import DEEP_STEP_MIN_KEYS, DEEP_STEP_SPLIT_MIN_KEYS

    for batch, heads_kv, d in ((89, 1, 128), (23, 4, 128), (12, 8, 128), (102, 1, 96)):
        p = _problem(batch=batch, heads_q=4 * heads_kv, heads_kv=heads_kv, seqlen_k=9000,
                     head_dim=d)
        s = DECODE.default_schedule("sm_90", p)
        assert (s.tile_n, s.k_latency, s.v_latency, s.splits, s.occupancy) == (
            256, 1, 1, 1, 1), (p, s)
    deep = _problem(batch=12, seqlen_k=9000, head_dim=128)  # 96 rows of H 32/8
    for p in (_problem(batch=11, seqlen_k=9000, head_dim=128),  # 88 rows: the fill rule's
              _problem(batch=13, seqlen_k=9000, head_dim=128),  # 104 rows
              dataclasses.replace(deep, seqlen_k=DEEP_STEP_MIN_KEYS - 1),
              dataclasses.replace(deep, head_dim=256),
              dataclasses.replace(deep, seqlen_q=8),  # 32-row tiles
              dataclasses.replace(deep, softcap=30.0),
              dataclasses.replace(deep, causal=True, bottom_right=True, window_left=4000,
                                  window_right=0),
              dataclasses.replace(deep, kv_dtype="e4m3"),
              dataclasses.replace(deep, causal=True, bottom_right=True, ragged=True,
                                  page_size=256)):
        s = DECODE.default_schedule("sm_90", p)
        assert (s.tile_n, s.k_latency) != (256, 1), (p, s)
    assert DECODE.default_schedule("sm_80", deep).tile_n == 128
    d64 = DECODE.default_schedule("sm_90", dataclasses.replace(deep, head_dim=64))
    assert (d64.tile_n, d64.splits) == (256, 2)  # the short heads' rule
    # on Hopper at D 128 over DEEP_STEP_SPLIT_MIN_KEYS keys or more: a wave of three CTAs an SM
    keys = DEEP_STEP_SPLIT_MIN_KEYS
    for batch, heads_kv, splits in ((12, 8, 4), (89, 1, 4), (101, 1, 3), (34, 3, 3)):
        p = _problem(batch=batch, heads_q=4 * heads_kv, heads_kv=heads_kv, seqlen_k=keys,
                     head_dim=128)
        s = DECODE.default_schedule("sm_90", p)
        assert (s.splits, s.occupancy, s.tile_n, s.combine) == (splits, 3, 64, "block_pdl"), s
    for arch, p in (("sm_90", dataclasses.replace(deep, seqlen_k=keys - 1)),
                    ("sm_90", dataclasses.replace(deep, seqlen_k=4 * keys, head_dim=96)),
                    ("sm_100", _problem(batch=14, seqlen_k=keys, head_dim=128))):  # 112 rows
        s = DECODE.default_schedule(arch, p)
        assert (s.tile_n, s.splits) == (256, 1), (arch, p, s)


def test_short_head_caches_alone_on_their_sms_walk_256_key_steps():
    """D 33-64 caches of 900-2047 keys, one split, each CTA alone on its SM (89-131 rows on
    Hopper): 256-key steps (1.08-1.14x on an H200); nothing else."""
    from tiledattention.kernels.decode._defaults import SHORT_HEAD_ALONE_MIN_KEYS as least

    for b, hkv, sk, d in ((12, 8, least, 64), (131, 1, 2047, 48), (89, 1, 1500, 64)):
        p = _problem(batch=b, heads_q=4 * hkv, heads_kv=hkv, seqlen_k=sk, head_dim=d)
        s = DECODE.default_schedule("sm_90", p)
        assert (s.tile_n, s.splits, s.occupancy, s.k_latency) == (256, 1, 1, 2), (p, s)
    p = _problem(batch=12, seqlen_k=1200)
    for change in ({"batch": 11}, {"batch": 17}, {"seqlen_k": least - 1}, {"head_dim": 32},
                   {"head_dim": 80}, {"softcap": 30.0}):
        q = dataclasses.replace(p, **change)
        assert DECODE.default_schedule("sm_90", q).tile_n == 128, change
    assert DECODE.default_schedule("sm_100", p).tile_n == 128


def test_short_heads_walk_256_key_steps_over_a_contiguous_cache():
    """D <= 64 over a contiguous 16-bit cache of 2k keys or more, on Hopper and data-centre
    Blackwell: 256-key steps (on an H200 1.04-1.12x the 128-key ones at D 64, batch 1-32), a
    window of 2k keys or more too; D 128, short caches and windows, pages, FP8 caches and the
    generations with less shared memory (none measured with them) keep their steps."""
    for arch in ("sm_80", "sm_90", "sm_100", "sm_120"):
        for b, hq, hkv, sk, d in ((1, 16, 16, 20000, 64), (8, 32, 8, 4096, 64),
                                  (8, 16, 16, 2048, 64), (1, 32, 8, 9000, 32)):
            p = _problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_k=sk, head_dim=d)
            step = 256 if arch in ("sm_90", "sm_100") else 128
            assert DECODE.default_schedule(arch, p).tile_n == step, (arch, p)
    assert DECODE.default_schedule("sm_90", _problem(seqlen_k=2047)).tile_n == 128
    assert DECODE.default_schedule("sm_90", _problem(head_dim=128)).tile_n == 128
    windowed = dataclasses.replace(_problem(seqlen_k=32768), causal=True, bottom_right=True,
                                   window_left=4095, window_right=0)  # counted by its keys
    assert DECODE.default_schedule("sm_90", windowed).tile_n == 256
    narrow = dataclasses.replace(windowed, window_left=1023)
    assert DECODE.default_schedule("sm_90", narrow).tile_n == 128
    paged = dataclasses.replace(_problem(seqlen_k=8192, batch=8, causal=True, bottom_right=True),
                                ragged=True, page_size=256)
    assert DECODE.default_schedule("sm_90", paged).tile_n == 128
    fp8 = dataclasses.replace(_problem(seqlen_k=8192), kv_dtype="e4m3")
    assert DECODE.default_schedule("sm_90", fp8).tile_n == 128


def test_the_combine_merges_at_most_2048_rows_into_an_output_row():
    """One or two K/V heads would take a wave of splits (66-132); the default merges at most
    2048 rows of partials into an output row, what one block merge holds (on an H200, one K/V
    head: twice the 1024-row cap's splits, block-merged, 1.63x and 1.57x)."""
    for hq, hkv, sk, d, splits in ((8, 1, 50000, 64, 128), (64, 1, 32768, 128, 32),
                                   (32, 1, 65536, 64, 64), (16, 2, 30000, 128, 66),
                                   (32, 8, 32768, 128, 16)):
        p = _problem(heads_q=hq, heads_kv=hkv, seqlen_k=sk, head_dim=d)
        s = DECODE.default_schedule("sm_90", p)
        assert s.splits == splits and s.splits * layout(p, s).tile_m <= 2048, (p, s)
    fp8 = dataclasses.replace(_problem(heads_q=64, heads_kv=1, seqlen_k=65536), kv_dtype="e4m3")
    assert DECODE.default_schedule("sm_90", fp8).splits * 64 <= 2048


def test_the_default_merges_every_split_of_a_row_from_one_block():
    """``combine="block"``: one load of all of a row's splits (padded to a power of two), the
    columns per CTA shrunk so the tile holds at most 8192 values (at least 4 columns, 16
    bytes); past 2048 merged rows ``normalise`` sends it to the stepping merge; one split
    has no merge. On an H200: 1.011-1.348x the stepping merge on ten calls."""
    p = _problem(seqlen_k=32768, head_dim=128)
    s = DECODE.default_schedule("sm_90", p).replace(combine="block")
    assert combine_constants(p, s) == {"TILE_G": 16, "TILE_S": 1, "CHUNK_D": 32, "UNROLL": 16,
                                       "PDL": False, "SINKS": False, "BLOCK": True}
    plan = launches(p, s, None)
    assert plan.combine_grid == (8, 4, 1) and not plan.pdl
    mqa = _problem(heads_q=8, heads_kv=1, seqlen_k=50000)  # 128 splits of 16 rows: 4 columns
    s = DECODE.default_schedule("sm_90", mqa)
    constants = combine_constants(mqa, s)
    assert (constants["UNROLL"], constants["CHUNK_D"]) == (128, 4)
    assert launches(mqa, s, None).combine_grid == (1, 16, 1)
    odd = DecodeSchedule(splits=37, combine="block", tile_n=128)  # padded to 64
    assert combine_constants(mqa, odd)["UNROLL"] == 64
    assert DECODE.normalise(mqa, DecodeSchedule(splits=129, combine="block")).combine == "kernel"
    # past a block's rows the dependent block merge keeps its dependent launch
    assert DECODE.normalise(mqa, DecodeSchedule(splits=129, combine="block_pdl")).combine == "pdl"
    assert DECODE.normalise(mqa, DecodeSchedule(splits=1, combine="block")).combine == "kernel"
    stepping = combine_constants(p, s.replace(combine="kernel"))
    assert (stepping["UNROLL"], stepping["CHUNK_D"], stepping["BLOCK"]) == (8, 32, False)
    # sinks too: the block merge adds each row's sink once (test_decode_variants_gpu.py)
    sinks = dataclasses.replace(p, sinks=True)
    s = DECODE.default_schedule("sm_90", sinks)
    assert s.splits > 1 and s.combine == "block_pdl"
    assert combine_constants(sinks, s)["SINKS"] and combine_constants(sinks, s)["BLOCK"]


def test_the_block_merge_is_a_dependent_launch_where_the_split_kernel_so_compiled_fits():
    """On Hopper the default block merge is launched as a programmatic dependent of the split
    kernel (``block_pdl``: 1.03x the block merge on an H200, 1.02x paged) up to D 128 without
    a softcap, window, FP8 cache or padded ragged batch: at D 256 (and with a softcap at D 128)
    the split kernel compiled with the PDL instruction spills, and it ran 0.73x."""
    p = _problem(seqlen_k=32768, head_dim=128)
    s = DECODE.default_schedule("sm_90", p)
    assert (s.splits, s.combine) == (16, "block_pdl")
    constants = combine_constants(p, s)
    assert constants["PDL"] and constants["BLOCK"] and split_constants(p, s)["PDL"]
    assert launches(p, s, None).pdl
    paged = Problem(batch=8, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=8192, head_dim=128,
                    dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=16)
    s = DECODE.default_schedule("sm_90", paged)
    assert s.splits > 1 and s.combine == "block_pdl"
    for other in (dataclasses.replace(p, head_dim=256), dataclasses.replace(p, softcap=30.0),
                  dataclasses.replace(paged, kv_dtype="e4m3"),
                  dataclasses.replace(p, window_left=4096, causal=True, bottom_right=True),
                  dataclasses.replace(p, kv_dtype="e4m3")):
        s = DECODE.default_schedule("sm_90", other)
        assert s.splits > 1 and s.combine == "block", other.describe()
    for arch in ("sm_100", "sm_120", "sm_80"):  # not measured there
        assert DECODE.default_schedule(arch, p).combine == "block", arch


def test_default_split_count_follows_cache_length_and_parallelism():
    assert DECODE.default_schedule("sm_90", TOKEN).splits == 16
    assert DECODE.default_schedule("sm_90", dataclasses.replace(TOKEN, batch=32)).splits == 1
    assert DECODE.default_schedule("sm_90", dataclasses.replace(TOKEN, seqlen_k=1024)).splits == 4
    for arch in ("sm_80", "sm_90", "sm_100", "sm_120"):
        for b, hkv in ((1, 1), (1, 8), (4, 8), (16, 8)):
            counts = [DECODE.default_schedule(arch, _problem(batch=b, heads_kv=hkv,
                                                             heads_q=4 * hkv,
                                                             seqlen_k=sk)).splits
                      for sk in (1, 300, 512, 1024, 4096, 32768, 131072)]
            assert counts == sorted(counts), (arch, b, hkv)  # grows with S_k
        for sk in (4096, 32768):
            counts = [DECODE.default_schedule(arch, _problem(batch=b, seqlen_k=sk)).splits
                      for b in (1, 2, 4, 8, 16, 32, 64)]
            assert counts == sorted(counts, reverse=True), (arch, sk)  # shrinks with B*H_kv
        gen = tooling.generation(arch)
        for b, sk in itertools.product((1, 2, 4, 8), (700, 4096, 65536, 1 << 18)):
            p = _problem(batch=b, seqlen_k=sk)
            s = DECODE.default_schedule(arch, p)
            if s.splits > 1:  # one wave at its occupancy, each split its minimum of keys
                assert layout(p, s).rows * s.splits <= SM_COUNTS[gen] * s.occupancy
                assert s.splits * MIN_KEYS_PER_SPLIT <= sk
            assert 1 <= s.splits <= MAX_SPLITS


# -- dispatch -----------------------------------------------------------------------------------
def test_hopper_rule_is_the_measured_boundary():
    assert DISPATCH_RULES["hopper"] == DispatchRule(max_seqlen_q=16, sparse_seqlen_q=64,
                                                    sparse_ctas=66)


@pytest.mark.parametrize("batch, heads_q, seqlen_q, family", [
    (1, 32, 1, "decode"), (64, 32, 1, "decode"), (64, 64, 16, "decode"),
    (1, 32, 17, "decode"), (8, 32, 17, "forward"),
    (1, 32, 32, "decode"), (2, 32, 64, "decode"),  # 64 forward CTAs
    (1, 66, 64, "decode"), (1, 67, 64, "forward"),  # the boundary: 66 CTAs
    (3, 32, 64, "forward"), (1, 8, 65, "forward"),
    (1, 32, 128, "forward"), (1, 1, 128, "forward"),
])
def test_choose_family(batch, heads_q, seqlen_q, family):
    p = _problem(batch=batch, heads_q=heads_q, heads_kv=1, seqlen_q=seqlen_q, seqlen_k=4096)
    expected = {"decode": DECODE, "forward": FORWARD}[family]
    assert tiledattention.choose_family("sm_90", p) is expected
    for arch in ("sm_80", "sm_89", "sm_100", "sm_121"):  # no measurement: Hopper's boundary
        assert tiledattention.choose_family(arch, p) is expected


def test_dispatch_rule_of_other_generations_and_bad_arches():
    assert dispatch_rule("sm_120") is DISPATCH_RULES["hopper"]
    for bad in ("sm_91", "sm_121a", "hopper", 90):
        with pytest.raises(InputValueError, match="arch must"):
            tiledattention.choose_family(bad, _problem())


# -- cache-length buckets -----------------------------------------------------------------------
@pytest.mark.parametrize("length, bucket", [
    (1, 1), (2, 2), (3, 4), (5, 4), (6, 8), (11, 8), (12, 16), (4096, 4096), (4097, 4096),
    (5792, 4096), (5793, 8192), (30000, 2**15), (100000, 2**17), (2**31 - 1, 2**31)])
def test_length_bucket_rounds_to_the_nearest_power_of_two_in_log_scale(length, bucket):
    # 3: 3*3 = 9 >= 2*2*2 = 8, so 3 >= 2^1.5 and its bucket is 2^2
    assert 1 << length_bucket(length) == bucket


def test_length_bucket_agrees_with_its_definition():
    for x in range(1, 5001):
        exact = math.log2(x)
        if abs(exact - math.floor(exact) - 0.5) > 1e-9:  # no integer sits at 2^(n+1/2)
            assert length_bucket(x) == round(exact), x
    for n in range(1, 32):  # either side of 2^(n+1/2), in integers: x*x >= 2^(2n+1)
        edge = math.isqrt(2 << (2 * n))  # the largest x with x*x <= 2^(2n+1), below it
        for x in (edge - 1, edge, edge + 1, edge + 2):
            n_lo = length_bucket(x)
            assert 2 ** (2 * n_lo - 1) <= x * x < 2 ** (2 * n_lo + 1), x


def test_bucket_problem_changes_only_the_cache_length():
    bucketed = bucket_problem(ODD)
    assert bucketed.seqlen_k == 1024
    assert {k: v for k, v in bucketed.to_dict().items() if k != "seqlen_k"} == \
        {k: v for k, v in ODD.to_dict().items() if k != "seqlen_k"}
    assert bucketed.bottom_right and bucketed.causal_offset == 1024 - 3
    assert bucket_problem(TOKEN) is TOKEN  # a power of two already
    assert bucket_problem(dataclasses.replace(TOKEN, seqlen_k=23170)).seqlen_k == 16384
    assert bucket_problem(dataclasses.replace(TOKEN, seqlen_k=23171)).seqlen_k == 32768


def test_bucket_problem_keeps_a_length_whose_bucket_is_no_valid_problem():
    # 8 * 2^21 * 128 = 2^31 elements of K: one past the int32 index limit
    p = _problem(heads_kv=8, head_dim=128, seqlen_k=2_000_000)
    assert length_bucket(p.seqlen_k) == 21
    with pytest.raises(UnsupportedProblemError):
        dataclasses.replace(p, seqlen_k=1 << 21)
    assert bucket_problem(p) is p


def test_bucket_problem_takes_the_canonical_form_of_its_length():
    """Rounded to S_q, a bottom-right problem becomes top-left (the same mask): the caller's
    alignment travels beside it (``decode._plan.decode_plan``)."""
    p = _problem(seqlen_q=16, seqlen_k=22, causal=True, bottom_right=True)  # 22 < 2^4.5
    assert bucket_problem(p) == _problem(seqlen_q=16, seqlen_k=16, causal=True)
    assert not bucket_problem(p).bottom_right and bucket_problem(p).causal


def test_sdpa_rejects_an_empty_cache_with_the_validation_error():
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 4, 1, 64, dtype=torch.bfloat16)
    k = torch.randn(1, 4, 0, 64, dtype=torch.bfloat16)
    with pytest.raises(InputValueError, match="k must have seqlen >= 1"):
        tiledattention.sdpa(q, k, k)
    # no heads: named too (was a ZeroDivisionError in the grouping's check)
    none = torch.randn(1, 0, 1, 64, dtype=torch.bfloat16)
    with pytest.raises(InputValueError,
                       match=r"^q must have heads >= 1; got shape \(1, 0, 1, 64\)"):
        tiledattention.sdpa(none, none, none)


# -- bottom-right problems ----------------------------------------------------------------------
def test_bottom_right_canonical_forms():
    square = _problem(seqlen_q=512, seqlen_k=512, causal=True, bottom_right=True)
    assert (square.causal, square.bottom_right) == (True, False)
    assert square == _problem(seqlen_q=512, seqlen_k=512, causal=True)
    token = _problem(seqlen_q=1, causal=True, bottom_right=True)
    assert (token.causal, token.bottom_right) == (False, False)  # the last query sees all keys
    assert token == _problem(seqlen_q=1)
    top_left = _problem(seqlen_q=1, causal=True)  # top-left at S_q = 1 sees key 0 only
    assert (top_left.causal, top_left.bottom_right) == (True, False) and top_left != token
    assert ODD.bottom_right and ODD.causal
    with pytest.raises(UnsupportedProblemError, match="bottom_right=True needs causal=True"):
        _problem(seqlen_q=4, bottom_right=True)
    with pytest.raises(UnsupportedProblemError, match="bottom_right must be a bool"):
        _problem(seqlen_q=4, causal=True, bottom_right=1)


def test_problem_dict_carries_bottom_right_only_when_true():
    assert "bottom_right" not in TOKEN.to_dict()
    assert ODD.to_dict()["bottom_right"] is True
    for p in (TOKEN, ODD, _problem(seqlen_q=7, causal=True)):
        assert Problem.from_dict(p.to_dict()) == p
    legacy = {k: v for k, v in ODD.to_dict().items() if k != "bottom_right"}
    assert Problem.from_dict(legacy) == dataclasses.replace(ODD, bottom_right=False)
    with pytest.raises(UnsupportedProblemError, match=r"missing \['causal'\]"):
        Problem.from_dict({k: v for k, v in legacy.items() if k != "causal"})


def test_causal_offset():
    assert ODD.causal_offset == 777 - 3
    assert dataclasses.replace(ODD, bottom_right=False).causal_offset == 0
    assert _problem(seqlen_q=5, seqlen_k=3, causal=True, bottom_right=True).causal_offset == -2
    assert TOKEN.causal_offset == 0


# -- runtime bounds -----------------------------------------------------------------------------
def test_runtime_holds_at_most_max_resolutions_oldest_out(monkeypatch):
    import tiledattention.core._runtime as runtime_module

    monkeypatch.setattr(runtime_module, "device_info", lambda index: DeviceInfo(
        index=index, arch="sm_90", name="fake", sm_count=132))
    calls = []

    def resolve(family, problem, device):
        calls.append((family.name, problem.seqlen_k, device.index))
        return f"{family.name}:{problem.seqlen_k}"

    runtime = Runtime(resolve, max_plans=2, max_resolutions=2)
    a, b, c = (dataclasses.replace(TOKEN, seqlen_k=n) for n in (1024, 2048, 4096))
    assert runtime.resolution(DECODE, a, 0) == "decode:1024"
    assert runtime.resolution(DECODE, b, 0) == "decode:2048"
    assert runtime.resolution(DECODE, a, 0) == "decode:1024"  # held: no call
    assert runtime.sizes() == (2, 0)
    assert runtime.resolution(DECODE, c, 0) == "decode:4096"  # a, the oldest, goes
    assert runtime.sizes() == (2, 0)
    assert calls == [("decode", 1024, 0), ("decode", 2048, 0), ("decode", 4096, 0)]
    runtime.resolution(DECODE, b, 0)
    runtime.resolution(DECODE, c, 0)
    assert len(calls) == 3  # b and c held
    assert runtime.resolution(DECODE, a, 0) == "decode:1024"  # evicted: resolved again
    assert calls[3:] == [("decode", 1024, 0)] and runtime.sizes() == (2, 0)
    for name in "xyz":
        runtime.keep_plan(name, name.upper())
    assert runtime.sizes() == (2, 2)
    assert [runtime.plan(n) for n in "xyz"] == [None, "Y", "Z"]
    runtime.clear()
    assert runtime.sizes() == (0, 0)


# -- search space and a simulated search --------------------------------------------------------
def test_compact_space_keeps_splits_of_two_key_tiles_at_least():
    space = search_spaces.space_for("decode", "sm_90", "compact")
    assert set(space.choices) == {"splits", "balanced", "flat", "longest_first", "tile_n",
                                  "occupancy", "k_latency"}
    restricted = search_spaces.DECODE_SPACE.restrict(space, _problem(seqlen_k=1024))
    assert "balanced" not in restricted.choices  # one cache length: nothing to balance
    assert "flat" not in restricted.choices  # a flat walk is a paged batch's
    assert "longest_first" not in restricted.choices  # and so is an order of its entries
    paged = search_spaces.DECODE_SPACE.restrict(space, PAGED).choices
    assert paged["flat"] == paged["balanced"] == paged["longest_first"] == (False, True)
    assert "longest_first" not in search_spaces.DECODE_SPACE.restrict(
        space, dataclasses.replace(PAGED, batch=1)).choices  # one entry: nothing to order
    assert restricted.choices["splits"] == (1, 2, 3, 4, 6, 8)
    tiles = math.ceil(1024 / 64)
    assert all(tiles / n >= 2 for n in restricted.choices["splits"])
    assert all(tiles / n < 2 for n in space.choices["splits"]
               if n not in restricted.choices["splits"])
    assert search_spaces.DECODE_SPACE.restrict(space, _problem(seqlen_k=1 << 20)).choices[
        "splits"] == space.choices["splits"]
    # the merge, not searched here, is the problem's default's (not the base's stepping one)
    for arch, problem, merge in (("sm_90", _problem(seqlen_k=32768), "block_pdl"),
                                 ("sm_90", _problem(seqlen_k=32768, head_dim=256), "block"),
                                 ("sm_100", _problem(seqlen_k=32768), "block")):
        compact = search_spaces.space_for("decode", arch, "compact")
        restricted = search_spaces.DECODE_SPACE.restrict(compact, problem)
        assert restricted.base.combine == merge, (arch, problem.describe())
        assert {s.combine for s in itertools.islice(restricted, 20)} == {merge}


def test_full_space_fixes_tile_m_at_one_position_and_combine_with_one_split():
    full = search_spaces.space_for("decode", "sm_90", "full")
    restrict = search_spaces.DECODE_SPACE.restrict
    token = restrict(full, _problem(seqlen_q=1, seqlen_k=4096))
    assert "tile_m" not in token.choices and "combine" in token.choices
    assert all(s.tile_m == full.base.tile_m for s in itertools.islice(token, 50))
    rows = restrict(full, _problem(seqlen_q=4, seqlen_k=4096))
    assert rows.choices["tile_m"] == (16, 32, 64, 128)
    short = restrict(full, _problem(seqlen_q=4, seqlen_k=129))  # 3 tiles of 64: one split
    assert short.choices["splits"] == (1,) and "combine" not in short.choices
    assert restrict(full, _problem(seqlen_k=256)).choices["splits"] == (1, 2)
    # only the rows past whole waves of two CTAs an SM split: where some are (536 rows, 8 past
    # two waves on sm_90; on sm_100's 148 SMs 240 past one), in whole batch entries
    assert "tail_rows" not in token.choices  # 8 rows
    assert restrict(full, _problem(batch=67, seqlen_k=5000)).choices["tail_rows"] == (0, 8)
    sm100 = search_spaces.space_for("decode", "sm_100", "full")
    assert restrict(sm100, _problem(batch=67, seqlen_k=5000)).choices["tail_rows"] == (0, 240)
    wide = restrict(full, _problem(batch=50, heads_q=32, heads_kv=16, seqlen_k=5000))
    assert wide.choices["tail_rows"] == (0, 16)  # 800 rows, 8 past three waves: an entry
    for p in (_problem(batch=66, seqlen_k=5000),  # 528 rows: two whole waves
              dataclasses.replace(_problem(batch=67, seqlen_k=5000), causal=True,
                                  bottom_right=True, ragged=True, page_size=64)):
        assert "tail_rows" not in restrict(full, p).choices, p.describe()


def test_shared_memory_prunes_per_architecture():
    space = search_spaces.space_for("decode", "sm_120", "full")
    wide = _problem(head_dim=256)
    s = DecodeSchedule(tile_n=128)  # 2 bytes * 256 * (16 + 2 * 128) = 136 KiB
    assert space.infeasibility("sm_120", wide, s) is not None
    assert space.infeasibility("sm_90", wide, s) is None
    assert "shared memory" in space.infeasibility("sm_90", wide, s.replace(tile_n=256))


def test_simulated_search_stores_a_row_that_never_answers_a_lookup(tmp_path):
    store = tmp_path / "x.sqlite"
    problem = _problem(heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=4096, head_dim=128)
    assert main(["search", "--kernel", "decode", "--device", "sm_90", "--backend", "simulated",
                 "--problem", "batch=1,heads_q=32,heads_kv=8,seqlen_q=1,seqlen_k=4096,"
                 "head_dim=128,dtype=bf16,causal=false", "--trials", "4",
                 "--db", str(store)]) == 0
    with db.ScheduleDB.open_for_lookup(store, codecs=codecs()) as database:
        rows = database.rows()
    assert len(rows) == 1
    row = rows[0]
    assert (row.family, row.arch, row.backend, row.problem) == ("decode", "sm_90", "simulated",
                                                                problem)
    assert isinstance(row.schedule, DecodeSchedule)
    assert DECODE.normalise(problem, row.schedule) == row.schedule
    assert search_spaces.space_for("decode", "sm_90").contains(row.schedule)

    device = DeviceInfo(index=0, arch="sm_90", name=row.device_name, sm_count=132)

    def resolver(path, shipped):
        return Resolver(open_user=lambda: db.ScheduleDB.open_for_lookup(path, codecs=codecs()),
                        open_shipped=shipped)

    alone = resolver(store, lambda arch: None)(DECODE, problem, device)
    assert (alone.source, alone.schedule) == ("default",
                                              DECODE.default_schedule("sm_90", problem))
    shipped = resolver(store, shipped_table)(DECODE, problem, device)
    assert shipped.source in ("shipped", "nearest", "default") and shipped.family == "decode"
    # the same row measured on a GPU would answer: the lookup skipped it for its backend only
    measured = tmp_path / "measured.sqlite"
    with db.ScheduleDB(measured, codecs=codecs()) as database:
        database.put(dataclasses.replace(row, backend="gpu"))
    found = resolver(measured, lambda arch: None)(DECODE, problem, device)
    assert (found.source, found.schedule) == ("exact-device", row.schedule)


# -- kernel arguments by name -------------------------------------------------------------------
def test_launch_order_of_the_runtime_values_is_the_kernels():
    """``_launch.launch`` passes (Q, K, V, Out, Opart, Lse, scale, offset, kv_div, window_left,
    window_right, softcap, Sinks, Ranges, Pages, KDescale, VDescale, split_hint, Order,
    *constants)
    and (Opart, Lse, Out, Sinks, *constants) positionally: the kernels must take them so."""
    assert SPLIT_PARAMETERS.names[:19] == ("Q", "K", "V", "Out", "Opart", "Lse", "qk_scale",
                                           "causal_offset", "kv_div", "window_left",
                                           "window_right", "softcap", "Sinks", "Ranges",
                                           "Pages", "KDescale", "VDescale", "split_hint",
                                           "Order")
    assert set(SPLIT_PARAMETERS.names[19:]) == SPLIT_PARAMETERS.constants
    assert COMBINE_PARAMETERS.names == ("Opart", "Lse", "Out", "Sinks", "TILE_G", "TILE_S",
                                        "CHUNK_D", "UNROLL", "PDL", "SINKS", "BLOCK")
    schedule = DecodeSchedule(splits=4, combine="pdl", k_latency=3)
    plan = launches(ODD, schedule, None)
    constants = split_constants(ODD, schedule)
    assert set(constants) == SPLIT_PARAMETERS.constants
    assert dict(zip(SPLIT_PARAMETERS.names[19:], plan.split_constants)) == constants
    assert dict(zip(COMBINE_PARAMETERS.names[4:], plan.combine_constants)) == \
        combine_constants(ODD, schedule) == {"TILE_G": 8, "TILE_S": 2, "CHUNK_D": 32,
                                             "UNROLL": 4, "PDL": True, "SINKS": False,
                                             "BLOCK": False}
    assert plan.split_grid == (16, 4, 1) and plan.combine_grid == (16, 3, 1)  # D 96 in 32s
    assert plan.pdl and plan.scale == pytest.approx(96 ** -0.5)


def test_ordered_places_values_by_name_whatever_the_mapping_order():
    runtime = {"Opart": "o", "Lse": "l", "Out": "out", "Sinks": 0}
    constants = {"TILE_G": 8, "TILE_S": 2, "CHUNK_D": 32, "UNROLL": 4, "PDL": False,
                 "SINKS": False, "BLOCK": True}
    for r, c in ((runtime, constants), (dict(reversed(list(runtime.items()))),
                                        dict(reversed(list(constants.items()))))):
        assert COMBINE_PARAMETERS.ordered(r, c) == ("o", "l", "out", 0, 8, 2, 32, 4, False,
                                                    False, True)
    values = split_constants(ODD, DecodeSchedule())
    args = SPLIT_PARAMETERS.ordered({n: n.lower() for n in SPLIT_PARAMETERS.runtime},
                                    dict(reversed(list(values.items()))))
    assert dict(zip(SPLIT_PARAMETERS.names, args)) == {
        **{n: n.lower() for n in SPLIT_PARAMETERS.runtime}, **values}


@pytest.mark.parametrize("change, message", [
    (lambda r, c: c.pop("PDL"), "constants missing ['PDL']"),
    (lambda r, c: r.pop("Lse"), "runtime missing ['Lse']"),
    (lambda r, c: c.update(CHUNK_N=16), "does not take: ['CHUNK_N']"),
    (lambda r, c: r.update(scale=1.0), "does not take: ['scale']"),
    (lambda r, c: r.update(TILE_G=8), "supplied twice"),
    (lambda r, c: c.update(Out="out"), "supplied twice"),
    (lambda r, c: (r.update(TILE_S=c.pop("TILE_S"))), "belong in the other mapping"),
    (lambda r, c: (c.update(Lse=r.pop("Lse"))), "belong in the other mapping"),
], ids=["missing_constant", "missing_runtime", "unknown_constant", "unknown_runtime",
        "twice_runtime", "twice_constant", "constant_in_runtime", "runtime_in_constants"])
def test_a_missing_unknown_misplaced_or_doubled_name_raises(change, message):
    runtime = {"Opart": "o", "Lse": "l", "Out": "out", "Sinks": 0}
    constants = {"TILE_G": 8, "TILE_S": 2, "CHUNK_D": 32, "UNROLL": 4, "PDL": False,
                 "SINKS": False, "BLOCK": False}
    change(runtime, constants)
    escaped = message.replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(KernelArgumentError, match=escaped) as exc:
        COMBINE_PARAMETERS.ordered(runtime, constants)
    assert "decode_combine(" in str(exc.value)


def test_kernel_parameters_refuse_a_launcher_that_disagrees_with_the_kernel():
    with pytest.raises(KernelArgumentError, match=r"runtime parameters are \['Lse', 'Opart', "
                                                  r"'Out', 'Sinks'\]; its launcher supplies"):
        KernelParameters(decode_combine, ("Opart", "Lse"))
    with pytest.raises(KernelArgumentError, match="cannot read the parameters"):
        KernelParameters(lambda Q: None, ("Q",))
    assert KernelParameters(decode_combine, ("Out", "Lse", "Opart", "Sinks")).names == \
        COMBINE_PARAMETERS.names


@pytest.mark.parametrize("hq, hkv, sq, tile_m", [(32, 8, 1, 16), (32, 1, 1, 32), (32, 4, 8, 64),
                                                  (32, 1, 5, 64), (64, 4, 8, 64), (16, 1, 8, 64)])
def test_the_default_packs_at_most_64_query_rows_a_tile(hq, hkv, sq, tile_m):
    """Group x S_q (padded to a power of two) rows, between 16 and 64: above 64 rows, 128-row
    tiles ran 1.7-2.3x the time of 64-row ones on an H100 (issue 29, docs/lookup.md)."""
    p = Problem(batch=8, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=4096, head_dim=128,
                dtype="bf16", causal=True, bottom_right=True)
    schedule = DECODE.default_schedule("sm_90", p)
    assert schedule.tile_m == tile_m
    rows = layout(p, schedule).rows  # the splits are counted for the capped tile's CTAs
    assert schedule.splits == max(1, min(SM_COUNTS["hopper"] // rows, 4096 // MIN_KEYS_PER_SPLIT))


# -- balanced splits (a ragged batch: caches of their own lengths) ------------------------------
def test_balanced_splits_apply_to_a_ragged_batch_of_several_splits_without_a_window():
    balanced = DecodeSchedule(splits=4, tile_n=128, balanced=True)
    assert DECODE.normalise(PAGED, balanced) is balanced
    assert DECODE.normalise(PAGED, balanced.replace(splits=1)) == DecodeSchedule(tile_n=128)
    assert not DECODE.normalise(_problem(), balanced).balanced  # one cache length
    windowed = dataclasses.replace(PAGED, window_left=255)
    assert not DECODE.normalise(windowed, balanced).balanced
    names = [n for n in SPLIT_PARAMETERS.names if n in SPLIT_PARAMETERS.constants]
    plan = launches(PAGED, balanced, None)
    assert plan.share_keys == 1000 and dict(zip(names, plan.split_constants))["BALANCED"]
    plain = launches(PAGED, balanced.replace(balanced=False), None)
    assert plain.share_keys == 0 and not dict(zip(names, plain.split_constants))["BALANCED"]
    # a call's own window walks as before, whatever the schedule
    assert launches(PAGED, balanced, None, window=(255, -1)).share_keys == 0
    # an old stored row (no field) reads as proportional splits, and keeps its key
    assert "balanced" not in DecodeSchedule(splits=4).to_dict()
    assert DecodeSchedule.from_dict(DecodeSchedule(splits=4).to_dict()) == DecodeSchedule(
        splits=4)


def test_balanced_walk_gives_every_split_the_longest_caches_share():
    plan = launches(PAGED, DecodeSchedule(splits=4, tile_n=128, balanced=True), None)
    # 1000 keys: 8 tiles, 2 a split; a cache of 300 keys (3 tiles) fills two splits
    assert key_walk(plan, 1, 300, 299) == [[(0, 2), (2, 3), (3, 3), (3, 3)]]
    assert key_walk(plan, 1, 1000, 999) == [[(0, 2), (2, 4), (4, 6), (6, 8)]]
    # a cache past the plan's longest takes its own share: every tile is walked
    assert key_walk(plan, 1, 2000, 1999) == [[(0, 4), (4, 8), (8, 12), (12, 16)]]
    proportional = launches(PAGED, DecodeSchedule(splits=4, tile_n=128), None)
    assert key_walk(proportional, 1, 300, 299) == [[(0, 1), (1, 2), (2, 3), (3, 3)]]


@pytest.mark.parametrize("arch", ARCHES)
def test_balanced_splits_compile(arch, exports):
    result = DECODE.compile(PAGED, DecodeSchedule(splits=4, balanced=True), arch)
    assert result.cubin[:4] == b"\x7fELF" and "/bal" in exports[0][2]


def test_a_paged_batch_short_of_the_gpu_takes_more_splits():
    from tiledattention.kernels.decode._defaults import FULL_GPU_OCCUPANCY, PAGED_SPLIT_FACTOR

    # 20 x 4 rows: two splits by the rule (two CTAs an SM), times the factor
    short = dataclasses.replace(PAGED, batch=20, heads_q=28, heads_kv=4, seqlen_k=10000)
    d = DECODE.default_schedule("sm_90", short)
    assert (d.splits, d.occupancy, d.balanced) == (2 * PAGED_SPLIT_FACTOR, FULL_GPU_OCCUPANCY,
                                                   False)
    # 240 rows fill two CTAs an SM but for a tenth with one split (160 rows take the factor:
    # test_paged); a window and an FP8 cache keep their rules
    assert DECODE.default_schedule("sm_90", dataclasses.replace(short, batch=60)).splits == 1
    windowed = dataclasses.replace(short, window_left=4095)
    assert DECODE.default_schedule("sm_90", windowed).splits < d.splits
    # Ampere keeps one CTA an SM and the rule's splits
    assert DECODE.default_schedule("sm_80", short).splits < d.splits
