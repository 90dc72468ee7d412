"""``tiledtune export`` / ``tiledtune import`` on temporary SQLite databases: the generated
ByTarget module (per kernel family; agrees with the runtime lookup, deterministic, accepted by
cuTile's compiler), lossless JSON/CSV round trips (CSV format 2, format-1 files still read as
forward rows), the ``--kernel`` filter, the merge rules, and hostile input rejected row by row."""

from __future__ import annotations

import csv
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
from tiledattention import FORWARD, Family, Problem, Schedule, register_family, unregister_family
from tiledattention.tooling import codecs, current_provenance, pick
from tuner import cli
from tuner.transfer import CSV_COLUMNS, MAX_ROW_CHARS, rows_to_csv

CODECS = codecs()
PROV = current_provenance(FORWARD)
STALE = dataclasses.replace(PROV, template_hash="0000000000ff")
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
        family="forward", arch=arch, device_name=device, problem=problem,
        schedule=Schedule(**schedule),
        median_ms=ms, spread_ms=ms / 97, tflops=problem.flops / (ms * 1e9), default_ms=ms * 1.3,
        baselines={**({} if n % 2 else {"torch-cudnn": ms * 1.1}),
                   **({"torch-flash": ms * 1.7} if n % 3 else {})},
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
    # baselines: both, torch-cudnn only, torch-flash only, none, in turn
    shapes = [("torch-cudnn", "torch-flash"), ("torch-cudnn",), ("torch-flash",), ()]
    return [dataclasses.replace(r, trials=5 + i, created_at=T0 + timedelta(minutes=i),
                                baselines={name: r.median_ms * (1.1 + 0.6 * k)
                                           for k, name in enumerate(shapes[i % 4])})
            for i, r in enumerate(rows)]


def fill(path: Path, rows) -> Path:
    with db.ScheduleDB(path, codecs=codecs()) as database:
        for row in rows:
            assert database.put(row) == "added"
    return path


def all_rows(path: Path) -> list[db.ScheduleRow]:
    with db.ScheduleDB(path, codecs=codecs(), read_only=True) as database:
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
    assert list(exported.BY_TARGET) == list(exported.KERNEL_OPTIONS) == ["forward"]
    options = exported.BY_TARGET["forward"]
    assert options["occupancy"] == ct.ByTarget(sm_90=2, sm_121=1, default=2)
    assert options["num_ctas"] == ct.ByTarget(sm_90=2, sm_121=1, default=1)
    assert options["opt_level"] == ct.ByTarget(sm_90=3, sm_121=2, default=3)
    assert exported.KERNEL_OPTIONS["forward"]["occupancy"] == {
        "default": 2, "by_arch": {"sm_90": 2, "sm_121": 1}}
    assert list(exported.SCHEDULES) == ["forward"]
    assert list(exported.SCHEDULES["forward"]) == ["sm_90", "sm_121"]
    assert [len(exported.SCHEDULES["forward"][a]) for a in ("sm_90", "sm_121")] == [8, 2]
    # an entry: the problem (every field), the winner's time, device and schedule
    entry = exported.SCHEDULES["forward"]["sm_121"][0]
    assert set(entry) == {"problem", "median_ms", "device", "schedule", "default_ms"}
    assert Problem.from_dict(entry["problem"]) == Problem(
        batch=1, heads_q=16, heads_kv=4, seqlen_q=1024, seqlen_k=1024, head_dim=128,
        dtype="bf16", causal=True)
    assert (entry["median_ms"], entry["device"]) == (1.0, GB10)
    assert Schedule.from_dict(entry["schedule"]) == Schedule(occupancy=1, opt_level=2)
    # the lookup metric travels with the table
    assert exported.LOOKUP["forward"] == {
        "bucket_fields": list(FORWARD.bucket_fields) + list(Problem.VARIANT_FIELDS),
        "optional": dict(Problem.OPTIONAL_FIELDS),
        "match_ratios": [list(pair) for pair in FORWARD.match_ratios],
        "distance_terms": [[list(names), weight] for names, weight in FORWARD.distance_terms],
        "nearest_limit": FORWARD.nearest_limit, "transfer_margin": FORWARD.transfer_margin,
        "transfer_limits": [[list(names), limit] for names, limit in FORWARD.transfer_limits],
        "padding_terms": [list(term) for term in FORWARD.padding_terms],
        "ragged_exact": list(FORWARD.ragged_exact)}


