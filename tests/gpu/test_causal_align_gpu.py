"""Bottom-right causal alignment on the GPU: the forward kernel against a float32 reference with
the mask built explicitly (query row ``i`` sees keys ``0..i + S_k - S_q``; rows that see no key,
possible when ``S_q > S_k``, must be exact zeros), over shapes, head dims, GQA and the schedule
flags that reorder or pair the query tiles; and ``causal_lower_right`` through the SDPA router.

Outputs are poisoned with NaN before each run, so an element the kernel forgot fails the test.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import tiledattention
from tiledattention import FORWARD, Schedule, problem_from_arrays
from tiledattention.core._reference import attention_reference as forward_reference
from tiledattention.kernels.forward._launch import default_scale, launch

from ._reference import TOLERANCE, random_qkv, rel_l2

pytestmark = pytest.mark.gpu

#: (S_q, S_k): decode-like, ragged, more queries than keys (rows 0..92 see no key), a ragged
#: key tail past a power of two, and neither a multiple of a tile
SHAPES = [(16, 8192), (7, 100), (100, 7), (64, 4097), (333, 1000)]

BASE = Schedule(tile_m=64, tile_n=64)
SCHEDULES = {
    "persistent": BASE.replace(persistent=True, occupancy=2),
    "paired_tiles": BASE.replace(paired_tiles=True),
    # 32-row tiles: odd tile counts leave a middle tile alone in its pair
    "paired_persistent_sawtooth": BASE.replace(tile_m=32, paired_tiles=True, persistent=True,
                                               kv_sawtooth=True),
    "longest_first": BASE.replace(longest_first=True, tile_n=128),
    "kv_sawtooth": BASE.replace(kv_sawtooth=True, tile_n=32),
    "split_masked_sawtooth": BASE.replace(split_masked=True, kv_sawtooth=True, exp2=True,
                                          approx_div=True),
    "tile_m128_split_masked": BASE.replace(tile_m=128, split_masked=True, longest_first=True),
}


def arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def expected(q, k, v, scale=None):
    problem, _ = problem_from_arrays(q, k, v, "bottom_right", scale)
    return forward_reference(q, k, v, problem, scale), problem


def launch_poisoned(q, k, v, schedule, scale=None):
    """Launch the forward kernel into a NaN-poisoned output buffer."""
    problem, _ = problem_from_arrays(q, k, v, "bottom_right", scale)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    launch(torch.cuda.current_stream(), q, k, v, out, problem, FORWARD.normalise(problem, schedule),
           default_scale(problem) if scale is None else scale,
           torch.cuda.get_device_properties(q.device).multi_processor_count)
    return out


def check(out, q, k, v, scale=None, label=""):
    ref, problem = expected(q, k, v, scale)
    assert out.shape == q.shape
    err = rel_l2(out, ref)  # inf if any element is not finite
    assert err <= FORWARD.tolerance(problem), f"rel L2 {err:.2e} {label}"
    sq, sk = q.shape[2], k.shape[2]
    if problem.bottom_right and sq > sk:  # rows 0 .. sq-sk-1 see no key: exact zeros
        blind = out[:, :, : sq - sk]
        assert torch.count_nonzero(blind).item() == 0, f"rows without a key not zero {label}"
    if problem.bottom_right and sq < sk:  # must differ from top-left here (the test's own check)
        top_left = forward_reference(q, k, v, dataclasses.replace(problem, bottom_right=False),
                                     scale)
        assert rel_l2(out, top_left) > 10 * FORWARD.tolerance(problem)


@pytest.mark.parametrize("d", [64, 128, 96])
@pytest.mark.parametrize("sq,sk", SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
def test_default_schedule(sq, sk, d):
    q, k, v = random_qkv(2, 8, 2, sq, sk, d, torch.bfloat16, seed=sq * 7 + sk + d)
    problem, _ = problem_from_arrays(q, k, v, "bottom_right", None)
    schedule = FORWARD.default_schedule(arch(), problem)
    check(launch_poisoned(q, k, v, schedule), q, k, v, label=schedule.describe())
    # the public entry point with an explicit forward schedule (stays on the forward kernel)
    out = tiledattention.sdpa(q, k, v, causal="bottom_right", schedule=schedule)
    check(out, q, k, v, label="sdpa " + schedule.describe())


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("sq,sk", SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
def test_schedules(sq, sk, name):
    schedule = SCHEDULES[name]
    q, k, v = random_qkv(1, 8, 2, sq, sk, 128, torch.bfloat16, seed=sq + 3 * sk)
    check(launch_poisoned(q, k, v, schedule), q, k, v, label=name)
    out = tiledattention.sdpa(q, k, v, causal="bottom_right", schedule=schedule)
    check(out, q, k, v, label=f"sdpa {name}")


@pytest.mark.parametrize("sq,sk", [(100, 7), (333, 1000)])
def test_fp16_and_scale(sq, sk):
    q, k, v = random_qkv(1, 8, 2, sq, sk, 96, torch.float16, seed=sq)
    for schedule in (BASE, SCHEDULES["paired_persistent_sawtooth"]):
        check(launch_poisoned(q, k, v, schedule, scale=0.07), q, k, v, scale=0.07,
              label=schedule.describe())
    assert TOLERANCE[torch.float16] == FORWARD.tolerance(
        problem_from_arrays(q, k, v, "bottom_right", None)[0])


def test_more_queries_than_keys_leaves_whole_tiles_without_keys():
    """S_q - S_k spans several query tiles: tiles that visit no key tile store zeros."""
    q, k, v = random_qkv(1, 4, 4, 1000, 70, 64, torch.bfloat16, seed=5)
    for schedule in (BASE, BASE.replace(tile_m=32, paired_tiles=True, persistent=True),
                     BASE.replace(longest_first=True, split_masked=True)):
        check(launch_poisoned(q, k, v, schedule), q, k, v, label=schedule.describe())


def test_family_case_checks_bottom_right():
    """The tuner's GPU case: its reference honours the alignment, its error is small."""
    problem = tiledattention.Problem(batch=1, heads_q=8, heads_kv=2, seqlen_q=100, seqlen_k=7,
                                     head_dim=64, dtype="bf16", causal=True, bottom_right=True)
    case = FORWARD.case(problem, torch.cuda.current_device())
    assert torch.isfinite(case.reference).all()
    assert torch.count_nonzero(case.reference[:, :, :93]).item() == 0
    assert case.error(case.launcher(BASE)) <= FORWARD.tolerance(problem)
    wrong = dataclasses.replace(problem, bottom_right=False)
    wrong_case = FORWARD.case(wrong, torch.cuda.current_device())
    assert rel_l2(wrong_case.reference, case.reference) > 0.1


