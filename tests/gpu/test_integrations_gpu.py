"""tiledattention.integrations on the GPU: the custom op under torch.compile / torch.export,
training through it, the SDPA router, and the transformers backend, against PyTorch (the
backward's accuracy in detail: test_backward_gpu.py; a 20-step training run:
test_training_gpu.py).

Errors are relative L2 against a float32 reference (bf16 <= 1e-2, fp16 <= 5e-3). Causal masking
is PyTorch's ``is_causal``: top-left aligned (query i sees keys 0..i).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tiledattention.integrations as ti
from tiledattention.integrations import _router

from ._reference import TOLERANCE, random_qkv, reference, rel_l2

pytestmark = pytest.mark.gpu

TORCH_SDPA = _router._TORCH_SDPA


@pytest.fixture(autouse=True)
def _router_off_and_counts_reset():
    ti.disable()
    ti.reset_router_stats()
    ti.reset_hf_stats()
    torch._dynamo.reset()
    yield
    ti.disable()
    assert F.scaled_dot_product_attention is TORCH_SDPA


SHAPES = {
    "mha": (2, 8, 8, 128, 128, 64),
    "gqa": (2, 8, 2, 113, 113, 128),
    "decode": (3, 8, 2, 1, 1000, 128),
    "sq>sk": (1, 4, 4, 300, 17, 96),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_op_matches_reference(shape, causal, dtype):
    b, hq, hkv, sq, sk, d = shape
    q, k, v = random_qkv(b, hq, hkv, sq, sk, d, dtype, seed=sq)
    with torch.no_grad():
        out = ti.attention(q, k, v, causal=causal)
    assert out.shape == (b, hq, sq, d) and out.dtype == dtype and out.is_contiguous()
    err = rel_l2(out, reference(q, k, v, causal))
    assert err <= TOLERANCE[dtype], f"rel L2 {err:.2e}"


def _reference_grads(q, k, v, causal, grad_out):
    q32, k32, v32 = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    reference(q32, k32, v32, causal).backward(grad_out.float())
    return q32.grad, k32.grad, v32.grad


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_through_the_op_matches_reference(causal):
    q, k, v = random_qkv(2, 8, 2, 129, 300, 64, torch.bfloat16, seed=4)
    grad_out = torch.randn_like(q)
    for x in (q, k, v):
        x.requires_grad_(True)
    out = ti.attention(q, k, v, causal=causal)
    # eager: sdpa_fwd_lse's eager route (entry_points/_autograd.py), not the op's dispatch
    assert type(out.grad_fn).__name__ == "_EagerForwardLseBackward"
    out.backward(grad_out)
    for which, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                                _reference_grads(q, k, v, causal, grad_out)):
        assert got.shape == want.shape and got.dtype == torch.bfloat16
        err = rel_l2(got, want)
        assert err <= 2e-2, f"{which}: rel L2 {err:.2e}"


class Block(torch.nn.Module):
    """Projections around the op, GQA, causal: the shape of a decoder's attention."""

    def __init__(self, dim=512, heads=8, kv_heads=2, head_dim=64):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = torch.nn.Linear(dim, heads * head_dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)  # strided, last dim 1
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        out = ti.attention(q, k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


def _block_and_input():
    torch.manual_seed(0)
    model = Block().to(device="cuda", dtype=torch.bfloat16).eval()
    x = torch.randn(2, 257, 512, device="cuda", dtype=torch.bfloat16)
    return model, x


def test_compile_fullgraph_matches_eager():
    model, x = _block_and_input()
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True)
        out = compiled(x)
    err = rel_l2(out, eager.float())
    assert err <= 1e-2, f"compiled vs eager rel L2 {err:.2e}"


def test_compile_explain_has_no_graph_breaks():
    model, x = _block_and_input()
    with torch.no_grad():
        explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_export_matches_eager():
    model, x = _block_and_input()
    exported = torch.export.export(model, (x,))
    targets = {node.target for node in exported.graph.nodes if node.op == "call_function"}
    # the block's parameters require grad, so the traced call is the training forward
    ops = torch.ops.tiledattention
    assert targets & {ops.sdpa_fwd.default, ops.sdpa_fwd_lse.default}
    with torch.no_grad():
        err = rel_l2(exported.module()(x), model(x).float())
    assert err <= 1e-2, f"exported vs eager rel L2 {err:.2e}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_router_sends_cuda_bf16_to_tiledattention(causal):
    q, k, v = random_qkv(2, 8, 2, 113, 300, 128, torch.bfloat16, seed=1)
    with torch.no_grad(), ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        scaled = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.05,
                                                enable_gqa=True)
    stats = ti.router_stats()
    assert (stats.tiledattention, stats.torch) == (2, 0), stats
    err = rel_l2(out, reference(q, k, v, causal))
    assert err <= TOLERANCE[torch.bfloat16], f"rel L2 {err:.2e}"
    err = rel_l2(scaled, reference(q, k, v, causal, scale=0.05))
    assert err <= TOLERANCE[torch.bfloat16], f"scale=0.05: rel L2 {err:.2e}"


