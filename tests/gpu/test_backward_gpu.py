"""The backward pass on the GPU: dQ, dK and dV against a float32 reference, held to torch's own
accuracy; NaN-poisoned gradient buffers; autograd through ``tiledattention.sdpa`` and
``tiledattention.integrations.attention``; ``torch.compile(fullgraph=True)`` of forward and
backward; a 32k-token backward whose extra memory is O(S·D) and whose profiler trace holds no
torch attention kernel; dK/dV walks split over CTAs and the causal dQ order reversed, from
NaN-poisoned partials; gradients bitwise identical run to run.

Accuracy rule (issue 17): each gradient's relative L2 error against the float32 reference (torch
autograd through float32 attention, math backend) is at most twice torch's cuDNN backend's error
against the same reference (flash where cuDNN cannot run, then memory-efficient), or 2e-3,
whichever is larger. Where none of torch's fused backends runs (e.g. bottom-right rows that see no
key, where torch returns NaN), the backward family's tolerance applies (bf16 2e-2, fp16 1e-2).
A gradient whose reference is zero (a row that sees a single key has dQ = 0 and gives its key
dK = 0) is held to an absolute bound instead.

Causal alignments: ``True`` is torch's ``is_causal`` (top-left: query i sees keys 0..i);
``"bottom_right"`` is torch's ``causal_lower_right`` (query i sees keys 0..i + S_k - S_q; rows
that see no key return zeros and get zero gradients).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tiledattention
import tiledattention.integrations as ti
from tiledattention import problem_from_arrays
from tiledattention.core._dtypes import torch_dtype
from tiledattention.core._reference import attention_reference

from ..backward_cases import CASES

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: BACKWARD's declared bounds (``Family.tolerances``), keyed by torch dtype
FAMILY_TOLERANCE = {torch_dtype(name): bound for name, bound in
                    tiledattention.BACKWARD.tolerances.items()}
FLOOR = 2e-3


# the pairwise-covering case set (CASES) is tests/backward_cases.py, checked without a GPU by
# tests/cpu/test_gpu_case_sets.py


def _case_id(case: tuple) -> str:
    (sq, sk), (hq, hkv), d, causal, dtype = case
    mask = {False: "full", True: "top-left", "bottom_right": "bottom-right"}[causal]
    return f"{sq}x{sk}-h{hq}/{hkv}-d{d}-{mask}-{dtype}"


# ------------------------------------------------------------------------------ helpers

def random_inputs(b, hq, hkv, sq, sk, d, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)

    return (make(b, hq, sq, d), make(b, hkv, sk, d), make(b, hkv, sk, d), make(b, hq, sq, d))


def reference_grads(q, k, v, causal, grad_out, scale=None):
    """float32 ``(dq, dk, dv)`` by torch autograd through float32 attention (math backend;
    GQA heads repeated, so dk/dv sum the group in float32)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    problem, _ = problem_from_arrays(q, k, v, causal, scale)
    q32, k32, v32 = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        out = attention_reference(q32, k32, v32, problem, scale)
    out.backward(grad_out.float())
    return q32.grad, k32.grad, v32.grad


def rel_l2(got, ref) -> float:
    got = got.float()
    if not torch.isfinite(got).all():
        return math.inf
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()


def is_zero(ref) -> bool:
    """A reference gradient that is zero but for float32 rounding."""
    return torch.linalg.vector_norm(ref).item() <= 1e-4 * math.sqrt(ref.numel())


