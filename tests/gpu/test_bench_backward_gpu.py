"""``tiledtune bench --kernel backward`` on a GPU: a tiny grid end to end (checks against the
backward case's float32 reference gradients, interleaved timing, CSV, run.json, summary,
plots), and one odd-length point measured directly."""

from __future__ import annotations

import argparse
import json

import pytest

import tiledattention
from tiledattention import BACKWARD
from tuner import bench
from tuner.bench import PRESETS, load_results
from tuner.commands import bench_cmd

pytestmark = pytest.mark.gpu


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def test_tiny_backward_bench_end_to_end(tmp_path):
    out = tmp_path / "bench"
    code = bench_cmd.run(_args("--kernel", "backward", "--tokens", "2048", "--hidden", "256",
                               "--head-dims", "64", "--seqlens", "256,1024", "--dtypes", "bf16",
                               "--causal", "no,yes", "--interleave", "3", "--no-matmul",
                               "--out", str(out)))
    results = load_results(out / "bench.csv")
    assert len(results) == 4 * len(PRESETS["backward"].contenders)
    by = {}
    for r in results:
        assert (r.kernel, r.phase, r.head_dim, r.dtype, r.batch * r.seqlen, r.heads) == \
            ("backward", "backward", 64, "bf16", 2048, 4)
        assert r.device and r.arch.startswith("sm_")
        if r.status == "ok":
            problem = tiledattention.Problem(
                batch=r.batch, heads_q=r.heads, heads_kv=r.heads, seqlen_q=r.seqlen,
                seqlen_k=r.seqlen, head_dim=r.head_dim, dtype=r.dtype, causal=r.causal)
            assert r.samples == 3 and r.median_ms > 0
            assert r.tflops == pytest.approx(BACKWARD.flops(problem) / (r.median_ms * 1e-3)
                                             / 1e12)
            if r.contender.startswith("tiledattention"):
                assert r.rel_err <= BACKWARD.tolerance(problem)
        else:
            assert r.reason, r  # every row that did not run says why
        by[(r.seqlen, r.causal, r.contender)] = r
    for s in (256, 1024):
        for causal in (False, True):
            ours = by[(s, causal, "tiledattention")]
            assert ours.status == "ok" and ours.schedule and ours.lookup_source, ours.note
            # an empty database: the lookup answers with the default, timed once
            assert by[(s, causal, "tiledattention-default")].status in ("skipped", "ok")
            assert by[(s, causal, "torch-flash")].status == "ok"
    assert json.loads((out / "run.json").read_text())["matmul_tflops"] == []
    summary = (out / "summary.md").read_text()
    assert "# tiledattention backward benchmark" in summary
    assert "## Target" in summary and "## Per point" in summary
    assert "bf16 D64 causal S1024 B2 H4" in summary
    for name in ("backward_tflops.png", "backward_speedup.png"):
        assert (out / name).stat().st_size < bench.MAX_PNG_BYTES
    assert code == 0


def test_an_odd_length_point_checks_every_contender():
    problem = tiledattention.Problem(batch=2, heads_q=8, heads_kv=8, seqlen_q=1000,
                                     seqlen_k=1000, head_dim=128, dtype="fp16", causal=True)
    preset = PRESETS["backward"]
    results = bench.measure_point(preset, problem, preset.contenders,
                                  bench.BenchSettings(interleave=3),
                                  env={"arch": tiledattention.device_info(0).arch})
    by = {r.contender: r for r in results}
    assert by["tiledattention"].status == "ok", by["tiledattention"].note
    assert by["torch-flash"].status == "ok", by["torch-flash"].note
    assert by["torch-cudnn"].status in ("ok", "unavailable")
    assert all(r.status != "wrong" for r in results), [r.note for r in results]
