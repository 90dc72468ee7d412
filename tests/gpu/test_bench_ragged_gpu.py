"""``tiledtune bench --preset ragged`` on a GPU: the preset over one small ragged point end to
end (each contender checked against the ragged case's float32 reference, timed, CSV, run.json,
summary, plots), and the backward's contenders at one small point measured directly."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

import tiledattention
from tiledattention import BACKWARD, FORWARD
from tuner import bench
from tuner.bench import RAGGED_CONTENDERS, RAGGED_POINTS, RAGGED_PRESETS, load_results
from tuner.commands import bench_cmd

pytestmark = pytest.mark.gpu

#: 8 packed sequences of 512, 384, 256 and 128 queries (the bucket B8 S512 of 4096 tokens)
TINY = dict(tokens=4096, longest=512, heads_q=8, heads_kv=2, head_dim=64)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def tiny_preset(monkeypatch):
    """``--preset ragged --kernel forward`` over the one small point :data:`TINY`."""
    monkeypatch.setitem(RAGGED_POINTS, "tiny", TINY)
    preset = dataclasses.replace(RAGGED_PRESETS["forward"], defaults=(
        dict(points=("tiny",), dtypes=("bf16",)),) * 2)
    monkeypatch.setitem(RAGGED_PRESETS, "forward", preset)


def _torch_varlen_expected() -> bool:
    """Whether the installed torch has ``varlen_attn`` (2.11 on; it then runs every point)."""
    import importlib.util

    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def test_ragged_preset_end_to_end(tmp_path, tiny_preset):
    out = tmp_path / "bench"
    code = bench_cmd.run(_args("--preset", "ragged", "--interleave", "3", "--no-matmul",
                               "--out", str(out)))
    results = load_results(out / "bench.csv")
    assert [r.contender for r in results] == ["tiledattention", "tiledattention-default",
                                              *RAGGED_CONTENDERS, "flash-attn-4"]
    problem = tiledattention.Problem(batch=8, heads_q=8, heads_kv=2, seqlen_q=512,
                                     seqlen_k=512, head_dim=64, dtype="bf16", causal=True,
                                     bottom_right=True, ragged=True)
    pairs = 2 * sum(n * (n + 1) // 2 for n in (512, 384, 256, 128))
    assert FORWARD.flops(problem) == 4 * 8 * 64 * pairs  # the valid tokens' causal work
    by = {}
    for r in results:
        assert r.ragged and (r.kernel, r.batch, r.heads, r.heads_kv, r.seqlen_q, r.head_dim) == \
            ("forward", 8, 8, 2, 512, 64)
        assert r.device and r.arch.startswith("sm_")
        if r.status == "ok":
            assert r.samples == 3 and r.median_ms > 0
            assert r.tflops == pytest.approx(FORWARD.flops(problem) / (r.median_ms * 1e-3)
                                             / 1e12)
            assert r.gbps == pytest.approx(bench.problem_bytes(problem)
                                           / (r.median_ms * 1e-3) / 1e9)
            assert r.rel_err is not None and r.rel_err <= FORWARD.tolerance(problem)
        else:
            assert r.reason, r  # every row that did not run says why
        by[r.contender] = r
    ours = by["tiledattention"]
    assert ours.status == "ok" and ours.schedule and ours.lookup_source, ours.note
    assert by["tiledattention-default"].status in ("ok", "skipped")
    assert by["efficient-padded"].status == "ok", by["efficient-padded"].note
    assert by["cudnn-padded"].status in ("ok", "unavailable"), by["cudnn-padded"].note
    if _torch_varlen_expected():
        assert by["torch-varlen"].status == "ok", by["torch-varlen"].note
    else:
        assert by["torch-varlen"].status == "skipped"
    assert json.loads((out / "run.json").read_text())["matmul_tflops"] == []
    summary = (out / "summary.md").read_text()
    assert "# tiledattention benchmark: ragged batches" in summary
    assert "bf16 D64 causal-br H8/2 L512 B8 (2560 tokens)" in summary
    for name in ("ragged_tflops_bf16.png", "ragged_speedup_bf16.png"):
        assert (out / name).stat().st_size < bench.MAX_PNG_BYTES
    assert code == 0


def test_ragged_backward_point_checks_every_contender():
    problem = tiledattention.Problem(batch=8, heads_q=8, heads_kv=2, seqlen_q=512,
                                     seqlen_k=512, head_dim=64, dtype="bf16", causal=True,
                                     ragged=True)
    preset = RAGGED_PRESETS["backward"]
    grid = bench.build_grid("backward", preset="ragged")
    results = bench.measure_point(preset, problem, grid.contenders_at(problem),
                                  bench.BenchSettings(interleave=3),
                                  env={"arch": tiledattention.device_info(0).arch})
    by = {r.contender: r for r in results}
    assert by["tiledattention"].status == "ok", by["tiledattention"].note
    assert by["efficient-padded"].status == "ok", by["efficient-padded"].note
    if _torch_varlen_expected():
        assert by["torch-varlen"].status == "ok", by["torch-varlen"].note
    for r in results:
        assert r.status != "wrong", r.note
        assert r.phase == "backward" and r.ragged
        if r.status == "ok":
            assert r.tflops == pytest.approx(BACKWARD.flops(problem) / (r.median_ms * 1e-3)
                                             / 1e12)
            assert r.rel_err <= BACKWARD.tolerance(problem)
