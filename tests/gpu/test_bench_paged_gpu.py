"""``tiledtune bench --kernel decode --preset paged`` on a GPU: the preset over one small paged
point end to end (each contender checked against the paged case's float32 reference, timed
interleaved, the copy rate, CSV, run.json, summary, plots), and a shipped bucket's lookup and
contenders measured directly."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

import tiledattention
from tuner import bench
from tuner.bench import PAGED_CONTENDERS, PAGED_POINTS, PAGED_PRESETS, load_results
from tuner.bench._paged import varlen_paged_support
from tuner.commands import bench_cmd

pytestmark = pytest.mark.gpu

#: 8 caches of 4096, 3072, 2048 and 1024 keys (twice) in pages of 64: the bucket B8 L4096
TINY = dict(batch=8, longest=4096, page_size=64, heads_q=32, heads_kv=8, head_dim=128)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def tiny_preset(monkeypatch):
    """``--kernel decode --preset paged`` over the one small point :data:`TINY`."""
    monkeypatch.setitem(PAGED_POINTS, "tiny", TINY)
    preset = dataclasses.replace(PAGED_PRESETS["decode"], defaults=(
        dict(points=("tiny",), dtypes=("bf16",)),) * 2)
    monkeypatch.setitem(PAGED_PRESETS, "decode", preset)


def test_paged_preset_end_to_end(tmp_path, tiny_preset):
    out = tmp_path / "bench"
    code = bench_cmd.run(_args("--kernel", "decode", "--preset", "paged", "--interleave", "5",
                               "--out", str(out)))
    results = load_results(out / "bench.csv")
    assert [r.contender for r in results] == ["tiledattention", "tiledattention-default",
                                              *PAGED_CONTENDERS, "flash-attn-4"]
    problem = tiledattention.Problem(batch=8, heads_q=32, heads_kv=8, seqlen_q=1,
                                     seqlen_k=4096, head_dim=128, dtype="bf16", causal=True,
                                     bottom_right=True, ragged=True, page_size=64)
    keys = 2 * (4096 + 3072 + 2048 + 1024)
    assert bench.problem_bytes(problem) == keys * 8 * 128 * 2 * 2  # the valid K/V bytes
    by = {}
    for r in results:
        assert r.page_size == 64 and r.ragged
        assert (r.kernel, r.batch, r.heads, r.heads_kv, r.seqlen_q, r.seqlen, r.head_dim) == \
            ("decode", 8, 32, 8, 1, 4096, 128)
        assert r.device and r.arch.startswith("sm_")
        assert r.status != "wrong", r.note
        if r.status == "ok":
            assert r.samples == 5 and r.median_ms > 0
            assert r.gbps == pytest.approx(keys * 8 * 128 * 2 * 2 / (r.median_ms * 1e-3) / 1e9)
            assert r.tflops == pytest.approx(4 * 32 * 128 * keys / (r.median_ms * 1e-3) / 1e12)
            assert r.rel_err is not None and r.rel_err <= tiledattention.DECODE.tolerance(problem)
        else:
            assert r.reason, r  # every row that did not run says why
        by[r.contender] = r
    ours = by["tiledattention"]
    assert ours.status == "ok" and ours.schedule and ours.lookup_source, ours.note
    assert by["tiledattention-default"].status in ("ok", "skipped")
    assert by["cudnn-padded-cache"].status in ("ok", "unavailable"), by["cudnn-padded-cache"].note
    if varlen_paged_support():
        assert by["torch-varlen-paged"].status == "skipped"
    else:
        assert by["torch-varlen-paged"].status in ("ok", "unavailable")
    copy = json.loads((out / "run.json").read_text())["copy_gbps"]
    assert len(copy) == 2 and all(500 < x < 20_000 for x in copy), copy
    assert ours.gbps < 1.5 * max(copy)  # ~84 MB of keys cannot beat a 1 GiB copy by much
    summary = (out / "summary.md").read_text()
    assert "# tiledattention decode benchmark: paged K/V cache" in summary
    assert "bf16 D128 H32/8 B8 L4096 page64 (20480 keys)" in summary
    assert "## Share of the copy bandwidth" in summary
    for name in ("paged_copy_share.png", "paged_speedup_bf16.png"):
        assert (out / name).stat().st_size < bench.MAX_PNG_BYTES
    assert code == 0


def test_shipped_bucket_is_looked_up_and_every_contender_checked():
    grid = bench.build_grid("decode", preset="paged")
    problem = grid.problems[0]  # B16, caches up to 32k, pages of 64
    assert (problem.batch, problem.seqlen_k, problem.page_size) == (16, 32768, 64)
    arch = tiledattention.device_info(0).arch
    results = bench.measure_point(grid.preset, problem, grid.contenders_at(problem),
                                  bench.BenchSettings(interleave=3), env={"arch": arch})
    by = {r.contender: r for r in results}
    ours = by["tiledattention"]
    assert ours.status == "ok", ours.note
    if arch == "sm_90":  # the shipped table's row answers its own bucket
        assert ours.lookup_source == "shipped", (ours.lookup_source, ours.lookup_detail)
    for r in results:
        assert r.status != "wrong", r.note
        assert r.page_size == 64 and r.phase == ""
        if r.status == "ok":
            assert r.gbps == pytest.approx(327680 * 8 * 128 * 2 * 2 / (r.median_ms * 1e-3)
                                           / 1e9)
