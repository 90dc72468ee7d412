"""Shipped cubins on the GPU: calls whose kernels a bundle holds run from it, through the
driver, with compiling switched off, and give the JIT-compiled kernels' results bit for bit
(prefill, decode, the backward, under a CUDA graph)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tiledattention  # noqa: E402
from tiledattention import Problem  # noqa: E402
from tiledattention.core import _aot, _bundles  # noqa: E402
from tuner.aot import Job, build_bundles  # noqa: E402

pytestmark = pytest.mark.gpu

PREFILL = Problem(batch=2, heads_q=16, heads_kv=4, seqlen_q=777, seqlen_k=777, head_dim=128,
                  dtype="bf16", causal=True)
DECODE = Problem(batch=3, heads_q=16, heads_kv=4, seqlen_q=1, seqlen_k=2049, head_dim=128,
                 dtype="bf16", causal=False)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tiledattention.core._device import device_info

    arch = device_info(torch.cuda.current_device()).arch
    jobs = [Job(family, tuple(sorted(p.to_dict().items())), arch)
            for family, p in (("forward", PREFILL), ("decode", DECODE), ("backward", PREFILL))]
    out = tmp_path_factory.mktemp("cubins")
    report = build_bundles(jobs, out, processes=3)
    assert report.failures == [] and arch in report.bundles
    return report.bundles[arch][0]


@pytest.fixture
def shipped(bundle, monkeypatch):
    """Within: the bundle in use and compiling forbidden; yields the driver launches made."""
    launched = []
    real = _aot._driver.launch_kernel
    monkeypatch.setattr(_aot._driver, "launch_kernel",
                        lambda *a: (launched.append(a[0]), real(*a))[1])

    def switch(on: bool) -> None:
        if on:
            monkeypatch.setenv(_bundles.ENV_CUBINS, str(bundle))
            monkeypatch.setenv(_aot.ENV_JIT, "0")
        else:
            monkeypatch.delenv(_bundles.ENV_CUBINS, raising=False)
            monkeypatch.delenv(_aot.ENV_JIT, raising=False)
        _aot.reset()
    yield switch, launched
    switch(False)


def _inputs(p: Problem, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim, device="cuda",
                    dtype=torch.bfloat16, generator=g)
    k = torch.randn(p.batch, p.heads_kv, p.seqlen_k, p.head_dim, device="cuda",
                    dtype=torch.bfloat16, generator=g)
    return q, k, torch.randn_like(k)


def _same(a, b) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("problem", [PREFILL, DECODE], ids=["prefill", "decode"])
def test_a_shipped_call_equals_the_jit_bit_for_bit(shipped, problem):
    switch, launched = shipped
    q, k, v = _inputs(problem)
    causal = problem.causal
    switch(False)
    want = tiledattention.sdpa(q, k, v, causal=causal)
    switch(True)
    got = torch.full_like(want, float("nan"))
    tiledattention.sdpa(q, k, v, causal=causal, out=got)
    torch.cuda.synchronize()
    assert launched, "no kernel ran from the bundle"
    assert _same(got, want)
    # another length under the same constants runs from the same images
    n = problem.seqlen_k - 100
    tiledattention.sdpa(q[:, :, :min(problem.seqlen_q, n)], k[:, :, :n], v[:, :, :n],
                        causal=causal)
    torch.cuda.synchronize()


def test_the_backward_from_shipped_cubins_equals_the_jit(shipped):
    switch, launched = shipped
    q, k, v = _inputs(PREFILL, 1)
    grad = torch.randn_like(q)
    switch(False)
    out, lse = tiledattention.sdpa_with_lse(q, k, v, causal=True)
    want = tiledattention.sdpa_backward(grad, q, k, v, out, lse, causal=True)
    switch(True)
    out2, lse2 = tiledattention.sdpa_with_lse(q, k, v, causal=True)
    got = tiledattention.sdpa_backward(grad, q, k, v, out2, lse2, causal=True)
    torch.cuda.synchronize()
    assert len(launched) >= 3  # forward, dQ, dK/dV at least
    assert _same(out2, out) and torch.equal(lse2, lse)
    assert all(_same(a, b) for a, b in zip(got, want))


def test_shipped_launches_replay_in_a_cuda_graph(shipped):
    switch, launched = shipped
    q, k, v = _inputs(DECODE, 2)
    switch(False)
    want = tiledattention.sdpa(q, k, v)
    switch(True)
    out = torch.empty_like(want)
    tiledattention.sdpa(q, k, v, out=out)  # warm: the plan and the loaded kernel
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tiledattention.sdpa(q, k, v, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _same(out, want) and launched
