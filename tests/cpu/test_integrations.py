"""tiledattention.integrations on the CPU: the custom op's registration, fake-tensor shapes,
compile/export tracing, training through the op, the SDPA router's decisions and restoring
(calls that require grad included), and the transformers backend (training included).

No GPU here, so the kernel call (``tiledattention.sdpa``) is replaced by a float32 torch
reference with the kernel's contract (``enable_gqa`` semantics, top-left ``is_causal``), the
training entry points (``sdpa_with_lse`` / ``sdpa_backward``) by the stand-ins of
``test_autograd`` (``training`` fixture), and the router's accepted device types are widened to
CPU where a test needs calls to reach the op. More on autograd: ``test_autograd.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import tiledattention
import tiledattention.integrations as ti
from tiledattention import InputValueError
from tiledattention.integrations import _router
from tiledattention import Problem
from tiledattention.core._problem import causal_flags, variant_args
from tiledattention.core._reference import attention_reference

from .test_autograd import TrainingKernels, install_training_kernels, torch_grads

TORCH_SDPA = _router._TORCH_SDPA  # PyTorch's own function, whatever the router does


def reference_sdpa(q, k, v, causal=False, scale=None, *, schedule=None):
    """The kernel's contract in float32 torch math (GQA heads grouped like enable_gqa);
    ``causal="bottom_right"``: lower-right aligned, rows that see no key are zeros."""
    group = q.shape[1] // k.shape[1]
    k32 = k.float().repeat_interleave(group, dim=1)
    v32 = v.float().repeat_interleave(group, dim=1)
    if causal == "bottom_right":
        sq, sk = q.shape[2], k.shape[2]
        keep = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
        seen = keep.any(dim=1)
        keep[~seen, 0] = True
        out = TORCH_SDPA(q.float(), k32, v32, attn_mask=keep, scale=scale)
        out = out.masked_fill(~seen[:, None], 0.0)
    else:
        out = TORCH_SDPA(q.float(), k32, v32, is_causal=bool(causal), scale=scale)
    return out.to(q.dtype).contiguous()


class KernelCalls:
    """Stands in for tiledattention.sdpa and records its calls."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.keep_scratch: list[bool] = []  # each call's sdpa(keep_scratch=)

    def __call__(self, q, k, v, causal=False, scale=None, *, schedule=None, keep_scratch=True,
                 window=None, softcap=None, sinks=None, ranges=None):
        call = {"q": tuple(q.shape), "k": tuple(k.shape), "causal": causal, "scale": scale,
                "dtype": q.dtype}
        variant = {name: value for name, value in (("window", window), ("softcap", softcap),
                                                   ("sinks", sinks), ("ranges", ranges))
                   if value is not None}
        self.calls.append({**call, **variant})
        self.keep_scratch.append(keep_scratch)
        if ranges is not None:
            return ranges_reference(q, k, v, causal, scale, ranges, window, softcap, sinks)
        if variant:
            return variant_reference(q, k, v, causal, scale, window, softcap, sinks)
        return reference_sdpa(q, k, v, causal, scale)


def ranges_reference(q, k, v, causal, scale, ranges, window, softcap, sinks):
    """``sdpa(..., ranges=)``'s result by the reference, entry by entry within its ranges;
    rows outside their entry's query range are zeros."""
    out = torch.zeros_like(q)
    for b, (q0, q1, k0, k1) in enumerate(ranges.T.tolist()):
        if q1 > q0 and k1 > k0:
            out[b:b + 1, :, q0:q1] = variant_reference(
                q[b:b + 1, :, q0:q1], k[b:b + 1, :, k0:k1], v[b:b + 1, :, k0:k1], causal,
                scale, window, softcap, sinks)
    return out


def variant_reference(q, k, v, causal, scale, window, softcap, sinks):
    """The float32 reference of a call with a window, a softcap or sinks, in q's dtype."""
    is_causal, bottom_right = causal_flags(causal)
    left, right, cap = variant_args(window, softcap)
    problem = Problem(batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1],
                      seqlen_q=q.shape[2], seqlen_k=k.shape[2], head_dim=q.shape[3],
                      dtype="bf16", causal=is_causal, bottom_right=bottom_right,
                      window_left=left, window_right=right, softcap=cap,
                      sinks=sinks is not None)
    return attention_reference(q, k, v, problem, scale, sinks).to(q.dtype)


@pytest.fixture
def kernel(monkeypatch) -> KernelCalls:
    calls = KernelCalls()
    monkeypatch.setattr(tiledattention, "sdpa", calls)
    return calls


@pytest.fixture
def training(monkeypatch) -> TrainingKernels:
    return install_training_kernels(monkeypatch)


@pytest.fixture
def cpu_is_kernel_device(monkeypatch):
    """Let the router and the HF backend send CPU calls to the op (which calls ``kernel``)."""
    monkeypatch.setattr(_router, "KERNEL_DEVICE_TYPES", ("cpu",))


pytestmark = pytest.mark.usefixtures("router_off")


def qkv(b=2, hq=4, hkv=4, sq=17, sk=17, d=64, dtype=torch.bfloat16, device="cpu", seed=0,
        requires_grad=False):
    gen = torch.Generator().manual_seed(seed)

    def make(h, s):
        return torch.randn(b, h, s, d, generator=gen).to(dtype=dtype, device=device)

    q, k, v = make(hq, sq), make(hkv, sk), make(hkv, sk)
    if requires_grad:
        for x in (q, k, v):
            x.requires_grad_(True)
    return q, k, v


# ---------------------------------------------------------------------------------- the op

def test_op_is_registered_with_its_schema():
    op = torch.ops.tiledattention.sdpa_fwd.default
    schema = str(op._schema)
    assert schema.startswith("tiledattention::sdpa_fwd(")
    assert ("Tensor q, Tensor k, Tensor v, bool causal, float? scale, bool bottom_right=False, "
            "SymInt window_left=-1, SymInt window_right=-1, float softcap=0., "
            "Tensor? sinks=None) -> Tensor") in schema
    assert ti.OP_NAME == "tiledattention::sdpa_fwd"