def test_header_states_provenance_without_timestamp(tiledtune, source_db, tmp_path):
    out = tmp_path / "tuned.py"
    assert tiledtune("export", "-o", out, "--db", source_db) == 0  # format from the suffix
    header = [line for line in out.read_text().splitlines() if line.startswith("#")][:8]
    text = "\n".join(header)
    assert f"Source database: {source_db}" in text
    assert "Rows: 12;" in text  # 13 stored, the stale one skipped
    assert f"cuda_tile={PROV.cuda_tile}" in text and f"template_hash={PROV.template_hash}" in text
    assert STALE.template_hash not in text
    assert str(datetime.now().year) not in text.replace(str(source_db), "")


def test_include_stale_exports_other_templates(tiledtune, source_db, tmp_path):
    out = tmp_path / "all.py"
    assert tiledtune("export", "-o", out, "--db", source_db, "--include-stale") == 0
    module = load_module(out, "stale")
    assert module.ARCHITECTURES == ("sm_90", "sm_100", "sm_121")
    assert module.KERNEL_OPTIONS["forward"]["occupancy"]["by_arch"]["sm_100"] == 3


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


def select(module, arch: str, problem: Problem):
    return module.select("forward", arch, **problem.to_dict())


def test_select_leaves_rows_beyond_the_nearest_limit_to_the_default(exported):
    tuned = Problem(batch=1, heads_q=16, heads_kv=4, seqlen_q=1024, seqlen_k=1024,
                    head_dim=128, dtype="bf16", causal=True)
    near = dataclasses.replace(tuned, seqlen_q=1500, seqlen_k=1500)  # distance 1.1 > 1.0
    closer = dataclasses.replace(tuned, batch=2)  # distance 0.5
    assert FORWARD.distance(tuned, near) > FORWARD.nearest_limit >= FORWARD.distance(tuned,
                                                                                     closer)
    assert select(exported, "sm_121", closer) is not None
    assert select(exported, "sm_121", near) is None


@pytest.mark.parametrize("arch", ["sm_90", "sm_121", "sm_100"])
def test_select_agrees_with_runtime_pick(exported, source_db, arch):
    answered = 0
    with db.ScheduleDB(source_db, codecs=CODECS, read_only=True) as database:
        for p in query_problems():
            # the rows the Resolver hands to pick: this family, arch and bucket, current template
            rows = [r for r in database.rows(family="forward", arch=arch, like=p)
                    if r.provenance.template_hash == PROV.template_hash]
            found = pick(FORWARD, rows, p, NO_DEVICE)
            got = select(exported, arch, p)
            expected = None if found is None else found[0].schedule.to_dict()
            assert got == expected, (arch, p.describe())
            answered += got is not None
    # with FORWARD.nearest_limit (1.0) the far shapes of query_problems() get no answer, nor do
    # those a row may not transfer to (another B·H_q beyond 2x, much more padding)
    assert answered >= (34 if arch == "sm_90" else 16 if arch == "sm_121" else 0)
    if arch == "sm_90":  # the H200 row wins its bucket; the result is a copy, not the table
        p = Problem(batch=1, heads_q=16, heads_kv=4, seqlen_q=1024, seqlen_k=1024, head_dim=128,
                    dtype="bf16", causal=True)
        got = select(exported, "sm_90", p)
        assert Schedule.from_dict(got) == Schedule(tile_m=128, occupancy=4, num_ctas=2,
                                                   exp2=True)
        got["tile_m"] = 16
        assert select(exported, "sm_90", p)["tile_m"] == 128


def test_select_prefers_the_exact_problem_like_pick(tiledtune, tmp_path):
    exact = mk("sm_90", H100, S=1024, B=1, hq=16, hkv=4, ms=0.5, tile_m=128)
    # same S_q, S_k, batch * heads_q and group size: distance 0, but another problem
    twin = mk("sm_90", H100, S=1024, B=2, hq=8, hkv=2, ms=0.1, tile_n=32)
    assert FORWARD.distance(exact.problem, twin.problem) == 0
    assert FORWARD.comparable(twin.problem, exact.problem)
    found = pick(FORWARD, [exact, twin], exact.problem, NO_DEVICE)
    assert found == (exact, "exact-arch")
    out = tmp_path / "tuned.py"
    assert tiledtune("export", "-o", out, "--db", fill(tmp_path / "db.sqlite",
                                                       [exact, twin])) == 0
    assert select(load_module(out, "twins"), "sm_90", exact.problem) == \
        exact.schedule.to_dict()