def test_router_falls_back_for_what_the_kernel_cannot_do():
    q, k, v = random_qkv(2, 4, 4, 64, 64, 64, torch.bfloat16, seed=2)
    mask = torch.rand(64, 64, device="cuda") > 0.2
    mask[:, 0] = True
    cases = {
        "attn_mask": ((q, k, v), {"attn_mask": mask}),
        "dtype": ((q.float(), k.float(), v.float()), {}),
        "head_dim": ((q[..., :16], k[..., :16], v[..., :16]), {}),
        "layout": ((q.transpose(2, 3).contiguous().transpose(2, 3), k, v), {}),
    }
    with torch.no_grad(), ti.sdpa_kernel():
        for reason, (args, kwargs) in cases.items():
            out = F.scaled_dot_product_attention(*args, **kwargs)
            assert torch.equal(out, TORCH_SDPA(*args, **kwargs)), reason
    stats = ti.router_stats()
    assert stats.tiledattention == 0
    assert stats.fallbacks == {"attn_mask": 1, "dtype": 1, "head_dim": 1, "layout": 1}


def test_router_trains_through_the_kernels():
    q, k, v = random_qkv(2, 4, 4, 64, 64, 64, torch.bfloat16, seed=3)
    grad_out = torch.randn_like(q)
    for x in (q, k, v):
        x.requires_grad_(True)
    with ti.sdpa_kernel():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad_out)
    stats = ti.router_stats()
    assert (stats.tiledattention, stats.torch) == (1, 0), stats
    for which, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                                _reference_grads(q, k, v, True, grad_out)):
        err = rel_l2(got, want)
        assert err <= 2e-2, f"{which}: rel L2 {err:.2e}"


# ---------------------------------------------------------------------------- transformers

def tiny_llama(attn_implementation: str, dtype: torch.dtype, state_dict=None,
               sliding: bool = False):
    """A two-layer Llama (``sliding``: a Gemma 3 text model, its first layer a sliding window
    of 64 keys, its second global) of small random weights, one seed: the same weights for
    every ``attn_implementation``."""
    transformers = pytest.importorskip("transformers")
    ti.register_hf()
    common = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=512)
    config = (transformers.Gemma3TextConfig(
                  **common, sliding_window=64, query_pre_attn_scalar=64,
                  layer_types=["sliding_attention", "full_attention"])
              if sliding else transformers.LlamaConfig(**common))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model.to(device="cuda", dtype=dtype).eval()


def test_hf_llama_logits_match_sdpa():
    reference_model = tiny_llama("sdpa", torch.float32)
    weights = {name: t.detach().cpu() for name, t in reference_model.state_dict().items()}
    mine = tiny_llama("tiledattention", torch.bfloat16, weights)
    theirs = tiny_llama("sdpa", torch.bfloat16, weights)
    gen = torch.Generator(device="cuda").manual_seed(5)
    ids = torch.randint(0, 512, (2, 97), device="cuda", generator=gen)
    with torch.no_grad():
        exact = reference_model(ids).logits
        got = mine(ids).logits
        expected = theirs(ids).logits
    stats = ti.hf_stats()
    assert (stats.tiledattention, stats.torch) == (2, 0), stats  # both layers ran the kernel
    err, sdpa_err = rel_l2(got, exact), rel_l2(expected, exact)
    assert err <= max(1e-2, 2 * sdpa_err), f"rel L2 {err:.2e} (torch sdpa bf16: {sdpa_err:.2e})"
    assert rel_l2(got, expected.float()) <= 2e-2  # two bf16 models: attention rounding only


def test_hf_llama_generate_runs_on_the_kernel():
    model = tiny_llama("tiledattention", torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(6)
    ids = torch.randint(0, 512, (2, 31), device="cuda", generator=gen)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                             min_new_tokens=8, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 39)
    assert torch.equal(out[:, :31], ids)
    stats = ti.hf_stats()
    # prefill plus 7 decode steps (the 8th token needs no forward), two layers each
    assert stats.tiledattention == 2 * 8 and stats.torch == 0, stats