def test_import_tiledattention_does_not_import_integrations_or_transformers():
    code = ("import sys, tiledattention; "
            "bad = [m for m in ('tiledattention.integrations', 'transformers') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    code = ("import sys, tiledattention.integrations; "
            "sys.exit(1 if 'transformers' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, "importing the integrations must not import transformers"


SHAPES = {
    "mha": (2, 8, 8, 128, 128, 64),
    "gqa": (2, 8, 2, 113, 113, 128),
    "mqa": (1, 6, 1, 17, 17, 96),
    "sq<sk": (3, 4, 4, 1, 1000, 64),
    "sq>sk": (1, 4, 2, 300, 17, 256),
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fake_cuda_tensors_propagate_shape_without_running_the_kernel(shape, dtype, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the kernel ran while tracing")

    monkeypatch.setattr(tiledattention, "sdpa", must_not_run)
    b, hq, hkv, sq, sk, d = shape
    with FakeTensorMode():
        q = torch.empty(b, hq, sq, d, dtype=dtype, device="cuda")
        k = torch.empty(b, hkv, sk, d, dtype=dtype, device="cuda")
        v = torch.empty(b, hkv, sk, d, dtype=dtype, device="cuda")
        out = ti.attention(q, k, v, causal=True, scale=0.1)
        assert out.shape == (b, hq, sq, d)
        assert out.dtype == dtype
        assert out.device.type == "cuda"
        assert out.is_contiguous()


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_meta_tensors_propagate_shape(shape):
    b, hq, hkv, sq, sk, d = shape
    # non-contiguous q: the output is still a fresh contiguous tensor
    q = torch.empty(b, sq, hq, d, dtype=torch.float16, device="meta").transpose(1, 2)
    k = torch.empty(b, hkv, sk, d, dtype=torch.float16, device="meta")
    out = torch.ops.tiledattention.sdpa_fwd(q, k, k, False, None)
    assert out.shape == (b, hq, sq, d) and out.dtype == torch.float16 and out.is_contiguous()


def test_fake_impl_rejects_bad_shapes_while_tracing():
    q = torch.empty(2, 4, 8, 64, device="meta")
    with pytest.raises(InputValueError, match="v must have the shape of k"):
        ti.attention(q, q, q[:, :2])
    with pytest.raises(InputValueError, match="k must have 4 dims"):
        ti.attention(q, q[0], q)


def test_without_a_cuda_tensor_the_kernel_says_what_is_wrong():
    q, k, v = qkv()
    with pytest.raises(InputValueError, match="must be a CUDA tensor"):
        ti.attention(q, k, v)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_op_calls_the_kernel_with_its_arguments(shape, causal, kernel):
    b, hq, hkv, sq, sk, d = shape
    q, k, v = qkv(b, hq, hkv, sq, sk, d)
    out = ti.attention(q, k, v, causal=causal, scale=0.25)
    assert kernel.calls == [{"q": (b, hq, sq, d), "k": (b, hkv, sk, d), "causal": causal,
                             "scale": 0.25, "dtype": torch.bfloat16}]
    assert torch.equal(out, reference_sdpa(q, k, v, causal, 0.25))


class Recording(TorchDispatchMode):
    """A dispatch mode (what make_fx, export and FLOP counters use) that records the ops it
    sees in ``ops``."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_untraced_eager_calls_skip_the_ops_dispatch(kernel, monkeypatch):
    """Without a gradient and with nothing tracing, attention runs the kernel directly; a
    dispatch mode (what make_fx, export and FLOP counters use) still sees the op."""
    q, k, v = qkv(2, 4, 2, 17, 17, 64)
    real_op = torch.ops.tiledattention.sdpa_fwd

    def op_must_not_run(*args):
        raise AssertionError("the op was dispatched for an untraced eager call")

    monkeypatch.setattr(torch.ops.tiledattention, "sdpa_fwd", op_must_not_run)
    out = ti.attention(q, k, v, causal="bottom_right", scale=0.5)
    assert kernel.calls[-1]["causal"] == "bottom_right" and kernel.calls[-1]["scale"] == 0.5
    assert kernel.keep_scratch[-1] is True  # eager: the runtime's kept buffers
    assert torch.equal(out, reference_sdpa(q, k, v, "bottom_right", 0.5))
    with pytest.raises(InputValueError, match="v must have the shape of k"):
        ti.attention(q, k, v[:, :1])
    monkeypatch.setattr(torch.ops.tiledattention, "sdpa_fwd", real_op)

    with Recording() as seen:
        traced = ti.attention(q, k, v, causal=True)
    assert torch.ops.tiledattention.sdpa_fwd.default in seen.ops
    assert torch.equal(traced, reference_sdpa(q, k, v, True, None))
    # the op keeps no scratch buffer between calls: CUDA graph trees would find it in the pool
    assert kernel.keep_scratch[-1] is False


def test_untraced_training_calls_take_the_eager_route(monkeypatch):
    """With a gradient to compute (the SDPA router's and Hugging Face's training path): eagerly,
    the eager route's autograd Function and no op dispatched; under a dispatch mode the op,
    which the mode sees."""
    from tiledattention.entry_points import _training

    def forward(runtime, q, k, v, causal, scale, *, schedule=None, variant=(None,) * 3):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        return out, out.float().logsumexp(-1)
    monkeypatch.setattr(_training, "training_forward",
                        lambda *args, **kwargs: (*forward(*args, **kwargs), None))
    q, k, v = (torch.randn(2, 4, 16, 8).requires_grad_() for _ in range(3))
    real = torch.ops.tiledattention.sdpa_fwd_lse

    def op_must_not_run(*args):
        raise AssertionError("the op was dispatched for an untraced eager call")
    monkeypatch.setattr(torch.ops.tiledattention, "sdpa_fwd_lse", op_must_not_run)
    for kwargs in ({"causal": True}, {"causal": True, "window": (4, 0), "softcap": 5.0}):
        out = ti.attention(q, k, v, **kwargs)
        assert type(out.grad_fn).__name__ == "_EagerForwardLseBackward"
    monkeypatch.setattr(torch.ops.tiledattention, "sdpa_fwd_lse", real)
    with Recording() as seen:
        ti.attention(q, k, v, causal=True)
    assert torch.ops.tiledattention.sdpa_fwd_lse.default in seen.ops


def test_opcheck(kernel):
    q, k, v = qkv(1, 4, 2, 9, 13, 32, dtype=torch.float16)
    torch.library.opcheck(torch.ops.tiledattention.sdpa_fwd.default, (q, k, v, True, None))
    torch.library.opcheck(torch.ops.tiledattention.sdpa_fwd.default, (q, k, v, False, 0.5))


def test_backward_through_the_op_runs_the_training_kernels(kernel, training):
    q, k, v = qkv(hq=4, hkv=2, requires_grad=True)
    out = ti.attention(q, k, v, causal=True)
    assert out.requires_grad
    assert kernel.calls == [] and len(training.forwards) == 1  # the forward that keeps the lse
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad_out.to(out.dtype))
    assert len(training.backwards) == 1
    _, dq, dk, dv = torch_grads(q, k, v, True, None, grad_out.to(out.dtype))
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        assert got.shape == want.shape
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


class Block(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.proj = torch.nn.Linear(d, d, dtype=torch.bfloat16)

    def forward(self, q, k, v):
        return self.proj(ti.attention(q, k, v, causal=True)).relu()


def test_compile_fullgraph_traces_the_op(kernel):
    model = Block()
    q, k, v = qkv(2, 4, 2, 17, 17, 64)
    with torch.no_grad():
        eager = model(q, k, v)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(q, k, v)
    assert torch.equal(compiled, eager)
    assert len(kernel.calls) == 2  # one eager, one from the compiled graph


def test_export_keeps_the_op_in_the_graph(kernel):
    q, k, v = qkv(2, 4, 2, 17, 17, 64)
    exported = torch.export.export(Block().eval(), (q, k, v))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert torch.ops.tiledattention.sdpa_fwd.default in targets
    kernel.calls.clear()
    with torch.no_grad():
        out = exported.module()(q, k, v)
    assert len(kernel.calls) == 1
    assert out.shape == (2, 4, 17, 64)


# ------------------------------------------------------------------------- route_decision

def _case(**overrides):
    args = dict(q=qkv()[0], k=qkv()[1], v=qkv()[2], attn_mask=None, dropout_p=0.0,
                enable_gqa=False)
    args.update(overrides)
    return args


def _decide(args, *, device_types=("cpu",), scale=None):
    return ti.route_decision(args["q"], args["k"], args["v"], args["attn_mask"],
                             args["dropout_p"], args["enable_gqa"], scale=scale,
                             device_types=device_types)


def _gqa(hq, hkv, enable):
    q, k, v = qkv(hq=hq, hkv=hkv)
    return _case(q=q, k=k, v=v, enable_gqa=enable)


CASES = {
    # (arguments, device types accepted, scale): expected
    "supported": ((_case(), ("cpu",), None), None),
    "fp16": ((_case(**dict(zip("qkv", qkv(dtype=torch.float16)))), ("cpu",), None), None),
    "gqa-enabled": ((_gqa(8, 2, True), ("cpu",), None), None),
    "sq!=sk": ((_case(**dict(zip("qkv", qkv(sq=1, sk=100)))), ("cpu",), None), None),
    "head_dim-40": ((_case(**dict(zip("qkv", qkv(d=40)))), ("cpu",), None), None),
    "scale": ((_case(), ("cpu",), 0.3), None),
    "attn_mask": ((_case(attn_mask=torch.ones(17, 17, dtype=torch.bool)), ("cpu",), None),
                  "attn_mask"),
    "dropout": ((_case(dropout_p=0.1), ("cpu",), None), "dropout"),
    "cpu": ((_case(), ("cuda",), None), "cpu"),
    "meta": ((_case(**dict(zip("qkv", qkv(device="meta")))), ("cuda",), None), "device"),
    "mixed-devices": ((_case(k=qkv(device="meta")[1]), ("cpu", "meta"), None), "device"),
    "fp32": ((_case(**dict(zip("qkv", qkv(dtype=torch.float32)))), ("cpu",), None), "dtype"),
    "mixed-dtypes": ((_case(v=qkv(dtype=torch.float16)[2]), ("cpu",), None), "dtype"),
    "3d": ((_case(**{n: x[0] for n, x in zip("qkv", qkv())}), ("cpu",), None), "ndim"),
    "requires-grad": ((_case(**dict(zip("qkv", qkv(requires_grad=True)))), ("cpu",), None),
                      None),
    "layout": ((_case(q=qkv(d=64)[0].transpose(2, 3).contiguous().transpose(2, 3)), ("cpu",),
                None), "layout"),
    "k!=v": ((_case(v=qkv(sk=9)[2]), ("cpu",), None), "shape"),
    "batch": ((_case(q=qkv(b=3)[0]), ("cpu",), None), "shape"),
    "empty": ((_case(**dict(zip("qkv", qkv(sq=0, sk=0)))), ("cpu",), None), "shape"),
    "head_dim-16": ((_case(**dict(zip("qkv", qkv(d=16)))), ("cpu",), None), "head_dim"),
    "head_dim-264": ((_case(**dict(zip("qkv", qkv(d=264)))), ("cpu",), None), "head_dim"),
    "head_dim-36": ((_case(**dict(zip("qkv", qkv(d=36)))), ("cpu",), None), "head_dim"),
    "gqa-not-enabled": ((_gqa(8, 2, False), ("cpu",), None), "gqa"),
    "gqa-not-a-multiple": ((_gqa(6, 4, True), ("cpu",), None), "gqa"),
    "scale-negative": ((_case(), ("cpu",), -1.0), "scale"),
}


@pytest.mark.parametrize("case,expected", CASES.values(), ids=CASES.keys())
def test_route_decision(case, expected):
    args, device_types, scale = case
    assert _decide(args, device_types=device_types, scale=scale) == expected
    assert expected is None or expected in ti.FALLBACK_REASONS


def test_route_decision_takes_inputs_that_require_grad_in_any_grad_mode():
    """The backward kernels run whatever the forward runs: grad is no reason to fall back."""
    args = _case(**dict(zip("qkv", qkv(requires_grad=True))))
    with torch.no_grad():
        assert _decide(args) is None
    assert _decide(args) is None
    assert "grad" not in ti.FALLBACK_REASONS
    # what torch's backward would need and the kernel lacks still falls back, with grad too
    assert _decide({**args, "dropout_p": 0.1}) == "dropout"
    assert _decide({**args, "attn_mask": torch.ones(17, 17, dtype=torch.bool)}) == "attn_mask"


def test_route_decision_defaults_to_cuda_only():
    with FakeTensorMode():
        q = torch.empty(2, 8, 33, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 2, 33, 128, dtype=torch.bfloat16, device="cuda")
        assert ti.route_decision(q, k, k, None, 0.0, True) is None
        assert ti.route_decision(q, k, k, None, 0.0, False) == "gqa"
    q, k, v = qkv()
    assert ti.route_decision(q, k, v, None, 0.0, False) == "cpu"


def test_checks_come_in_the_documented_order():
    """A call failing several checks reports the first in FALLBACK_REASONS."""
    q, k, v = qkv(dtype=torch.float32, d=16)
    mask = torch.ones(17, 17, dtype=torch.bool)
    assert ti.route_decision(q, k, v, mask, 0.5, False) == "attn_mask"
    assert ti.route_decision(q, k, v, None, 0.5, False) == "dropout"
    assert ti.route_decision(q, k, v, None, 0.0, False) == "cpu"
    assert ti.route_decision(q, k, v, None, 0.0, False, device_types=("cpu",)) == "dtype"


# ---------------------------------------------------------------------------------- router

def test_router_replaces_and_restores_sdpa():
    assert not ti.is_enabled()
    with ti.sdpa_kernel():
        assert ti.is_enabled()
        assert F.scaled_dot_product_attention is not TORCH_SDPA
        assert torch.nn.functional.scaled_dot_product_attention is F.scaled_dot_product_attention
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_router_restores_sdpa_on_exception():
    with pytest.raises(KeyError, match="boom"):
        with ti.sdpa_kernel():
            raise KeyError("boom")
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_router_nests():
    with ti.sdpa_kernel():
        routed = F.scaled_dot_product_attention
        with ti.sdpa_kernel():
            assert F.scaled_dot_product_attention is routed
        assert F.scaled_dot_product_attention is routed  # the inner block leaves it on
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_enable_disable_are_idempotent_and_blocks_leave_enable_on():
    ti.enable()
    ti.enable()
    routed = F.scaled_dot_product_attention
    with ti.sdpa_kernel():
        pass
    assert F.scaled_dot_product_attention is routed
    ti.disable()
    ti.disable()
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_router_restores_a_function_patched_before_it(monkeypatch):
    def someone_elses(*args, **kwargs):
        return TORCH_SDPA(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", someone_elses)
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(*qkv())
    assert torch.equal(out, TORCH_SDPA(*qkv()))
    assert F.scaled_dot_product_attention is someone_elses


CPU_CALLS = {
    "plain": (qkv(), {}),
    "causal-scale": (qkv(sq=9, sk=30), {"is_causal": True, "scale": 0.2}),
    "mask": (qkv(dtype=torch.float32), {"attn_mask": torch.randn(17, 17)}),
    "gqa": (qkv(hq=8, hkv=2, dtype=torch.float16), {"enable_gqa": True}),
}


@pytest.mark.parametrize("args,kwargs", CPU_CALLS.values(), ids=CPU_CALLS.keys())
def test_router_gives_cpu_calls_to_torch_unchanged(args, kwargs, kernel):
    expected = TORCH_SDPA(*args, **kwargs)
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(*args, **kwargs)
    assert torch.equal(out, expected)
    assert kernel.calls == []
    stats = ti.router_stats()
    assert stats.tiledattention == 0 and stats.torch == 1
    assert stats.fallbacks == {"attn_mask" if "attn_mask" in kwargs else "cpu": 1}


def test_router_sends_supported_calls_to_the_op(kernel, cpu_is_kernel_device):
    q, k, v = qkv(hq=8, hkv=2, sq=9, sk=30)
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2, enable_gqa=True)
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, enable_gqa=True)
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(9, 30, dtype=torch.bool),
                                       enable_gqa=True)
    assert [(c["causal"], c["scale"]) for c in kernel.calls] == [(True, 0.2), (False, None)]
    assert torch.equal(out, reference_sdpa(q, k, v, True, 0.2))
    stats = ti.router_stats()
    assert (stats.tiledattention, stats.torch) == (2, 2)
    assert stats.fallbacks == {"dropout": 1, "attn_mask": 1}
    ti.reset_router_stats()
    assert ti.router_stats() == ti.RouterStats(tiledattention=0, torch=0, fallbacks={})


def test_router_trains_through_the_kernels(kernel, training, cpu_is_kernel_device):
    q, k, v = qkv(hq=8, hkv=2, requires_grad=True)
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.float().square().sum().backward()
        # dropout is torch's, also in training
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, enable_gqa=True)
    assert kernel.calls == []  # no plain forward: the one that keeps the lse
    assert len(training.forwards) == 1 and len(training.backwards) == 1
    stats = ti.router_stats()
    assert (stats.tiledattention, stats.fallbacks) == (1, {"dropout": 1})
    _, dq, dk, dv = torch_grads(q, k, v, True, None, 2 * out.detach().float())
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        assert got.shape == want.shape
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


def test_router_under_compile_fullgraph_trains(kernel, training, cpu_is_kernel_device):
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()

    q, k, v = qkv(dtype=torch.float16, requires_grad=True)
    with ti.sdpa_kernel():
        torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v).backward()
    assert len(training.forwards) == 1 and len(training.backwards) == 1
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_router_under_compile_fullgraph(kernel, cpu_is_kernel_device):
    def f(q, k, v, mask):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return a + b

    q, k, v = qkv()
    mask = torch.rand(17, 17) > 0.3
    mask[:, 0] = True
    expected = reference_sdpa(q, k, v, True) + TORCH_SDPA(q, k, v, attn_mask=mask)
    with ti.sdpa_kernel():
        out = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, mask)
    assert len(kernel.calls) == 1 and kernel.calls[0]["causal"] is True
    assert torch.equal(out, expected)


# ---------------------------------------------------------------------------- transformers

def tiny_llama(attn_implementation: str, dtype=torch.bfloat16):
    transformers = pytest.importorskip("transformers")
    ti.register_hf()
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,  # 16 is below the kernel's 32
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation)
    return model.to(dtype).eval()


def test_register_hf_makes_the_name_known():
    transformers = pytest.importorskip("transformers")
    ti.register_hf()
    ti.register_hf()  # idempotent
    assert ti.ATTN_IMPLEMENTATION in transformers.AttentionInterface._global_mapping
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert ALL_MASK_ATTENTION_FUNCTIONS[ti.ATTN_IMPLEMENTATION] is ti._hf.tiledattention_mask
    model = tiny_llama("tiledattention")
    assert model.config._attn_implementation == "tiledattention"


def test_hf_llama_logits_match_sdpa(kernel, cpu_is_kernel_device):
    mine, theirs = tiny_llama("tiledattention"), tiny_llama("sdpa")
    ids = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = mine(ids).logits
        expected = theirs(ids).logits
    # every layer ran the kernel: causal, GQA heads passed unrepeated, [B, H, S, D] layout
    assert kernel.calls == [{"q": (2, 4, 33, 32), "k": (2, 2, 33, 32), "causal": True,
                             "scale": 32 ** -0.5, "dtype": torch.bfloat16}] * 2
    assert ti.hf_stats().tiledattention == 2 and ti.hf_stats().torch == 0
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.95


def test_hf_llama_logits_wrong_without_causal_would_be_caught(kernel, cpu_is_kernel_device,
                                                              monkeypatch):
    """Guards the test above: a kernel that ignored ``causal`` changes the logits."""
    theirs = tiny_llama("sdpa")
    ids = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(tiledattention, "sdpa",
                        lambda q, k, v, causal=False, scale=None, **kw: reference_sdpa(
                            q, k, v, False, scale))
    mine = tiny_llama("tiledattention")
    with torch.no_grad():
        got, expected = mine(ids).logits, theirs(ids).logits
    assert not torch.allclose(got, expected, rtol=2e-2, atol=2e-2)


def test_hf_padding_mask_runs_as_ranges_and_other_masks_go_to_sdpa(kernel,
                                                                    cpu_is_kernel_device):
    mine, theirs = tiny_llama("tiledattention"), tiny_llama("sdpa")
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :5] = 0  # left padding: each entry's keys one range
    with torch.no_grad():
        got = mine(ids, attention_mask=mask).logits
        expected = theirs(ids, attention_mask=mask).logits
    assert len(kernel.calls) == 2 and ti.hf_stats().fallbacks == {}
    assert kernel.calls[0]["ranges"].tolist() == [[0, 5], [20, 20], [0, 5], [20, 20]]
    valid = mask.bool()  # the padded positions' own outputs are nobody's business
    assert torch.allclose(got[valid], expected[valid], atol=3e-2, rtol=3e-2)
    ti.reset_hf_stats()
    mask[0, 7] = 0  # a hole: no range expresses it
    with torch.no_grad():
        got = mine(ids, attention_mask=mask).logits
        expected = theirs(ids, attention_mask=mask).logits
    assert ti.hf_stats().fallbacks == {"attn_mask": 2}
    assert torch.equal(got, expected)


def test_hf_generate_matches_sdpa(kernel, cpu_is_kernel_device):
    mine, theirs = tiny_llama("tiledattention"), tiny_llama("sdpa")
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        got = mine.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        expected = theirs.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    assert got.shape == (1, 18)
    assert torch.equal(got, expected)
    # prefill is causal over 12 tokens; each decode step is one query over the whole cache
    prefill = [c for c in kernel.calls if c["q"][2] == 12]
    decode = [c for c in kernel.calls if c["q"][2] == 1]
    assert prefill and all(c["causal"] and c["k"][2] == 12 for c in prefill)
    assert decode and all(not c["causal"] for c in decode)
    assert sorted({c["k"][2] for c in decode}) == list(range(13, 18))


def test_hf_static_cache_generate_runs_every_call_as_ranges(kernel, cpu_is_kernel_device):
    """A static cache's buffer runs past the queries (its unfilled slots are padding) and its
    layers give the query offset as a tensor: the prefill and every decode step of a
    left-padded batch still run the kernel, each entry from its first valid key to the
    queries' end, and generate sdpa's tokens."""
    mine, theirs = tiny_llama("tiledattention"), tiny_llama("sdpa")
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0,
                  cache_implementation="static")
    with torch.no_grad():
        got = mine.generate(ids, attention_mask=mask, **kwargs)
        assert torch.equal(got, theirs.generate(ids, attention_mask=mask, **kwargs))
    assert ti.hf_stats().fallbacks == {} and len(kernel.calls) == 12
    buffer = kernel.calls[0]["k"][2]
    assert buffer >= 17 and all(c["k"][2] == buffer for c in kernel.calls)
    assert kernel.calls[0]["ranges"].tolist() == [[0, 3], [12, 12], [0, 3], [12, 12]]
    ends = [c["ranges"][3].tolist() for c in kernel.calls if c["q"][2] == 1]
    assert ends == [[n, n] for n in range(13, 18) for _ in range(2)]


def _static_decode(model, ids, mask, compiled, steps=4):
    """A prefill of ``ids`` into a static cache of 40 slots, then ``steps`` greedy decode steps
    (``torch.compile(fullgraph=True, backend="aot_eager")`` where ``compiled``): their
    last-position logits, ``[steps, B, vocab]`` float32."""
    transformers = pytest.importorskip("transformers")
    cache = transformers.StaticCache(config=model.config, max_cache_len=40)
    length = ids.shape[1]
    with torch.no_grad():
        out = model(ids, attention_mask=mask[:, :length], past_key_values=cache,
                    cache_position=torch.arange(length))
        step = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
        logits = []
        for position in range(length, length + steps):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            out = step(token, attention_mask=mask[:, :position + 1], past_key_values=cache,
                       cache_position=torch.tensor([position]))
            logits.append(out.logits[:, -1].float())
    return torch.stack(logits)


def test_hf_compiled_static_cache_decode_runs_the_ranges_op(kernel, cpu_is_kernel_device):
    """Compiled, the decode step's mask cannot be read on the host: its ranges are found on the
    device and the step runs ``tiledattention::sdpa_ranges_fwd`` in one graph, matching sdpa's
    logits; an entry whose keys have a hole comes out NaN, the others as before."""
    mine, theirs = tiny_llama("tiledattention"), tiny_llama("sdpa")
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, :3] = 0
    got = _static_decode(mine, ids, mask, compiled=True)
    torch.testing.assert_close(got, _static_decode(theirs, ids, mask, compiled=False),
                               rtol=2e-2, atol=2e-2)
    decode = [c for c in kernel.calls if c["q"][2] == 1]
    assert len(decode) == 8 and ti.hf_stats().fallbacks == {}
    assert decode[-1]["ranges"].tolist() == [[0, 0], [1, 1], [0, 3], [16, 16]]
    mask[0, 5] = 0  # a hole in entry 0's keys: no range expresses it
    holed = _static_decode(mine, ids, mask, compiled=True)
    assert torch.isnan(holed[:, 0]).all() and not torch.isnan(holed[:, 1]).any()
    torch.testing.assert_close(holed[:, 1], got[:, 1], rtol=2e-2, atol=2e-2)
    # eagerly the host reads the mask: the holed steps go to transformers, exactly
    ti.reset_hf_stats()
    eager = _static_decode(mine, ids, mask, compiled=False)
    assert ti.hf_stats().fallbacks == {"attn_mask": 10}  # the prefill holds the hole too
    torch.testing.assert_close(eager, _static_decode(theirs, ids, mask, compiled=False),
                               rtol=2e-2, atol=2e-2)


def test_the_ranges_op_is_registered_with_its_schema_and_fake():
    schema = str(torch.ops.tiledattention.sdpa_ranges_fwd.default._schema)
    assert schema.startswith("tiledattention::sdpa_ranges_fwd(Tensor q, Tensor k, Tensor v, "
                             "Tensor ranges, float? scale")
    with FakeTensorMode():
        q, k, v = qkv(hq=8, hkv=2, sq=1, sk=40)
        out = torch.ops.tiledattention.sdpa_ranges_fwd(
            q, k, v, torch.zeros(4, 2, dtype=torch.int32), None)
    assert out.shape == q.shape and out.dtype == q.dtype
    with FakeTensorMode(), pytest.raises(InputValueError, match=r"ranges must be an int32 "
                                         r"tensor \[4, B\] = \[4, 2\]"):
        q, k, v = qkv(hq=8, hkv=2, sq=1, sk=40)
        torch.ops.tiledattention.sdpa_ranges_fwd(q, k, v, torch.zeros(4, 3, dtype=torch.int32),
                                                 None)


def test_the_ranges_op_refuses_inputs_that_need_a_gradient_when_called():
    """The ranges op has no autograd: in grad mode, with an input that requires grad, the call
    itself is refused with the runtime's error (not a backward that fails later)."""
    from tiledattention import UnsupportedOperationError

    q, k, v = qkv(hq=8, hkv=2, sq=1, sk=40)
    ranges = torch.tensor([[0, 0], [1, 1], [0, 3], [40, 40]], dtype=torch.int32)
    with pytest.raises(UnsupportedOperationError, match="ranges= has no autograd"):
        ti.ranged_attention(q.requires_grad_(), k, v, ranges)


def test_hf_training_runs_the_kernels(kernel, training, cpu_is_kernel_device):
    mine = tiny_llama("tiledattention").train()  # bf16, the same weights
    theirs = tiny_llama("sdpa").train()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(4))
    loss = mine(ids, labels=ids).loss
    loss.backward()
    expected = theirs(ids, labels=ids).loss
    expected.backward()
    assert kernel.calls == []
    assert [(f["q"], f["k"], f["causal"]) for f in training.forwards] == [
        ((2, 4, 16, 32), (2, 2, 16, 32), True)] * 2  # GQA heads unrepeated, causal
    assert len(training.backwards) == 2
    stats = ti.hf_stats()
    assert (stats.tiledattention, stats.torch) == (2, 0)
    # two bf16 models that differ in attention rounding only
    torch.testing.assert_close(loss, expected, rtol=1e-2, atol=1e-2)
    for (name, p), q in zip(mine.named_parameters(), theirs.parameters()):
        err = (torch.linalg.vector_norm(p.grad.float() - q.grad.float())
               / torch.linalg.vector_norm(q.grad.float())).item()
        assert err <= 3e-2, f"{name}: rel L2 {err:.2e}"


def test_hf_mixed_precision_training_runs_the_kernels(kernel, training, cpu_is_kernel_device):
    """Under torch.autocast the rotary embedding hands attention float32 queries and keys and
    bf16 values; torch's SDPA computes in bf16 there, and so does the kernel."""
    mine = tiny_llama("tiledattention", dtype=torch.float32).train()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = mine(ids, labels=ids, use_cache=False).loss
    loss.backward()
    assert ti.hf_stats().tiledattention == 2 and ti.hf_stats().torch == 0
    assert len(training.forwards) == 2 and len(training.backwards) == 2
    weight = mine.model.layers[0].self_attn.q_proj.weight
    assert weight.dtype == torch.float32 and weight.grad is not None
    assert torch.isfinite(weight.grad).all() and weight.grad.abs().max() > 0


def test_router_and_op_compute_in_autocasts_dtype(kernel, cpu_is_kernel_device):
    q, k, v = qkv(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ti.attention(q, k, v, causal=True)
        with ti.sdpa_kernel():
            routed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert [c["dtype"] for c in kernel.calls] == [torch.bfloat16] * 2
    assert out.dtype == routed.dtype == torch.bfloat16
    assert ti.router_stats().tiledattention == 1
    with ti.sdpa_kernel():  # autocast off: float32 is torch's business
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert ti.router_stats().fallbacks == {"dtype": 1} and len(kernel.calls) == 2


def test_hf_training_with_attention_dropout_goes_to_sdpa(kernel, training,
                                                         cpu_is_kernel_device):
    transformers = pytest.importorskip("transformers")
    ti.register_hf()
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_dropout=0.1)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="tiledattention").to(torch.bfloat16).train()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(4))
    model(ids, labels=ids).loss.backward()
    assert kernel.calls == [] and training.forwards == []
    assert ti.hf_stats().fallbacks == {"dropout": 2}
    assert model.model.layers[0].self_attn.q_proj.weight.grad is not None