def test_select_rejects_bad_input(exported):
    p = Problem(batch=1, heads_q=16, heads_kv=4, seqlen_q=1024, seqlen_k=1024, head_dim=128,
                dtype="bf16", causal=True)
    fields = p.to_dict()
    assert exported.select("forward", "sm_999", **fields) is None  # no such arch: no entry
    # no comparable entry: another group size, head_dim, dtype or mask
    for change in ({"heads_kv": 16}, {"head_dim": 64}, {"dtype": "fp16"}, {"causal": False}):
        assert exported.select("forward", "sm_90", **{**fields, **change}) is None, change
    with pytest.raises(ValueError, match="family must be one of"):
        exported.select("no_such_family", "sm_90", **fields)
    with pytest.raises(ValueError, match="give exactly the fields"):
        exported.select("forward", "sm_90", **{k: v for k, v in fields.items() if k != "batch"})
    with pytest.raises(ValueError, match="give exactly the fields"):
        exported.select("forward", "sm_90", **fields, group=4)
    with pytest.raises(ValueError, match="seqlen_q must be a positive int"):
        exported.select("forward", "sm_90", **{**fields, "seqlen_q": 0})
    with pytest.raises(ValueError, match="batch must be a positive int"):
        exported.select("forward", "sm_90", **{**fields, "batch": True})


def test_module_distance_is_the_lookup_distance(exported):
    """``distance(family, a, b)`` in the module is ``FORWARD.distance`` on comparable problems
    of one bucket and ``None`` otherwise (another bucket field or GQA group size)."""
    rng = random.Random(7)
    changes = [{}] * 6 + [{"dtype": "fp16"}, {"causal": True}, {"head_dim": 128},
                          {"heads_kv": 1}]  # heads_kv 1: another group size (MQA)
    compared = 0
    for _ in range(2000):
        group = rng.choice((1, 2, 4))
        a, b = (Problem(batch=rng.randint(1, 8), heads_q=group * kv, heads_kv=kv,
                        seqlen_q=rng.randint(1, 70000), seqlen_k=rng.randint(1, 70000),
                        head_dim=64, dtype="bf16", causal=False)
                for kv in (rng.choice((2, 4, 8)), rng.choice((2, 4, 8))))
        b = dataclasses.replace(b, **rng.choice(changes))
        got = exported.distance("forward", a.to_dict(), b.to_dict())
        same_bucket = all(getattr(a, n) == getattr(b, n) for n in FORWARD.bucket_fields)
        if same_bucket and FORWARD.comparable(b, a):
            assert got == FORWARD.distance(a, b)
            compared += 1
        else:
            assert got is None, (a.describe(), b.describe())
    assert 1000 < compared < 1400


def test_module_imports_without_cuda_tile(tiledtune, source_db, tmp_path, monkeypatch):
    out = tmp_path / "tuned.py"
    assert tiledtune("export", "--format", "bytarget", "-o", out, "--db", source_db) == 0
    monkeypatch.setitem(sys.modules, "cuda.tile", None)  # `import cuda.tile` now fails
    module = load_module(out, "no_cuda_tile")
    assert module.ct is None
    assert module.BY_TARGET == {"forward": {"occupancy": None, "num_ctas": None,
                                            "opt_level": None}}
    assert module.KERNEL_OPTIONS["forward"]["num_ctas"]["by_arch"] == {"sm_90": 2, "sm_121": 1}
    p = Problem(batch=1, heads_q=16, heads_kv=4, seqlen_q=4096, seqlen_k=4096, head_dim=128,
                dtype="bf16", causal=True)
    assert select(module, "sm_121", p)["exp2"] is True


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
    options = exported.BY_TARGET["forward"]
    kernel = ct.kernel(copy_tiles, occupancy=options["occupancy"], num_ctas=options["num_ctas"],
                       opt_level=options["opt_level"])
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
    # every shape of baselines survives: both, one, the other, none
    assert {tuple(r.baselines) for r in all_rows(fresh)} == {
        ("torch-cudnn", "torch-flash"), ("torch-cudnn",), ("torch-flash",), ()}


def test_csv_format_4_has_family_backend_problem_and_baselines_as_json(tiledtune, source_db,
                                                                        tmp_path):
    assert CSV_COLUMNS == ("format", "family", "arch", "device_name", "backend", "problem",
                           "schedule", "median_ms", "spread_ms", "tflops", "default_ms",
                           "baselines_ms", "trials", "created_at", *db.PROVENANCE_FIELDS)
    out = tmp_path / "rows.csv"
    assert tiledtune("export", "-o", out, "--db", source_db) == 0
    with open(out, newline="") as f:
        cells = list(csv.DictReader(f))
    rows = sorted((r for r in all_rows(source_db)
                   if r.provenance.template_hash == PROV.template_hash), key=lambda r: r.key)
    assert len(cells) == len(rows) == 12
    for cell, row in zip(cells, rows):
        assert (cell["format"], cell["family"], cell["arch"], cell["backend"]) == (
            "4", "forward", row.arch, "gpu")
        assert json.loads(cell["problem"]) == row.problem.to_dict()
        assert cell["problem"] == db.canonical_json(row.problem.to_dict())
        assert cell["baselines_ms"] == db.canonical_json(dict(row.baselines))
        assert Schedule.from_dict(json.loads(cell["schedule"])) == row.schedule


