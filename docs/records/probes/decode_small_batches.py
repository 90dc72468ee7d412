"""Decode at batch 1-2 (issue 49: B1 caches of 8k keys at >= 60% of the copy rate, 32k at >=
85%): the default's split count, occupancy and load depth against neighbours, on the GPU.
Each call is a decode step over a contiguous bf16 cache (one query row a head); for each, the
default and variants that change one or two of its fields, timed interleaved (L2 flushed, GPU
time, median of ``--rounds``) beside torch's cuDNN backend and a device copy of the cache's
bytes; "% of copy": the K/V bytes over the time, against the copy's rate (bytes read plus
written). Errors by relative L2 against the float32 reference.

    source .devtk/setup.sh && python3 docs/records/probes/decode_small_batches.py [--rounds 20]
        [--heads64]   # instead: head dims of 64 and groups of one (HEADS64)
        [--steps]     # (with --heads64) 256-key steps at D <= 64 instead of the neighbours
        [--check]     # instead: other calls (CHECK), the default against the former steps
        [--mqa]       # instead: one K/V head (MQA), the neighbours and fewer splits
        [--check-rows]  # instead: other calls of few K/V rows (CHECK_ROWS), against the former
        [--block]     # instead: the calls of BLOCK, the default's merge against combine="block"
        [--sinks]     # instead: the calls of SINKS with sink logits, the default (block merge)
                      # against the stepping merge
        [--few-rows]  # instead: the calls of FEW_ROWS, the default (2048 merged rows, block)
                      # against its splits capped at 1024 rows, block-merged and stepping
        [--pdl]       # instead: the calls of BLOCK, the block merge against the block merge
                      # launched as a programmatic dependent (combine="block_pdl")
        [--deep64]    # instead: the calls of HEADS64 at D 64, the default against deeper K/V
                      # load pipelines (three and four steps ahead) of its 256-key steps
        [--wide]      # instead: B1 calls of CALLS, the default against 8 worker warps and
                      # 64-key steps with K/V four steps ahead (more loads in flight)
        [--waves]     # instead: batched calls of WAVES (one split fills the GPU, in a
                      # fraction of a wave over), the default against 2-4 splits
        [--kt]        # instead: the calls of CALLS, the default against K loaded transposed
                      # (what several tuned rows chose), alone and with 8 worker warps
        [--host]      # each sample an isolated call from an idle GPU, the host's time counted
                      # (else GPU time: the host runs ahead)
        [--pdl-full]  # instead: the calls of PDL_FULL (split grids of the SMs' count or
                      # near it), the same, and each with a power of two of splits

Prints one table per call, then a summary: each variant's time over the default's, geometric
mean over the calls.
"""

import argparse
import math
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention as ta
from tiledattention.kernels.decode._schedule import MAX_SPLITS
from tuner.measure import time_interleaved

CALLS = [  # B, H_q, H_kv, S_k, D
    (1, 32, 8, 4096, 128),
    (1, 32, 8, 8192, 128),
    (1, 32, 8, 16384, 128),
    (1, 32, 8, 32768, 128),
    (1, 64, 8, 12000, 128),
    (2, 28, 4, 9000, 128),
    (1, 16, 16, 20000, 64),
    (1, 32, 4, 24000, 256),
]
#: ``--heads64``: head dims of 64 and multi-head caches (a group of one), where the default
#: (one CTA an SM) trailed cuDNN in the first run (B1 H16/16 20000 D64: 0.83x)
HEADS64 = [
    (1, 16, 16, 20000, 64),
    (1, 32, 8, 16384, 64),
    (1, 12, 12, 8192, 64),
    (2, 16, 16, 6000, 64),
    (1, 8, 8, 30000, 64),
    (1, 32, 32, 8192, 128),
    (1, 40, 40, 4096, 128),
    (8, 32, 8, 4096, 64),
    (32, 16, 16, 2048, 64),
]
#: ``--check``: other calls, the default (256-key steps at D <= 64 since the rule) against the
#: former default
CHECK = [
    (1, 24, 8, 12000, 64),
    (4, 16, 16, 5000, 64),
    (16, 32, 8, 3000, 64),
    (1, 64, 64, 6000, 64),
    (2, 32, 4, 40000, 64),
    (1, 8, 1, 50000, 64),
    (64, 12, 12, 2500, 64),
    (3, 20, 20, 7777, 64),
    (1, 32, 8, 9000, 32),
]
#: ``--mqa``: one K/V head at batch 1-2 (B1 H8/1 50000 D64 ran 0.63x cuDNN in the check: 132
#: splits of one row, merged by two combine CTAs)
MQA = [
    (1, 8, 1, 50000, 64),
    (1, 48, 1, 8192, 128),
    (1, 64, 1, 32768, 128),
    (2, 16, 1, 20000, 64),
]
#: ``--check-rows``: other calls of few K/V rows (and those of ``MQA``), the default against
#: the former one (no cap on the rows merged per output row, the stepping merge)
CHECK_ROWS = [
    (1, 16, 2, 30000, 128),
    (1, 56, 1, 16000, 128),
    (1, 32, 1, 65536, 64),
    (3, 40, 1, 9000, 128),
    (1, 24, 1, 12000, 64),
]

