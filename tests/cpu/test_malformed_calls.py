"""Malformed calls drawn at random through every public entry point on CPU tensors: a valid
call with one or two of its arguments spoiled (a dim dropped or added, a size changed, a dtype,
a transposed or strided view, a list or a NumPy array for a tensor, a value of the wrong kind
for a keyword). Each must raise a ``TiledAttentionError`` (a valid call on CPU tensors is told
its device, also one) and launch nothing; the ``explain`` functions raise one or answer.
Seeded: the draws are the same on every run. This fuzz found the errors fixed in a5ea794,
eb5f08e and 968b157 (Python's own ``AttributeError``, ``TypeError``, ``ZeroDivisionError``
and torch's ``RuntimeError`` raised from inside the checks)."""

from __future__ import annotations

import random

import cuda.tile
import pytest
import torch

import tiledattention as ta
from tiledattention import TiledAttentionError

CALLS = 400  # a kind
WEIRD = (None, -1, 0, 1.5, float("nan"), float("inf"), "x", True, [1, 2], (1,), (1, 2, 3),
         (-2, 0), (1.5, 2), ("a", 1), torch.tensor(1.0), torch.zeros(3, dtype=torch.int64),
         object(), 2 ** 40, {}, b"x")
DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.bool,
          torch.float8_e4m3fn, torch.float16, torch.bfloat16)


def _tensor(shape, dtype=torch.bfloat16):
    if not dtype.is_floating_point:
        return torch.zeros(shape, dtype=dtype)
    return torch.randn(shape).to(dtype)


def _spoil(rng: random.Random, x: torch.Tensor):
    """``x`` changed one way a caller gets a tensor argument wrong."""
    shape = list(x.shape)
    how = rng.randrange(8)
    if how == 0:
        return x.to(rng.choice(DTYPES))
    if how == 1 and x.dim() > 1:
        return x[..., 0]
    if how == 2:
        return x[None]
    if how == 3 and shape:
        shape[rng.randrange(len(shape))] = rng.choice([0, 1, 3, 7, 129])
        return _tensor(shape, x.dtype)
    if how == 4 and x.dim() >= 2:
        return x.transpose(-1, -2)
    if how == 5:
        return x.tolist() if x.numel() < 50 else x.float().numpy()
    if how == 6 and shape and shape[-1] > 1:
        return x[..., ::2]
    return rng.choice(WEIRD)


def _spoiled(rng: random.Random, tensors: dict, keywords: dict, weird: tuple) -> None:
    """Spoil zero to two of ``tensors`` and give some of ``weird`` (keyword names) odd values,
    in place."""
    for name in weird:
        if rng.random() < 0.08:
            keywords[name] = rng.choice(WEIRD)
    for _ in range(rng.choice([0, 1, 1, 2])):
        name = rng.choice(list(tensors))
        if isinstance(tensors[name], torch.Tensor):
            tensors[name] = _spoil(rng, tensors[name])


def _dense(rng: random.Random):
    b, hkv, group = rng.choice([1, 3]), rng.choice([1, 2, 4]), rng.choice([1, 2, 7])
    sq, sk, d = rng.choice([1, 5, 64]), rng.choice([1, 33, 128]), rng.choice([64, 128])
    dtype = rng.choice([torch.bfloat16, torch.float16])
    return b, hkv * group, hkv, sq, sk, d, dtype


def sdpa_call(rng, explain=False):
    b, hq, hkv, sq, sk, d, dtype = _dense(rng)
    t = dict(q=_tensor((b, hq, sq, d), dtype), k=_tensor((b, hkv, sk, d), dtype),
             v=_tensor((b, hkv, sk, d), dtype))
    kw: dict = {}
    if explain:
        _spoiled(rng, t, kw, ("causal", "window", "softcap", "sinks"))
        return lambda: ta.explain(*t.values(), **kw)
    _spoiled(rng, t, kw, ("causal", "scale", "window", "softcap", "sinks", "schedule", "out",
                          "ranges", "q_descale", "k_descale"))
    lse_takes = not {"out", "ranges", "q_descale", "k_descale"} & set(kw)
    entry = ta.sdpa_with_lse if lse_takes and rng.random() < 0.3 else ta.sdpa
    return lambda: entry(*t.values(), **kw)


