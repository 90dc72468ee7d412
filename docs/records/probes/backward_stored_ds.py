"""The stored-dS backward (``dq_mode="stored"``: the dK/dV kernel stores each pair's dS, a dQ
kernel multiplies it by K: 5 matrix products a pair, no atomics) against the sm_90 default
(two kernels, 7 products), on the GPU, through ``tiledattention.sdpa_backward`` with the
schedule given: the GPU view (a spin hides the host's launch) and an isolated call with the
host counted (``backward_splits.compare_schedules``); errors against the default's gradients.
bf16, ``[B, H, S, D]``; µs per call.

    source .devtk/setup.sh && python3 docs/records/probes/backward_stored_ds.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from backward_splits import compare_schedules  # noqa: E402

from tiledattention import BACKWARD  # noqa: E402

# (batch, heads_q, heads_kv, seqlen, head_dim, causal): training calls, grouped and not
SHAPES = [(1, 16, 16, 8192, 128, False), (1, 32, 8, 4096, 128, True),
          (8, 16, 16, 577, 64, False), (1, 8, 8, 256, 64, True), (4, 32, 32, 2048, 128, True),
          (2, 16, 4, 4096, 64, True), (2, 32, 8, 2048, 128, False), (1, 28, 4, 4096, 128, True),
          (4, 8, 1, 2048, 128, True), (1, 16, 16, 4096, 256, True), (2, 20, 20, 2048, 96, True)]


def candidates(problem):
    """The default and three stored-dS forms of it: dQ query tiles of the dK/dV kernel's rows
    at two CTAs an SM, and of 128 rows at one and at two."""
    default = BACKWARD.default_schedule("sm_90", problem)
    stored = default.replace(dq_mode="stored", dq_worker_warps=None, kv_latency=None)
    return {"default": default,
            "stored-m": stored.replace(dq_tile_m=default.dkdv_tile_m, dq_occupancy=2),
            "stored-128o1": stored.replace(dq_tile_m=128, dq_occupancy=1),
            "stored-128o2": stored.replace(dq_tile_m=128, dq_occupancy=2)}


def tile_candidates(problem):
    """The default, its stored-dS form with 128-row dQ tiles (one CTA an SM), and that with
    the dK/dV kernel's query steps of 128 rows, or with 128 keys a CTA at one CTA an SM and 8
    worker warps (FlashAttention-3's layout): fewer, larger stores a key tile."""
    default = BACKWARD.default_schedule("sm_90", problem)
    stored = default.replace(dq_mode="stored", dq_worker_warps=None, kv_latency=None,
                             dq_tile_m=128, dq_occupancy=1)
    return {"default": default, "stored": stored,
            "stored-m128": stored.replace(dkdv_tile_m=128),
            "stored-n128": stored.replace(dkdv_tile_n=128, dkdv_tile_m=64, dkdv_occupancy=1,
                                          dkdv_worker_warps=8)}


TILE_SHAPES = [(1, 16, 16, 8192, 128, False), (4, 32, 32, 2048, 128, True),
               (2, 32, 8, 2048, 128, False), (8, 16, 16, 577, 64, False),
               (2, 16, 4, 4096, 64, True), (1, 24, 8, 3000, 128, True)]


if __name__ == "__main__":
    if "--tiles" in sys.argv:
        compare_schedules(TILE_SHAPES, tile_candidates, "default")
    else:
        compare_schedules(SHAPES, candidates, "default")
