"""The split-KV decode family's variants on the GPU (issue 32): sliding windows, logit softcap
and attention sinks, against the float32 reference (``attention_reference``, which applies
them explicitly), by relative L2 error within ``DECODE.tolerance``.

Each case runs through the family's own case (``DecodeCase``: NaN-poisoned output) with six
schedules: the sm_90 default, one split (the split kernel normalises and adds the sink itself),
three splits merged by a programmatic dependent launch with 64-key steps (the stepping combine
adds the sink once), five splits merged from one tile (the block combine adds it once), and the
one-split and five-split ones folding each key tile as slices of its keys (one slice holds the
sink). Covered: windows of 1 key and 2 keys, windows longer than the cache (passed as
the call's window, which the problem's canonical form drops), one-sided and two-sided windows,
S_q > 1 bottom-right (speculative decoding) and top-left with S_q != S_k, a softcap that binds
(q scaled up 8x), sinks that dominate (8.0), grouped heads (4, 7, MQA), odd cache lengths, rows
that see no key (exact zeros, with and without sinks), and a decode loop whose cache grows
through one kept plan with the window's start following it.
"""

from __future__ import annotations

import pytest
import torch

import tiledattention
from tiledattention import DECODE, Call, DecodeSchedule, Problem
from tiledattention.core import _plans as hot
from tiledattention.core._reference import attention_reference
from tiledattention.kernels.decode._launch import launch, launches, new_scratch
from tiledattention.kernels.decode._plan import decode_plan

from ._reference import rel_l2

gpu = pytest.mark.gpu

#: one split (DIRECT: the split kernel adds the sink), three splits merged by PDL (the stepping
#: merge), five merged from one tile (the block merge: its sink term, softcap and windows)
ONE_SPLIT = DecodeSchedule(splits=1, tile_n=64, k_latency=2, v_latency=2)
THREE_PDL = DecodeSchedule(splits=3, combine="pdl", tile_n=64, k_transposed=True)
FIVE_BLOCK = DecodeSchedule(splits=5, combine="block", tile_n=64)
#: key tiles folded as slices of their keys (one split: four of 32; five splits: two of 32)
SLICED = {"one-split-sliced": ONE_SPLIT.replace(tile_n=128, key_slices=4),
          "five-block-sliced": FIVE_BLOCK.replace(key_slices=2)}


def _problem(*, hq=32, hkv=8, sq=1, sk=1025, d=128, dtype="bf16", causal=False,
             bottom_right=False, left=-1, right=-1, softcap=0.0, sinks=False,
             batch=2) -> Problem:
    return Problem(batch=batch, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk,
                   head_dim=d, dtype=dtype, causal=causal, bottom_right=bottom_right,
                   window_left=left, window_right=right, softcap=softcap, sinks=sinks)


CASES = {
    # decode against a window of the cache's last keys (bottom-right: the row is the newest)
    "token-win256-br": _problem(causal=True, bottom_right=True, left=256),
    "token-win1-br": _problem(causal=True, bottom_right=True, left=1),
    "token-win0-br-sinks": _problem(causal=True, bottom_right=True, left=0, sinks=True),
    # speculative decoding: 4 and 5 query rows, bottom-right, a window and causal
    "spec4-win64-br": _problem(sq=4, causal=True, bottom_right=True, left=64),
    "spec5-win100-br-cap-sinks": _problem(sq=5, sk=777, hq=28, hkv=4, d=96, causal=True,
                                          bottom_right=True, left=100, softcap=20.0,
                                          sinks=True),
    # a two-sided window without the causal mask, bottom-right and top-left (S_q != S_k)
    "spec3-win(16,1)-br": _problem(sq=3, bottom_right=True, left=16, right=1),
    "rows3-win(-1,100)-tl": _problem(sq=3, right=100, dtype="fp16"),
    "rows8-win(40,5)-tl-sinks": _problem(sq=8, left=40, right=5, sinks=True),
    # softcap and sinks without a window, grouped heads 4 / MQA, odd lengths
    "token-cap": _problem(softcap=5.0),
    "token-mqa-sinks": _problem(hq=16, hkv=1, sk=4097, sinks=True),
    "spec4-br-cap-sinks-fp16": _problem(sq=4, sk=1000, causal=True, bottom_right=True,
                                        softcap=10.0, sinks=True, dtype="fp16", d=64),
    "everything-long": _problem(sk=32769, causal=True, bottom_right=True, left=4096,
                                softcap=30.0, sinks=True, batch=1),
}


