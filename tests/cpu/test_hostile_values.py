"""Hostile values: dimensions (and the products of them the kernel indexes) beyond int32,
integers beyond 64 bits, numbers beyond a 64-bit float, in ``Problem``, in tensors and in files
given to ``tiledtune import`` (rejected row by row with the field named, the other rows
imported); and spreadsheet formula injection through the text cells of ``tiledtune export``'s
CSV (neutralised with a leading ``'``, read back unchanged)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

import db
from tiledattention import FORWARD, Problem, Schedule, UnsupportedProblemError
from tiledattention.tooling import codecs, current_provenance
from tiledattention import problem_from_arrays
from tuner import cli
from tuner.transfer import rows_to_csv

CODECS = codecs()
PROV = current_provenance(FORWARD)
H100 = "NVIDIA H100 80GB HBM3"
T0 = datetime(2025, 7, 1, 8, 30, tzinfo=timezone.utc)
INT32_MAX = 2**31 - 1
#: Starts of a cell that a spreadsheet runs as a formula.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
#: Text columns of the CSV form (numbers, times and the JSON cells are not text).
TEXT_COLUMNS = ("family", "arch", "device_name", *db.PROVENANCE_FIELDS)


def problem(**changes) -> Problem:
    fields = dict(batch=1, heads_q=16, heads_kv=4, seqlen_q=1024, seqlen_k=1024, head_dim=128,
                  dtype="bf16", causal=True)
    return Problem(**{**fields, **changes})


def row(seqlen: int, *, device: str = H100, prov=PROV, n: int = 0) -> db.ScheduleRow:
    p = problem(seqlen_q=seqlen, seqlen_k=seqlen)
    ms = seqlen / 1000
    return db.ScheduleRow(family="forward", arch="sm_90", device_name=device, problem=p,
                          schedule=Schedule(tile_m=128, occupancy=2), median_ms=ms,
                          spread_ms=ms / 50, tflops=p.flops / (ms * 1e9), default_ms=ms * 1.2,
                          trials=9 + n, created_at=T0 + timedelta(seconds=n), provenance=prov)


def fill(path: Path, rows) -> Path:
    with db.ScheduleDB(path, codecs=CODECS) as database:
        for r in rows:
            assert database.put(r) == "added"
    return path


def all_rows(path: Path) -> list[db.ScheduleRow]:
    if not path.exists():
        return []
    with db.ScheduleDB(path, codecs=CODECS, read_only=True) as database:
        return sorted(database.rows(), key=lambda r: r.key)


@pytest.fixture
def tiledtune(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    return lambda *argv: cli.main([str(a) for a in argv])


def rejections(err: str) -> dict[int, str]:
    """``{row index: reason}`` from the import's stderr (``FILE: row N: reason``)."""
    found = {}
    for line in err.splitlines():
        _, sep, rest = line.partition(": row ")
        if sep:
            index, _, reason = rest.partition(": ")
            found[int(index)] = reason
    return found


# -- Problem and tensors ----------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("batch", 10**400), ("seqlen_q", 2**62), ("seqlen_k", 2**31), ("heads_q", 2**31),
    ("heads_kv", 2**64)], ids=["batch-10**400", "seqlen_q-2**62", "seqlen_k-2**31",
                               "heads_q-2**31", "heads_kv-2**64"])
def test_problem_rejects_a_dimension_beyond_int32(field, value):
    with pytest.raises(UnsupportedProblemError,
                       match=rf"^{field} must be at most {INT32_MAX} \(2\*\*31-1"):
        problem(**{field: value})


