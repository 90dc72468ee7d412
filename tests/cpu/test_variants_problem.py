"""Issue 32's problem fields on the CPU: the window's semantics and canonical form, the work it
leaves (``attended_pairs``, ``key_span``), keys and lookup buckets, argument validation, the
float32 reference's window, softcap and sinks, and the sinks' gradient formula."""

from __future__ import annotations

import math
import random

import pytest
import torch

from tiledattention import (BACKWARD, DECODE, FORWARD, InputTypeError, InputValueError, Problem,
                            UnsupportedProblemError)
from tiledattention.entry_points._autograd import sink_grad, sink_grad_from_rows
from tiledattention.core._problem import sink_logits, variant_args
from tiledattention.core._reference import attention_reference, visible_keys


def problem(sq=9, sk=13, causal=False, br=False, left=-1, right=-1, softcap=0.0, sinks=False,
            b=1, hq=2, hkv=1, d=32) -> Problem:
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype="bf16", causal=causal, bottom_right=br, window_left=left,
                   window_right=right, softcap=softcap, sinks=sinks)


def seen(sq, sk, causal, br, left, right) -> list[list[int]]:
    """The keys each row sees, by the definition (the spec every family implements)."""
    off = sk - sq if br else 0
    return [[j for j in range(sk)
             if (not causal or j <= i + off) and (left < 0 or j >= i + off - left)
             and (right < 0 or j <= i + off + right)] for i in range(sq)]


def random_masks(count: int):
    rng = random.Random(7)
    for _ in range(count):
        sq, sk = rng.randint(1, 24), rng.randint(1, 24)
        causal, br = rng.random() < 0.5, rng.random() < 0.5
        left, right = rng.choice([-1, 0, 1, 2, 5, 40]), rng.choice([-1, 0, 1, 3, 40])
        if br and not (causal or left >= 0 or right >= 0):
            continue
        yield sq, sk, causal, br, left, right


def test_canonical_form_keeps_the_mask_and_counts_the_attended_pairs():
    for sq, sk, causal, br, left, right in random_masks(3000):
        p = problem(sq, sk, causal, br, left, right)
        want = seen(sq, sk, causal, br, left, right)
        assert seen(sq, sk, p.causal, p.bottom_right, p.window_left, p.window_right) == want
        assert p.attended_pairs == sum(map(len, want)), p
        assert Problem.from_dict(p.to_dict()) == p  # canonical: a fixed point
        for first in range(sq):
            last = min(sq - 1, first + 3)
            keys = sorted({j for row in want[first:last + 1] for j in row})
            lo, hi = p.key_span(first, last)
            assert (lo, hi) == (keys[0], keys[-1] + 1) if keys else lo >= hi, (p, first)


def test_canonical_forms_named():
    # causal binds the right side at least as tightly; a right side of 0 is causal
    assert problem(causal=True, right=3).window_right == -1
    p = problem(right=0, left=2)
    assert (p.causal, p.window_right, p.window_left) == (True, -1, 2)
    # a side that binds no key is unbounded; no window and no causal drops the alignment
    assert problem(sq=9, sk=9, left=8).window_left == -1
    assert problem(sq=9, sk=9, left=7).window_left == 7
    assert not problem(sq=4, sk=9, br=True, left=20).bottom_right
    # one decode row, bottom-right: causal binds nothing, the window does (aligned)
    p = problem(sq=1, sk=100, causal=True, br=True, left=9)
    assert (p.causal, p.bottom_right, p.window_left) == (False, True, 9)
    assert p.key_span(0, 0) == (90, 100)


def test_variant_fields_stay_out_of_plain_keys_and_join_the_bucket():
    plain = problem(causal=True)
    assert plain.to_dict() == {k: v for k, v in plain.to_dict().items()}  # noqa: C416
    assert not set(Problem.VARIANT_FIELDS) & set(plain.to_dict())
    windowed = problem(sq=64, sk=64, causal=True, left=15, softcap=30.0, sinks=True)
    assert windowed.to_dict()["window_left"] == 15 and windowed.to_dict()["sinks"] is True
    for family in (FORWARD, DECODE, BACKWARD):
        codec = family.codec()
        assert "window" not in codec.bucket_text(plain)
        assert '"softcap":30.0' in codec.bucket_text(windowed)
        assert codec.bucket_text(windowed) != codec.bucket_text(
            problem(sq=64, sk=64, causal=True, left=15, softcap=30.0))
    assert "win(15,-1)" in windowed.describe() and "cap30" in windowed.describe()