def _static_steps(model, ids, mask, tokens, form):
    """A prefill of ``ids`` into a 256-slot static cache, then a decode step for each of
    ``tokens`` (``[steps, B, 1]``, fed whatever the logits say), run as ``form``:
    "eager", "compiled" (``torch.compile(mode="reduce-overhead", fullgraph=True)``) or
    "graph" (the eager step captured by hand into one CUDA graph, the position advanced
    inside it). Each step's last-position logits, float32 ``[steps, B, vocab]``."""
    transformers = pytest.importorskip("transformers")
    cache = transformers.StaticCache(config=model.config, max_cache_len=256)
    length = ids.shape[1]
    with torch.no_grad():
        out = model(ids, attention_mask=mask, past_key_values=cache,
                    cache_position=torch.arange(length, device="cuda"))
        token = tokens[0].clone()
        position = torch.tensor([length], device="cuda")
        full = torch.cat((mask, torch.ones_like(mask[:, :1]).expand(-1, 256 - length)), 1)

        def step():
            logits = model_call(token, attention_mask=full, past_key_values=cache,
                                cache_position=position).logits[:, -1].float()
            position.add_(1)
            return logits

        model_call = torch.compile(model, mode="reduce-overhead", fullgraph=True) \
            if form == "compiled" else model
        logits = []
        if form == "graph":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                logits.append(step())  # warm: every kernel compiled before the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = step()
            position.fill_(length + 1)
        while len(logits) < len(tokens):
            token.copy_(tokens[len(logits)])
            if form == "graph":
                graph.replay()
                logits.append(captured.clone())
            else:
                logits.append(step())
    return torch.stack(logits)