def tiny_model(kind: str, attn_implementation: str):
    """A two-layer model of ``kind`` with small random weights: "mistral" (a sliding window of
    8 keys on every layer), "gemma2" (a window of 8 on alternate layers, softcap 5), "gpt_oss"
    (a window of 8 on alternate layers, sinks)."""
    transformers = pytest.importorskip("transformers")
    ti.register_hf()
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=256, sliding_window=8)
    if kind == "mistral":
        config = transformers.MistralConfig(**common)
    elif kind == "gemma2":
        config = transformers.Gemma2Config(**common, attn_logit_softcapping=5.0,
                                           query_pre_attn_scalar=32)
    else:
        config = transformers.GptOssConfig(**common, num_local_experts=2,
                                           num_experts_per_tok=1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation)
    if kind == "gpt_oss":  # sinks large enough to matter
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.sinks, mean=1.0)
    return model.to(torch.bfloat16).eval()


@pytest.mark.parametrize("kind", ["mistral", "gemma2", "gpt_oss"])
def test_hf_routes_windows_softcap_and_sinks_to_the_kernel(kind, kernel, cpu_is_kernel_device):
    """Every attention call of these models runs the kernel (no fallback), with the layer's
    window as (W - 1, 0), its softcap and its sinks; the logits match the eager model's, in
    the prefill and in a decode step over the cache (bottom-right: the window slides)."""
    mine, theirs = tiny_model(kind, "tiledattention"), tiny_model(kind, "eager")
    ids = torch.randint(0, 128, (2, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, expected = mine(ids[:, :20]), theirs(ids[:, :20])
        torch.testing.assert_close(got.logits, expected.logits, rtol=3e-2, atol=3e-2)
        step = mine(ids[:, 20:], past_key_values=got.past_key_values).logits
        want = theirs(ids[:, 20:], past_key_values=expected.past_key_values).logits
    torch.testing.assert_close(step, want, rtol=3e-2, atol=3e-2)
    assert ti.hf_stats().torch == 0, ti.hf_stats()
    assert ti.hf_stats().tiledattention == 4
    windowed = [c for c in kernel.calls if "window" in c]
    assert windowed and all(c["window"] == (7, 0) for c in windowed)
    assert len(windowed) == (4 if kind == "mistral" else 2)
    assert any(c["q"][2] == 1 and c["causal"] == "bottom_right" for c in windowed)
    assert all((c.get("softcap") == 5.0) == (kind == "gemma2") for c in kernel.calls)
    assert all(("sinks" in c) == (kind == "gpt_oss") for c in kernel.calls)


@pytest.mark.parametrize("kind", ["mistral", "gemma2", "gpt_oss"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_hf_static_cache_sliding_layers_decode_as_ranges(kind, compiled, kernel,
                                                         cpu_is_kernel_device):
    """A static cache's sliding layers (a buffer of the window's 8 slots, rolled once full)
    run every decode step on the kernel, compiled too, as ranges found from the mask, which
    holds the window (no window passed besides): while the buffer fills (entry 1 left-padded by
    2) and after it rolls (its padding leaving the window one step later); the logits match
    the eager model's."""
    mine, theirs = tiny_model(kind, "tiledattention"), tiny_model(kind, "eager")
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, :2] = 0
    got = _static_decode(mine, ids, mask, compiled=compiled, steps=6)
    torch.testing.assert_close(got, _static_decode(theirs, ids, mask, compiled=False, steps=6),
                               rtol=3e-2, atol=3e-2)
    assert ti.hf_stats().fallbacks == {}
    decode = [c for c in kernel.calls if c["q"][2] == 1]
    assert len(decode) == 12 and all("window" not in c and "ranges" in c for c in decode)
    sliding = [c["ranges"][2:].tolist() for c in decode if c["k"][2] == 8]
    # positions 5-7 fill the buffer; at 8 it holds positions 1-8 (1 padding entry 1's), at 9
    # and on the last 8; each step once a sliding layer (mistral's two, the others' one)
    layers = 2 if kind == "mistral" else 1
    steps = [[[0, 2], [n + 1, n + 1]] for n in (5, 6, 7)] + [[[0, 1], [8, 8]]] + [
        [[0, 0], [8, 8]]] * 2
    assert sliding == [ranges for ranges in steps for _ in range(layers)]


def test_hf_gemma2_generate_routes_unless_the_prompt_holds_the_pad_token(kernel,
                                                                          cpu_is_kernel_device):
    """Gemma 2's ``generate()`` from a prompt longer than its window runs every attention call
    (prefill and each decode step, local and global layers) in the kernel, and its greedy
    tokens are eager's. Gemma 2's ``pad_token_id`` is 0: a prompt holding token 0 and no
    ``attention_mask`` makes ``generate`` infer one (``_prepare_attention_mask_for_generation``)
    that masks that key, so every call whose keys hold it, correctly, goes to transformers
    (``attn_mask``); an explicit all-ones ``attention_mask`` routes them again."""
    mine, theirs = tiny_model("gemma2", "tiledattention"), tiny_model("gemma2", "eager")
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(5))
    kwargs = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)

    def generate(prompt, **more):
        ti.reset_hf_stats()
        kernel.calls.clear()
        with torch.no_grad():
            got = mine.generate(prompt, **kwargs, **more)
            stats = ti.hf_stats()
            assert torch.equal(got, theirs.generate(prompt, **kwargs, **more))
        return stats

    stats = generate(ids)  # 4 forwards (the prefill, 3 decode steps) of 2 layers
    assert (stats.tiledattention, stats.torch) == (8, 0), stats
    windowed = [c for c in kernel.calls if "window" in c]
    assert len(windowed) == 4 and all(c["window"] == (7, 0) for c in windowed)
    assert [c["k"][2] for c in windowed] == [20, 8, 8, 8]  # the sliding layer keeps 8 keys
    padded = ids.clone()
    padded[0, 13] = mine.generation_config.pad_token_id
    assert padded[0, 13] == 0
    stats = generate(padded)
    # the global layer sees key 13 in every call, a hole in its keys: transformers runs it. The
    # sliding one sees it until it leaves the window: in the prefill as a hole; for query 20
    # (keys 13..20 in its window) as the first key, which the kernel runs as a range
    # (sdpa(ranges=)); queries 21 and 22 see keys 14.. and 15..: no padding at all
    assert (stats.tiledattention, stats.fallbacks) == (3, {"attn_mask": 5}), stats
    assert [(c["q"][2], c["k"][2], "ranges" in c) for c in kernel.calls] == [
        (1, 8, True), (1, 8, False), (1, 8, False)]
    stats = generate(padded, attention_mask=torch.ones_like(padded))
    assert (stats.tiledattention, stats.torch) == (8, 0), stats


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_hf_left_padded_batch_generate_runs_every_call_as_ranges(kind, kernel,
                                                                 cpu_is_kernel_device):
    """``generate()`` on a batch of prompts of different lengths (left padding, an attention
    mask) runs every attention call, prefill and decode steps, in the kernel with per-entry
    ranges, and its greedy tokens are eager's; a mask with a hole in the middle (not padding)
    still goes to transformers."""
    if kind == "llama":
        mine, theirs = tiny_llama("tiledattention"), tiny_llama("eager")
    else:
        mine, theirs = tiny_model(kind, "tiledattention"), tiny_model(kind, "eager")
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 128, (3, 14), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding: entry 1 has 9 tokens, entry 2 has 1
    mask[2, :13] = 0
    ids = ids.masked_fill(mask == 0, 0)
    kwargs = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, attention_mask=mask,
                  pad_token_id=0)
    ti.reset_hf_stats()
    with torch.no_grad():
        got = mine.generate(ids, **kwargs)
        stats = ti.hf_stats()
        assert torch.equal(got, theirs.generate(ids, **kwargs))
    assert (stats.tiledattention, stats.torch) == (8, 0), stats
    assert all("ranges" in c and c["causal"] == "bottom_right" for c in kernel.calls)
    first = kernel.calls[0]["ranges"]  # the prefill's: rows and keys from each entry's first
    assert first.tolist() == [[0, 5, 13], [14, 14, 14], [0, 5, 13], [14, 14, 14]]
    holed = mask.clone()
    holed[0, 6] = 0  # not padding: a hole
    ti.reset_hf_stats()
    with torch.no_grad():
        mine(ids, attention_mask=holed)
    assert ti.hf_stats().tiledattention == 0 and ti.hf_stats().fallbacks == {"attn_mask": 2}


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_hf_padding_free_training_runs_every_call_on_varlen_attn(kind, monkeypatch,
                                                                 cpu_is_kernel_device):
    """transformers' padding-free batches (``DataCollatorWithFlattening``: one row of sequences
    end to end, ``cu_seq_lens_q/k`` and ``max_length_q/k``) run every attention call on
    ``tiledattention.varlen_attn`` (a float32 reference stands in for the kernel), forward and
    backward, and give the loss and gradients of eager on the same sequences as a padded batch
    (eager itself on the packed row lets sequences attend to each other: it has no packed
    path)."""
    transformers = pytest.importorskip("transformers")
    from tiledattention.tooling import varlen_reference

    calls = []

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal=False, scale=None,
               window_size=(-1, -1), enable_gqa=False):
        calls.append((tuple(q.shape), cu_q.tolist(), max_q, is_causal, window_size))
        group = q.shape[1] // k.shape[1]
        return varlen_reference(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                cu_q, cu_k, causal=is_causal, scale=scale,
                                window=window_size).to(q.dtype)
    monkeypatch.setattr(tiledattention, "varlen_attn", varlen)
    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(3, 128, (n,), generator=gen) for n in (11, 4, 17)]
    packed = collate([{"input_ids": s.tolist()} for s in seqs])
    ids = torch.zeros(3, 17, dtype=torch.long)
    mask = torch.zeros(3, 17, dtype=torch.long)
    for i, s in enumerate(seqs):  # the same sequences right-padded
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    padded = dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    models = {}
    for name, batch in (("tiledattention", packed), ("eager", padded)):
        model = tiny_llama(name) if kind == "llama" else tiny_model(kind, name)
        model.train()
        loss = model(**batch).loss
        loss.backward()
        models[name] = (loss.detach(), model.model.layers[0].self_attn.q_proj.weight.grad)
    assert ti.hf_stats().tiledattention == 2 and not ti.hf_stats().fallbacks
    assert len(calls) == 2 and all(c[1] == [0, 11, 15, 32] and c[2] == 17 for c in calls)
    assert all(c[4] == ((7, 0) if kind == "mistral" else (-1, -1)) for c in calls)
    (mine, g_mine), (theirs, g_theirs) = models["tiledattention"], models["eager"]
    assert abs(mine.item() - theirs.item()) < 1e-2
    assert rel_l2_cpu(g_mine, g_theirs) < 5e-2


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_hf_packed_call_keeps_one_offsets_tensor_one(monkeypatch, dtype):
    """The packed call converts the offsets to int32 once when queries and keys share one
    tensor, so ``varlen_attn`` still sees one (the bucket it takes depends on it); two stay
    two."""
    from tiledattention.integrations._hf import _packed_call

    seen = []

    def varlen(q, k, v, cu_q, cu_k, *args, **kwargs):
        seen.append((cu_k is cu_q, cu_q.dtype, cu_k.dtype))
        return q
    monkeypatch.setattr(tiledattention, "varlen_attn", varlen)
    q, k = torch.randn(1, 4, 10, 8), torch.randn(1, 2, 10, 8)
    cu = torch.tensor([0, 4, 10], dtype=dtype)
    for cu_k in (cu, cu.clone()):
        _packed_call(q, k, k, True, None, dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu_k,
                                               max_length_q=6, max_length_k=6))
    assert seen == [(True, torch.int32, torch.int32), (False, torch.int32, torch.int32)]