def test_a_window_is_measured_by_its_span_in_the_lookup():
    def long(s):
        return Problem(batch=1, heads_q=32, heads_kv=8, seqlen_q=s, seqlen_k=s, head_dim=128,
                       dtype="bf16", causal=True, window_left=4095)
    a, b = long(32768), long(65536)
    assert a.lookup_shape().seqlen_k == 4096 and a.lookup_shape().batch == 8
    assert FORWARD.distance(a, b) == pytest.approx(0.5)  # within the nearest limit (1.0)
    codec = FORWARD.codec()
    assert codec.bucket_text(a) == codec.bucket_text(b)
    assert codec.terms(a)[:2] == codec.terms(b)[:2] == (12.0, 12.0)
    plain = problem(causal=True)
    assert plain.lookup_shape() is plain


def test_bad_variant_arguments_are_named():
    for window, error, words in (((1,), InputTypeError, "pair"), ("7,0", InputTypeError, "pair"),
                                 ((1.5, 0), InputTypeError, "left side must be an int"),
                                 ((0, True), InputTypeError, "right side"),
                                 ((-2, 0), InputValueError, "left side must be >= -1")):
        with pytest.raises(error, match=words):
            variant_args(window, None)
    for cap, error in ((-1.0, InputValueError), (math.nan, InputValueError),
                       (math.inf, InputValueError), (True, InputTypeError),
                       ("30", InputTypeError)):
        with pytest.raises(error, match="softcap"):
            variant_args(None, cap)
    assert variant_args((4095, 0), 30) == (4095, 0, 30.0)
    q = torch.zeros(1, 4, 8, 32)
    for sinks, error, words in ((torch.zeros(3), InputValueError, r"shape \[H_q\]"),
                                (torch.zeros(4, dtype=torch.int32), InputTypeError, "float32"),
                                ([0.0] * 4, InputTypeError, "torch.Tensor")):
        with pytest.raises(error, match=words):
            sink_logits(sinks, 4, q, "torch")
    got = sink_logits(torch.ones(4, dtype=torch.bfloat16), 4, q, "torch")
    assert got.dtype == torch.float32 and got.is_contiguous()
    with pytest.raises(UnsupportedProblemError, match="window_left"):
        problem(left=-3)
    with pytest.raises(UnsupportedProblemError, match="bottom_right"):
        problem(br=True)


