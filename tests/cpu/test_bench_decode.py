"""``tiledtune bench --kernel decode`` without a GPU: grid, flags, bytes, the reference, the
check-then-time logic on a decode point, CSV, the summary and the plot."""

from __future__ import annotations

import argparse
import json
import math

import pytest

import tiledattention
from tiledattention import Problem
from tuner import bench
from tuner.bench import (
    DECODE_CONTENDERS,
    MAX_PNG_BYTES,
    BenchConfigError,
    BenchResult,
    DecodePoint,
    RunInfo,
    build_decode_grid,
    load_results,
    point_gbps,
    point_tflops,
    problem_bytes,
    render_decode_markdown,
    speedup_table,
    write_csv,
    write_decode_plots,
    write_run_info,
)
from tuner.commands import bench_cmd
from tuner.measure import Timing


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def _squash(text: str) -> str:
    return " ".join(text.split())


def _key(p: DecodePoint) -> tuple:
    return (p.batch, p.seqlen_q, p.seqlen_k, p.mask)


# -- grid ----------------------------------------------------------------------------------------

def test_default_decode_grid():
    grid = build_decode_grid()
    points = grid.points()
    assert grid.contenders == DECODE_CONTENDERS
    assert DECODE_CONTENDERS == ("tiledattention", "tiledattention-default",
                                 "tiledattention-forward", "torch-cudnn", "torch-flash",
                                 "torch-efficient")
    assert all((p.heads_q, p.heads_kv, p.head_dim, p.dtype) == (32, 8, 128, "bf16")
               for p in points)
    single = [(1, 1, s, "none") for s in (4096, 8192, 16384, 30000, 32768, 65536, 100000,
                                          131072)]
    batched = [(b, 1, s, "none") for b in (8, 32) for s in (2048, 8192)]
    assert [_key(p) for p in points] == single + batched + [(8, 16, 8192, "bottom-right")]
    verify = points[-1].problem
    assert verify.causal and verify.bottom_right and verify.causal_offset == 8192 - 16


def test_quick_decode_grid_is_small_and_keeps_each_kind_of_point():
    points = build_decode_grid(quick=True).points()
    assert 0 < len(points) <= 4
    assert {p.mask for p in points} == {"none", "bottom-right"}
    assert {p.batch for p in points} == {1, 8}


def test_flags_replace_their_axis_in_every_group_and_problems_are_measured_once():
    # every group at B=4, S_k=4096: (4,1,4096,none) twice, then the verification group
    grid = build_decode_grid(batches="4", seqlens_k="4096")
    assert [_key(p) for p in grid.points()] == [(4, 1, 4096, "none"),
                                                (4, 16, 4096, "bottom-right")]
    # bottom-right with S_q = 1 masks nothing: one problem, listed once, as "none"
    grid = build_decode_grid(batches="1", seqlens_q="1", seqlens_k="4096",
                             masks="none,bottom-right")
    assert [_key(p) for p in grid.points()] == [(1, 1, 4096, "none")]
    grid = build_decode_grid(batches="2", seqlens_q="4", seqlens_k="64", masks="br,causal,no",
                             heads="32/8,16,64/1", head_dims="64,128", dtypes="fp16,bf16",
                             contenders="torch-flash,tiledattention")
    points = grid.points()
    assert grid.contenders == ("tiledattention", "torch-flash")  # canonical order
    assert len(points) == 2 * 3 * 2 * 3  # dtypes x heads x head dims x masks
    assert {(p.heads_q, p.heads_kv) for p in points} == {(32, 8), (16, 16), (64, 1)}
    assert [p.dtype for p in points[:18]] == ["fp16"] * 18  # dtype order as given
    assert [p.mask for p in points[:3]] == ["none", "top-left", "bottom-right"]
    assert build_decode_grid(contenders="all").contenders == DECODE_CONTENDERS
    assert build_decode_grid(heads=[(8, 2)], batches=[3]).points()[0].heads_kv == 2


