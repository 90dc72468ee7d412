"""The SDPA router with a ``PaddingMask`` on the GPU: left- and right-padded batches run as
``tiledattention.sdpa(..., ranges=)`` and match the float32 reference built entry by entry
(``tiledattention.tooling.varlen_reference`` on each entry's valid rows and keys, which the test
works out on the host from the lengths, by position).

Every padded position of q, k and v holds NaN: a kernel that reads one key, value or query
outside its entry's range turns a valid row into NaN. Rows outside an entry's query range must
come out as zeros. Lengths include 0, 1 and odd lengths around the tiles' edges; heads are
grouped (``enable_gqa=True``). Errors are relative L2 (bf16 <= 1e-2, fp16 <= 5e-3).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tiledattention.integrations as ti
from tiledattention.tooling import varlen_reference

from ._reference import TOLERANCE, rel_l2

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("router_off")]


def entries(lengths, sq, sk, side):
    """Each entry's valid query rows ``(q0, q1)`` and keys ``(k0, k1)``: keys by side and
    length, query row ``i`` valid where its position ``i + S_k - S_q`` is a valid key."""
    spans = []
    for lk in lengths:
        k0, k1 = (sk - lk, sk) if side == "left" else (0, lk)
        rows = [i for i in range(sq) if k0 <= i + sk - sq < k1]
        spans.append(((rows[0], rows[-1] + 1) if rows else (0, 0), (k0, k1)))
    return spans


def padded_inputs(lengths, hq, hkv, sq, sk, d, side, dtype=torch.bfloat16, seed=0):
    """q, k, v ``[B, H, S, D]`` with NaN at every padded position; the entries' spans."""
    spans = entries(lengths, sq, sk, side)
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(heads, s, which):
        x = torch.randn(len(lengths), heads, s, d, device="cuda", dtype=dtype, generator=gen)
        for b, span in enumerate(spans):
            lo, hi = span[which]
            x[b, :, :lo] = float("nan")
            x[b, :, hi:] = float("nan")
        return x
    return make(hq, sq, 0), make(hkv, sk, 1), make(hkv, sk, 1), spans


def check(q, k, v, spans, out, causal, scale=None):
    """Zeros outside each entry's query rows; the reference on its rows."""
    for b, ((q0, q1), (k0, k1)) in enumerate(spans):
        assert torch.equal(out[b, :, :q0], torch.zeros_like(out[b, :, :q0])), b
        assert torch.equal(out[b, :, q1:], torch.zeros_like(out[b, :, q1:])), b
        if q1 <= q0:
            continue
        got = out[b, :, q0:q1].transpose(0, 1)
        assert not got.isnan().any(), f"entry {b} read a position outside its range"
        packed = lambda x, lo, hi: x[b, :, lo:hi].transpose(0, 1)  # noqa: E731
        want = varlen_reference(packed(q, q0, q1), packed(k, k0, k1), packed(v, k0, k1),
                                torch.tensor([0, q1 - q0], dtype=torch.int32),
                                torch.tensor([0, k1 - k0], dtype=torch.int32),
                                causal=causal is not False,
                                bottom_right=causal == "bottom_right", scale=scale)
        if want.abs().sum() == 0:  # no key visible
            assert torch.equal(got, torch.zeros_like(got)), b
        else:
            err = rel_l2(got, want)
            assert err < TOLERANCE[q.dtype], (b, q1 - q0, k1 - k0, err)


def routed(q, k, v, mask, **kwargs):
    before = ti.router_stats()
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=q.shape[1] != k.shape[1], **kwargs)
    after = ti.router_stats()
    assert after.tiledattention == before.tiledattention + 1, after.fallbacks
    assert after.fallbacks == before.fallbacks
    return out


