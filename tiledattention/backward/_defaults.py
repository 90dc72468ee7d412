"""The backward family's per-architecture default schedule: what runs for a shape nobody tuned
and the shipped table does not cover."""

from __future__ import annotations

from .._compile import SM_COUNTS, generation
from .._problem import Problem, padded_head_dim
from ._launch import normalise
from ._schedule import SPLITS, BackwardSchedule

__all__ = ["default_backward_schedule", "dkdv_splits", "WAVES", "FILL", "MAX_CAUSAL_WALK",
           "MAX_SPLIT_SCRATCH"]

#: Hopper defaults by padded head dim, from an H100 sweep of each kernel alone at the bench
#: grid's S = 4k points, bf16, causal and not (scripts/backward_probe.py at 6113995; numbers in
#: docs/benchmarks/backward/README.md). Two CTAs per SM paid 1.3-1.8x in both kernels at D <= 128;
#: at D = 256 the dK/dV kernel's two [64, 256] float32 accumulators need 8 worker warps (3.4x
#: faster than without) and Q/dO loads issued three steps ahead (+8%).
_HOPPER = {
    64: BackwardSchedule(dkdv_tile_n=64, dkdv_tile_m=128, dkdv_occupancy=2,
                         dq_tile_m=64, dq_tile_n=64, dq_occupancy=2),
    128: BackwardSchedule(dkdv_tile_n=64, dkdv_tile_m=64, dkdv_occupancy=2,
                          dq_tile_m=128, dq_tile_n=64, dq_occupancy=2, dq_worker_warps=8),
    256: BackwardSchedule(dkdv_tile_n=64, dkdv_tile_m=64, dkdv_worker_warps=8, q_latency=3,
                          dq_tile_m=64, dq_tile_n=64, dq_occupancy=2),
}
#: Elsewhere (not measured here): Hopper's tiles, one CTA per SM (the consumer parts and Ampere
#: have less shared memory and register file per CTA to share).
_OTHER = {d: s.replace(dkdv_occupancy=1, dq_occupancy=1) for d, s in _HOPPER.items()}


#: Waves of CTAs (SMs x the dK/dV kernel's occupancy) the dK/dV grid should fill before its
#: walk is split: one without a mask (every CTA does the same work), three with one (causal
#: walks differ in length, and more, shorter CTAs even the tail out). From the H100 probes of
#: issue 31 (scripts/backward_parallel_probe.py; docs/benchmarks/backward/training.md): the
#: multi-query B1 H8/1 S6144 D128 causal backward ran 2.1x faster with 8 splits (96 CTAs ->
#: 768), B4 H8/1 S2048 D96 full 1.41x with 2; splitting a grid that already fills its waves
#: cost 4-8% (MHA S8192 full, D256 at one CTA per SM).
WAVES = {False: 1, True: 3}
#: A grid within this share of its waves counts as filling them.
FILL = 0.9
#: Longest causal walk (query heads x query tiles) one dK/dV CTA should take: the longest
#: walks of a causal grid finish last. B1 H32/4 S8192 D128 causal (up to 8 x 128 steps a CTA)
#: ran 1.13x faster with 2 splits and 1.19x with 4, though 2 filled the waves.
MAX_CAUSAL_WALK = 256
#: Most float32 scratch the default's split partials (dK and dV, ``splits`` of each) may take:
#: a 32k-token causal backward would otherwise split 8 ways for its long walks and hold 0.5 GiB
#: of partials where its gradients take 0.1 GiB.
MAX_SPLIT_SCRATCH = 256 << 20


def dkdv_splits(arch: str, problem: Problem, schedule: BackwardSchedule) -> int:
    """The fewest dK/dV splits (a power of two, at most 16) with which the dK/dV grid fills
    ``WAVES[causal]`` waves of the generation's largest part and, with a causal mask, no CTA
    walks more than ``MAX_CAUSAL_WALK`` (query head, query tile) pairs; fewer where the
    partials would take more than ``MAX_SPLIT_SCRATCH``."""
    p = problem
    slots = SM_COUNTS[generation(arch)] * schedule.dkdv_occupancy
    ctas = -(-p.seqlen_k // schedule.dkdv_tile_n) * p.batch * p.heads_kv
    walk = p.group_size * -(-p.seqlen_q // schedule.dkdv_tile_m)
    per_split = 2 * p.batch * p.heads_kv * p.seqlen_k * p.head_dim * 4  # dK and dV, float32
    want = FILL * WAVES[p.causal] * slots
    splits = 1
    while (splits < SPLITS[-1] and 2 * splits * per_split <= MAX_SPLIT_SCRATCH
           and (ctas * splits < want or (p.causal and walk > MAX_CAUSAL_WALK * splits))):
        splits *= 2
    return splits


def default_backward_schedule(arch: str, problem: Problem) -> BackwardSchedule:
    """Per-architecture default by head dim (``_HOPPER`` on sm_90, else ``_OTHER``), its
    dK/dV walk split over enough CTAs to fill the GPU (``dkdv_splits``), the causal dQ kernel
    run longest tiles first (H100 probe, issue 31: 0-3% faster on six causal training shapes,
    never slower), with tiles capped at what the problem needs (``normalise``)."""
    table = _HOPPER if generation(arch) == "hopper" else _OTHER
    base = normalise(problem, table[max(64, padded_head_dim(problem.head_dim))])
    return normalise(problem, base.replace(dkdv_splits=dkdv_splits(arch, problem, base),
                                           dq_heavy_first=problem.causal))
