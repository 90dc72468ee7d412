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
from tuner.measure import time_interleaved

sys.path.insert(0, os.path.dirname(__file__))
from backward_splits import _problem, backward_calls, compile_all, relative_error  # noqa: E402

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
    jobs = [(_problem(*shape), s) for shape in SHAPES
            for s in candidates(_problem(*shape)).values()]
    compile_all(jobs)
    table = []
    for shape in SHAPES:
        problem = _problem(*shape)
        found = candidates(problem)
        fns = backward_calls(shape, found)
        ref = fns["padded"]()
        errs = {name: relative_error(fn(), ref) for name, fn in fns.items()}
        views = {view: time_interleaved(fns, rounds=15, **kw) for view, kw in
                 (("gpu", {}), ("isolated", {"host": True}))}
        print(f"== {problem.describe()}")
        for name, sc in found.items():
            print(f"  {name:14s} {sc.describe():60s} err {errs[name]:.1e}  " + "  ".join(
                f"{view} {1e3 * t[name].median_ms:8.1f} us" for view, t in views.items()))
            if name != "padded":
                table.append((problem.describe(), name,
                              *(views[v]["padded"].median_ms / views[v][name].median_ms
                                for v in views)))
    print("\n| call | schedule | speed-up over padded: GPU | isolated |\n|---|---|---|---|")
    for call, name, gpu, isolated in table:
        print(f"| {call} | {name} | {gpu:.2f} | {isolated:.2f} |")


if __name__ == "__main__":
    main()
