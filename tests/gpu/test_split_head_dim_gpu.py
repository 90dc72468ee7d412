"""Head dims that are not powers of two, run as two power-of-two parts (``split_d``), against the
float32 reference on the GPU: second parts of 16, 32 and 64 columns (and 72, whose second part is
partly zero-filled), both causal alignments, odd lengths, S_q != S_k, grouped-query heads, the
training forward's log-sum-exps, the unchecked loads that exact parts allow, and sdpa's own
default. Outputs are poisoned with NaN before each run."""

from __future__ import annotations

import pytest
import torch

import tiledattention
from tiledattention import FORWARD, Schedule, problem_from_arrays
from tiledattention.core._reference import attention_reference
from tiledattention.kernels.forward import head_dim_parts
from tiledattention.kernels.forward._launch import default_scale, kernel_constants, launch

from ._reference import TOLERANCE, random_qkv, rel_l2

pytestmark = pytest.mark.gpu

FAST = Schedule(tile_m=64, tile_n=128, occupancy=2, exp2=True, approx_div=True,
                k_transposed=True, split_d=True)
SCHEDULES = {
    "fast": FAST,
    "row_major_k_sawtooth": FAST.replace(k_transposed=False, kv_sawtooth=True, tile_n=64),
    "big_tiles_paired": FAST.replace(tile_m=128, num_worker_warps=8, paired_tiles=True,
                                     k_latency=4, v_latency=2),
    "persistent_split_masked": FAST.replace(persistent=True, split_masked=True, tile_n=32),
}


def run(q, k, v, causal, schedule):
    problem, _ = problem_from_arrays(q, k, v, causal, None)
    assert kernel_constants(problem, schedule)["TILE_D2"] == head_dim_parts(q.shape[-1], True)[1]
    out = torch.full_like(q, float("nan"))
    launch(torch.cuda.current_stream(), q, k, v, out, problem, schedule, default_scale(problem),
           torch.cuda.get_device_properties(q.device).multi_processor_count)
    return out, problem


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("d", [40, 72, 80, 96, 160, 192])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"], ids=["full", "tl", "br"])
def test_split_head_dims(d, causal, name):
    if name == "big_tiles_paired" and d > 128:
        pytest.skip("128-row tiles at D > 128 are the D=256 default's territory")
    q, k, v = random_qkv(2, 8, 2, 333, 1000 if causal == "bottom_right" else 333, d,
                         torch.bfloat16, seed=d)
    out, problem = run(q, k, v, causal, SCHEDULES[name])
    err = rel_l2(out, attention_reference(q, k, v, problem))
    assert err <= TOLERANCE[q.dtype], f"D={d} {name}: rel L2 {err:.2e}"


@pytest.mark.parametrize("d", [80, 96])
def test_unchecked_loads_with_exact_parts(d):
    q, k, v = random_qkv(1, 4, 4, 256, 512, d, torch.float16, seed=3)
    out, problem = run(q, k, v, False, FAST.replace(unchecked_loads=True))
    assert kernel_constants(problem, FAST.replace(unchecked_loads=True))["CHECK_BOUNDS"] is False
    err = rel_l2(out, attention_reference(q, k, v, problem))
    assert err <= TOLERANCE[q.dtype]


@pytest.mark.parametrize("d", [80, 96, 192])
def test_sdpa_and_training_forward_split(d):
    q, k, v = random_qkv(2, 8, 4, 517, 517, d, torch.bfloat16, seed=d + 1)
    problem, _ = problem_from_arrays(q, k, v, True, None)
    ref = attention_reference(q, k, v, problem)
    out = tiledattention.sdpa(q, k, v, causal=True, schedule=FAST)
    assert rel_l2(out, ref) <= TOLERANCE[q.dtype]
    out, lse = tiledattention.sdpa_with_lse(q, k, v, causal=True, schedule=FAST)
    assert rel_l2(out, ref) <= TOLERANCE[q.dtype]
    # base-2 log-sum-exp of the scaled scores, row by row
    scores = (q.float() @ k.float().repeat_interleave(2, 1).transpose(-1, -2)) * d ** -0.5
    mask = torch.ones(517, 517, dtype=torch.bool, device=q.device).tril()
    want = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), -1) / torch.log(
        torch.tensor(2.0))
    assert torch.allclose(lse, want, atol=2e-2, rtol=1e-3)
    # the default of this head dim too
    default = FORWARD.default_schedule("sm_90", problem)
    out = tiledattention.sdpa(q, k, v, causal=True, schedule=default)
    assert rel_l2(out, ref) <= TOLERANCE[q.dtype]