def rel_l2_cpu(a, b):
    return (torch.linalg.vector_norm(a.float() - b.float())
            / torch.linalg.vector_norm(b.float())).item()


def test_hf_window_mask_is_left_out_only_when_the_window_is_all_it_holds():
    pytest.importorskip("transformers")
    from tiledattention.integrations._hf import tiledattention_mask

    plain = dict(batch_size=2, q_length=5, kv_length=12, q_offset=7, kv_offset=0,
                 local_size=4)
    assert tiledattention_mask(**plain) is None
    padded = torch.ones(2, 12, dtype=torch.bool)
    padded[0, 0] = False
    assert tiledattention_mask(**plain, attention_mask=padded) is not None
    assert tiledattention_mask(**{**plain, "q_offset": 0}) is not None  # a static cache
    assert tiledattention_mask(**plain, allow_is_causal_skip=False) is not None


# ------------------------------------------------------- causal alignment: the op and CausalBias

try:
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left
except ImportError:  # pragma: no cover - torch without bias objects
    causal_lower_right = causal_upper_left = None

needs_bias = pytest.mark.skipif(causal_lower_right is None,
                                reason="this torch has no torch.nn.attention.bias")


@pytest.mark.parametrize("causal,expected", [(False, False), (True, True), (1, True),
                                             ("top_left", True), ("bottom_right", "bottom_right")])
