"""A paged FP8 cache without a GPU (``paged_attention(..., k_descale=, v_descale=)`` over
float8_e4m3fn pools): its problem, the family that reads its decode steps, compile-only builds
of the paged split kernel for every architecture with FP8 (refused before Hopper), the
dequantising gather of a long query run, and the errors for bad arguments, each before any
launch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tiledattention as ta
from tiledattention import (DECODE, InputTypeError, InputValueError, Problem,
                            UnsupportedProblemError)
from tiledattention.core._family import check_arch_dtype
from tiledattention.entry_points._paged import paged_problem, reader


E4M3 = torch.float8_e4m3fn
FP8_ARCHES = ("sm_90", "sm_100", "sm_120", "sm_121")


def _step(page_size: int = 16, **fields) -> Problem:
    base = dict(batch=16, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=16384, head_dim=128,
                dtype="bf16", causal=True, bottom_right=True, ragged=True,
                page_size=page_size, kv_dtype="e4m3")
    return Problem(**{**base, **fields})


def _call(batch=2, hq=8, hkv=2, sq=1, d=64, page=16, pages=8, kv=E4M3, q=torch.bfloat16):
    """CPU arrays of a paged call: q, the pools, a block table and the lengths."""
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(batch, hq, sq, d, generator=gen).to(q)
    k = torch.randn(pages, page, hkv, d, generator=gen).to(kv)
    v = torch.randn(pages, page, hkv, d, generator=gen).to(kv)
    table = torch.arange(batch * 2, dtype=torch.int32).reshape(batch, 2) % pages
    lengths = torch.full((batch,), 2 * page - 3, dtype=torch.int32)
    return query, k, v, table, lengths


def test_a_paged_fp8_call_is_a_paged_problem_with_its_kv_dtype():
    q, k, v, table, lengths = _call()
    problem, longest = paged_problem(q, k, table, True, None, None, None, None, "e4m3")
    assert problem.kv_dtype == "e4m3" and problem.page_size == 16 and problem.ragged
    assert longest == 32 and "kv-e4m3" in problem.describe()
    # its decode steps go to the decode family, which reads the pages in place
    assert reader("sm_90", problem).name == "decode"
    # a long query run over an FP8 cache: no family reads its pages (gathered, dequantised)
    long_run = paged_problem(q.expand(2, 8, 512, 64), k, table, True, None, None, None, None,
                             "e4m3")[0]
    assert reader("sm_90", long_run) is None


@pytest.mark.parametrize("arch", FP8_ARCHES)
@pytest.mark.parametrize("page_size", [16, 64])
def test_the_paged_fp8_split_kernel_compiles_for_each_architecture_with_fp8(arch, page_size):
    problem = _step(page_size)
    schedule = DECODE.default_schedule(arch, problem)
    assert DECODE.compile(problem, schedule, arch).cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_a_paged_fp8_cache_needs_hopper_or_later(arch):
    with pytest.raises(UnsupportedProblemError, match="FP8 attention needs sm_90 or later"):
        check_arch_dtype(arch, _step())
    check_arch_dtype(arch, _step(kv_dtype=""))  # a 16-bit cache runs anywhere


@pytest.mark.parametrize("change, error, message", [
    (dict(v_dtype=torch.bfloat16), InputTypeError, "k_pages and v_pages of an FP8 cache must "
     "have one dtype"),
    (dict(q_dtype=E4M3), InputTypeError, "q must be bfloat16 or float16"),
    (dict(k_descale=torch.ones(2, 2, dtype=torch.float16)), InputTypeError,
     "k_descale must be float32"),
    (dict(v_descale=torch.ones(3, 2)), InputValueError,
     r"v_descale must have shape \[B, H_kv\] = \[2, 2\]"),
    (dict(k_descale=2.0), InputTypeError, "k_descale must be a float32 torch.Tensor"),
    (dict(kv_dtype=torch.bfloat16, k_descale=torch.ones(())), InputValueError,
     "k_descale go with an FP8 cache"),
    (dict(k_descale=torch.ones(2, 2)), InputValueError, "must be CUDA tensors"),
], ids=["v-dtype", "q-fp8", "descale-dtype", "descale-shape", "descale-type",
        "descale-without-fp8", "valid-but-on-cpu"])
def test_bad_paged_fp8_arguments_are_refused_naming_them(change, error, message):
    q, k, v, table, lengths = _call(q=change.pop("q_dtype", torch.bfloat16),
                                    kv=change.pop("kv_dtype", E4M3))
    if "v_dtype" in change:
        v = v.to(change.pop("v_dtype"))
    with pytest.raises(error, match=message):
        ta.paged_attention(q, k, v, table, lengths, **change)


def test_the_paged_op_takes_the_descales_under_fake_tensors():
    """``torch.compile`` traces the custom op with the factors as tensor arguments: its fake
    gives q's dtype and shape, an FP8 cache's output being in q's dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tiledattention.entry_points._paged import paged_op

    with FakeTensorMode():
        q, k, v, table, lengths = (torch.empty_like(x) for x in _call())
        out = paged_op(q, k, v, table, lengths, True, None, -1, -1, 0.0, None, None,
                       torch.ones(2, 2), torch.ones(2, 2))
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == tuple(q.shape)


