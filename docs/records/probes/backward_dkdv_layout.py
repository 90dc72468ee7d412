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
from tuner.measure import time_interleaved

sys.path.insert(0, os.path.dirname(__file__))
from backward_splits import _problem, backward_calls, compile_all, relative_error  # noqa: E402

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
    jobs = [(_problem(*shape), s) for shape in SHAPES
            for s in candidates(_problem(*shape)).values()]
    compile_all(jobs)
    table = []
    for shape in SHAPES:
        problem = _problem(*shape)
        found = candidates(problem)
        fns = backward_calls(shape, found)
        ref = fns["default"]()
        errs = {name: relative_error(fn(), ref) for name, fn in fns.items()}
        views = {view: time_interleaved(fns, rounds=15, **kw) for view, kw in
                 (("gpu", {}), ("isolated", {"host": True}))}
        print(f"== {problem.describe()}")
        for name, sc in found.items():
            print(f"  {name:14s} {sc.describe():70s} err {errs[name]:.1e}  " + "  ".join(
                f"{view} {1e3 * t[name].median_ms:8.1f} us" for view, t in views.items()))
            if name != "default":
                table.append((problem.describe(), name,
                              *(views[v]["default"].median_ms / views[v][name].median_ms
                                for v in views)))
    print("\n| call | schedule | speed-up over the default: GPU | isolated |\n|---|---|---|---|")
    for call, name, gpu, isolated in table:
        print(f"| {call} | {name} | {gpu:.2f} | {isolated:.2f} |")


if __name__ == "__main__":
    main()