@pytest.mark.parametrize("kwargs, flag, words", [
    (dict(batches="0"), "--batch", "positive integer"),
    (dict(batches="1,1"), "--batch", "twice"),
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
    (dict(head_dims="100"), "--head-dims", "multiples of 8"),
    (dict(dtypes="fp32"), "--dtypes", "'fp32'"),
    (dict(contenders="torch-math"), "--contenders", "'torch-math'"),
    (dict(seqlens_q="16", seqlens_k="8"), "--seqlens-q", "S_q 16 > S_k 8"),
    (dict(batches="100000", seqlens_k="131072"), "--batch", "int32"),
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
    assert bench_cmd.run(_args("--kernel", "decode", "--quick")) == 1
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
    assert [p.describe() for p in grid.points()] == ["B2 H8/2 S_q1 S_k1000 D64 fp16 none"]


# -- the point, bytes and rates ------------------------------------------------------------------

def test_decode_point_problem_and_result_fields():
    point = DecodePoint(batch=8, heads_q=32, heads_kv=8, seqlen_q=16, seqlen_k=8192,
                        head_dim=128, dtype="bf16", mask="bottom-right")
    assert point.problem == Problem(batch=8, heads_q=32, heads_kv=8, seqlen_q=16,
                                    seqlen_k=8192, head_dim=128, dtype="bf16", causal=True,
                                    bottom_right=True)
    assert point.causal_arg == "bottom_right"
    assert DecodePoint.of(point.problem) == point
    fields = point.result_fields()
    assert fields == dict(kernel="decode", batch=8, heads=32, heads_kv=8, seqlen_q=16,
                          seqlen=8192, head_dim=128, dtype="bf16", causal=True,
                          bottom_right=True)
    assert [DecodePoint(**{**point.__dict__, "mask": m}).causal_arg
            for m in ("none", "top-left")] == [False, True]
    with pytest.raises(ValueError, match="mask"):
        DecodePoint(**{**point.__dict__, "mask": "causal"})


def test_bytes_are_q_k_v_and_out_once_each_in_the_input_dtype():
    torch = pytest.importorskip("torch")
    for b, hq, hkv, sq, sk, d in ((1, 32, 8, 1, 30000, 128), (8, 32, 8, 16, 8192, 128),
                                  (3, 6, 2, 5, 77, 40)):
        problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk,
                          head_dim=d, dtype="fp16", causal=False)
        q = torch.empty(b, hq, sq, d, dtype=torch.float16)
        k = torch.empty(b, hkv, sk, d, dtype=torch.float16)
        moved = 2 * q.nbytes + 2 * k.nbytes  # q read and out written; k and v read
        assert problem_bytes(problem) == moved
        assert point_gbps(problem, 0.5) == pytest.approx(moved / 0.5e-3 / 1e9, rel=1e-12)
    point = build_decode_grid().points()[0]  # B1 H32/8 S_q1 S_k4096 D128
    k_and_v = 2 * 8 * 4096 * 128 * 2
    assert problem_bytes(point.problem) == k_and_v + 2 * 32 * 128 * 2
    assert point_tflops(point, 1e-3) == pytest.approx(4 * 32 * 4096 * 128 / 1e-6 / 1e12)
    with pytest.raises(ValueError):
        point_gbps(point, 0.0)


# -- reference and contenders on the CPU --------------------------------------------------------

def _explicit_reference(q, k, v, offset):
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = (x.float().repeat_interleave(group, dim=1) for x in (k, v))
    scores = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if offset is not None:
        i = torch.arange(q.shape[2])[:, None]
        j = torch.arange(k.shape[2])[None, :]
        scores = scores.masked_fill(j > i + offset, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("sq, sk", [(1, 70), (7, 70), (16, 16)])
@pytest.mark.parametrize("mask", ["none", "top-left", "bottom-right"])
def test_reference_handles_grouped_heads_and_both_alignments(sq, sk, mask):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 8, sq, 40, generator=gen).bfloat16()
    k = torch.randn(2, 2, sk, 40, generator=gen).bfloat16()
    v = torch.randn(2, 2, sk, 40, generator=gen).bfloat16()
    causal, br = mask != "none", mask == "bottom-right"
    # a budget of two rows per chunk: the offsets must carry over between chunks
    out = bench.reference_attention(q, k, v, causal, bottom_right=br,
                                    budget_bytes=2 * 4 * 2 * 8 * sk * 2)
    offset = None if not causal else (sk - sq if br else 0)
    torch.testing.assert_close(out, _explicit_reference(q, k, v, offset), rtol=1e-5,
                               atol=1e-5)


def test_torch_contenders_get_gqa_and_the_bottom_right_mask():
    torch = pytest.importorskip("torch")
    from torch.nn.attention.bias import CausalBias

    point = DecodePoint(batch=1, heads_q=8, heads_kv=2, seqlen_q=4, seqlen_k=50, head_dim=64,
                        dtype="bf16", mask="bottom-right")
    kwargs = bench.torch_sdpa_kwargs(point.problem)
    assert set(kwargs) == {"attn_mask", "enable_gqa"} and kwargs["enable_gqa"] is True
    assert isinstance(kwargs["attn_mask"], CausalBias)
    top = DecodePoint(**{**point.__dict__, "mask": "top-left", "heads_kv": 8})
    assert bench.torch_sdpa_kwargs(top.problem) == {"is_causal": True}
    # the same keywords through torch's math backend on the CPU match the reference
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 8, 4, 64, generator=gen).bfloat16()
    k, v = (torch.randn(1, 2, 50, 64, generator=gen).bfloat16() for _ in range(2))
    prepared = bench.torch_sdpa("MATH")(q, k, v, point, "sm_90")
    with prepared.context():
        out = prepared.fn()
    ref = bench.reference_attention(q, k, v, True, bottom_right=True, budget_bytes=1 << 20)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


