"""The schedule database on real SQLite files: round trips, the better-wins rule, concurrent
writers in separate processes, read-only lookups, broken files, migrations and JSON tables."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sqlite3
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import db
from db import _migrate, _schema
from tiledattention import Problem, Schedule, shipped_table
from tiledattention.tooling import Provenance, codecs

CODECS = codecs()


def open_db(location, **options) -> db.ScheduleDB:
    return db.ScheduleDB(location, codecs=CODECS, **options)


def open_lookup(location) -> db.ScheduleDB | None:
    return db.ScheduleDB.open_for_lookup(location, codecs=CODECS)


ASSETS = Path(__file__).parent / "assets"
PROV = Provenance(template_hash="0123456789ab", cuda_tile="1.7.0", tileiras="13.1.0",
                  torch="2.9.0", driver="13.0")
H100 = "NVIDIA H100 80GB HBM3"


def problem(seqlen: int = 1024, *, batch: int = 1, causal: bool = True, head_dim: int = 128,
            dtype: str = "bf16") -> Problem:
    return Problem(batch=batch, heads_q=16, heads_kv=4, seqlen_q=seqlen, seqlen_k=seqlen,
                   head_dim=head_dim, dtype=dtype, causal=causal)


def row(ms: float = 1.0, *, p: Problem | None = None, device: str = H100,
        schedule: Schedule | None = None, prov: Provenance = PROV, flash: float | None = None,
        **extra) -> db.ScheduleRow:
    """A forward row with a torch-cudnn baseline, and a torch-flash one when ``flash``."""
    return db.ScheduleRow(
        family="forward", arch="sm_90", device_name=device, problem=p or problem(),
        schedule=schedule or Schedule(tile_m=128, tile_n=64, occupancy=2, exp2=True),
        median_ms=ms, spread_ms=0.0125, tflops=321.5, default_ms=ms * 1.7,
        baselines={"torch-cudnn": ms * 1.1, **({"torch-flash": flash} if flash else {})},
        trials=30, created_at=datetime(2025, 7, 1, 8, 30, 15, 123456, tzinfo=timezone.utc),
        provenance=prov, **extra)


# -- rows -----------------------------------------------------------------------------------
def test_row_dict_round_trip_is_json_and_lossless():
    r = row(0.123456789, flash=0.2)
    data = json.loads(json.dumps(r.to_dict()))
    assert data["format"] == db.ROW_FORMAT
    assert data["baselines_ms"] == {"torch-cudnn": 0.123456789 * 1.1, "torch-flash": 0.2}
    assert db.ScheduleRow.from_dict(data, CODECS) == r
    assert hash(r) == hash(db.ScheduleRow.from_dict(data, CODECS))  # rows go into sets


def test_row_baselines_are_a_read_only_mapping_of_any_names():
    r = row(1.0, flash=2.0)
    assert isinstance(r.baselines, db.Baselines) and r.baselines == {"torch-cudnn": 1.1,
                                                                      "torch-flash": 2.0}
    with pytest.raises(TypeError):
        r.baselines["torch-cudnn"] = 0.5  # type: ignore[index]
    other = db.ScheduleRow(**{**r.__dict__, "baselines": {"vendor-lib": 3, "torch-cudnn": 1.1}})
    assert list(other.baselines) == ["torch-cudnn", "vendor-lib"]  # name order
    assert other.baselines["vendor-lib"] == 3.0
    assert db.ScheduleRow(**{**r.__dict__, "baselines": {}}).to_dict()["baselines_ms"] == {}


@pytest.mark.parametrize("baselines, match", [
    ({"torch-cudnn": 0.0}, "torch-cudnn.*> 0"), ({"torch-cudnn": float("nan")}, "finite"),
    ({"torch-cudnn": True}, "torch-cudnn"), ({"": 1.0}, "baseline name"),
    ({"a b": 1.0}, "baseline name"), ([("torch-cudnn", 1.0)], "mapping"),
    ({f"b{i}": 1.0 for i in range(db.MAX_BASELINES + 1)}, "at most"),
], ids=["zero", "nan", "bool", "empty-name", "space-in-name", "not-a-mapping", "too-many"])
def test_row_rejects_bad_baselines(baselines, match):
    with pytest.raises(db.RecordError, match=match):
        db.ScheduleRow(**{**row().__dict__, "baselines": baselines})


@pytest.mark.parametrize("field, value", [
    ("median_ms", "1.0"), ("trials", 2.5), ("arch", 90), ("created_at", "yesterday"),
    ("created_at", "2025-07-01T08:30:15"), ("baselines_ms", {"torch-flash": True}),
    ("baselines_ms", [0.5]), ("baselines_ms", {"torch-flash": "0.5"}),
    ("torch_flash_ms", 0.5),  # a field of row format 3, not 4
], ids=["median-str", "trials-float", "arch-int", "time-garbage", "time-naive", "flash-bool",
        "baselines-list", "flash-str", "format-3-field"])
def test_row_from_dict_names_the_bad_field(field, value):
    data = row().to_dict()
    data[field] = value
    with pytest.raises(ValueError, match=field):
        db.ScheduleRow.from_dict(data, CODECS)


def test_row_from_dict_rejects_bad_nested_and_unknown_fields():
    data = row().to_dict()
    data["schedule"]["tile_m"] = 48
    with pytest.raises(ValueError, match="schedule.*tile_m"):
        db.ScheduleRow.from_dict(data, CODECS)
    data = row().to_dict() | {"colour": "red"}
    with pytest.raises(ValueError, match="colour"):
        db.ScheduleRow.from_dict(data, CODECS)
    data = row().to_dict() | {"format": db.ROW_FORMAT + 1}
    with pytest.raises(ValueError, match="upgrade tiledattention"):
        db.ScheduleRow.from_dict(data, CODECS)


def _format_3(data: dict, **fields) -> dict:
    """``data`` (a row's dict form) as row format 3 wrote it: fixed baseline fields."""
    data = {**data, "format": 3, **fields}
    del data["baselines_ms"]
    return data


@pytest.mark.parametrize("fields, expected", [
    ({"torch_cudnn_ms": 1.5, "torch_flash_ms": 2.25}, {"torch-cudnn": 1.5, "torch-flash": 2.25}),
    ({"torch_cudnn_ms": None, "torch_flash_ms": 0.75}, {"torch-flash": 0.75}),
    ({"torch_cudnn_ms": 0.5}, {"torch-cudnn": 0.5}),
    ({}, {}),
], ids=["both", "null-cudnn", "no-flash-field", "neither"])
def test_row_of_format_3_reads_its_baseline_fields_into_the_mapping(fields, expected):
    data = _format_3(row().to_dict(), **fields)
    assert db.ScheduleRow.from_dict(data, CODECS).baselines == expected
    for name in (1, 2):  # formats 1 and 2 have the fields too
        older = {k: v for k, v in data.items() if k not in ("backend", "family")}
        assert db.ScheduleRow.from_dict({**older, "format": name, **(
            {"family": "forward"} if name == 2 else {})}, CODECS).baselines == expected


def test_row_of_format_3_with_a_baselines_mapping_or_bad_field_is_rejected():
    data = _format_3(row().to_dict(), torch_cudnn_ms=1.0)
    with pytest.raises(db.RecordError, match="format 3 has no 'baselines_ms'"):
        db.ScheduleRow.from_dict({**data, "baselines_ms": {}}, CODECS)
    with pytest.raises(db.RecordError, match="torch_cudnn_ms"):
        db.ScheduleRow.from_dict({**data, "torch_cudnn_ms": "1.0"}, CODECS)


def test_row_created_at_is_normalised_to_utc():
    local = datetime(2025, 7, 1, 10, 30, tzinfo=timezone(timedelta(hours=2)))
    r = db.ScheduleRow(**{**row().__dict__, "created_at": local})
    assert r.created_at.utcoffset() == timedelta(0) and r.created_at.hour == 8


# -- put / get / rows -------------------------------------------------------------------------
def test_put_get_rows_round_trip(tmp_path):
    path = tmp_path / "nested" / "dir" / "schedules.sqlite"
    a = row(1.0, flash=0.9)
    b = row(2.0, p=problem(2048, causal=False))
    c = row(3.0, p=problem(512, head_dim=64, dtype="fp16", causal=False),
            device="NVIDIA H100 PCIe")
    with open_db(path) as store:
        assert [store.put(r) for r in (a, b, c)] == ["added"] * 3
        assert str(store) == str(path)
        assert store.get("forward", "sm_90", H100, a.problem) == a
        assert store.get("forward", "sm_90", H100, problem(4096)) is None
        assert store.get("forward", "sm_100", H100, a.problem) is None
        assert len(store) == 3
        assert store.rows(family="forward", like=problem()) == [a]
        assert store.rows(family="forward", like=c.problem) == [c]
        assert store.rows(family="other") == []
        assert store.rows(device_name=H100) == sorted([a, b], key=lambda r: r.key)
        assert store.rows(arch="sm_100") == []
        assert store.delete("forward", "sm_90", H100, b.problem) is True
        assert store.delete("forward", "sm_90", H100, b.problem) is False
        assert len(store) == 2
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_better_wins_rule(tmp_path):
    with open_db(tmp_path / "s.sqlite") as store:
        key = ("forward", "sm_90", H100, problem())
        assert store.put(row(2.0), current=PROV) == "added"
        assert store.put(row(3.0), current=PROV) == "kept"
        assert store.get(*key).median_ms == 2.0
        assert store.put(row(2.0), current=PROV) == "kept"  # a tie keeps the stored row
        assert store.put(row(1.5, schedule=Schedule(tile_m=64)), current=PROV) == "improved"
        assert store.get(*key).schedule == Schedule(tile_m=64)
        # torch and driver are not part of the toolchain: a slower row is still kept out
        same_toolchain = Provenance(**{**PROV.to_dict(), "torch": "3.0", "driver": "14.0"})
        assert store.put(row(25.0, prov=same_toolchain), current=PROV) == "kept"
        assert store.put(row(30.0), force=True) == "forced"
        assert store.get(*key).median_ms == 30.0
        assert store.put(row(1.0, p=problem(64)), force=True) == "added"
        assert len(store) == 2


def test_a_usable_row_is_never_replaced_by_one_the_runtime_would_ignore(tmp_path):
    """The issue's case: export rows, give them an older template and 5x the time, import them
    back: every current row stays; and the other way round, current rows replace stale ones."""
    old = Provenance(**{**PROV.to_dict(), "template_hash": "0ld0ld0ld0ld"})
    with open_db(tmp_path / "s.sqlite") as store:
        key = ("forward", "sm_90", H100, problem())
        assert store.put(row(1.0), current=PROV) == "added"
        outcome, why = store.merge(row(5.0, prov=old), current=PROV)
        assert (outcome, store.get(*key).median_ms) == ("skipped", 1.0)
        assert "0ld0ld0ld0ld" in why and "ignore" in why
        assert store.put(row(0.5, prov=old), current=PROV) == "skipped"  # even when faster
        assert store.put(row(0.1, backend="simulated"), current=PROV) == "skipped"
        assert store.get(*key).backend == "gpu"
        # a stale stored row gives way to a current one, however slow
        stale = ("forward", "sm_90", H100, problem(2048))
        assert store.put(row(1.0, p=problem(2048), prov=old), current=old) == "added"
        assert store.put(row(9.0, p=problem(2048)), current=PROV) == "replaced"
        assert store.get(*stale).provenance == PROV
        # another cuda-tile: the current toolchain's row wins, the other is kept out
        newer = Provenance(**{**PROV.to_dict(), "cuda_tile": "1.8.0"})
        assert store.put(row(0.2, prov=newer), current=PROV) == "skipped"
        assert store.put(row(0.2, prov=newer), current=newer) == "replaced"
        # without knowing what is current, differing toolchains never overwrite
        assert store.put(row(0.1), current=None) == "skipped"
        assert store.get(*key).median_ms == 0.2


# -- lookups --------------------------------------------------------------------------------
def test_open_for_lookup_on_missing_path_creates_nothing(tmp_path):
    where = tmp_path / "no" / "such" / "schedules.sqlite"
    assert open_lookup(where) is None
    assert open_lookup(f"sqlite:///{where}") is None
    assert list(tmp_path.iterdir()) == []


def test_open_for_lookup_reads_without_writing(tmp_path):
    path = tmp_path / "s.sqlite"
    with open_db(path) as store:
        store.put(row(1.0))
    lookup = open_lookup(path)
    try:
        assert lookup.rows(family="forward", arch="sm_90", like=problem()) == [row(1.0)]
        with pytest.raises(db.DatabaseUnavailable, match="read-only"):
            lookup.put(row(0.5))
    finally:
        lookup.close()
    with open_db(path) as store:
        assert store.get("forward", "sm_90", H100, problem()).median_ms == 1.0


def _broken_not_sqlite(path: Path) -> None:
    path.write_text("tile_m,tile_n\n128,64\n" * 50)


def _broken_truncated(path: Path) -> None:
    with open_db(path) as store:
        for i in range(60):
            store.put(row(1.0, p=problem(16 + i, batch=1 + i)))
    sqlite3.connect(path).execute("PRAGMA wal_checkpoint(TRUNCATE)").close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _broken_foreign(path: Path) -> None:
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    connection.commit()
    connection.close()


def _broken_tiny(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + b"\x10")


@pytest.mark.parametrize("make", [_broken_not_sqlite, _broken_truncated, _broken_foreign,
                                  _broken_tiny],
                         ids=["not-sqlite", "truncated", "foreign-schema", "tiny-header"])
def test_broken_files_raise_database_unavailable_naming_the_file(tmp_path, make):
    path = tmp_path / "broken.sqlite"
    make(path)
    with pytest.raises(db.DatabaseUnavailable) as info:
        open_lookup(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, db.DatabaseError)
    with pytest.raises(db.DatabaseUnavailable, match=str(path)):
        open_db(path)  # writing refuses too, and does not touch the file


def test_foreign_schema_with_version_table_but_no_schedules(tmp_path):
    path = tmp_path / "other.sqlite"
    connection = sqlite3.connect(path)
    connection.execute(f"CREATE TABLE {_schema.VERSION_TABLE} (version_num TEXT)")
    connection.execute(f"INSERT INTO {_schema.VERSION_TABLE} VALUES ('0002')")
    connection.commit()
    connection.close()
    with pytest.raises(db.DatabaseUnavailable, match="no 'schedules' table"):
        open_lookup(path)


def test_lookup_reads_while_a_writer_holds_a_write_transaction(tmp_path):
    path = tmp_path / "s.sqlite"
    with open_db(path) as store:
        store.put(row(1.0))
    writer = sqlite3.connect(path, isolation_level=None, timeout=0.1)
    try:
        # EXCLUSIVE would keep every reader out of a rollback-journal database; WAL lets them in
        writer.execute("BEGIN EXCLUSIVE")
        writer.execute("UPDATE schedules SET median_ms = 99.0")
        lookup = open_lookup(path)
        try:
            found = lookup.rows(arch="sm_90")
        finally:
            lookup.close()
        assert [r.median_ms for r in found] == [1.0]  # the committed state, not the open write
        writer.execute("ROLLBACK")
    finally:
        writer.close()


def _write_rows(path: str, worker: int, count: int) -> None:
    with open_db(path) as store:
        for i in range(count):
            # every worker also races the others on one shared key, with its own timing
            store.put(row(10.0 + worker, p=problem(64)))
            store.put(row(1.0 + i, p=problem(128 + i, batch=1 + worker)))


@pytest.mark.slow  # spawns writer processes
def test_concurrent_writers_in_processes_lose_nothing(tmp_path):
    path = tmp_path / "concurrent" / "s.sqlite"
    workers, count = 4, 25
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_write_rows, args=(str(path), w, count))
                 for w in range(workers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0] * workers
    with open_db(path, read_only=True) as store:
        rows = store.rows()
        assert len(rows) == workers * count + 1
        keys = {(r.problem.batch, r.problem.seqlen_q) for r in rows}
        assert keys == {(1 + w, 128 + i) for w in range(workers) for i in range(count)} | {(1, 64)}
        assert store.get("forward", "sm_90", H100, problem(64)).median_ms == 10.0  # the fastest worker


