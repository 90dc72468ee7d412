"""The forward kernel's variants on the GPU: sliding windows, logit softcap and attention sinks,
against the float32 reference that applies each explicitly
(``tiledattention.core._reference.attention_reference``).

Windows of one key, wider than the sequence, one-sided and two-sided, with S_q != S_k in both
alignments, odd lengths and grouped heads, under the schedule flags that change the key walk
(split masked loops, sawtooth, paired and persistent tiles, natural-log units); a softcap that
binds (q scaled up), sinks that dominate (8.0), the stored log-sum-exp with both, rows that see
no key (zeros, with or without sinks), and the family's case, plan and launcher. Outputs are
poisoned with NaN before each launch; errors are relative L2.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tiledattention import FORWARD, Problem, Schedule
from tiledattention.core._problem import row_stat_shape
from tiledattention.core._reference import attention_reference, visible_keys
from tiledattention.kernels.forward._launch import default_scale, launch, launch_with_lse

from ._reference import rel_l2

pytestmark = pytest.mark.gpu

BASE = Schedule(tile_m=64, tile_n=64)
SCHEDULES = {
    "default": None,
    "split_masked_sawtooth": BASE.replace(split_masked=True, kv_sawtooth=True, exp2=True,
                                          approx_div=True),
    "paired_persistent": BASE.replace(tile_m=32, paired_tiles=True, persistent=True,
                                      occupancy=2),
    "longest_first_128x32": BASE.replace(tile_m=128, tile_n=32, longest_first=True),
    "natural_log_k_transposed": BASE.replace(exp2=False, k_transposed=True, tile_n=128),
}


def _problem(sq: int, sk: int, *, causal: bool = False, hq: int = 8, hkv: int = 2,
             d: int = 128, dtype: str = "bf16", **variant) -> Problem:
    return Problem(batch=2, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=dtype, causal=causal, **variant)


def _inputs(problem: Problem, seed: int = 0, q_scale: float = 1.0, sink: float | None = None):
    """Random q, k, v of ``problem`` (q times ``q_scale``) and its sinks: all ``sink``, or
    random around 2 (the size of a row's largest scores) when ``sink`` is None."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = torch.bfloat16 if problem.dtype == "bf16" else torch.float16

    def rand(heads: int, seqlen: int) -> torch.Tensor:
        return torch.randn(problem.batch, heads, seqlen, problem.head_dim, device="cuda",
                           dtype=dtype, generator=gen)

    q = (rand(problem.heads_q, problem.seqlen_q).float() * q_scale).to(dtype)
    k, v = rand(problem.heads_kv, problem.seqlen_k), rand(problem.heads_kv, problem.seqlen_k)
    sinks = None
    if problem.sinks:
        sinks = (torch.full((problem.heads_q,), sink, device="cuda") if sink is not None
                 else torch.randn(problem.heads_q, device="cuda", generator=gen) + 2.0)
    return q, k, v, sinks


def _schedule(problem: Problem, schedule: Schedule | None) -> Schedule:
    major, minor = torch.cuda.get_device_capability()
    if schedule is None:
        schedule = FORWARD.default_schedule(f"sm_{major}{minor}", problem)
    return FORWARD.normalise(problem, schedule)


def _run(problem: Problem, q, k, v, sinks, schedule: Schedule | None = None, lse=None):
    """The forward into NaN-poisoned outputs (and log-sum-exp, when ``lse`` is true)."""
    out = torch.full_like(q, float("nan"))
    sm_count = torch.cuda.get_device_properties(q.device).multi_processor_count
    stream = torch.cuda.current_stream()
    s = _schedule(problem, schedule)
    if lse:
        stats = torch.full(row_stat_shape(problem), float("nan"), device="cuda")
        view = stats[:, :, :problem.seqlen_q]
        launch_with_lse(stream, q, k, v, out, view, problem, s, default_scale(problem),
                        sm_count, sinks=sinks)
        torch.cuda.synchronize()
        return out, view
    launch(stream, q, k, v, out, problem, s, default_scale(problem), sm_count, sinks=sinks)
    torch.cuda.synchronize()
    return out


def _check(problem: Problem, out, q, k, v, sinks, label: str = "") -> torch.Tensor:
    ref = attention_reference(q, k, v, problem, sinks=sinks)
    err = rel_l2(out, ref)  # inf if any element is not finite
    assert err <= FORWARD.tolerance(problem), f"rel L2 {err:.2e} {problem.describe()} {label}"
    blind = ~visible_keys(problem, q.device).any(dim=1)  # [S_q]: rows that see no key
    if blind.any():
        assert torch.count_nonzero(out[:, :, blind]).item() == 0, f"blind rows not zero {label}"
    return ref


# -- windows ---------------------------------------------------------------------------------------
WINDOWS = {
    "one_key_causal": dict(sq=1025, sk=1025, causal=True, window_left=0),
    "one_key_each_side": dict(sq=1025, sk=1025, window_left=1, window_right=1),
    "left_128_causal": dict(sq=1025, sk=1025, causal=True, window_left=128),
    "left_only_full": dict(sq=700, sk=700, window_left=100),
    "right_only_full": dict(sq=700, sk=700, window_right=100),
    "two_sided": dict(sq=1025, sk=1025, window_left=200, window_right=57),
    "more_keys_top_left": dict(sq=300, sk=1025, window_left=90, window_right=30),
    "more_keys_bottom_right_causal": dict(sq=300, sk=1025, causal=True, bottom_right=True,
                                          window_left=90),
    "more_keys_bottom_right_two_sided": dict(sq=300, sk=1025, bottom_right=True,
                                             window_left=90, window_right=30),
    "more_queries_top_left": dict(sq=1025, sk=300, window_left=50, window_right=20),
    "more_queries_bottom_right_causal": dict(sq=1025, sk=300, causal=True, bottom_right=True,
                                             window_left=64),
}


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
@pytest.mark.parametrize("case", WINDOWS.values(), ids=WINDOWS.keys())
def test_windows(case, schedule):
    case = dict(case)
    problem = _problem(case.pop("sq"), case.pop("sk"), **case)
    assert problem.windowed
    q, k, v, sinks = _inputs(problem)
    _check(problem, _run(problem, q, k, v, sinks, schedule), q, k, v, sinks)


def test_a_window_wider_than_the_sequence_is_the_plain_problem():
    wide = _problem(513, 513, causal=True, window_left=5000)
    assert not wide.windowed  # canonical form: a side that binds nothing is -1
    q, k, v, sinks = _inputs(wide)
    out = _run(wide, q, k, v, sinks)
    _check(wide, out, q, k, v, sinks)
    plain = _problem(513, 513, causal=True)
    assert torch.equal(out, _run(plain, q, k, v, None))


@pytest.mark.parametrize("d", [64, 96, 256])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_windows_over_head_dims_and_dtypes(d, dtype):
    problem = _problem(1025, 1025, causal=True, d=d, dtype=dtype, window_left=300, hq=4, hkv=4)
    q, k, v, sinks = _inputs(problem, seed=d)
    _check(problem, _run(problem, q, k, v, sinks), q, k, v, sinks)


def test_multi_query_heads_with_a_window():
    problem = _problem(777, 777, hq=8, hkv=1, window_left=64, window_right=64)
    q, k, v, sinks = _inputs(problem, seed=3)
    for schedule in (None, BASE.replace(persistent=True)):
        _check(problem, _run(problem, q, k, v, sinks, schedule), q, k, v, sinks)


# -- softcap ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softcap_binds_on_large_logits(causal, schedule):
    problem = _problem(1025, 1025, causal=causal, softcap=10.0)
    q, k, v, sinks = _inputs(problem, q_scale=8.0)  # scores of +-50 and more: the cap binds
    ref = _check(problem, _run(problem, q, k, v, sinks, schedule), q, k, v, sinks)
    uncapped = attention_reference(q, k, v, dataclasses.replace(problem, softcap=0.0))
    assert rel_l2(uncapped, ref) > 0.1  # the test's own check: the cap changes the result


# -- sinks -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
@pytest.mark.parametrize("sink", [8.0, None], ids=["dominant", "random"])
def test_sinks(sink, schedule):
    problem = _problem(1025, 1025, causal=True, sinks=True)
    q, k, v, sinks = _inputs(problem, sink=sink)
    ref = _check(problem, _run(problem, q, k, v, sinks, schedule), q, k, v, sinks)
    if sink is not None:  # the test's own check: a sink of 8 takes most of each row's weight
        plain = attention_reference(q, k, v, dataclasses.replace(problem, sinks=False))
        assert ref.norm() < 0.5 * plain.norm()


def test_rows_that_see_no_key_are_zero_with_sinks():
    problem = _problem(400, 100, causal=True, bottom_right=True, sinks=True)  # rows 0..299
    q, k, v, sinks = _inputs(problem, sink=1.0)
    out = _run(problem, q, k, v, sinks)
    _check(problem, out, q, k, v, sinks)
    assert torch.count_nonzero(out[:, :, :300]).item() == 0


# -- all together, the log-sum-exp -----------------------------------------------------------------
ALL = dict(window_left=150, softcap=20.0, sinks=True)


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
@pytest.mark.parametrize("shape", [(1025, 1025, False), (300, 1025, True), (1025, 300, True)],
                         ids=["square", "more_keys_br", "more_queries_br"])
def test_everything_at_once(shape, schedule):
    sq, sk, bottom_right = shape
    problem = _problem(sq, sk, causal=True, bottom_right=bottom_right, **ALL)
    q, k, v, sinks = _inputs(problem, q_scale=3.0)
    _check(problem, _run(problem, q, k, v, sinks, schedule), q, k, v, sinks)


def _reference_lse(problem: Problem, q, k, sinks) -> torch.Tensor:
    """Base-2 log-sum-exp of each row's scaled (capped) scores, sink included; +inf for a row
    with neither a visible key nor a sink."""
    group = problem.heads_q // problem.heads_kv
    s = q.float() @ k.float().repeat_interleave(group, 1).transpose(-1, -2)
    s = s * default_scale(problem)
    if problem.softcap > 0:
        s = problem.softcap * torch.tanh(s / problem.softcap)
    s = s.masked_fill(~visible_keys(problem, q.device), -math.inf)
    if sinks is not None:
        sink = sinks[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)
        s = torch.cat([s, sink], dim=-1)
    lse = torch.logsumexp(s, dim=-1) / math.log(2.0)
    return lse.masked_fill(lse == -math.inf, math.inf)


LSE_CASES = {
    "window_br_more_queries": dict(sq=500, sk=200, causal=True, bottom_right=True,
                                   window_left=40),
    "window_sinks_softcap": dict(sq=777, sk=777, window_left=100, window_right=10, softcap=15.0,
                                 sinks=True),
    "sinks_blind_rows": dict(sq=400, sk=100, causal=True, bottom_right=True, sinks=True),
}


@pytest.mark.parametrize("schedule", [None, BASE.replace(exp2=False, split_masked=True)],
                         ids=["default", "natural_log_split"])
@pytest.mark.parametrize("case", LSE_CASES.values(), ids=LSE_CASES.keys())
def test_stored_log_sum_exp_includes_the_sink_and_the_cap(case, schedule):
    case = dict(case)
    problem = _problem(case.pop("sq"), case.pop("sk"), **case)
    q, k, v, sinks = _inputs(problem, q_scale=2.0)
    out, lse = _run(problem, q, k, v, sinks, schedule, lse=True)
    _check(problem, out, q, k, v, sinks)
    expected = _reference_lse(problem, q, k, sinks)
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(lse), finite)  # +inf exactly where no key and no sink
    assert (lse[~finite] == math.inf).all()
    assert torch.allclose(lse[finite], expected[finite], rtol=1e-3, atol=2e-2)
    if sinks is not None and (~visible_keys(problem, q.device).any(dim=1)).any():
        blind = ~visible_keys(problem, q.device).any(dim=1)
        want = (sinks / math.log(2.0))[None, :, None].expand_as(lse)[:, :, blind]
        assert torch.allclose(lse[:, :, blind], want)


