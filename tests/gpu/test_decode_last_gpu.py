"""``DecodeSchedule(combine="last")`` on the GPU: the split CTA that counts its row done last
merges it (no merge kernel).

- against the float32 reference and the block merge on the same inputs: grouped and multi-
  query heads, D 64-256, a group of 7 with several query positions, sinks, a sliding window,
  split counts that take the merge one step or several, a paged batch of mixed lengths with
  balanced splits (whose short entries' splits store empty partials);
- a stress test: 2,000 launches at cache lengths drawn at random, the partials NaN-filled
  before each (a partial read before its split stored it comes out NaN), each output against
  the block merge's on the same inputs; the row counters all zero after;
- a CUDA graph replaying the call with new inputs (the counters set back by every launch).
"""

from __future__ import annotations

import random

import pytest
import torch

import tiledattention
from tiledattention import DECODE, DecodeSchedule, Problem
from tiledattention.kernels.decode._launch import launch, launches, new_scratch

from ._reference import rel_l2

gpu = pytest.mark.gpu


def _problem(b, hq, hkv, sk, d, dtype="bf16", sq=1, **extra) -> Problem:
    causal = sq > 1 or "window_left" in extra or extra.get("ragged", False)
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=dtype, causal=causal, bottom_right=causal, **extra)


CASES = {
    # name: (problem, splits)
    "gqa4-d128-16-splits": (_problem(1, 32, 8, 32768, 128), 16),
    "mqa-d64-64-splits": (_problem(1, 8, 1, 50000, 64), 64),  # 64 splits: four steps of 16
    "group7-rows3-d96-37-splits": (_problem(2, 28, 4, 9001, 96, sq=3), 37),
    "gqa8-d256-fp16-sinks": (_problem(1, 16, 2, 9000, 256, "fp16", sinks=True), 8),
    "window-4096": (_problem(2, 32, 8, 20000, 128, window_left=4095, window_right=0), 8),
    "paged-16-balanced": (_problem(6, 32, 8, 6000, 128, ragged=True, page_size=16), 8),
}


@gpu
@pytest.mark.parametrize("name", list(CASES))
def test_last_merges_as_the_block_merge_and_the_reference(name):
    problem, splits = CASES[name]
    case = DECODE.case(problem, torch.cuda.current_device())
    schedule = DECODE.default_schedule("sm_90", problem).replace(
        splits=splits, flat=False, tail_rows=0, balanced=problem.ragged)
    outs = {}
    for combine in ("last", "block"):
        err = case.error(case.launcher(schedule.replace(combine=combine)))
        assert err <= DECODE.tolerance(problem), (combine, err)
        outs[combine] = case.out.clone()
    assert rel_l2(outs["last"], outs["block"]) < 1e-3  # the same partials, merged alike


@gpu
def test_last_merge_reads_what_every_split_stored_over_2000_launches():
    problem = _problem(1, 32, 8, 16384, 128)
    case = DECODE.case(problem, torch.cuda.current_device())
    base = DECODE.default_schedule("sm_90", problem).replace(splits=16)
    plans = {c: launches(problem, base.replace(combine=c), None) for c in ("last", "block")}
    assert plans["last"].combine is None and plans["block"].combine is not None
    scratch = {c: new_scratch(p, lambda shape: torch.empty(shape, device="cuda"))
               for c, p in plans.items()}
    outs = {c: torch.empty_like(case.q) for c in plans}
    stream = torch.cuda.current_stream()
    rng = random.Random(49)
    mismatches = 0
    for _ in range(2000):
        length = rng.randint(1, problem.seqlen_k)
        k, v = case.k[:, :, :length], case.v[:, :, :length]
        for c, plan in plans.items():
            scratch[c][0].fill_(float("nan"))  # the partials and log-sum-exps, not the counters
            scratch[c][1].fill_(float("nan"))
            outs[c].fill_(float("nan"))
            launch(stream, plan, case.q, k, v, outs[c], 0, scratch[c])
        if not (torch.isfinite(outs["last"]).all() and rel_l2(outs["last"], outs["block"]) < 1e-3):
            mismatches += 1
    assert mismatches == 0
    assert int(torch.count_nonzero(scratch["last"][2])) == 0  # every counter set back


@gpu
def test_a_graph_of_the_last_merge_replays_with_new_inputs():
    b, hq, hkv, sk, d = 1, 32, 8, 16384, 128
    gen = torch.Generator(device="cuda").manual_seed(5)

    def rand(h, s):
        return torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)

    schedule = DecodeSchedule(splits=16, combine="last", tile_n=128, k_latency=2, v_latency=2)
    q, k, v = rand(hq, 1), rand(hkv, sk), rand(hkv, sk)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile and keep the plan
        for _ in range(3):
            tiledattention.sdpa(q, k, v, schedule=schedule)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tiledattention.sdpa(q, k, v, schedule=schedule)
    for _ in range(3):  # the graph reads the tensors; each replay's counters start at zero
        for x in (q, k, v):
            x.copy_(torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=gen))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), enable_gqa=True)
        assert rel_l2(out, ref) < DECODE.tolerance(_problem(b, hq, hkv, sk, d))
    del graph