def test_row_with_invalid_stored_schedule_is_skipped_with_one_warning(tmp_path):
    path = tmp_path / "s.sqlite"
    good, bad = row(1.0), row(2.0, p=problem(2048))
    with open_db(path) as store:
        store.put(good)
        store.put(bad)
    connection = sqlite3.connect(path)
    connection.execute("UPDATE schedules SET schedule = ? WHERE problem LIKE '%\"seqlen_q\":2048%'",
                       (json.dumps({"format": 1, "tile_m": 48}),))
    connection.commit()
    connection.close()
    lookup = open_lookup(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert lookup.rows() == [good]
        assert lookup.get("forward", "sm_90", H100, bad.problem) is None
    lookup.close()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages  # one per row per call
    assert all(str(path) in m and '"seqlen_q":2048' in m and "tile_m" in m for m in messages)


# -- migrations -----------------------------------------------------------------------------
def test_head_revision_constant_matches_the_migrations():
    assert _migrate.head_revision() == _schema.HEAD_REVISION
    assert _migrate.known_revisions() == {"0001", "0002", "0003", "0004", "0005"}


def test_migrated_file_has_exactly_the_current_columns_and_index(tmp_path):
    path = tmp_path / "old.db"
    shutil.copyfile(ASSETS / "schedules_v1.db", path)
    open_db(path).close()
    assert _columns(path) == {c.name for c in _schema.schedules.c}
    connection = sqlite3.connect(path)
    indexes = {r[1] for r in connection.execute("PRAGMA index_list(schedules)")}
    connection.close()
    assert "ix_schedules_lookup" in indexes


def test_file_of_revision_0002_is_read_unmigrated_and_migrated_on_write(tmp_path):
    path = tmp_path / "r2.sqlite"
    engine = __import__("sqlalchemy").create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        _migrate.upgrade(connection, "0002")
        connection.exec_driver_sql(
            "INSERT INTO schedules (arch, device_name, dtype, causal, batch, heads_q, heads_kv, "
            "seqlen_q, seqlen_k, head_dim, schedule, median_ms, spread_ms, tflops, trials, "
            "created_at, template_hash, cuda_tile, tileiras, torch, driver, torch_flash_ms) "
            "VALUES ('sm_90', 'GPU', 'fp16', 0, 2, 8, 2, 100, 300, 64, "
            f"'{Schedule(tile_m=128).to_json()}', 0.5, 0.01, 10.0, 7, "
            "'2026-01-02 03:04:05.000000', 'abcdefabcdef', '1.7.0', '13.4', '2.11', '13.0', 0.6)")
    engine.dispose()
    expected = Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=100, seqlen_k=300, head_dim=64,
                       dtype="fp16", causal=False)
    lookup = open_lookup(path)  # read-only: the runtime reads an old file as it is
    [found] = lookup.rows(family="forward", like=expected)
    lookup.close()
    assert _revision(path) == "0002"
    assert found.family == "forward" and found.problem == expected
    assert found.schedule == Schedule(tile_m=128) and found.baselines == {"torch-flash": 0.6}
    with open_db(path) as store:
        assert _revision(path) == _schema.HEAD_REVISION
        assert store.rows() == [found]