@pytest.mark.parametrize("changes, product", [
    # B*H_q*S_q*D = 1024*16*1024*128 = 2**31 elements of q
    (dict(batch=1024, heads_q=16, heads_kv=16), "batch*heads_q*seqlen_q*padded head_dim "
                                                "(1024*16*1024*128 = 2147483648"),
    # the keys alone: 1*4*2**22*128 = 2**31 elements of k
    (dict(seqlen_k=2**22), "batch*heads_kv*seqlen_k*padded head_dim (1*4*4194304*128"),
    # D=72 is loaded as 128 columns: 1*16*2**20*72 < 2**31 but 1*16*2**20*128 = 2**31
    (dict(seqlen_q=2**20, seqlen_k=1, head_dim=72),
     "batch*heads_q*seqlen_q*padded head_dim (1*16*1048576*128 = 2147483648"),
], ids=["q-elements", "k-elements", "padded-head-dim"])
def test_problem_rejects_a_product_beyond_int32(changes, product):
    with pytest.raises(UnsupportedProblemError) as exc:
        problem(**changes)
    assert str(exc.value).startswith(product), str(exc.value)
    assert f"must be at most {INT32_MAX}" in str(exc.value)
    # half of each still fits
    halved = {name: value // 2 if name in ("batch", "seqlen_q", "seqlen_k") and value > 1
              else value for name, value in changes.items()}
    assert problem(**halved).as_tuple()


class CudaLike(torch.Tensor):
    """A meta tensor (a shape and strides, no memory) that says it lives on a GPU."""

    is_cuda = property(lambda self: True)


CudaLike.__module__ = "torch.testing_hostile"  # problem_from_arrays looks for torch's module


def cuda_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.Tensor._make_subclass(CudaLike, tensor)


def meta(*shape: int) -> torch.Tensor:
    return cuda_like(torch.empty(*shape, dtype=torch.bfloat16, device="meta"))


def test_problem_from_arrays_refuses_tensors_beyond_int32():
    # 1*128*131072*128 = 2**31 elements of q (4 GiB of bf16: the launch would index past int32)
    q, k = meta(1, 128, 131072, 128), meta(1, 8, 131072, 128)
    with pytest.raises(UnsupportedProblemError, match="elements of q and out"):
        problem_from_arrays(q, k, k, True, None)
    # half of it is fine
    q = meta(1, 64, 131072, 128)
    assert problem_from_arrays(q, k, k, True, None)[0].heads_q == 64
    # views into a packed [B, S, 3, H, D] qkv buffer: 2**30 elements each, but the last row of
    # q lies 3.2e9 elements past its first
    packed = torch.empty(2, 65536, 3, 64, 128, dtype=torch.bfloat16, device="meta")
    q, k, v = (cuda_like(packed[:, :, i].transpose(1, 2)) for i in range(3))
    assert q.shape == (2, 64, 65536, 128)
    with pytest.raises(UnsupportedProblemError, match=r"q must lie within 2147483647"):
        problem_from_arrays(q, k, v, True, None)


# -- import: numbers no row can hold ------------------------------------------------------------
HUGE = "1" + "0" * 400  # 10**400
GIGANTIC = "9" * 5000  # more digits than int() converts (4300)


