"""Autograd on the CPU: the training ops ``tiledattention::sdpa_fwd_lse`` / ``sdpa_bwd`` (schemas,
fake implementations, opcheck), which entry points take them (only calls that need a gradient),
what reaches the kernels (the forward's lse and out, dense gradients, the alignment, the scale, a
schedule), gradients through ``tiledattention.sdpa``, ``integrations.attention`` and the plain
``sdpa_fwd`` op, ``torch.compile(fullgraph=True)`` of forward and backward, and errors.

No GPU here: the kernel entry points (``tiledattention.sdpa_with_lse`` / ``sdpa_backward``, and
``tiledattention.sdpa``'s no-grad path) are replaced by float32 torch math with the kernels'
contract: a base-2 log-sum-exp in a strided view of row-aligned storage (``+inf`` for a row that
sees no key), and a backward computed from that lse (not by autograd), so a wrong or stale lse
gives wrong gradients. Gradients are compared with torch autograd through a float32 reference.
Causal alignments: ``True`` is torch's ``is_causal`` (top-left), ``"bottom_right"`` torch's
``causal_lower_right`` with rows that see no key returning zeros.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import tiledattention
import tiledattention.integrations as ti
from tiledattention import (DecodeSchedule, InputTypeError, InputValueError, Schedule,
                            TiledAttentionError, UnsupportedOperationError)
from tiledattention.entry_points import _autograd

LOG2E = 1.4426950408889634
ROW_ALIGN = 32  # tiledattention.kernels.backward._launch.ROW_STAT_ALIGN, as the kernels store rows
TORCH_SDPA = F.scaled_dot_product_attention


# ----------------------------------------------------------------------- stand-in kernels

def _keep(sq: int, sk: int, causal) -> torch.Tensor | None:
    """[S_q, S_k] bool mask of the keys each query row sees (``None``: all)."""
    if causal is False:
        return None
    offset = sk - sq if causal == "bottom_right" else 0
    return torch.ones(sq, sk, dtype=torch.bool).tril(offset)


def _scores(q, k, causal, scale):
    """float32 scaled scores ``[B, H_q, S_q, S_k]`` (masked keys at -inf) and the scale."""
    group = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q.float() @ k.float().repeat_interleave(group, 1).transpose(-1, -2) * scale
    keep = _keep(q.shape[2], k.shape[2], causal)
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    return s, scale


def reference_with_lse(q, k, v, causal=False, scale=None, *, schedule=None):
    """``sdpa_with_lse``'s contract in float32 math."""
    b, hq, sq, _ = q.shape
    s, _ = _scores(q, k, causal, scale)
    lse_e = torch.logsumexp(s, -1)  # -inf for a row that sees no key
    p = torch.exp(s - lse_e[..., None]).nan_to_num(0.0)
    out = (p @ v.float().repeat_interleave(hq // k.shape[1], 1)).to(q.dtype)
    store = torch.full((b, hq, -(-sq // ROW_ALIGN) * ROW_ALIGN), math.nan)
    lse = store[:, :, :sq]
    lse.copy_(torch.where(torch.isinf(lse_e), math.inf, lse_e * LOG2E))
    return out, lse


def reference_backward(grad_out, q, k, v, out, lse, causal=False, scale=None, *, schedule=None,
                       grads=None):
    """``sdpa_backward``'s contract: FlashAttention's backward from ``lse``, in float32."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    s, scale = _scores(q, k, causal, scale)
    p = torch.exp2(s * LOG2E - lse[..., None])  # 0 where masked or where lse is +inf
    g = grad_out.float()
    dv = p.transpose(-1, -2) @ g
    dp = g @ v.float().repeat_interleave(group, 1).transpose(-1, -2)
    delta = (g * out.float()).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    dq = ds @ k.float().repeat_interleave(group, 1) * scale
    dk = ds.transpose(-1, -2) @ q.float() * scale
    dk = dk.view(b, hkv, group, sk, d).sum(2)
    dv = dv.view(b, hkv, group, sk, d).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class TrainingKernels:
    """Stands in for ``tiledattention.sdpa_with_lse`` / ``sdpa_backward`` (and optionally the
    plain forward) and records what they were given."""

    def __init__(self) -> None:
        self.forwards: list[dict] = []
        self.backwards: list[dict] = []
        self.plain: list[dict] = []

    def sdpa_with_lse(self, q, k, v, causal=False, scale=None, *, schedule=None):
        out, lse = reference_with_lse(q, k, v, causal, scale)
        self.forwards.append({"q": tuple(q.shape), "k": tuple(k.shape), "causal": causal,
                              "scale": scale, "schedule": schedule, "out": out, "lse": lse})
        return out, lse

    def sdpa_backward(self, grad_out, q, k, v, out, lse, causal=False, scale=None, *,
                      schedule=None, grads=None):
        self.backwards.append({"causal": causal, "scale": scale, "out": out, "lse": lse,
                               "grad_strides": grad_out.stride(), "grad_shape": grad_out.shape})
        return reference_backward(grad_out, q, k, v, out, lse, causal, scale)

    def sdpa(self, q, k, v, causal=False, scale=None, *, window=None, softcap=None, sinks=None,
             schedule=None, out=None, keep_scratch=True):
        # a stand-in of plain attention: the variant arguments come as tiledattention.sdpa's
        # defaults
        assert (window, softcap, sinks) == (None, None, None)
        self.plain.append({"q": tuple(q.shape), "causal": causal, "scale": scale})
        result = reference_with_lse(q, k, v, causal, scale)[0]
        return result if out is None else out.copy_(result)


def install_training_kernels(monkeypatch) -> TrainingKernels:
    """Replace the training entry points, and ``tiledattention.sdpa``'s no-grad path
    (``_run_sdpa``; the op ``sdpa_fwd`` calls ``tiledattention.sdpa``), by stand-ins."""
    kernels = TrainingKernels()
    def with_lse(runtime, *args, variant=(None, None, None), **kwargs):
        assert variant == (None, None, None)
        return kernels.sdpa_with_lse(*args, **kwargs)

    def backward(runtime, *args, variant=(None, None, None), with_row_sums=False, **kwargs):
        assert variant == (None, None, None) and not with_row_sums  # (no sinks here)
        return kernels.sdpa_backward(*args, **kwargs)

    # the ops call the training entry points on the runtime (tiledattention.entry_points._training), not
    # the facade: replace both
    monkeypatch.setattr(tiledattention, "sdpa_with_lse", kernels.sdpa_with_lse)
    monkeypatch.setattr(tiledattention, "sdpa_backward", kernels.sdpa_backward)
    monkeypatch.setattr(tiledattention.entry_points._training, "sdpa_with_lse", with_lse)
    # (the ops and the eager route call this one: the forward and the kept call, none here)
    monkeypatch.setattr(tiledattention.entry_points._training, "training_forward",
                        lambda *args, **kwargs: (*with_lse(*args, **kwargs), None))
    monkeypatch.setattr(tiledattention.entry_points._training, "sdpa_backward", backward)
    monkeypatch.setattr(tiledattention, "_run_sdpa",
                        lambda runtime, *args, **kwargs: kernels.sdpa(*args, **kwargs))
    return kernels


@pytest.fixture
def training(monkeypatch) -> TrainingKernels:
    return install_training_kernels(monkeypatch)


def qkv(b=2, hq=4, hkv=2, sq=17, sk=17, d=32, dtype=torch.float32, seed=0,
        requires_grad=True):
    gen = torch.Generator().manual_seed(seed)

    def make(h, s):
        x = torch.randn(b, h, s, d, generator=gen).to(dtype)
        return x.requires_grad_(requires_grad)

    return make(hq, sq), make(hkv, sk), make(hkv, sk)


def torch_grads(q, k, v, causal, scale, grad_out):
    """float32 torch autograd through torch's SDPA (GQA heads repeated; bottom-right by an
    explicit mask, rows that see no key zeroed): ``(out, dq, dk, dv)``."""
    q32, k32, v32 = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = k32.repeat_interleave(group, 1), v32.repeat_interleave(group, 1)
    if causal == "bottom_right":
        keep = _keep(q.shape[2], k.shape[2], causal)
        seen = keep.any(1)
        keep[~seen, 0] = True
        out = TORCH_SDPA(q32, kr, vr, attn_mask=keep, scale=scale).masked_fill(~seen[:, None],
                                                                                0.0)
    else:
        out = TORCH_SDPA(q32, kr, vr, is_causal=bool(causal), scale=scale)
    out.backward(grad_out.float())
    return out.detach(), q32.grad, k32.grad, v32.grad


def assert_grads_match(q, k, v, causal, scale, grad_out, out, tol=1e-4):
    expected = torch_grads(q, k, v, causal, scale, grad_out)
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad),
                               expected):
        assert got is not None, f"{name}: no gradient"
        assert got.shape == want.shape, name
        err = (torch.linalg.vector_norm(got.float() - want)
               / torch.linalg.vector_norm(want).clamp_min(1e-30)).item()
        assert err <= tol, f"{name}: rel L2 {err:.2e}"


# ---------------------------------------------------------------------------------- the ops

def test_training_ops_are_registered_with_their_schemas():
    fwd = str(torch.ops.tiledattention.sdpa_fwd_lse.default._schema)
    variant = ("SymInt window_left=-1, SymInt window_right=-1, float softcap=0., "
               "Tensor? sinks=None) -> (")
    assert fwd.startswith("tiledattention::sdpa_fwd_lse(Tensor q, Tensor k, Tensor v, bool causal,"
                          " float? scale, bool bottom_right=False, str? schedule=None, "
                          + variant), fwd
    assert fwd.count("Tensor") == 6  # three inputs, the sinks, (out, lse)
    bwd = str(torch.ops.tiledattention.sdpa_bwd.default._schema)
    assert bwd.startswith("tiledattention::sdpa_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v,"
                          " Tensor out, Tensor lse, bool causal, float? scale, "
                          "bool bottom_right=False, " + variant), bwd
    assert bwd.count("Tensor") == 10
    assert ti.FWD_LSE_OP_NAME == "tiledattention::sdpa_fwd_lse"
    assert ti.BWD_OP_NAME == "tiledattention::sdpa_bwd"


def test_import_tiledattention_does_not_load_autograd():
    """The ops and torch's op machinery load with the first call that needs a gradient (or with
    the integrations), not with ``import tiledattention`` nor with a call that needs none."""
    code = ("import sys, torch, tiledattention\n"
            "q = torch.randn(1, 2, 5, 32, dtype=torch.bfloat16)\n"
            "try:\n"
            "    tiledattention.sdpa(q, q, q)\n"
            "except tiledattention.InputValueError:\n"
            "    pass\n"
            "sys.exit(1 if 'tiledattention.entry_points._autograd' in sys.modules else 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


SHAPES = {
    "mha": (2, 8, 8, 128, 128, 64),
    "gqa": (2, 8, 2, 113, 113, 128),
    "mqa": (1, 6, 1, 17, 17, 96),
    "sq<sk": (3, 4, 4, 1, 1000, 64),
    "sq>sk": (1, 4, 2, 300, 17, 256),
    "row-aligned": (1, 2, 2, 64, 64, 40),
}


def _qkv_on(device, shape, dtype, requires_grad=False):
    b, hq, hkv, sq, sk, d = shape
    q = torch.empty(b, hq, sq, d, dtype=dtype, device=device, requires_grad=requires_grad)
    k = torch.empty(b, hkv, sk, d, dtype=dtype, device=device, requires_grad=requires_grad)
    v = torch.empty(b, hkv, sk, d, dtype=dtype, device=device, requires_grad=requires_grad)
    return q, k, v


def _expected_lse_layout(b, hq, sq):
    padded = -(-sq // ROW_ALIGN) * ROW_ALIGN
    return (b, hq, sq), (hq * padded, padded, 1)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fakes_give_the_real_layouts_without_running_a_kernel(shape, dtype, monkeypatch):
    """Fake CUDA tensors (no autograd on them: a CPU-only torch cannot record CUDA nodes; the
    autograd formula is traced on meta tensors below and by torch.compile further down)."""
    def must_not_run(*args, **kwargs):
        raise AssertionError("a kernel ran while tracing")

    for name in ("sdpa", "sdpa_with_lse", "sdpa_backward"):
        monkeypatch.setattr(tiledattention, name, must_not_run)
    for name in ("sdpa_with_lse", "sdpa_backward"):
        monkeypatch.setattr(tiledattention.entry_points._training, name, must_not_run)
    b, hq, hkv, sq, sk, d = shape
    with FakeTensorMode():
        q, k, v = _qkv_on("cuda", shape, dtype)
        out, lse = torch.ops.tiledattention.sdpa_fwd_lse(q, k, v, True, 0.1, True)
        assert out.shape == (b, hq, sq, d) and out.dtype == dtype and out.is_contiguous()
        assert out.device.type == "cuda"
        assert (tuple(lse.shape), lse.stride()) == _expected_lse_layout(b, hq, sq)
        assert lse.dtype == torch.float32 and lse.device.type == "cuda"
        g = torch.empty_like(out)
        dq, dk, dv = torch.ops.tiledattention.sdpa_bwd(g, q, k, v, out, lse, True, 0.1, True)
        for grad, like in ((dq, q), (dk, k), (dv, v)):
            assert grad.shape == like.shape and grad.dtype == dtype and grad.is_contiguous()
            assert grad.device.type == "cuda"


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_meta_tensors_propagate_through_the_training_ops_and_autograd(shape):
    b, hq, hkv, sq, sk, d = shape
    q = torch.empty(b, sq, hq, d, dtype=torch.float16, device="meta").transpose(1, 2)
    k = torch.empty(b, hkv, sk, d, dtype=torch.float16, device="meta")
    out, lse = torch.ops.tiledattention.sdpa_fwd_lse(q, k, k, False, None)
    assert out.shape == (b, hq, sq, d) and out.is_contiguous()
    assert (tuple(lse.shape), lse.stride()) == _expected_lse_layout(b, hq, sq)
    dq, dk, dv = torch.ops.tiledattention.sdpa_bwd(out, q, k, k, out, lse, False, None)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
    # autograd: out differentiable, lse not; the backward formula runs sdpa_bwd's meta kernel
    q, k, v = _qkv_on("meta", shape, torch.bfloat16, requires_grad=True)
    out, lse = torch.ops.tiledattention.sdpa_fwd_lse(q, k, v, True, None, True)
    assert out.requires_grad and not lse.requires_grad
    grads = torch.autograd.grad(ti.attention(q, k, v, causal=True).sum(), (q, k, v))
    assert [(tuple(g.shape), g.dtype) for g in grads] == [
        (tuple(x.shape), torch.bfloat16) for x in (q, k, v)]


def test_fakes_reject_bad_shapes_and_flags_while_tracing():
    q = torch.empty(2, 4, 8, 64, device="meta")
    lse = torch.empty(2, 4, 8, device="meta")
    with pytest.raises(InputValueError, match="v must have the shape of k"):
        torch.ops.tiledattention.sdpa_fwd_lse(q, q, q[:, :2], False, None)
    with pytest.raises(InputValueError, match="k must have 4 dims"):
        torch.ops.tiledattention.sdpa_bwd(q, q, q[0], q, q, lse, False, None)
    with pytest.raises(InputValueError, match="bottom_right=True needs causal=True"):
        torch.ops.tiledattention.sdpa_fwd_lse(q, q, q, False, None, True)
    with pytest.raises(InputValueError, match="bottom_right=True needs causal=True"):
        torch.ops.tiledattention.sdpa_bwd(q, q, q, q, q, lse, False, None, True)


@pytest.mark.parametrize("causal,bottom_right", [(False, False), (True, False), (True, True)],
                         ids=["full", "top-left", "bottom-right"])
def test_opcheck_training_ops(causal, bottom_right, training):
    """torch.library.opcheck: schema, fake vs real (shapes, dtypes, strides), autograd
    registration, and AOT dispatch (forward and backward traced, dynamic shapes)."""
    q, k, v = qkv(1, 4, 2, 9, 13, 32, dtype=torch.float16)
    torch.library.opcheck(torch.ops.tiledattention.sdpa_fwd_lse.default,
                          (q, k, v, causal, None, bottom_right))
    q, k, v = qkv(1, 4, 2, 13, 9, 32, dtype=torch.float16, seed=1)  # bottom-right: empty rows
    out, lse = reference_with_lse(q.detach(), k.detach(), v.detach(),
                                  "bottom_right" if bottom_right else causal, 0.5)
    g = torch.randn_like(out)
    torch.library.opcheck(torch.ops.tiledattention.sdpa_bwd.default,
                          (g, q.detach(), k.detach(), v.detach(), out, lse, causal, 0.5,
                           bottom_right))


def test_opcheck_plain_forward_op_with_its_backward(training):
    q, k, v = qkv(1, 4, 2, 9, 13, 32, dtype=torch.float16)
    torch.library.opcheck(torch.ops.tiledattention.sdpa_fwd.default, (q, k, v, True, None))
    torch.library.opcheck(torch.ops.tiledattention.sdpa_fwd.default, (q, k, v, True, 0.5, True))


# ------------------------------------------------------------- which entry needs the lse

GRAD_MODES = {
    "no-input-requires-grad": (False, False, torch.enable_grad, False),
    "no_grad": (True, True, torch.no_grad, False),
    "inference_mode": (True, True, torch.inference_mode, False),
    "q-requires-grad": (True, False, torch.enable_grad, True),
    "only-k-v-require-grad": (False, True, torch.enable_grad, True),
}


def _inputs_for(q_grad, kv_grad):
    q, k, v = qkv(requires_grad=False)
    q.requires_grad_(q_grad)
    k.requires_grad_(kv_grad)
    v.requires_grad_(kv_grad)
    return q, k, v


@pytest.mark.parametrize("q_grad,kv_grad,mode,trains", GRAD_MODES.values(), ids=GRAD_MODES.keys())
@pytest.mark.parametrize("entry", ["integrations.attention", "tiledattention.sdpa"])
def test_only_calls_that_need_a_gradient_keep_the_lse(entry, q_grad, kv_grad, mode, trains,
                                                      training):
    q, k, v = _inputs_for(q_grad, kv_grad)
    run = ti.attention if entry == "integrations.attention" else tiledattention.sdpa
    with mode():
        out = run(q, k, v, True, 0.3)
    assert len(training.forwards) == (1 if trains else 0)
    assert len(training.plain) == (0 if trains else 1)
    assert out.requires_grad == trains
    assert torch.equal(out, reference_with_lse(q.detach(), k.detach(), v.detach(), True, 0.3)[0])
    if trains:
        assert training.forwards[0]["causal"] is True and training.forwards[0]["scale"] == 0.3
        out.sum().backward()
        assert len(training.backwards) == 1
        assert (q.grad is not None) == q_grad and (k.grad is not None) == kv_grad


def test_attention_under_compile_picks_the_op_per_grad_mode(training):
    """Dynamo reads grad mode and requires_grad while tracing (and guards on them)."""
    def f(q, k, v):
        return ti.attention(q, k, v, causal=True) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    q, k, v = qkv()
    with torch.no_grad():
        compiled(q, k, v)
    assert (len(training.plain), len(training.forwards)) == (1, 0)
    compiled(q, k, v).sum().backward()
    assert (len(training.plain), len(training.forwards), len(training.backwards)) == (1, 1, 1)
    assert q.grad is not None


# ------------------------------------------------------------------------------ gradients

GRAD_CASES = {
    "mha-full": ((2, 4, 4, 17, 17, 32), False),
    "gqa-causal": ((2, 8, 2, 33, 33, 64), True),
    "mqa-causal-sq<sk": ((1, 4, 1, 9, 40, 32), True),
    "gqa-causal-sq>sk": ((1, 4, 2, 40, 9, 32), True),
    "bottom-right-sq<sk": ((1, 4, 2, 9, 40, 40), "bottom_right"),
    "bottom-right-sq>sk": ((1, 4, 2, 40, 9, 32), "bottom_right"),  # 31 rows see no key
    "one-row": ((2, 4, 2, 1, 17, 32), "bottom_right"),  # a decode step: sees every key
}


@pytest.mark.parametrize("shape,causal", GRAD_CASES.values(), ids=GRAD_CASES.keys())
@pytest.mark.parametrize("entry", ["integrations.attention", "tiledattention.sdpa",
                                   "torch.ops.tiledattention.sdpa_fwd"])
def test_gradients_match_torch(entry, shape, causal, training):
    b, hq, hkv, sq, sk, d = shape
    q, k, v = qkv(b, hq, hkv, sq, sk, d, seed=sq * sk)
    grad_out = torch.randn(b, hq, sq, d, generator=torch.Generator().manual_seed(9))
    if entry == "integrations.attention":
        out = ti.attention(q, k, v, causal=causal, scale=0.2)
    elif entry == "tiledattention.sdpa":
        out = tiledattention.sdpa(q, k, v, causal, 0.2)
    else:
        out = torch.ops.tiledattention.sdpa_fwd(q, k, v, bool(causal), 0.2,
                                                causal == "bottom_right")
    out.backward(grad_out)
    assert_grads_match(q, k, v, causal, 0.2, grad_out, out)
    if causal == "bottom_right" and sq > sk:
        assert q.grad[:, :, :sq - sk].abs().max() == 0  # rows that see no key


def test_gradients_of_bf16_inputs_match_torch_in_bf16_rounding(training):
    q, k, v = qkv(2, 8, 2, 65, 65, 64, dtype=torch.bfloat16)
    grad_out = torch.randn(2, 8, 65, 64, generator=torch.Generator().manual_seed(3))
    out = ti.attention(q, k, v, causal=True)
    out.backward(grad_out.bfloat16())
    for x in (q, k, v):
        assert x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape
    assert_grads_match(q, k, v, True, None, grad_out.bfloat16(), out, tol=1e-2)


def test_backward_gets_the_forwards_out_and_lse(training):
    q, k, v = qkv(1, 4, 2, 40, 33, 32)
    out = ti.attention(q, k, v, causal="bottom_right", scale=0.25)
    out.sum().backward()
    fwd, bwd = training.forwards[0], training.backwards[0]
    assert (fwd["causal"], bwd["causal"]) == ("bottom_right", "bottom_right")
    assert (fwd["scale"], bwd["scale"]) == (0.25, 0.25)
    assert bwd["lse"].data_ptr() == fwd["lse"].data_ptr()
    assert bwd["lse"].stride() == fwd["lse"].stride() == (4 * 64, 64, 1)
    assert bwd["out"].data_ptr() == fwd["out"].data_ptr() == out.data_ptr()


def test_plain_forward_ops_backward_recomputes_the_lse(training):
    """``sdpa_fwd`` keeps nothing: its backward runs sdpa_fwd_lse once, then the backward."""
    q, k, v = qkv(1, 4, 2, 17, 30, 32)
    out = torch.ops.tiledattention.sdpa_fwd(q, k, v, True, None, True)
    assert (len(training.plain), len(training.forwards)) == (1, 0)
    out.sum().backward()
    assert (len(training.plain), len(training.forwards), len(training.backwards)) == (1, 1, 1)
    assert training.backwards[0]["lse"].data_ptr() == training.forwards[0]["lse"].data_ptr()


@pytest.mark.parametrize("loss", ["sum", "broadcast-weight", "transposed", "dense"])
def test_backward_gets_dense_or_row_strided_gradients(loss, training):
    """Expanded gradients (zero strides) are copied; a transposed one goes as it is."""
    q, k, v = qkv(2, 4, 2, 17, 17, 32)
    out = ti.attention(q, k, v)
    if loss == "sum":
        out.sum().backward()  # grad_out: a scalar expanded, all strides 0
    elif loss == "broadcast-weight":
        (out * torch.randn(32)).sum().backward()  # strides (0, 0, 0, 1)
    elif loss == "transposed":
        out.transpose(1, 2).contiguous().square().sum().backward()  # [B, S, H, D] strided
    else:
        out.square().sum().backward()
    strides, shape = training.backwards[0]["grad_strides"], training.backwards[0]["grad_shape"]
    assert all(st != 0 for st, n in zip(strides, shape) if n > 1), strides
    assert strides[-1] == 1
    if loss == "transposed":
        assert strides == (17 * 4 * 32, 32, 4 * 32, 1)  # no copy for a row-strided gradient
    expected = torch_grads(q, k, v, False, None, torch.ones(2, 4, 17, 32))
    if loss == "sum":
        torch.testing.assert_close(q.grad, expected[1], rtol=1e-4, atol=1e-5)


def test_grads_of_strided_inputs(training):
    """q, k, v as views of packed [B, S, H, D] projections (what a model passes)."""
    b, s, hq, hkv, d = 2, 19, 4, 2, 32
    gen = torch.Generator().manual_seed(5)
    packed = torch.randn(b, s, hq + 2 * hkv, d, generator=gen).requires_grad_(True)
    q, k, v = packed.split([hq, hkv, hkv], dim=2)
    out = ti.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    out.square().sum().backward()
    q2, k2, v2 = (x.detach().transpose(1, 2) for x in (q, k, v))
    _, dq, dk, dv = torch_grads(q2, k2, v2, True, None, 2 * out.detach())
    expected = torch.cat([dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)], dim=2)
    torch.testing.assert_close(packed.grad, expected, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------ torch.compile

def _graph_targets_backend():
    """An aot_eager-like backend that records the call targets of the forward and backward
    graphs AOTAutograd builds."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen = {"forward": [], "backward": []}

    def compiler(which):
        def compile_graph(gm, example_inputs):
            seen[which] += [n.target for n in gm.graph.nodes if n.op == "call_function"]
            return make_boxed_func(gm.forward)
        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward")), seen


class Block(torch.nn.Module):
    """Projections around the attention, GQA, causal, strided q/k/v."""

    def __init__(self, dim=64, heads=4, kv_heads=2, head_dim=32):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = torch.nn.Linear(dim, heads * head_dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x, attend=ti.attention):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        out = attend(q, k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_fullgraph_traces_forward_and_backward(dynamic, training):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 21, 64, generator=torch.Generator().manual_seed(1))
    model(x).square().mean().backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    backend, seen = _graph_targets_backend()
    compiled = torch.compile(model, fullgraph=True, backend=backend, dynamic=dynamic)
    compiled(x).square().mean().backward()
    assert torch.ops.tiledattention.sdpa_fwd_lse.default in seen["forward"]
    assert torch.ops.tiledattention.sdpa_bwd.default in seen["backward"]
    assert torch.ops.tiledattention.sdpa_fwd.default not in seen["forward"]
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager[name], rtol=1e-5, atol=1e-6)
    assert len(training.backwards) == 2  # one eager, one compiled


def test_compile_fullgraph_of_the_plain_op_traces_its_recomputing_backward(training):
    def f(q, k, v):
        return torch.ops.tiledattention.sdpa_fwd(q, k, v, True, None).square().sum()

    backend, seen = _graph_targets_backend()
    q, k, v = qkv()
    torch.compile(f, fullgraph=True, backend=backend)(q, k, v).backward()
    assert torch.ops.tiledattention.sdpa_fwd.default in seen["forward"]
    assert torch.ops.tiledattention.sdpa_fwd_lse.default in seen["backward"]
    assert torch.ops.tiledattention.sdpa_bwd.default in seen["backward"]
    dq = q.grad.clone()
    q.grad = None
    f(q, k, v).backward()
    torch.testing.assert_close(dq, q.grad)


# ------------------------------------------------------------------- schedules and errors

def test_an_explicit_forward_schedule_reaches_the_kernel(training):
    q, k, v = qkv()
    schedule = Schedule(tile_m=64, tile_n=32)
    out = tiledattention.sdpa(q, k, v, True, schedule=schedule)
    assert training.forwards[0]["schedule"] == schedule
    out.sum().backward()
    assert q.grad is not None


def test_a_decode_schedule_cannot_train(training):
    q, k, v = qkv(sq=1)
    with pytest.raises(UnsupportedOperationError, match="DecodeSchedule") as info:
        tiledattention.sdpa(q, k, v, schedule=DecodeSchedule())
    assert isinstance(info.value, TiledAttentionError)
    with torch.no_grad():  # without a gradient it is the decode kernel's business
        tiledattention.sdpa(q, k, v, schedule=DecodeSchedule())
    assert len(training.plain) == 1


@pytest.mark.parametrize("kwargs,error,match", [
    ({"causal": "lower_right"}, InputValueError, "causal must be"),
    ({"causal": 2.5}, InputTypeError, "causal must be"),
    ({"scale": "0.1"}, InputTypeError, "scale must be a float"),
    ({"scale": True}, InputTypeError, "scale must be a float"),
    ({"schedule": "fast"}, InputTypeError, "schedule must be"),
], ids=["causal-string", "causal-type", "scale-string", "scale-bool", "schedule-type"])
def test_bad_arguments_raise_the_packages_errors(kwargs, error, match, training):
    q, k, v = qkv()
    with pytest.raises(error, match=match) as info:
        tiledattention.sdpa(q, k, v, **kwargs)
    assert isinstance(info.value, TiledAttentionError)
    assert training.forwards == []


def test_cpu_tensors_that_require_grad_are_refused_by_the_runtime():
    """No stand-ins: the real sdpa_with_lse validates before touching a GPU."""
    q, k, v = qkv(dtype=torch.bfloat16)
    for run in (tiledattention.sdpa, ti.attention):
        with pytest.raises(InputValueError, match="must be a CUDA tensor"):
            run(q, k, v, True)


def test_an_integer_scale_is_a_float_to_the_op(training):
    q, k, v = qkv()
    tiledattention.sdpa(q, k, v, False, 1)
    ti.attention(q, k, v, False, 1)
    assert [f["scale"] for f in training.forwards] == [1.0, 1.0]
    assert all(isinstance(f["scale"], float) for f in training.forwards)


def test_grad_enabled_follows_torch():
    assert _autograd.grad_enabled()
    with torch.no_grad():
        assert not _autograd.grad_enabled()
    q, k, v = qkv(requires_grad=False)
    assert not _autograd.needs_grad(q, k, v)
    v.requires_grad_(True)
    assert _autograd.needs_grad(q, k, v)
    with torch.inference_mode():
        assert not _autograd.needs_grad(q, k, v)
