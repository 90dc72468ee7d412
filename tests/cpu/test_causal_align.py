"""Bottom-right causal alignment on the CPU: the problem's canonical forms and attended pairs,
the ``causal=`` argument's checks, the forward kernel's constant and compile-only builds, and
the float32 reference the GPU checks use. (The router's ``CausalBias`` handling is tested in
``test_integrations.py``; the kernel's results in ``tests/gpu/test_causal_align_gpu.py``.)"""

from __future__ import annotations

import math

import pytest
import torch

import tiledattention
from tiledattention import tooling
from tiledattention import (FORWARD, InputTypeError, InputValueError, Problem, Schedule,
                            UnsupportedProblemError, compile_schedule)
from tiledattention.core._reference import attention_reference as reference
from tiledattention.kernels.forward._launch import kernel_constants, no_effect_flags
from tiledattention.core._problem import BOTTOM_RIGHT, TOP_LEFT, causal_flags


def problem(sq, sk, *, causal=True, bottom_right=True, d=64, hq=8, hkv=2, dtype="bf16"):
    return Problem(batch=1, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=dtype, causal=causal, bottom_right=bottom_right)


def keep_mask(p: Problem) -> torch.Tensor:
    """[S_q, S_k] booleans: which keys each query row attends, by definition."""
    rows = torch.arange(p.seqlen_q)[:, None]
    keys = torch.arange(p.seqlen_k)[None, :]
    if not p.causal:
        return torch.ones(p.seqlen_q, p.seqlen_k, dtype=torch.bool)
    offset = p.seqlen_k - p.seqlen_q if p.bottom_right else 0
    return keys <= rows + offset


# ------------------------------------------------------------------------------ the problem

def test_bottom_right_with_equal_lengths_is_top_left():
    p = problem(300, 300)
    assert (p.causal, p.bottom_right) == (True, False)
    assert p == problem(300, 300, bottom_right=False)
    assert "bottom_right" not in p.to_dict()


def test_bottom_right_with_one_query_masks_nothing():
    p = problem(1, 5000)
    assert (p.causal, p.bottom_right) == (False, False)
    assert p == problem(1, 5000, causal=False, bottom_right=False)
    assert p.attended_pairs == 5000


def test_bottom_right_stays_where_it_changes_the_mask():
    for sq, sk in ((16, 8192), (100, 7), (2, 3)):
        p = problem(sq, sk)
        assert (p.causal, p.bottom_right) == (True, True)
        assert p.causal_offset == sk - sq
        assert p.to_dict()["bottom_right"] is True
        assert Problem.from_dict(p.to_dict()) == p
        assert p != problem(sq, sk, bottom_right=False)
        assert "causal-br" in p.describe()


def test_bottom_right_needs_causal():
    with pytest.raises(UnsupportedProblemError, match="bottom_right=True needs causal=True"):
        problem(16, 100, causal=False)


@pytest.mark.parametrize("bottom_right", [False, True], ids=["top_left", "bottom_right"])
@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 9), (9, 1), (7, 100), (100, 7), (64, 4097),
                                   (333, 1000), (1000, 333), (17, 17), (2, 3), (3, 2)])
def test_attended_pairs_match_brute_force(sq, sk, bottom_right):
    p = problem(sq, sk, bottom_right=bottom_right)
    assert p.attended_pairs == int(keep_mask(p).sum())
    assert p.flops == 4.0 * p.batch * p.heads_q * p.head_dim * int(keep_mask(p).sum())


def test_rows_without_a_key_only_bottom_right_with_more_queries():
    assert int((~keep_mask(problem(100, 7)).any(dim=1)).sum()) == 93
    for p in (problem(7, 100), problem(100, 7, bottom_right=False), problem(64, 4097)):
        assert bool(keep_mask(p).any(dim=1).all())


# --------------------------------------------------------------------------- causal= values

@pytest.mark.parametrize("value,flags", [(False, (False, False)), (True, (True, False)),
                                         (TOP_LEFT, (True, False)),
                                         (BOTTOM_RIGHT, (True, True))])
def test_causal_flags(value, flags):
    assert causal_flags(value) == flags


@pytest.mark.parametrize("value", ["lower_right", "", "True", "BOTTOM_RIGHT"])
def test_causal_flags_reject_an_unknown_string(value):
    with pytest.raises(InputValueError, match="causal must be a bool, 'top_left' or "
                                              "'bottom_right'") as info:
        causal_flags(value)
    assert repr(value) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [None, 1, 0.0, b"bottom_right", ["bottom_right"]])