#: The columns of a format-1 CSV file (before kernel families): one column per problem field.
LEGACY_CSV_COLUMNS = ("format", "arch", "device_name", "batch", "heads_q", "heads_kv",
                      "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal", "schedule",
                      "median_ms", "spread_ms", "tflops", "default_ms", "torch_cudnn_ms",
                      "torch_flash_ms", "trials", "created_at", *db.PROVENANCE_FIELDS)


def legacy_csv(rows) -> str:
    def text(value):
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return repr(value) if isinstance(value, float) else str(value)

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(LEGACY_CSV_COLUMNS)
    for row in rows:
        data = row.to_dict()
        flat = {**data, **data["problem"], **data["provenance"], "format": 1,
                "schedule": db.canonical_json(data["schedule"]),
                **{old: row.baselines.get(name) for old, name in db.LEGACY_BASELINES.items()}}
        writer.writerow([text(flat[name]) for name in LEGACY_CSV_COLUMNS])
    return out.getvalue()


def test_format_1_csv_imports_as_forward_rows(tiledtune, tmp_path, capsys):
    rows = synthetic_rows()[:6]
    path = tmp_path / "old.csv"
    path.write_text(legacy_csv(rows))
    target = tmp_path / "target.sqlite"
    assert tiledtune("import", path, "--db", target) == 0
    assert sorted(all_rows(target), key=lambda r: r.key) == sorted(rows, key=lambda r: r.key)
    assert {r.family for r in all_rows(target)} == {"forward"}
    # a bad problem cell in a format-1 file is still rejected with its reason
    first = legacy_csv(rows[:1]).splitlines()
    path.write_text("\n".join([first[0], first[1].replace(",true,", ",maybe,", 1)]) + "\n")
    capsys.readouterr()
    assert tiledtune("import", path, "--db", target) == 1
    assert "causal must be a bool" in capsys.readouterr().err


def _format_3(row: db.ScheduleRow) -> dict:
    """``row``'s dict form as row format 3 wrote it: fixed baseline fields, not a mapping."""
    data = {**row.to_dict(), "format": 3}
    del data["baselines_ms"]
    return {**data, **{old: row.baselines.get(name)
                       for old, name in db.LEGACY_BASELINES.items()}}


def test_format_3_json_and_csv_files_import_their_baselines_into_the_mapping(tiledtune,
                                                                              tmp_path):
    """Files exported before baselines became a mapping: JSON rows with ``torch_cudnn_ms`` /
    ``torch_flash_ms`` fields and CSV files with those columns (an empty cell: not timed)."""
    rows = [mk("sm_90", H100, S=1024 * (n + 1), ms=0.5 + n, n=n) for n in range(4)]
    assert {tuple(r.baselines) for r in rows} == {
        ("torch-cudnn", "torch-flash"), ("torch-cudnn",), ("torch-flash",), ()}
    old_json = tmp_path / "old.json"
    old_json.write_text(json.dumps({"format": 3, "rows": [_format_3(r) for r in rows]}))
    columns = [c for c in CSV_COLUMNS if c != "baselines_ms"] + list(db.LEGACY_BASELINES)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        flat = {**_format_3(r), **r.provenance.to_dict()}
        writer.writerow(["" if flat[c] is None else db.canonical_json(flat[c])
                         if isinstance(flat[c], dict) else repr(flat[c])
                         if isinstance(flat[c], float) else str(flat[c]) for c in columns])
    old_csv = tmp_path / "old.csv"
    old_csv.write_text(out.getvalue())
    for path in (old_json, old_csv):
        target = tmp_path / f"{path.suffix[1:]}.sqlite"
        assert tiledtune("import", path, "--db", target) == 0
        assert sorted(all_rows(target), key=lambda r: r.key) == sorted(rows, key=lambda r: r.key)
    # a row of format 4 holding the old fields is rejected: they are not fields of format 4
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 4, "rows": [{**_format_3(rows[0]), "format": 4}]}))
    assert tiledtune("import", bad, "--db", tmp_path / "bad.sqlite") == 1


