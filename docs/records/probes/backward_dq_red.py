"""Whether the one-pass backward's dQ shares run faster added element by element from
registers (``dq_mode="red"``: ``ct.atomic_add``, ``REDG`` on sm_90, no staging) than by the
bulk reduce-add staged through one shared-memory buffer (``"atomic"``: ``UTMAREDG``, each pair's
share waits for the last one's to be read), and whether either beats the two-kernel default
(issue 47). On the GPU, through ``tiledattention.sdpa_backward`` with the schedule given,
interleaved, in the GPU view (a spin hides the host) and an isolated call (host counted);
bf16; µs per call; the error is each schedule's largest relative L2 difference from the
default's gradients.

    source .devtk/setup.sh && python3 docs/records/probes/backward_dq_red.py
"""

import os
import sys

from tiledattention import BACKWARD
from tiledattention.kernels.backward._defaults import _default

sys.path.insert(0, os.path.dirname(__file__))
from backward_splits import compare_schedules  # noqa: E402

# (batch, heads_q, heads_kv, seqlen, head_dim, causal): FA4's widest leads on the 16 training
# shapes (docs/records/benchmarks/backward/fa4/) and smaller calls
SHAPES = [(1, 28, 4, 16384, 128, True), (1, 32, 32, 8192, 128, False),
          (1, 32, 8, 4096, 128, True), (1, 48, 1, 8192, 128, True), (2, 8, 8, 4096, 96, False),
          (1, 64, 8, 6000, 64, True), (8, 16, 16, 577, 64, False), (2, 16, 8, 4096, 256, True)]

#: the softcap one-pass rule's dK/dV fields at D <= 128 (FA3's layout)
WIDE = {"dkdv_tile_n": 128, "dkdv_tile_m": 64, "dkdv_occupancy": 1, "dkdv_worker_warps": 8}


def candidates(problem):
    found = {"default": BACKWARD.default_schedule("sm_90", problem)}
    if problem.head_dim <= 128:
        found["atomic wide"] = _default("sm_90", problem, dq_mode="atomic", **WIDE)
        found["red wide"] = _default("sm_90", problem, dq_mode="red", **WIDE)
    else:
        found["atomic"] = _default("sm_90", problem, dq_mode="atomic")
    found["red"] = _default("sm_90", problem, dq_mode="red")
    return found


def main():
    compare_schedules(SHAPES, candidates, "default")


if __name__ == "__main__":
    main()
