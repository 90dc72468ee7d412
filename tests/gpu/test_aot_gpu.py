"""Shipped cubins on the GPU: a fresh process with compiling switched off
(``TILEDATTENTION_JIT=0``) and no ``tileiras`` on ``PATH`` runs prefill, decode, the backward,
a CUDA-graph replay and a packed batch (its work table and clears too) and its backward (the
prologue of work tables and clears too) from a bundle, and gives this process's JIT-compiled
results bit for bit. (A process of its own: cuTile keeps each kernel it loaded for a launch signature, so in
one process a signature the JIT compiled first would never reach the bundle.)"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tiledattention  # noqa: E402
from tiledattention import Problem  # noqa: E402
from tiledattention.tooling import ragged_problem  # noqa: E402
from tiledattention.core import _aot, _bundles  # noqa: E402
from tuner.aot import build_bundles, jobs_for  # noqa: E402

pytestmark = pytest.mark.gpu

PREFILL = Problem(batch=2, heads_q=16, heads_kv=4, seqlen_q=777, seqlen_k=777, head_dim=128,
                  dtype="bf16", causal=True)
DECODE = Problem(batch=3, heads_q=16, heads_kv=4, seqlen_q=1, seqlen_k=2049, head_dim=128,
                 dtype="bf16", causal=False)
#: a packed batch of five sequences (varlen_attn): its forward, work table and clears
LENGTHS = (300, 17, 1024, 555, 90)
RAGGED = ragged_problem(sequences=len(LENGTHS), tokens_q=sum(LENGTHS), longest_q=max(LENGTHS),
                        longest_k=max(LENGTHS), heads_q=16, heads_kv=4, head_dim=128,
                        dtype="bf16", causal=True, bottom_right=True)
#: (name, problem, training) of the calls both processes make; batch 1 takes the other images
CALLS = [("prefill", PREFILL, False), ("prefill-b1", dataclasses.replace(PREFILL, batch=1), False),
         ("decode", DECODE, False), ("decode-b1", dataclasses.replace(DECODE, batch=1), False),
         ("training", PREFILL, True), ("graph", DECODE, False), ("varlen", RAGGED, False),
         ("varlen-training", RAGGED, True)]

CHILD = r'''
import sys, torch
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from test_aot_gpu import CALLS, run
from tiledattention.tooling import served_from_bundles
results = {name: run(problem, training, graph=name == "graph") for name, problem, training in CALLS}
served = served_from_bundles()
torch.save({"results": results, "served": served}, sys.argv[1])
'''


def run(problem: Problem, training: bool, graph: bool = False) -> list:
    """The outputs (and with ``training`` the gradients) of one call on seeded inputs; with
    ``graph`` captured in a CUDA graph and replayed into a poisoned output."""
    g = torch.Generator(device="cuda").manual_seed(problem.seqlen_k + problem.batch)
    p = problem

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    if p.ragged:  # LENGTHS packed, with 7 tokens of no sequence at the end (cleared)
        tokens = sum(LENGTHS) + 7
        q = randn(tokens, p.heads_q, p.head_dim)
        k, v = (randn(tokens, p.heads_kv, p.head_dim) for _ in range(2))
        cu = torch.tensor((0, *LENGTHS), device="cuda").cumsum(0).to(torch.int32)
        leaves = [x.requires_grad_(training) for x in (q, k, v)]
        out = tiledattention.varlen_attn(*leaves, cu, cu, max(LENGTHS), max(LENGTHS),
                                         is_causal=True, enable_gqa=True)
        grads = torch.autograd.grad(out, leaves, randn(*out.shape)) if training else ()
        torch.cuda.synchronize()
        return [t.detach().cpu() for t in (out, *grads)]

    q = randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim)
    k, v = (randn(p.batch, p.heads_kv, p.seqlen_k, p.head_dim) for _ in range(2))
    if training:
        grad = randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim)
        out, lse = tiledattention.sdpa_with_lse(q, k, v, causal=p.causal)
        grads = tiledattention.sdpa_backward(grad, q, k, v, out, lse, causal=p.causal)
        return [t.cpu() for t in (out, lse, *grads)]
    out = torch.empty_like(q)
    tiledattention.sdpa(q, k, v, causal=p.causal, out=out)
    if graph:
        torch.cuda.synchronize()
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            tiledattention.sdpa(q, k, v, causal=p.causal, out=out)
        out.fill_(float("nan"))
        cuda_graph.replay()
    torch.cuda.synchronize()
    return [out.cpu()]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tiledattention.core._device import device_info

    arch = device_info(torch.cuda.current_device()).arch
    jobs = jobs_for([arch], [("forward", PREFILL), ("decode", DECODE), ("backward", PREFILL),
                             ("forward", RAGGED), ("backward", RAGGED)], shipped=False)
    out = tmp_path_factory.mktemp("cubins")
    report = build_bundles(jobs, out, processes=4)
    assert report.failures == [] and arch in report.bundles
    return report.bundles[arch][0]


def _without_compiler(path: str) -> str:
    """``PATH`` without the directories that hold ``tileiras``."""
    return os.pathsep.join(d for d in path.split(os.pathsep)
                           if d and not (Path(d) / "tileiras").exists())


def test_a_fresh_process_runs_from_the_bundle_without_the_compiler(bundle, tmp_path):
    root = str(Path(__file__).resolve().parents[2])
    saved = tmp_path / "shipped.pt"
    env = {**os.environ, _bundles.ENV_CUBINS: str(bundle), _aot.ENV_JIT: "0",
           "PATH": _without_compiler(os.environ.get("PATH", ""))}
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run([sys.executable, "-c", CHILD, str(saved), root, here], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shipped = torch.load(saved)
    assert shipped["served"] >= 6  # forward, decode split and merge, the backward's kernels
    for name, problem, training in CALLS:  # here: compiled by cuTile's JIT
        want = run(problem, training, graph=name == "graph")
        got = shipped["results"][name]
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), \
                name


def test_compiling_off_and_no_image_is_a_clear_error(bundle, tmp_path):
    other = dataclasses.replace(PREFILL, head_dim=64)  # constants no bundle holds
    paths = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
    code = (f"import sys; sys.path[:0] = {paths!r}\n"
            "from test_aot_gpu import run\n"
            "from tiledattention import Problem\n"
            f"run(Problem(**{other.to_dict()!r}), False)\n")
    env = {**os.environ, _bundles.ENV_CUBINS: str(bundle), _aot.ENV_JIT: "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    assert "CompileRequiredError" in done.stderr and "TILEDATTENTION_JIT=0" in done.stderr