def backward_call(rng):
    b, hq, hkv, sq, sk, d, dtype = _dense(rng)
    t = dict(grad_out=_tensor((b, hq, sq, d), dtype), q=_tensor((b, hq, sq, d), dtype),
             k=_tensor((b, hkv, sk, d), dtype), v=_tensor((b, hkv, sk, d), dtype),
             out=_tensor((b, hq, sq, d), dtype), lse=_tensor((b, hq, sq), torch.float32))
    kw: dict = {}
    _spoiled(rng, t, kw, ("causal", "scale", "window", "softcap", "sinks", "schedule", "grads",
                          "deterministic"))
    return lambda: ta.sdpa_backward(*t.values(), **kw)


def varlen_call(rng, explain=False):
    lengths = [rng.randrange(1, 70) for _ in range(rng.choice([1, 2, 5]))]
    _, hq, hkv, _, _, d, dtype = _dense(rng)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    tokens = sum(lengths)
    t = dict(query=_tensor((tokens, hq, d), dtype), key=_tensor((tokens, hkv, d), dtype),
             value=_tensor((tokens, hkv, d), dtype), cu_seq_q=cu, cu_seq_k=cu.clone())
    kw: dict = dict(is_causal=rng.choice([False, True]), enable_gqa=hq != hkv)
    if rng.random() < 0.3:  # over a paged cache
        page = rng.choice([16, 64])
        pages = [-(-n // page) for n in lengths]
        t["key"], t["value"] = (_tensor((sum(pages), page, hkv, d), dtype) for _ in range(2))
        t["cu_seq_k"] = None
        kw.update(block_table=torch.zeros(len(lengths), max(pages), dtype=torch.int32),
                  seqused_k=torch.tensor(lengths, dtype=torch.int32))
    longest = [max(lengths), max(lengths)]
    for i in range(2):
        if rng.random() < 0.1:
            longest[i] = rng.choice(WEIRD)
    weird = ("window_size", "is_causal", "enable_gqa", "seqused_k", "block_table")
    if explain:
        _spoiled(rng, t, kw, weird + ("training",))
        return lambda: ta.explain_varlen(*t.values(), *longest, **kw)
    _spoiled(rng, t, kw, weird + ("scale",))
    return lambda: ta.varlen_attn(*t.values(), *longest, **kw)


def paged_call(rng, explain=False):
    b, hq, hkv, _, _, d, dtype = _dense(rng)
    sq, page = rng.choice([1, 2, 40]), rng.choice([16, 64, 256])
    lengths = [rng.randrange(sq, 600) for _ in range(b)]
    pages = [-(-n // page) for n in lengths]
    t = dict(q=_tensor((b, hq, sq, d), dtype), k_pages=_tensor((sum(pages), page, hkv, d), dtype),
             v_pages=_tensor((sum(pages), page, hkv, d), dtype),
             block_table=torch.zeros(b, max(pages), dtype=torch.int32),
             seqused_k=torch.tensor(lengths, dtype=torch.int32))
    kw: dict = {}
    weird = ("causal", "window", "softcap", "sinks", "max_k")
    if explain:
        _spoiled(rng, t, kw, weird)
        return lambda: ta.explain_paged(*t.values(), **kw)
    _spoiled(rng, t, kw, weird + ("scale", "k_descale", "v_descale"))
    return lambda: ta.paged_attention(*t.values(), **kw)


KINDS = {"sdpa": sdpa_call, "sdpa_backward": backward_call, "varlen_attn": varlen_call,
         "paged_attention": paged_call}


@pytest.fixture
def launches(monkeypatch):
    calls = []
    monkeypatch.setattr(cuda.tile, "launch", lambda *a, **k: calls.append(a))
    return calls


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_malformed_call_raises_the_package_error_and_launches_nothing(kind, launches):
    rng = random.Random(f"malformed {kind}")
    escaped = []
    for i in range(CALLS):
        call = KINDS[kind](rng)
        try:
            call()
        except TiledAttentionError:
            continue
        except Exception as exc:  # noqa: BLE001: what the test looks for
            escaped.append(f"draw {i}: {type(exc).__name__}: {exc}")
            continue
        escaped.append(f"draw {i}: returned on CPU tensors")
    assert escaped == [], escaped[:5]
    assert launches == []


@pytest.mark.parametrize("kind", ["sdpa", "varlen_attn", "paged_attention"])
def test_explaining_a_malformed_call_raises_the_package_error_or_answers(kind, launches):
    rng = random.Random(f"explain {kind}")
    escaped = []
    for i in range(CALLS):
        try:
            KINDS[kind](rng, explain=True)()
        except TiledAttentionError:
            pass
        except Exception as exc:  # noqa: BLE001: what the test looks for
            escaped.append(f"draw {i}: {type(exc).__name__}: {exc}")
    assert escaped == [], escaped[:5]
    assert launches == []