def test_causal_flags_reject_other_types(value):
    with pytest.raises(InputTypeError, match="causal must be a bool") as info:
        causal_flags(value)
    assert type(value).__name__ in str(info.value)
    assert isinstance(info.value, TypeError)


def test_sdpa_checks_the_alignment_before_touching_a_gpu():
    q = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(InputValueError, match="causal"):
        tiledattention.sdpa(q, q, q, causal="lower_right")
    with pytest.raises(InputTypeError, match="causal"):
        tiledattention.sdpa(q, q, q, causal=None)


# ------------------------------------------------------------------------------ the kernel

def test_kernel_constants_carry_the_alignment():
    schedule = Schedule(tile_m=64, tile_n=64)
    assert kernel_constants(problem(16, 8192), schedule)["BOTTOM_RIGHT"] is True
    for p in (problem(16, 8192, bottom_right=False), problem(16, 8192, causal=False,
                                                             bottom_right=False),
              problem(512, 512)):  # canonical: top-left
        constants = kernel_constants(p, schedule)
        assert constants["BOTTOM_RIGHT"] is False
        assert constants["CAUSAL"] is p.causal


def test_balance_flags_stay_for_bottom_right():
    """paired_tiles / longest_first still even out causal work under a shifted diagonal."""
    p = problem(4096, 8192)
    for flags in ({"paired_tiles": True}, {"longest_first": True}, {"kv_sawtooth": True},
                  {"split_masked": True}):
        assert no_effect_flags(p, Schedule(tile_m=64, tile_n=64, **flags)) == {}


def _text(p: Problem, schedule: Schedule) -> str:
    result = compile_schedule(p, schedule, "sm_90")
    assert result.cubin[:4] == b"\x7fELF"
    return tooling.text_digest(result.cubin)


def test_bottom_right_compiles_for_sm_90_and_differs_from_top_left():
    schedule = FORWARD.default_schedule("sm_90", problem(100, 1000))
    fewer_queries = _text(problem(100, 1000), schedule)
    more_queries = _text(problem(1000, 100), schedule)
    top_left = _text(problem(100, 1000, bottom_right=False), schedule)
    assert fewer_queries != top_left
    # the offset is read from the shapes at run time: one kernel serves both
    assert fewer_queries == more_queries


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    {"persistent": True},
    {"paired_tiles": True, "persistent": True},
    {"longest_first": True, "kv_sawtooth": True},
    {"split_masked": True, "kv_sawtooth": True, "approx_div": True, "exp2": True},
], ids=lambda f: "+".join(f))
def test_bottom_right_schedules_compile(flags):
    p = problem(333, 1000, d=96)
    _text(p, Schedule(tile_m=64, tile_n=64, **flags))


# --------------------------------------------------------------------------- the reference

def _brute_force(q, k, v, p: Problem) -> torch.Tensor:
    group = p.group_size
    k = k.float().repeat_interleave(group, 1)
    v = v.float().repeat_interleave(group, 1)
    scores = q.float() @ k.transpose(-1, -2) / math.sqrt(p.head_dim)
    keep = keep_mask(p)
    out = torch.zeros(q.shape, dtype=torch.float32)
    for i in range(p.seqlen_q):
        seen = keep[i]
        if seen.any():
            weights = torch.softmax(scores[:, :, i, seen], dim=-1)
            out[:, :, i] = torch.einsum("bhn,bhnd->bhd", weights, v[:, :, seen])
    return out


@pytest.mark.parametrize("sq,sk,bottom_right", [(7, 100, True), (100, 7, True), (33, 64, True),
                                                (33, 64, False), (64, 33, False)])
def test_reference_matches_brute_force(sq, sk, bottom_right):
    p = problem(sq, sk, bottom_right=bottom_right, d=32, hq=4, hkv=2)
    gen = torch.Generator().manual_seed(sq * sk)
    q = torch.randn(1, 4, sq, 32, generator=gen)
    k = torch.randn(1, 2, sk, 32, generator=gen)
    v = torch.randn(1, 2, sk, 32, generator=gen)
    ref = reference(q, k, v, p)
    assert torch.isfinite(ref).all()
    torch.testing.assert_close(ref, _brute_force(q, k, v, p), rtol=1e-5, atol=1e-5)
    if p.bottom_right and sq > sk:
        assert torch.equal(ref[:, :, : sq - sk], torch.zeros_like(ref[:, :, : sq - sk]))

