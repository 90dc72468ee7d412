"""A paged FP8 cache on the GPU (``paged_attention(..., k_descale=, v_descale=)``) against a
float32 reference over each entry's dequantised cache.

The pools are ``test_paged_gpu``'s (shuffled pages; NaN in every unused page, past each length
and -1 past each entry's pages in the block table), quantised to float8_e4m3fn page by page with
the factors of the entry that owns the page (per entry and K/V head); NaN stays NaN in e4m3, so
a read outside an entry's keys still turns its output into NaN.
"""

from __future__ import annotations

import pytest
import torch

import tiledattention

from ._reference import rel_l2
from .test_paged_gpu import TOL, paged_cache, reference

pytestmark = pytest.mark.gpu

E4M3 = torch.float8_e4m3fn


def fp8_cache(lengths, page_size, hkv, d, seed=0):
    """(k_pages, v_pages, block_table, seqused_k, k_descale, v_descale, dequantised caches):
    each entry's keys and values quantised with its per-head factor (amax / 448)."""
    k_pages, v_pages, table, seqused, caches = paged_cache(lengths, page_size, hkv, d,
                                                           seed=seed)
    factors = []
    for x in (0, 1):  # k, v
        amax = torch.stack([c[x].float().abs().amax(dim=(0, 2)) for c in caches])  # [B, H_kv]
        factors.append((amax / 448.0).clamp_min(1e-12))
    pools = []
    for pool, factor in zip((k_pages, v_pages), factors):
        out = pool.to(E4M3)  # unused pages and slots: NaN
        for b, n in enumerate(lengths):
            ids = table[b, :-(-n // page_size)].long()
            out[ids] = (pool[ids].float() / factor[b][None, None, :, None]).to(E4M3)
        pools.append(out)
    dequantised = []
    for b, (k, v) in enumerate(caches):
        pair = [(x.float() / f[b][None, :, None]).to(E4M3).float() * f[b][None, :, None]
                for x, f in zip((k, v), factors)]
        dequantised.append(tuple(pair))
    return (*pools, table, seqused, *factors, dequantised)


def run_fp8(lengths, page_size, hq=32, hkv=8, d=128, sq=1, dtype=torch.bfloat16, seed=0,
            broadcast=None, causal=True, window=None):
    k_pages, v_pages, table, seqused, kd, vd, caches = fp8_cache(lengths, page_size, hkv, d,
                                                                 seed)
    if broadcast == "per-tensor":  # one factor for every entry and head
        kd, vd = kd.amax(), vd.amax()
        k_pages, v_pages, table, seqused, caches = _requantised(lengths, page_size, hkv, d,
                                                                seed, kd, vd)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    q = torch.randn(len(lengths), hq, sq, d, generator=gen, device="cuda", dtype=dtype)
    with torch.no_grad():
        out = tiledattention.paged_attention(q, k_pages, v_pages, table, seqused, causal=causal,
                                             window=window, max_k=max(lengths), k_descale=kd,
                                             v_descale=vd)
    want = reference(q, caches, causal, window)
    assert out.dtype == dtype and not out.isnan().any(), "a read outside an entry's keys"
    for b in range(len(lengths)):
        assert rel_l2(out[b], want[b]) < TOL[dtype], (b, lengths[b])
    return out, (q, k_pages, v_pages, table, seqused, kd, vd)


def _requantised(lengths, page_size, hkv, d, seed, kd, vd):
    """The pools quantised with one factor each (a per-tensor scale), and the caches as
    dequantised from them."""
    k_pages, v_pages, table, seqused, caches = paged_cache(lengths, page_size, hkv, d, seed=seed)
    caches = [tuple((x.float() / s).to(E4M3).float() * s for x, s in zip(c, (kd, vd)))
              for c in caches]
    return ((k_pages.float() / kd).to(E4M3), (v_pages.float() / vd).to(E4M3), table, seqused,
            caches)


@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_fp8_decode_over_pages(page_size):
    run_fp8([1, 17, 1000, 64, 3000, 255, 256, 257], page_size)


@pytest.mark.parametrize("hq, hkv, d, dtype, sq", [
    (28, 4, 128, torch.bfloat16, 1),
    (32, 8, 64, torch.float16, 1),
    (16, 16, 128, torch.bfloat16, 4),  # speculative tokens: four query rows an entry
])
def test_fp8_heads_head_dims_dtypes_and_query_rows(hq, hkv, d, dtype, sq):
    run_fp8([5, 700, 2049, 33], 32, hq=hq, hkv=hkv, d=d, sq=sq, dtype=dtype, seed=3)


def test_a_per_tensor_factor_broadcasts():
    run_fp8([40, 1500, 9], 16, hq=8, hkv=2, seed=4, broadcast="per-tensor")


def test_a_long_query_run_over_an_fp8_cache_is_dequantised_and_gathered():
    """Chunked prefill (300 queries an entry) runs the forward on the gathered pages,
    dequantised into q's dtype."""
    run_fp8([300, 2000, 777], 64, hq=16, hkv=4, sq=300, seed=6)
    # a window without the causal mask: bottom-right as well
    run_fp8([300, 2000, 777], 64, hq=16, hkv=4, sq=300, seed=6, causal=False, window=(90, 20))


def test_compiled_fp8_call_matches_eager():
    out, (q, k_pages, v_pages, table, seqused, kd, vd) = run_fp8([5, 999, 64], 64, seed=7)
    fn = torch.compile(lambda *a: tiledattention.paged_attention(*a[:5], max_k=999,
                                                                 k_descale=a[5],
                                                                 v_descale=a[6]),
                       fullgraph=True)
    with torch.no_grad():
        assert torch.equal(fn(q, k_pages, v_pages, table, seqused, kd, vd), out)


def test_a_cuda_graph_replays_fp8_steps_with_new_lengths_and_factors():
    """Capture one FP8 decode step, then replay it with shorter lengths and new factors
    written into the captured tensors: each replay matches a fresh eager call."""
    lengths = [33, 1000, 4000, 17]
    out, (q, k_pages, v_pages, table, seqused, kd, vd) = run_fp8(lengths, 16, seed=8)
    with torch.no_grad():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tiledattention.paged_attention(q, k_pages, v_pages, table, seqused,
                                                      max_k=4096, k_descale=kd, v_descale=vd)
        for step in range(5):
            seqused.copy_(torch.tensor([n - 7 * step for n in lengths], dtype=torch.int32))
            kd.mul_(1.5)
            vd.mul_(0.75)
            graph.replay()
            want = tiledattention.paged_attention(q, k_pages, v_pages, table, seqused,
                                                  max_k=4096, k_descale=kd, v_descale=vd)
            assert not captured.isnan().any(), step
            assert torch.equal(captured, want), step
