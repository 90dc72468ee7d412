"""Whether a small backward should split its dK/dV walk (issue 47's host time), on the GPU: the
sm_90 default against the same schedule with one split (``dkdv_splits=1``: no float32
partials, no two partial-sum launches), through ``tiledattention.sdpa_backward`` with the
schedule given, in three views: the GPU's (``time_interleaved``: a spin hides the host's
launch), a loop of calls back to back with the host counted (``loop``), and an isolated call
from an idle GPU with the host counted (``host``). bf16, ``[B, H, S, D]``; µs per call.

    source .devtk/setup.sh && python3 docs/records/probes/backward_splits.py \
        [--grouped | --split-d [--softcap] | --latency]

``--grouped``: head dim 64 with grouped and multi-query heads instead (``GROUPED``), where the
dK/dV grid has the fewest CTAs. ``--split-d``: head dims of two parts (``SPLIT_D``: 40, 72, 80,
96, 160, 192), the default (``split_d``) against the same schedule with the head dim padded to
a power of two (``split_d=False``), and the table gives the default's speed-up over it.
With ``--softcap`` too: capped scores (``SOFTCAP_SPLIT_D``), whose default runs one-pass.
``--latency``: head dim 256 (``LATENCY``), the default against the same schedule with the dK/dV
kernel's Q/dO loads two steps ahead (``q_latency=2``: the default's three spill, cuobjdump).
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

SPLIT_D = [(2, 8, 8, 4096, 96, False), (4, 12, 4, 1000, 96, True), (1, 32, 32, 3000, 96, True),
           (8, 32, 8, 1024, 72, True), (4, 16, 16, 2048, 72, False), (2, 20, 20, 4096, 80, True),
           (8, 16, 16, 577, 80, False), (4, 8, 8, 2048, 40, True), (2, 16, 4, 2048, 160, True),
           (1, 16, 16, 4096, 192, True)]

#: ``--split-d`` with ``--softcap``: capped scores, whose Hopper default runs one-pass
SOFTCAP_SPLIT_D = [(2, 8, 8, 4096, 96, True, 30.0), (4, 16, 4, 2048, 80, False, 30.0),
                   (1, 16, 16, 4096, 192, True, 50.0), (2, 16, 4, 2048, 72, True, 30.0)]

LATENCY = [(2, 16, 8, 4096, 256, True), (2, 16, 4, 2048, 256, False),
           (1, 8, 8, 8192, 256, True), (4, 16, 16, 1024, 256, False), (1, 32, 8, 2048, 256, True)]

#: by mode: (shapes, the variant of the default, its label, whether the default's time over
#: the variant's is the table's ratio (else the inverse), a default that has no variant)
MODES = {
    "splits": (SHAPES, lambda d: d.replace(dkdv_splits=1), "one split", True,
               lambda d: d.dkdv_splits == 1),
    "grouped": (GROUPED, lambda d: d.replace(dkdv_splits=1), "one split", True,
                lambda d: d.dkdv_splits == 1),
    "latency": (LATENCY, lambda d: d.replace(q_latency=2), "lat2", True,
                lambda d: d.q_latency == 2),
    "split-d": (SPLIT_D, lambda d: d.replace(split_d=False), "padded", False,
                lambda d: not d.split_d),
}


def _compile(job):
    problem, schedule = job
    try:  # fills cuTile's cache for the launches
        built = BACKWARD.compile(problem, schedule, "sm_90")
    except Exception as exc:  # reported by the launch that follows
        return f"{type(exc).__name__}: {exc}"[:160]
    return "; ".join(f"{k.name} {k.registers} registers, {k.stack_bytes} B stack"
                     for k in built.resources())


def compile_all(jobs):
    """Compile ``(problem, schedule)`` pairs in parallel (cuTile's cache serves the launches),
    printing what each kernel compiled to (registers, and stack: spills) or why it did not."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        for (problem, schedule), said in zip(jobs, pool.map(_compile, jobs)):
            print(f"  {problem.describe()} {schedule.describe()}: {said}")


def backward_calls(shape, candidates):
    """Random bf16 inputs of ``shape`` (``(b, hq, hkv, s, d, causal)``, and a softcap where
    a seventh) and their forward, and a backward call per candidate schedule
    (``sdpa_backward`` with the schedule given), by name."""
    b, hq, hkv, s, d, causal, *cap = shape
    softcap = cap[0] if cap else None
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (hq, hkv, hkv))
    g = torch.randn_like(q)
    out, lse = ta.sdpa_with_lse(q, k, v, causal=causal, softcap=softcap)
    return {name: (lambda sc=sc: ta.sdpa_backward(g, q, k, v, out, lse, causal, softcap=softcap,
                                                  schedule=sc))
            for name, sc in candidates.items()}


