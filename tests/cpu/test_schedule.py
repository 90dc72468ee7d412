"""Schedule (the forward family's schedule type): validation names the field; dict/JSON round
trip, also through the family's database codec; stable key."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tiledattention import FORWARD, InputValueError, Schedule, ScheduleError, \
    TiledAttentionError

TOGGLED = Schedule(tile_m=128, tile_n=32, occupancy=3, num_ctas=2, opt_level=2,
                   num_worker_warps=8, k_latency=3, v_latency=10, k_transposed=True,
                   allow_tma=False, exp2=True, approx_div=True, kv_sawtooth=True,
                   longest_first=True, unchecked_loads=True, split_masked=True,
                   persistent=True, paired_tiles=True)


@pytest.mark.parametrize("schedule", [Schedule(), TOGGLED], ids=["default", "toggled"])
def test_round_trip_through_dict_and_json(schedule):
    assert Schedule.from_dict(schedule.to_dict()) == schedule
    assert Schedule.from_json(schedule.to_json()) == schedule
    assert json.loads(schedule.to_json())["format"] == 1


@pytest.mark.parametrize("schedule", [Schedule(), TOGGLED], ids=["default", "toggled"])
def test_forward_family_stores_schedules_of_this_type(schedule):
    assert FORWARD.schedule_type is Schedule
    codec = FORWARD.codec()
    assert codec.schedule(schedule.to_dict()) == schedule
    assert codec.schedule(schedule.to_json()) == schedule  # the SQL / CSV cell form


def test_key_is_stable_and_distinguishes_every_field():
    assert Schedule().key == Schedule().key
    code = "from tiledattention import Schedule; print(Schedule(tile_m=128).key)"
    other_process = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                   text=True, check=True).stdout.strip()
    assert other_process == Schedule(tile_m=128).key
    keys = {Schedule().key}
    for name, value in TOGGLED.to_dict().items():
        if name != "format" and value != getattr(Schedule(), name):
            keys.add(Schedule().replace(**{name: value}).key)
    toggled = [f for f, v in TOGGLED.to_dict().items() if f != "format"
               and v != getattr(Schedule(), f)]
    assert len(toggled) == len(Schedule().to_dict()) - 1  # TOGGLED changes every field
    assert len(keys) == 1 + len(toggled)  # the default plus one per toggled field


@pytest.mark.parametrize("field, value, message", [
    ("tile_m", 48, "Schedule.tile_m must be one of"),
    ("tile_n", 512, "Schedule.tile_n must be one of"),
    ("tile_m", "64", "Schedule.tile_m must be an int"),
    ("occupancy", 0, "Schedule.occupancy must be in 1..32"),
    ("num_ctas", 3, "Schedule.num_ctas must be one of"),
    ("opt_level", 4, "Schedule.opt_level must be in 0..3"),
    ("num_worker_warps", 6, "Schedule.num_worker_warps must be one of"),
    ("k_latency", 0, "Schedule.k_latency must be in 1..10 or None"),
    ("v_latency", 11, "Schedule.v_latency must be in 1..10 or None"),
    ("exp2", 1, "Schedule.exp2 must be a bool"),
    ("occupancy", True, "Schedule.occupancy must be an int"),
])
def test_validation_names_the_field(field, value, message):
    with pytest.raises(ScheduleError, match=message) as exc:
        Schedule(**{field: value})
    assert isinstance(exc.value, ValueError)
    assert isinstance(exc.value, InputValueError) and isinstance(exc.value, TiledAttentionError)


def test_from_dict_rejects_unknown_fields_and_newer_formats():
    with pytest.raises(ScheduleError, match="unknown schedule field"):
        Schedule.from_dict({**Schedule().to_dict(), "tile_k": 64})
    with pytest.raises(ScheduleError, match="newer"):
        Schedule.from_dict({**Schedule().to_dict(), "format": 99})
    with pytest.raises(ScheduleError, match="must be JSON"):
        Schedule.from_json("{not json")
    with pytest.raises(ScheduleError, match="mapping"):
        Schedule.from_dict([("tile_m", 64)])


def test_frozen():
    with pytest.raises(AttributeError):
        Schedule().tile_m = 128
