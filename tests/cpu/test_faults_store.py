"""The schedule store's fault catalogue as CI tests (issue 45, point 5): the corrupt-database and
hostile-import matrices of ``scripts/reliability_cases.py``, run through the real CLI in this
process (``tuner.cli.main``), and the validated inputs of point 4.

For every corrupt database and every command (``list``, ``export``, ``import``): no traceback;
the exit status the README's rule gives (0 done; 2 what the user gave or their environment
cannot be used, in one line ``tiledtune COMMAND: ...`` naming the database; 1 only where the
command documents it: ``export`` found nothing to write, ``import`` rejected some rows); a file
that is refused, or only read, left byte for byte as it was, with nothing made beside it; and no
row lost from a database that was merged into.

For every hostile import file: no traceback; the file rejected whole (exit 2, one line) or each
bad row rejected with its reason on one line (exit 1) while the file's good row is still
imported; the good database's rows unchanged, above all by a row claiming an impossible time
(``median_ms 1e-300`` once replaced a real row), a key named twice, or a date in year 9999.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import db
import tiledattention as ta
from tiledattention import DECODE, FORWARD, DecodeSchedule, Problem, Schedule
from tiledattention.tooling import codecs, current_provenance
from tuner import cli

from .test_read_only import deny_writes

H100 = "NVIDIA H100 80GB HBM3"


def _problem(seqlen: int, **changes) -> Problem:
    return Problem(**{**dict(batch=1, heads_q=16, heads_kv=16, seqlen_q=seqlen, seqlen_k=seqlen,
                             head_dim=128, dtype="bf16", causal=False), **changes})


def _row(seqlen: int, median_ms: float, **changes) -> db.ScheduleRow:
    fields = dict(family="forward", arch="sm_90", device_name=H100, problem=_problem(seqlen),
                  schedule=Schedule(tile_m=64, tile_n=64), median_ms=median_ms,
                  spread_ms=0.01, tflops=100.0, trials=8, default_ms=2 * median_ms,
                  provenance=current_provenance(FORWARD))
    return db.ScheduleRow(**{**fields, **changes})


#: The rows of the good database: real H100 times (well under the peak rate).
GOOD = [_row(1024, 0.05), _row(2048, 0.2), _row(4096, 0.6)]
#: A valid row of a key the good database lacks: every hostile file carries it as well.
NEW = _row(512, 0.03)


def _stored(path: Path) -> dict[tuple, tuple]:
    """Every row of a SQLite file as stored, by key (nothing decoded)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        columns = [c[1] for c in connection.execute("PRAGMA table_info(schedules)")]
        if not columns:
            return {}
        found = connection.execute(f"SELECT {', '.join(columns)} FROM schedules").fetchall()
    finally:
        connection.close()
    records = [dict(zip(columns, r)) for r in found]
    return {(r["family"], r["arch"], r["device_name"], r["problem"]):
            tuple(v for k, v in r.items() if k != "id") for r in records}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("good") / "good.sqlite"
    with db.ScheduleDB(path, codecs=codecs()) as store:
        store.merge_many(GOOD)
    return path


