"""Prefill schedules on the GPU (issue 48: ahead of FlashAttention-4 on every call): the sm_90
default against hand-picked schedules on long causal, grouped, multi-query, D 256 and split
head-dim calls, with FlashAttention-4 and torch's cuDNN backend beside. Interleaved, the L2
flushed before each sample (GPU time, the host hidden); every candidate's output checked
against the float32 reference of the family's case (NaN-poisoned output).

    source .devtk/setup.sh && python3 docs/records/probes/prefill_sweep.py [--rounds N]
        [--only SUBSTRING] [--twin JSON] [--set first|stages]

``--twin``: instead of the hand-picked schedules, the default against its twin with the
fields given as JSON (e.g. ``{"lazy_rescale": true}``).

Each candidate is compiled ahead in a pool of processes (``FORWARD.compile`` for sm_90 warms
cuTile's disk cache, so the first launch loads the cubin instead of compiling).
"""

import argparse
import dataclasses
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor

import tiledattention as ta
from tiledattention.kernels.forward import Schedule
from tuner.bench import build_peer_contender
from tuner.measure import time_interleaved

# (B, H_q, H_kv, S, D, causal, dtype): none is a call of the table or of the tests
POINTS = [
    (1, 32, 8, 32768, 128, True, "bf16"),
    (1, 40, 8, 16384, 128, True, "bf16"),
    (2, 28, 4, 4096, 128, True, "bf16"),
    (1, 64, 1, 8192, 128, True, "bf16"),
    (4, 32, 8, 2048, 128, True, "fp16"),
    (2, 16, 8, 8192, 256, True, "bf16"),
    (2, 16, 16, 4096, 80, False, "bf16"),
    (1, 24, 8, 8192, 96, True, "bf16"),
]

FAST = dict(exp2=True, approx_div=True)


def candidates(p, default):
    """Name -> schedule: the default and the alternatives that fit ``p``'s head dim."""
    out = {"default": default}
    split = dict(split_d=default.split_d)
    if p.causal:
        out["default+split_masked"] = default.replace(split_masked=True)
    if p.head_dim <= 128 and p.causal:
        w8 = dict(tile_m=128, tile_n=128, occupancy=1, num_worker_warps=8, split_masked=True,
                  **FAST, **split)
        out["w8 persistent lf"] = Schedule(persistent=True, longest_first=True, v_latency=4,
                                           unchecked_loads=True, **w8)
        out["w8 lf"] = Schedule(longest_first=True, v_latency=4, unchecked_loads=True, **w8)
        out["w8 persistent paired"] = Schedule(persistent=True, paired_tiles=True,
                                               v_latency=4, unchecked_loads=True, **w8)
        out["w8 persistent lf Kt"] = Schedule(persistent=True, longest_first=True,
                                              k_transposed=True, **w8)
        out["w8 cta2 lf"] = Schedule(num_ctas=2, longest_first=True, unchecked_loads=True,
                                     **w8)
        out["occ2 cta2 lf sm unchk"] = default.replace(tile_m=128, tile_n=128, occupancy=2,
                                                       num_ctas=2, longest_first=True,
                                                       split_masked=True,
                                                       unchecked_loads=True)
    elif p.head_dim > 128:
        out["128x64 w8 paired sm"] = Schedule(tile_m=128, tile_n=64, occupancy=1,
                                              num_worker_warps=8, paired_tiles=p.causal,
                                              split_masked=p.causal, k_transposed=True, **FAST)
        out["w8 persistent lf sm"] = Schedule(tile_m=128, tile_n=128, occupancy=1,
                                              num_worker_warps=8, persistent=True,
                                              longest_first=p.causal, split_masked=p.causal,
                                              k_latency=4, v_latency=2, **FAST)
        out["64x128 occ2 lf sm"] = Schedule(tile_m=64, tile_n=128, occupancy=2,
                                            longest_first=p.causal, split_masked=p.causal,
                                            k_transposed=True, **FAST)
        out["default occ1"] = default.replace(occupancy=1)
    else:  # a split head dim, full
        out["128x64 occ2 w8 pers"] = Schedule(tile_m=128, tile_n=64, occupancy=2,
                                              num_worker_warps=8, persistent=True,
                                              k_latency=4, v_latency=4, **FAST, **split)
        out["64x128 occ3"] = Schedule(tile_m=64, tile_n=128, occupancy=3, k_latency=4,
                                      v_latency=2, unchecked_loads=True, **FAST, **split)
        out["padded w8 pers"] = default.replace(split_d=False)
        out["occ2 w8 pers"] = default.replace(occupancy=2)
    return out


# the second round (--set stages): where the first found no schedule near FA4. The default's
# 128-key step keeps one K and one V tile in shared memory (83 KB a CTA, two CTAs an SM): 64-key
# steps two loads ahead fit two stages in 100 KB; 256-row tiles over a cluster run one CTA an
# SM with 255 registers (sm_90 builds, cuobjdump -res-usage). Split head dims (D 96, 80):
# 64-row tiles, the padded head dim, and the 64-key steps.
STAGES_POINTS = POINTS[:4] + [  # the first round's causal D 128 calls, its causal D 96 one, and:
    POINTS[7],
    (2, 32, 32, 4096, 96, True, "bf16"),
    (4, 32, 32, 2048, 96, False, "bf16"),
    (1, 16, 16, 16384, 80, True, "bf16"),
    (2, 16, 16, 4096, 80, False, "bf16"),
]


