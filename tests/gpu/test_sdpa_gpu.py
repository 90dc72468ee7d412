"""sdpa against a float32 reference on the GPU (relative L2: bf16 <= 1e-2, fp16 <= 5e-3).

Outputs are poisoned with NaN before each run (the runtime allocates with torch.empty; the
tests also launch into a NaN-filled buffer), so an element the kernel forgot fails the test.
Causal masking is PyTorch's ``is_causal``: top-left aligned (query i sees keys 0..i).
"""

from __future__ import annotations

import pytest
import torch

import tiledattention
from tiledattention import FORWARD, Schedule, problem_from_arrays
from tiledattention.kernels.forward._launch import default_scale, launch

from ._reference import TOLERANCE, random_qkv, reference, rel_l2

pytestmark = pytest.mark.gpu


def arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def run_poisoned(q, k, v, causal, schedule, scale=None):
    """Launch into a NaN-poisoned output buffer."""
    problem, _ = problem_from_arrays(q, k, v, causal, scale)
    out = torch.full((q.shape[0], q.shape[1], q.shape[2], q.shape[3]), float("nan"),
                     dtype=q.dtype, device=q.device)
    launch(torch.cuda.current_stream(), q, k, v, out, problem, schedule,
           default_scale(problem) if scale is None else scale,
           torch.cuda.get_device_properties(q.device).multi_processor_count)
    return out


def check(q, k, v, causal, schedule, scale=None):
    out = run_poisoned(q, k, v, causal, schedule, scale)
    err = rel_l2(out, reference(q, k, v, causal, scale))
    assert err <= TOLERANCE[q.dtype], f"rel L2 {err:.2e} ({schedule.describe()})"
    return out


def default_for(q, k, v, causal):
    problem, _ = problem_from_arrays(q, k, v, causal, None)
    return FORWARD.default_schedule(arch(), problem)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s", [1, 17, 128, 1000, 4096])
def test_seqlens(s, causal, dtype):
    q, k, v = random_qkv(2, 4, 4, s, s, 128, dtype, seed=s)
    check(q, k, v, causal, default_for(q, k, v, causal))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", [(1, 1000), (113, 4097), (1000, 17), (4097, 113), (300, 301)])
def test_seqlen_q_differs_from_k(sq, sk, causal):
    q, k, v = random_qkv(1, 4, 4, sq, sk, 128, torch.bfloat16, seed=sq + sk)
    check(q, k, v, causal, default_for(q, k, v, causal))


@pytest.mark.parametrize("hq,hkv", [(32, 8), (16, 1)], ids=["gqa32-8", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grouped_query(hq, hkv, causal):
    q, k, v = random_qkv(2, hq, hkv, 333, 517, 128, torch.bfloat16, seed=hq)
    check(q, k, v, causal, default_for(q, k, v, causal))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_head_dims(d, dtype):
    for causal in (False, True):
        q, k, v = random_qkv(2, 4, 2, 777, 1000, d, dtype, seed=d)
        check(q, k, v, causal, default_for(q, k, v, causal))


def test_noncontiguous_bshd_inputs_and_sdpa_entry_point():
    """[B, S, H, D] tensors viewed as [B, H, S, D]: strided, last dim contiguous, no copy."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    base = [torch.randn(2, s, h, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
            for s, h in ((999, 8), (1024, 2), (1024, 2))]
    q, k, v = (x.transpose(1, 2) for x in base)
    assert not q.is_contiguous()
    for causal in (False, True):
        out = tiledattention.sdpa(q, k, v, causal=causal)
        assert rel_l2(out, reference(q, k, v, causal)) <= 1e-2
        assert out.shape == (2, 8, 999, 64)


def test_scale_and_explicit_schedule():
    q, k, v = random_qkv(1, 2, 2, 500, 600, 64, torch.float16, seed=3)
    check(q, k, v, True, Schedule(tile_m=64, tile_n=32), scale=0.05)


def test_cupy_inputs_on_cupy_stream():
    cupy = pytest.importorskip("cupy")
    q, k, v = random_qkv(1, 4, 4, 257, 300, 64, torch.float16, seed=11)
    cq, ck, cv = (cupy.from_dlpack(x) for x in (q, k, v))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        out = tiledattention.sdpa(cq, ck, cv, causal=True)
    stream.synchronize()
    assert isinstance(out, cupy.ndarray)
    assert rel_l2(torch.from_dlpack(out), reference(q, k, v, True)) <= 5e-3


BASE = Schedule(tile_m=64, tile_n=64, occupancy=1)
TOGGLES = {
    "tile_m32": BASE.replace(tile_m=32),
    "tile_m128": BASE.replace(tile_m=128),
    "tile_m256_n32": BASE.replace(tile_m=256, tile_n=32),
    "tile_n128": BASE.replace(tile_n=128),
    "tile_n256": BASE.replace(tile_m=32, tile_n=256),
    "occupancy2": BASE.replace(occupancy=2),
    "num_ctas2": BASE.replace(num_ctas=2),
    "opt_level2": BASE.replace(opt_level=2),
    "worker_warps8": BASE.replace(tile_m=128, num_worker_warps=8),
    "latency_k3_v7": BASE.replace(k_latency=3, v_latency=7),
    "exp2": BASE.replace(exp2=True),
    "approx_div": BASE.replace(approx_div=True),
    "k_transposed": BASE.replace(k_transposed=True),
    "no_tma": BASE.replace(allow_tma=False),
    "kv_sawtooth": BASE.replace(kv_sawtooth=True),
    "longest_first": BASE.replace(longest_first=True),
    "unchecked_loads": BASE.replace(unchecked_loads=True),
    "split_masked": BASE.replace(split_masked=True),
    "split_masked_sawtooth": BASE.replace(split_masked=True, kv_sawtooth=True, tile_n=32),
    "split_masked_longest_first": BASE.replace(split_masked=True, longest_first=True, tile_m=128),
    "persistent": BASE.replace(persistent=True),
    "persistent_occ2_longest_first": BASE.replace(persistent=True, occupancy=2,
                                                  longest_first=True, split_masked=True),
    "paired_tiles": BASE.replace(paired_tiles=True),
    # 450 rows in 32-row tiles: 15 tiles, so the middle one is a work item of its own
    "paired_tiles_odd_sawtooth": BASE.replace(paired_tiles=True, tile_m=32, kv_sawtooth=True),
    "paired_persistent_occ2": BASE.replace(paired_tiles=True, persistent=True, occupancy=2,
                                           tile_m=128, split_masked=True),
}


@pytest.mark.parametrize("name", list(TOGGLES))
def test_every_dimension(name):
    schedule = TOGGLES[name]
    for causal in (False, True):
        # ragged shape: masking and zero-filled tails on every path
        q, k, v = random_qkv(1, 4, 2, 450, 333, 128, torch.bfloat16, seed=len(name))
        check(q, k, v, causal, schedule)
        # tile-aligned shape: where unchecked loads really drop the bounds checks
        q, k, v = random_qkv(1, 4, 2, 512, 1024, 128, torch.bfloat16, seed=len(name) + 1)
        check(q, k, v, causal, schedule)
