"""``tiledtune bench --kernel backward`` on a GPU: a tiny grid end to end (checks of both
phases against the float32 reference gradients, interleaved timing, CSV, run.json, summary,
plots), and one odd-length point measured directly."""

from __future__ import annotations

import argparse
import json

import pytest

import tiledattention
from tuner import bench
from tuner.bench import BACKWARD_CONTENDERS, BACKWARD_PHASES, load_results
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
    assert len(results) == 4 * len(BACKWARD_CONTENDERS) * len(BACKWARD_PHASES)
    by = {}
    for r in results:
        assert (r.kernel, r.head_dim, r.dtype, r.batch * r.seqlen, r.heads) == \
            ("backward", 64, "bf16", 2048, 4)
        assert r.phase in BACKWARD_PHASES and r.device and r.arch.startswith("sm_")
        if r.status == "ok":
            problem = tiledattention.Problem(
                batch=r.batch, heads_q=r.heads, heads_kv=r.heads, seqlen_q=r.seqlen,
                seqlen_k=r.seqlen, head_dim=r.head_dim, dtype=r.dtype, causal=r.causal)
            flops = bench.phase_flops(problem)[r.phase]
            assert r.samples == 3 and r.median_ms > 0
            assert r.tflops == pytest.approx(flops / (r.median_ms * 1e-3) / 1e12)
            assert r.rel_err <= tiledattention.BACKWARD.tolerance(problem)
        else:
            assert r.reason, r  # every row that did not run says why
        by[(r.seqlen, r.causal, r.contender, r.phase)] = r
    for s in (256, 1024):
        for causal in (False, True):
            for phase in BACKWARD_PHASES:
                ours = by[(s, causal, "tiledattention", phase)]
                assert ours.status == "ok", ours.note
                assert ours.schedule and ours.lookup_source
                default = by[(s, causal, "tiledattention-default", phase)]
                # an empty database: the lookup answers with the default, timed once
                assert default.status in ("skipped", "ok"), default.note
                flash = by[(s, causal, "torch-flash", phase)]
                assert flash.status == "ok", flash.note
    assert json.loads((out / "run.json").read_text())["matmul_tflops"] == []
    summary = (out / "summary.md").read_text()
    assert "# tiledattention backward benchmark" in summary
    assert "## Target" in summary and "## Per point" in summary
    assert "bf16 D64 causal S1024 B2 H4" in summary
    for name in ("backward_tflops.png", "backward_speedup.png"):
        assert (out / name).stat().st_size < bench.MAX_PNG_BYTES
    assert code == 0


def test_an_odd_length_point_checks_every_contender():
    point = bench.BackwardPoint(batch=2, heads=8, seqlen=1000, head_dim=128, dtype="fp16",
                                causal=True)
    table = bench.make_backward_contenders()
    results = bench.measure_backward_point(point, [table[n] for n in BACKWARD_CONTENDERS],
                                           bench.BenchSettings(interleave=3),
                                           env={"arch": tiledattention.device_info(0).arch})
    assert len(results) == 2 * len(BACKWARD_CONTENDERS)
    by = {(r.contender, r.phase): r for r in results}
    for phase in BACKWARD_PHASES:
        assert by[("tiledattention", phase)].status == "ok", by[("tiledattention", phase)].note
        assert by[("torch-flash", phase)].status == "ok", by[("torch-flash", phase)].note
        assert by[("torch-cudnn", phase)].status in ("ok", "unavailable")
    assert all(r.status != "wrong" for r in results), [r.note for r in results]