def hostile_json_items() -> tuple[list[str], dict[int, str], list[db.ScheduleRow]]:
    """Row texts of a JSON file, the reason expected for each bad row index, the good rows."""
    good = [row(512, n=1), row(2048, n=2), row(4096, n=3)]
    base = row(1024).to_dict()

    def variant(text_value: str, *path: str) -> str:
        data = json.loads(json.dumps(base))
        target = data
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = "@@VALUE@@"
        return json.dumps(data).replace('"@@VALUE@@"', text_value)

    big_problem = json.dumps({**base, "problem": {**base["problem"], "batch": 1024,
                                                  "heads_q": 16, "heads_kv": 16}})
    as_text = {**base, "problem": json.dumps(base["problem"]).replace('"batch": 1',
                                                                     f'"batch": {HUGE}')}
    items = [
        json.dumps(good[0].to_dict()),
        variant(HUGE, "problem", "batch"),
        variant(str(2**62), "problem", "seqlen_q"),
        big_problem,
        variant(str(2**70), "trials"),
        variant("1e400", "median_ms"),
        variant(HUGE, "median_ms"),
        variant(GIGANTIC, "problem", "seqlen_k"),
        variant(f"-{HUGE}", "schedule", "tile_m"),
        variant("true", "schedule", "format"),
        json.dumps(as_text),
        json.dumps(good[1].to_dict()),
        variant("1e400", "tflops"),
        json.dumps(good[2].to_dict()),
    ]
    reasons = {
        1: "problem.batch must be an integer within signed 64 bits",
        2: f"seqlen_q must be at most {INT32_MAX}",
        3: f"batch*heads_q*seqlen_q*padded head_dim (1024*16*1024*128 = 2147483648 elements "
           f"of q and out) must be at most {INT32_MAX}",
        4: "trials must be an integer within signed 64 bits; got 1180591620717411303424",
        5: "median_ms must be a finite number; got 1e400",
        6: "median_ms must be an integer within signed 64 bits",
        7: "problem.seqlen_k must be an integer within signed 64 bits; got 999999999999...",
        8: "schedule.tile_m must be an integer within signed 64 bits",
        9: "schedule.format must be an int; got true",
        10: "problem.batch must be an integer within signed 64 bits",
        12: "tflops must be a finite number; got 1e400",
    }
    return items, reasons, good


def test_json_import_rejects_numbers_beyond_the_limits_row_by_row(tiledtune, tmp_path, capsys):
    items, reasons, good = hostile_json_items()
    path = tmp_path / "hostile.json"
    path.write_text(f'{{"format": {db.ROW_FORMAT}, "rows": [{", ".join(items)}]}}')
    target = tmp_path / "target.sqlite"
    capsys.readouterr()
    assert tiledtune("import", path, "--db", target) == 1  # some rows rejected
    found = rejections(capsys.readouterr().err)
    assert sorted(found) == sorted(reasons)
    for index, reason in reasons.items():
        assert reason in found[index], (index, found[index])
    assert all_rows(target) == sorted(good, key=lambda r: r.key)


def test_csv_import_rejects_numbers_beyond_the_limits_row_by_row(tiledtune, tmp_path, capsys):
    good = [row(512, n=1), row(1024, n=2)]
    text = rows_to_csv(good)
    header, first, second = text.splitlines()
    columns = next(csv.reader([header]))
    cells = next(csv.reader([second]))

    def variant(**changes: str) -> str:
        out = list(cells)
        for name, value in changes.items():
            out[columns.index(name)] = value
        line = io.StringIO()
        csv.writer(line, lineterminator="").writerow(out)
        return line.getvalue()

    def problem_cell(**changes: str) -> str:  # the problem's JSON cell, values as JSON text
        data = json.loads(cells[columns.index("problem")])
        data.update({name: f"@@{name}@@" for name in changes})
        text = db.canonical_json(data)
        for name, value in changes.items():
            text = text.replace(f'"@@{name}@@"', value)
        return text

    bad = [
        variant(problem=problem_cell(batch=HUGE)),
        variant(problem=problem_cell(seqlen_q=str(2**62))),
        variant(problem=problem_cell(batch="1024", heads_q="16", heads_kv="16", seqlen_q="1024")),
        variant(trials=str(2**70)),
        variant(median_ms="1e400"),
        variant(trials=GIGANTIC),
        variant(spread_ms="nan"),
    ]
    reasons = {
        1: "problem.batch must be an integer within signed 64 bits",
        2: f"seqlen_q must be at most {INT32_MAX}",
        3: "batch*heads_q*seqlen_q*padded head_dim (1024*16*1024*128 = 2147483648 elements",
        4: "trials must be an integer within signed 64 bits; got 1180591620717411303424",
        5: "median_ms must be a finite number; got 1e400",
        6: "trials must be an integer within signed 64 bits; got 999999999999...",
        7: "spread_ms must be a finite number; got nan",
    }
    path = tmp_path / "hostile.csv"
    path.write_text("\n".join([header, first, *bad, second]) + "\n")
    target = tmp_path / "target.sqlite"
    capsys.readouterr()
    assert tiledtune("import", path, "--db", target) == 1
    found = rejections(capsys.readouterr().err)
    assert sorted(found) == sorted(reasons)
    for index, reason in reasons.items():
        assert reason in found[index], (index, found[index])
    assert all_rows(target) == sorted(good, key=lambda r: r.key)


