"""The forward with a K/V group's query heads packed into one tile (``Schedule.pack_gqa``) on
the GPU, against the float32 reference (``tiledattention.core._reference``) and against the
unpacked kernel.

A packed tile's row ``r`` is head ``r // rows`` at position ``r % rows``: a kernel that mixes
the heads up, masks by the tile's row instead of its position, or walks the key tiles of
``tile_m`` positions instead of ``tile_m / group`` gives another head's output or a wrong
causal edge, which the reference catches. A group that is not a power of two (3, 5, 6, 7)
fills a power of two of head slots, the rest idle: one stored over the next group's first
head, or a group stored at another's heads, is caught the same way (the outputs are poisoned),
in every layout of q (transposed, rows not 16-byte aligned).
Groups of 2-16 (multi-query), causal in both
alignments with S_q != S_k, odd lengths past the tiles' edges, windows, a binding softcap,
sinks (each row its own head's), a head dim of two parts, the stored log-sum-exp, persistent
and paired walks, and packed variable-length batches (NaN poison sequences between the real
ones) under both ragged launch modes. Outputs are poisoned with NaN before each launch.
"""

from __future__ import annotations

import pytest
import torch

from tiledattention import FORWARD, Problem, Schedule
from tiledattention.core._problem import row_stat_shape
from tiledattention.core._reference import attention_reference
from tiledattention.kernels.forward import _launch
from tiledattention.kernels.forward._launch import default_scale, launch_with_lse

from . import test_varlen_gpu as varlen
from ._reference import rel_l2
from .test_varlen_gpu import LENGTHS, check, check_grads, packed_batch

pytestmark = pytest.mark.gpu

launch_mode = varlen.launch_mode  # the fixture: every ragged launch on a work table, or none