def test_top_left_is_unchanged_where_it_differs():
    """causal=True on the same tensors still masks top-left."""
    q, k, v = random_qkv(1, 8, 2, 64, 4097, 128, torch.bfloat16, seed=9)
    out = tiledattention.sdpa(q, k, v, causal=True, schedule=BASE)
    problem, _ = problem_from_arrays(q, k, v, True, None)
    assert rel_l2(out, forward_reference(q, k, v, problem)) <= FORWARD.tolerance(problem)


# ------------------------------------------------------------------------------ the router

@pytest.fixture
def router_off():
    import tiledattention.integrations as ti

    ti.disable()
    ti.reset_router_stats()
    yield ti
    ti.disable()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_router_runs_causal_lower_right_on_the_kernel(dtype, router_off):
    bias_module = pytest.importorskip("torch.nn.attention.bias")
    ti = router_off
    q, k, v = random_qkv(2, 8, 2, 16, 8192, 128, dtype, seed=2)
    with torch.no_grad(), ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias_module.causal_lower_right(16, 8192), enable_gqa=True)
        upper = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias_module.causal_upper_left(16, 8192), enable_gqa=True)
    stats = ti.router_stats()
    assert (stats.tiledattention, stats.torch) == (2, 0), stats
    check(out, q, k, v)
    problem, _ = problem_from_arrays(q, k, v, True, None)
    assert rel_l2(upper, forward_reference(q, k, v, problem)) <= FORWARD.tolerance(problem)


def test_router_gives_causal_bias_calls_it_does_not_take_to_torch(router_off):
    """An input the kernel cannot take (head_dim 20) goes to torch's own CausalBias dispatch,
    bias intact; one it can take, requiring grad, runs forward and backward on the kernels."""
    bias_module = pytest.importorskip("torch.nn.attention.bias")
    ti = router_off
    q, k, v = random_qkv(1, 4, 4, 16, 512, 20, torch.bfloat16, seed=3)
    bias = bias_module.causal_lower_right(16, 512)
    q_grad = q.detach().clone().requires_grad_(True)
    expected_out = F.scaled_dot_product_attention(q_grad, k, v, attn_mask=bias)
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q_grad, k, v, attn_mask=bias)
    assert ti.router_stats().fallbacks == {"head_dim": 1}
    assert torch.equal(out, expected_out)

    q, k, v = random_qkv(1, 4, 4, 16, 512, 64, torch.bfloat16, seed=3)
    q_grad = q.detach().clone().requires_grad_(True)
    ti.reset_router_stats()
    with ti.sdpa_kernel():
        out = F.scaled_dot_product_attention(q_grad, k, v, attn_mask=bias)
    assert (ti.router_stats().tiledattention, ti.router_stats().torch) == (1, 0)
    out.float().square().sum().backward()
    q_ref = q.detach().float().requires_grad_(True)
    problem, _ = problem_from_arrays(q, k, v, "bottom_right", None)
    forward_reference(q_ref, k, v, problem).square().sum().backward()
    assert rel_l2(q_grad.grad, q_ref.grad) <= 2e-2
    check(out.detach(), q, k, v)