# -- export: spreadsheet formulas ---------------------------------------------------------------
INJECTIONS = ['=HYPERLINK("http://x","y")', "=cmd|' /C calc'!A0", "+1", "-2", "@SUM(1)",
              "'quoted", "''", "'=already quoted", "NVIDIA H100 80GB HBM3"]


def injection_rows() -> list[db.ScheduleRow]:
    rows = [row(256 * (i + 1), device=name, n=i) for i, name in enumerate(INJECTIONS)]
    # the provenance columns are text too
    rows.append(row(64, device="NVIDIA H200", n=20,
                    prov=dataclasses.replace(PROV, torch="=1+1", driver="-13.0")))
    rows.append(row(128, device="NVIDIA H200", n=21,
                    prov=dataclasses.replace(PROV, torch="@2.9", driver="+13.0")))
    return rows


def exported_csv(tiledtune, tmp_path: Path, rows) -> tuple[Path, list[dict[str, str]]]:
    source = fill(tmp_path / "source.sqlite", rows)
    out = tmp_path / "rows.csv"
    assert tiledtune("export", "--format", "csv", "-o", out, "--db", source,
                     "--include-stale") == 0
    with open(out, newline="") as f:
        return out, list(csv.DictReader(f))


def test_csv_export_neutralises_formula_text_cells_and_import_reads_them_back(tiledtune,
                                                                             tmp_path, capsys):
    rows = injection_rows()
    out, cells = exported_csv(tiledtune, tmp_path, rows)
    assert len(cells) == len(rows)
    for cell in cells:
        for name in TEXT_COLUMNS:
            assert not cell[name].startswith(FORMULA_START), (name, cell[name])
    devices = {cell["device_name"] for cell in cells}
    assert {"'" + name for name in INJECTIONS[:7]} <= devices  # a formula, or a leading '
    assert "''=already quoted" in devices and "NVIDIA H100 80GB HBM3" in devices
    assert {cell["torch"] for cell in cells} >= {"'=1+1", "'@2.9"}
    assert {cell["driver"] for cell in cells} >= {"'-13.0", "'+13.0"}
    # import takes exactly the one quote off: the same rows come back
    fresh = tmp_path / "fresh.sqlite"
    assert tiledtune("import", out, "--db", fresh) == 0, capsys.readouterr().err
    assert all_rows(fresh) == sorted(rows, key=lambda r: r.key)
    assert {r.device_name for r in all_rows(fresh)} >= set(INJECTIONS)


@pytest.mark.parametrize("device", ["\tx", "\rx"], ids=["tab", "carriage-return"])
def test_csv_export_neutralises_control_characters_that_import_refuses(tiledtune, tmp_path,
                                                                        capsys, device):
    """The database takes such a name; the CSV cell must not start a formula, and import
    refuses it (not printable) rather than storing a changed name."""
    rows = [row(512, device=device), row(1024, n=1)]
    out, cells = exported_csv(tiledtune, tmp_path, rows)
    assert {c["device_name"] for c in cells} == {"'" + device, H100}
    fresh = tmp_path / "fresh.sqlite"
    capsys.readouterr()
    assert tiledtune("import", out, "--db", fresh) == 1
    found = rejections(capsys.readouterr().err)
    assert len(found) == 1 and "device_name must be printable text" in next(iter(found.values()))
    assert all_rows(fresh) == [rows[1]]