def _revision(path: Path) -> str:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(f"SELECT version_num FROM {_schema.VERSION_TABLE}").fetchone()[0]
    finally:
        connection.close()


def _columns(path: Path) -> set[str]:
    connection = sqlite3.connect(path)
    try:
        return {r[1] for r in connection.execute("PRAGMA table_info(schedules)")}
    finally:
        connection.close()


def test_v1_asset_reads_and_migrates_forward_keeping_rows(tmp_path):
    path = tmp_path / "old.db"
    shutil.copyfile(ASSETS / "schedules_v1.db", path)
    assert _revision(path) == "0001" and "torch_flash_ms" not in _columns(path)
    assert "torch_cudnn_ms" in _columns(path)
    lookup = open_lookup(path)  # read-only: reads v1, migrates nothing
    before = lookup.rows()
    lookup.close()
    assert _revision(path) == "0001"
    assert len(before) == 3
    by_len = {r.problem.seqlen_q: r for r in before}  # the asset's rows: S 4096, 1024, 2048
    assert [by_len[s].device_name for s in (4096, 1024, 2048)] == [H100, H100,
                                                                    "NVIDIA H100 PCIe"]
    # the asset's torch_cudnn_ms: 1.5, NULL, 0.5 (revision 0001 has no torch_flash_ms)
    assert [by_len[s].baselines for s in (4096, 1024, 2048)] == [
        {"torch-cudnn": 1.5}, {}, {"torch-cudnn": 0.5}]
    assert by_len[4096].created_at == datetime(2025, 6, 1, 12, tzinfo=timezone.utc)
    assert all(r.backend == "gpu" for r in before)

    with open_db(path) as store:  # opening for writing migrates in place
        assert _revision(path) == _schema.HEAD_REVISION
        assert "baselines_ms" in _columns(path)
        assert not {"torch_cudnn_ms", "torch_flash_ms"} & _columns(path)
        assert store.rows() == before
        extra = row(0.5, p=problem(8192), flash=0.7)
        assert store.put(extra) == "added"
        assert store.get("forward", "sm_90", H100, extra.problem).baselines["torch-flash"] == 0.7
        assert len(store) == 4