def test_csv_keeps_provenance_text_that_looks_like_a_number(tiledtune, tmp_path, capsys):
    rows = [mk("sm_90", H100, S=1024, ms=1.0,
               prov=dataclasses.replace(PROV, template_hash="000000000000")),
            mk("sm_90", H100, S=2048, ms=2.0, prov=dataclasses.replace(PROV, driver="13"))]
    path = tmp_path / "rows.csv"
    path.write_text(rows_to_csv(rows))
    target = tmp_path / "target.sqlite"
    assert tiledtune("import", path, "--db", target) == 0, capsys.readouterr().err
    assert sorted(all_rows(target), key=lambda r: r.key) == sorted(rows, key=lambda r: r.key)


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
                      "kept": "1", "skipped": "0", "rejected": "0"}
    stored = {r.key: r for r in all_rows(target)}
    assert stored[faster.key].median_ms == faster.median_ms / 2
    assert stored[slower.key] == exported[slower.key]
    assert stored[foreign.key] == exported[foreign.key]
    # --force overwrites the kept one; a second plain import keeps everything
    assert tiledtune("import", "rows.json", "--db", target, "--force") == 0
    assert table_counts(capsys.readouterr().out, "rows.json")["forced"] == "13"
    assert tiledtune("import", "rows.json", "--db", target) == 0
    again = table_counts(capsys.readouterr().out, "rows.json")
    # the stale row (another template) is skipped, not weighed against itself
    assert (again["kept"], again["skipped"]) == ("12", "1")
    assert all_rows(target) == all_rows(source_db)


# -- hostile input --------------------------------------------------------------------------------
def hostile_rows() -> tuple[list, list[str], list[db.ScheduleRow]]:
    good = [mk("sm_90", H100, S=1024, ms=0.5, n=1), mk("sm_90", H100, S=2048, ms=0.9, n=2),
            mk("sm_90", H100, S=4096, ms=3.0, n=3)]
    first = good[0].to_dict()
    legacy = {**_format_3(good[2]), "format": 1}
    del legacy["family"], legacy["backend"]

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
        variant(family="no_such_family"),                              # unknown family
        variant(format=1),                                             # format 1 has no family
        variant(format=db.ROW_FORMAT + 1),                             # newer row format
        variant(**{"baselines_ms__torch-flash": -1.0}),                # a negative baseline
        variant(problem="{not json"),                                  # problem text not JSON
        good[1].to_dict(),
        legacy,                                                        # format 1: a forward row
    ]
    reasons = ["'median_ms'", "batch must be a positive int", "unknown architecture 'sm_999'",
               "tile_m must be one of", "duplicate key", "must be a mapping", "unknown row field",
               "device_name must be printable text", "median_ms must be a finite number",
               "unknown kernel family 'no_such_family'", "row format 1 has no 'family' field",
               f"row format {db.ROW_FORMAT + 1} is newer", "problem is not JSON",
               "baselines_ms['torch-flash'] must be a finite number > 0"]
    return items, reasons, good