def test_op_passes_the_alignment_to_the_kernel(causal, expected, kernel):
    q, k, v = qkv(1, 4, 2, 9, 30, 64)
    out = ti.attention(q, k, v, causal=causal)
    assert [c["causal"] for c in kernel.calls] == [expected]
    assert torch.equal(out, reference_sdpa(q, k, v, expected))


def test_op_rejects_a_bad_alignment():
    q = torch.empty(1, 4, 9, 64, device="meta")
    with pytest.raises(InputValueError, match="causal"):
        ti.attention(q, q, q, causal="lower_right")
    with pytest.raises(InputValueError, match="bottom_right=True needs causal=True"):
        torch.ops.tiledattention.sdpa_fwd(q, q, q, False, None, True)


def test_fake_bottom_right_propagates_shape():
    with FakeTensorMode():
        q = torch.empty(2, 8, 16, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 2, 300, 64, dtype=torch.bfloat16, device="cuda")
        out = ti.attention(q, k, k, causal="bottom_right")
        assert out.shape == (2, 8, 16, 64) and out.dtype == torch.bfloat16


def test_opcheck_bottom_right(kernel):
    q, k, v = qkv(1, 4, 2, 9, 13, 32, dtype=torch.float16)
    torch.library.opcheck(torch.ops.tiledattention.sdpa_fwd.default, (q, k, v, True, None, True))
    q, k, v = qkv(1, 4, 2, 13, 9, 32, dtype=torch.float16)  # rows 0..3 see no key
    torch.library.opcheck(torch.ops.tiledattention.sdpa_fwd.default, (q, k, v, True, 0.5, True))


