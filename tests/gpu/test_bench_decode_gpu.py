"""``tiledtune bench --kernel decode`` on a GPU: one point end to end (check, interleaved
timing, copy rate, CSV, run.json, summary, plot), and a bottom-right point's contenders."""

from __future__ import annotations

import argparse
import json

import pytest

import tiledattention
from tuner import bench
from tuner.bench import PRESETS, load_results
from tuner.commands import bench_cmd

pytestmark = pytest.mark.gpu

_OURS = ("tiledattention", "tiledattention-default", "tiledattention-forward")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def test_tiny_decode_bench_end_to_end(tmp_path):
    out = tmp_path / "bench"
    code = bench_cmd.run(_args("--kernel", "decode", "--batch", "1", "--seqlens-q", "1",
                               "--seqlens-k", "30000", "--masks", "none", "--quick",
                               "--interleave", "5", "--out", str(out)))
    results = load_results(out / "bench.csv")
    assert [r.contender for r in results] == list(PRESETS["decode"].contenders)
    for r in results:
        assert (r.kernel, r.batch, r.heads, r.heads_kv, r.seqlen_q, r.seqlen, r.head_dim) == \
            ("decode", 1, 32, 8, 1, 30000, 128)
        assert r.device and r.arch.startswith("sm_")
        if r.status == "ok":
            assert r.samples == 5 and r.median_ms > 0 and r.gbps > 0 and r.tflops > 0
        else:
            assert r.reason, r  # every row that did not run says why
    by = {r.contender: r for r in results}
    assert by["tiledattention"].status == "ok", by["tiledattention"].note
    assert by["tiledattention-forward"].status == "ok", by["tiledattention-forward"].note
    # an empty database: the lookup answers with the default, which is then timed once
    assert by["tiledattention-default"].status in ("ok", "skipped")
    assert by["torch-flash"].status == "ok", by["torch-flash"].note  # GQA decode: flash runs
    copy = json.loads((out / "run.json").read_text())["copy_gbps"]
    assert len(copy) == 2 and all(500 < x < 20_000 for x in copy), copy
    # a kernel reading ~123 MB cannot beat a 1 GiB copy by much
    assert by["tiledattention"].gbps < 1.5 * max(copy)
    summary = (out / "summary.md").read_text()
    assert "## Per point" in summary and "B1 H32/8 S_q1 S_k30000 D128 bf16 none" in summary
    assert (out / "decode_copy_share.png").stat().st_size < bench.MAX_PNG_BYTES
    assert code == 0


def test_bottom_right_point_checks_every_contender():
    problem = tiledattention.Problem(batch=2, heads_q=32, heads_kv=8, seqlen_q=16,
                                     seqlen_k=2000, head_dim=128, dtype="bf16", causal=True,
                                     bottom_right=True)
    preset = PRESETS["decode"]
    results = bench.measure_point(preset, problem, preset.contenders,
                                  bench.BenchSettings(interleave=3),
                                  env={"arch": tiledattention.device_info(0).arch})
    by = {r.contender: r for r in results}
    for name in ("tiledattention", "tiledattention-forward"):
        assert by[name].status == "ok", by[name].note
    # torch runs causal_lower_right on flash (and efficient) only; cuDNN says why it cannot
    assert by["torch-flash"].status == "ok", by["torch-flash"].note
    assert by["torch-cudnn"].status in ("ok", "unavailable")
    assert all(r.status != "wrong" for r in results), [r.note for r in results]