def test_hostile_json_rows_are_rejected_with_reasons(tiledtune, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    items, reasons, good = hostile_rows()
    Path("hostile.json").write_text(json.dumps({"format": db.ROW_FORMAT, "rows": items}))
    target = fill(tmp_path / "target.sqlite", [mk("sm_121", GB10, S=64, ms=3.0)])
    before = all_rows(target)
    capsys.readouterr()
    assert tiledtune("import", "hostile.json", "--db", target) == 1
    captured = capsys.readouterr()
    for reason in reasons:
        assert reason in captured.err, reason
    assert table_counts(captured.out, "hostile.json")["rejected"] == str(len(items) - 3)
    assert table_counts(captured.out, "hostile.json")["added"] == "3"
    assert sorted(all_rows(target), key=lambda r: r.key) == sorted(before + good,
                                                                   key=lambda r: r.key)


def test_hostile_csv_rows_are_rejected_with_reasons(tiledtune, source_db, tmp_path, capsys):
    good = [mk("sm_90", H100, S=1024, ms=0.5, n=1), mk("sm_90", H100, S=2048, ms=0.9, n=2)]
    header, first, second = rows_to_csv(good).splitlines()
    for cell in (',"{""batch"":1,""causal"":true,', '""tile_m"":64', '""dtype"":""bf16""',
                 "4,forward,sm_90,"):
        assert cell in first, cell
    bad = [first.replace("sm_90", "sm_999", 1),
           first.replace('""causal"":true', '""causal"":""maybe""', 1),
           first.replace('""tile_m"":64', '""tile_m"":48'),
           first.replace('""dtype"":""bf16""', '""dtype"":""int8""', 1),
           first.replace(",forward,", ",no_such_family,", 1),
           first.replace('"{""batch"":1,', '"{""batch"":1,""colour"":1,', 1),
           first.replace('"{""batch"":1,', '"{not json', 1),
           first.replace('""torch-flash"":0.85', '""torch-flash"":1e400', 1),
           first.replace('"{""torch-flash"":0.85}"', '"{""torch-flash"":0.85,}"', 1),
           first + ",extra", first]
    path = tmp_path / "hostile.csv"
    path.write_text("\n".join([header, first, *bad, second]) + "\n")
    target = tmp_path / "target.sqlite"
    capsys.readouterr()
    assert tiledtune("import", path, "--db", target) == 1
    err = capsys.readouterr().err
    for reason in ("sm_999", "causal must be a bool", "tile_m must be one of",
                   "dtype must be one of", "unknown kernel family 'no_such_family'",
                   "unknown ['colour']", "column 'problem' must hold a JSON object",
                   "baselines_ms.torch-flash must be a finite number",
                   "column 'baselines_ms' must hold a JSON object",
                   "cells; the header has", "duplicate key"):
        assert reason in err, reason
    for index in range(1, len(bad) + 1):  # every bad row is named
        assert f"row {index}: " in err, index
    assert all_rows(target) == good


@pytest.mark.parametrize("kind", ["huge", "garbage-json", "garbage-nosuffix", "text",
                                  "wrong-top-level", "newer-format", "missing", "bad-csv-header"])
def test_unreadable_files_are_rejected_whole(tiledtune, source_db, tmp_path, capsys, kind):
    path = tmp_path / {"garbage-nosuffix": "blob", "text": "notes.txt",
                       "bad-csv-header": "x.csv"}.get(kind, "x.json")
    good = tmp_path / "good.json"
    db.dump_rows([mk("sm_90", H100, S=777, ms=1.0)], good)
    if kind == "huge":  # files have no size limit (read a chunk at a time); one row has
        path.write_text('{"format": 4, "rows": [{"device_name": "' + "x" * MAX_ROW_CHARS
                        + '"}]}')
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
    expected = {"huge": "longer than the limit", "garbage-json": "not UTF-8",
                "garbage-nosuffix": "not UTF-8", "text": "neither JSON",
                "wrong-top-level": "at the top", "newer-format": "file format 99",
                "missing": "no such file", "bad-csv-header": "missing"}[kind]
    assert expected in err
    # the readable file next to it is still imported, the rest of the database is untouched
    assert sorted(all_rows(target), key=lambda r: r.key) == sorted(
        before + db.load_rows_file(good, CODECS).rows(), key=lambda r: r.key)


# -- several kernel families --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyProblem:
    rows: int
    width: int
    dtype: str = "bf16"

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        return cls(**data)

    def describe(self):
        return f"toy {self.rows}x{self.width} {self.dtype}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToySchedule:
    block: int = 32
    occupancy: int = 1

    def __post_init__(self):
        if self.block not in (16, 32, 64):
            raise ValueError(f"ToySchedule.block must be one of [16, 32, 64]; got {self.block}")

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        return cls(**data)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def describe(self):
        return f"block{self.block} occ{self.occupancy}"


class ToyFamily(Family):
    """A second kernel family with only what the database and the exporters use. Not
    ``toy_family.TOY``: this one has a kernel option (``occupancy``) and two distance terms, and
    these tests register and unregister it."""

    name = "export_toy"
    problem_type = ToyProblem
    schedule_type = ToySchedule
    template_modules = ("json.decoder",)
    bucket_fields = ("dtype",)
    distance_terms = ((("rows",), 1.0), (("width",), 0.25))

    def default_schedule(self, arch, problem):
        return ToySchedule()

    def flops(self, problem):
        return 2.0 * problem.rows * problem.width

    def compile(self, problem, schedule, arch):
        raise NotImplementedError

    def case(self, problem, device_index):
        raise NotImplementedError

    def tolerance(self, problem):
        return 0.0


@pytest.fixture
def toy():
    family = register_family(ToyFamily())
    try:
        yield family
    finally:
        unregister_family("export_toy")


def toy_row(arch: str, rows: int, width: int, ms: float, *, device: str = H100, **schedule):
    problem = ToyProblem(rows=rows, width=width)
    return db.ScheduleRow(
        family="export_toy", arch=arch, device_name=device, problem=problem,
        schedule=ToySchedule(**schedule), median_ms=ms, spread_ms=ms / 50, tflops=1.0,
        trials=3, created_at=T0, provenance=current_provenance(ToyFamily()))


def toy_rows() -> list[db.ScheduleRow]:
    return [toy_row("sm_90", 1024, 64, 0.5, block=64, occupancy=4),
            toy_row("sm_90", 4096, 64, 2.0, block=16, occupancy=4),
            toy_row("sm_90", 4096, 64, 1.5, device=H200, block=32, occupancy=2),
            toy_row("sm_100", 1024, 128, 0.2, occupancy=3)]


@pytest.fixture
def mixed_db(toy, tmp_path) -> Path:
    return fill(tmp_path / "mixed.sqlite", synthetic_rows() + toy_rows())


def test_module_has_one_table_per_family(tiledtune, mixed_db, toy, tmp_path):
    out = tmp_path / "tuned.py"
    assert tiledtune("export", "-o", out, "--db", mixed_db) == 0
    module = load_module(out, "mixed")
    assert module.ARCHITECTURES == ("sm_90", "sm_100", "sm_121")
    assert sorted(module.SCHEDULES) == ["export_toy", "forward"]
    assert list(module.SCHEDULES["export_toy"]) == ["sm_90", "sm_100"]
    assert [len(module.SCHEDULES["export_toy"][a]) for a in ("sm_90", "sm_100")] == [2, 1]
    # the forward tables are those of a forward-only export
    only = tmp_path / "forward.py"
    assert tiledtune("export", "-o", only, "--db", mixed_db, "--kernel", "forward") == 0
    forward = load_module(only, "forward_only")
    assert module.SCHEDULES["forward"] == forward.SCHEDULES["forward"]
    assert module.KERNEL_OPTIONS["forward"] == forward.KERNEL_OPTIONS["forward"]
    # kernel options only for the options the family's schedules have, counted over the
    # problems' winners (sm_90: 4 and 2, not the slower H100 row's 4 again); a tie without the
    # default schedule's value (1) goes to the smallest value
    assert module.KERNEL_OPTIONS["export_toy"] == {
        "occupancy": {"default": 2, "by_arch": {"sm_90": 2, "sm_100": 3}}}
    assert module.BY_TARGET["export_toy"]["occupancy"] == ct.ByTarget(sm_90=2, sm_100=3, default=2)
    assert module.LOOKUP["export_toy"] == {"bucket_fields": ["dtype"], "optional": {},
                                    "match_ratios": [],
                                    "distance_terms": [[["rows"], 1.0], [["width"], 0.25]],
                                    "nearest_limit": None,  # any distance
                                    "transfer_margin": 1.03, "transfer_limits": [],
                                    "padding_terms": [], "ragged_exact": []}
    # select() and distance() follow the family's own metric, as pick does
    family = toy
    for rows, width in itertools.product((1, 900, 1024, 3000, 4096, 10000), (1, 64, 128, 300)):
        problem = ToyProblem(rows=rows, width=width)
        for arch in ("sm_90", "sm_100", "sm_121"):
            candidates = [r for r in toy_rows() if r.arch == arch]
            found = pick(family, candidates, problem, NO_DEVICE)
            expected = None if found is None else found[0].schedule.to_dict()
            got = module.select("export_toy", arch, **problem.to_dict())
            assert got == expected, (arch, problem)
        other = ToyProblem(rows=1024, width=64)
        assert module.distance("export_toy", problem.to_dict(), other.to_dict()) == \
            family.distance(problem, other)
    assert module.select("export_toy", "sm_90", rows=4096, width=64, dtype="bf16") == \
        {"block": 32, "occupancy": 2}  # the faster H200 row wins the problem
    assert module.select("export_toy", "sm_90", rows=4096, width=64, dtype="fp16") is None
    with pytest.raises(ValueError, match="give exactly the fields"):
        module.select("export_toy", "sm_90", rows=4096, width=64)


def test_kernel_filter_selects_one_family(tiledtune, mixed_db, toy, tmp_path, capsys):
    for kernel, expected in (("export_toy", 4), ("forward", 12)):
        out = tmp_path / f"{kernel}.json"
        assert tiledtune("export", "-o", out, "--db", mixed_db, "--kernel", kernel) == 0
        rows = db.load_rows_file(out, codecs()).rows()
        assert len(rows) == expected and {r.family for r in rows} == {kernel}
    module_path = tmp_path / "toy.py"
    assert tiledtune("export", "-o", module_path, "--db", mixed_db, "--kernel",
                     "export_toy") == 0
    assert list(load_module(module_path, "toy_only").SCHEDULES) == ["export_toy"]
    # --kernel with --arch: the toy family has no sm_121 rows
    assert tiledtune("export", "-o", tmp_path / "x.csv", "--db", mixed_db, "--kernel",
                     "export_toy", "--arch", "sm_121") == 1
    capsys.readouterr()
    assert tiledtune("export", "-o", tmp_path / "x.csv", "--db", mixed_db, "--kernel",
                     "no_such_family") == 2
    err = capsys.readouterr().err
    assert "kernel must be one of" in err and "'export_toy'" in err and "'forward'" in err


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_round_trip_of_several_families_is_lossless(tiledtune, mixed_db, toy, tmp_path, fmt):
    out = tmp_path / f"rows.{fmt}"
    assert tiledtune("export", "-o", out, "--db", mixed_db, "--include-stale") == 0
    fresh = tmp_path / "fresh.sqlite"
    assert tiledtune("import", out, "--db", fresh) == 0
    assert all_rows(fresh) == all_rows(mixed_db)
    assert len(all_rows(fresh)) == 13 + 4


def test_rows_of_an_unregistered_family_are_rejected_on_import(tiledtune, mixed_db, toy,
                                                               tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert tiledtune("export", "-o", "rows.json", "--db", mixed_db) == 0
    unregister_family("export_toy")
    target = tmp_path / "target.sqlite"
    capsys.readouterr()
    assert tiledtune("import", "rows.json", "--db", target) == 1
    captured = capsys.readouterr()
    assert "unknown kernel family 'export_toy'" in captured.err
    assert table_counts(captured.out, "rows.json")["rejected"] == "4"
    assert {r.family for r in all_rows(target)} == {"forward"}


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
    # no database: --source user has nothing (by default the shipped tables would be exported)
    assert tiledtune("export", "-o", out, "--db", tmp_path / "absent.sqlite",
                     "--source", "user") == 1
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


# -- --source: the shipped tables -----------------------------------------------------------------
def shipped_rows(arch: str = "sm_90") -> list[db.ScheduleRow]:
    from tiledattention import shipped_table

    return list(shipped_table(arch))


def test_without_a_database_the_shipped_tables_are_exported(tiledtune, tmp_path, capsys):
    """A new user (no database) gets the shipped rows without a flag, as ct.ByTarget tables."""
    absent = tmp_path / "absent.sqlite"
    out = tmp_path / "shipped.py"
    assert tiledtune("export", "--format", "bytarget", "-o", out, "--db", absent) == 0
    captured = capsys.readouterr()
    assert f"no schedule database at {absent}: exporting the shipped tables instead" in \
        captured.err
    assert "from tiledattention/pretuned/sm_90.json" in captured.out
    assert not absent.exists()
    module = load_module(out, "shipped")
    shipped = shipped_rows()
    assert module.ARCHITECTURES == ("sm_90",)
    assert set(module.BY_TARGET) == {r.family for r in shipped} >= {"forward", "decode"}
    assert isinstance(module.BY_TARGET["forward"]["occupancy"], ct.ByTarget)
    assert sum(len(module.SCHEDULES[f]["sm_90"]) for f in module.SCHEDULES) == len(shipped)
    # the same with the flag, and as lossless rows
    rows_file = tmp_path / "shipped.json"
    assert tiledtune("export", "--source", "shipped", "-o", rows_file, "--db", absent) == 0
    assert sorted(r.key for r in db.load_rows_file(rows_file, CODECS)) == \
        sorted(r.key for r in shipped)


def test_source_picks_user_shipped_or_both(tiledtune, tmp_path, capsys):
    shipped = [r for r in shipped_rows() if r.family == "forward"]
    faster = dataclasses.replace(shipped[0], median_ms=shipped[0].median_ms / 2,
                                 schedule=Schedule(tile_m=32, tile_n=32))  # wins its key
    slower = dataclasses.replace(shipped[1], median_ms=shipped[1].median_ms * 2,
                                 schedule=Schedule(tile_m=32, tile_n=32))  # loses its key
    stale = dataclasses.replace(shipped[2], median_ms=shipped[2].median_ms / 4,
                                provenance=STALE)  # faster, but the runtime ignores it
    own = mk("sm_121", GB10, S=1024, ms=1.0)  # a key the shipped table does not have
    user = fill(tmp_path / "user.sqlite", [faster, slower, stale, own])

    def exported(*flags) -> dict:
        out = tmp_path / "rows.json"
        assert tiledtune("export", "--kernel", "forward", "-o", out, "--db", user, *flags) == 0
        return {r.key: r for r in db.load_rows_file(out, CODECS)}

    assert set(exported()) == {faster.key, slower.key, stale.key, own.key} - {stale.key}
    assert set(exported("--source", "user")) == set(exported())
    assert set(exported("--source", "shipped")) == {r.key for r in shipped}
    capsys.readouterr()
    both = exported("--source", "both")
    assert "3 key(s) in both the database and the shipped tables: kept the faster row" in \
        capsys.readouterr().err
    assert set(both) == {r.key for r in shipped} | {own.key}
    assert both[faster.key].schedule == faster.schedule  # the user's faster row
    assert both[slower.key] == shipped[1]  # the shipped row: faster
    assert both[stale.key] == shipped[2]  # a row the runtime uses over a faster stale one
    # --source shipped never opens the database: a damaged file does not matter
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"not a database" * 100)
    assert tiledtune("export", "--source", "shipped", "-o", tmp_path / "s.json",
                     "--db", broken) == 0
    assert tiledtune("export", "-o", tmp_path / "s.json", "--db", broken) == 2
