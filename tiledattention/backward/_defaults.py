"""The backward family's per-architecture default schedule: what runs for a shape nobody tuned
and the shipped table does not cover."""

from __future__ import annotations

from .._compile import generation
from .._problem import Problem, padded_head_dim
from ._launch import normalise
from ._schedule import BackwardSchedule

__all__ = ["default_backward_schedule"]

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


def default_backward_schedule(arch: str, problem: Problem) -> BackwardSchedule:
    """Per-architecture default by head dim (``_HOPPER`` on sm_90, else ``_OTHER``), with tiles
    capped at what the problem needs (``normalise``)."""
    table = _HOPPER if generation(arch) == "hopper" else _OTHER
    return normalise(problem, table[max(64, padded_head_dim(problem.head_dim))])