def test_an_fp8_cache_splits_more_at_two_ctas_an_sm_unless_one_split_fills_the_gpu():
    """The decode default of an FP8 cache: over a contiguous cache as many splits as two CTAs
    an SM hold in one wave (at least ``FP8_CONTIGUOUS_MIN_KEYS`` keys a split), over pages four
    times the bf16 rule's (``FP8_SPLIT_FACTOR``, at least 512 keys), two CTAs an SM, K loads four
    steps ahead (and V loads four over pages of 16), on Hopper; a contiguous batch whose one
    split fills the GPU keeps the bf16 rule's schedule."""
    def rules(**fields):
        fp8 = Problem(**{**dict(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=48000,
                                head_dim=128, dtype="bf16", causal=False), **fields},
                      kv_dtype="e4m3")
        bf16 = dataclasses.replace(fp8, kv_dtype="")
        return (DECODE.default_schedule("sm_90", fp8), DECODE.default_schedule("sm_90", bf16))

    fp8, bf16 = rules()  # B1: 8 rows, 16 splits by the bf16 rule
    assert (bf16.splits, bf16.occupancy, bf16.k_latency) == (16, 1, 3)  # LONG_SPLIT_K_LATENCY
    assert (fp8.splits, fp8.occupancy, fp8.k_latency, fp8.v_latency) == (33, 2, 4, 2)
    uneven, _ = rules(batch=6, heads_q=16)  # 48 rows: 264 // 48
    assert uneven.splits == 5
    paged, paged_bf16 = rules(batch=60, heads_q=28, heads_kv=4, seqlen_k=4096, causal=True,
                              bottom_right=True, ragged=True, page_size=32)
    assert paged_bf16.splits == 1 and paged.splits == 4  # 240 rows, but paged
    assert paged.v_latency == 2
    small, _ = rules(batch=8, seqlen_k=20000, causal=True, bottom_right=True, ragged=True,
                     page_size=16)
    assert (small.tile_n, small.v_latency) == (64, 4)
    full, full_bf16 = rules(batch=64, seqlen_k=1500)  # 512 rows: one split fills the GPU
    assert full == full_bf16
    short, _ = rules(seqlen_k=1000)  # at least 256 keys a split
    assert short.splits == 3
    short_paged, _ = rules(seqlen_k=1000, batch=2, causal=True, bottom_right=True, ragged=True,
                           page_size=64)  # over pages, at least 512
    assert short_paged.splits == 1


def test_an_fp8_caches_values_reach_the_split_kernel_as_int16_words_of_their_bytes(
        monkeypatch):
    """The split kernel reads an e4m3 V as int16 words (``_launch.fp8_words``): each word's low
    byte is an even head-dim column, its high byte the next odd one; a view whose offset or
    strides are odd is copied first (a word must not straddle two elements' pairs); the
    launcher hands the kernel the words and K as it is."""
    from tiledattention.kernels.decode import _launch

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 3, 5, 16, generator=g) * 40).to(torch.float8_e4m3fn)
    words = _launch.fp8_words(x)
    assert words.dtype is torch.int16 and words.shape == (2, 3, 5, 8)
    assert words.data_ptr() == x.data_ptr()  # the same bytes, no copy
    as_bytes = x.view(torch.uint8).to(torch.int32)
    assert torch.equal((words.to(torch.int32) & 0xFF), as_bytes[..., 0::2])
    assert torch.equal(((words.to(torch.int32) >> 8) & 0xFF), as_bytes[..., 1::2])
    wide = (torch.randn(2, 3, 5, 17, generator=g) * 40).to(torch.float8_e4m3fn)
    odd = wide[..., 1:]  # offset 1, strides 255, 85, 17
    assert torch.equal(_launch.fp8_words(odd), _launch.fp8_words(odd.contiguous()))

    problem = Problem(batch=2, heads_q=8, heads_kv=2, seqlen_q=1, seqlen_k=300, head_dim=64,
                      dtype="bf16", causal=False, kv_dtype="e4m3")
    schedule = DECODE.default_schedule("sm_90", problem)
    plan = _launch.launches(problem, schedule, None)
    launched = []
    monkeypatch.setattr(_launch._aot, "launch",
                        lambda stream, grid, kernel, args, **kw: launched.append(args))
    q = torch.randn(2, 8, 1, 64).to(torch.bfloat16)
    k, v = ((torch.randn(2, 2, 300, 64, generator=g) * 40).to(torch.float8_e4m3fn)
            for _ in range(2))
    partials = _launch.new_scratch(plan, torch.empty)
    ones = torch.ones(2, 2)
    _launch.launch(0, plan, q, k, v, torch.empty_like(q), 0, partials, descales=(ones, ones))
    passed_k, passed_v = launched[0][1], launched[0][2]
    assert passed_k is k
    assert passed_v.dtype is torch.int16 and passed_v.shape == (2, 2, 300, 32)
    assert passed_v.data_ptr() == v.data_ptr()