@pytest.fixture
def tiledtune(monkeypatch, tmp_path, capsys):
    """``tiledtune ARGV`` in this process: ``(exit status, stdout, stderr)``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("TILEDATTN_DB", raising=False)
    monkeypatch.delenv("TILEDATTN_LOCK_WAIT", raising=False)

    def run(*argv) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def _one_line(command: str, err: str, *names: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tiledtune {command}: "), err
    for name in names:
        assert name in lines[0], (name, err)


# -- the corrupt-database matrix -----------------------------------------------------------------

def _copy(good: Path, tmp: Path, sql: str) -> Path:
    path = tmp / "db.sqlite"
    shutil.copyfile(good, path)
    connection = sqlite3.connect(path)
    connection.executescript(sql)
    connection.commit()
    connection.close()
    return path


def _file(tmp: Path, data: bytes) -> Path:
    path = tmp / "db.sqlite"
    path.write_bytes(data)
    return path


def _sqlite(tmp: Path, sql: str) -> Path:
    path = tmp / "db.sqlite"
    connection = sqlite3.connect(path)
    connection.executescript(sql)
    connection.commit()
    connection.close()
    return path


def _garbage_page(good: Path, tmp: Path) -> Path:
    data = bytearray(good.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page + 8:page + 400] = bytes(range(256)) + bytes(range(136))  # the table's b-tree
    return _file(tmp, bytes(data))


def _garbage_wal(good: Path, tmp: Path) -> Path:
    path = tmp / "db.sqlite"
    shutil.copyfile(good, path)
    Path(f"{path}-wal").write_bytes(bytes(range(256)) * 20)  # no valid frame: SQLite ignores it
    return path


def _directory(tmp: Path) -> Path:
    path = tmp / "db.sqlite"
    path.mkdir()
    return path


def _fifo(tmp: Path) -> Path:
    path = tmp / "db.sqlite"
    os.mkfifo(path)  # read, it would block for ever
    return path


def _dangling(tmp: Path) -> Path:
    path = tmp / "db.sqlite"
    path.symlink_to(tmp / "gone" / "target.sqlite")
    return path


def _read_only(good: Path, tmp: Path, monkeypatch, what: str) -> Path:
    folder = tmp / "deployed"
    folder.mkdir()
    path = folder / "db.sqlite"
    shutil.copyfile(good, path)
    locked = folder if what == "folder" else path
    deny_writes(monkeypatch, locked)  # root passes permission checks: os.access says no
    return path


#: ``id: (make(good, tmp, monkeypatch) -> location, exit of list, export, import)``; export's 1:
#: nothing to export; the one bad row of a copy is skipped by readers with a warning.
CORRUPT = {
    "0-byte file": (lambda g, t, m: _file(t, b""), 0, 0, 0),
    "truncated": (lambda g, t, m: _file(t, g.read_bytes()[:5000]), 2, 2, 2),
    "truncated header": (lambda g, t, m: _file(t, g.read_bytes()[:50]), 2, 2, 2),
    "random bytes": (lambda g, t, m: _file(t, bytes(range(256)) * 32), 2, 2, 2),
    "zero bytes": (lambda g, t, m: _file(t, bytes(8192)), 2, 2, 2),
    "text file": (lambda g, t, m: _file(t, b"schedules: none\n"), 2, 2, 2),
    "garbage b-tree page": (lambda g, t, m: _garbage_page(g, t), 2, 2, 2),
    "foreign tables": (lambda g, t, m: _sqlite(t, "CREATE TABLE notes (x TEXT);"), 2, 2, 2),
    "SQLite without tables": (lambda g, t, m: _sqlite(t, "PRAGMA user_version = 7;"), 2, 2, 0),
    "schedules table dropped": (lambda g, t, m: _copy(g, t, "DROP TABLE schedules;"), 2, 2, 2),
    "version record deleted": (lambda g, t, m: _copy(
        g, t, "DELETE FROM tiledattention_schema_version;"), 2, 2, 2),
    "version table dropped": (lambda g, t, m: _copy(
        g, t, "DROP TABLE tiledattention_schema_version;"), 2, 2, 2),
    "wrong columns": (lambda g, t, m: _copy(
        g, t, "DROP TABLE schedules; CREATE TABLE schedules (x INTEGER);"), 2, 2, 2),
    "median_ms text": (lambda g, t, m: _copy(
        g, t, "UPDATE schedules SET median_ms = 'fast' WHERE id = 1;"), 0, 0, 0),
    "median_ms negative": (lambda g, t, m: _copy(
        g, t, "UPDATE schedules SET median_ms = -1 WHERE id = 1;"), 0, 0, 0),
    "problem not JSON": (lambda g, t, m: _copy(
        g, t, "UPDATE schedules SET problem = '{not json' WHERE id = 3;"), 0, 0, 0),
    "schedule invalid": (lambda g, t, m: _copy(
        g, t, "UPDATE schedules SET schedule = '{\"tile_m\": -5}' WHERE id = 1;"), 0, 0, 0),
    "created_at not a time": (lambda g, t, m: _copy(
        g, t, "UPDATE schedules SET created_at = 'yesterday' WHERE id = 1;"), 0, 0, 0),
    "future schema version": (lambda g, t, m: _copy(
        g, t, "UPDATE tiledattention_schema_version SET version_num = '0099';"), 0, 0, 2),
    "garbage -wal beside it": (lambda g, t, m: _garbage_wal(g, t), 0, 0, 0),
    "a directory": (lambda g, t, m: _directory(t), 2, 2, 2),
    "a FIFO": (lambda g, t, m: _fifo(t), 2, 2, 2),
    "dangling symlink": (lambda g, t, m: _dangling(t), 0, 0, 2),
    "read-only file": (lambda g, t, m: _read_only(g, t, m, "file"), 0, 0, 2),
    "read-only folder": (lambda g, t, m: _read_only(g, t, m, "folder"), 0, 0, 2),
    "bogus URL": (lambda g, t, m: "bogus://nowhere", 2, 2, 2),
}


def _snapshot(location) -> tuple:
    """The bytes of a file at ``location`` and the names in its folder (a FIFO, a directory:
    their kind only)."""
    path = Path(str(location))
    if "://" in str(location):
        return ()
    kind = ("link" if path.is_symlink() else "dir" if path.is_dir() else
            "fifo" if path.exists() and not path.is_file() else
            path.read_bytes() if path.exists() else None)
    return kind, sorted(p.name for p in path.parent.iterdir())


@pytest.mark.parametrize("kind", list(CORRUPT))
def test_a_corrupt_database_is_answered_in_one_line_and_left_as_it_was(kind, good, tmp_path,
                                                                        tiledtune, monkeypatch):
    make, *expected = CORRUPT[kind]
    work = tmp_path / "work"
    work.mkdir()
    location = make(good, work, monkeypatch)
    rows = tmp_path / "rows.json"
    db.dump_rows([NEW, _row(1024, 0.04)], rows)  # a new key, and one the good rows hold
    shown = str(location)
    for command, want in zip(("list", "export", "import"), expected):
        before = _snapshot(location)
        stored = _stored(location) if want == 0 and Path(shown).is_file() \
            and Path(shown).stat().st_size else {}
        argv = {"list": ["list", "--db", location],
                "export": ["export", "--db", location, "-o", tmp_path / "out.json"],
                "import": ["import", "--db", location, rows]}[command]
        code, out, err = tiledtune(*argv)
        assert "Traceback" not in err and "internal error" not in err, (command, err)
        assert code == want, (command, code, err)
        if code == 2:
            _one_line(command, err, shown)
        if code == 2 or command != "import":
            assert _snapshot(location) == before, command  # nothing written, nothing beside it
        elif stored:  # merged into: every stored key is still there
            after = _stored(location)
            assert set(stored) <= set(after), command


# -- the hostile-import matrix -------------------------------------------------------------------

def _dict(row: db.ScheduleRow) -> dict:
    return json.loads(json.dumps(row.to_dict()))


def _rows_text(*items: str) -> str:
    """A rows file of the given row texts (each a JSON value's text)."""
    return '{"format": %d, "rows": [%s]}' % (db.ROW_FORMAT, ", ".join(items))


def _with(row: db.ScheduleRow, *path_and_value) -> str:
    """``row``'s JSON text with the field at ``path`` set to ``value`` (a JSON text)."""
    *path, value = path_and_value
    data = _dict(row)
    where = data
    for name in path[:-1]:
        where = where[name]
    marker = "\x00MARK\x00"
    where[path[-1]] = marker
    return json.dumps(data).replace(json.dumps(marker), value)


def _without(row: db.ScheduleRow, name: str) -> str:
    data = _dict(row)
    del data[name]
    return json.dumps(data)


def _twice(row: db.ScheduleRow, where: str, key: str, value: str) -> str:
    """``row``'s JSON text with ``key`` named a second time in ``where`` ("row" or a nested
    object's field name), with ``value``."""
    text = json.dumps(_dict(row))
    if where == "row":
        return text[:-1] + f', "{key}": {value}}}'
    start = text.index(f'"{where}": {{') + len(f'"{where}": {{')
    return text[:start] + f'"{key}": {value}, ' + text[start:]


STORED = _row(1024, 0.05)  # GOOD[0]: the key a hostile row tries to replace
FAST_DECODE = db.ScheduleRow(
    family="decode", arch="sm_90", device_name=H100,
    problem=Problem(batch=8, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=131072,
                    head_dim=128, dtype="bf16", causal=False),
    schedule=DecodeSchedule(), median_ms=0.2, spread_ms=0.001, tflops=80.0, trials=8,
    provenance=current_provenance(DECODE))
NEW_TEXT = json.dumps(_dict(NEW))
FUTURE = datetime(9999, 1, 1, tzinfo=timezone.utc).isoformat()
SOON = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()

#: ``id: (file name, text or bytes, exit status, what the rejection line says)``; row cases hold
#: the hostile row first and ``NEW`` after it (imported: exit 1), file cases are rejected whole.
HOSTILE = {
    "malformed JSON": ("rows.json", _rows_text(NEW_TEXT)[:-3], 2, "file rejected: not JSON"),
    "not UTF-8": ("rows.json", b"\xff\xfe{\x00\x00garbage", 2, "not UTF-8"),
    "empty file": ("rows.json", "", 2, "the file is empty"),
    "a JSON list at the top": ("rows.json", "[1, 2, 3]", 2, "expected"),
    "a format from the future": ("rows.json", '{"format": 99, "rows": []}', 2, "format 99"),
    "rows not a list": ("rows.json", '{"format": 4, "rows": {"a": 1}}', 2, "must be a list"),
    "top-level key twice": ("rows.json", '{"format": 4, "format": 4, "rows": []}', 2,
                            "expected"),
    "deeply nested": ("rows.json", _rows_text(_with(NEW, "problem", "[" * 100_000 + "]" * 100_000),
                                              NEW_TEXT), 2, "nested too deeply"),
    "median_ms a string": ("rows.json", _rows_text(_with(STORED, "median_ms", '"fast"'),
                                                   NEW_TEXT), 1, "median_ms"),
    "median_ms NaN": ("rows.json", _rows_text(_with(STORED, "median_ms", "NaN"), NEW_TEXT), 1,
                      "median_ms must be a finite number"),
    "median_ms Infinity": ("rows.json", _rows_text(_with(STORED, "median_ms", "-Infinity"),
                                                   NEW_TEXT), 1, "finite"),
    "median_ms negative": ("rows.json", _rows_text(_with(STORED, "median_ms", "-1.0"),
                                                   NEW_TEXT), 1, "median_ms"),
    "median_ms zero": ("rows.json", _rows_text(_with(STORED, "median_ms", "0"), NEW_TEXT), 1,
                       "median_ms"),
    "median_ms 1e-300": ("rows.json", _rows_text(_with(STORED, "median_ms", "1e-300"),
                                                 NEW_TEXT), 1,
                         "median_ms 1e-300 is faster than physically possible"),
    "median_ms 1e400": ("rows.json", _rows_text(_with(STORED, "median_ms", "1e400"), NEW_TEXT),
                        1, "finite"),
    "baseline 1e-300": ("rows.json", _rows_text(_with(STORED, "baselines_ms",
                                                      '{"torch-cudnn": 1e-300}'), NEW_TEXT), 1,
                        "baselines_ms['torch-cudnn'] 1e-300 is faster than physically"),
    "tflops beyond the peak": ("rows.json", _rows_text(_with(STORED, "tflops", "1e9"),
                                                       NEW_TEXT), 1, "tflops 1e+09 is over 2x"),
    "decode faster than its bytes": ("rows.json", _rows_text(json.dumps(_dict(FAST_DECODE)),
                                                             NEW_TEXT), 1,
                                     "faster than physically possible: 1.72e+10 FLOPs and 4.3 GB"),
    "batch 10**400": ("rows.json", _rows_text(_with(STORED, "problem", "batch", "1" + "0" * 400),
                                              NEW_TEXT), 1, "problem.batch must be an integer"),
    "true as an int": ("rows.json", _rows_text(_with(STORED, "trials", "true"), NEW_TEXT), 1,
                       "trials"),
    "unknown field": ("rows.json", _rows_text(_with(STORED, "speedup", "9.9"), NEW_TEXT), 1,
                      "speedup"),
    "missing field": ("rows.json", _rows_text(_without(STORED, "median_ms"), NEW_TEXT), 1,
                      "median_ms"),
    "key twice in a row": ("rows.json", _rows_text(_twice(STORED, "row", "median_ms", "1e-3"),
                                                   NEW_TEXT), 1,
                           "the row names the key 'median_ms' more than once"),
    "key twice in the problem": ("rows.json", _rows_text(_twice(STORED, "problem", "batch", "64"),
                                                         NEW_TEXT), 1,
                                 "problem names the key 'batch' more than once"),
    "year 9999": ("rows.json", _rows_text(_with(STORED, "created_at", json.dumps(FUTURE)),
                                          NEW_TEXT), 1, "is in the future"),
    "created_at not a time": ("rows.json", _rows_text(_with(STORED, "created_at", '"soon"'),
                                                      NEW_TEXT), 1, "created_at"),
    "an escape in the device name": ("rows.json", _rows_text(_with(
        _row(1024, 0.05, device_name="GPU"), "device_name", json.dumps("GPU\x1b[2J")), NEW_TEXT),
        1, "escape character"),
    "a huge device name": ("rows.json", _rows_text(_with(STORED, "device_name",
                                                         json.dumps("x" * 100_000)), NEW_TEXT),
                           1, "at most 256 characters"),
    "a row that is a number": ("rows.json", _rows_text("42", NEW_TEXT), 1, "must be a mapping"),
    "an unknown architecture": ("rows.json", _rows_text(_with(STORED, "arch", '"sm_999"'),
                                                        NEW_TEXT), 1, "sm_999"),
    "CSV with an unknown header": ("rows.csv", "format,nonsense\n4,1\n", 2, "CSV header"),
    "CSV row of too few cells": ("rows.csv", None, 1, "cells; the header has"),
    "CSV problem cell naming a key twice": ("rows.csv", None, 1,
                                            "problem names the key 'batch' more than once"),
}


def _csv_case(kind: str) -> str:
    from tuner.transfer import rows_to_csv

    header, line = rows_to_csv([STORED]).splitlines()
    new = rows_to_csv([NEW]).splitlines()[1]
    if kind == "CSV row of too few cells":
        return "\n".join([header, line.rsplit(",", 3)[0], new]) + "\n"
    assert '""batch"":1' in line
    return "\n".join([header, line.replace('""batch"":1', '""batch"":1,""batch"":64', 1),
                      new]) + "\n"


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_import_file_is_refused_with_a_reason_and_loses_no_row(kind, good, tmp_path,
                                                                          tiledtune):
    name, content, want, reason = HOSTILE[kind]
    content = _csv_case(kind) if content is None else content
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    target = tmp_path / "team.sqlite"
    shutil.copyfile(good, target)
    before = _stored(target)
    code, out, err = tiledtune("import", "--db", target, path)
    assert "Traceback" not in err and "internal error" not in err, err
    assert code == want, (code, err)
    lines = err.strip().splitlines()
    assert lines and all(line.startswith(f"{path}: ") for line in lines), err
    assert len(lines) == 1 and reason in lines[0], err  # one bad row (or file): one line
    after = _stored(target)
    assert {k: after.get(k) for k in before} == before  # no stored row lost or changed
    added = set(after) - set(before)
    assert len(added) == (1 if want == 1 else 0), added  # the file's good row, when read


def test_an_impossible_time_never_replaces_a_real_row_even_forced(good, tmp_path, tiledtune):
    target = tmp_path / "team.sqlite"
    shutil.copyfile(good, target)
    before = _stored(target)
    rows = tmp_path / "fast.json"
    rows.write_text(_rows_text(_with(STORED, "median_ms", "1e-300")))
    code, out, err = tiledtune("import", "--db", target, "--force", rows)
    assert code == 1 and "faster than physically possible" in err, err
    assert _stored(target) == before


@pytest.mark.parametrize("case", ["just under twice the peak", "an hour ahead", "unicode name"])
def test_import_takes_rows_near_the_bounds(case, good, tmp_path, tiledtune):
    """The bounds are generous: a time at 1.5x the fastest H100-class rate, a timestamp an hour
    ahead (clock skew), a device name in any script."""
    row = {"just under twice the peak": _row(8192, 4 * 16 * 128 * 8192**2 / 1500e12 * 1e3),
           "an hour ahead": _row(512, 0.03, created_at=datetime.fromisoformat(SOON)),
           "unicode name": _row(512, 0.03, device_name="GPU ☃ 日本語 Ω")}[case]
    target = tmp_path / "team.sqlite"
    shutil.copyfile(good, target)
    rows = tmp_path / "rows.json"
    db.dump_rows([row], rows)
    code, out, err = tiledtune("import", "--db", target, rows)
    assert code == 0 and not err.strip(), err
    assert len(_stored(target)) == len(GOOD) + 1


# -- inputs of the runtime's database API ------------------------------------------------------

@pytest.mark.parametrize("bad", [123, b"/tmp/x.sqlite", 1.5, ["a.sqlite"]])
def test_use_database_names_its_argument_and_what_it_takes(bad, monkeypatch):
    monkeypatch.setattr(ta._runtime, "current", None)
    with pytest.raises(ta.InputTypeError, match=r"use_database\(location\) must be a path "
                                                 r"\(str or os.PathLike\), an SQLAlchemy URL "
                                                 rf"string, or None .*; got {type(bad).__name__}"):
        ta.use_database(bad)
    with pytest.raises(ta.InputTypeError, match=r"open_database\(location\)"):
        ta.open_database(bad)


def test_use_database_refuses_a_blank_location_and_takes_a_path(tmp_path, monkeypatch):
    monkeypatch.setattr(ta._runtime, "current", None)
    with pytest.raises(ta.InputValueError, match=r"use_database\(location\) must be a path"):
        ta.use_database("  ")
    ta.use_database(tmp_path / "schedules.sqlite")  # os.PathLike
    ta.use_database(None)
