"""``tiledtune bench`` without a GPU: grid, FLOPs, the check-then-time logic, CSV, reports."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys

import pytest

from tiledattention import Problem
from tuner import bench
from tuner.bench import (
    CONTENDERS,
    MAX_PNG_BYTES,
    BenchConfigError,
    BenchPoint,
    BenchResult,
    PlotsUnavailable,
    RunInfo,
    build_grid,
    load_results,
    point_tflops,
    ratio_table,
    render_markdown,
    write_csv,
    write_plots,
    write_run_info,
)
from tuner.commands import bench_cmd
from tuner.measure import Timing

INFO = RunInfo(command="tiledtune bench --quick", date="2025-01-01T00:00:00+00:00")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def _squash(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


# -- grid ----------------------------------------------------------------------------------------

def test_default_grid_points():
    grid = build_grid()
    points = grid.points()
    assert len(points) == 3 * 6 * 2 * 2
    assert grid.contenders == CONTENDERS and len(CONTENDERS) == 8
    assert {p.head_dim for p in points} == {64, 128, 256}
    assert {p.seqlen for p in points} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {p.dtype for p in points} == {"bf16", "fp16"}
    assert {p.causal for p in points} == {True, False}
    assert len(set(points)) == len(points)
    for p in points:
        assert p.batch * p.seqlen == 16384
        assert p.heads * p.head_dim == 2048
    assert BenchPoint(batch=32, heads=32, seqlen=512, head_dim=64, dtype="bf16",
                      causal=False) in points
    assert BenchPoint(batch=1, heads=8, seqlen=16384, head_dim=256, dtype="fp16",
                      causal=True) in points


def test_custom_grid_keeps_invariants_and_contender_order():
    grid = build_grid(tokens="8192", hidden="1024", head_dims="128,64", seqlens="256,8192",
                      dtypes="fp16", causal="yes", contenders="eager,tiledattention")
    points = grid.points()
    assert len(points) == 4
    assert all(p.batch * p.seqlen == 8192 and p.heads * p.head_dim == 1024 for p in points)
    assert {(p.seqlen, p.batch) for p in points} == {(256, 32), (8192, 1)}
    assert {(p.head_dim, p.heads) for p in points} == {(128, 8), (64, 16)}
    assert all(p.dtype == "fp16" and p.causal for p in points)
    assert grid.contenders == ("tiledattention", "eager")
    assert build_grid(contenders="all").contenders == CONTENDERS


def test_quick_grid_is_small_and_explicit_flags_win():
    quick = build_grid(quick=True)
    assert 0 < len(quick.points()) < len(build_grid().points()) / 4
    assert build_grid(quick=True, dtypes="fp16").dtypes == ("fp16",)
    settings = bench_cmd.settings_from_args(_args("--quick"))
    assert settings.max_seconds < bench.BenchSettings().max_seconds
    assert bench_cmd.settings_from_args(_args("--quick", "--samples", "77")).max_samples == 77


@pytest.mark.parametrize("kwargs, flag, words", [
    (dict(seqlens="3000"), "--seqlens", "does not divide --tokens 16384"),
    (dict(seqlens="32768"), "--seqlens", "does not divide"),
    (dict(seqlens="0"), "--seqlens", "positive integer"),
    (dict(seqlens="512,512"), "--seqlens", "twice"),
    (dict(seqlens="512,,1024"), "--seqlens", "empty item"),
    (dict(seqlens=""), "--seqlens", "comma-separated"),
    (dict(head_dims="100"), "--head-dims", "multiples of 8"),
    (dict(head_dims="48"), "--head-dims", "does not divide --hidden 2048"),
    (dict(head_dims="x"), "--head-dims", "positive integer"),
    (dict(dtypes="fp32"), "--dtypes", "'fp32'"),
    (dict(causal="maybe"), "--causal", "'maybe'"),
    (dict(causal="yes,causal"), "--causal", "twice"),
    (dict(tokens="abc"), "--tokens", "positive integer"),
    (dict(hidden="-5"), "--hidden", "positive integer"),
    (dict(tokens="1000", seqlens="512"), "--seqlens", "--tokens 1000"),
    (dict(contenders="triton"), "--contenders", "'triton'"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_grid_flags_are_rejected_naming_the_flag(kwargs, flag, words):
    with pytest.raises(BenchConfigError) as info:
        build_grid(**kwargs)
    message = str(info.value)
    assert message.startswith(flag), message
    assert words in message


@pytest.mark.parametrize("argv, flag", [
    (("--seqlens", "3000"), "--seqlens"),
    (("--head-dims", "100"), "--head-dims"),
    (("--dtypes", "f16"), "--dtypes"),
    (("--samples", "0"), "--samples"),
    (("--rel-precision", "nan"), "--rel-precision"),
    (("--min-samples", "300"), "--min-samples"),
    (("--mem-fraction", "1.5"), "--mem-fraction"),
    (("--device", "-1"), "--device"),
], ids=lambda x: x if isinstance(x, str) else "-".join(x))
def test_run_rejects_bad_flags_with_exit_2(argv, flag, capsys):
    assert bench_cmd.run(_args(*argv)) == 2
    err = _squash(capsys.readouterr().err)
    assert "error" in err and flag in err


# -- FLOPs ---------------------------------------------------------------------------------------

def _brute_force_pairs(sq: int, sk: int, causal: bool) -> int:
    """Count attended (query, key) pairs one by one; top-left causal: key j <= query i."""
    return sum(1 for i in range(sq) for j in range(sk) if not causal or j <= i)


@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 17), (5, 113), (113, 5), (64, 100), (100, 64)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flops_match_brute_force_counting(sq, sk, causal):
    b, h, d = 2, 3, 40
    problem = Problem(batch=b, heads_q=h, heads_kv=h, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                      dtype="bf16", causal=causal)
    assert problem.flops == 4 * b * h * d * _brute_force_pairs(sq, sk, causal)
    # 2 ms for the problem: TFLOP/s = flops / 2e-3 / 1e12
    assert point_tflops(problem, 2.0) == pytest.approx(problem.flops / 2e-3 / 1e12, rel=1e-12)


def test_flops_match_the_reference_mask():
    """The pairs the causal reference attends are exactly the ones counted."""
    torch = pytest.importorskip("torch")
    for sq, sk in ((7, 19), (19, 7), (16, 16)):
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        attended = int((~(j > i)).sum())  # the mask reference_attention applies
        assert attended == _brute_force_pairs(sq, sk, True)


def test_point_tflops_of_a_grid_point():
    point = BenchPoint(batch=4, heads=16, seqlen=4096, head_dim=128, dtype="bf16", causal=True)
    pairs = 4096 * 4097 // 2
    assert point.flops == 4 * 4 * 16 * 128 * pairs
    assert point_tflops(point, 1.5) == pytest.approx(4 * 4 * 16 * 128 * pairs / 1.5e-3 / 1e12)
    with pytest.raises(ValueError):
        point_tflops(point, 0.0)


# -- reference and check-then-time on the CPU ----------------------------------------------------

@pytest.mark.parametrize("sq, sk", [(33, 33), (17, 50), (50, 17)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_reference_attention_matches_torch_in_chunks(sq, sk, causal):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, sq, 40, generator=gen).bfloat16()
    k = torch.randn(2, 3, sk, 40, generator=gen).bfloat16()
    v = torch.randn(2, 3, sk, 40, generator=gen).bfloat16()
    # a budget of a few rows forces several query chunks (the causal offset must carry over)
    out = bench.reference_attention(q, k, v, causal, budget_bytes=2 * 4 * 2 * 3 * sk * 5)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=causal)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def _fake_timing(fn, **kwargs) -> Timing:
    fn()
    return Timing(median_ms=2.0, spread_ms=0.1, mean_ms=2.05, min_ms=1.9, samples=kwargs["min_samples"])


def _cpu_contenders():
    import torch

    table = bench.make_contenders()

    def wrong(q, k, v, point, arch):
        return bench.Prepared(lambda: torch.zeros_like(q))

    def nan(q, k, v, point, arch):
        return bench.Prepared(lambda: torch.full_like(q, float("nan")))

    def broken(q, k, v, point, arch):
        def fn():
            raise RuntimeError("No available kernel. Aborting execution.\nsecond line")
        return bench.Prepared(fn)

    hog = dataclasses.replace(table["eager"], name="hog", score_bytes=lambda p: 1 << 50)
    return [table["eager"], table["torch-math"], bench.Contender("wrong", wrong),
            bench.Contender("nan", nan), bench.Contender("broken", broken), hog]


def test_measure_point_classifies_contenders_on_cpu():
    pytest.importorskip("torch")
    point = BenchPoint(batch=2, heads=2, seqlen=37, head_dim=64, dtype="bf16", causal=True)
    env = dict(device="cpu", arch="sm_90")
    results = bench.measure_point(point, _cpu_contenders(), bench.BenchSettings(), env=env,
                                  time_fn=_fake_timing, device="cpu",
                                  free_memory=lambda: 64 << 30)
    by = {r.contender: r for r in results}
    assert [r.contender for r in results] == ["eager", "torch-math", "wrong", "nan", "broken",
                                              "hog"]
    for name in ("eager", "torch-math"):
        r = by[name]
        assert r.status == "ok", r.note
        assert r.rel_err <= bench.TOLERANCES["bf16"]
        assert r.median_ms == 2.0 and r.samples == 10
        assert r.tflops == pytest.approx(point.flops / 2e-3 / 1e12)
        assert (r.batch, r.heads, r.seqlen, r.head_dim, r.causal) == (2, 2, 37, 64, True)
    assert by["wrong"].status == "wrong" and by["wrong"].tflops is None
    assert by["wrong"].reason.startswith("err=") and by["wrong"].rel_err == pytest.approx(1.0)
    assert by["nan"].status == "wrong" and "nan" in by["nan"].reason
    assert by["broken"].status == "unavailable"
    assert by["broken"].reason == "RuntimeError: No available kernel. Aborting execution."
    assert by["hog"].status == "skipped"
    assert by["hog"].reason.startswith("would need 1048576.0 GiB")
    assert all(r.device == "cpu" and r.arch == "sm_90" for r in results)


def test_interleaved_timing_takes_only_the_contenders_that_passed():
    pytest.importorskip("torch")
    point = BenchPoint(batch=1, heads=2, seqlen=29, head_dim=64, dtype="bf16", causal=False)
    calls = []

    def fake_interleaved(fns, *, rounds):
        calls.append((sorted(fns), rounds))
        for fn in fns.values():
            fn()  # each runs inside its contender's context
        return {name: Timing(median_ms=1.0 + i, spread_ms=0.0, mean_ms=1.0 + i, min_ms=1.0 + i,
                             samples=rounds) for i, name in enumerate(fns)}

    def never(fn, **kwargs):
        raise AssertionError("interleaved runs must not time contenders one by one")

    settings = bench.BenchSettings(interleave=7)
    results = bench.measure_point(point, _cpu_contenders(), settings,
                                  env=dict(device="cpu", arch="sm_90"), time_fn=never,
                                  interleaved_fn=fake_interleaved, device="cpu",
                                  free_memory=lambda: 64 << 30)
    assert calls == [(["eager", "torch-math"], 7)]
    by = {r.contender: r for r in results}
    assert [r.contender for r in results] == ["eager", "torch-math", "wrong", "nan", "broken",
                                              "hog"]
    assert (by["eager"].median_ms, by["torch-math"].median_ms) == (1.0, 2.0)
    assert by["eager"].samples == 7 and by["eager"].status == "ok"
    assert [by[n].status for n in ("wrong", "nan", "broken", "hog")] == \
        ["wrong", "wrong", "unavailable", "skipped"]

    def crash(fns, *, rounds):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    results = bench.measure_point(point, _cpu_contenders()[:2], settings,
                                  env=dict(device="cpu", arch="sm_90"), time_fn=never,
                                  interleaved_fn=crash, device="cpu",
                                  free_memory=lambda: 64 << 30)
    assert [r.status for r in results] == ["unavailable", "unavailable"]
    assert "illegal memory access" in results[0].reason


def test_default_contender_runs_the_forward_familys_default_schedule():
    torch = pytest.importorskip("torch")
    from tiledattention import FORWARD

    point = BenchPoint(batch=1, heads=2, seqlen=64, head_dim=64, dtype="bf16", causal=True)
    q = torch.randn(1, 2, 64, 64).bfloat16()
    prepared = bench.make_contenders()["tiledattention-default"].prepare(q, q, q, point, "sm_90")
    # only prepared, not run: the schedule is chosen without a GPU
    assert prepared.schedule == FORWARD.default_schedule("sm_90", point.problem).describe()
    assert prepared.lookup_source == "forced"
    assert prepared.lookup_detail == "FORWARD.default_schedule('sm_90')"


def test_kernel_option_accepts_the_families_with_a_grid(capsys):
    assert _args().kernel == "forward"
    assert _args("--kernel", "forward").kernel == "forward"
    assert _args("--kernel", "decode").kernel == "decode"
    assert _args("--kernel", "backward").kernel == "backward"
    with pytest.raises(SystemExit) as info:
        _args("--kernel", "toy")
    assert info.value.code == 2
    err = _squash(capsys.readouterr().err)
    assert "--kernel" in err and "forward, decode, backward families only" in err
    assert "'toy'" in err


def test_interleave_option_is_validated():
    assert bench_cmd.settings_from_args(_args("--interleave", "30")).interleave == 30
    assert bench_cmd.settings_from_args(_args()).interleave == 0
    with pytest.raises(BenchConfigError, match="--interleave"):
        bench_cmd.settings_from_args(_args("--interleave", "-1"))


def test_environment_names_the_device_and_the_forward_familys_versions(monkeypatch):
    import tiledattention
    from tiledattention import FORWARD, DeviceInfo, current_provenance

    fake = DeviceInfo(index=3, arch="sm_90", name="NVIDIA H100 80GB HBM3", sm_count=132)
    monkeypatch.setattr(tiledattention, "device_info", lambda index: fake)
    env = bench.environment(3)
    prov = current_provenance(FORWARD)
    assert env == dict(device="NVIDIA H100 80GB HBM3", arch="sm_90", driver=prov.driver,
                       torch_version=prov.torch, cuda_tile_version=prov.cuda_tile)


def test_memory_budget_skips_eager_and_math_only_when_too_big():
    table = bench.make_contenders()
    big = BenchPoint(batch=1, heads=32, seqlen=16384, head_dim=64, dtype="bf16", causal=False)
    assert table["eager"].score_bytes(big) == 4 * 32 * 16384 ** 2  # fp32-sized S×S scores
    assert table["torch-math"].score_bytes(big) > table["eager"].score_bytes(big)
    for name in ("tiledattention", "torch-flash", "torch-cudnn", "torch-efficient"):
        assert table[name].score_bytes(big) == 0
    free = 80 << 30  # an 80 GiB GPU: 40% is 32 GiB, the eager scores need exactly 32 GiB
    assert table["eager"].score_bytes(big) <= 0.4 * free
    assert table["torch-math"].score_bytes(big) > 0.4 * free


# -- CSV -----------------------------------------------------------------------------------------

def _result(contender, seqlen, tflops=None, *, status="ok", d=64, causal=False, dtype="bf16",
            reason="", **extra) -> BenchResult:
    tokens, hidden = 16384, 2048
    timed = status == "ok"
    extra.setdefault("rel_err", 1e-3 if timed else None)
    return BenchResult(contender=contender, status=status, reason=reason,
                       batch=tokens // seqlen, heads=hidden // d, seqlen=seqlen, head_dim=d,
                       dtype=dtype, causal=causal,
                       median_ms=(1.0 / tflops) if timed else None,
                       spread_ms=0.01 if timed else None, samples=50 if timed else None,
                       tflops=tflops,
                       device="NVIDIA H100 80GB HBM3", arch="sm_90", driver="13.0",
                       torch_version="2.9.0", cuda_tile_version="1.7.0", **extra)


def test_csv_round_trip(tmp_path):
    results = [
        _result("tiledattention", 1024, 1 / 3, schedule="128x64 occ2 exp2 approx Kt",
                lookup_source="exact-device", lookup_detail="B16 H32 S1024 D64 bf16 full in x.db",
                sm_clock="1980 MHz", mem_clock="2619 MHz"),
        _result("torch-flash", 1024, 123.456789012345, causal=True, dtype="fp16", d=128),
        _result("torch-cudnn", 2048, status="unavailable",
                reason='RuntimeError: No available kernel, "quoted", comma'),
        _result("eager", 16384, status="skipped", reason="would need 32.0 GiB"),
        _result("torch-math", 512, status="wrong", reason="err=0.03 > 0.01",
                rel_err=0.0312345),
    ]
    path = write_csv(results, tmp_path / "sub" / "bench.csv")
    loaded = load_results(path)
    assert loaded == results
    header = path.read_text().splitlines()[0].split(",")
    for column in ("contender", "status", "reason", "batch", "heads", "seqlen", "head_dim",
                   "dtype", "causal", "median_ms", "spread_ms", "samples", "tflops", "rel_err",
                   "schedule", "lookup_source", "device", "arch", "driver", "torch_version",
                   "cuda_tile_version", "sm_clock", "mem_clock"):
        assert column in header
    assert not list(tmp_path.glob("sub/*.tmp"))


def test_load_results_rejects_other_csvs(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="lacks columns"):
        load_results(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_results(tmp_path / "missing.csv")


# -- markdown ------------------------------------------------------------------------------------

def _synthetic() -> list[BenchResult]:
    """tiledattention is 2x and 4x cuDNN at D=64 full (geomean sqrt(8) = 2.83); at S=4096
    cuDNN is unavailable and drops out of the geomean; eager is skipped at S=4096."""
    return [
        _result("tiledattention", 1024, 200.0, schedule="128x64 occ2", lookup_source="nearest"),
        _result("torch-cudnn", 1024, 100.0),
        _result("eager", 1024, 50.0),
        _result("tiledattention", 2048, 300.0, schedule="128x64 occ2", lookup_source="default"),
        _result("torch-cudnn", 2048, 75.0),
        _result("eager", 2048, 30.0),
        _result("tiledattention", 4096, 310.0),
        _result("torch-cudnn", 4096, status="unavailable", reason="RuntimeError: cudnn boom"),
        _result("eager", 4096, status="skipped", reason="would need 99.0 GiB"),
        _result("tiledattention", 1024, 150.0, causal=True),
        _result("torch-cudnn", 1024, 100.0, causal=True),
        _result("eager", 1024, status="wrong", reason="err=0.5 > 0.01", causal=True,
                rel_err=0.5),
    ]


def test_ratio_table_geomeans():
    table = ratio_table(_synthetic())
    assert table[(64, False)]["torch-cudnn"] == pytest.approx(math.sqrt(2.0 * 4.0))
    assert table[(64, False)]["eager"] == pytest.approx(math.sqrt(4.0 * 10.0))
    assert table[(64, True)]["torch-cudnn"] == pytest.approx(1.5)
    assert table[(64, True)]["eager"] is None  # the only eager point is wrong


def test_markdown_summary_content():
    text = render_markdown(_synthetic(), INFO)
    assert "`tiledtune bench --quick`" in text and "2025-01-01" in text
    assert "NVIDIA H100 80GB HBM3 (sm_90)" in text and "2.9.0" in text and "1.7.0" in text
    assert "## bf16, D=64, full" in text and "## bf16, D=64, causal" in text
    head = next(line for line in text.splitlines() if line.startswith("| S |"))
    columns = [c.strip() for c in head.split("|")[1:-1]]
    assert columns == ["S", "B×H", "tiledattention", "torch-cudnn", "eager",
                       "÷ torch-cudnn", "÷ eager"]
    full = [line for line in text.split("## bf16, D=64, full")[1].split("##")[0].splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
             for line in full}
    assert cells["1024"] == ["1024", "16×32", "200.0", "100.0", "50.0", "2.00", "4.00"]
    assert cells["2048"] == ["2048", "8×32", "300.0", "75.0", "30.0", "4.00", "10.00"]
    assert cells["4096"] == ["4096", "4×32", "310.0", "unavailable", "skipped", "—", "—"]
    geo = text.split("## Geometric mean")[1]
    geo_rows = [line for line in geo.splitlines() if line.startswith("| 64 |")]
    assert geo_rows[0].replace(" ", "") == "|64|full|2.83|6.32|"
    assert geo_rows[1].replace(" ", "") == "|64|causal|1.50|—|"
    notes = text.split("## Notes")[1]
    assert "torch-cudnn, bf16 D=64 full S=4096 (B=4, H=32): unavailable: RuntimeError: " \
           "cudnn boom" in notes
    assert "eager, bf16 D=64 full S=4096 (B=4, H=32): skipped: would need 99.0 GiB" in notes
    assert "eager, bf16 D=64 causal S=1024 (B=16, H=32): wrong: err=0.5 > 0.01" in notes
    assert "S=1024: 128x64 occ2 (nearest)" in text


def test_markdown_reports_the_share_of_the_matmul_rate():
    info = RunInfo(command="x", date="d", matmul_tflops=(400.0, 500.0))
    text = render_markdown(_synthetic(), info)
    assert "before and after the grid: 400.0 / 500.0 TFLOP/s" in text
    section = text.split("share of the matrix-product rate (500.0 TFLOP/s)")[1].split("##")[0]
    rows = [line.replace(" ", "") for line in section.splitlines() if line.startswith("| bf16")]
    # the faster of the two rates is the ceiling: 200/500, 300/500, 310/500; causal 150/500
    assert rows == ["|bf16|64|full|40%|60%|62%|", "|bf16|64|causal|30%|—|—|"]
    assert "matrix-product" not in render_markdown(_synthetic(), INFO)


def test_report_only_keeps_the_runs_matmul_rate(tmp_path):
    csv_path = write_csv(_synthetic(), tmp_path / "bench.csv")
    info = RunInfo(command="tiledtune bench", date="d", matmul_tflops=(700.0, 710.5))
    write_run_info(info, tmp_path / "run.json")
    assert RunInfo.from_json((tmp_path / "run.json").read_text()) == info
    assert bench_cmd.run(_args("--report-only", str(csv_path), "--no-plots")) == 0
    assert "700.0 / 710.5 TFLOP/s" in (tmp_path / "summary.md").read_text()


def test_markdown_without_tiledattention_has_no_ratio_columns():
    results = [r for r in _synthetic() if r.contender != "tiledattention"]
    text = render_markdown(results, INFO)
    assert "÷" not in text and "Geometric mean" not in text
    assert "| S | B×H | torch-cudnn | eager |" in text


# -- plots ---------------------------------------------------------------------------------------

def _full_grid_results() -> list[BenchResult]:
    results = []
    for point in build_grid().points():
        for i, name in enumerate(CONTENDERS):
            status = "ok" if (i + point.seqlen // 512) % 7 else "unavailable"
            tflops = 100.0 + 37 * i + math.log2(point.seqlen) * (3 + i) + point.head_dim / 10
            results.append(_result(name, point.seqlen, tflops if status == "ok" else None,
                                   status=status, d=point.head_dim, causal=point.causal,
                                   dtype=point.dtype, reason="" if status == "ok" else "x"))
    return results


def test_plots_are_small_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    written, messages = write_plots(_full_grid_results(), tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["ratio_cudnn_bf16.png", "ratio_cudnn_fp16.png", "tflops_bf16.png",
                     "tflops_fp16.png"]
    assert messages == []
    for path in written:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert 5_000 < len(data) < MAX_PNG_BYTES


def test_plots_lower_dpi_to_fit_and_fail_loudly_when_impossible(tmp_path):
    pytest.importorskip("matplotlib")
    results = _synthetic()
    write_plots(results, tmp_path / "big")
    size = (tmp_path / "big" / "tflops_bf16.png").stat().st_size
    write_plots(results, tmp_path / "small", max_bytes=int(size * 0.8))
    assert (tmp_path / "small" / "tflops_bf16.png").stat().st_size <= size * 0.8
    with pytest.raises(RuntimeError, match="KiB even at dpi"):
        write_plots(results, tmp_path / "tiny", max_bytes=1000)


def test_no_ratio_plot_without_cudnn(tmp_path):
    pytest.importorskip("matplotlib")
    results = [r for r in _synthetic() if r.contender != "torch-cudnn"]
    written, messages = write_plots(results, tmp_path)
    assert [p.name for p in written] == ["tflops_bf16.png"]
    assert "torch-cudnn has no measured point" in messages[0]


def test_plots_skipped_with_a_message_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(PlotsUnavailable, match="pip install"):
        write_plots(_synthetic(), tmp_path)
    csv_path = write_csv(_synthetic(), tmp_path / "bench.csv")
    assert bench_cmd.run(_args("--report-only", str(csv_path))) == 0
    assert "plots skipped" in _squash(capsys.readouterr().err)
    assert (tmp_path / "summary.md").exists() and not list(tmp_path.glob("*.png"))


# -- report-only through run() -------------------------------------------------------------------

def test_report_only_rerenders_from_csv(tmp_path, capsys):
    csv_path = write_csv(_synthetic(), tmp_path / "run" / "bench.csv")
    out = tmp_path / "rendered"
    assert bench_cmd.run(_args("--report-only", str(csv_path), "--out", str(out))) == 0
    summary = (out / "summary.md").read_text()
    assert "re-rendered from" in summary
    assert "| 1024 | 16×32 | 200.0 | 100.0 | 50.0 | 2.00 | 4.00 |" in summary
    assert "unavailable: RuntimeError: cudnn boom" in summary
    if _has_matplotlib():
        assert (out / "tflops_bf16.png").exists()
    out = _squash(capsys.readouterr().out)  # results (tables, files written) on stdout
    assert "summary.md" in out and "unavailable" in out  # the rich table shows statuses


def test_report_only_through_the_cli_registry(tmp_path):
    from tuner import cli

    csv_path = write_csv(_synthetic(), tmp_path / "bench.csv")
    assert cli.main(["bench", "--report-only", str(csv_path), "--no-plots"]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert f"- command: `tiledtune bench --report-only {csv_path} --no-plots (re-rendered " \
        f"from {csv_path})`" in summary


def test_report_only_with_no_plots_and_bad_csv(tmp_path, capsys):
    csv_path = write_csv(_synthetic(), tmp_path / "bench.csv")
    assert bench_cmd.run(_args("--report-only", str(csv_path), "--no-plots")) == 0
    assert not list(tmp_path.glob("*.png")) and (tmp_path / "summary.md").exists()
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n")
    assert bench_cmd.run(_args("--report-only", str(bad))) == 2
    assert "lacks columns" in _squash(capsys.readouterr().err)


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def test_results_round_trip_through_csv_keeps_the_summary(tmp_path):
    results = _synthetic()
    path = write_csv(results, tmp_path / "bench.csv")
    assert render_markdown(load_results(path), INFO) == render_markdown(results, INFO)


def test_every_status_and_order_is_kept():
    results = _synthetic()
    assert {r.status for r in results} == {"ok", "unavailable", "skipped", "wrong"}
    with pytest.raises(ValueError, match="status"):
        dataclasses.replace(results[0], status="fast")
    with pytest.raises(ValueError, match="needs median_ms"):
        dataclasses.replace(results[0], tflops=None)
    assert list(itertools.islice(CONTENDERS, 2)) == ["tiledattention", "tiledattention-default"]
