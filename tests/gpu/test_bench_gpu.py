"""``tiledtune bench`` on a GPU: a tiny grid end to end, and the accuracy gate with poisoning."""

from __future__ import annotations

import argparse

import pytest

from tuner import bench
from tuner.bench import BenchPoint, load_results
from tuner.commands import bench_cmd

pytestmark = pytest.mark.gpu


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiledtune bench")
    bench_cmd.configure(parser)
    return parser.parse_args(list(argv))


def test_tiny_bench_end_to_end(tmp_path):
    out = tmp_path / "bench"
    code = bench_cmd.run(_args("--tokens", "2048", "--hidden", "512", "--head-dims", "64,128",
                           "--seqlens", "256,1024", "--dtypes", "bf16,fp16", "--causal",
                           "yes,no", "--quick", "--out", str(out)))
    results = load_results(out / "bench.csv")
    assert len(results) == 2 * 2 * 2 * 2 * len(bench.make_contenders())
    by = {(r.contender, r.dtype, r.head_dim, r.causal, r.seqlen): r for r in results}
    for r in results:
        assert r.batch * r.seqlen == 2048 and r.heads * r.head_dim == 512
        assert r.device and r.arch.startswith("sm_")
        if r.status == "ok":
            assert r.tflops > 0 and r.median_ms > 0 and r.samples >= 5
            assert r.rel_err <= bench.TOLERANCES[r.dtype]
    # the math backend and eager run everywhere at these sizes
    for name in ("torch-math", "eager", "torch-auto"):
        assert all(by[(name, dt, d, c, s)].status == "ok"
                   for dt in ("bf16", "fp16") for d in (64, 128) for c in (True, False)
                   for s in (256, 1024)), name
    ta = [r for r in results if r.contender == "tiledattention"]
    assert all(r.status != "wrong" for r in ta), [r.note for r in ta if r.status == "wrong"]
    assert all(r.schedule for r in ta if r.status == "ok")
    assert code == 0
    assert (out / "summary.md").exists()


def test_poisoned_output_is_caught():
    import torch

    def uninitialised(q, k, v, point, arch):  # a "kernel" that never writes its output
        return bench.Prepared(lambda: torch.empty_like(q))

    point = BenchPoint(batch=2, heads=4, seqlen=512, head_dim=64, dtype="bf16", causal=True)
    results = bench.measure_point(
        point, [bench.make_contenders()["torch-math"], bench.Contender("lazy", uninitialised)],
        bench.BenchSettings(max_seconds=0.2), env={})
    assert results[0].status == "ok", results[0].note
    assert results[1].status == "wrong", results[1].note
