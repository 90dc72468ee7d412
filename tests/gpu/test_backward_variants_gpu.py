"""The backward kernels' variants on the GPU: sliding windows, softcap and sinks, gradients against
autograd through the float32 reference (``tiledattention.core._reference.attention_reference``, which
applies window, softcap and sinks explicitly).

Inputs are random (never zeros); the gradient buffers, delta and the split partials are filled
with NaN before every launch; each gradient is compared by relative L2 error with the backward
family's tolerance (bf16 2e-2, fp16 1e-2), or by an absolute bound where the reference gradient
is zero (a row that sees a single key has dQ = 0 and gives its key dK = 0).

The kernels are tested on their own: the log-sum-exp they read is computed here in float32 from
the same definition (base 2, in units of scaled scores, the sink's term included, +inf for a row
that sees no key without sinks) and the output is the reference's, cast to the input dtype. One
test runs the family's own case, whose log-sum-exp comes from this project's forward.

Alignment: ``bottom_right`` shifts the causal mask and the window alike (row ``i``'s diagonal is
key ``i + S_k - S_q``; rows before ``S_q - S_k`` see no key when ``S_q > S_k``); without it
row ``i``'s diagonal is key ``i`` (torch's ``is_causal``).
"""

from __future__ import annotations

import math

import pytest
import torch

from tiledattention import BACKWARD, BackwardSchedule, Problem
from tiledattention.core._problem import default_scale, row_stat_shape
from tiledattention.core._reference import attention_reference, visible_keys
from tiledattention.kernels.backward._family import allocate_scratch
from tiledattention.kernels.backward._launch import launch, launches

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LOG2_E = 1.0 / math.log(2.0)


def _problem(sq, sk, *, causal=False, bottom_right=False, left=-1, right=-1, softcap=0.0,
             sinks=False, hq=4, hkv=4, d=64, dtype="bf16", batch=1) -> Problem:
    return Problem(batch=batch, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=dtype, causal=causal, bottom_right=bottom_right, window_left=left,
                   window_right=right, softcap=softcap, sinks=sinks)


#: (problem, factor q is scaled by, sink logit or None for random ones)
CASES = {
    # windows of one key (the diagonal only: zero dQ and dK) and of three
    "window-0-causal": (_problem(1025, 1025, causal=True, left=0), 1.0, None),
    "window-1-1": (_problem(1025, 1025, left=1, right=1, hq=8, hkv=2), 1.0, None),
    # a window longer than the sequence binds nothing (the canonical problem is plain)
    "window-past-the-length": (_problem(1025, 1025, causal=True, left=5000), 1.0, None),
    "window-just-binding": (_problem(1025, 1025, causal=True, left=1023), 1.0, None),
    # one-sided, without the causal mask
    "left-only": (_problem(1025, 1025, left=100, d=128), 1.0, None),
    "right-only": (_problem(1025, 1025, right=77, hq=8, hkv=1), 1.0, None),
    "two-sided-gqa": (_problem(1025, 1025, left=128, right=64, hq=8, hkv=2, d=96), 1.0, None),
    # S_q != S_k in both alignments
    "sq<sk-top-left": (_problem(300, 1000, causal=True, left=200, d=40), 1.0, None),
    "sq<sk-bottom-right": (_problem(300, 1000, causal=True, bottom_right=True, left=200), 1.0,
                           None),
    "sq>sk-bottom-right": (_problem(1000, 300, causal=True, bottom_right=True, left=50,
                                    hq=8, hkv=1), 1.0, None),
    "sq<sk-window-bottom-right": (_problem(513, 1025, bottom_right=True, left=64, right=32,
                                           dtype="fp16"), 1.0, None),
    "sq>sk-window-top-left": (_problem(1025, 257, left=20, right=40, hq=8, hkv=2), 1.0, None),
    # a softcap that binds: q scaled up so that scores reach several times the cap
    "softcap": (_problem(1025, 1025, softcap=5.0, hq=8, hkv=2, d=128), 8.0, None),
    "softcap-causal-fp16": (_problem(777, 777, causal=True, softcap=10.0, dtype="fp16"), 8.0,
                            None),
    # sinks (the kernels read them through the log-sum-exp only); one that dominates
    "sinks": (_problem(1025, 1025, causal=True, sinks=True, hq=8, hkv=2), 1.0, None),
    "sinks-dominate-window": (_problem(1025, 1025, causal=True, left=64, sinks=True), 1.0, 8.0),
    "sinks-rows-without-keys": (_problem(700, 300, causal=True, bottom_right=True, left=30,
                                         sinks=True, hq=8, hkv=1), 1.0, None),
    # everything together: multi-query heads, an odd head dim, bottom-right, two batches
    "all-mqa": (_problem(1025, 1100, causal=True, bottom_right=True, left=200, softcap=20.0,
                         sinks=True, hq=8, hkv=1, d=72, batch=2), 4.0, None),
    "all-band-fp16": (_problem(1025, 1025, left=33, right=65, softcap=15.0, sinks=True, hq=6,
                               hkv=2, dtype="fp16"), 4.0, None),
}

