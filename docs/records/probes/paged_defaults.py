"""Paged decode schedules on the GPU (issue 49): the sm_90 default against 64- and 32-key steps,
occupancy 2, loads four steps ahead and twice the splits, on mixed-length paged batches (the
family's paged case: caches of the longest, 3/4, 1/2 and 1/4 of it, in shuffled pages) at
pages of 16 to 256 and GQA 32/8 and 28/4; FlashAttention-4 beside where it is importable.
Interleaved, the L2 flushed before each sample; shares of the device copy rate (read +
written, same run) on the valid K/V bytes read once.

    source .devtk/setup.sh && python3 docs/records/probes/paged_defaults.py [--check]

``--check``: other points (none of the sweep's), the default against the default before the
paged rule (128-key steps, one wave of splits by the cache rule, occupancy 1) and FA4.
``--slices``: the sweep's points, the default against it with two and four key slices.
"""

import sys

import tiledattention as ta
from tuner.bench import BenchSettings, build_peer_contender, copy_gbps
from tuner.measure import time_interleaved

# (batch, heads_q, heads_kv, longest cache, page size)
POINTS = ((8, 32, 8, 16384, 16), (24, 32, 8, 8192, 16), (48, 28, 4, 4096, 16),
          (64, 32, 8, 2048, 16), (12, 28, 4, 16384, 32), (32, 32, 8, 8192, 32),
          (8, 32, 8, 32768, 64), (40, 28, 4, 8192, 256))
CHECK_POINTS = ((16, 32, 8, 12000, 16), (40, 28, 4, 6000, 16), (4, 32, 8, 32768, 16),
                (56, 32, 8, 3000, 32), (28, 28, 4, 7000, 32), (20, 28, 4, 10000, 64),
                (48, 32, 8, 5000, 128), (10, 32, 8, 20000, 256))


def previous_default(problem, d):
    """The default before the paged rule: 128-key steps, K two steps ahead, occupancy 1, one
    wave of splits (132 SMs) capped at a split per 256 keys."""
    from tiledattention.kernels.decode import layout
    base = d.replace(tile_n=128, occupancy=1, k_latency=2)
    rows = layout(problem, base).rows
    return base.replace(splits=max(1, min(132 // rows, problem.seqlen_k // 256)))


def default_with(problem, **constants):
    """The sm_90 decode default of ``problem`` with ``kernels.decode._defaults``' ``constants``
    set to the values given (a rule as it was before a constant existed), restored after."""
    from tiledattention.kernels.decode import _defaults

    saved = {name: getattr(_defaults, name) for name in constants}
    try:
        for name, value in constants.items():
            setattr(_defaults, name, value)
        return ta.DECODE.default_schedule("sm_90", problem)
    finally:
        for name, value in saved.items():
            setattr(_defaults, name, value)


def copy_rate():
    """The device-to-device copy rate in GB/s of bytes read + written (the bench's ceiling,
    ``tuner.bench.copy_gbps``, timed in 10 interleaved rounds), printed."""
    gbps = copy_gbps(BenchSettings(interleave=10))
    print(f"device copy {gbps:.0f} GB/s (read + written)")
    return gbps


def add_fa4(problem, case, fns, errors):
    """FlashAttention-4 beside, where it is importable and takes the point."""
    try:
        fns["flash-attn-4"], errors["flash-attn-4"] = build_peer_contender(
            "flash-attn-4", problem, case, backward=False)
    except Exception as exc:  # not installed, or it cannot take the point
        print(f"  flash-attn-4: {type(exc).__name__}: {str(exc)[:100]}")


def report(times, kv_bytes, copy_gbps, errors, candidates):
    """One line per contender, fastest first: time, share of the copy rate, error, schedule."""
    for name, t in sorted(times.items(), key=lambda kv: kv[1].median_ms):
        gbps = kv_bytes / (t.median_ms * 1e-3) / 1e9
        label = candidates[name].describe() if name in candidates else ""
        print(f"  {name:14s} {1e3 * t.median_ms:8.1f} us {100 * gbps / copy_gbps:5.1f}% of "
              f"copy err {errors[name]:.1e} {label}")


def main():
    copy_gbps = copy_rate()
    check = "--check" in sys.argv
    for b, hq, hkv, sk, page in CHECK_POINTS if check else POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=128,
                       dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=page)
        case = ta.DECODE.case(p, 0)
        d = ta.DECODE.default_schedule("sm_90", p)
        candidates = {"default": d, "n64": d.replace(tile_n=64), "n32": d.replace(tile_n=32),
                      "n64 occ2": d.replace(tile_n=64, occupancy=2),
                      "n64 K4": d.replace(tile_n=64, k_latency=4),
                      "n64 2x splits": d.replace(tile_n=64, splits=2 * d.splits),
                      "occ2 K4": d.replace(occupancy=2, k_latency=4)}
        if check:
            candidates = {"default": d, "previous": previous_default(p, d)}
        if "--slices" in sys.argv:  # each key tile folded as slices of its keys
            candidates = {"default": d, **{f"ks{w}": d.replace(key_slices=w) for w in (2, 4)}}
        fns = {name: case.launcher(s) for name, s in candidates.items()}
        errors = {name: case.error(run) for name, run in fns.items()}
        add_fa4(p, case, fns, errors)
        times = time_interleaved(fns, rounds=15)
        valid = int(case.seqused.sum()) * hkv * 128 * 2 * 2
        print(f"== {p.describe()} lengths {case.seqused.tolist()[:4]}.. default {d.describe()}")
        report(times, valid, copy_gbps, errors, candidates)

if __name__ == "__main__":
    main()