def relative_error(got, want):
    """The largest relative L2 difference between two runs' gradients."""
    return max((torch.linalg.vector_norm((a - r).float()) / torch.linalg.vector_norm(
        r.float())).item() for a, r in zip(got, want))


def compare_schedules(shapes, candidates, base):
    """Per shape (``(b, hq, hkv, s, d, causal)``), time the schedules ``candidates(problem)``
    names (a dict, ``base`` among them) interleaved, in the GPU view and an isolated call,
    print each one's error against ``base`` and its µs, then a table of speed-ups over
    ``base``."""
    compile_all([(_problem(*shape), s) for shape in shapes
                 for s in candidates(_problem(*shape)).values()])
    table = []
    for shape in shapes:
        problem = _problem(*shape)
        found = candidates(problem)
        fns = backward_calls(shape, found)
        ref = fns[base]()
        errs = {name: relative_error(fn(), ref) for name, fn in fns.items()}
        views = {view: time_interleaved(fns, rounds=15, **kw) for view, kw in
                 (("gpu", {}), ("isolated", {"host": True}))}
        print(f"== {problem.describe()}")
        for name, sc in found.items():
            print(f"  {name:14s} {sc.describe():70s} err {errs[name]:.1e}  " + "  ".join(
                f"{view} {1e3 * t[name].median_ms:8.1f} us" for view, t in views.items()))
            if name != base:
                table.append((problem.describe(), name,
                              *(views[v][base].median_ms / views[v][name].median_ms
                                for v in views)))
    print(f"\n| call | schedule | speed-up over {base}: GPU | isolated |\n|---|---|---|---|")
    for call, name, gpu, isolated in table:
        print(f"| {call} | {name} | {gpu:.2f} | {isolated:.2f} |")


def _problem(b, hq, hkv, s, d, causal, softcap=0.0):
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
                   dtype="bf16", causal=causal, softcap=softcap)


def main():
    mode = next((m for m in ("grouped", "split-d", "latency") if f"--{m}" in sys.argv), "splits")
    shapes, variant_of, label, default_over_variant, alone = MODES[mode]
    if mode == "split-d" and "--softcap" in sys.argv:
        shapes = SOFTCAP_SPLIT_D
    jobs = []
    for shape in shapes:
        problem = _problem(*shape)
        default = BACKWARD.default_schedule("sm_90", problem)
        jobs += [(problem, default), (problem, variant_of(default))]
    compile_all(jobs)
    rows = []
    for shape in shapes:
        problem = _problem(*shape)
        default = BACKWARD.default_schedule("sm_90", problem)
        if alone(default):
            print(f"== {problem.describe()}: the default has no {label} variant "
                  f"({default.describe()})")
            continue
        candidates = {"default": default, label: variant_of(default)}
        fns = backward_calls(shape, candidates)
        err = relative_error(fns[label](), fns["default"]())
        views = {view: time_interleaved(fns, rounds=15, **kw) for view, kw in
                 (("gpu", {}), ("loop", {"loop": True, "flush_l2": False}),
                  ("isolated", {"host": True}))}
        print(f"== {problem.describe()}: {default.describe()}; {label} differs by {err:.1e}")
        for name in candidates:
            print(f"  {name:10s} " + "  ".join(f"{view} {1e3 * t[name].median_ms:8.1f} us"
                                               for view, t in views.items()))
        ratios = [views[v]["default"].median_ms / views[v][label].median_ms for v in views]
        rows.append((problem.describe(), default.dkdv_splits,
                     *(r if default_over_variant else 1 / r for r in ratios)))
    what = (f"{label}'s speed-up" if default_over_variant
            else f"the default's speed-up over {label}")
    print(f"\n| call | default splits | {what}: GPU | loop | isolated |\n"
          "|---|---|---|---|---|")
    for call, splits, gpu, loop, isolated in rows:
        print(f"| {call} | {splits} | {gpu:.2f} | {loop:.2f} | {isolated:.2f} |")


if __name__ == "__main__":
    main()