#: small tiles (many per window), the walk split over CTAs, and both work orders; and the
#: same split 16 ways with tall tiles; ``launches`` normalises them per problem
SCHEDULES = {
    "default": None,
    "small-split4": BackwardSchedule(dkdv_tile_n=32, dkdv_tile_m=16, dq_tile_m=16, dq_tile_n=32,
                                     dkdv_splits=4, dq_heavy_first=True, tile_major=True),
    "split16": BackwardSchedule(dkdv_tile_n=16, dkdv_tile_m=64, dq_tile_m=128, dq_tile_n=16,
                                dkdv_splits=16),
}


def _inputs(problem: Problem, q_factor: float, sink: float | None, seed: int = 7):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = DTYPES[problem.dtype]
    b, d = problem.batch, problem.head_dim

    def make(heads, seqlen):
        return torch.randn(b, heads, seqlen, d, device="cuda", dtype=dtype, generator=gen)

    q = (make(problem.heads_q, problem.seqlen_q).float() * q_factor).to(dtype)
    k, v = make(problem.heads_kv, problem.seqlen_k), make(problem.heads_kv, problem.seqlen_k)
    grad_out = make(problem.heads_q, problem.seqlen_q)
    sinks = None
    if problem.sinks:
        sinks = (torch.full((problem.heads_q,), sink, device="cuda") if sink is not None else
                 torch.randn(problem.heads_q, device="cuda", generator=gen) + 2.0)
    return q, k, v, grad_out, sinks


def reference_lse(q, k, problem: Problem, scale: float, sinks) -> torch.Tensor:
    """float32 ``[B, H_q, S_q]`` log-sum-exp the backward reads: base 2, of the scaled (capped)
    scores over the visible keys and the sink; +inf for a row with neither."""
    group = problem.heads_q // problem.heads_kv
    s = q.float() @ k.float().repeat_interleave(group, 1).transpose(-1, -2) * scale
    if problem.softcap > 0:
        s = problem.softcap * torch.tanh(s / problem.softcap)
    s = s.masked_fill(~visible_keys(problem, q.device), float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        s = torch.cat([s, sink], dim=-1)
    lse = torch.logsumexp(s, dim=-1) * LOG2_E
    return torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))


def reference_grads(q, k, v, grad_out, problem: Problem, scale: float, sinks):
    """The reference output (float32) and ``(dq, dk, dv)`` by autograd through it."""
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    with torch.enable_grad():
        out = attention_reference(*leaves, problem, scale, sinks=sinks)
        grads = torch.autograd.grad(out, leaves, grad_out.float())
    return out.detach(), grads


def run_backward(problem, schedule, q, k, v, out, grad_out, lse_values, scale):
    """dq, dk, dv from the backward kernels alone, every output and scratch buffer (gradients,
    delta, partials) NaN-poisoned first; the row statistics in padded storage as the runtime
    keeps them."""
    plan = launches(problem, schedule, scale)
    store = torch.full(row_stat_shape(problem), float("nan"), device="cuda")
    lse = store[:, :, :problem.seqlen_q]
    lse.copy_(lse_values)
    delta = torch.full_like(store, float("nan"))[:, :, :problem.seqlen_q]
    grads = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
    scratch = allocate_scratch(plan, q.device)
    for buffer in scratch.values():
        buffer.fill_(float("nan"))
    launch(torch.cuda.current_stream(), plan, q, k, v, out, grad_out, lse, delta, *grads,
           scratch)
    torch.cuda.synchronize()
    return grads