class _FakeRuntime:
    def __init__(self, calls):
        self.calls = calls

    def resolution(self, family, problem, device_index):
        self.calls.append(("resolution", family.name, problem, device_index))
        return tiledattention.Resolution(schedule=family.default_schedule("sm_90", problem),
                                         source="default", detail="fake", family=family.name)


def test_our_contenders_pass_the_right_schedule_and_mask(monkeypatch):
    torch = pytest.importorskip("torch")
    if not hasattr(tiledattention, "DECODE"):
        pytest.skip("the decode family is not in this checkout")
    calls = []
    monkeypatch.setattr(tiledattention, "runtime", lambda: _FakeRuntime(calls))
    monkeypatch.setattr(tiledattention, "sdpa", lambda q, k, v, causal=False, scale=None, *,
                        schedule=None: calls.append(("sdpa", causal, schedule)) or q)
    monkeypatch.setattr(tiledattention, "explain",
                        lambda q, k, v, causal=False: _FakeRuntime([]).resolution(
                            tiledattention.DECODE, point.problem, 0))
    point = build_decode_grid().points()[-1]  # S_q 16, bottom-right
    q = torch.zeros(8, 32, 16, 128).bfloat16()
    table = bench.make_decode_contenders()
    prepared = {name: table[name].prepare(q, q, q, point, "sm_90")
                for name in ("tiledattention", "tiledattention-default",
                             "tiledattention-forward")}
    for p in prepared.values():
        p.fn()
    sdpa_calls = [c for c in calls if c[0] == "sdpa"]
    decode_default = tiledattention.DECODE.default_schedule("sm_90", point.problem)
    forward_default = tiledattention.FORWARD.default_schedule("sm_90", point.problem)
    assert sdpa_calls == [("sdpa", "bottom_right", None),  # dispatch + lookup: no schedule
                          ("sdpa", "bottom_right", decode_default),
                          ("sdpa", "bottom_right", forward_default)]
    assert ("resolution", "forward", point.problem, None) in calls
    assert prepared["tiledattention"].schedule == f"decode: {decode_default.describe()}"
    assert prepared["tiledattention-default"].lookup_source == "forced"
    assert prepared["tiledattention-forward"].schedule == \
        f"forward: {forward_default.describe()}"


def _fake_interleaved(fns, *, rounds):
    for fn in fns.values():
        fn()
    return {name: Timing(median_ms=0.01 * (i + 1), spread_ms=0.0, mean_ms=0.01 * (i + 1),
                         min_ms=0.01 * (i + 1), samples=rounds) for i, name in enumerate(fns)}


def test_measure_point_on_a_decode_point_on_cpu():
    torch = pytest.importorskip("torch")

    def wrong(q, k, v, point, arch):
        return bench.Prepared(lambda: torch.zeros_like(q))

    point = DecodePoint(batch=2, heads_q=8, heads_kv=2, seqlen_q=3, seqlen_k=300, head_dim=64,
                        dtype="bf16", mask="bottom-right")
    table = bench.make_decode_contenders()
    contenders = [bench.Contender("math", bench.torch_sdpa("MATH")),
                  bench.Contender("auto", bench.torch_sdpa(None)), bench.Contender("wrong", wrong),
                  table["tiledattention"]]  # CPU tensors: tiledattention.sdpa refuses them
    results = bench.measure_point(point, contenders, bench.BenchSettings(interleave=5),
                                  env=dict(device="cpu", arch="sm_90"),
                                  interleaved_fn=_fake_interleaved, device="cpu",
                                  free_memory=lambda: 64 << 30)
    by = {r.contender: r for r in results}
    assert [by[n].status for n in ("math", "auto", "wrong", "tiledattention")] == \
        ["ok", "ok", "wrong", "unavailable"]
    assert "CUDA" in by["tiledattention"].reason
    math_row = by["math"]
    assert (math_row.kernel, math_row.batch, math_row.heads, math_row.heads_kv,
            math_row.seqlen_q, math_row.seqlen, math_row.bottom_right) == \
        ("decode", 2, 8, 2, 3, 300, True)
    assert math_row.median_ms == 0.01 and math_row.samples == 5
    assert math_row.gbps == pytest.approx(problem_bytes(point.problem) / 1e-5 / 1e9)
    assert math_row.tflops == pytest.approx(point.problem.flops / 1e-5 / 1e12)
    assert by["auto"].median_ms == 0.02