#: The baselines of ``assets/schedules_v3.db`` (revision 0003) by (family, backend, S_k): its
#: torch_cudnn_ms and torch_flash_ms columns, a NULL left out (``make_schedules_v3.py``).
V3_BASELINES = {
    ("forward", "gpu", 4096): {"torch-cudnn": 1.5, "torch-flash": 2.25},
    ("forward", "gpu", 1024): {"torch-flash": 0.875},
    ("decode", "gpu", 8192): {"torch-cudnn": 0.0625},
    ("backward", "gpu", 2048): {},
    ("forward", "simulated", 512): {"torch-cudnn": 0.375, "torch-flash": 0.75},
}


def _v3_baselines(rows) -> dict:
    return {(r.family, r.backend, r.problem.seqlen_k): dict(r.baselines) for r in rows}


def test_v3_asset_is_read_unmigrated_with_its_baseline_columns_as_the_mapping(tmp_path):
    path = tmp_path / "v3.db"
    shutil.copyfile(ASSETS / "schedules_v3.db", path)
    assert _revision(path) == "0003"
    assert {"torch_cudnn_ms", "torch_flash_ms"} <= _columns(path)
    lookup = open_lookup(path)  # read-only: the runtime reads a 0003 file as it is
    try:
        assert _v3_baselines(lookup.rows()) == V3_BASELINES
        [first] = lookup.candidates("forward", "sm_90", lookup.rows(family="forward")[0].problem,
                                    template="tmplv3hash00").exact
        assert first.baselines == V3_BASELINES[("forward", "gpu", first.problem.seqlen_k)]
    finally:
        lookup.close()
    assert _revision(path) == "0003" and "baselines_ms" not in _columns(path)