# -- the family's case, plan and launcher ----------------------------------------------------------
def test_the_family_case_passes_its_sinks():
    problem = _problem(513, 513, causal=True, window_left=64, sinks=True, softcap=30.0)
    case = FORWARD.case(problem, torch.cuda.current_device())
    assert case.sinks is not None
    schedule = _schedule(problem, None)
    assert case.error(case.launcher(schedule)) <= FORWARD.tolerance(problem)


def test_the_plan_launches_with_and_without_sinks():
    from tiledattention.core import _plans
    from tiledattention.kernels.forward._plan import forward_plan

    _plans.bind_torch()
    device = torch.cuda.current_device()
    for problem in (_problem(333, 333, causal=True, window_left=30, sinks=True),
                    _problem(333, 333, causal=True)):
        q, k, v, sinks = _inputs(problem, seed=5)
        plan = forward_plan(problem, _schedule(problem, None), device, None)
        plan = plan.for_torch(q, None, k, v)
        out = plan.run(None, q, k, v, device, None, sinks=sinks)
        torch.cuda.synchronize()
        _check(problem, out, q, k, v, sinks)


def test_forward_with_lse_passes_sinks():
    problem = _problem(300, 300, causal=True, sinks=True, window_left=50)
    q, k, v, sinks = _inputs(problem, seed=7)
    out = torch.full_like(q, float("nan"))
    stats = torch.empty(row_stat_shape(problem), device="cuda")[:, :, :problem.seqlen_q]
    FORWARD.forward_with_lse(torch.cuda.current_stream(), q, k, v, out, stats, problem,
                             _schedule(problem, None), default_scale(problem),
                             torch.cuda.current_device(), sinks=sinks)
    torch.cuda.synchronize()
    _check(problem, out, q, k, v, sinks)
    expected = _reference_lse(problem, q, k, sinks)
    assert torch.allclose(stats, expected, rtol=1e-3, atol=2e-2)
