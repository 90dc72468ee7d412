"""Whether head dims of two parts (72, 80, 96; 40, 160, 192) train faster one-pass (issue 47):
the sm_90 default (two kernels, ``split_d``) against the same problem one-pass with the
softcap rule's D <= 128 dK/dV fields (128 keys x 64 rows, one CTA an SM, 8 worker warps:
``atomic wide``) and one-pass with the default's own dK/dV fields (``atomic``). On an H200
the B2 H8 S4096 D96 full call ran ``atomic wide`` at 1.07x the default in both views
(section 1 of ``docs/records/benchmarks/backward/probes-2026-11-30.md``; this probe is its
section 3). Through ``tiledattention.sdpa_backward`` with the schedule given, interleaved, in
the GPU view (a spin hides the host) and an isolated call (host counted); bf16; µs per call;
errors against the default's gradients.

    source .devtk/setup.sh && python3 docs/records/probes/backward_onepass_split_d.py
"""

import os
import sys

from tiledattention import BACKWARD
from tiledattention.kernels.backward._defaults import SOFTCAP_ONE_PASS, _default

sys.path.insert(0, os.path.dirname(__file__))
from backward_splits import compare_schedules  # noqa: E402

# (batch, heads_q, heads_kv, seqlen, head_dim, causal)
SHAPES = [(2, 8, 8, 4096, 96, False), (4, 12, 4, 1000, 96, True), (1, 32, 32, 3000, 96, True),
          (8, 32, 8, 1024, 72, True), (4, 16, 16, 2048, 72, False), (2, 20, 20, 4096, 80, True),
          (8, 16, 16, 577, 80, False), (1, 8, 1, 4096, 96, True), (4, 8, 8, 2048, 40, True),
          (2, 16, 4, 2048, 160, True), (1, 16, 16, 4096, 192, True)]

#: the softcap one-pass rule's dK/dV fields at D <= 128 (FA3's layout)
WIDE = SOFTCAP_ONE_PASS["hopper"][128].fields


def candidates(problem):
    found = {"default": BACKWARD.default_schedule("sm_90", problem),
             "atomic": _default("sm_90", problem, dq_mode="atomic")}
    if problem.head_dim <= 128:
        found["atomic wide"] = _default("sm_90", problem, dq_mode="atomic", **WIDE)
    return found


def main():
    compare_schedules(SHAPES, candidates, "default")


if __name__ == "__main__":
    main()
