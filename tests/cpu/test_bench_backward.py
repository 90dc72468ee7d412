"""``tiledtune bench --kernel backward`` without a GPU: the preset's grid and flags, CSV, the
summary (geometric means over the points where both ran; rows of the committed study's two
phases and of the backward family's one) and the plots."""

from __future__ import annotations

import argparse
import json

import pytest

from tiledattention import BACKWARD
from tuner.bench import (MAX_PNG_BYTES, PRESETS, BenchConfigError, BenchResult, RunInfo,
                         build_grid, load_results, render_markdown, result_fields, write_csv,
                         write_plots)
from tuner.commands import bench_cmd

#: the phases of the committed study's rows (the backward family's rows time "backward")
PHASES = ("backward", "forward+backward")
#: the contenders of the committed study (torch-efficient is no baseline of the family's case)
CONTENDERS = PRESETS["backward"].order


def build_backward_grid(**options):
    return build_grid("backward", **options)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def _squash(text: str) -> str:
    return " ".join(text.split())


# -- grid and flags

def test_default_backward_grid_is_the_issues_grid():
    grid = build_backward_grid()
    points = grid.problems
    assert len(points) == 2 * 3 * 3 * 2 == len(set(points))
    assert grid.contenders == ("tiledattention", "tiledattention-default", "torch-cudnn",
                               "torch-flash", "flash-attn-4")
    assert {p.dtype for p in points} == {"bf16", "fp16"}
    assert {p.head_dim for p in points} == {64, 128, 256}
    assert {p.seqlen_q for p in points} == {1024, 4096, 16384}
    assert {p.causal for p in points} == {False, True}
    assert all(p.batch * p.seqlen_q == 16384 and p.heads_q * p.head_dim == 2048 for p in points)
    assert all(p.heads_kv == p.heads_q and not p.bottom_right for p in points)
    assert isinstance(points[0], BACKWARD.problem_type) and grid.preset.phase == "backward"
    quick = build_backward_grid(quick=True).problems
    assert len(quick) == 8 and {p.dtype for p in quick} == {"bf16"}


def test_flags_shrink_the_backward_grid():
    grid = bench_cmd.grid_from_args(_args(
        "--kernel", "backward", "--dtypes", "fp16", "--head-dims", "128", "--seqlens",
        "2048,8192", "--causal", "yes", "--contenders", "torch-flash,tiledattention"))
    assert [(p.dtype, p.head_dim, p.seqlen_q, p.causal, p.batch, p.heads_q)
            for p in grid.problems] == [("fp16", 128, 2048, True, 8, 16),
                                        ("fp16", 128, 8192, True, 2, 16)]
    assert grid.contenders == ("tiledattention", "torch-flash")  # canonical order
    small = bench_cmd.grid_from_args(_args("--kernel", "backward", "--tokens", "2048",
                                           "--hidden", "256", "--seqlens", "512"))
    assert {(p.batch, p.heads_q) for p in small.problems} == {(4, 4), (4, 2), (4, 1)}


