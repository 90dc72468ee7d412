"""Whether the backward's dK/dV kernel runs faster in the dQ kernel's layout (issue 47), on the
GPU: the sm_90 default (head dim <= 128: two CTAs an SM, four worker warps) against one CTA an
SM with 8 worker warps, on 64- or 128-key tiles, Q/dO loads at the compiler's latency or two
steps ahead: the layouts whose sm_90 SASS does not spill (cuobjdump on CPU builds; three steps
ahead spills at 64 keys, 128 x 128 tiles spill at D 128). Through
``tiledattention.sdpa_backward`` with the schedule given (the dQ kernel as the default's; the
splits and grid order as the default rule gives them for each layout),
interleaved, in the GPU view (a spin hides the host) and an isolated call (host counted); bf16;
µs per call.

    source .devtk/setup.sh && python3 docs/records/probes/backward_dkdv_layout.py
"""

import os
import sys

from tiledattention import BACKWARD
from tiledattention.kernels.backward._defaults import _default

sys.path.insert(0, os.path.dirname(__file__))
from backward_splits import compare_schedules  # noqa: E402

# (batch, heads_q, heads_kv, seqlen, head_dim, causal)
SHAPES = [(1, 16, 16, 8192, 128, False), (2, 32, 8, 4096, 128, True),
          (4, 28, 4, 2048, 128, True), (1, 8, 1, 6144, 128, True), (8, 16, 16, 1024, 128, False),
          (2, 16, 16, 4096, 64, True), (8, 12, 12, 577, 64, False), (1, 32, 8, 8192, 64, True)]


def candidates(problem):
    wide = {"dkdv_occupancy": 1, "dkdv_worker_warps": 8, "dkdv_tile_m": 64}
    return {"default": BACKWARD.default_schedule("sm_90", problem),
            "64k w8 lat2": _default("sm_90", problem, **wide, dkdv_tile_n=64, q_latency=2),
            "128k w8": _default("sm_90", problem, **wide, dkdv_tile_n=128, q_latency=None),
            "128k w8 lat2": _default("sm_90", problem, **wide, dkdv_tile_n=128, q_latency=2)}


def main():
    compare_schedules(SHAPES, candidates, "default")


if __name__ == "__main__":
    main()
