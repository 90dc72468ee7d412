"""The resolution chain of sdpa's schedule lookup, on real SQLite files (no GPU needed)."""

from __future__ import annotations

import dataclasses
import sqlite3
import warnings

import pytest

import db
import tiledattention
from db import ScheduleRow
from tiledattention import FORWARD, DeviceInfo, Problem, Schedule
from tiledattention.tooling import Resolver, codecs, current_provenance


def ScheduleDB(location):  # noqa: N802 - the database with every family's codec
    return db.ScheduleDB(location, codecs=codecs())

DEVICE = DeviceInfo(index=0, arch="sm_90", name="NVIDIA H200", sm_count=132)


def problem(s=4096, b=4, h=16, kv=16, d=128, dtype="bf16", causal=True):
    return Problem(batch=b, heads_q=h, heads_kv=kv, seqlen_q=s, seqlen_k=s, head_dim=d,
                   dtype=dtype, causal=causal)


def row(p, schedule, device="NVIDIA H200", ms=1.0, template=None):
    prov = current_provenance(FORWARD)
    if template:
        prov = dataclasses.replace(prov, template_hash=template)
    return ScheduleRow(family="forward", arch="sm_90", device_name=device, problem=p, schedule=schedule,
                       median_ms=ms, spread_ms=0.01, tflops=100.0, trials=5, provenance=prov,
                       default_ms=ms * 1.2)  # beat the default: it may transfer


def resolver(location, shipped=None):
    resolve = Resolver(
        open_user=lambda: db.ScheduleDB.open_for_lookup(location, codecs=codecs()),
        open_shipped=lambda arch: shipped)
    return lambda problem, device: resolve(FORWARD, problem, device)


A = Schedule(tile_m=128, tile_n=64, occupancy=2)
B = Schedule(tile_m=64, tile_n=32, occupancy=3)
C = Schedule(tile_m=32, tile_n=32)


def test_each_step_of_the_chain(tmp_path):
    path = tmp_path / "s.sqlite"
    with ScheduleDB(path) as store:
        store.put(row(problem(), A))  # this device
        store.put(row(problem(causal=False), B, device="NVIDIA H100 80GB HBM3"))  # same arch
        store.put(row(problem(s=2048), C))  # a neighbour for the nearest step
    shipped = db.RowTable([row(problem(d=64), B, device="NVIDIA H200")], source="shipped",
                          codecs=codecs())
    resolve = resolver(str(path), shipped)

    exact = resolve(problem(), DEVICE)
    assert (exact.source, exact.schedule) == ("exact-device", A)
    other = resolve(problem(causal=False), DEVICE)
    assert (other.source, other.schedule) == ("exact-arch", B)
    near = resolve(problem(s=3000), DEVICE)  # log2 distance: 4096 is nearer than 2048
    assert (near.source, near.schedule) == ("nearest", A)
    assert "B4 H16 S4096" in near.detail
    from_shipped = resolve(problem(d=64), DEVICE)
    assert (from_shipped.source, from_shipped.schedule) == ("shipped", B)
    fallback = resolve(problem(d=256), DEVICE)
    assert fallback.source == "default"
    assert fallback.schedule == FORWARD.default_schedule("sm_90", problem(d=256))


def test_nearest_requires_same_dtype_causal_head_dim_and_gqa_ratio(tmp_path):
    path = tmp_path / "s.sqlite"
    with ScheduleDB(path) as store:
        store.put(row(problem(dtype="fp16"), A))
        store.put(row(problem(causal=False), A))
        store.put(row(problem(d=64), A))
        store.put(row(problem(h=32, kv=8), A))
    assert resolver(str(path))(problem(s=2048), DEVICE).source == "default"


def test_distance_prefers_sequence_length_over_batch_heads():
    target = problem(s=4096, b=4)
    assert FORWARD.distance(problem(s=4096, b=16), target) < FORWARD.distance(problem(s=8192), target)


def test_rows_of_another_kernel_template_are_skipped_and_said_once(tmp_path):
    path = tmp_path / "s.sqlite"
    with ScheduleDB(path) as store:
        store.put(row(problem(), A, template="000000000000"))
        store.put(row(problem(s=2048), B, template="000000000000"))
    resolve = resolver(str(path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve(problem(), DEVICE).source == "default"
        assert resolve(problem(s=1024), DEVICE).source == "default"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "skipping 2 forward schedule(s)" in messages[0]
    assert "tiledtune restamp" in messages[0] and "tiledtune search --kernel forward" in messages[0]


def test_missing_database_gives_defaults_and_creates_nothing(tmp_path):
    path = tmp_path / "sub" / "absent.sqlite"
    assert resolver(str(path))(problem(), DEVICE).source == "default"
    assert not path.exists() and not path.parent.exists()


@pytest.mark.parametrize("content", [b"this is not a database at all" * 10,
                                     b"SQLite format 3\x00" + b"\x00" * 50])
def test_unreadable_database_warns_once_naming_it_then_defaults(tmp_path, content):
    path = tmp_path / "broken.sqlite"
    path.write_bytes(content)
    resolve = resolver(str(path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = resolve(problem(), DEVICE)
        second = resolve(problem(s=1024), DEVICE)
    assert first.source == second.source == "default"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and str(path) in messages[0]


def test_foreign_schema_warns_and_defaults(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as con:
        con.execute("create table users (id integer)")
    with pytest.warns(RuntimeWarning, match="other.sqlite"):
        assert resolver(str(path))(problem(), DEVICE).source == "default"


def test_hand_edited_invalid_schedule_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "s.sqlite"
    with ScheduleDB(path) as store:
        store.put(row(problem(), A))
    with sqlite3.connect(path) as con:
        con.execute("update schedules set schedule = replace(schedule, '\"tile_m\":128', "
                    "'\"tile_m\":48')")
    with pytest.warns(RuntimeWarning):
        found = resolver(str(path))(problem(), DEVICE)
    assert found.source == "default"


def test_use_database_switches_the_process_runtime(tmp_path):
    tiledattention.use_database(str(tmp_path / "x.sqlite"))
    try:
        first = tiledattention.runtime()
        assert tiledattention.runtime() is first
        tiledattention.use_database(None)
        assert tiledattention.runtime() is not first
    finally:
        tiledattention.use_database(None)
