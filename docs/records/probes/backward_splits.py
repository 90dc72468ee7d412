"""Whether a small backward should split its dK/dV walk (issue 47's host time), on the GPU: the
sm_90 default against the same schedule with one split (``dkdv_splits=1``: no float32
partials, no two partial-sum launches), through ``tiledattention.sdpa_backward`` with the
schedule given, in three views: the GPU's (``time_interleaved``: a spin hides the host's
launch), a loop of calls back to back with the host counted (``loop``), and an isolated call
from an idle GPU with the host counted (``host``). bf16, ``[B, H, S, D]``; µs per call.

    source .devtk/setup.sh && python3 docs/records/probes/backward_splits.py [--grouped]

``--grouped``: head dim 64 with grouped and multi-query heads instead (``GROUPED``), where the
dK/dV grid has the fewest CTAs.
"""

import sys

import torch

import tiledattention as ta
from tiledattention import BACKWARD, Problem
from tuner.measure import time_interleaved

# (batch, heads_q, heads_kv, seqlen, head_dim, causal): small training calls, grouped and not
SHAPES = [(1, 8, 8, 256, 64, True), (1, 16, 16, 512, 64, True), (2, 12, 12, 384, 64, False),
          (1, 16, 16, 1024, 64, True), (4, 12, 4, 1000, 96, True), (1, 32, 8, 1024, 128, True),
          (1, 8, 1, 2048, 128, True), (1, 12, 12, 2048, 64, True), (1, 4, 4, 4096, 128, True)]

GROUPED = [(1, 8, 1, 2048, 64, True), (1, 16, 1, 4096, 64, True), (2, 32, 4, 2048, 64, True),
           (1, 32, 8, 2048, 64, True), (1, 8, 2, 1024, 64, False), (4, 16, 2, 512, 64, True)]


def _compile(job):
    problem, schedule = job
    try:
        BACKWARD.compile(problem, schedule, "sm_90")  # fills cuTile's cache for the launches
    except Exception as exc:  # reported by the launch that follows
        return f"{type(exc).__name__}: {exc}"[:160]
    return None


def _problem(b, hq, hkv, s, d, causal):
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
                   dtype="bf16", causal=causal)


def main():
    import os
    from concurrent.futures import ProcessPoolExecutor

    shapes = GROUPED if "--grouped" in sys.argv else SHAPES
    jobs = []
    for shape in shapes:
        problem = _problem(*shape)
        default = BACKWARD.default_schedule("sm_90", problem)
        jobs += [(problem, default), (problem, default.replace(dkdv_splits=1))]
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        for failed in pool.map(_compile, jobs):
            if failed:
                print("  not compiled:", failed)
    rows = []
    for b, hq, hkv, s, d, causal in shapes:
        problem = _problem(b, hq, hkv, s, d, causal)
        default = BACKWARD.default_schedule("sm_90", problem)
        if default.dkdv_splits == 1:
            print(f"== {problem.describe()}: the default does not split ({default.describe()})")
            continue
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for h in (hq, hkv, hkv))
        g = torch.randn_like(q)
        out, lse = ta.sdpa_with_lse(q, k, v, causal=causal)
        candidates = {"default": default, "one split": default.replace(dkdv_splits=1)}
        fns = {name: (lambda sc=sc: ta.sdpa_backward(g, q, k, v, out, lse, causal, schedule=sc))
               for name, sc in candidates.items()}
        ref = fns["default"]()
        err = max((torch.linalg.vector_norm((a - r).float()) / torch.linalg.vector_norm(
            r.float())).item() for a, r in zip(fns["one split"](), ref))
        views = {view: time_interleaved(fns, rounds=15, **kw) for view, kw in
                 (("gpu", {}), ("loop", {"loop": True, "flush_l2": False}),
                  ("isolated", {"host": True}))}
        print(f"== {problem.describe()}: {default.describe()}; one split differs by {err:.1e}")
        for name in candidates:
            print(f"  {name:10s} " + "  ".join(f"{view} {1e3 * t[name].median_ms:8.1f} us"
                                               for view, t in views.items()))
        rows.append((problem.describe(), default.dkdv_splits,
                     *(views[v]["default"].median_ms / views[v]["one split"].median_ms
                       for v in views)))
    print("\n| call | default splits | one split's speed-up: GPU | loop | isolated |\n"
          "|---|---|---|---|---|")
    for what, splits, gpu, loop, isolated in rows:
        print(f"| {what} | {splits} | {gpu:.2f} | {loop:.2f} | {isolated:.2f} |")


if __name__ == "__main__":
    main()