def torch_baseline(q, k, v, causal, grad_out, reference):
    """``(backend name, (err dq, err dk, err dv))`` of torch's fused backward: cuDNN, else flash,
    else memory-efficient; ``(None, None)`` when none of them runs these inputs (or gives a
    non-finite gradient, as torch does for rows that see no key)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kwargs = {}
    if causal == "bottom_right":
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(q.shape[2], k.shape[2])
    else:
        kwargs["is_causal"] = bool(causal)
    group = q.shape[1] // k.shape[1]
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        # grouped heads natively where the backend takes enable_gqa, else repeated
        for gqa in ((True, False) if group > 1 else (False,)):
            q2, k2, v2 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
            kr, vr = k2, v2
            extra = dict(kwargs)
            if gqa:
                extra["enable_gqa"] = True
            elif group > 1:
                kr, vr = k2.repeat_interleave(group, 1), v2.repeat_interleave(group, 1)
            try:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q2, kr, vr, **extra)
                    out.backward(grad_out)
                torch.cuda.synchronize()
            except (RuntimeError, TypeError, ValueError):  # "No available kernel", ...
                continue
            grads = (q2.grad, k2.grad, v2.grad)
            if all(torch.isfinite(g).all() for g in grads):
                return name, tuple(rel_l2(g, r) for g, r in zip(grads, reference))
    return None, None


def poisoned_backward(q, k, v, out, lse, grad_out, problem, schedule):
    """``(plan, grads)``: the backward of ``schedule`` through the family's launch, every buffer
    it writes (the gradients, ``delta``, the split partials, the one-pass accumulator)
    NaN-poisoned first, so that anything it leaves unwritten shows."""
    from tiledattention.kernels.backward._launch import launch, launches, scratch_shapes

    plan = launches(problem, schedule, problem.head_dim ** -0.5)
    scratch = {name: torch.full(s, math.nan, device="cuda")
               for name, s in scratch_shapes(problem, schedule).items()}
    grads = tuple(torch.full_like(x, math.nan) for x in (q, k, v))
    delta = torch.full_like(lse, math.nan)
    launch(torch.cuda.current_stream(), plan, q, k, v, out, grad_out, lse, delta, *grads,
           scratch)
    return plan, grads


def check_grads(grads, reference, baseline, dtype, label=""):
    name, baseline_errors = baseline
    for i, (which, g, ref) in enumerate(zip(("dq", "dk", "dv"), grads, reference)):
        assert torch.isfinite(g).all(), f"{label} {which}: not finite"
        if is_zero(ref):
            err = g.float().abs().max().item()
            assert err <= 1e-3, f"{label} {which}: reference is zero, ours max |g| {err:.2e}"
            continue
        err = rel_l2(g, ref)
        if baseline_errors is None:
            bound, why = FAMILY_TOLERANCE[dtype], "family tolerance (no torch backend ran)"
        else:
            bound = max(2 * baseline_errors[i], FLOOR)
            why = f"2 x torch {name} ({baseline_errors[i]:.2e}) or {FLOOR}"
        assert err <= bound, f"{label} {which}: rel L2 {err:.2e} > {bound:.2e} = {why}"


# ---------------------------------------------------------------------------- accuracy

@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_gradients_against_fp32_reference_and_torch(case):
    """sdpa_with_lse + sdpa_backward into NaN-poisoned gradient buffers."""
    (sq, sk), (hq, hkv), d, causal, dtype_name = case
    dtype = DTYPES[dtype_name]
    q, k, v, grad_out = random_inputs(2, hq, hkv, sq, sk, d, dtype, seed=sq * 31 + sk + d)
    out, lse = tiledattention.sdpa_with_lse(q, k, v, causal)
    buffers = tuple(torch.full_like(x, math.nan) for x in (q, k, v))
    grads = tiledattention.sdpa_backward(grad_out, q, k, v, out, lse, causal, grads=buffers)
    assert all(g is b for g, b in zip(grads, buffers)), "grads must be written into the buffers"
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and g.dtype == dtype
    reference = reference_grads(q, k, v, causal, grad_out)
    check_grads(grads, reference, torch_baseline(q, k, v, causal, grad_out, reference), dtype,
                _case_id(case))
    if causal == "bottom_right" and sq > sk:  # rows that see no key
        assert grads[0][:, :, :sq - sk].abs().max().item() == 0


@pytest.mark.parametrize("causal", [False, True, "bottom_right"],
                         ids=["full", "top-left", "bottom-right"])
def test_scale_and_strided_inputs(causal):
    """An explicit scale; q, k, v as views of one packed [B, S, H, D] projection."""
    b, s, hq, hkv, d = 2, 333, 8, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(11)
    packed = torch.randn(b, s, hq + 2 * hkv, d, device="cuda", dtype=torch.bfloat16,
                         generator=gen)
    q, k, v = (x.transpose(1, 2) for x in packed.split([hq, hkv, hkv], dim=2))
    grad_out = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    out, lse = tiledattention.sdpa_with_lse(q, k, v, causal, 0.05)
    grads = tiledattention.sdpa_backward(grad_out, q, k, v, out, lse, causal, 0.05)
    reference = reference_grads(q, k, v, causal, grad_out, scale=0.05)
    for which, g, ref in zip(("dq", "dk", "dv"), grads, reference):
        err = rel_l2(g, ref)
        assert err <= FAMILY_TOLERANCE[torch.bfloat16], f"{which}: rel L2 {err:.2e}"


def test_lse_is_the_base2_log_sum_exp():
    q, k, v, _ = random_inputs(1, 4, 2, 77, 300, 64, torch.float16, seed=3)
    _, lse = tiledattention.sdpa_with_lse(q, k, v, "bottom_right")
    scores = q.float() @ k.float().repeat_interleave(2, 1).transpose(-1, -2) / 8.0
    keep = torch.ones(77, 300, dtype=torch.bool, device="cuda").tril(300 - 77)
    expected = torch.logsumexp(scores.masked_fill(~keep, -math.inf), -1) / math.log(2)
    torch.testing.assert_close(lse, expected, rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------------------ autograd

AUTOGRAD_SHAPES = {
    "gqa-causal": ((2, 8, 2, 257, 257, 128), True),
    "mqa-bottom-right-sq<sk": ((1, 8, 1, 17, 1000, 64), "bottom_right"),
    "mha-full-sq>sk": ((2, 4, 4, 1000, 257, 96), False),
}


@pytest.mark.parametrize("entry", ["tiledattention.sdpa", "integrations.attention",
                                   "router", "torch.ops.tiledattention.sdpa_fwd"])
@pytest.mark.parametrize("shape,causal", AUTOGRAD_SHAPES.values(), ids=AUTOGRAD_SHAPES.keys())
def test_autograd_gives_the_backward_kernels_gradients(entry, shape, causal):
    b, hq, hkv, sq, sk, d = shape
    q, k, v, grad_out = random_inputs(b, hq, hkv, sq, sk, d, torch.bfloat16, seed=sq + sk)
    out_ref, lse = tiledattention.sdpa_with_lse(q, k, v, causal)
    direct = tiledattention.sdpa_backward(grad_out, q, k, v, out_ref, lse, causal)
    for x in (q, k, v):
        x.requires_grad_(True)
    if entry == "tiledattention.sdpa":
        out = tiledattention.sdpa(q, k, v, causal)
    elif entry == "integrations.attention":
        out = ti.attention(q, k, v, causal=causal)
    elif entry == "router":
        from torch.nn.attention.bias import causal_lower_right

        kwargs = ({"attn_mask": causal_lower_right(sq, sk)} if causal == "bottom_right"
                  else {"is_causal": causal})
        ti.reset_router_stats()
        with ti.sdpa_kernel():
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv, **kwargs)
        assert ti.router_stats().tiledattention == 1
    else:
        out = torch.ops.tiledattention.sdpa_fwd(q, k, v, bool(causal), None,
                                                causal == "bottom_right")
    assert out.requires_grad
    out.backward(grad_out)
    for which, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), direct):
        assert got.shape == want.shape and got.dtype == want.dtype
        err = rel_l2(got, want.float())
        assert err <= 1e-3, f"{which}: autograd vs sdpa_backward rel L2 {err:.2e}"


def test_autograd_with_an_expanded_and_a_broadcast_gradient():
    """``out.sum()`` hands the backward an all-zero-stride gradient, a broadcast weight one
    with zero strides but a contiguous last dim: both must give the dense gradient's result."""
    q, k, v, _ = random_inputs(2, 8, 2, 129, 129, 64, torch.bfloat16, seed=5)
    w = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    results = {}
    for name, loss in (("sum", lambda o: o.sum()),
                       ("broadcast", lambda o: (o * w).sum()),
                       ("dense-ones", lambda o: (o * torch.ones_like(o)).sum()),
                       ("dense-w", lambda o: (o * w.expand_as(o).contiguous()).sum())):
        q2, k2, v2 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        loss(tiledattention.sdpa(q2, k2, v2, True)).backward()
        results[name] = (q2.grad, k2.grad, v2.grad)
    for a, b in (("sum", "dense-ones"), ("broadcast", "dense-w")):
        for got, want in zip(results[a], results[b]):
            assert rel_l2(got, want.float()) <= 1e-3, (a, b)