@pytest.mark.parametrize("form", ["eager", "compiled", "graph"])
def test_hf_static_cache_decode_runs_the_kernels_compiled_and_captured(form, monkeypatch):
    """A left-padded batch's decode steps over a static cache: eagerly (ranges checked on the
    host), compiled with reduce-overhead and captured by hand (ranges found on the device,
    the tiledattention::sdpa_ranges_fwd op in the graph), every layer on the kernel, the
    logits sdpa's within bf16 rounding."""
    import tiledattention

    mine = tiny_llama("tiledattention", torch.bfloat16)  # one seed: the same weights
    theirs = tiny_llama("sdpa", torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(9)
    ids = torch.randint(0, 512, (3, 77), device="cuda", generator=gen)
    tokens = torch.randint(0, 512, (6, 3, 1), device="cuda", generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :20] = 0  # left padding
    mask[2, :1] = 0
    calls = []  # (query rows, with ranges) of each kernel call run (not replayed)
    sdpa = tiledattention.sdpa
    monkeypatch.setattr(tiledattention, "sdpa", lambda q, *args, **kw: (
        calls.append((q.shape[2], kw.get("ranges") is not None)), sdpa(q, *args, **kw))[1])
    got = _static_steps(mine, ids, mask, tokens, form)
    expected = _static_steps(theirs, ids, mask, tokens, "eager")
    assert calls and all(ranged for _, ranged in calls), calls
    # both layers of at least two steps ran the kernel: eagerly all six, compiled the
    # graph tree's warm-up and recording, captured the warm step and the capture
    assert sum(rows == 1 for rows, _ in calls) >= 4, calls
    assert ti.hf_stats().torch == 0, ti.hf_stats()
    for step, (a, b) in enumerate(zip(got, expected)):
        assert torch.isfinite(a).all()
        assert rel_l2(a, b) <= 2e-2, f"step {step}: rel L2 {rel_l2(a, b):.2e}"


@pytest.mark.parametrize("form", ["eager", "compiled"])
def test_hf_static_cache_sliding_layers_decode_on_the_kernels(form, monkeypatch):
    """A static cache's sliding layer (a buffer of its 64-key window, rolled at every step past
    a 77-token prompt, entry 1's left padding still in the window) and its global layer: every
    decode step's attention on the kernel, as ranges, compiled with reduce-overhead too (the
    ranges found on the device); the logits sdpa's within bf16 rounding."""
    import tiledattention

    mine = tiny_llama("tiledattention", torch.bfloat16, sliding=True)
    theirs = tiny_llama("sdpa", torch.bfloat16, sliding=True)
    gen = torch.Generator(device="cuda").manual_seed(11)
    ids = torch.randint(0, 512, (3, 77), device="cuda", generator=gen)
    tokens = torch.randint(0, 512, (6, 3, 1), device="cuda", generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :20] = 0
    mask[2, :1] = 0
    calls = []  # (query rows, keys, with ranges, with a window) of each kernel call run
    sdpa = tiledattention.sdpa
    monkeypatch.setattr(tiledattention, "sdpa", lambda q, k, *args, **kw: (
        calls.append((q.shape[2], k.shape[2], kw.get("ranges") is not None, "window" in kw)),
        sdpa(q, k, *args, **kw))[1])
    got = _static_steps(mine, ids, mask, tokens, form)
    expected = _static_steps(theirs, ids, mask, tokens, "eager")
    steps = [c for c in calls if c[0] == 1]
    assert all(ranged and not window for _, _, ranged, window in steps), calls
    # both layers (the sliding one over its 64 slots) of at least two steps
    assert sum(keys == 64 for _, keys, _, _ in steps) >= 2, calls
    assert sum(keys == 256 for _, keys, _, _ in steps) >= 2, calls
    assert ti.hf_stats().torch == 0, ti.hf_stats()
    for step, (a, b) in enumerate(zip(got, expected)):
        assert torch.isfinite(a).all()
        assert rel_l2(a, b) <= 2e-2, f"step {step}: rel L2 {rel_l2(a, b):.2e}"


def test_hf_static_cache_generate_compiles_through_the_kernels(monkeypatch):
    """``generate(cache_implementation="static")`` on a GPU compiles the decode step itself
    (transformers' auto-compile, reduce-overhead): every decode step's attention runs the
    ranges op, and its scores follow the same generation run eagerly (compiling disabled)
    wherever the two have chosen the same tokens so far."""
    import tiledattention

    model = tiny_llama("tiledattention", torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(10)
    ids = torch.randint(0, 512, (2, 45), device="cuda", generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    calls = []
    sdpa = tiledattention.sdpa
    monkeypatch.setattr(tiledattention, "sdpa", lambda q, *args, **kw: (
        calls.append((q.shape[2], kw.get("ranges") is not None)), sdpa(q, *args, **kw))[1])
    kwargs = dict(attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                  pad_token_id=0, cache_implementation="static", output_scores=True,
                  return_dict_in_generate=True)
    with torch.no_grad():
        compiled = model.generate(ids, **kwargs)
        assert compiled.sequences.shape == (2, 53)
        assert calls and all(ranged for _, ranged in calls), calls
        # the compiled steps' warm-up and recording ran the kernel in both layers
        assert sum(rows == 1 for rows, _ in calls) >= 4, calls
        eager = model.generate(ids, disable_compile=True, **kwargs)
    assert ti.hf_stats().torch == 0, ti.hf_stats()
    same = 0
    for step, (a, b) in enumerate(zip(compiled.scores, eager.scores)):
        finite = torch.isfinite(b)  # min_new_tokens sets the end token's score to -inf
        assert not a.isnan().any() and torch.equal(torch.isfinite(a), finite), step
        assert rel_l2(a[finite].float(), b[finite].float()) <= 3e-2, f"step {step}"
        if not torch.equal(compiled.sequences[:, 45 + step], eager.sequences[:, 45 + step]):
            break
        same += 1
    assert same >= 3, same


def test_hf_llama_training_step_matches_sdpa():
    """One mixed-precision (autocast bf16) training step from the same float32 weights: the
    loss and every weight's gradient of the tiledattention model against the sdpa model's."""
    reference_model = tiny_llama("sdpa", torch.float32)
    weights = {name: t.detach().cpu() for name, t in reference_model.state_dict().items()}
    mine = tiny_llama("tiledattention", torch.float32, weights).train()
    theirs = tiny_llama("sdpa", torch.float32, weights).train()
    gen = torch.Generator(device="cuda").manual_seed(8)
    ids = torch.randint(0, 512, (2, 97), device="cuda", generator=gen)
    losses = []
    for model in (mine, theirs):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        losses.append(loss.item())
    stats = ti.hf_stats()
    assert (stats.tiledattention, stats.torch) == (2, 0), stats  # both layers, with grad
    assert abs(losses[0] - losses[1]) <= 1e-2 * abs(losses[1]), losses
    for (name, p), q in zip(mine.named_parameters(), theirs.parameters()):
        err = rel_l2(p.grad, q.grad.float())
        assert err <= 3e-2, f"{name}: gradient rel L2 {err:.2e} vs the sdpa model's"


def test_hf_padded_batch_runs_as_ranges_and_a_holed_mask_falls_back():
    """Left padding: every layer's call runs the kernel with per-entry ranges, and the logits
    of the real tokens are sdpa's (to attention rounding); a mask with a hole in the middle is
    no padding and goes to sdpa, exactly."""
    mine = tiny_llama("tiledattention", torch.bfloat16)
    theirs = tiny_llama("sdpa", torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(7)
    ids = torch.randint(0, 512, (2, 40), device="cuda", generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :9] = 0
    with torch.no_grad():
        got = mine(ids, attention_mask=mask).logits
        expected = theirs(ids, attention_mask=mask).logits
    stats = ti.hf_stats()
    assert (stats.tiledattention, stats.fallbacks) == (2, {}), stats
    valid = mask.bool()
    assert rel_l2(got[valid], expected[valid].float()) <= 2e-2
    ti.reset_hf_stats()
    mask[1, 20] = 0
    with torch.no_grad():
        got = mine(ids, attention_mask=mask).logits
        expected = theirs(ids, attention_mask=mask).logits
    assert ti.hf_stats().fallbacks == {"attn_mask": 2}
    assert torch.equal(got, expected)
