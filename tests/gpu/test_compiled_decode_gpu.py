"""Decode steps compiled and captured (issue 29): ``integrations.attention`` inside
``torch.compile(mode="reduce-overhead")`` (CUDA graph trees), inside a hand-made
``torch.cuda.graph``, and eager, each over 100 steps of a growing K/V cache, every step against
the float32 reference (relative L2 error within the decode family's tolerance). A compiled step
is called three times per length, so that CUDA graph trees warm it up, record it and replay it.

The cache is either a module's static buffer that each step writes one position of (its
addresses never change: what a static KV cache is), or a new tensor per step (``torch.cat``:
the cudagraph trees copy it into their own input buffers). The lengths cross a plan bucket
(``length_bucket``) and the multi-split schedules write float32 partials: a partial buffer the
runtime kept in a graph's pool made graph trees raise "tensor(s) in the cudagraph pool not
tracked as outputs" on the third call (before ``sdpa(keep_scratch=False)``).
"""

from __future__ import annotations

import pytest
import torch

import tiledattention
import tiledattention.integrations as ti
from tiledattention import DECODE
from tiledattention.kernels.decode import length_bucket

from ._reference import TOLERANCE, reference, rel_l2

gpu = pytest.mark.gpu

B, HQ, HKV, D = 1, 32, 8, 128
START, STEPS = 2850, 100  # crosses the bucket edge at 2^11.5 (2896 keys)


class Cache(torch.nn.Module):
    """A static K/V cache: buffers of the longest length, written one position per step."""

    def __init__(self, longest: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(B, HKV, longest, D, device="cuda", dtype=dtype))
        self.register_buffer("v", torch.zeros(B, HKV, longest, D, device="cuda", dtype=dtype))

    def forward(self, q, k_new, v_new, length: int):
        self.k[:, :, length - 1:length].copy_(k_new)
        self.v[:, :, length - 1:length].copy_(v_new)
        return ti.attention(q, self.k[:, :, :length], self.v[:, :, :length], causal=False)


def _steps(dtype: torch.dtype, seed: int):
    """(q, k_new, v_new, length) of each step and the prefilled K/V of the first."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(h, s):
        return torch.randn(B, h, s, D, device="cuda", dtype=dtype, generator=gen)

    prefix = rand(HKV, START - 1), rand(HKV, START - 1)
    steps = [(rand(HQ, 1), rand(HKV, 1), rand(HKV, 1), START + i) for i in range(STEPS)]
    return prefix, steps


def _check(out, q, k, v, where: str) -> None:
    err = rel_l2(out, reference(q, k, v, False))
    assert err <= TOLERANCE[q.dtype], f"{where}: relative L2 error {err:.3g}"


def _multi_split(dtype: torch.dtype) -> None:
    """The lengths of these tests run the decode family with several splits (partials)."""
    q = torch.empty(B, HQ, 1, D, device="cuda", dtype=dtype)
    k = torch.empty(B, HKV, START, D, device="cuda", dtype=dtype)
    found = tiledattention.explain(q, k, k)
    assert found.family == DECODE.name and found.schedule.splits > 1, found
    assert length_bucket(START) != length_bucket(START + STEPS - 1)


@pytest.fixture
def replays(monkeypatch) -> list:
    """Counts CUDA graph replays (the graph trees replay through ``CUDAGraph.replay``)."""
    count = []
    real = torch.cuda.CUDAGraph.replay

    def replay(graph):
        count.append(1)
        return real(graph)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", replay)
    return count


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("cache", ["static-buffer", "new-tensor"])
def test_reduce_overhead_decode_steps_run_and_match_the_reference(cache, dtype, replays):
    _multi_split(dtype)
    torch._dynamo.reset()
    (k_prefix, v_prefix), steps = _steps(dtype, seed=29)
    if cache == "static-buffer":
        model = Cache(START + STEPS, dtype)
        model.k[:, :, :START - 1].copy_(k_prefix)
        model.v[:, :, :START - 1].copy_(v_prefix)
        step = torch.compile(model, mode="reduce-overhead", fullgraph=True, dynamic=True)
    else:
        def attend(q, k, v):
            return ti.attention(q, k, v, causal=False)

        step = torch.compile(attend, mode="reduce-overhead", fullgraph=True, dynamic=True)
    k_all, v_all = k_prefix, v_prefix
    with torch.no_grad():
        for i, (q, k_new, v_new, length) in enumerate(steps):
            k_all = torch.cat([k_all, k_new], dim=2)
            v_all = torch.cat([v_all, v_new], dim=2)
            # a tree runs a new size eagerly (warm-up), then records it, then replays it: three
            # calls a step (the static cache's write is idempotent), each checked
            for call in range(3):
                if cache == "static-buffer":
                    out = step(q, k_new, v_new, length)
                else:
                    out = step(q, k_all, v_all)
                out = out.clone()  # a graph tree's output is overwritten by its next replay
                _check(out, q, k_all, v_all,
                       f"reduce-overhead, {cache}, step {i} (S_k {length}), call {call}")
    torch._dynamo.reset()
    # graphs ran (not a silent fallback to eager): one replay a step at least
    assert len(replays) >= STEPS, f"{len(replays)} CUDA graph replays in {STEPS} steps"


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_hand_captured_decode_steps_run_and_match_the_reference(dtype):
    """One graph per length, all in one memory pool, captured after an eager warm-up on a side
    stream; each replayed with the step's inputs copied into the captured buffers."""
    _multi_split(dtype)
    (k_prefix, v_prefix), steps = _steps(dtype, seed=30)
    cache = Cache(START + STEPS, dtype)
    cache.k[:, :, :START - 1].copy_(k_prefix)
    cache.v[:, :, :START - 1].copy_(v_prefix)
    q_in = torch.zeros(B, HQ, 1, D, device="cuda", dtype=dtype)
    kv_in = torch.zeros(2, B, HKV, 1, D, device="cuda", dtype=dtype)
    pool = torch.cuda.graph_pool_handle()
    k_all, v_all = k_prefix, v_prefix
    with torch.no_grad():
        for i, (q, k_new, v_new, length) in enumerate(steps):
            q_in.copy_(q)
            kv_in[0].copy_(k_new)
            kv_in[1].copy_(v_new)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm up: compile, look up, keep the plan
                cache(q_in, kv_in[0], kv_in[1], length)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = cache(q_in, kv_in[0], kv_in[1], length)
            out.fill_(float("nan"))
            graph.replay()
            k_all = torch.cat([k_all, k_new], dim=2)
            v_all = torch.cat([v_all, v_new], dim=2)
            _check(out, q, k_all, v_all, f"torch.cuda.graph, step {i} (S_k {length})")
            del graph, out


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_eager_decode_steps_match_the_reference(dtype):
    _multi_split(dtype)
    (k_prefix, v_prefix), steps = _steps(dtype, seed=31)
    cache = Cache(START + STEPS, dtype)
    cache.k[:, :, :START - 1].copy_(k_prefix)
    cache.v[:, :, :START - 1].copy_(v_prefix)
    k_all, v_all = k_prefix, v_prefix
    with torch.no_grad():
        for i, (q, k_new, v_new, length) in enumerate(steps):
            out = cache(q, k_new, v_new, length)
            k_all = torch.cat([k_all, k_new], dim=2)
            v_all = torch.cat([v_all, v_new], dim=2)
            _check(out, q, k_all, v_all, f"eager, step {i} (S_k {length})")
