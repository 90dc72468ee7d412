"""Randomised conformance on the GPU: seeded draws that vary every dimension a user varies at
once (batch, heads and their grouping, head dim, dtype, odd and unequal lengths, both causal
alignments, windows, softcap, sinks, memory layouts, page sizes, FP8 inputs and caches,
padded ranges, mixed prefill and decode steps over pages), each call checked against a float32 attention written out from the definition
(``_reference.attend``, independent of the package's own reference), by relative L2 error.

Every output the library writes into is poisoned first (``out=`` filled with NaN), every page
no entry uses and every slot past an entry's keys is NaN, and packed batches carry NaN poison
sequences between the real ones, so a read or a write outside the call's rows fails the check.
The feature-by-feature GPU tests cover each dimension alone; these cover their combinations on
shapes no tuning grid holds. Each kind draws ``TILEDATTENTION_CONFORMANCE_CASES`` cases
(default 12); a failing case's id names its seed and its whole draw, so it replays alone.
"""

from __future__ import annotations

import math
import os
import random

import pytest
import torch

import tiledattention as ta
from tiledattention.tooling import dequantise_fp8, quantise_fp8

from ._reference import attend, rel_l2

pytestmark = pytest.mark.gpu

CASES = int(os.environ.get("TILEDATTENTION_CONFORMANCE_CASES", "12"))
HEAD_DIMS = (32, 40, 64, 72, 80, 96, 128, 160, 192, 256)
GROUPS = (1, 2, 3, 4, 7, 8)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: relative L2 bounds: the families' own (``Family.tolerances``), the backward's for gradients
FORWARD_TOL = {"bf16": 1e-2, "fp16": 5e-3}
GRAD_TOL = {"bf16": 2e-2, "fp16": 1e-2}
FP8_CACHE_TOL = 1e-2  # against the float32 attention of the dequantised cache
FP8_TOL = 5e-2  # e4m3 q, k, v (P·V in e4m3): the forward family's e4m3 bound
#: score elements the float32 reference may hold at once (1 GiB)
REFERENCE_ELEMENTS = 1 << 28


# -- the reference (``_reference.attend``) ---------------------------------------------------------
def dense_reference(q, k, v, **kw):
    return torch.stack([attend(q[b], k[b], v[b], **kw) for b in range(q.shape[0])])


# -- draws ---------------------------------------------------------------------------------------
def draw_heads(rng, most_q=48):
    group = rng.choice(GROUPS)
    hkv = rng.choice([h for h in (1, 2, 3, 4, 8) if h * group <= most_q] or [1])
    return hkv * group, hkv


def draw_mask(rng, paged=False):
    """``(causal, bottom_right, window, softcap)``: a paged call's queries are the last
    positions of their keys, so its causal mask and window are bottom-right."""
    causal = rng.random() < 0.6
    bottom_right = paged or (causal and rng.random() < 0.5)
    window = None
    if rng.random() < 0.35:
        left = rng.choice([-1, rng.randint(0, 40), rng.randint(41, 700)])
        right = 0 if causal else rng.choice([-1, 0, rng.randint(1, 300)])
        if (left, right) != (-1, -1):
            window = (left, right)
    softcap = round(rng.uniform(5.0, 50.0), 2) if rng.random() < 0.25 else None
    return causal, bottom_right, window, softcap


def causal_arg(causal, bottom_right):
    return ("bottom_right" if bottom_right else True) if causal else False


