"""``tiledtune bench`` on a GPU: a tiny grid end to end, and the accuracy gate with poisoning."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

import tiledattention
from tiledattention import FORWARD
from tuner import bench
from tuner.bench import CONTENDERS, load_results
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
    assert len(results) == 2 * 2 * 2 * 2 * len(CONTENDERS)
    for r in results:
        assert r.kernel == "forward" and r.batch * r.seqlen == 2048
        assert r.heads * r.head_dim == 512 and r.device and r.arch.startswith("sm_")
        if r.status == "ok":
            assert r.tflops > 0 and r.median_ms > 0 and r.samples >= 5
        if r.status == "ok" and r.contender.startswith("tiledattention"):
            problem = tiledattention.Problem(
                batch=r.batch, heads_q=r.heads, heads_kv=r.heads, seqlen_q=r.seqlen,
                seqlen_k=r.seqlen, head_dim=r.head_dim, dtype=r.dtype, causal=r.causal)
            assert r.rel_err <= FORWARD.tolerance(problem)
        elif r.status != "ok":
            assert r.reason, r  # every row that did not run says why
    ours = [r for r in results if r.contender == "tiledattention"]
    assert all(r.status == "ok" and r.schedule for r in ours), [r.note for r in ours]
    assert all(r.status == "ok" for r in results if r.contender == "torch-flash")
    assert code == 0
    assert (out / "summary.md").exists() and (out / "tflops_bf16.png").exists()


class _LazyForward(type(FORWARD)):
    """The forward family, but its launches never write the output."""

    name = "lazyforward"

    def case(self, problem, device_index):
        case = super().case(problem, device_index)
        case.launcher = lambda schedule: (lambda: None)
        return case


def test_poisoned_output_is_caught():
    family = tiledattention.register_family(_LazyForward())
    try:
        preset = dataclasses.replace(bench.PRESETS["forward"], also=("lazyforward",),
                                     order=CONTENDERS + ("tiledattention-lazyforward",))
        problem = tiledattention.Problem(batch=2, heads_q=4, heads_kv=4, seqlen_q=512,
                                         seqlen_k=512, head_dim=64, dtype="bf16", causal=True)
        results = bench.measure_point(
            preset, problem, ("tiledattention", "tiledattention-lazyforward"),
            bench.BenchSettings(max_seconds=0.2), env={"arch": tiledattention.device_info(0).arch})
    finally:
        tiledattention.unregister_family(family.name)
    assert results[0].status == "ok", results[0].note
    assert results[1].status == "wrong" and "nan" in results[1].reason, results[1].note