@pytest.mark.parametrize("kwargs, flag, words", [
    (dict(seqlens="1000"), "--seqlens", "does not divide --tokens"),
    (dict(head_dims="100"), "--head-dims", "multiple of 8"),
    (dict(head_dims="96", hidden="1000"), "--head-dims", "does not divide --hidden"),
    (dict(dtypes="fp32"), "--dtypes", "'fp32'"),
    (dict(causal="maybe"), "--causal", "'maybe'"),
    (dict(contenders="eager"), "--contenders", "'eager' for --kernel backward"),
    (dict(contenders="torch-efficient"), "--contenders", "'torch-efficient'"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_backward_flags_are_rejected_naming_the_flag(kwargs, flag, words):
    with pytest.raises(BenchConfigError) as info:
        build_backward_grid(**kwargs)
    assert str(info.value).startswith(flag) and words in str(info.value), str(info.value)


@pytest.mark.parametrize("argv, words", [
    (("--kernel", "backward", "--batch", "4"),
     "--batch belongs to the decode grid (--kernel decode); it does nothing with --kernel "
     "backward"),
    (("--kernel", "backward", "--masks", "none"), "--masks belongs to the decode grid"),
    (("--kernel", "backward", "--heads", "32/8"), "--heads belongs to the decode grid"),
    (("--kernel", "backward", "--seqlens-k", "4096"), "--seqlens-k belongs to the decode"),
    (("--kernel", "decode", "--seqlens", "1024"), "--seqlens belongs to the forward grid"),
    (("--kernel", "decode", "--causal", "yes"), "the backward grid takes it too"),
    (("--kernel", "backward", "--contenders", "eager"), "--contenders"),
    (("--kernel", "backward", "--interleave", "-1"), "--interleave"),
    (("--kernel", "attention"), None),
], ids=lambda x: "-".join(x) if isinstance(x, tuple) else None)
def test_run_refuses_other_grids_options_with_exit_2(argv, words, capsys):
    if words is None:  # argparse refuses an unknown kernel itself
        with pytest.raises(SystemExit) as info:
            _args(*argv)
        assert info.value.code == 2
        assert "forward, decode, backward" in capsys.readouterr().err
        return
    assert bench_cmd.run(_args(*argv)) == 2
    err = _squash(capsys.readouterr().err)
    assert "error" in err and words in err, err


def test_backward_interleaves_by_default_and_takes_the_forward_grids_options():
    assert bench_cmd.settings_from_args(_args("--kernel", "backward")).interleave == 30
    assert bench_cmd.settings_from_args(_args("--kernel", "backward", "--quick")).interleave == 10
    assert bench_cmd.settings_from_args(
        _args("--kernel", "backward", "--interleave", "0")).interleave == 0
    assert bench_cmd.settings_from_args(_args()).interleave == 0  # forward: unchanged
    grid = bench_cmd.grid_from_args(_args("--kernel", "backward", "--no-matmul"))
    assert grid.kernel == "backward"


def test_backward_run_without_a_gpu_gets_past_the_flags(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert bench_cmd.run(_args("--kernel", "backward", "--quick")) == 2  # an environment condition
    assert "no CUDA device" in _squash(capsys.readouterr().err)


# -- reports

_ENV = dict(device="NVIDIA H100 80GB HBM3", arch="sm_90", driver="580.1",
            torch_version="2.11.0", cuda_tile_version="1.7.0")


def _phase_flops(point) -> dict[str, float]:
    return {"backward": BACKWARD.flops(point), "forward+backward": 3.5 * point.flops}


def _fields(point) -> dict:
    """The committed study's rows: H_kv and S_q left empty (self-attention)."""
    return dict(result_fields(point), heads_kv=None, seqlen_q=None)


def _row(name, point, phase, ms=None, *, status="ok", reason="", **extra):
    ok = status == "ok"
    flops = _phase_flops(point)[phase] if ok else None
    return BenchResult(contender=name, status=status, reason=reason, phase=phase,
                       median_ms=ms, spread_ms=0.0 if ok else None, samples=30 if ok else None,
                       tflops=flops / (ms * 1e-3) / 1e12 if ok else None,
                       rel_err=5e-3 if ok else None, kernel="backward", **_fields(point),
                       **_ENV, **extra)


def _synthetic():
    """Three points (both phases alike unless said). P1: ours 1.0 ms, flash 1.5, cuDNN 1.2,
    efficient 3.0. P2: ours 2.0, flash 3.0, cuDNN unavailable, efficient 4.0. P3: ours 4.0,
    flash unavailable, cuDNN 3.0; fwd+bwd of ours wrong. The default is skipped everywhere."""
    p1, p2, p3 = build_backward_grid().problems[:3]  # bf16 D=64 full, S 1k, 4k, 16k
    times = [(p1, {"tiledattention": 1.0, "torch-flash": 1.5, "torch-cudnn": 1.2,
                   "torch-efficient": 3.0}),
             (p2, {"tiledattention": 2.0, "torch-flash": 3.0, "torch-cudnn": None,
                   "torch-efficient": 4.0}),
             (p3, {"tiledattention": 4.0, "torch-flash": None, "torch-cudnn": 3.0,
                   "torch-efficient": 8.0})]
    rows = []
    for point, per in times:
        for name in CONTENDERS:
            for phase in PHASES:
                if name == "tiledattention-default":
                    rows.append(_row(name, point, phase, status="skipped",
                                     reason="same schedule as tiledattention"))
                elif per[name] is None:
                    rows.append(_row(name, point, phase, status="unavailable",
                                     reason=f"RuntimeError: no {name} kernel"))
                elif point is p3 and name == "tiledattention" and phase != "backward":
                    rows.append(_row(name, point, phase, status="wrong",
                                     reason="err=0.5 > 0.02"))
                else:
                    scale = 1.0 if phase == "backward" else 1.5
                    extra = dict(schedule="dkdv 64x64 occ2 | dq 128x64 occ2",
                                 lookup_source="default") if name == "tiledattention" else {}
                    rows.append(_row(name, point, phase, per[name] * scale, **extra))
    return rows, (p1, p2, p3)


def test_geomeans_take_only_the_points_where_both_ran():
    rows, _ = _synthetic()
    text = render_markdown(rows, RunInfo(command="x", date="d"))
    geo = text.split("## Geometric mean speed-up")[1].split("\n## ")[0]
    # flash: P3 left out (1.5, 1.5); cuDNN: P2 left out (1.2, 0.75); efficient: 3, 2, 2
    assert "| tiledattention | backward | 1.50 | 2 | 0.95 | 2 | 2.29 | 3 |" in geo
    # the step: P3's is wrong, P2 has no cuDNN: only P1 (1.2)
    assert "| tiledattention | forward+backward | 1.50 | 2 | 1.20 | 1 |" in geo
    assert "| tiledattention-default | backward | — | 0 | — | 0 | — | 0 |" in geo
    shapes = text.split("by head dim and mask (over dtypes and S)")[1].split("\n## ")[0]
    assert "| D | mask | ÷ flash | ÷ cuDNN | ÷ efficient |" in shapes
    assert "| 64 | full | 1.50 | 0.95 | 2.29 |" in shapes


def test_rows_of_the_backward_family_render_with_their_one_phase():
    rows = [r for r in _synthetic()[0] if r.phase == "backward"
            and r.contender != "torch-efficient"]
    text = render_markdown(rows, RunInfo(command="x", date="d"))
    head = next(line for line in text.splitlines() if line.startswith("| point |"))
    assert head == ("| point | contender | bwd ms | bwd TFLOP/s | bwd ÷ flash | bwd ÷ cuDNN |")
    assert "forward+backward" not in text and "## Target" in text
    assert "| tiledattention | backward | 1.50 | 2 | 0.95 | 2 |" in text


def _cells(text: str, label: str, contender: str) -> list[str]:
    block = text.split("## Per point")[1].split("\n## ")[0]
    current = None
    for line in block.splitlines():
        if not line.startswith("| ") or line.startswith("| point"):
            continue
        row = [c.strip() for c in line.split("|")[1:-1]]
        current = row[0] or current
        if current == label and row[1] == contender:
            return row[2:]
    raise AssertionError(f"no row for {label} {contender}")


def test_backward_summary_content():
    rows, (p1, p2, p3) = _synthetic()
    info = RunInfo(command="tiledtune bench --kernel backward", date="2026-11-23",
                   matmul_tflops=(700.0, 710.0))
    text = render_markdown(rows, info)
    assert text.startswith("# tiledattention backward benchmark")
    assert "NVIDIA H100 80GB HBM3 (sm_90)" in text and "700.0 / 710.0 TFLOP/s" in text
    target = text.split("## Target")[1].split("\n## ")[0]
    assert "over the 2 points where both ran: **1.50** (issue 17 asks for at least 1.2: met)" \
        in _squash(target)
    assert "÷ `torch-cudnn`: 0.95 over 2 points" in _squash(target)
    assert "fp16" not in target and "bf16 D64 full S16384 B1 H32 (torch-flash: unavailable)" \
        in _squash(target)
    label = "bf16 D64 full S1024 B16 H32"
    tflops = _phase_flops(p1)
    assert _cells(text, label, "tiledattention") == [
        "1.000", f"{tflops['backward'] / 1e9:.0f}", "1.50", "1.20",
        "1.500", f"{tflops['forward+backward'] / 1.5e9:.0f}", "1.50", "1.20"]
    assert _cells(text, label, "tiledattention-default") == ["skipped"] + ["—"] * 3 + \
        ["skipped"] + ["—"] * 3
    p3_label = "bf16 D64 full S16384 B1 H32"
    assert _cells(text, p3_label, "tiledattention")[4:] == ["wrong", "—", "—", "—"]
    assert _cells(text, p3_label, "torch-flash")[0] == "unavailable"
    geo = text.split("## Geometric mean speed-up")[1].split("\n## ")[0]
    assert "| tiledattention | backward | 1.50 | 2 | 0.95 | 2 | 2.29 | 3 |" in geo
    assert "| tiledattention-default | backward | — | 0 | — | 0 | — | 0 |" in geo
    left = text.split("## Left out of the means")[1].split("\n## ")[0]
    assert "- tiledattention backward ÷ torch-cudnn: 1 point(s): bf16 D64 full S4096 B4 H32 " \
           "(torch-cudnn: unavailable)" in left
    assert "- tiledattention-default backward: no point where it and a baseline both ran" \
        in left
    assert "- tiledattention forward+backward ÷ torch-cudnn: 2 point(s): bf16 D64 full S4096 " \
           "B4 H32 (torch-cudnn: unavailable); bf16 D64 full S16384 B1 H32 (tiledattention: " \
           "wrong)" in left
    notes = _squash(text.split("## Notes")[1])
    assert "tiledattention-default, both phases, skipped: same schedule as tiledattention — " \
           f"at {label}, bf16 D64 full S4096 B4 H32, {p3_label}" in notes
    assert f"tiledattention, forward+backward, wrong: err=0.5 > 0.02 — at {p3_label}" in notes
    assert f"- {label}, tiledattention: dkdv 64x64 occ2 | dq 128x64 occ2 (default)" in text


def test_backward_csv_round_trip_and_report_only(tmp_path, capsys):
    rows, _ = _synthetic()
    path = write_csv(rows, tmp_path / "bench.csv")
    assert load_results(path) == rows
    assert "phase" in path.read_text().splitlines()[0].split(",")
    (tmp_path / "run.json").write_text(json.dumps({"command": "x", "date": "d",
                                                   "matmul_tflops": [650.0]}))
    out = tmp_path / "again"
    assert bench_cmd.run(_args("--report-only", str(path), "--out", str(out))) == 0
    summary = (out / "summary.md").read_text()
    assert "backward benchmark" in summary and "re-rendered from" in summary
    assert "650.0 TFLOP/s" in summary
    if _has_matplotlib():
        for name in ("backward_tflops.png", "backward_speedup.png"):
            assert (out / name).stat().st_size < MAX_PNG_BYTES
    out = _squash(capsys.readouterr().out)  # results on stdout
    assert "tiledtune bench --kernel backward" in out and "Geometric mean speed-up" in out


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def test_backward_plots_are_small_pngs_for_the_whole_grid(tmp_path):
    pytest.importorskip("matplotlib")
    rows = []
    for point in build_backward_grid().problems:
        for i, name in enumerate(CONTENDERS):
            for phase in PHASES:
                rows.append(_row(name, point, phase, 1.0 + 0.1 * i))
    written, messages = write_plots(rows, tmp_path)
    assert [p.name for p in written] == ["backward_tflops.png", "backward_speedup.png"]
    assert messages == []
    for p in written:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < MAX_PNG_BYTES
    only_torch = [r for r in rows if r.contender.startswith("torch")]
    written, messages = write_plots(only_torch, tmp_path / "torch")
    assert [p.name for p in written] == ["backward_tflops.png"]
    assert messages == ["no backward_speedup.png: torch-flash and torch-cudnn and "
                        "flash-attn-4 and tiledattention never both ran"]


def test_backward_points_name_grouped_heads_and_unequal_lengths():
    from tuner.bench._report import LAYOUTS
    from tuner.bench._results import BenchResult

    label = LAYOUTS["backward"].label
    fields = dict(kernel="backward", phase="backward", contender="tiledattention",
                  status="skipped", dtype="bf16", batch=2, heads=16, seqlen=3000, head_dim=128,
                  causal=True)
    gqa = BenchResult(**fields, heads_kv=4, seqlen_q=1000, bottom_right=True)
    mha = BenchResult(**fields, heads_kv=16, seqlen_q=3000)
    assert label(gqa) == "bf16 D128 causal-br S1000x3000 B2 H16/4"
    assert label(mha) == "bf16 D128 causal S3000 B2 H16"