def test_no_grad_calls_keep_nothing_for_a_backward_pass():
    q, k, v, _ = random_inputs(1, 8, 2, 257, 257, 128, torch.bfloat16, seed=6)
    for x in (q, k, v):
        x.requires_grad_(True)
    with torch.no_grad():
        a = tiledattention.sdpa(q, k, v, True)
        b = ti.attention(q, k, v, causal=True)
    assert a.grad_fn is None and b.grad_fn is None
    trained = tiledattention.sdpa(q, k, v, True)
    # the eager route of tiledattention::sdpa_fwd_lse (entry_points/_autograd.py)
    assert type(trained.grad_fn).__name__ == "_EagerForwardLseBackward"
    assert rel_l2(trained.detach(), a.float()) <= 1e-2  # the lse kernel's forward, same result


# ------------------------------------------------------------------------- torch.compile

class Block(torch.nn.Module):
    """Projections around the attention, GQA 8/2, D=128, causal, strided q/k/v."""

    def __init__(self, dim=512, heads=8, kv_heads=2, head_dim=128):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = torch.nn.Linear(dim, heads * head_dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        out = ti.attention(q, k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


def test_compile_fullgraph_forward_and_backward_match_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block().to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 257, 512, device="cuda", dtype=torch.bfloat16)
    model(x).float().square().mean().backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True)
    for _ in range(2):  # the second call runs the compiled graphs only
        model.zero_grad()
        compiled(x).float().square().mean().backward()
    for name, p in model.named_parameters():
        err = rel_l2(p.grad, eager[name].float())
        assert err <= 2e-2, f"{name}: compiled vs eager rel L2 {err:.2e}"