def _inputs(problem: Problem, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = torch.bfloat16 if problem.dtype == "bf16" else torch.float16

    def rand(heads: int, seqlen: int) -> torch.Tensor:
        return torch.randn(problem.batch, heads, seqlen, problem.head_dim, device="cuda",
                           dtype=dtype, generator=gen)

    q = (rand(problem.heads_q, problem.seqlen_q).float() * 2.0).to(dtype)  # binds a softcap
    k, v = rand(problem.heads_kv, problem.seqlen_k), rand(problem.heads_kv, problem.seqlen_k)
    sinks = (torch.randn(problem.heads_q, device="cuda", generator=gen) * 2.0 + 2.0
             if problem.sinks else None)  # per head: a row that took another head's is wrong
    return q, k, v, sinks


def _run(problem: Problem, schedule: Schedule, q, k, v, sinks):
    """Output and log-sum-exp of the forward under ``schedule``, into NaN-poisoned arrays."""
    out = torch.full_like(q, float("nan"))
    stats = torch.full(row_stat_shape(problem), float("nan"), device="cuda")
    lse = stats[:, :, :problem.seqlen_q]
    sm_count = torch.cuda.get_device_properties(q.device).multi_processor_count
    launch_with_lse(torch.cuda.current_stream(), q, k, v, out, lse, problem,
                    FORWARD.normalise(problem, schedule), default_scale(problem), sm_count,
                    sinks=sinks)
    torch.cuda.synchronize()
    return out, lse


CASES = {
    "gqa4_causal_odd": dict(hq=16, hkv=4, sq=333, sk=333, causal=True),
    "gqa2_full": dict(hq=8, hkv=4, sq=257, sk=257),
    "gqa8_bottom_right_more_keys": dict(hq=32, hkv=4, sq=77, sk=1000, causal=True,
                                        bottom_right=True),
    "gqa8_bottom_right_more_queries": dict(hq=16, hkv=2, sq=700, sk=301, causal=True,
                                           bottom_right=True),
    "mqa16_short_queries": dict(hq=16, hkv=1, sq=19, sk=2049, causal=True, bottom_right=True),
    "mqa16_full": dict(hq=16, hkv=1, sq=130, sk=130),
    "gqa4_window_two_sided": dict(hq=8, hkv=2, sq=600, sk=600, window_left=100,
                                  window_right=20),
    "gqa4_window_causal": dict(hq=8, hkv=2, sq=600, sk=600, causal=True, window_left=64),
    "gqa4_softcap_sinks": dict(hq=8, hkv=2, sq=300, sk=300, causal=True, softcap=20.0,
                               sinks=True),
    "gqa4_d96_fp16": dict(hq=12, hkv=3, sq=211, sk=211, causal=True, d=96, dtype="fp16"),
    "gqa4_d64": dict(hq=8, hkv=2, sq=1000, sk=1000, causal=True, d=64),
    # idle slots: the last group's run past the heads
    "gqa7_bottom_right_chunk": dict(hq=28, hkv=4, sq=400, sk=1500, causal=True,
                                    bottom_right=True),
    "gqa7_mqa_short_queries": dict(hq=7, hkv=1, sq=19, sk=2049, causal=True, bottom_right=True),
    "gqa3_softcap_sinks": dict(hq=12, hkv=4, sq=333, sk=333, causal=True, softcap=20.0,
                               sinks=True),
    "gqa5_window_two_sided": dict(hq=10, hkv=2, sq=600, sk=600, window_left=100,
                                  window_right=20),
    "gqa6_d96_fp16": dict(hq=12, hkv=2, sq=211, sk=211, causal=True, d=96, dtype="fp16"),
}

SCHEDULES = {
    "64x64": Schedule(tile_m=64, tile_n=64, pack_gqa=True),
    "128x128_w8_exp2": Schedule(tile_m=128, tile_n=128, num_worker_warps=8, exp2=True,
                                approx_div=True, pack_gqa=True),
    "64x128_sawtooth_split_masked": Schedule(tile_m=64, tile_n=128, kv_sawtooth=True,
                                             split_masked=True, longest_first=True,
                                             pack_gqa=True),
    "persistent_paired": Schedule(tile_m=64, tile_n=64, persistent=True, paired_tiles=True,
                                  occupancy=2, pack_gqa=True),
    "128x128_two_ctas": Schedule(tile_m=128, tile_n=128, occupancy=2, num_ctas=2,
                                 longest_first=True, pack_gqa=True),
}


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_packed_heads_match_the_reference_and_the_unpacked_kernel(case, schedule):
    case = dict(case)
    problem = Problem(batch=2, heads_q=case.pop("hq"), heads_kv=case.pop("hkv"),
                      seqlen_q=case.pop("sq"), seqlen_k=case.pop("sk"),
                      head_dim=case.pop("d", 128), dtype=case.pop("dtype", "bf16"),
                      causal=case.pop("causal", False), **case)
    assert _launch.packed_heads(problem, FORWARD.normalise(problem, schedule)) == \
        problem.group_size  # the case runs packed
    q, k, v, sinks = _inputs(problem, seed=problem.seqlen_q)
    out, lse = _run(problem, schedule, q, k, v, sinks)
    ref = attention_reference(q, k, v, problem, sinks=sinks)
    err = rel_l2(out, ref)  # inf if any element is not finite
    assert err <= FORWARD.tolerance(problem), f"rel L2 {err:.2e} {problem.describe()}"
    plain_out, plain_lse = _run(problem, schedule.replace(pack_gqa=False), q, k, v, sinks)
    assert rel_l2(out, plain_out) <= FORWARD.tolerance(problem)
    # the log-sum-exp the backward reads: each row's own (inf for a row that sees no key)
    finite = torch.isfinite(plain_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.allclose(lse[finite], plain_lse[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["bshd", "odd_rows"])
@pytest.mark.parametrize("hq, hkv", [(28, 4), (10, 2)])
def test_idle_slots_read_q_in_any_layout(hq, hkv, layout):
    """Groups of 7 and 5 (idle slots) read q through a view stepping a group's heads: q as a
    transposed ``[B, S, H, D]`` tensor, or cut from rows of ``D + 3`` elements (strides of no
    16-byte multiple)."""
    problem = Problem(batch=2, heads_q=hq, heads_kv=hkv, seqlen_q=150, seqlen_k=700,
                      head_dim=128, dtype="bf16", causal=True, bottom_right=True)
    q, k, v, _ = _inputs(problem, seed=hq)
    if layout == "bshd":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    else:
        wide = torch.full((*q.shape[:3], q.shape[3] + 3), float("nan"), device="cuda",
                          dtype=q.dtype)
        wide[..., :q.shape[3]] = q
        q = wide[..., :q.shape[3]]
    ref = attention_reference(q, k, v, problem)
    for schedule in (SCHEDULES["128x128_two_ctas"], SCHEDULES["64x64"]):
        out, _ = _run(problem, schedule, q, k, v, None)
        assert rel_l2(out, ref) <= FORWARD.tolerance(problem), (layout, schedule)


def test_groups_that_do_not_pack_run_unpacked():
    """A group of 1, or wider than the tile (64 heads, or 40 in 64 slots, over 32 rows) runs
    the plain kernel: the flag normalises away and the output matches the reference."""
    for hq, hkv, tile_m in ((8, 8, 64), (40, 1, 32), (64, 1, 32)):
        problem = Problem(batch=1, heads_q=hq, heads_kv=hkv, seqlen_q=100, seqlen_k=100,
                          head_dim=64, dtype="bf16", causal=True)
        schedule = Schedule(tile_m=tile_m, tile_n=64, pack_gqa=True)
        assert not FORWARD.normalise(problem, schedule).pack_gqa
        q, k, v, _ = _inputs(problem, seed=hq)
        out, _ = _run(problem, schedule, q, k, v, None)
        assert rel_l2(out, attention_reference(q, k, v, problem)) <= FORWARD.tolerance(problem)


@pytest.fixture
def packed_ragged(monkeypatch):
    """Every ragged forward launch packs its groups' heads (``pack_gqa``), whatever the lookup
    gave; counts the launches that did."""
    plain = _launch.ragged_launch
    packed = []

    def ragged_launch(problem, schedule, *args, **kwargs):
        schedule = schedule.replace(pack_gqa=True)
        packed.append(_launch.packed_heads(problem, _launch.normalise(problem, schedule)))
        return plain(problem, schedule, *args, **kwargs)
    monkeypatch.setattr(_launch, "ragged_launch", ragged_launch)
    return packed


@pytest.mark.parametrize("is_causal", [False, True, "top_left"])
def test_packed_variable_length_batches(packed_ragged, launch_mode, is_causal):
    q, k, v, cu_q, cu_k, real = packed_batch(LENGTHS, LENGTHS[::-1], hq=8, hkv=2, seed=5)
    check(q, k, v, cu_q, cu_k, real, is_causal=is_causal)
    check(q, k, v, cu_q, cu_k, real, window=(100, 0))
    lens_q = [0, 5, 9, 0, 33, 4, 2000, 16]
    lens_k = [0, 0, 9, 12, 33, 0, 2100, 16]
    q, k, v, cu_q, cu_k, real = packed_batch(lens_q, lens_k, hq=16, hkv=1, d=64,
                                             dtype=torch.float16, seed=6)
    check(q, k, v, cu_q, cu_k, real, is_causal=is_causal)
    for hq, hkv in ((28, 4), (12, 4)):  # groups of 7 and 3: idle slots
        q, k, v, cu_q, cu_k, real = packed_batch(lens_q, lens_k, hq=hq, hkv=hkv, seed=hq)
        check(q, k, v, cu_q, cu_k, real, is_causal=is_causal)
    assert packed_ragged and all(p > 1 for p in packed_ragged)


def test_packed_variable_length_gradients(packed_ragged):
    """Training through packed tiles: the backward reads the log-sum-exp the packed forward
    stored, so a row stored under another head's index gives wrong gradients."""
    check_grads(LENGTHS, LENGTHS, is_causal=True, hq=8, hkv=2)
    check_grads([3, 100, 0, 50, 129], [10, 100, 7, 49, 200], is_causal=True, hq=16, hkv=4,
                d=64, dtype=torch.float16)
    check_grads([3, 100, 0, 50, 129], [10, 100, 7, 49, 200], is_causal=True, hq=28, hkv=4)
    assert packed_ragged and all(p > 1 for p in packed_ragged)