def check(grads, reference, problem: Problem, label: str) -> None:
    tolerance = BACKWARD.tolerance(problem)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, reference):
        assert torch.isfinite(got).all(), f"{label}: {name} has non-finite values"
        ref_norm = torch.linalg.vector_norm(ref).item()
        err = torch.linalg.vector_norm(got.float() - ref).item()
        if ref_norm <= 1e-4 * math.sqrt(ref.numel()):  # a zero gradient (one key a row)
            assert err <= 1e-2 * math.sqrt(ref.numel()), f"{label}: {name} abs err {err}"
        else:
            assert err / ref_norm <= tolerance, f"{label}: {name} rel err {err / ref_norm}"


def _device_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@pytest.mark.parametrize("schedule_name", sorted(SCHEDULES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_variant_gradients_against_the_fp32_reference(case, schedule_name):
    problem, q_factor, sink = CASES[case]
    schedule = SCHEDULES[schedule_name] or BACKWARD.default_schedule(_device_arch(), problem)
    scale = default_scale(problem)
    q, k, v, grad_out, sinks = _inputs(problem, q_factor, sink)
    out32, reference = reference_grads(q, k, v, grad_out, problem, scale, sinks)
    lse = reference_lse(q, k, problem, scale, sinks)
    grads = run_backward(problem, schedule, q, k, v, out32.to(q.dtype), grad_out, lse, scale)
    check(grads, reference, problem, f"{case} / {schedule_name}")


def test_the_softcap_binds_in_its_cases():
    """The softcap cases reach scores well past the cap (else they test nothing)."""
    for case in ("softcap", "softcap-causal-fp16"):
        problem, q_factor, sink = CASES[case]
        q, k, _, _, _ = _inputs(problem, q_factor, sink)
        group = problem.heads_q // problem.heads_kv
        raw = (q.float() @ k.float().repeat_interleave(group, 1).transpose(-1, -2)
               * default_scale(problem))
        assert raw.abs().max().item() > 3 * problem.softcap


def test_dominant_sinks_leave_small_but_exact_gradients():
    """With sink 8.0 most of each row's weight goes to the sink: the gradients are small, and
    still within tolerance of the reference relative to their own size."""
    problem, q_factor, sink = CASES["sinks-dominate-window"]
    scale = default_scale(problem)
    q, k, v, grad_out, sinks = _inputs(problem, q_factor, sink)
    out32, reference = reference_grads(q, k, v, grad_out, problem, scale, sinks)
    lse = reference_lse(q, k, problem, scale, sinks)
    assert (lse > 8.0 * LOG2_E - 1e-3).all()  # the sink's term dominates every row
    schedule = BACKWARD.default_schedule(_device_arch(), problem)
    grads = run_backward(problem, schedule, q, k, v, out32.to(q.dtype), grad_out, lse, scale)
    check(grads, reference, problem, "sinks-dominate-window")


def test_windowed_split_gradients_are_bitwise_identical_run_to_run():
    problem, q_factor, sink = CASES["all-mqa"]
    scale = default_scale(problem)
    q, k, v, grad_out, sinks = _inputs(problem, q_factor, sink)
    out32, _ = reference_grads(q, k, v, grad_out, problem, scale, sinks)
    lse = reference_lse(q, k, problem, scale, sinks)
    schedule = SCHEDULES["small-split4"]
    assert launches(problem, schedule, scale).splits == 4
    runs = [run_backward(problem, schedule, q, k, v, out32.to(q.dtype), grad_out, lse, scale)
            for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


@pytest.mark.parametrize("case", ["two-sided-gqa", "softcap", "all-mqa", "sinks"])
def test_family_case_with_the_forwards_log_sum_exp(case):
    """The family's own test case: the forward kernel's output and log-sum-exp (sinks
    included), then the backward, NaN-poisoned, against autograd through the reference."""
    problem = CASES[case][0]
    arch = _device_arch()
    bwd_case = BACKWARD.case(problem, torch.cuda.current_device())
    error = bwd_case.error(bwd_case.launcher(BACKWARD.default_schedule(arch, problem)))
    assert error <= BACKWARD.tolerance(problem), f"{case}: {error}"
