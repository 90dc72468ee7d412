"""The training calls' warm path (``entry_points/_training.py``) and the eager autograd route
(``entry_points/_autograd.py``): a repeated call reuses what the first one resolved, so it must
compute on the new call's data, layout and arguments exactly what a cold call does.

Every call here takes fresh random inputs (a warm call that kept anything of an earlier call's
data would fail), gradients are compared with autograd through the float32 reference, and the
warm result is compared bit for bit with a cold one (the runtime's memory cleared before it).
"""

from __future__ import annotations

import pytest
import torch

import tiledattention
from tiledattention.core._reference import attention_reference
from tiledattention.core._problem import problem_from_arrays
from tiledattention.entry_points import _autograd

pytestmark = pytest.mark.gpu

#: name -> (B, H_q, H_kv, S_q, S_k, D, dtype, sdpa keywords)
CASES = {
    "gqa-causal-odd": (2, 8, 2, 333, 333, 64, torch.bfloat16, dict(causal=True)),
    "mqa-full-fp16": (1, 6, 1, 200, 517, 128, torch.float16, dict(causal=False)),
    "bottom-right": (2, 4, 4, 131, 390, 96, torch.bfloat16, dict(causal="bottom_right")),
    "window-softcap-sinks": (1, 8, 2, 300, 300, 64, torch.bfloat16,
                             dict(causal=True, window=(64, 0), softcap=20.0, sinks=True)),
}
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 1.5e-2}


def _inputs(case: str, seed: int, layout: str = "contiguous"):
    b, hq, hkv, sq, sk, d, dtype, kwargs = CASES[case]
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(h: int, s: int) -> torch.Tensor:
        if layout == "bshd":  # [B, S, H, D] storage seen as [B, H, S, D]: other strides
            x = torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=gen)
            return x.transpose(1, 2).requires_grad_()
        return torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    q, k, v = make(hq, sq), make(hkv, sk), make(hkv, sk)
    kwargs = dict(kwargs)
    if kwargs.pop("sinks", False):
        kwargs["sinks"] = torch.randn(hq, device="cuda", generator=gen).requires_grad_()
    grad_out = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype, generator=gen)
    return q, k, v, kwargs, grad_out


def _ours(q, k, v, kwargs, grad_out):
    out = tiledattention.sdpa(q, k, v, **kwargs)
    leaves = [q, k, v] + ([kwargs["sinks"]] if "sinks" in kwargs else [])
    return (out, *torch.autograd.grad(out, leaves, grad_out))


def _reference(q, k, v, kwargs, grad_out):
    problem, _ = problem_from_arrays(q, k, v, kwargs.get("causal", False), None,
                                     kwargs.get("window"), kwargs.get("softcap"),
                                     kwargs.get("sinks"))
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    sinks = kwargs.get("sinks")
    if sinks is not None:
        leaves.append(sinks.detach().float().requires_grad_())
    out = attention_reference(*leaves[:3], problem, q.shape[-1] ** -0.5,
                              sinks=leaves[3] if sinks is not None else None)
    return (out, *torch.autograd.grad(out, leaves, grad_out.float()))


def _rel(got, ref) -> float:
    got = got.float()
    assert torch.isfinite(got).all()
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()


@pytest.mark.parametrize("case", sorted(CASES))
def test_warm_calls_compute_on_their_own_inputs(case):
    tiledattention.runtime().clear()
    dtype = CASES[case][6]
    for seed in range(4):  # the first call cold, the others warm, each on new data
        layout = "bshd" if seed == 2 else "contiguous"  # a new layout between warm calls
        q, k, v, kwargs, grad_out = _inputs(case, seed, layout)
        got = _ours(q, k, v, kwargs, grad_out)
        want = _reference(q, k, v, kwargs, grad_out)
        for name, g, w in zip(("out", "dq", "dk", "dv", "dsinks"), got, want):
            assert _rel(g, w) < TOLERANCE[dtype], (case, seed, name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_warm_call_is_bitwise_a_cold_call(case):
    q, k, v, kwargs, grad_out = _inputs(case, 11)
    tiledattention.runtime().clear()
    cold = _ours(q, k, v, kwargs, grad_out)
    warm = _ours(q, k, v, kwargs, grad_out)  # same data: the kept resolution
    for c, w in zip(cold, warm):
        assert torch.equal(c, w)


def test_the_warm_key_tells_scale_causal_and_dtype_apart():
    """Calls that differ in one argument the key holds (scale, the mask, the dtype) each get
    their own result, whichever came first."""
    tiledattention.runtime().clear()
    q, k, v, kwargs, grad_out = _inputs("gqa-causal-odd", 3)
    for variant in (dict(causal=True), dict(causal=False), dict(causal=True, scale=0.05),
                    dict(causal=True)):
        got = tiledattention.sdpa(q, k, v, **variant)
        problem, _ = problem_from_arrays(q, k, v, variant["causal"], variant.get("scale"))
        want = attention_reference(q.float(), k.float(), v.float(), problem,
                                   variant.get("scale", q.shape[-1] ** -0.5))
        assert _rel(got, want) < TOLERANCE[torch.bfloat16], variant
    half = [x.detach().half().requires_grad_() for x in (q, k, v)]
    got = _ours(*half, dict(causal=True), grad_out.half())
    want = _reference(*half, dict(causal=True), grad_out.half())
    for g, w in zip(got, want):
        assert _rel(g, w) < TOLERANCE[torch.float16]


def test_the_eager_route_and_the_custom_ops_agree_bitwise():
    """The eager autograd Function and the custom ops (what torch.compile traces) run the same
    implementation."""
    q, k, v, kwargs, grad_out = _inputs("gqa-causal-odd", 5)
    assert _autograd.eager(q, k, v)
    eager = _ours(q, k, v, kwargs, grad_out)
    out, lse = torch.ops.tiledattention.sdpa_fwd_lse(q, k, v, True, None)
    grads = torch.ops.tiledattention.sdpa_bwd(grad_out, q, k, v, out, lse, True, None)
    for a, b in zip(eager, (out, *grads)):
        assert torch.equal(a, b)


def test_a_compiled_training_step_runs_through_the_ops():
    q, k, v, kwargs, grad_out = _inputs("gqa-causal-odd", 6)

    def step(q, k, v):
        return tiledattention.sdpa(q, k, v, causal=True)
    compiled = torch.compile(step, fullgraph=True)
    got = compiled(q, k, v)
    grads = torch.autograd.grad(got, (q, k, v), grad_out)
    want = _reference(q, k, v, kwargs, grad_out)
    for g, w in zip((got, *grads), want):
        assert _rel(g, w) < TOLERANCE[torch.bfloat16]