def test_compile_fullgraph_traces_bottom_right(kernel):
    def f(q, k, v):
        return ti.attention(q, k, v, causal="bottom_right") * 2

    q, k, v = qkv(2, 4, 2, 9, 30, 64)
    with torch.no_grad():
        out = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert [c["causal"] for c in kernel.calls] == ["bottom_right"]
    assert torch.equal(out, reference_sdpa(q, k, v, "bottom_right") * 2)


def _bias_case(make, sq, sk, **overrides):
    q, k, v = qkv(sq=sq, sk=sk)
    return _case(q=q, k=k, v=v, attn_mask=make(sq, sk), **overrides)


@needs_bias
@pytest.mark.filterwarnings("ignore:Lower right causal bias")
@pytest.mark.parametrize("variant", ["lower_right", "upper_left"])
def test_route_decision_takes_a_causal_bias_of_the_call_lengths(variant):
    make = causal_lower_right if variant == "lower_right" else causal_upper_left
    for sq, sk in ((9, 30), (30, 9), (17, 17), (1, 40)):
        assert _decide(_bias_case(make, sq, sk)) is None
    case = _bias_case(make, 9, 30)
    for bias in (make(9, 31), make(10, 30), make(30, 9)):
        assert _decide({**case, "attn_mask": bias}) == "causal_bias"
    assert ti.route_decision(case["q"], case["k"], case["v"], case["attn_mask"], 0.0, False,
                             is_causal=True, device_types=("cpu",)) == "causal_bias"
    # the checks before it still come first
    assert _decide({**case, "dropout_p": 0.1}) == "dropout"
    assert _decide(case, device_types=("cuda",)) == "cpu"
    assert "causal_bias" in ti.FALLBACK_REASONS
    order = ti.FALLBACK_REASONS
    assert order.index("shape") < order.index("causal_bias") < order.index("head_dim")


