"""The backward of head dims that are not powers of two, run as two power-of-two parts
(``BackwardSchedule.split_d``), on the GPU: dQ, dK and dV against the float32 reference (held to
torch's own accuracy, ``test_backward_gpu.check_grads``) for second parts of 16, 32 and 64
columns (and 72, whose second part is partly zero-filled), both kernels' modes (the dQ kernel
and the one-pass reduce-add), dK/dV walks split over CTAs, full, top-left and bottom-right
masks with S_q != S_k, odd lengths and grouped heads, into NaN-poisoned gradients, partials
and accumulators; a split and a padded run agree; a packed (ragged) batch; sdpa's default."""

from __future__ import annotations

import pytest
import torch

import tiledattention
from tiledattention import BACKWARD, problem_from_arrays
from tiledattention.core._problem import head_dim_parts
from tiledattention.kernels.backward._launch import dkdv_constants, dq_constants

from .test_backward_gpu import (check_grads, is_zero, poisoned_backward, random_inputs,
                                reference_grads, rel_l2, torch_baseline)

pytestmark = pytest.mark.gpu

MASKS = {"full": False, "tl": True, "br": "bottom_right"}


@pytest.mark.parametrize("mode,splits", [("kernel", 1), ("kernel", 2), ("atomic", 1)])
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("d", [40, 72, 80, 96, 160, 192])
def test_split_head_dim_gradients_match_the_reference(d, mask, mode, splits):
    causal = MASKS[mask]
    dtype = torch.float16 if d in (72, 160) else torch.bfloat16
    q, k, v, grad_out = random_inputs(2, 8, 2, 333, 1000 if mask == "br" else 333, d, dtype,
                                      seed=d + splits)
    out, lse = tiledattention.sdpa_with_lse(q, k, v, causal)
    problem, _ = problem_from_arrays(q, k, v, causal, None)
    schedule = BACKWARD.default_schedule("sm_90", problem).replace(
        split_d=True, dq_mode=mode, dkdv_splits=splits)
    first, second = head_dim_parts(d, True)
    for constants in (dq_constants(problem, schedule), dkdv_constants(problem, schedule)):
        assert (constants["TILE_D"], constants["TILE_D2"]) == (first, second) and second
    _, grads = poisoned_backward(q, k, v, out, lse, grad_out, problem, schedule)
    reference = reference_grads(q, k, v, causal, grad_out)
    label = f"D {d} {mask} {schedule.describe()}"
    check_grads(grads, reference, torch_baseline(q, k, v, causal, grad_out, reference), dtype,
                label)
    _, padded = poisoned_backward(q, k, v, out, lse, grad_out, problem,
                                  schedule.replace(split_d=False))
    for which, a, b in zip(("dq", "dk", "dv"), grads, padded):
        assert rel_l2(a, b.float()) <= 2e-3, f"{label} {which}: split and padded differ"


def test_packed_batch_with_a_split_head_dim():
    """``varlen_attn``'s backward (the ragged kernels with work tables) at D 72, split by its
    default, against the float32 reference per sequence."""
    lengths = [1, 37, 300, 129, 64, 511]
    total, heads_q, heads_kv, d = sum(lengths), 8, 2, 72
    gen = torch.Generator(device="cuda").manual_seed(5)

    def make(h):
        return torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16,
                           generator=gen).requires_grad_(True)

    q, k, v = make(heads_q), make(heads_kv), make(heads_kv)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda",
                           dtype=torch.int32)
    grad_out = torch.randn(total, heads_q, d, device="cuda", dtype=torch.bfloat16,
                           generator=gen)
    out = tiledattention.varlen_attn(q, k, v, offsets, offsets, max(lengths), max(lengths),
                                     is_causal=True, enable_gqa=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out)
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        parts = [x[rows].transpose(0, 1).unsqueeze(0) for x in (q, k, v)]
        ref = reference_grads(*parts, True, grad_out[rows].transpose(0, 1).unsqueeze(0))
        for which, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
            got = got[rows].transpose(0, 1).unsqueeze(0)
            if is_zero(want):  # (a sequence of one token has dQ = 0)
                assert got.float().abs().max().item() <= 1e-3, f"sequence of {n}: {which}"
                continue
            err = rel_l2(got, want)
            assert err <= 2e-2, f"sequence of {n}: {which} rel L2 {err:.2e}"
        start += n


def test_sdpa_backward_default_splits_a_head_dim_of_two_parts():
    q, k, v, grad_out = random_inputs(1, 4, 4, 500, 500, 80, torch.bfloat16, seed=11)
    problem, _ = problem_from_arrays(q, k, v, True, None)
    assert BACKWARD.default_schedule("sm_90", problem).split_d
    out, lse = tiledattention.sdpa_with_lse(q, k, v, True)
    grads = tiledattention.sdpa_backward(grad_out, q, k, v, out, lse, True)
    reference = reference_grads(q, k, v, True, grad_out)
    check_grads(grads, reference, torch_baseline(q, k, v, True, grad_out, reference),
                torch.bfloat16, "default")