PREFILL_LENGTHS = [300, 1, 129, 0, 64, 255, 17]


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_prefill(side, causal):
    s = 300
    q, k, v, spans = padded_inputs(PREFILL_LENGTHS, 16, 4, s, s, 128, side)
    lengths = torch.tensor(PREFILL_LENGTHS, device="cuda")
    mask = ti.padding_mask(lengths, s, s, side=side, causal=causal)
    out = routed(q, k, v, mask)
    assert out.shape == q.shape and out.dtype == q.dtype
    check(q, k, v, spans, out, causal)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_decode_step_and_chunk(side):
    sk = 1000
    lengths = [1000, 613, 1, 0, 999, 65]
    for sq in (1, 4, 33):
        q, k, v, spans = padded_inputs(lengths, 32, 8, sq, sk, 128, side, seed=sq)
        mask = ti.padding_mask(torch.tensor(lengths, dtype=torch.int32, device="cuda"), sq, sk,
                               side=side, causal="bottom_right")
        check(q, k, v, spans, routed(q, k, v, mask), "bottom_right")


@pytest.mark.parametrize("hq, hkv, d, dtype", [(8, 1, 64, torch.float16),
                                               (12, 4, 96, torch.bfloat16),
                                               (6, 6, 256, torch.bfloat16)])
def test_grouped_heads_head_dims_and_dtypes(hq, hkv, d, dtype):
    lengths = [77, 1, 130, 3, 128]
    q, k, v, spans = padded_inputs(lengths, hq, hkv, 130, 130, d, "left", dtype=dtype)
    mask = ti.padding_mask(torch.tensor(lengths), 130, 130, side="left", causal="bottom_right",
                           device="cuda")  # lengths on the CPU, ranges on the GPU
    check(q, k, v, spans, routed(q, k, v, mask, scale=0.3), "bottom_right", scale=0.3)


def test_odd_lengths_from_one_to_a_few_thousand():
    lengths = [2049, 1, 1023, 7, 2047, 513]
    s = 2049
    q, k, v, spans = padded_inputs(lengths, 8, 2, s, s, 128, "left", seed=5)
    mask = ti.padding_mask(torch.tensor(lengths, device="cuda"), s, s, side="left",
                           causal=True)
    check(q, k, v, spans, routed(q, k, v, mask), True)


def test_calls_that_require_grad_fall_back_to_torch():
    lengths = [40, 17, 1]
    q, k, v, spans = padded_inputs(lengths, 8, 2, 40, 40, 64, "right")
    q, k, v = (x.nan_to_num(0.0).requires_grad_() for x in (q, k, v))  # torch reads padding
    mask = ti.padding_mask(torch.tensor(lengths, device="cuda"), 40, 40, side="right",
                           causal=True)
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert ti.router_stats().fallbacks == {"padding_mask_grad": 1}
    out.float().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    with torch.no_grad():
        check(q, k, v, spans, out.detach(), True)


def test_a_repeated_decode_signature_runs_warm_with_each_calls_ranges():
    """A static cache's decode steps: one signature a step, new ranges each time. The kept
    plan (no validation) reads each call's ranges; a call that needs a gradient is not
    served warm (it is refused, as a first call would be)."""
    import tiledattention
    from tiledattention import UnsupportedOperationError

    sk = 700
    for step, lengths in enumerate(([700, 3, 0, 351], [1, 699, 350, 64], [9, 9, 700, 0])):
        q, k, v, spans = padded_inputs(lengths, 16, 4, 1, sk, 128, "left", seed=step)
        ranges = torch.tensor([[q0 for (q0, _), _ in spans], [q1 for (_, q1), _ in spans],
                               [k0 for _, (k0, _) in spans], [k1 for _, (_, k1) in spans]],
                              dtype=torch.int32, device="cuda")
        check(q, k, v, spans, tiledattention.sdpa(q, k, v, "bottom_right", ranges=ranges),
              "bottom_right")
    with pytest.raises(UnsupportedOperationError, match="autograd"):
        tiledattention.sdpa(q.requires_grad_(), k, v, "bottom_right", ranges=ranges)