def test_v3_asset_migrates_every_baseline_value_into_the_mapping(tmp_path):
    path = tmp_path / "v3.db"
    shutil.copyfile(ASSETS / "schedules_v3.db", path)
    lookup = open_lookup(path)
    before = lookup.rows()
    lookup.close()
    with open_db(path) as store:  # opening for writing migrates in place
        assert _revision(path) == _schema.HEAD_REVISION == "0005"
        assert _columns(path) == {c.name for c in _schema.schedules.c}
        assert not {"torch_cudnn_ms", "torch_flash_ms"} & _columns(path)
        after = store.rows()
        assert after == before and _v3_baselines(after) == V3_BASELINES
    connection = sqlite3.connect(path)
    stored = connection.execute("SELECT family, problem, baselines_ms FROM schedules").fetchall()
    connection.close()
    # the column holds canonical JSON text: every value, exactly, and no null for a NULL
    assert sorted(text for _, _, text in stored) == sorted(
        db.canonical_json(v) for v in V3_BASELINES.values())


def test_migration_0004_downgrades_to_the_baseline_columns(tmp_path):
    path = tmp_path / "v3.db"
    shutil.copyfile(ASSETS / "schedules_v3.db", path)
    with open_db(path) as store:
        extra = row(0.5, p=problem(8192), flash=0.7)
        store.put(db.ScheduleRow(**{**extra.__dict__, "baselines": {
            **extra.baselines, "vendor-lib": 0.25}}))
    engine = __import__("sqlalchemy").create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        _migrate.downgrade(connection, "0003")
    engine.dispose()
    assert _revision(path) == "0003"
    assert {"torch_cudnn_ms", "torch_flash_ms"} <= _columns(path)
    assert "baselines_ms" not in _columns(path)
    lookup = open_lookup(path)
    try:  # the 0003 file reads as before; a baseline without a column ("vendor-lib") is gone
        assert _v3_baselines(lookup.rows()) == {**V3_BASELINES, ("forward", "gpu", 8192): {
            "torch-cudnn": 0.55, "torch-flash": 0.7}}
    finally:
        lookup.close()