WHICH = ["default", "one-split", "three-pdl", "five-block", *SLICED, "five-block-occ4"]


def _case(problem: Problem, *, q_times: float = 1.0, sink: float | None = None):
    case = DECODE.case(problem, 0)
    if q_times != 1.0 or sink is not None:
        if q_times != 1.0:
            case.q.mul_(q_times)
        if sink is not None:
            case.sinks.fill_(sink)
        case.reference = attention_reference(case.q, case.k, case.v, problem,
                                             sinks=case.sinks)
    return case


def _schedules(problem: Problem) -> dict[str, DecodeSchedule]:
    return {"default": DECODE.default_schedule("sm_90", problem), "one-split": ONE_SPLIT,
            "three-pdl": THREE_PDL, "five-block": FIVE_BLOCK, **SLICED,
            # the block merge (its sink term) compiled for four CTAs an SM
            "five-block-occ4": FIVE_BLOCK.replace(merge_occupancy=4)}


@gpu
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("which", WHICH)
def test_variant_matches_the_reference(name, which):
    problem = CASES[name]
    case = _case(problem)
    schedule = _schedules(problem)[which]
    err = case.error(case.launcher(schedule))
    assert err <= DECODE.tolerance(problem), f"{problem.describe()} {schedule.describe()}: " \
                                             f"rel L2 {err:.2e}"


@gpu
@pytest.mark.parametrize("which", WHICH)
def test_a_softcap_that_binds(which):
    """q scaled up 8x: raw scores of tens, capped at 5; without the cap the softmax would be
    nearly one-hot and the reference far from the uncapped result."""
    problem = _problem(sq=2, causal=True, bottom_right=True, left=300, softcap=5.0)
    case = _case(problem, q_times=8.0)
    uncapped = attention_reference(case.q, case.k, case.v,
                                   _problem(sq=2, causal=True, bottom_right=True, left=300))
    assert rel_l2(uncapped, case.reference) > 0.3  # the cap binds
    err = case.error(case.launcher(_schedules(problem)[which]))
    assert err <= DECODE.tolerance(problem), f"rel L2 {err:.2e}"


@gpu
@pytest.mark.parametrize("which", WHICH)
def test_dominant_sinks(which):
    """Sinks of 8.0 take most of each row's weight (scores are O(1)): the output shrinks to a
    fraction of the plain one, which only an exactly-once sink term gets right."""
    problem = _problem(sq=3, sk=2049, causal=True, bottom_right=True, left=512, sinks=True)
    case = _case(problem, sink=8.0)
    err = case.error(case.launcher(_schedules(problem)[which]))
    assert err <= DECODE.tolerance(problem), f"rel L2 {err:.2e}"
    plain = attention_reference(case.q, case.k, case.v, _problem(
        sq=3, sk=2049, causal=True, bottom_right=True, left=512))
    # e^8 against ~513 keys of O(1) scores: the sink takes most of the weight
    assert case.out.float().norm() < 0.4 * plain.norm()


@gpu
@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
@pytest.mark.parametrize("which", WHICH)
def test_rows_that_see_no_key_are_zeros(sinks, which):
    """Bottom-right with S_q > S_k and a window: the first S_q - S_k rows see no key."""
    problem = _problem(sq=8, sk=5, causal=True, bottom_right=True, left=2, sinks=sinks)
    case = _case(problem)
    err = case.error(case.launcher(_schedules(problem)[which]))
    assert err <= DECODE.tolerance(problem), f"rel L2 {err:.2e}"
    assert torch.count_nonzero(case.out[:, :, :3]).item() == 0
    assert torch.isfinite(case.out).all()


