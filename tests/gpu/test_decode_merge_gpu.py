"""The split kernel's own merge (``DecodeSchedule(combine="last_cta")``, issue 49) under stress.

Each split CTA stores its partials, counts itself on its row's counter (an acquire-release atomic
at device scope) and the CTA that counts last merges the row and resets the counter. What would
show a wrong ordering: a merge reading a partial before its store is visible (a stale value, or
the NaN every partial is poisoned with before each launch), a counter left off zero (the next
launch merges early or never), a row merged twice or not at all (its output stays NaN).

For every launch (``TILEDATTENTION_STRESS_LAUNCHES`` per shape, default 1000) a random cache
length is drawn, the partial buffers and both outputs are filled with NaN, and the same schedule
runs with the merge in the split kernel and with the combine kernel; the outputs must be equal
bit for bit (both merge the splits in the same order with the same arithmetic), and every 100th
launch is also checked against the float32 reference. The counters must be zero at the end. A
CUDA graph of the merging launch, replayed with new queries, must match eager launches.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from tiledattention import DECODE, DecodeSchedule, Problem
from tiledattention.core._reference import attention_reference
from tiledattention.kernels.decode._launch import launch, launches, partial_shapes
from tiledattention.kernels.decode._plan import new_partials

from ._reference import rel_l2

gpu = pytest.mark.gpu

LAUNCHES = int(os.environ.get("TILEDATTENTION_STRESS_LAUNCHES", "1000"))
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _problem(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype="bf16", causal=False,
             sinks=False) -> Problem:
    return Problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q,
                   seqlen_k=seqlen_k, head_dim=head_dim, dtype=dtype, causal=causal,
                   bottom_right=causal, sinks=sinks)


#: (the problem at its longest cache, splits): rows x splits from 8 x 16 to 192 x 5, a group
#: of 7, multi-query with 4 query positions (bottom-right causal), sinks, D 64-256, fp16
SHAPES = {
    "B1-H32/8-D128-split16": (_problem(1, 32, 8, 1, 32768, 128), 16),
    "B16-H28/4-D128-split3": (_problem(16, 28, 4, 1, 3000, 128), 3),
    "B2-H8/1-Sq4-D64-fp16-causal-split64": (_problem(2, 8, 1, 4, 9000, 64, "fp16", True), 64),
    "B24-H8/8-D256-sinks-split5": (_problem(24, 8, 8, 1, 1500, 256, sinks=True), 5),
}


class _Pair:
    """One shape's inputs at their longest cache and the two plans (merge in the split kernel,
    merge by the combine kernel) with their own partial buffers and outputs."""

    def __init__(self, problem: Problem, splits: int, seed: int) -> None:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        dtype = _DTYPES[problem.dtype]

        def rand(*shape):
            return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)

        p = problem
        self.problem = p
        self.q = rand(p.batch, p.heads_q, p.seqlen_q, p.head_dim)
        self.k = rand(p.batch, p.heads_kv, p.seqlen_k, p.head_dim)
        self.v = rand(p.batch, p.heads_kv, p.seqlen_k, p.head_dim)
        self.sinks = (torch.randn(p.heads_q, device="cuda", generator=gen) if p.sinks else None)
        base = DecodeSchedule(splits=splits, tile_n=64, k_latency=2, v_latency=2)
        self.merge = launches(p, base.replace(combine="last_cta"), None)
        self.combine = launches(p, base, None)
        assert self.merge.merge and self.merge.combine is None and self.merge.splits == splits
        assert not self.combine.merge and self.combine.combine is not None
        self.merge_partials = new_partials(partial_shapes(self.merge), self.q.device)
        self.combine_partials = new_partials(partial_shapes(self.combine), self.q.device)
        self.out = torch.empty_like(self.q)
        self.out_combine = torch.empty_like(self.q)

    def run(self, length: int) -> None:
        """Both plans over the first ``length`` keys, into NaN-poisoned outputs and partials."""
        for buffer in (*self.merge_partials[:2], *self.combine_partials, self.out,
                       self.out_combine):
            buffer.fill_(float("nan"))
        self.launch(length, self.out, self.merge, self.merge_partials)
        self.launch(length, self.out_combine, self.combine, self.combine_partials)

    def launch(self, length, out, plan, partials) -> None:
        offset = length - self.problem.seqlen_q if self.problem.causal else 0
        launch(torch.cuda.current_stream(), plan, self.q, self.k[:, :, :length],
               self.v[:, :, :length], out, offset, partials, sinks=self.sinks)

    def reference_error(self, length: int) -> float:
        fields = self.problem.to_dict()
        fields["seqlen_k"] = length
        problem = Problem.from_dict(fields)
        ref = attention_reference(self.q, self.k[:, :, :length], self.v[:, :, :length], problem,
                                  None, sinks=self.sinks)
        return rel_l2(self.out, ref)

    @property
    def counters(self) -> torch.Tensor:
        return self.merge_partials[2]


@gpu
@pytest.mark.parametrize("name", list(SHAPES))
def test_last_cta_merge_matches_the_combine_kernel_bit_for_bit(name):
    problem, splits = SHAPES[name]
    pair = _Pair(problem, splits, seed=len(name))
    rng = random.Random(name)
    lowest = problem.seqlen_q if problem.causal else 1
    mismatched = torch.zeros((), dtype=torch.int64, device="cuda")
    worst = 0.0
    for i in range(LAUNCHES):
        length = rng.randint(lowest, problem.seqlen_k)
        pair.run(length)
        same = (pair.out == pair.out_combine).all() & torch.isfinite(pair.out_combine).all()
        mismatched += (~same).to(torch.int64)
        if i % 100 == 0:
            worst = max(worst, pair.reference_error(length))
    torch.cuda.synchronize()
    print(f"{name}: {LAUNCHES} launches, {int(mismatched)} mismatched, worst reference error "
          f"{worst:.2e}, counters left {int(pair.counters.abs().sum())}")
    assert int(mismatched) == 0, f"{int(mismatched)} of {LAUNCHES} launches differ"
    assert worst <= DECODE.tolerance(problem)
    assert int(pair.counters.abs().sum()) == 0, "a counter was not reset"


@gpu
def test_last_cta_merge_replays_in_a_cuda_graph():
    problem, splits = SHAPES["B16-H28/4-D128-split3"]
    pair = _Pair(problem, splits, seed=7)
    length = problem.seqlen_k - 11
    static_out = torch.empty_like(pair.q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm (compiled) before capture
        pair.launch(length, static_out, pair.merge, pair.merge_partials)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pair.launch(length, static_out, pair.merge, pair.merge_partials)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(200):
        pair.q.copy_(torch.randn(pair.q.shape, device="cuda", generator=gen))
        static_out.fill_(float("nan"))
        graph.replay()
        pair.launch(length, pair.out_combine, pair.combine, pair.combine_partials)
        assert torch.equal(static_out, pair.out_combine)
    assert int(pair.counters.abs().sum()) == 0