#: ``--block``: the default's merge against all of a row's splits merged from one tile
#: (``combine="block"``), the rest of the schedule the default's
BLOCK = [
    (1, 32, 8, 4096, 128),
    (1, 32, 8, 8192, 128),
    (1, 32, 8, 32768, 128),
    (1, 64, 8, 12000, 128),
    (2, 28, 4, 9000, 128),
    (4, 32, 8, 16000, 128),
    (1, 16, 16, 20000, 64),
    (1, 8, 1, 50000, 64),
    (1, 64, 1, 32768, 128),
    (1, 32, 4, 24000, 256),
]

#: ``--sinks``: decode with attention sinks (GPT-OSS-like heads and others), whose default
#: merge became the block one after its sink term first ran on a GPU
SINKS = [
    (1, 64, 8, 32768, 64),
    (4, 64, 8, 8000, 64),
    (1, 32, 8, 8192, 128),
    (2, 28, 4, 20000, 128),
    (1, 8, 1, 50000, 64),
    (1, 40, 1, 12000, 128),
]
#: ``--pdl-full``: calls whose default split grid fills every SM (rows x splits = 132) or
#: nearly, where the block merge launched as a programmatic dependent ran 0.73x (B1 H32/4 24000
#: D 256, 33 splits of 4 rows) while it gained on grids of 128 CTAs or fewer
PDL_FULL = [
    (1, 32, 4, 24000, 256),
    (1, 16, 4, 24000, 128),
    (2, 16, 2, 30000, 128),
    (1, 12, 12, 20000, 128),
    (3, 32, 8, 8000, 128),
    (1, 24, 8, 16000, 64),
    (1, 28, 4, 16000, 128),
]
#: ``--waves``: batched calls whose one split fills the GPU with a last wave mostly empty
#: (rows of 144-768 CTAs at two an SM of 132), where the default trails cuDNN (0.94-0.98x)
WAVES = [
    (40, 32, 8, 2000, 128),
    (18, 32, 8, 5000, 128),
    (96, 32, 8, 700, 128),
    (36, 28, 4, 2200, 128),
    (24, 32, 8, 3000, 128),
    (64, 32, 8, 1024, 128),
]
#: ``--few-rows``: calls of one K/V head whose splits the 2048-row cap raised over the 1024-row
#: one (not measured when the cap rose), and two more
FEW_ROWS = [
    (1, 56, 1, 16000, 128),
    (1, 32, 1, 65536, 64),
    (3, 40, 1, 9000, 128),
    (1, 16, 1, 40000, 128),
    (2, 12, 1, 30000, 64),
]


def former_default(problem):
    """The sm_90 default before the rules of 2026-11-30 (256-key steps at D <= 64, the cap on
    merged rows, the block merge): the same function with them switched off."""
    from tiledattention.kernels.decode import _defaults

    names = ("SHORT_HEAD_DIM", "MAX_MERGED_ROWS", "DEFAULT_COMBINE")
    saved = [getattr(_defaults, n) for n in names]
    for name, value in zip(names, (0, 1 << 30, "kernel")):
        setattr(_defaults, name, value)
    try:
        return _defaults.default_decode_schedule("sm_90", problem)
    finally:
        for name, value in zip(names, saved):
            setattr(_defaults, name, value)


