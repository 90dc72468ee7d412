"""The training calls' warm-path key and the eager autograd route, on the CPU (the GPU half:
``tests/gpu/test_training_warm_gpu.py``)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from tiledattention.entry_points import _autograd
from tiledattention.entry_points._training import _signature

NO_VARIANT = (None, None, None)


def _qkv(**kw):
    return tuple(torch.randn(2, 4, 16, 8, **kw) for _ in range(3))


def _key(q, k, v, causal=True, scale=None, variant=NO_VARIANT, schedule=None):
    return _signature("sdpa_with_lse", q, k, v, causal, scale, variant, schedule)


def test_the_key_holds_every_argument_the_first_call_judged():
    q, k, v = _qkv()
    base = _key(q, k, v)
    assert base == _key(*_qkv())  # same shapes and layouts, other data: the same key
    strided = torch.randn(2, 16, 4, 8).transpose(1, 2)
    others = [
        _key(strided, k, v),                                   # q's strides
        _key(q, k.half(), v),                                  # k's dtype
        _key(q, k, torch.randn(2, 4, 17, 8)),                  # v's shape
        _key(q, k, v, causal=1),                               # causal's type (1 == True)
        _key(q, k, v, causal="bottom_right"),
        _key(q, k, v, scale=1),                                # scale and its type
        _key(q, k, v, scale=1.0),
        _key(q, k, v, variant=((4, 0), None, None)),           # window
        _key(q, k, v, variant=(None, 20, None)),               # softcap and its type
        _key(q, k, v, variant=(None, 20.0, None)),
        _key(q, k, v, variant=(None, None, torch.zeros(4))),   # the sinks' layout
        _key(q, k, v, variant=(None, None, torch.zeros(4, dtype=torch.float16))),
        _signature("sdpa_backward", q, k, v, True, None, NO_VARIANT, None),
    ]
    assert len({base, *others}) == len(others) + 1


def test_arguments_without_a_key_take_the_validating_path():
    q, k, v = _qkv()
    assert _key(q, k, v, variant=([4, 0], None, None)) is None  # unhashable: validate
    assert _key(object(), k, v) is None                        # not a tensor (CuPy, junk)


def test_eager_means_plain_tensors_outside_any_tracing():
    q, k, v = _qkv()
    assert _autograd.eager(q, k, v, None)
    assert not _autograd.eager(q, k, torch.empty(2, 4, 16, 8, device="meta"))
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(q)
        assert not _autograd.eager(fake, k, v)

    class Watching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    with Watching():
        assert not _autograd.eager(q, k, v)
    seen = []

    def traced(x):
        seen.append((torch.jit.is_tracing(), _autograd.eager(x, k, v)))
        return x * 2
    torch.jit.trace(traced, q)  # (a deprecated tracer; it records ops, not launches)
    assert (True, False) in seen and all(tracing != eager for tracing, eager in seen)


def test_the_eager_route_computes_what_the_ops_compute(monkeypatch):
    """On CPU tensors, with the runtime's entry points replaced by stand-ins (as
    tests/cpu/test_autograd.py does), the eager Function and the custom ops pass the same
    arguments and give the same output and gradients."""
    from tiledattention.entry_points import _training

    def forward(runtime, q, k, v, causal, scale, *, schedule=None, variant=NO_VARIANT):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        return out, out.float().logsumexp(-1)

    def backward(runtime, grad_out, q, k, v, out, lse, causal, scale, *, variant=NO_VARIANT,
                 **_):  # arithmetic of every input: a route that wires one wrongly differs
        return grad_out * out + q, k + lse.sum(), v * 2 + grad_out.sum()
    monkeypatch.setattr(_training, "training_forward",
                        lambda *args, **kwargs: (*forward(*args, **kwargs), None))
    monkeypatch.setattr(_training, "sdpa_backward", backward)
    q, k, v = (x.requires_grad_() for x in _qkv())
    g = torch.randn(2, 4, 16, 8)
    results = []
    for route in ("eager", "ops"):
        monkeypatch.setattr(_autograd, "eager", lambda *t, r=route: r == "eager")
        out = _autograd.sdpa(q, k, v, causal=True)
        results.append((out, *torch.autograd.grad(out, (q, k, v), g)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


class _KeptBackward:
    """Stands in for a kept backward call: its gradients are arithmetic of every input."""

    def __init__(self):
        self.calls = 0

    def backward(self, grad_out, q, k, v, out, lse, grads, with_row_sums=False):
        assert grads is None and not with_row_sums
        self.calls += 1
        return grad_out * out + q, k + lse.sum(), v * 2 + grad_out.sum()


def test_a_repeated_backward_runs_the_forwards_kept_backward(monkeypatch):
    """The eager route's node resolves the backward once per kept forward call
    (``_training.backward_plan``) and then launches it directly; a gradient laid out otherwise
    than the output, sinks, a forward with no kept call and a traced backward take the general
    path (``_training.sdpa_backward``)."""
    from tiledattention.entry_points import _training

    kept = _training._Resolved(None, None, None, 1.0, 0)
    bwd = _KeptBackward()
    resolved, general = [], []

    def forward(runtime, q, k, v, causal, scale, *, schedule=None, variant=NO_VARIANT):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        return out, out.float().logsumexp(-1), None if variant[2] is not None else kept

    def backward_plan(runtime, grad_out, q, k, v, out, lse, causal, scale, *, variant):
        resolved.append(variant)
        return bwd

    def sdpa_backward(runtime, grad_out, q, k, v, out, lse, causal, scale, *,
                      variant=NO_VARIANT, **_):
        general.append(grad_out.stride())
        return grad_out * out + q, k + lse.sum(), v * 2 + grad_out.sum()
    monkeypatch.setattr(_training, "training_forward", forward)
    monkeypatch.setattr(_training, "backward_plan", backward_plan)
    monkeypatch.setattr(_training, "sdpa_backward", sdpa_backward)
    q, k, v = (x.requires_grad_() for x in _qkv())
    g = torch.randn(2, 4, 16, 8)
    first = torch.autograd.grad(_autograd.sdpa(q, k, v, causal=True), (q, k, v), g)
    second = torch.autograd.grad(_autograd.sdpa(q, k, v, causal=True), (q, k, v), g)
    assert len(resolved) == 1 and bwd.calls == 2 and not general
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    # the gradient of out.sum() is expanded (zero strides: the general path copies it dense);
    # a transposed one is not the output's layout either: the general path takes both
    torch.autograd.grad(_autograd.sdpa(q, k, v, causal=True).sum(), (q, k, v))
    transposed = torch.randn(2, 16, 4, 8).transpose(1, 2)
    torch.autograd.grad(_autograd.sdpa(q, k, v, causal=True), (q, k, v), transposed)
    assert general == [g.stride(), transposed.stride()] and bwd.calls == 2
    # sinks (no kept call from the stand-in, and the sinks' own gradient): the general path
    sinks = torch.zeros(4, requires_grad=True)
    monkeypatch.setattr(_autograd, "attention_grads",
                        lambda *a: (*sdpa_backward(None, *a[:6], None, None), None))
    torch.autograd.grad(_autograd.sdpa(q, k, v, causal=True, sinks=sinks), (q, k, v), g)
    assert len(general) == 3 and bwd.calls == 2 and len(resolved) == 1

    class Passthrough(TorchDispatchMode):  # a mode that records ops sees the backward
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    out = _autograd.sdpa(q, k, v, causal=True)  # a kept forward whose backward is resolved
    with Passthrough():
        torch.autograd.grad(out, (q, k, v), g)
    assert len(general) == 4 and bwd.calls == 2


@pytest.mark.parametrize("variant", [{}, {"window_left": 64, "softcap": 30.0, "sinks": True}])
def test_the_prepared_forward_launches_what_launch_with_lse_does(monkeypatch, variant):
    """A training call's kept forward (``Family.prepare_with_lse``, the forward family's
    prepared launch) passes ``launch_with_lse``'s grid, kernel and arguments, each call's own
    arrays in their places."""
    import cuda.tile

    from tiledattention import FORWARD, Problem
    from tiledattention.core import _device
    from tiledattention.core._device import DeviceInfo
    from tiledattention.kernels.forward._launch import launch_with_lse

    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(_device, "device_info",
                        lambda i: DeviceInfo(index=0, arch="sm_90", name="x", sm_count=132))
    problem = Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=333, seqlen_k=333, head_dim=64,
                      dtype="bf16", causal=True, **variant)
    schedule = FORWARD.default_schedule("sm_90", problem)
    run = FORWARD.prepare_with_lse(problem, schedule, 0.125, 0)
    for _ in range(2):
        q = torch.empty(2, 8, 333, 64, dtype=torch.bfloat16)
        k, v, out = torch.empty(2, 2, 333, 64), torch.empty(2, 2, 333, 64), torch.empty_like(q)
        lse, sinks = torch.empty(2, 8, 333), torch.empty(8) if problem.sinks else None
        run("stream", q, k, v, out, lse, sinks)
        launch_with_lse("stream", q, k, v, out, lse, problem,
                        FORWARD.normalise(problem, schedule), 0.125, 132, sinks=sinks)
        prepared, direct = calls.pop(0), calls.pop(0)
        assert prepared[:3] == direct[:3]
        assert len(prepared[3]) == len(direct[3])
        for a, b in zip(prepared[3], direct[3]):
            assert a is b or (not isinstance(a, torch.Tensor) and a == b)


@pytest.mark.parametrize("variant", [{}, {"window_left": 100, "softcap": 30.0},
                                     {"causal": False, "heads_kv": 8, "head_dim": 128}],
                         ids=["causal-gqa", "window-softcap", "full-mha-d128"])
@pytest.mark.parametrize("splits", [1, 4])
def test_the_prepared_backward_launches_what_the_familys_backward_does(monkeypatch, splits,
                                                                       variant):
    """A training call's kept backward (``BackwardFamily.prepare_backward``: an unsplit walk's
    argument tuples built once) launches the same kernels, grids and arguments as
    ``BACKWARD.backward`` (the float32 dK/dV partials of a split walk are each call's own),
    the variants' values and a tile-major grid included, and a one-pass schedule keeps asking
    ``backward`` (which honours torch's deterministic mode per call)."""
    import cuda.tile

    from tiledattention import BACKWARD, Problem

    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    fields = dict(batch=2, heads_q=8, heads_kv=2, seqlen_q=333, seqlen_k=333, head_dim=64,
                  dtype="bf16", causal=True)
    problem = Problem(**{**fields, **variant})
    schedule = BACKWARD.default_schedule("sm_90", problem).replace(dkdv_splits=splits,
                                                                   dq_mode="kernel")
    d, hkv = problem.head_dim, problem.heads_kv
    run = BACKWARD.prepare_backward(problem, schedule, 0.125)
    q, out, grad_out, dq = (torch.empty(2, 8, 333, d, dtype=torch.bfloat16) for _ in range(4))
    k, v, dk, dv = (torch.empty(2, hkv, 333, d, dtype=torch.bfloat16) for _ in range(4))
    lse, delta = torch.empty(2, 8, 333), torch.empty(2, 8, 333)
    run("stream", q, k, v, out, grad_out, lse, delta, (dq, dk, dv))
    prepared = list(calls)
    calls.clear()
    BACKWARD.backward("stream", problem, schedule, 0.125, q, k, v, out, grad_out, lse, delta,
                      (dq, dk, dv))
    splits = BACKWARD.normalise(problem, schedule).dkdv_splits
    assert len(prepared) == len(calls) == (2 if splits == 1 else 4)
    for a, b in zip(prepared, calls):
        assert a[:3] == b[:3] and len(a[3]) == len(b[3])
        for x, y in zip(a[3], b[3]):
            if isinstance(x, torch.Tensor) and x is not y:  # a split walk's partials
                assert x.dtype == y.dtype == torch.float32 and x.shape == y.shape
            else:
                assert x is y or x == y
    one_pass = schedule.replace(dq_mode="atomic", dkdv_splits=1)
    asked = []
    monkeypatch.setattr(type(BACKWARD), "backward", lambda self, *a, **k: asked.append(a))
    BACKWARD.prepare_backward(problem, one_pass, 0.125)("s", q, k, v, out, grad_out, lse, delta,
                                                         (dq, dk, dv))
    assert len(asked) == 1 and asked[0][2] is one_pass
