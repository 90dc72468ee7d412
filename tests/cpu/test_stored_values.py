"""What a stored value must hold, and messages that say what is wrong (issue 30, item 8).

- A text field of an imported row with a NUL byte or an ANSI escape is refused naming the
  character and where it is, not with "at most 256 characters; got 18 characters".
- A schedule read from a file or a database names every field of its format: only fields added
  since the format was first written may be missing (they read as their defaults, which are
  what the kernel did before they existed); a missing ``tile_m`` is refused, never filled in.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import warnings
from datetime import datetime, timezone

import pytest

import db
from tiledattention import BACKWARD, DECODE, FORWARD, Problem, Schedule, ScheduleError
from tiledattention.tooling import codecs, current_provenance
from tuner.transfer import MAX_TEXT, read_rows

CODECS = codecs()
H100 = "NVIDIA H100 80GB HBM3"
#: The forward schedule's fields as format 1 was first written (commit fb6bd79).
FORMAT1_FIELDS = ("tile_m", "tile_n", "occupancy", "num_ctas", "opt_level", "k_latency",
                  "v_latency", "k_transposed", "allow_tma", "exp2", "approx_div", "kv_sawtooth",
                  "longest_first", "unchecked_loads")
#: Fields added since, with the value a dict without them reads as.
ADDED = {"num_worker_warps": None, "split_masked": False, "persistent": False,
         "paired_tiles": False, "split_d": False, "pv_wide": False, "fast_acc": False,
         "pack_gqa": False}
SCHEDULE = Schedule(tile_m=128, tile_n=64, occupancy=2, num_worker_warps=8, exp2=True,
                    persistent=True, split_masked=True)


def _row(device: str = H100, schedule: Schedule = SCHEDULE) -> db.ScheduleRow:
    problem = Problem(batch=1, heads_q=16, heads_kv=4, seqlen_q=1024, seqlen_k=1024,
                      head_dim=128, dtype="bf16", causal=True)
    return db.ScheduleRow(family="forward", arch="sm_90", device_name=device, problem=problem,
                          schedule=schedule, median_ms=0.5, spread_ms=0.01, tflops=100.0,
                          default_ms=0.6, trials=9,
                          created_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
                          provenance=current_provenance(FORWARD))


def _rows_file(tmp_path, items) -> object:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"format": db.ROW_FORMAT, "rows": items}))
    return path


# -- text fields ------------------------------------------------------------------------------

@pytest.mark.parametrize("value, words", [
    ("NVIDIA\x00H100 80GB", "got a NUL byte ('\\x00') at character 7 of 16"),
    ("\x1b[31mNVIDIA H100", "got an escape character (an ANSI terminal sequence) ('\\x1b') at "
                            "character 1 of 16"),
    ("H100\nforged line", "got a line break ('\\n') at character 5 of 16"),
    ("H1\u200b00", "got a character that is not printable ('\\u200b') at character 3 of 5"),
], ids=["nul", "ansi", "line-break", "zero-width"])
def test_a_text_field_with_an_unprintable_character_says_which_and_where(value, words):
    with pytest.raises(db.RecordError) as exc:
        db.check_text("device_name", value, MAX_TEXT)
    message = str(exc.value)
    assert message == f"device_name must be printable text; {words}"
    assert "at most" not in message  # the length was never the problem


def test_a_text_field_too_long_says_its_length_and_the_limit():
    with pytest.raises(db.RecordError, match=r"^torch must be printable text of at most 256 "
                                             r"characters; got 300 characters$"):
        db.check_text("torch", "x" * 300, MAX_TEXT)
    db.check_text("torch", "x" * 256, MAX_TEXT)  # at the limit: fine


def test_import_rejects_an_ansi_device_name_naming_the_escape(tmp_path):
    good = _row().to_dict()
    hostile = {**_row().to_dict(), "device_name": "\x1b[2J\x1b[31mNVIDIA H100"}
    hostile["problem"] = {**hostile["problem"], "seqlen_q": 2048, "seqlen_k": 2048}
    accepted, rejected = read_rows(_rows_file(tmp_path, [good, hostile]), CODECS)
    assert [index for index, _ in accepted] == [0]  # rows count from 0
    assert rejected == ["row 1: device_name must be printable text; got an escape character "
                        "(an ANSI terminal sequence) ('\\x1b') at character 1 of 20"]


# -- schedule fields ---------------------------------------------------------------------------

def test_the_format1_fields_are_the_ones_every_stored_schedule_names():
    """A field added to ``Schedule`` must be listed as added since format 1 (old rows lack it),
    or rows stored before it stop loading: this pins the two lists."""
    fields = [f.name for f in dataclasses.fields(Schedule)]
    assert sorted(fields) == sorted(FORMAT1_FIELDS + tuple(ADDED))
    old = {"format": 1, **{name: getattr(SCHEDULE, name) for name in FORMAT1_FIELDS}}
    assert Schedule.from_dict(old) == dataclasses.replace(SCHEDULE, **ADDED)


@pytest.mark.parametrize("name", FORMAT1_FIELDS)
def test_a_schedule_lacking_a_format1_field_is_refused_naming_it(name):
    data = SCHEDULE.to_dict()
    del data[name]
    with pytest.raises(ScheduleError, match=rf"^schedule lacks field\(s\) \['{name}'\]; a stored "
                                            r"schedule of format 1 names every field"):
        Schedule.from_dict(data)


@pytest.mark.parametrize("name", list(ADDED))
def test_a_schedule_lacking_a_field_added_since_reads_as_its_default(name):
    data = SCHEDULE.to_dict()
    data.pop(name, None)
    assert Schedule.from_dict(data) == dataclasses.replace(SCHEDULE, **{name: ADDED[name]})


def test_a_bad_value_is_named_before_missing_fields():
    with pytest.raises(ScheduleError, match="tile_m must be one of"):
        Schedule.from_dict({"format": 1, "tile_m": 48})


@pytest.mark.parametrize("family", [DECODE, BACKWARD], ids=["decode", "backward"])
def test_decode_and_backward_schedules_name_every_field(family):
    schedule_type = family.schedule_type
    full = schedule_type().to_dict()
    assert schedule_type.from_dict(full) == schedule_type()
    for name in (f.name for f in dataclasses.fields(schedule_type)):
        data = {k: v for k, v in full.items() if k != name}
        if name in schedule_type.ADDED_FIELDS:  # added later: missing reads as the old kernel
            assert schedule_type.from_dict(data) == schedule_type()
            continue
        with pytest.raises(ScheduleError, match=rf"lacks field\(s\) \['{name}'\]"):
            schedule_type.from_dict(data)


def test_every_shipped_row_names_every_field():
    """The shipped table loads under the rule, strictly: a row that failed would raise."""
    from pathlib import Path

    import tiledattention

    table = Path(tiledattention.__file__).parent / "pretuned" / "sm_90.json"
    rows = list(db.load_rows_file(table, CODECS))
    assert {r.family for r in rows} == {"forward", "decode", "backward"}
    assert len(rows) == len(json.loads(table.read_text())["rows"]) >= 177  # none skipped


def test_import_refuses_a_row_whose_schedule_lacks_tile_m(tmp_path):
    data = _row().to_dict()
    del data["schedule"]["tile_m"]
    accepted, rejected = read_rows(_rows_file(tmp_path, [data]), CODECS)
    assert accepted == []
    [reason] = rejected
    assert reason.startswith("row 0: ") and "lacks field(s) ['tile_m']" in reason


def test_a_stored_row_lacking_tile_m_is_skipped_with_a_warning_not_filled_in(tmp_path):
    path = tmp_path / "s.sqlite"
    with db.ScheduleDB(path, codecs=CODECS) as store:
        assert store.put(_row()) == "added"
    data = SCHEDULE.to_dict()
    del data["tile_m"]
    connection = sqlite3.connect(path)
    connection.execute("UPDATE schedules SET schedule = ?", (json.dumps(data),))
    connection.commit()
    connection.close()
    with db.ScheduleDB(path, codecs=CODECS, read_only=True) as store, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.rows() == []
    assert any("lacks field(s) ['tile_m']" in str(w.message) for w in caught)