def draw_dense(seed):
    rng = random.Random(seed)
    hq, hkv = draw_heads(rng)
    d = rng.choice(HEAD_DIMS)
    b = rng.randint(1, 4)
    sq = rng.choice([1, 1, 2, 3, 5, 8, rng.randint(9, 200), rng.randint(201, 1500)])
    sk = rng.choice([rng.randint(1, 100), rng.randint(101, 2500), rng.randint(2501, 9000)])
    while b * hq * sq * sk > REFERENCE_ELEMENTS // 2:
        sk = max(1, sk // 2)
    causal, bottom_right, window, softcap = draw_mask(rng)
    return dict(b=b, hq=hq, hkv=hkv, sq=sq, sk=sk, d=d, dtype=rng.choice(list(DTYPES)),
                causal=causal, bottom_right=bottom_right, window=window, softcap=softcap,
                sinks=rng.random() < 0.2,
                scale=rng.choice([None, round(rng.uniform(0.03, 0.2), 4)]),
                layout=rng.choice(["bhsd", "bshd"]), seed=seed)


def describe(draw):
    shown = (f"{k}{v}" for k, v in draw.items() if v not in (None, False))
    return "-".join(shown).replace(", ", "_").replace("(", "").replace(")", "")


def tensor(shape, dtype, gen, layout="bhsd"):
    """``[B, H, S, D]`` normal values; ``bshd``: a transposed view of ``[B, S, H, D]`` storage."""
    b, h, s, d = shape
    if layout == "bshd":
        return torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    return torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen)


def dense_inputs(draw, requires_grad=False):
    gen = torch.Generator(device="cuda").manual_seed(draw["seed"])
    dtype = DTYPES[draw["dtype"]]
    q = tensor((draw["b"], draw["hq"], draw["sq"], draw["d"]), dtype, gen, draw["layout"])
    k = tensor((draw["b"], draw["hkv"], draw["sk"], draw["d"]), dtype, gen, draw["layout"])
    v = tensor((draw["b"], draw["hkv"], draw["sk"], draw["d"]), dtype, gen, draw["layout"])
    sinks = (torch.randn(draw["hq"], device="cuda", generator=gen).mul_(2.0)
             if draw["sinks"] else None)
    if requires_grad:
        for x in (q, k, v, sinks):
            if x is not None:
                x.requires_grad_()
    return q, k, v, sinks


def reference_kw(draw):
    scale = draw["scale"] if draw["scale"] is not None else 1.0 / math.sqrt(draw["d"])
    return dict(causal=draw["causal"], bottom_right=draw["bottom_right"], window=draw["window"],
                softcap=draw["softcap"], scale=scale)


DENSE = [draw_dense(1000 + i) for i in range(CASES)]
#: odd draws take the torch custom ops' route (what ``torch.compile`` and ``torch.export`` run),
#: even ones the eager route (``torch.autograd.Function``), which a plain call takes
TRAINING = [{**draw_dense(2000 + i), "route": ("op" if i % 2 else "eager")}
            for i in range(CASES)]


# -- sdpa forward --------------------------------------------------------------------------------
@pytest.mark.parametrize("draw", DENSE, ids=describe)
def test_sdpa_forward(draw):
    q, k, v, sinks = dense_inputs(draw)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    got = ta.sdpa(q, k, v, causal_arg(draw["causal"], draw["bottom_right"]), draw["scale"],
                  window=draw["window"], softcap=draw["softcap"], sinks=sinks, out=out)
    assert got is out
    want = dense_reference(q, k, v, sinks=sinks, **reference_kw(draw))
    assert rel_l2(got, want) < FORWARD_TOL[draw["dtype"]]


# -- FP8: e4m3 q, k and v, or an e4m3 K/V cache under 16-bit queries ---------------------------
def draw_fp8(seed):
    draw = draw_dense(seed)
    rng = random.Random(-seed)
    cache = rng.random() < 0.5  # else q, k and v all e4m3
    if cache:  # a cache is read by the decode kernels: calls of few query rows
        draw["sq"] = rng.choice([1, 1, 2, 4])
    draw.update(fp8="cache" if cache else "qkv", layout="bhsd",
                per_tensor=rng.random() < 0.3)
    if not cache:
        draw["dtype"] = "bf16"  # the output of e4m3 inputs
    return draw


FP8 = [draw_fp8(6000 + i) for i in range(CASES)]


def fp8_values(x, heads_kv, per_tensor):
    """``(e4m3 x, its descale factor, the float32 values they stand for)``: one factor for
    the tensor, or ``[B, H_kv]`` (``tooling.quantise_fp8``'s per-head convention)."""
    if per_tensor:
        factor = x.float().abs().amax() / torch.finfo(torch.float8_e4m3fn).max
        stored = (x.float() / factor).to(torch.float8_e4m3fn)
        return stored, factor, stored.float() * factor
    stored, factor = quantise_fp8(x, heads_kv)
    return stored, factor, dequantise_fp8(stored, factor)