# -- reports -------------------------------------------------------------------------------------

_ENV = dict(device="NVIDIA H100 80GB HBM3", arch="sm_90", driver="580.1",
            torch_version="2.11.0", cuda_tile_version="1.2.0")


def _row(contender, point: DecodePoint, us=None, *, status="ok", reason="", **extra):
    timed = status == "ok"
    ms = us / 1000 if timed else None
    extra.setdefault("rel_err", 1e-3 if timed else None)
    return BenchResult(contender=contender, status=status, reason=reason,
                       median_ms=ms, spread_ms=0.0 if timed else None,
                       samples=30 if timed else None,
                       tflops=point_tflops(point, ms) if timed else None,
                       gbps=point_gbps(point, ms) if timed else None,
                       **point.result_fields(), **_ENV, **extra)


def _synthetic():
    """Three points. P1: ours 10 µs, cuDNN 20, flash 15, efficient 30 (best FA: flash 15).
    P2: ours 40, cuDNN 40, flash unavailable, efficient 80. P3 (bottom-right): cuDNN and flash
    unavailable (listed, not averaged), efficient 60, ours 30; the default is wrong."""
    p1, p2, p3 = (build_decode_grid().points()[i] for i in (0, 8, 12))
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
    table = speedup_table(_synthetic())
    assert list(table) == ["tiledattention", "tiledattention-default", "tiledattention-forward"]
    value, n = table["tiledattention"]["cuDNN"]
    assert n == 2 and value == pytest.approx(math.sqrt(2.0 * 1.0))
    value, n = table["tiledattention"]["flash/efficient"]  # 15/10, 80/40, 60/30
    assert n == 3 and value == pytest.approx((1.5 * 2.0 * 2.0) ** (1 / 3))
    value, n = table["tiledattention-default"]["flash/efficient"]  # P3 is wrong: left out
    assert n == 2 and value == pytest.approx(math.sqrt(1.2 * 2.0))
    assert table["tiledattention-forward"]["cuDNN"][0] == pytest.approx(math.sqrt(0.4 * 0.5))


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
    text = render_decode_markdown(results, info)
    assert text.startswith("# tiledattention decode benchmark")
    assert "NVIDIA H100 80GB HBM3 (sm_90)" in text and "cuda-tile 1.2.0" in text
    assert "2900 / 3000 GB/s" in text and "shares are of the faster, 3000" in text
    p1 = "B1 H32/8 S_q1 S_k4096 D128 bf16 none"
    gbps = problem_bytes(results[0] and build_decode_grid().points()[0].problem) / 10e-6 / 1e9
    assert _cells(text, p1, "tiledattention") == [
        "10.0", f"{point_tflops(build_decode_grid().points()[0], 0.01):.2f}", f"{gbps:.0f}",
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
    bare = render_decode_markdown(results, RunInfo(command="x", date="d"))
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
    assert "geomean speed-up" in out and "unavailable" in out and "B1 H32/8" in out


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
    written, messages = write_decode_plots(_synthetic(), tmp_path, (2900.0, 3000.0))
    assert [p.name for p in written] == ["decode_copy_share.png"] and messages == []
    data = written[0].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < MAX_PNG_BYTES
    # a big grid (every default point in both dtypes) still fits
    big = []
    for point in build_decode_grid(dtypes="bf16,fp16", heads="32/8,64/8").points():
        big += [_row(name, point, 10.0 + i) for i, name in enumerate(DECODE_CONTENDERS)]
    written, _ = write_decode_plots(big, tmp_path / "big", (3000.0,))
    assert written[0].stat().st_size < MAX_PNG_BYTES
    written, messages = write_decode_plots(_synthetic(), tmp_path / "bare")
    assert "GB/s" in messages[0]