def test_newer_revision_is_readable_but_refused_for_writing(tmp_path):
    path = tmp_path / "future.sqlite"
    with open_db(path) as store:
        store.put(row(1.0, flash=0.8))
    connection = sqlite3.connect(path)
    connection.execute(f"UPDATE {_schema.VERSION_TABLE} SET version_num = '0099'")
    connection.execute("ALTER TABLE schedules ADD COLUMN power_watts FLOAT")
    connection.execute("ALTER TABLE schedules DROP COLUMN baselines_ms")
    connection.commit()
    connection.close()

    lookup = open_lookup(path)
    [found] = lookup.rows()
    lookup.close()
    assert found.median_ms == 1.0 and found.baselines == {}
    before = path.read_bytes()
    # opening for writing is refused at once, before anything is tuned or written
    with pytest.raises(db.SchemaTooNew, match="'0099'.*[Uu]pgrade tiledattention"):
        open_db(path)
    assert _revision(path) == "0099" and path.read_bytes() == before


# -- JSON tables ----------------------------------------------------------------------------
def test_dump_load_round_trip_is_lossless_and_deterministic(tmp_path):
    rows = [row(1.0 / 3.0, p=problem(100 + i), flash=0.1 * i or None)
            for i in range(5)]
    first, second = tmp_path / "a.json", tmp_path / "out" / "b.json"
    db.dump_rows(rows, first)
    db.dump_rows(reversed(rows), second)
    assert first.read_bytes() == second.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "out"]  # no temp files left
    table = db.load_rows_file(first, CODECS)
    assert list(table) == sorted(rows, key=lambda r: r.key)
    assert table.rows(family="forward", like=problem()) == list(table)
    assert table.rows(family="forward", like=problem(dtype="fp16")) == []
    assert json.loads(first.read_text())["format"] == db.ROW_FORMAT == 4