@pytest.mark.parametrize("draw", FP8, ids=describe)
def test_fp8_sdpa(draw):
    """Against the float32 attention of the dequantised inputs; factors ``[B, H_kv]`` (a query
    head takes its K/V head's) or one per tensor."""
    q, k, v, sinks = dense_inputs(draw)
    names = "kv" if draw["fp8"] == "cache" else "qkv"
    inputs, real, factors = [q, k, v], [q.float(), k.float(), v.float()], {}
    for i, name in enumerate("qkv"):
        if name in names:
            inputs[i], factors[f"{name}_descale"], real[i] = fp8_values(
                inputs[i], draw["hkv"], draw["per_tensor"])
    out_dtype = q.dtype if draw["fp8"] == "cache" else torch.bfloat16
    out = torch.full((*q.shape[:3], draw["d"]), float("nan"), dtype=out_dtype, device="cuda")
    got = ta.sdpa(*inputs, causal_arg(draw["causal"], draw["bottom_right"]), draw["scale"],
                  window=draw["window"], softcap=draw["softcap"], sinks=sinks, out=out,
                  **factors)
    assert got is out
    want = dense_reference(*real, sinks=sinks, **reference_kw(draw))
    tol = FP8_CACHE_TOL if draw["fp8"] == "cache" else FP8_TOL
    assert rel_l2(got, want) < tol


# -- training: sdpa's gradients ------------------------------------------------------------------
def take_route(draw, monkeypatch):
    """The ops' route for ``draw["route"] == "op"``: the check that sends a plain call past the
    ops made to say no (as it does while ``torch.compile`` traces)."""
    if draw["route"] == "op":
        from tiledattention.entry_points import _autograd, _varlen

        monkeypatch.setattr(_autograd, "eager", lambda *tensors: False)
        monkeypatch.setattr(_varlen, "eager", lambda *tensors: False)


@pytest.mark.parametrize("draw", TRAINING, ids=describe)
def test_sdpa_gradients(draw, monkeypatch):
    take_route(draw, monkeypatch)
    q, k, v, sinks = dense_inputs(draw, requires_grad=True)
    leaves = [x for x in (q, k, v, sinks) if x is not None]
    out = ta.sdpa(q, k, v, causal_arg(draw["causal"], draw["bottom_right"]), draw["scale"],
                  window=draw["window"], softcap=draw["softcap"], sinks=sinks)
    assert ("Eager" in type(out.grad_fn).__name__) == (draw["route"] == "eager")
    gen = torch.Generator(device="cuda").manual_seed(draw["seed"] + 1)
    grad_out = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=gen)
    got = torch.autograd.grad(out, leaves, grad_out)
    refs = [x.detach().float().requires_grad_() for x in leaves]
    rq, rk, rv = refs[:3]
    want_out = dense_reference(rq, rk, rv, sinks=refs[3] if sinks is not None else None,
                               **reference_kw(draw))
    want = torch.autograd.grad(want_out, refs, grad_out.float())
    assert rel_l2(out, want_out) < FORWARD_TOL[draw["dtype"]]
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        if w.abs().max() == 0:  # zero by the algebra (each row sees one key, or none): noise
            assert g.float().abs().max() < 1e-3, name
            continue
        assert rel_l2(g, w) < GRAD_TOL[draw["dtype"]], name


# -- paged caches --------------------------------------------------------------------------------
def draw_paged(seed):
    rng = random.Random(seed)
    hq, hkv = draw_heads(rng, most_q=64)
    b = rng.randint(1, 24)
    sq = rng.choice([1, 1, 1, 2, 4, rng.randint(5, 160)])
    longest = rng.choice([rng.randint(sq, 600), rng.randint(max(sq, 601), 6000)])
    lengths = [rng.randint(sq, longest) for _ in range(b)]
    lengths[rng.randrange(b)] = longest
    causal, _, window, softcap = draw_mask(rng, paged=True)
    fp8 = rng.random() < 0.3  # decode steps read it; long runs gather and dequantise it
    return dict(b=b, hq=hq, hkv=hkv, sq=sq, lengths=tuple(lengths), d=rng.choice(HEAD_DIMS),
                dtype=rng.choice(list(DTYPES)), page=rng.choice([16, 32, 64, 128, 256]),
                causal=causal, window=window, softcap=softcap, sinks=rng.random() < 0.2,
                fp8=fp8, seed=seed)


