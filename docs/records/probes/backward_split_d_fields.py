"""Which fields a split head dim's backward wants (issue 47), on the GPU: per call, the padded
default and split schedules with the fields the sm_90 SASS of the split kernels pointed at
(cuobjdump on the CPU): the D <= 128 default's dQ kernel (128 rows, 8 worker warps) spills at
two CTAs an SM once split (80 registers a thread; the padded one is held to one CTA by its
shared memory), and the D 160 dK/dV kernel spills with Q/dO loads three steps ahead (none at
two). Through ``tiledattention.sdpa_backward`` with the schedule given, interleaved, in the
GPU view (a spin hides the host) and an isolated call (host counted); bf16; µs per call.

    source .devtk/setup.sh && python3 docs/records/probes/backward_split_d_fields.py
"""

import os
import sys

from tiledattention import BACKWARD

sys.path.insert(0, os.path.dirname(__file__))
from backward_splits import compare_schedules  # noqa: E402

# (batch, heads_q, heads_kv, seqlen, head_dim, causal)
SHAPES = [(2, 8, 8, 4096, 96, False), (1, 32, 32, 3000, 96, True), (4, 12, 4, 1000, 96, True),
          (8, 32, 8, 1024, 72, True), (2, 20, 20, 4096, 80, True), (8, 16, 16, 577, 80, False),
          (2, 16, 4, 2048, 160, True), (1, 16, 16, 4096, 160, False),
          (1, 16, 16, 4096, 192, True)]


def candidates(problem):
    padded = BACKWARD.default_schedule("sm_90", problem).replace(split_d=False)
    split = padded.replace(split_d=True)
    found = {"padded": padded, "split": split}
    if problem.head_dim <= 128:
        found["split dq occ1"] = split.replace(dq_occupancy=1)
    else:
        found["padded lat2"] = padded.replace(q_latency=2)
        found["split lat2"] = split.replace(q_latency=2)
    return found


def main():
    compare_schedules(SHAPES, candidates, "padded")


if __name__ == "__main__":
    main()