def dense(q, k, v, p, scale, sinks):
    """Attention written out element by element in float64 (independent of the reference)."""
    group = p.heads_q // p.heads_kv
    out = torch.zeros(q.shape, dtype=torch.float64)
    rows = seen(p.seqlen_q, p.seqlen_k, p.causal, p.bottom_right, p.window_left,
                p.window_right)
    for b in range(p.batch):
        for h in range(p.heads_q):
            for i, keys in enumerate(rows):
                s = [float(q[b, h, i].double() @ k[b, h // group, j].double()) * scale
                     for j in keys]
                if p.softcap:
                    s = [p.softcap * math.tanh(x / p.softcap) for x in s]
                terms = s + ([float(sinks[h])] if p.sinks else [])
                if not terms:
                    continue
                m = max(terms)
                denom = sum(math.exp(x - m) for x in terms)
                for x, j in zip(s, keys):
                    out[b, h, i] += math.exp(x - m) / denom * v[b, h // group, j].double()
    return out


@pytest.mark.parametrize("kwargs", [
    dict(causal=True, left=3), dict(causal=True, br=True, sq=5, left=2),
    dict(left=2, right=1), dict(sq=13, sk=6, causal=True, br=True, left=1),  # rows see no key
    dict(softcap=2.0), dict(sinks=True, causal=True), dict(causal=True, left=4, softcap=1.5,
                                                            sinks=True)])
def test_the_reference_applies_window_softcap_and_sinks(kwargs):
    p = problem(**kwargs)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, p.seqlen_q, 32, generator=gen) * 2  # large logits: the cap binds
    k = torch.randn(1, 1, p.seqlen_k, 32, generator=gen)
    v = torch.randn(1, 1, p.seqlen_k, 32, generator=gen)
    sinks = torch.tensor([1.5, -0.5]) if p.sinks else None
    got = attention_reference(q, k, v, p, sinks=sinks)
    want = dense(q, k, v, p, 32 ** -0.5, sinks)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    assert torch.equal(visible_keys(p, "cpu"), torch.tensor(
        [[j in row for j in range(p.seqlen_k)] for row in seen(
            p.seqlen_q, p.seqlen_k, p.causal, p.bottom_right, p.window_left,
            p.window_right)]))


def test_sink_grad_is_the_sinks_gradient():
    """``sink_grad`` (from the forward's base-2 log-sum-exp) against autograd through the
    reference, with rows that see no key (their LSE is the sink's alone)."""
    p = problem(sq=11, sk=6, causal=True, br=True, left=2, sinks=True)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 11, 32, generator=gen)
    k = torch.randn(1, 1, 6, 32, generator=gen)
    v = torch.randn(1, 1, 6, 32, generator=gen)
    sinks = torch.tensor([0.7, -1.2], requires_grad=True)
    out = attention_reference(q, k, v, p, sinks=sinks)
    grad_out = torch.randn(out.shape, generator=gen)
    (want,) = torch.autograd.grad(out, sinks, grad_out)
    scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * 32 ** -0.5
    scores = scores.masked_fill(~visible_keys(p, "cpu"), -math.inf)
    terms = torch.cat([scores, sinks.detach().view(1, 2, 1, 1).expand(1, 2, 11, 1)], dim=-1)
    lse = torch.logsumexp(terms, dim=-1) / math.log(2.0)  # base 2, as the kernels store it
    got = sink_grad(grad_out, out.detach(), lse, sinks.detach())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    rows = (grad_out * out.detach()).sum(-1)  # delta, as the backward kernels store it
    torch.testing.assert_close(sink_grad_from_rows(rows, lse, sinks.detach()), want, rtol=1e-4,
                               atol=1e-6)


def test_an_eager_call_takes_the_sinks_gradient_from_the_kernels_row_sums(monkeypatch):
    """The eager route asks the backward for its row sums ``delta`` (no second pass over dO and
    O) and builds the sinks' gradient from them; without a sinks gradient it does not ask."""
    from tiledattention.entry_points import _autograd, _training

    gen = torch.Generator().manual_seed(6)
    q, grad_out, out = (torch.randn(1, 2, 11, 32, generator=gen) for _ in range(3))
    k = v = torch.randn(1, 1, 6, 32, generator=gen)
    lse = torch.randn(1, 2, 11, generator=gen)
    sinks = torch.tensor([0.7, -1.2])
    marked = torch.randn(1, 2, 11, generator=gen)  # not dO * O: the route must use these
    asked = []

    def backward(runtime, grad_out, q, k, v, out, lse, causal, scale, *, variant,
                 with_row_sums=False):
        asked.append(with_row_sums)
        grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v))
        return (*grads, marked) if with_row_sums else grads

    monkeypatch.setattr(_training, "sdpa_backward", backward)
    flags = (True, None, True, 2, -1, 0.0)
    *_, dsinks = _autograd.attention_grads(grad_out, q, k, v, out, lse, sinks, flags, True)
    assert asked == [True]
    torch.testing.assert_close(dsinks, sink_grad_from_rows(marked, lse, sinks))
    assert not torch.allclose(dsinks, sink_grad(grad_out, out, lse, sinks))
    *_, none = _autograd.attention_grads(grad_out, q, k, v, out, lse, sinks, flags, False)
    assert none is None and asked == [True, False]