# ------------------------------------------------------------------- long sequence, memory

#: substrings of the kernel names of torch's attention backends (flash, cuDNN, memory-efficient
#: cutlass "fmha", the math path's softmax and matrix products)
TORCH_ATTENTION_KERNELS = ("flash", "fmha", "cudnn", "efficient", "sdpa", "softmax", "gemm",
                           "xmma", "nvjet", "cutlass")


def test_32k_backward_memory_is_o_s_d_and_runs_no_torch_attention_kernel():
    b, hq, hkv, s, d = 1, 8, 2, 32768, 128
    q, k, v, grad_out = random_inputs(b, hq, hkv, s, s, d, torch.bfloat16, seed=32)
    for x in (q, k, v):
        x.requires_grad_(True)
    tiledattention.sdpa(q, k, v, True).backward(grad_out)  # compile, warm up, allocate .grad
    for x in (q, k, v):
        x.grad = None
    torch.cuda.synchronize()

    def nbytes(*xs):
        return sum(x.numel() * x.element_size() for x in xs)

    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = tiledattention.sdpa(q, k, v, True)
        out.backward(grad_out)
        torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    row_stats = 2 * b * hq * (-(-s // 32) * 32) * 4  # lse + delta, float32, row-aligned
    # the dK/dV split partials of the schedule the lookup gave (none: this grid fills the GPU)
    from tiledattention import BACKWARD
    from tiledattention.kernels.backward._launch import scratch_shapes

    problem, _ = problem_from_arrays(q, k, v, True, None)
    schedule = tiledattention.runtime().resolution(BACKWARD, problem, 0).schedule
    scratch = sum(math.prod(shape) * 4 for shape in scratch_shapes(problem, schedule).values())
    assert scratch <= 128 << 20
    # out, the gradients, the two row statistics, one copy of a grad_out, the partials, 64 MiB
    bound = nbytes(out, q, k, v) + nbytes(grad_out) + row_stats + scratch + (64 << 20)
    assert extra <= bound, f"extra peak {extra / 2**20:.0f} MiB > {bound / 2**20:.0f} MiB"
    assert extra < s * s, "extra peak memory of the order of an S x S matrix"
    for x in (q, k, v):
        assert x.grad is not None and torch.isfinite(x.grad).all()

    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(names) >= 3, names  # the forward, dQ and dK/dV kernels at least
    torch_kernels = [n for n in names if any(t in n.lower() for t in TORCH_ATTENTION_KERNELS)]
    assert torch_kernels == [], torch_kernels


# --------------------------------------------------------- split walks, work order, determinism

SPLIT_SHAPES = {  # (B, H_q, H_kv, S_q, S_k, D), causal, dtype
    "mqa-causal-odd": ((1, 8, 1, 1025, 1025, 128), True, torch.bfloat16),
    "gqa-bottom-right-sq<sk": ((2, 16, 4, 333, 1000, 96), "bottom_right", torch.float16),
    "gqa-full-sq>sk": ((1, 12, 3, 1000, 257, 64), False, torch.bfloat16),
    "mha-top-left-sq<sk": ((2, 4, 4, 100, 700, 256), True, torch.bfloat16),
}


@pytest.mark.parametrize("splits", [2, 4, 8, 16])
@pytest.mark.parametrize("shape,causal,dtype", SPLIT_SHAPES.values(), ids=SPLIT_SHAPES.keys())
def test_split_dkdv_walks_and_heavy_first_dq_match_the_reference(shape, causal, dtype, splits):
    """Every split count (walks shared unevenly: the pair counts are not multiples of it),
    with the causal dQ order reversed and, for 4 and 16 splits, tile-major grids, into
    NaN-poisoned gradient buffers and NaN-poisoned partials: a partial a split leaves
    unwritten would reach dK or dV."""
    from tiledattention import BACKWARD

    b, hq, hkv, sq, sk, d = shape
    q, k, v, grad_out = random_inputs(b, hq, hkv, sq, sk, d, dtype, seed=splits * 7 + sq)
    out, lse = tiledattention.sdpa_with_lse(q, k, v, causal)
    problem, _ = problem_from_arrays(q, k, v, causal, None)
    schedule = BACKWARD.default_schedule("sm_90", problem).replace(
        dkdv_splits=splits, dq_heavy_first=bool(causal), tile_major=splits in (4, 16))
    plan, grads = poisoned_backward(q, k, v, out, lse, grad_out, problem, schedule)
    assert plan.splits > 1
    reference = reference_grads(q, k, v, causal, grad_out)
    check_grads(grads, reference, torch_baseline(q, k, v, causal, grad_out, reference), dtype,
                f"splits {splits}")


@pytest.mark.parametrize("shape,causal,dtype", list(SPLIT_SHAPES.values())[:2],
                         ids=list(SPLIT_SHAPES)[:2])
def test_gradients_are_bitwise_identical_run_to_run(shape, causal, dtype):
    """The looked-up schedule (split where the grid is small) and an 8-way split: three runs
    each give the same bits."""
    from tiledattention import BACKWARD

    b, hq, hkv, sq, sk, d = shape
    q, k, v, grad_out = random_inputs(b, hq, hkv, sq, sk, d, dtype, seed=99)
    out, lse = tiledattention.sdpa_with_lse(q, k, v, causal)
    problem, _ = problem_from_arrays(q, k, v, causal, None)
    for schedule in (None, BACKWARD.default_schedule("sm_90", problem).replace(dkdv_splits=8)):
        runs = [tiledattention.sdpa_backward(grad_out, q, k, v, out, lse, causal,
                                             schedule=schedule) for _ in range(3)]
        for other in runs[1:]:
            for a, b_ in zip(runs[0], other):
                assert torch.equal(a.view(torch.int16), b_.view(torch.int16))