def describe_paged(draw):
    shown = {**draw, "lengths": f"{len(draw['lengths'])}x{max(draw['lengths'])}"}
    return describe(shown)


def paged_pools(draw, gen):
    """``(k_pages, v_pages, block_table, seqused)``: shuffled pages, NaN in unused pages and
    past each length, -1 past each entry's pages in the table."""
    page, hkv, d, dtype = draw["page"], draw["hkv"], draw["d"], DTYPES[draw["dtype"]]
    need = [-(-n // page) for n in draw["lengths"]]
    total = sum(need) + 2
    order = torch.randperm(total, generator=gen, device="cuda")
    k_pages = torch.full((total, page, hkv, d), float("nan"), dtype=dtype, device="cuda")
    v_pages = torch.full_like(k_pages, float("nan"))
    table = torch.full((draw["b"], max(need) + 1), -1, dtype=torch.int32, device="cuda")
    used = 0
    for i, (n, pages) in enumerate(zip(draw["lengths"], need)):
        ids = order[used:used + pages]
        used += pages
        table[i, :pages] = ids.int()
        for pool in (k_pages, v_pages):
            values = torch.randn(pages * page, hkv, d, generator=gen, device="cuda", dtype=dtype)
            pool[ids] = values.masked_fill(torch.arange(pages * page, device="cuda")[:, None, None]
                                           >= n, float("nan")).view(pages, page, hkv, d)
    seqused = torch.tensor(draw["lengths"], dtype=torch.int32, device="cuda")
    return k_pages, v_pages, table, seqused


def quantised(pool):
    """``pool`` in e4m3 with one float32 descale factor a K/V head (its largest finite
    magnitude maps to e4m3's largest value)."""
    amax = pool.float().nan_to_num(0.0).abs().amax(dim=(0, 1, 3)).clamp(min=1e-12)
    descale = amax / torch.finfo(torch.float8_e4m3fn).max
    return (pool.float() / descale[None, None, :, None]).to(torch.float8_e4m3fn), descale


def entry_cache(k_pages, v_pages, ids, n, factors):
    """One entry's ``(k, v) [H_kv, n, D]`` in float32, gathered from its pages (dequantised
    by ``factors`` for an FP8 pool)."""
    pages = [p for p in ids if p >= 0]
    out = []
    for i, pool in enumerate((k_pages, v_pages)):
        x = pool[pages].flatten(0, 1)[:n].float()
        if factors is not None:
            x = x * factors[i][None, :, None]
        out.append(x.transpose(0, 1))
    return out


PAGED = [draw_paged(3000 + i) for i in range(CASES)]


@pytest.mark.parametrize("draw", PAGED, ids=describe_paged)
def test_paged_attention(draw):
    gen = torch.Generator(device="cuda").manual_seed(draw["seed"])
    k_pages, v_pages, table, seqused = paged_pools(draw, gen)
    dtype = DTYPES[draw["dtype"]]
    q = torch.randn(draw["b"], draw["hq"], draw["sq"], draw["d"], device="cuda", dtype=dtype,
                    generator=gen)
    sinks = torch.randn(draw["hq"], device="cuda", generator=gen) if draw["sinks"] else None
    descales, factors = {}, None
    if draw["fp8"]:  # the pools in e4m3, one factor a K/V head ([1, H_kv]); NaN stays NaN
        (k_pages, kd), (v_pages, vd) = (quantised(x) for x in (k_pages, v_pages))
        descales, factors = dict(k_descale=kd[None], v_descale=vd[None]), (kd, vd)
    caches = [entry_cache(k_pages, v_pages, ids, n, factors)
              for ids, n in zip(table.tolist(), draw["lengths"])]
    got = ta.paged_attention(q, k_pages, v_pages, table, seqused, causal=draw["causal"],
                             window=draw["window"], softcap=draw["softcap"], sinks=sinks,
                             **descales)
    scale = 1.0 / math.sqrt(draw["d"])
    want = torch.stack([attend(q[i], k, v,
                               causal=draw["causal"], bottom_right=True, window=draw["window"],
                               softcap=draw["softcap"], sinks=sinks, scale=scale)
                        for i, (k, v) in enumerate(caches)])
    tol = FP8_CACHE_TOL if draw["fp8"] else FORWARD_TOL[draw["dtype"]]
    assert rel_l2(got, want) < tol


# -- padded batches with ranges (sdpa(..., ranges=)) --------------------------------------------
def draw_ranges(seed):
    rng = random.Random(seed)
    hq, hkv = draw_heads(rng)
    b = rng.randint(1, 8)
    sq = rng.choice([1, 2, 4, rng.randint(5, 64), rng.randint(65, 700)])
    sk = rng.randint(max(sq, 2), 2500)
    spans_q, spans_k = [], []
    for _ in range(b):  # left or right padding, or none
        nq, nk = rng.randint(1, sq), rng.randint(1, sk)
        lq, lk = rng.choice([(0, 0), (sq - nq, sk - nk)])
        spans_q.append((lq, lq + nq))
        spans_k.append((lk, lk + nk))
    causal, bottom_right, window, softcap = draw_mask(rng)
    return dict(b=b, hq=hq, hkv=hkv, sq=sq, sk=sk, spans_q=tuple(spans_q),
                spans_k=tuple(spans_k), d=rng.choice(HEAD_DIMS), dtype=rng.choice(list(DTYPES)),
                causal=causal, bottom_right=bottom_right, window=window, softcap=softcap,
                sinks=rng.random() < 0.2, seed=seed)


def describe_ranges(draw):
    return describe({k: v for k, v in draw.items() if k not in ("spans_q", "spans_k")})


RANGES = [draw_ranges(5000 + i) for i in range(CASES)]


@pytest.mark.parametrize("draw", RANGES, ids=describe_ranges)
def test_padded_batch_ranges(draw):
    """Each entry attends within its ranges, its mask and window aligned within them as
    ``causal`` says; the padding is NaN and the rows outside an entry's queries are zeros."""
    gen = torch.Generator(device="cuda").manual_seed(draw["seed"])
    dtype, d = DTYPES[draw["dtype"]], draw["d"]

    def padded(heads, s, spans):
        x = torch.randn(draw["b"], heads, s, d, device="cuda", dtype=dtype, generator=gen)
        for i, (lo, hi) in enumerate(spans):
            x[i, :, :lo] = float("nan")
            x[i, :, hi:] = float("nan")
        return x
    q = padded(draw["hq"], draw["sq"], draw["spans_q"])
    k, v = (padded(draw["hkv"], draw["sk"], draw["spans_k"]) for _ in range(2))
    sinks = torch.randn(draw["hq"], device="cuda", generator=gen) if draw["sinks"] else None
    ranges = torch.tensor([[lo for lo, _ in draw["spans_q"]], [hi for _, hi in draw["spans_q"]],
                           [lo for lo, _ in draw["spans_k"]], [hi for _, hi in draw["spans_k"]]],
                          dtype=torch.int32, device="cuda")
    got = ta.sdpa(q, k, v, causal_arg(draw["causal"], draw["bottom_right"]), ranges=ranges,
                  window=draw["window"], softcap=draw["softcap"], sinks=sinks)
    want = torch.zeros(got.shape, dtype=torch.float32, device="cuda")
    kw = reference_kw({**draw, "scale": None})
    for i, ((q0, q1), (k0, k1)) in enumerate(zip(draw["spans_q"], draw["spans_k"])):
        want[i, :, q0:q1] = attend(q[i, :, q0:q1], k[i, :, k0:k1], v[i, :, k0:k1], sinks=sinks,
                                   **kw)
    assert rel_l2(got, want) < FORWARD_TOL[draw["dtype"]]


# -- packed variable-length batches -------------------------------------------------------------
def draw_varlen(seed):
    rng = random.Random(seed)
    hq, hkv = draw_heads(rng)
    n = rng.randint(1, 24)
    longest = rng.choice([64, 512, 3000])
    lens_k = [rng.randint(1, longest) for _ in range(n)]
    same = rng.random() < 0.5
    lens_q = list(lens_k) if same else [rng.randint(1, k) for k in lens_k]
    causal = rng.random() < 0.6
    window = (-1, -1)
    if rng.random() < 0.3:
        window = (rng.randint(0, 500), 0 if causal else rng.choice([-1, rng.randint(0, 200)]))
    return dict(hq=hq, hkv=hkv, lens_q=tuple(lens_q), lens_k=tuple(lens_k),
                d=rng.choice(HEAD_DIMS), dtype=rng.choice(list(DTYPES)), causal=causal,
                window=window, grad=rng.random() < 0.5, seed=seed)


def describe_varlen(draw):
    shown = {**draw, "lens_q": f"{len(draw['lens_q'])}x{max(draw['lens_q'])}",
             "lens_k": max(draw["lens_k"]), "window": draw["window"] != (-1, -1) and draw["window"]}
    return describe(shown)


def packed(lengths, heads, d, dtype, gen):
    """Packed ``[T, heads, D]`` with a NaN poison sequence of 1-17 tokens after every real one:
    ``(x, cu, spans)``, ``spans`` the real sequences' token ranges."""
    chunks, cu, spans, at = [], [0], [], 0
    for i, n in enumerate(lengths):
        chunks.append(torch.randn(n, heads, d, device="cuda", dtype=dtype, generator=gen))
        spans.append((at, at + n))
        poison = 1 + (7 * i + 3) % 17
        chunks.append(torch.full((poison, heads, d), float("nan"), device="cuda", dtype=dtype))
        at += n + poison
        cu += [at - poison, at]
    return torch.cat(chunks), torch.tensor(cu, dtype=torch.int32, device="cuda"), spans


VARLEN = [{**draw_varlen(4000 + i), "route": ("op" if i % 2 else "eager")}
          for i in range(CASES)]


@pytest.mark.parametrize("draw", VARLEN, ids=describe_varlen)
def test_varlen_attention(draw, monkeypatch):
    take_route(draw, monkeypatch)
    gen = torch.Generator(device="cuda").manual_seed(draw["seed"])
    dtype, d = DTYPES[draw["dtype"]], draw["d"]
    q, cu_q, spans_q = packed(draw["lens_q"], draw["hq"], d, dtype, gen)
    k, cu_k, spans_k = packed(draw["lens_k"], draw["hkv"], d, dtype, gen)
    v, _, _ = packed(draw["lens_k"], draw["hkv"], d, dtype, gen)
    leaves = [x.requires_grad_(draw["grad"]) for x in (q, k, v)]
    # the poison sequences are sequences too: each sees only its own NaN rows
    longest_q = max(hi - lo for lo, hi in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()))
    longest_k = max(hi - lo for lo, hi in zip(cu_k[:-1].tolist(), cu_k[1:].tolist()))
    out = ta.varlen_attn(q, k, v, cu_q, cu_k, longest_q, longest_k, is_causal=draw["causal"],
                         window_size=draw["window"], enable_gqa=draw["hq"] != draw["hkv"])
    window = None if draw["window"] == (-1, -1) else draw["window"]
    scale = 1.0 / math.sqrt(d)
    grad_out = torch.randn(out.shape, device="cuda", dtype=dtype, generator=gen)
    refs = [x.detach().float().requires_grad_() for x in leaves]
    for (ql, qh), (kl, kh) in zip(spans_q, spans_k):
        want = attend(refs[0][ql:qh].transpose(0, 1), refs[1][kl:kh].transpose(0, 1),
                      refs[2][kl:kh].transpose(0, 1), causal=draw["causal"], bottom_right=True,
                      window=window, softcap=None, sinks=None, scale=scale).transpose(0, 1)
        assert rel_l2(out[ql:qh], want) < FORWARD_TOL[draw["dtype"]], (ql, qh)
        if draw["grad"]:
            want.backward(grad_out[ql:qh].float())
    if not draw["grad"]:
        return
    got = torch.autograd.grad(out, leaves, grad_out.masked_fill(out.isnan(), 0.0))
    for name, g, r, spans in zip(("dq", "dk", "dv"), got, refs,
                                 (spans_q, spans_k, spans_k)):
        rows = torch.cat([torch.arange(lo, hi, device="cuda") for lo, hi in spans])
        assert rel_l2(g[rows], r.grad[rows]) < GRAD_TOL[draw["dtype"]], name


# -- a serving engine's mixed step over pages (varlen_attn with a block table) -----------------
def draw_mixed(seed):
    """Sequences of their own query counts over pages: decode tokens (1), none (0), speculative
    runs and prefill chunks, some with more queries than keys."""
    rng = random.Random(seed)
    hq, hkv = draw_heads(rng, most_q=64)
    n = rng.randint(2, 24)
    counts = [rng.choice([0, 1, 1, 1, rng.randint(2, 6), rng.randint(7, 300)]) for _ in range(n)]
    counts[rng.randrange(n)] = rng.randint(2, 300)  # not one count for all
    lengths = [rng.randint(max(c - rng.randint(0, 40), 0), 5000) for c in counts]
    causal = rng.random() < 0.7
    window = (-1, -1)
    if rng.random() < 0.3:
        window = (rng.randint(0, 500), 0 if causal else rng.choice([-1, rng.randint(0, 200)]))
    return dict(b=n, hq=hq, hkv=hkv, counts=tuple(counts), lengths=tuple(lengths),
                d=rng.choice(HEAD_DIMS), dtype=rng.choice(list(DTYPES)),
                page=rng.choice([16, 32, 64, 128, 256]), causal=causal, window=window,
                spare=rng.randint(0, 5), seed=seed)


def describe_mixed(draw):
    shown = {**draw, "counts": f"{len(draw['counts'])}x{max(draw['counts'])}",
             "lengths": max(draw["lengths"]),
             "window": draw["window"] != (-1, -1) and draw["window"]}
    return describe(shown)


MIXED = [draw_mixed(6000 + i) for i in range(CASES)]


@pytest.mark.parametrize("draw", MIXED, ids=describe_mixed)
def test_mixed_paged_step(draw):
    gen = torch.Generator(device="cuda").manual_seed(draw["seed"])
    k_pages, v_pages, table, seqused = paged_pools(draw, gen)
    dtype, d, counts = DTYPES[draw["dtype"]], draw["d"], draw["counts"]
    query = torch.randn(sum(counts) + draw["spare"], draw["hq"], d, device="cuda", dtype=dtype,
                        generator=gen)
    cu = torch.tensor([0] + [sum(counts[:i + 1]) for i in range(len(counts))],
                      dtype=torch.int32, device="cuda")
    poison = torch.full_like(query, float("nan"))  # the allocator hands its block out next
    del poison
    with torch.no_grad():
        out = ta.varlen_attn(query, k_pages, v_pages, cu, None, max(counts), max(draw["lengths"]),
                             is_causal=draw["causal"], window_size=draw["window"],
                             enable_gqa=draw["hq"] != draw["hkv"], seqused_k=seqused,
                             block_table=table)
    window = None if draw["window"] == (-1, -1) else draw["window"]
    causal = draw["causal"] or (window is not None and window[1] == 0)
    for i, (ids, n, c) in enumerate(zip(table.tolist(), draw["lengths"], counts)):
        rows = slice(int(cu[i]), int(cu[i]) + c)
        if not c:
            continue
        k, v = entry_cache(k_pages, v_pages, ids, n, None)
        want = torch.zeros(c, draw["hq"], d, device="cuda")
        if n:
            want = attend(query[rows].transpose(0, 1), k, v, causal=causal, bottom_right=True,
                          window=window, softcap=None, sinks=None,
                          scale=1.0 / math.sqrt(d)).transpose(0, 1)
        assert rel_l2(out[rows], want) < FORWARD_TOL[draw["dtype"]], (i, c, n)
    tail = out[int(cu[-1]):]
    assert torch.equal(tail, torch.zeros_like(tail)), "rows of no sequence"