def test_load_rows_file_is_strict_unless_asked(tmp_path):
    path = tmp_path / "t.json"
    data = {"format": 4, "rows": [row(1.0).to_dict(), row(2.0, p=problem(64)).to_dict()]}
    data["rows"][1]["schedule"]["tile_n"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"t\.json: row 1: .*tile_n"):
        db.load_rows_file(path, CODECS)
    with pytest.warns(RuntimeWarning, match="row 1"):
        assert list(db.load_rows_file(path, CODECS, strict=False)) == [row(1.0)]
    path.write_text(json.dumps({"format": db.ROW_FORMAT + 1, "rows": []}))
    with pytest.raises(ValueError, match="upgrade tiledattention"):
        db.load_rows_file(path, CODECS)


def test_shipped_table_missing_arch_is_none():
    assert shipped_table("sm_999") is None
    with pytest.raises(ValueError, match="sm_90"):
        shipped_table("../../etc/passwd")


def test_import_db_does_not_import_sqlalchemy():
    import subprocess
    import sys

    code = "import sys, db; print('sqlalchemy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parents[2], check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("how", ["merge", "merge_many"])
def test_a_write_that_loses_a_race_is_run_again_and_gives_up_after_its_attempts(
        tmp_path, monkeypatch, how):
    """``put``/``merge``/``merge_many`` share one retry loop (``ScheduleDB._write``): a write
    transaction that found the database locked, or lost an insert race, runs again after a
    pause; one that keeps losing races raises DatabaseUnavailable, one still locked when its
    ``lock_wait_s`` has passed DatabaseLocked; any other error is not retried."""
    from sqlalchemy.exc import IntegrityError, OperationalError

    from db import _store

    pauses = []
    monkeypatch.setattr(_store.time, "sleep", pauses.append)
    failures: list[Exception] = []
    store = open_db(tmp_path / "s.sqlite")
    real = store._transaction

    def transaction(*, write):
        if write and failures:
            raise failures.pop(0)
        return real(write=write)

    monkeypatch.setattr(store, "_transaction", transaction)

    def write(seqlen):
        if how == "merge":
            return store.merge(row(p=problem(seqlen)))
        return store.merge_many([row(p=problem(seqlen))])[0]

    failures[:] = [OperationalError("INSERT", {}, Exception("database is locked")),
                   IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))]
    assert write(1024) == ("added", "") and len(pauses) == 2 and not failures
    failures[:] = [IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))] * 8
    with pytest.raises(db.DatabaseUnavailable, match="8 attempts in a row lost an insert race"):
        write(2048)
    store._lock_wait_s = 0.0  # the wait is over at the first lock found
    failures[:] = [OperationalError("INSERT", {}, Exception("database is locked"))]
    with pytest.raises(db.DatabaseUnavailable, match="s.sqlite is locked by another process"):
        write(2048)
    failures[:] = [OperationalError("INSERT", {}, Exception("disk I/O error"))]
    with pytest.raises(OperationalError, match="disk I/O"):
        write(4096)
    assert len(pauses) == 9 and len(store.rows()) == 1
