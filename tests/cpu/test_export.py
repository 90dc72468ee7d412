"""``tiledtune export`` / ``tiledtune import`` on temporary SQLite databases: the generated
ByTarget module (agrees with the runtime lookup, deterministic, accepted by cuTile's compiler),
lossless JSON/CSV round trips, the merge rules, and hostile input rejected row by row."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import itertools
import json
import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import cuda.tile as ct
import pytest
from cuda.tile import compilation as ctc

import db
from tiledattention._lookup import pick, shape_distance
from tiledattention._problem import Problem
from tiledattention._provenance import current_provenance
from tiledattention._schedule import Schedule
from tuner import cli, import_cmd

PROV = current_provenance()
STALE = dataclasses.replace(PROV, template_hash="000000000000")
OTHER_TOOLCHAIN = dataclasses.replace(PROV, cuda_tile="0.9.0")
H100, H200, GB10, GB10_SLOW = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GB10",
                               "NVIDIA GB10 (slow)")
T0 = datetime(2025, 7, 1, 8, 30, 15, 123456, tzinfo=timezone.utc)
NO_DEVICE = "a GPU without rows of its own"


def mk(arch: str, device: str, *, S: int, Sk: int | None = None, B: int = 1, hq: int = 16,
       hkv: int = 4, D: int = 128, dtype: str = "bf16", causal: bool = True, ms: float,
       prov=PROV, n: int = 0, **schedule) -> db.ScheduleRow:
    problem = Problem(batch=B, heads_q=hq, heads_kv=hkv, seqlen_q=S, seqlen_k=Sk or S,
                      head_dim=D, dtype=dtype, causal=causal)
    return db.ScheduleRow(
        arch=arch, device_name=device, problem=problem, schedule=Schedule(**schedule),
        median_ms=ms, spread_ms=ms / 97, tflops=problem.flops / (ms * 1e9), default_ms=ms * 1.3,
        torch_cudnn_ms=None if n % 2 else ms * 1.1, torch_flash_ms=ms * 1.7 if n % 3 else None,
        trials=7 + n, created_at=T0 + timedelta(seconds=n, microseconds=n), provenance=prov)


def fp16(device: str, **kw) -> db.ScheduleRow:
    return mk("sm_90", device, D=64, dtype="fp16", causal=False, hq=8, hkv=8, B=2, **kw)


def synthetic_rows() -> list[db.ScheduleRow]:
    """Winners per bucket (sm_90): occupancy 2,4,2,1,1,2,2,4 -> 2; num_ctas 2,2,2,2,2,1,1,1 -> 2;
    opt_level 3 x7, 2 x1 -> 3. sm_121 buckets: occupancy 1 and 2 (a tie -> Schedule's default 1;
    a per-row count would say 2 because of the slower GB10 row), opt_level 2. Overall: occupancy
    2 (5 of 10), num_ctas tie 5:5 -> 1, opt_level 3."""
    rows = [
        mk("sm_90", H100, S=512, ms=0.05, occupancy=2, num_ctas=2),
        mk("sm_90", H100, S=1024, ms=0.2, occupancy=2, num_ctas=1),  # loses its bucket to H200
        mk("sm_90", H200, S=1024, ms=0.15, tile_m=128, occupancy=4, num_ctas=2, exp2=True),
        mk("sm_90", H100, S=2048, ms=0.6, occupancy=2, num_ctas=2, k_latency=3),
        mk("sm_90", H100, S=4096, ms=2.0, tile_m=128, tile_n=128, occupancy=1, num_ctas=2),
        mk("sm_90", H100, S=8192, ms=8.0, tile_m=128, tile_n=128, num_ctas=2, opt_level=2),
        mk("sm_90", H100, S=1024, B=4, ms=0.12, occupancy=2, approx_div=True),  # fastest
        fp16(H100, S=1024, ms=0.1, tile_n=32, occupancy=2),
        fp16(H100, S=1024, Sk=4096, ms=0.35, occupancy=4, k_transposed=True),
        mk("sm_121", GB10, S=1024, ms=1.0, occupancy=1, opt_level=2),
        mk("sm_121", GB10, S=4096, ms=9.0, occupancy=2, opt_level=2, exp2=True),
        mk("sm_121", GB10_SLOW, S=4096, ms=12.0, occupancy=2, opt_level=2),
        mk("sm_100", "NVIDIA B200", S=2048, ms=0.1, occupancy=3, prov=STALE),
    ]
    return [dataclasses.replace(r, trials=5 + i, created_at=T0 + timedelta(minutes=i))
            for i, r in enumerate(rows)]


def fill(path: Path, rows) -> Path:
    with db.ScheduleDB(path) as database:
        for row in rows:
            assert database.put(row) == "added"
    return path


def all_rows(path: Path) -> list[db.ScheduleRow]:
    with db.ScheduleDB(path, read_only=True) as database:
        return database.rows()


@pytest.fixture
def tiledtune(monkeypatch):
    """The CLI as tests call it: ``tuner.cli.main(argv)``, with rich tables one line per row."""
    monkeypatch.setenv("COLUMNS", "200")
    return lambda *argv: cli.main([str(a) for a in argv])


@pytest.fixture
def source_db(tmp_path) -> Path:
    return fill(tmp_path / "source.sqlite", synthetic_rows())


def load_module(path: Path, name: str = "tuned_schedules"):
    spec = importlib.util.spec_from_file_location(f"_exported_{name}_{id(path)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def exported(tiledtune, source_db, tmp_path):
    out = tmp_path / "tuned.py"
    assert tiledtune("export", "--format", "bytarget", "-o", out, "--db", source_db) == 0
    return load_module(out)


# -- the ByTarget module ------------------------------------------------------------------------
def test_bytarget_values_are_most_common_winners_per_arch(exported):
    assert exported.ARCHITECTURES == ("sm_90", "sm_121")  # the stale sm_100 row is left out
    assert exported.OCCUPANCY == ct.ByTarget(sm_90=2, sm_121=1, default=2)
    assert exported.NUM_CTAS == ct.ByTarget(sm_90=2, sm_121=1, default=1)
    assert exported.OPT_LEVEL == ct.ByTarget(sm_90=3, sm_121=2, default=3)
    assert exported.KERNEL_OPTIONS["occupancy"] == {"default": 2,
                                                    "by_arch": {"sm_90": 2, "sm_121": 1}}
    assert [len(exported.SCHEDULES[a]) for a in ("sm_90", "sm_121")] == [8, 2]


def test_header_states_provenance_without_timestamp(tiledtune, source_db, tmp_path):
    out = tmp_path / "tuned.py"
    assert tiledtune("export", "-o", out, "--db", source_db) == 0  # format from the suffix
    header = [line for line in out.read_text().splitlines() if line.startswith("#")][:8]
    text = "\n".join(header)
    assert f"Source database: {source_db}" in text
    assert "Rows: 12;" in text  # 13 stored, the stale one skipped
    assert f"cuda_tile={PROV.cuda_tile}" in text and f"template_hash={PROV.template_hash}" in text
    assert "000000000000" not in text
    assert str(datetime.now().year) not in text.replace(str(source_db), "")


def test_include_stale_exports_other_templates(tiledtune, source_db, tmp_path):
    out = tmp_path / "all.py"
    assert tiledtune("export", "-o", out, "--db", source_db, "--include-stale") == 0
    module = load_module(out, "stale")
    assert module.ARCHITECTURES == ("sm_90", "sm_100", "sm_121")
    assert module.KERNEL_OPTIONS["occupancy"]["by_arch"]["sm_100"] == 3


def query_problems() -> list[Problem]:
    """Every tuned shape and nearby untuned ones (odd lengths, S_q != S_k, other batch sizes,
    exact distance ties) plus shapes with no comparable bucket."""
    problems = [r.problem for r in synthetic_rows()]
    for S, Sk, B in itertools.product((1, 17, 300, 700, 1024, 1500, 3000, 4097, 16384),
                                      (None, 1000, 2048), (1, 2, 3, 8)):
        problems.append(Problem(batch=B, heads_q=16, heads_kv=4, seqlen_q=S, seqlen_k=Sk or S,
                                head_dim=128, dtype="bf16", causal=True))
    for S, Sk in ((2048, 2048), (1024, 2000), (113, 5000), (4097, 1024)):
        problems.append(Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=S, seqlen_k=Sk,
                                head_dim=64, dtype="fp16", causal=False))
    problems += [
        Problem(batch=1, heads_q=16, heads_kv=4, seqlen_q=1024, seqlen_k=1024, head_dim=96,
                dtype="bf16", causal=True),  # other head_dim
        Problem(batch=1, heads_q=16, heads_kv=16, seqlen_q=1024, seqlen_k=1024, head_dim=128,
                dtype="bf16", causal=True),  # other group size
        Problem(batch=1, heads_q=16, heads_kv=4, seqlen_q=1024, seqlen_k=1024, head_dim=128,
                dtype="fp16", causal=True),  # other dtype
    ]
    return problems


@pytest.mark.parametrize("arch", ["sm_90", "sm_121", "sm_100"])
def test_select_agrees_with_runtime_pick(exported, source_db, arch):
    with db.ScheduleDB(source_db, read_only=True) as database:
        rows = [r for r in database.rows(arch=arch)
                if r.provenance.template_hash == PROV.template_hash]  # as the Resolver does
    answered = 0
    for p in query_problems():
        found = pick(rows, p, NO_DEVICE)
        got = exported.select(arch, p.dtype, p.causal, p.head_dim, p.seqlen_q, p.seqlen_k,
                              batch_heads=p.batch * p.heads_q, group=p.group_size)
        expected = None if found is None else found[0].schedule.to_dict()
        assert got == expected, (arch, p.describe())
        answered += got is not None
    assert answered > (40 if arch == "sm_90" else 30 if arch == "sm_121" else -1)
    if arch == "sm_90":  # the H200 row wins its bucket; the result is a copy, not the table
        got = exported.select("sm_90", "bf16", True, 128, 1024, 1024, 16, 4)
        assert Schedule.from_dict(got) == Schedule(tile_m=128, occupancy=4, num_ctas=2,
                                                   exp2=True)
        got["tile_m"] = 16
        assert exported.select("sm_90", "bf16", True, 128, 1024, 1024, 16, 4)["tile_m"] == 128


def test_select_without_batch_heads_and_bad_input(exported):
    # batch_heads=None ignores that term: S=1024 ties B1 (H200, 0.15 ms) and B4 (0.12 ms)
    assert exported.select("sm_90", "bf16", True, 128, 1024, 1024, group=4)["approx_div"]
    assert exported.select("sm_90", "bf16", True, 128, 1024, 1024) is None  # group 1: none
    assert exported.select("sm_999", "bf16", True, 128, 1024, 1024, group=4) is None
    with pytest.raises(ValueError, match="seqlen_q must be a positive int"):
        exported.select("sm_90", "bf16", True, 128, 0, 1024)


def test_module_distance_is_the_lookup_distance(exported):
    rng = random.Random(7)
    for _ in range(2000):
        a, b = (Problem(batch=rng.randint(1, 64), heads_q=rng.choice((8, 16, 32)), heads_kv=8,
                        seqlen_q=rng.randint(1, 70000), seqlen_k=rng.randint(1, 70000),
                        head_dim=64, dtype="bf16", causal=False) for _ in range(2))
        entry = {"seqlen_q": b.seqlen_q, "seqlen_k": b.seqlen_k,
                 "batch_heads": b.batch * b.heads_q}
        assert exported.shape_distance(a.seqlen_q, a.seqlen_k, a.batch * a.heads_q, entry) \
            == shape_distance(a, b)


def test_module_imports_without_cuda_tile(tiledtune, source_db, tmp_path, monkeypatch):
    out = tmp_path / "tuned.py"
    assert tiledtune("export", "--format", "bytarget", "-o", out, "--db", source_db) == 0
    monkeypatch.setitem(sys.modules, "cuda.tile", None)  # `import cuda.tile` now fails
    module = load_module(out, "no_cuda_tile")
    assert module.ct is None
    assert (module.OCCUPANCY, module.NUM_CTAS, module.OPT_LEVEL) == (None, None, None)
    assert module.KERNEL_OPTIONS["num_ctas"]["by_arch"] == {"sm_90": 2, "sm_121": 1}
    assert module.select("sm_121", "bf16", True, 128, 4096, 4096, 16, 4)["exp2"] is True


def test_export_is_deterministic_whatever_the_insertion_order(tiledtune, tmp_path):
    location = tmp_path / "db.sqlite"
    outputs = {}
    for order in ("forward", "again", "reversed", "shuffled"):
        rows = synthetic_rows()
        if order == "reversed":
            rows.reverse()
        elif order == "shuffled":
            random.Random(3).shuffle(rows)
        if order != "again":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{location}{suffix}").unlink(missing_ok=True)
            fill(location, rows)
        for fmt in ("bytarget", "json", "csv"):
            out = tmp_path / f"{order}.{fmt}"
            assert tiledtune("export", "--format", fmt, "-o", out, "--db", location) == 0
            outputs.setdefault(fmt, []).append(out.read_bytes())
    for fmt, texts in outputs.items():
        assert len(set(texts)) == 1, fmt
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic writes left no temp files


ConstInt = ct.Constant[int]


def copy_tiles(x, y, TILE: ConstInt):  # decorated in the test with the exported options
    bid = ct.bid(0)
    tile = ct.load(x, index=(bid,), shape=(TILE,))  # [TILE]
    ct.store(y, index=(bid,), tile=tile)


def test_exported_options_compile_with_cutile(exported):
    kernel = ct.kernel(copy_tiles, occupancy=exported.OCCUPANCY, num_ctas=exported.NUM_CTAS,
                       opt_level=exported.OPT_LEVEL)
    array = ctc.ArrayConstraint(ct.float32, 1, index_dtype=ct.int32, stride_lower_bound_incl=0,
                                alias_groups=(), may_alias_internally=False,
                                stride_constant=(1,), base_addr_divisible_by=16)
    signature = ctc.KernelSignature(
        [array, array, 128], calling_convention=ctc.CallingConvention.cutile_python_v1())
    for arch in ("sm_90", "sm_121"):
        buf = io.BytesIO()
        ctc.export_kernel(kernel, [signature], buf, gpu_code=arch, output_format="cubin")
        assert buf.getvalue()[:4] == b"\x7fELF", arch


# -- JSON / CSV round trips and merging ---------------------------------------------------------
@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_round_trip_is_lossless(tiledtune, source_db, tmp_path, fmt):
    out = tmp_path / f"rows.{fmt}"
    assert tiledtune("export", "--format", fmt, "-o", out, "--db", source_db,
                     "--include-stale") == 0
    fresh = tmp_path / "fresh.sqlite"
    assert tiledtune("import", out, "--db", fresh) == 0
    assert all_rows(fresh) == all_rows(source_db)
    assert len(all_rows(fresh)) == 13  # stale rows too, on request
    current = tmp_path / f"current.{fmt}"
    assert tiledtune("export", "--format", fmt, "-o", current, "--db", source_db) == 0
    only = tmp_path / "only.sqlite"
    assert tiledtune("import", current, "--db", only) == 0
    assert len(all_rows(only)) == 12  # by default the stale row stays behind
    assert {r.torch_flash_ms for r in all_rows(fresh)} & {None}  # optional columns survive


def test_arch_filter(tiledtune, source_db, tmp_path):
    out = tmp_path / "rows.csv"
    assert tiledtune("export", "-o", out, "--arch", "sm_121", "--db", source_db) == 0
    fresh = tmp_path / "fresh.sqlite"
    assert tiledtune("import", out, "--db", fresh) == 0
    assert {r.device_name for r in all_rows(fresh)} == {GB10, GB10_SLOW}
    assert tiledtune("export", "-o", out, "--arch", "sm_121a", "--db", source_db) == 2


def table_counts(output: str, name: str) -> dict[str, str]:
    lines = [[c.strip() for c in line.replace("┃", "│").split("│")[1:-1]]
             for line in output.splitlines() if line.replace("┃", "│").count("│") > 2]
    header = next(cells for cells in lines if cells and cells[0] == "file")
    row = next(cells for cells in lines if cells and cells[0] == name)
    return dict(zip(header[1:], row[1:]))


def test_merge_outcomes_are_reported(tiledtune, source_db, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert tiledtune("export", "-o", "rows.json", "--db", source_db, "--include-stale") == 0
    target = tmp_path / "target.sqlite"
    exported = {r.key: r for r in all_rows(source_db)}
    faster, slower, foreign = (r for r in synthetic_rows()[:3])
    fill(target, [dataclasses.replace(faster, median_ms=faster.median_ms / 2),   # kept
                  dataclasses.replace(slower, median_ms=slower.median_ms * 2),   # improved
                  dataclasses.replace(foreign, median_ms=0.001, provenance=OTHER_TOOLCHAIN)])
    capsys.readouterr()
    assert tiledtune("import", "rows.json", "--db", target) == 0
    counts = table_counts(capsys.readouterr().out, "rows.json")
    assert counts == {"added": "10", "improved": "1", "replaced": "1", "forced": "0",
                      "kept": "1", "rejected": "0"}
    stored = {r.key: r for r in all_rows(target)}
    assert stored[faster.key].median_ms == faster.median_ms / 2
    assert stored[slower.key] == exported[slower.key]
    assert stored[foreign.key] == exported[foreign.key]
    # --force overwrites the kept one; a second plain import keeps everything
    assert tiledtune("import", "rows.json", "--db", target, "--force") == 0
    assert table_counts(capsys.readouterr().out, "rows.json")["forced"] == "13"
    assert tiledtune("import", "rows.json", "--db", target) == 0
    assert table_counts(capsys.readouterr().out, "rows.json")["kept"] == "13"
    assert all_rows(target) == all_rows(source_db)


# -- hostile input --------------------------------------------------------------------------------
def hostile_rows() -> tuple[list, list[str], list[db.ScheduleRow]]:
    good = [mk("sm_90", H100, S=1024, ms=0.5, n=1), mk("sm_90", H100, S=2048, ms=0.9, n=2)]
    first = good[0].to_dict()

    def variant(**changes):
        data = json.loads(json.dumps(first))
        for path, value in changes.items():
            *parents, leaf = path.split("__")
            target = data
            for p in parents:
                target = target[p]
            target[leaf] = value
        return data

    items = [
        first,
        variant(median_ms="fast"),                                     # wrong type
        variant(problem__batch=2.5),                                   # wrong type, nested
        variant(arch="sm_999"),                                        # unknown architecture
        variant(schedule__tile_m=48),                                  # schedule does not validate
        variant(median_ms=0.01),                                       # duplicate key, faster
        42,                                                            # not an object
        variant(extra="field"),                                        # unknown field
        variant(device_name="x" * 5000),                               # absurd string
        variant(median_ms=1e400),                                      # inf after parsing
        good[1].to_dict(),
    ]
    reasons = ["'median_ms'", "batch must be a positive int", "unknown architecture 'sm_999'",
               "tile_m must be one of", "duplicate key", "must be a mapping", "unknown row field",
               "device_name must be printable text", "median_ms must be a finite number"]
    return items, reasons, good


def test_hostile_json_rows_are_rejected_with_reasons(tiledtune, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    items, reasons, good = hostile_rows()
    Path("hostile.json").write_text(json.dumps({"format": 1, "rows": items}))
    target = fill(tmp_path / "target.sqlite", [mk("sm_121", GB10, S=64, ms=3.0)])
    before = all_rows(target)
    capsys.readouterr()
    assert tiledtune("import", "hostile.json", "--db", target) == 1
    captured = capsys.readouterr()
    for reason in reasons:
        assert reason in captured.err, reason
    assert table_counts(captured.out, "hostile.json")["rejected"] == str(len(items) - 2)
    assert table_counts(captured.out, "hostile.json")["added"] == "2"
    assert sorted(all_rows(target), key=lambda r: r.key) == sorted(before + good,
                                                                   key=lambda r: r.key)


def test_hostile_csv_rows_are_rejected_with_reasons(tiledtune, source_db, tmp_path, capsys):
    from tuner.export_cmd import rows_to_csv

    good = [mk("sm_90", H100, S=1024, ms=0.5, n=1), mk("sm_90", H100, S=2048, ms=0.9, n=2)]
    header, first, second = rows_to_csv(good).splitlines()
    bad = [first.replace("sm_90", "sm_999", 1), first.replace(",true,", ",maybe,", 1),
           first.replace('""tile_m"":64', '""tile_m"":48'), first.replace(",bf16,", ",int8,", 1),
           first + ",extra", first]
    path = tmp_path / "hostile.csv"
    path.write_text("\n".join([header, first, *bad, second]) + "\n")
    target = tmp_path / "target.sqlite"
    capsys.readouterr()
    assert tiledtune("import", path, "--db", target) == 1
    err = capsys.readouterr().err
    for reason in ("sm_999", "causal must be a bool", "tile_m must be one of",
                   "dtype must be one of", "cells; the header has", "duplicate key"):
        assert reason in err, reason
    assert all_rows(target) == good


@pytest.mark.parametrize("kind", ["huge", "garbage-json", "garbage-nosuffix", "text",
                                  "wrong-top-level", "newer-format", "missing", "bad-csv-header"])
def test_unreadable_files_are_rejected_whole(tiledtune, source_db, tmp_path, capsys, kind):
    path = tmp_path / {"garbage-nosuffix": "blob", "text": "notes.txt",
                       "bad-csv-header": "x.csv"}.get(kind, "x.json")
    good = tmp_path / "good.json"
    db.dump_rows([mk("sm_90", H100, S=777, ms=1.0)], good)
    if kind == "huge":
        with open(path, "wb") as f:  # sparse: large on stat, nothing on disk
            f.truncate(import_cmd.MAX_FILE_BYTES + 1)
    elif kind.startswith("garbage"):
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00garbage" * 50)
    elif kind == "text":
        path.write_text("hello, this is not a schedule file\n")
    elif kind == "wrong-top-level":
        path.write_text(json.dumps([mk("sm_90", H100, S=64, ms=1.0).to_dict()]))
    elif kind == "newer-format":
        path.write_text(json.dumps({"format": 99, "rows": []}))
    elif kind == "bad-csv-header":
        path.write_text("format,arch,colour\n1,sm_90,red\n")
    target = fill(tmp_path / "target.sqlite", [mk("sm_121", GB10, S=64, ms=3.0)])
    before = all_rows(target)
    capsys.readouterr()
    assert tiledtune("import", path, good, "--db", target) == 2
    err = capsys.readouterr().err
    assert f"{path}: file rejected:" in err
    expected = {"huge": "larger than the limit", "garbage-json": "not UTF-8",
                "garbage-nosuffix": "not UTF-8", "text": "neither JSON",
                "wrong-top-level": "at the top", "newer-format": "file format 99",
                "missing": "no such file", "bad-csv-header": "missing"}[kind]
    assert expected in err
    # the readable file next to it is still imported, the rest of the database is untouched
    assert sorted(all_rows(target), key=lambda r: r.key) == sorted(
        before + db.load_rows_file(good).rows(), key=lambda r: r.key)


# -- empty selections -----------------------------------------------------------------------------
def test_empty_export_exits_non_zero(tiledtune, source_db, tmp_path, capsys):
    empty = tmp_path / "empty.sqlite"
    db.ScheduleDB(empty).close()
    out = tmp_path / "tuned.py"
    for fmt in ("bytarget", "json", "csv"):
        capsys.readouterr()
        assert tiledtune("export", "--format", fmt, "-o", out, "--db", empty) == 1
        assert "nothing to export" in capsys.readouterr().err
    assert tiledtune("export", "-o", out, "--arch", "sm_80", "--db", source_db) == 1
    assert tiledtune("export", "-o", out, "--db", tmp_path / "absent.sqlite") == 1
    assert not (tmp_path / "absent.sqlite").exists()
    # only stale rows for the chosen arch: nothing for the ByTarget module
    assert tiledtune("export", "-o", out, "--arch", "sm_100", "--db", source_db) == 1
    assert not out.exists()
    assert tiledtune("export", "-o", tmp_path / "x.txt", "--db", source_db) == 2


def test_help_documents_exit_status(tiledtune, capsys):
    for command in ("import", "export"):
        with pytest.raises(SystemExit):
            tiledtune(command, "--help")
        assert "exit status" in capsys.readouterr().out