def _run_plan(plan_launches, q, k, v, offset, sinks=None):
    out = torch.full_like(q, float("nan"))
    partials = new_scratch(plan_launches, lambda shape: torch.empty(shape, device="cuda"))
    launch(torch.cuda.current_stream(), plan_launches, q, k, v, out, offset, partials, sinks)
    return out


@gpu
@pytest.mark.parametrize("schedule", [ONE_SPLIT, THREE_PDL], ids=["one-split", "three-pdl"])
def test_a_window_longer_than_the_cache(schedule):
    """The call's window (5000) passes the cache (1025 keys): the problem's canonical form
    drops it, a plan given the call's window keeps it (WINDOW on) and still sees every key."""
    problem = _problem(causal=True, bottom_right=True, left=5000)
    assert problem.window_left == -1  # canonical: the window binds nothing here
    case = _case(problem)
    plan = launches(problem, schedule, None, window=(5000, -1))
    assert plan.variant.windowed
    out = _run_plan(plan, case.q, case.k, case.v, problem.seqlen_k - problem.seqlen_q)
    assert rel_l2(out, case.reference) <= DECODE.tolerance(problem)


@gpu
def test_the_window_follows_a_growing_cache():
    """One plan, kept for the bucket of its first length, runs a decode loop of 40 steps of a
    growing cache (crossing nothing: every length is in the first one's bucket); each step
    sees only its last 300 keys (bottom-right window), with sinks and a softcap."""
    first = 3000
    problem = _problem(sk=first, causal=True, bottom_right=True, left=299, softcap=25.0,
                       sinks=True, batch=1)
    hot.bind_torch()
    plan = decode_plan(Call.of(problem, causal="bottom_right"),
                       DECODE.default_schedule("sm_90", problem), 0)
    gen = torch.Generator(device="cuda").manual_seed(7)
    k = torch.randn(1, 8, first + 40, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    sinks = torch.randn(32, device="cuda", generator=gen)
    for length in range(first, first + 40, 3):
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        plan = plan.for_torch(q, None, k, v)
        kl, vl = k[:, :, :length], v[:, :, :length]
        out = plan.run(None, q, kl, vl, 0, None, sinks)
        now = _problem(sk=length, causal=True, bottom_right=True, left=299, softcap=25.0,
                       sinks=True, batch=1)
        ref = attention_reference(q, kl, vl, now, sinks=sinks)
        assert rel_l2(out, ref) <= DECODE.tolerance(now), length
        # the keys before the window do not count: zeroing them changes nothing
        kz, vz = kl.clone(), vl.clone()
        kz[:, :, :length - 300] = 0
        vz[:, :, :length - 300] = 0
        assert torch.equal(plan.run(None, q, kz, vz, 0, None, sinks), out), length


@gpu
def test_sdpa_decode_with_a_window_softcap_and_sinks():
    """Through ``tiledattention.sdpa``: the decode family takes a one-row call with a window,
    a softcap and sinks, first call and warm call (a longer cache of the same bucket)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(2, 8, 5000, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    sinks = torch.randn(32, device="cuda", generator=gen)
    for length in (4500, 4501, 4999):
        kl, vl = k[:, :, :length], v[:, :, :length]
        out = tiledattention.sdpa(q, kl, vl, causal="bottom_right", window=(1023, 0),
                                  softcap=30.0, sinks=sinks)
        problem = _problem(sk=length, causal=True, bottom_right=True, left=1023,
                           softcap=30.0, sinks=True)
        ref = attention_reference(q, kl, vl, problem, sinks=sinks)
        assert rel_l2(out, ref) <= DECODE.tolerance(problem), length