def stage_candidates(p, default):
    """Name -> schedule of the second round: K/V stages and tile shapes around the default."""
    out = {"default": default}
    if p.causal:
        cluster = dict(num_ctas=2, longest_first=True, k_transposed=True, split_d=default.split_d,
                       **FAST)
        out["128x64 occ2 cta2 L2"] = Schedule(tile_m=128, tile_n=64, occupancy=2, k_latency=2,
                                              v_latency=2, **cluster)
        out["128x64 occ2 cta2 L2 sm unchk"] = Schedule(
            tile_m=128, tile_n=64, occupancy=2, k_latency=2, v_latency=2, split_masked=True,
            unchecked_loads=True, **cluster)
        out["256x64 occ1 cta2"] = Schedule(tile_m=256, tile_n=64, occupancy=1, **cluster)
        out["256x64 occ1 cta2 L3"] = Schedule(tile_m=256, tile_n=64, occupancy=1, k_latency=3,
                                              v_latency=3, **cluster)
    if default.split_d:
        out["padded"] = ta.FORWARD.default_schedule(
            "sm_90", dataclasses.replace(p, head_dim=128)).replace(split_d=False)
        out["64x128 occ3 lf sawtooth"] = Schedule(
            tile_m=64, tile_n=128, occupancy=3, kv_sawtooth=p.causal, longest_first=p.causal,
            k_latency=4, v_latency=2, split_d=True, **FAST)
        out["64x64 occ4"] = Schedule(tile_m=64, tile_n=64, occupancy=4, kv_sawtooth=True,
                                     longest_first=p.causal, split_d=True, k_transposed=True,
                                     **FAST)
        if not p.causal:
            out["128x64 occ2 w8 pers"] = Schedule(tile_m=128, tile_n=64, occupancy=2,
                                                  num_worker_warps=8, persistent=True,
                                                  k_latency=4, v_latency=4, split_d=True, **FAST)
    return out


def problem(b, hq, hkv, s, d, causal, dtype):
    return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
                      dtype=dtype, causal=causal)


def _compile(job):
    p, s = job
    try:
        ta.FORWARD.compile(p, s, "sm_90")
        return None
    except Exception as exc:  # reported, the candidate then skipped
        return f"{type(exc).__name__}: {str(exc)[:160]}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--only", default="")
    parser.add_argument("--twin", type=json.loads, default=None)
    parser.add_argument("--set", choices=("first", "stages"), default="first")
    args = parser.parse_args()
    points = [problem(*pt) for pt in (STAGES_POINTS if args.set == "stages" else POINTS)]
    pick = stage_candidates if args.set == "stages" else candidates
    points = [p for p in points if args.only in p.describe()]
    plans = []
    for p in points:
        default = ta.FORWARD.default_schedule("sm_90", p)
        plans.append((p, {"default": default, "twin": default.replace(**args.twin)}
                      if args.twin else pick(p, default)))
    jobs = [(p, s) for p, cands in plans for s in cands.values()]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        failures = dict(zip(range(len(jobs)), pool.map(_compile, jobs)))
    print(f"compiled {len(jobs)} kernels ahead in {time.perf_counter() - start:.0f} s")
    index = 0
    for p, cands in plans:
        case = ta.FORWARD.case(p, 0)
        fns, errors = {}, {}
        for name, s in cands.items():
            failed = failures[index]
            index += 1
            if failed:
                print(f"  {name}: not compiled: {failed}")
                continue
            fns[name] = case.launcher(s)
            errors[name] = case.error(fns[name])
        for peer in ("flash-attn-4", "torch-cudnn"):
            try:
                if peer == "torch-cudnn":
                    fns[peer], errors[peer] = case.baselines()[peer], float("nan")
                else:
                    fns[peer], errors[peer] = build_peer_contender(peer, p, case,
                                                                   backward=False)
            except Exception as exc:  # not installed, or it cannot take the point
                print(f"  {peer}: {type(exc).__name__}: {str(exc)[:100]}")
        times = time_interleaved(fns, rounds=args.rounds)
        flops = ta.FORWARD.flops(p)
        print(f"== {p.describe()}")
        fa4 = times.get("flash-attn-4")
        for name, t in sorted(times.items(), key=lambda kv: kv[1].median_ms):
            tflops = flops / (t.median_ms * 1e-3) / 1e12
            vs = f"{fa4.median_ms / t.median_ms:5.2f}x FA4" if fa4 else ""
            label = cands[name].describe() if name in cands else ""
            print(f"  {name:24s} {t.median_ms:8.3f} ms {tflops:6.0f} TFLOP/s {vs} "
                  f"err {errors[name]:.1e} {label}")
        del case


if __name__ == "__main__":
    main()