def variants(default, head_dim, steps=False, check=None):
    """Neighbours of the default: splits x2 / x4 / /2, occupancy 2, loads four steps ahead;
    with ``steps`` instead, longer key steps at head dims up to 64 (the same bytes a step as
    128 keys at D 128)."""
    s = default.splits
    out = {"default": default}
    if check == "kt":
        return {**out, "Kt": default.replace(k_transposed=True),
                "Kt w8": default.replace(k_transposed=True, num_worker_warps=8),
                "Kt K4": default.replace(k_transposed=True, k_latency=4)}
    if check == "waves":
        split = default.replace(combine="block_pdl")
        return {**out, "occ1": default.replace(occupancy=1),
                **{f"splits {n}": split.replace(splits=n) for n in (2, 3, 4)}}
    if check == "wide":
        return {**out, "w8": default.replace(num_worker_warps=8),
                "n64 K4 V4": default.replace(tile_n=64, k_latency=4, v_latency=4),
                "n64 K4 V4 occ2 splits x2": default.replace(
                    tile_n=64, k_latency=4, v_latency=4, occupancy=2,
                    splits=min(2 * s, MAX_SPLITS))}
    if check == "deep64":
        return {**out, "K3 V3": default.replace(k_latency=3, v_latency=3),
                "K4 V4": default.replace(k_latency=4, v_latency=4),
                "K3 V2": default.replace(k_latency=3),
                "K3 V3 occ2 splits x2": default.replace(k_latency=3, v_latency=3, occupancy=2,
                                                        splits=min(2 * s, MAX_SPLITS))}
    if check in ("pdl", "pdl-full"):  # (the default was the block merge when these ran)
        tried = {"block merge": default.replace(combine="block"),
                 "block merge, PDL": default.replace(combine="block_pdl")}
        if check == "pdl-full":
            pow2 = 1 << (s.bit_length() - 1)
            tried.update({"pow2 splits": default.replace(splits=pow2, combine="block"),
                          "pow2 splits, PDL": default.replace(splits=pow2,
                                                              combine="block_pdl")})
        return {**out, **tried}
    if check == "sinks":
        return {**out, "stepping merge": default.replace(combine="kernel")}
    if check == "few-rows":
        capped = max(1, min(s, 1024 // default.tile_m))
        return {**out, "1024 rows, block": default.replace(splits=capped),
                "1024 rows, stepping": default.replace(splits=capped, combine="kernel")}
    if check == "block":
        return {**out, "block merge": default.replace(combine="block"),
                "block merge, splits x2": default.replace(combine="block",
                                                          splits=min(2 * s, MAX_SPLITS))}
    if check is not None:
        return {**out, "former default": check}
    if steps:
        if head_dim <= 64:
            out["n256"] = default.replace(tile_n=256)
            out["n256 occ2"] = default.replace(tile_n=256, occupancy=2)
            out["n256 splits x2 occ2"] = default.replace(tile_n=256, occupancy=2,
                                                         splits=min(2 * s, MAX_SPLITS))
            out["n256 splits /2"] = default.replace(tile_n=256, splits=max(s // 2, 1))
            out["n256 K1 V1"] = default.replace(tile_n=256, k_latency=1, v_latency=1)
        return out
    for factor, tag in ((2, "x2"), (4, "x4")):
        more = min(s * factor, MAX_SPLITS)
        out[f"splits {tag}"] = default.replace(splits=more)
        out[f"splits {tag} occ2"] = default.replace(splits=more, occupancy=2)
        out[f"splits {tag} occ2 K4"] = default.replace(splits=more, occupancy=2, k_latency=4)
    out["occ2"] = default.replace(occupancy=2)
    out["K4"] = default.replace(k_latency=4)
    if s >= 2:
        out["splits /2"] = default.replace(splits=s // 2)
    if s >= 8:
        out["splits /4"] = default.replace(splits=s // 4)
        out["splits /8"] = default.replace(splits=s // 8)
    return out


def measure(call, rounds, steps=False, check=False, block=False, mode=None, host=False):
    b, hq, hkv, sk, d = call
    g = torch.Generator(device="cuda").manual_seed(sum(call))
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=g).to(torch.bfloat16)
               for h, s in ((hq, 1), (hkv, sk), (hkv, sk)))
    sinks = None
    if mode == "sinks":
        sinks = torch.randn(hq, device="cuda", generator=g) + 2.0
    p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                   dtype="bf16", causal=False, sinks=sinks is not None)
    default = ta.DECODE.default_schedule("sm_90", p)
    tried = variants(default, d, steps,
                     mode if mode else "block" if block else former_default(p) if check
                     else None)
    kf = k.float().repeat_interleave(hq // hkv, 1)
    vf = v.float().repeat_interleave(hq // hkv, 1)
    scores = q.float() @ kf.transpose(-1, -2) / d ** 0.5  # [b, hq, 1, sk]
    if sinks is not None:  # the sink joins each row's denominator as one more logit
        scores = torch.cat([scores, sinks.view(1, hq, 1, 1).expand(b, hq, 1, 1)], -1)
    ref = torch.softmax(scores, -1)[..., :sk] @ vf
    del kf, vf, scores
    fns, errs = {}, {}
    for tag, sch in tried.items():
        fns[tag] = (lambda sch=sch: ta.sdpa(q, k, v, schedule=sch, sinks=sinks))
        out = fns[tag]()
        errs[tag] = ((out.float() - ref).norm() / ref.norm()).item()

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                    enable_gqa=hq != hkv)
    fns["cudnn"] = cudnn
    kv_bytes = 2 * k.numel() * k.element_size()
    src = torch.ones(kv_bytes // 4, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    fns["copy"] = lambda: dst.copy_(src)
    t = {n: tm.median_ms for n, tm in time_interleaved(fns, rounds=rounds, host=host).items()}
    rate = 2 * kv_bytes / t["copy"]  # bytes a ms, read plus written
    print(f"\n# B{b} H{hq}/{hkv} S_k {sk} D{d}: default {default.describe()}; copy "
          f"{2 * kv_bytes / t['copy'] / 1e6:.0f} GB/s")
    print("| schedule | µs | % of copy | ÷ default (speed) | ÷ cuDNN (speed) | err |\n"
          "|---|---|---|---|---|---|")
    for tag in tried:
        print(f"| {tag} ({tried[tag].describe()}) | {t[tag] * 1e3:.1f} | "
              f"{kv_bytes / t[tag] / rate:.0%} | {t['default'] / t[tag]:.3f} | "
              f"{t['cudnn'] / t[tag]:.3f} | {errs[tag]:.1e} |")
    print(f"| cuDNN | {t['cudnn'] * 1e3:.1f} | {kv_bytes / t['cudnn'] / rate:.0%} | "
          f"{t['default'] / t['cudnn']:.3f} | 1 | |", flush=True)
    return {tag: t["default"] / t[tag] for tag in tried}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--heads64", action="store_true", help="the calls of HEADS64 instead")
    ap.add_argument("--steps", action="store_true",
                    help="(with --heads64) longer key steps instead of the neighbours")
    ap.add_argument("--check", action="store_true",
                    help="the calls of CHECK: the default against the former one")
    ap.add_argument("--check-rows", action="store_true",
                    help="the calls of CHECK_ROWS: the default against the former one")
    ap.add_argument("--mqa", action="store_true", help="the calls of MQA instead")
    ap.add_argument("--block", action="store_true",
                    help="the calls of BLOCK: the default's merge against the block merge")
    ap.add_argument("--sinks", action="store_true",
                    help="the calls of SINKS: the default against the stepping merge")
    ap.add_argument("--pdl", action="store_true",
                    help="the calls of BLOCK: the block merge against it launched with PDL")
    ap.add_argument("--kt", action="store_true",
                    help="the calls of CALLS: K loaded transposed")
    ap.add_argument("--waves", action="store_true",
                    help="the batched calls of WAVES: 2-4 splits against one")
    ap.add_argument("--wide", action="store_true",
                    help="B1 calls of CALLS: more loads in flight")
    ap.add_argument("--deep64", action="store_true",
                    help="the D 64 calls of HEADS64: deeper load pipelines")
    ap.add_argument("--host", action="store_true",
                    help="isolated calls from an idle GPU, the host's time counted")
    ap.add_argument("--pdl-full", action="store_true",
                    help="the calls of PDL_FULL: the same, on grids that fill the SMs")
    ap.add_argument("--few-rows", action="store_true",
                    help="the calls of FEW_ROWS: the default against 1024 merged rows")
    args = ap.parse_args()
    mode = ("sinks" if args.sinks else "few-rows" if args.few_rows else "pdl" if args.pdl
            else "pdl-full" if args.pdl_full else "deep64" if args.deep64
            else "wide" if args.wide else "waves" if args.waves else "kt" if args.kt
            else None)
    calls = (SINKS if args.sinks else FEW_ROWS if args.few_rows else BLOCK if args.pdl
             else PDL_FULL if args.pdl_full
             else [c for c in HEADS64 if c[4] == 64] if args.deep64
             else CALLS[:4] if args.wide else WAVES if args.waves else CALLS if args.kt
             else CHECK if args.check
             else CHECK_ROWS + MQA if args.check_rows else HEADS64 if args.heads64
             else MQA if args.mqa else BLOCK if args.block else CALLS)
    speed = [measure(call, args.rounds, args.steps, args.check or args.check_rows, args.block,
                     mode, args.host) for call in calls]
    print("\n| variant | geometric mean speed ÷ default | min | max |\n|---|---|---|---|")
    for tag in speed[0]:
        xs = [s[tag] for s in speed if tag in s]
        geo = math.exp(statistics.fmean(math.log(x) for x in xs))
        print(f"| {tag} | {geo:.3f} | {min(xs):.3f} | {max(xs):.3f} |")


if __name__ == "__main__":
    main()
