"""The forward kernel's per-architecture default schedule: what ``sdpa`` runs for a shape nobody
tuned and the shipped table does not cover."""

from __future__ import annotations

from .._compile import generation
from ._problem import Problem
from ._schedule import Schedule

__all__ = ["default_schedule"]


def default_schedule(arch: str, problem: Problem) -> Schedule:
    """Per-architecture default, used when no tuned schedule is known for a shape.

    sm_90 (``docs/tuning.md``, ``docs/performance-notes.md``): for D <= 128 the best of ten
    hand-picked schedules (H200), 64x128 tiles at occupancy 2 with exp2, approximate division
    and K loaded transposed; causal with S_q >= 4k, the same 128-row tile split over a cluster of
    two CTAs, longest query tiles first (H100 probe 8: 0.99-1.24x the 64x128 default on the 12
    D64/D128 bf16/fp16 points with S >= 4k, 1.13-1.24x at D128 S >= 8k; 0.97-1.02x below 4k).
    For D > 128 the schedule the tuner found for every D=256 key with S >= 4k (128x128, 8 worker
    warps, occupancy 3), 1.2-1.36x faster than 64x128 there; causal, with query tiles paired
    (H100 probe 11, bf16: 1.03x, 1.08x, 1.11x, 1.12x, 1.10x the unpaired schedule at S = 1k,
    2k, 4k, 8k, 16k). Other architectures get the choices public cuTile attention code reports
    as good there (not measured by this project).
    """
    gen = generation(arch)
    fast_math = dict(exp2=True, approx_div=True, k_transposed=True)
    if gen == "hopper":
        if problem.head_dim > 128:
            return Schedule(tile_m=128, tile_n=128, occupancy=3, num_worker_warps=8, exp2=True,
                            k_transposed=True, k_latency=4, v_latency=2,
                            paired_tiles=problem.causal)
        if problem.causal and problem.seqlen_q >= 4096:
            return Schedule(tile_m=128, tile_n=128, occupancy=2, num_ctas=2, longest_first=True,
                            **fast_math)
        return Schedule(tile_m=64, tile_n=128, occupancy=2, **fast_math)
    if gen == "blackwell":
        return Schedule(tile_m=128, tile_n=128, occupancy=2, **fast_math)
    # consumer Blackwell, Ada, Ampere: 99-163 KiB of shared memory per SM
    return Schedule(tile_m=64, tile_n=64, occupancy=2 if problem.head_dim <= 128 else 1,
                    **fast_math)
