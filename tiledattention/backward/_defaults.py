"""The backward family's per-architecture default schedule: what runs for a shape nobody tuned
and the shipped table does not cover."""

from __future__ import annotations

from .._compile import generation
from ..forward._problem import Problem, padded_head_dim
from ._launch import normalise
from ._schedule import BackwardSchedule

__all__ = ["default_backward_schedule"]

#: (dkdv_tile_n, dkdv_tile_m, dq_tile_m, dq_tile_n) by padded head dim. Both kernels keep two
#: float32 accumulators or a [tile, D] accumulator and a [tile, tile] score tile in registers,
#: so the tiles shrink as D grows.
_TILES = {
    "hopper": {64: (128, 64, 128, 64), 128: (64, 64, 64, 64), 256: (64, 32, 64, 32)},
    "default": {64: (64, 64, 64, 64), 128: (64, 64, 64, 64), 256: (32, 32, 32, 32)},
}


def default_backward_schedule(arch: str, problem: Problem) -> BackwardSchedule:
    """Per-architecture default tiles by head dim (see ``_TILES``), one CTA per SM."""
    table = _TILES.get(generation(arch), _TILES["default"])
    d = max(64, padded_head_dim(problem.head_dim))
    kn, km, qm, qn = table[d]
    return normalise(problem, BackwardSchedule(dkdv_tile_n=kn, dkdv_tile_m=km, dq_tile_m=qm,
                                               dq_tile_n=qn))