@needs_bias
@pytest.mark.filterwarnings("ignore:Lower right causal bias")
def test_causal_alignment_of_a_routed_call():
    assert _router.causal_alignment(causal_lower_right(9, 30), False) == "bottom_right"
    assert _router.causal_alignment(causal_upper_left(9, 30), False) is True
    assert _router.causal_alignment(None, True) is True
    assert _router.causal_alignment(None, False) is False


@needs_bias
@pytest.mark.filterwarnings("ignore:Lower right causal bias")
@pytest.mark.parametrize("variant", ["lower_right", "upper_left"])
@pytest.mark.parametrize("sq,sk", [(9, 30), (30, 9)])
def test_router_falls_back_to_torch_with_the_causal_bias_intact(variant, sq, sk, kernel):
    """torch's own result for a CausalBias call the router does not take (here: CPU tensors),
    routing on or off. Handed to torch's function as it is, the bias would be read as a plain
    (uninitialised) tensor: CausalBias.__torch_function__ dispatches only for the function that
    is torch.nn.functional.scaled_dot_product_attention, which the router replaced."""
    make = causal_lower_right if variant == "lower_right" else causal_upper_left
    q, k, v = qkv(2, 4, 4, sq, sk, 32, dtype=torch.float32, seed=sq)
    bias = make(sq, sk)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        scaled = F.scaled_dot_product_attention(q, k, v, bias, 0.0, False, 0.3)
    assert torch.equal(out.nan_to_num(7.0), expected.nan_to_num(7.0))  # torch: NaN rows, sq > sk
    assert torch.equal(scaled.nan_to_num(7.0),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                                      scale=0.3).nan_to_num(7.0))
    # the dispatch's call back into F.scaled_dot_product_attention is not counted again
    assert ti.router_stats().fallbacks == {"cpu": 2}
    assert kernel.calls == []
    materialised = bias._materialize()
    if sq <= sk:  # every row sees a key: the same as the explicit boolean mask
        torch.testing.assert_close(out, TORCH_SDPA(q, k, v, attn_mask=materialised))


