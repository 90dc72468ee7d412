"""``tiledtune bench --kernel decode`` without a GPU: the preset's grid and flags, bytes, CSV,
the summary (GB/s, the share of the copy rate, speed-ups) and the plot."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from tiledattention import Problem
from tuner.bench import (
    MAX_PNG_BYTES,
    PRESETS,
    BenchConfigError,
    BenchResult,
    RunInfo,
    build_grid,
    load_results,
    problem_bytes,
    render_markdown,
    result_fields,
    write_csv,
    write_plots,
    write_run_info,
)
from tuner.commands import bench_cmd

DECODE_CONTENDERS = PRESETS["decode"].order


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def _squash(text: str) -> str:
    return " ".join(text.split())


def _mask(p: Problem) -> str:
    return ("bottom-right" if p.bottom_right else "top-left") if p.causal else "none"


def _key(p: Problem) -> tuple:
    return (p.batch, p.seqlen_q, p.seqlen_k, _mask(p))


def build_decode_grid(**options):
    return build_grid("decode", **options)


# -- grid ----------------------------------------------------------------------------------------

def test_default_decode_grid():
    grid = build_decode_grid()
    points = grid.problems
    assert grid.contenders == ("tiledattention", "tiledattention-default",
                               "tiledattention-forward", "torch-cudnn", "torch-flash",
                               "flash-attn-4")
    assert all((p.heads_q, p.heads_kv, p.head_dim, p.dtype) == (32, 8, 128, "bf16")
               for p in points)
    single = [(1, 1, s, "none") for s in (4096, 8192, 16384, 30000, 32768, 65536, 100000,
                                          131072)]
    batched = [(b, 1, s, "none") for b in (8, 32) for s in (2048, 8192)]
    assert [_key(p) for p in points] == single + batched + [(8, 16, 8192, "bottom-right")]
    verify = points[-1]
    assert verify.causal and verify.bottom_right and verify.causal_offset == 8192 - 16


def test_quick_decode_grid_is_small_and_keeps_each_kind_of_point():
    points = build_decode_grid(quick=True).problems
    assert 0 < len(points) <= 4
    assert {_mask(p) for p in points} == {"none", "bottom-right"}
    assert {p.batch for p in points} == {1, 8}


def test_flags_replace_their_axis_in_every_group_and_problems_are_measured_once():
    # every group at B=4, S_k=4096: (4,1,4096,none) twice, then the verification group
    grid = build_decode_grid(batch="4", seqlens_k="4096")
    assert [_key(p) for p in grid.problems] == [(4, 1, 4096, "none"),
                                                (4, 16, 4096, "bottom-right")]
    # bottom-right with S_q = 1 masks nothing: one problem, listed once, as "none"
    grid = build_decode_grid(batch="1", seqlens_q="1", seqlens_k="4096",
                             masks="none,bottom-right")
    assert [_key(p) for p in grid.problems] == [(1, 1, 4096, "none")]
    grid = build_decode_grid(batch="2", seqlens_q="4", seqlens_k="64", masks="br,causal,no",
                             heads="32/8,16,64/1", head_dims="64,128", dtypes="fp16,bf16",
                             contenders="torch-flash,tiledattention")
    points = grid.problems
    assert grid.contenders == ("tiledattention", "torch-flash")  # canonical order
    assert len(points) == 2 * 3 * 2 * 3  # dtypes x heads x head dims x masks
    assert {(p.heads_q, p.heads_kv) for p in points} == {(32, 8), (16, 16), (64, 1)}
    assert [p.dtype for p in points[:18]] == ["fp16"] * 18  # dtype order as given
    assert [_mask(p) for p in points[:3]] == ["none", "top-left", "bottom-right"]
    assert build_decode_grid(contenders="all").contenders == PRESETS["decode"].contenders
    assert build_decode_grid(heads=[(8, 2)], batch=[3]).problems[0].heads_kv == 2


@pytest.mark.parametrize("kwargs, flag, words", [
    (dict(batch="0"), "--batch", "positive integer"),
    (dict(batch="1,1"), "--batch", "twice"),
    (dict(seqlens_k=""), "--seqlens-k", "comma-separated"),
    (dict(seqlens_k="4096,,8192"), "--seqlens-k", "empty item"),
    (dict(seqlens_q="x"), "--seqlens-q", "positive integer"),
    (dict(masks="sliding"), "--masks", "'sliding'"),
    (dict(masks="none,full"), "--masks", "twice"),
    (dict(heads="32/5"), "--heads", "multiple of H_kv"),
    (dict(heads="32/8/2"), "--heads", "H_q/H_kv"),
    (dict(heads="32/"), "--heads", "H_q/H_kv"),
    (dict(heads="32/0"), "--heads", "positive integer"),
    (dict(heads="32/8,32/8"), "--heads", "twice"),
    (dict(head_dims="100"), "--head-dims", "multiple of 8"),
    (dict(dtypes="fp32"), "--dtypes", "'fp32'"),
    (dict(contenders="torch-math"), "--contenders", "'torch-math' for --kernel decode"),
    (dict(seqlens_q="16", seqlens_k="8"), "--seqlens-q", "S_q 16 > S_k 8"),
    (dict(batch="100000", seqlens_k="131072"), "--batch", "int32"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_decode_flags_are_rejected_naming_the_flag(kwargs, flag, words):
    with pytest.raises(BenchConfigError) as info:
        build_decode_grid(**kwargs)
    message = str(info.value)
    assert message.startswith(flag), message
    assert words in message, message


@pytest.mark.parametrize("argv, flag", [
    (("--kernel", "decode", "--seqlens", "1024"), "--seqlens belongs to the forward grid"),
    (("--kernel", "decode", "--tokens", "8192"), "--tokens belongs to the forward grid"),
    (("--kernel", "decode", "--no-matmul"), "--no-matmul belongs to the forward grid"),
    (("--batch", "4"), "--batch belongs to the decode grid"),
    (("--kernel", "forward", "--heads", "32/8"), "--heads belongs to the decode grid"),
    (("--kernel", "decode", "--heads", "32/5"), "--heads"),
    (("--kernel", "decode", "--masks", "maybe"), "--masks"),
    (("--kernel", "decode", "--contenders", "eager"), "--contenders"),
    (("--kernel", "decode", "--interleave", "-2"), "--interleave"),
], ids=lambda x: "-".join(x) if isinstance(x, tuple) else None)
def test_run_rejects_bad_decode_flags_with_exit_2(argv, flag, capsys):
    assert bench_cmd.run(_args(*argv)) == 2
    err = _squash(capsys.readouterr().err)
    assert "error" in err and flag in err, err


def test_decode_run_without_a_gpu_gets_past_the_flags(capsys):
    pytest.importorskip("torch")
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert bench_cmd.run(_args("--kernel", "decode", "--quick")) == 2  # an environment condition
    assert "no CUDA device" in _squash(capsys.readouterr().err)


def test_decode_interleaves_by_default():
    assert bench_cmd.settings_from_args(_args("--kernel", "decode")).interleave == 30
    assert bench_cmd.settings_from_args(_args("--kernel", "decode", "--quick")).interleave == 10
    assert bench_cmd.settings_from_args(
        _args("--kernel", "decode", "--interleave", "0")).interleave == 0
    assert bench_cmd.settings_from_args(_args()).interleave == 0  # forward: unchanged


def test_grid_from_args_builds_the_decode_grid():
    grid = bench_cmd.grid_from_args(_args("--kernel", "decode", "--batch", "2", "--seqlens-q",
                                          "1", "--seqlens-k", "1000", "--heads", "8/2",
                                          "--head-dims", "64", "--dtypes", "fp16"))
    assert grid.problems == (Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=1, seqlen_k=1000,
                                     head_dim=64, dtype="fp16", causal=False),)
    assert grid.kernel == "decode" and grid.preset.also == ("forward",)


def test_result_fields_of_a_decode_problem():
    problem = build_decode_grid().problems[-1]
    assert result_fields(problem) == dict(batch=8, heads=32, heads_kv=8, seqlen_q=16,
                                          seqlen=8192, head_dim=128, dtype="bf16", causal=True,
                                          bottom_right=True)


def test_bytes_are_q_k_v_and_out_once_each_in_the_input_dtype():
    torch = pytest.importorskip("torch")
    for b, hq, hkv, sq, sk, d in ((1, 32, 8, 1, 30000, 128), (8, 32, 8, 16, 8192, 128),
                                  (3, 6, 2, 5, 77, 40)):
        problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk,
                          head_dim=d, dtype="fp16", causal=False)
        q = torch.empty(b, hq, sq, d, dtype=torch.float16)
        k = torch.empty(b, hkv, sk, d, dtype=torch.float16)
        assert problem_bytes(problem) == 2 * q.nbytes + 2 * k.nbytes  # q, out; k, v
    point = build_decode_grid().problems[0]  # B1 H32/8 S_q1 S_k4096 D128
    assert problem_bytes(point) == 2 * 8 * 4096 * 128 * 2 + 2 * 32 * 128 * 2


# -- reports -------------------------------------------------------------------------------------

_ENV = dict(device="NVIDIA H100 80GB HBM3", arch="sm_90", driver="580.1",
            torch_version="2.11.0", cuda_tile_version="1.2.0")


def _tflops(point: Problem, ms: float) -> float:
    return point.flops / (ms * 1e-3) / 1e12


def _gbps(point: Problem, ms: float) -> float:
    return problem_bytes(point) / (ms * 1e-3) / 1e9


def _row(contender, point: Problem, us=None, *, status="ok", reason="", **extra):
    timed = status == "ok"
    ms = us / 1000 if timed else None
    extra.setdefault("rel_err", 1e-3 if timed else None)
    return BenchResult(contender=contender, status=status, reason=reason,
                       median_ms=ms, spread_ms=0.0 if timed else None,
                       samples=30 if timed else None,
                       tflops=_tflops(point, ms) if timed else None,
                       gbps=_gbps(point, ms) if timed else None, kernel="decode",
                       **result_fields(point), **_ENV, **extra)


def _synthetic():
    """Three points. P1: ours 10 µs, cuDNN 20, flash 15, efficient 30 (best FA: flash 15).
    P2: ours 40, cuDNN 40, flash unavailable, efficient 80. P3 (bottom-right): cuDNN and flash
    unavailable (listed, not averaged), efficient 60, ours 30; the default is wrong."""
    p1, p2, p3 = (build_decode_grid().problems[i] for i in (0, 8, 12))
    return [
        _row("tiledattention", p1, 10.0, schedule="decode: split8", lookup_source="default"),
        _row("tiledattention-default", p1, 12.5),
        _row("tiledattention-forward", p1, 50.0),
        _row("torch-cudnn", p1, 20.0), _row("torch-flash", p1, 15.0),
        _row("torch-efficient", p1, 30.0),
        _row("tiledattention", p2, 40.0), _row("tiledattention-default", p2, 40.0),
        _row("tiledattention-forward", p2, 80.0), _row("torch-cudnn", p2, 40.0),
        _row("torch-flash", p2, status="unavailable", reason="RuntimeError: flash boom"),
        _row("torch-efficient", p2, 80.0),
        _row("tiledattention", p3, 30.0),
        _row("tiledattention-default", p3, status="wrong", reason="err=0.5 > 0.01",
             rel_err=0.5),
        _row("tiledattention-forward", p3, 45.0),
        _row("torch-cudnn", p3, status="unavailable",
             reason="RuntimeError: No available kernel (cuDNN: no causal_lower_right)"),
        _row("torch-flash", p3, status="unavailable", reason="RuntimeError: no kernel"),
        _row("torch-efficient", p3, 60.0),
    ]


def test_speedups_are_geomeans_over_the_points_where_both_ran():
    text = render_markdown(_synthetic(), RunInfo(command="x", date="d"))
    geo = text.split("## Geometric mean speed-up")[1].split("\n## ")[0]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in geo.splitlines() if line.startswith("| tiledattention")}
    assert list(rows) == ["tiledattention", "tiledattention-default", "tiledattention-forward"]
    # cuDNN: 20/10, 40/40; flash/efficient (the faster that ran): 15/10, 80/40, 60/30
    assert rows["tiledattention"] == [f"{math.sqrt(2.0):.2f}", "2",
                                      f"{(1.5 * 2.0 * 2.0) ** (1 / 3):.2f}", "3"]
    # the default is wrong at P3: left out
    assert rows["tiledattention-default"][2:] == [f"{math.sqrt(1.2 * 2.0):.2f}", "2"]
    assert rows["tiledattention-forward"][0] == f"{math.sqrt(0.4 * 0.5):.2f}"


def _cells(text: str, point: str, contender: str) -> list[str]:
    block = text.split("## Per point")[1].split("\n## ")[0]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in block.splitlines()
            if line.startswith("| ")]
    current = None
    for row in rows:
        current = row[0] or current
        if current == point and row[1] == contender:
            return row[2:]
    raise AssertionError(f"no row for {point} {contender}")


def test_decode_summary_content():
    info = RunInfo(command="tiledtune bench --kernel decode", date="2026-11-23",
                   copy_gbps=(2900.0, 3000.0))
    results = _synthetic()
    text = render_markdown(results, info)
    assert text.startswith("# tiledattention decode benchmark")
    assert "NVIDIA H100 80GB HBM3 (sm_90)" in text and "cuda-tile 1.2.0" in text
    assert "2900 / 3000 GB/s" in text and "shares are of the faster, 3000" in text
    p1 = "B1 H32/8 S_q1 S_k4096 D128 bf16 none"
    gbps = _gbps(build_decode_grid().problems[0], 0.01)
    assert _cells(text, p1, "tiledattention") == [
        "10.0", f"{_tflops(build_decode_grid().problems[0], 0.01):.2f}", f"{gbps:.0f}",
        f"{100 * gbps / 3000:.0f}%", "2.00", "1.50"]
    assert _cells(text, p1, "torch-flash")[-2:] == ["1.33", "1.00"]
    p3 = "B8 H32/8 S_q16 S_k8192 D128 bf16 bottom-right"
    assert _cells(text, p3, "torch-cudnn") == ["unavailable"] + ["—"] * 5
    assert _cells(text, p3, "tiledattention")[-2:] == ["—", "2.00"]
    share = text.split("## Share of the copy bandwidth")[1].split("\n## ")[0]
    assert f"| {p3} | " in share and "unavailable" in share and "wrong" in share
    geo = text.split("## Geometric mean speed-up")[1].split("\n## ")[0]
    assert "| tiledattention | 1.41 | 2 | 1.82 | 3 |" in geo
    notes = text.split("## Notes")[1]
    assert f"torch-cudnn, {p3}: unavailable: RuntimeError: No available kernel" in notes
    assert f"tiledattention-default, {p3}: wrong: err=0.5 > 0.01" in notes
    assert f"- {p1}, tiledattention: decode: split8 (default)" in text
    # without a copy rate there is no share column content and no share table
    bare = render_markdown(results, RunInfo(command="x", date="d"))
    assert "## Share of the copy bandwidth" not in bare
    assert _cells(bare, p1, "tiledattention")[3] == "—"


def test_decode_csv_round_trip_and_report_only(tmp_path, capsys):
    results = _synthetic()
    path = write_csv(results, tmp_path / "bench.csv")
    assert load_results(path) == results
    header = path.read_text().splitlines()[0].split(",")
    for column in ("kernel", "heads_kv", "seqlen_q", "bottom_right", "gbps"):
        assert column in header
    info = RunInfo(command="tiledtune bench --kernel decode", date="d", copy_gbps=(3000.0,))
    write_run_info(info, tmp_path / "run.json")
    assert json.loads((tmp_path / "run.json").read_text())["copy_gbps"] == [3000.0]
    out = tmp_path / "again"
    assert bench_cmd.run(_args("--report-only", str(path), "--out", str(out))) == 0
    summary = (out / "summary.md").read_text()
    assert "decode benchmark" in summary and "re-rendered from" in summary
    assert "shares are of the faster, 3000" in summary
    if _has_matplotlib():
        assert (out / "decode_copy_share.png").exists()
    out = _squash(capsys.readouterr().out)  # results on stdout
    assert "Geometric mean speed-up" in out and "Share of the copy bandwidth" in out
    assert "unavailable" in out and "B1 H32/8" in out and "--kernel decode" in out


def test_forward_csvs_without_the_decode_columns_still_load(tmp_path):
    old = ("contender,status,reason,batch,heads,seqlen,head_dim,dtype,causal,median_ms,"
           "spread_ms,samples,tflops,rel_err\n"
           "torch-flash,ok,,4,16,4096,128,bf16,yes,1.5,0.1,30,300.0,0.001\n")
    (tmp_path / "old.csv").write_text(old)
    (row,) = load_results(tmp_path / "old.csv")
    assert (row.kernel, row.heads_kv, row.seqlen_q, row.bottom_right, row.gbps) == \
        ("forward", None, None, False, None)
    assert row.mask == "causal" and row.tflops == 300.0
    (tmp_path / "bad.csv").write_text(old.replace(",yes,", ",maybe,"))
    with pytest.raises(ValueError, match="causal must be yes or no"):
        load_results(tmp_path / "bad.csv")


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def test_decode_plot_is_a_small_png(tmp_path):
    pytest.importorskip("matplotlib")
    written, messages = write_plots(_synthetic(), tmp_path, (2900.0, 3000.0))
    assert [p.name for p in written] == ["decode_copy_share.png"] and messages == []
    data = written[0].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < MAX_PNG_BYTES
    # a big grid (every default point in both dtypes) still fits
    big = []
    for point in build_decode_grid(dtypes="bf16,fp16", heads="32/8,64/8").problems:
        big += [_row(name, point, 10.0 + i) for i, name in enumerate(DECODE_CONTENDERS)]
    written, _ = write_plots(big, tmp_path / "big", (3000.0,))
    assert written[0].stat().st_size < MAX_PNG_BYTES
    written, messages = write_plots(_synthetic(), tmp_path / "bare")
    assert "GB/s" in messages[0]