@needs_bias
def test_router_falls_back_with_a_causal_bias_and_is_causal_like_torch():
    q, k, v = qkv(1, 2, 2, 9, 30, 32, dtype=torch.float32)
    with pytest.raises(ValueError, match="CausalBias should not be used with causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(9, 30),
                                       is_causal=True)
    with ti.sdpa_kernel(), pytest.raises(ValueError, match="causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(9, 30),
                                       is_causal=True)


@needs_bias
@pytest.mark.filterwarnings("ignore:Lower right causal bias")
def test_router_sends_a_causal_bias_to_the_op(kernel, cpu_is_kernel_device):
    q, k, v = qkv(hq=8, hkv=2, sq=9, sk=30)
    with ti.sdpa_kernel():
        lower = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(9, 30),
                                               scale=0.2, enable_gqa=True)
        upper = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_upper_left(9, 30),
                                               enable_gqa=True)
        # lengths that are not the call's: torch's business (here it cannot broadcast them)
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(8, 30),
                                           enable_gqa=True)
    assert [(c["causal"], c["scale"]) for c in kernel.calls] == [("bottom_right", 0.2),
                                                                 (True, None)]
    assert torch.equal(lower, reference_sdpa(q, k, v, "bottom_right", 0.2))
    assert torch.equal(upper, reference_sdpa(q, k, v, True))
    stats = ti.router_stats()
    assert (stats.tiledattention, stats.fallbacks) == (2, {"causal_bias": 1})


@needs_bias
def test_router_under_compile_fullgraph_with_causal_bias(kernel, cpu_is_kernel_device):
    bias = causal_lower_right(9, 30)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    q, k, v = qkv(sq=9, sk=30)
    with ti.sdpa_kernel():
        out = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert [c["causal"] for c in kernel.calls] == ["bottom_right"]
    assert torch.equal(out, reference_sdpa(q, k, v, "bottom_right"))
