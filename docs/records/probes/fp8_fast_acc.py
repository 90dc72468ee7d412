"""FP8 prefill with the e4m3 products accumulated in the tensor core's own precision
(``Schedule.fast_acc``: ``ct.mma(..., use_fast_acc=True)``) against tileiras's default (each
product summed into a fresh float32 tile, then added: one FADD an element and product), on the
GPU (issue 52). Per call: the lookup's schedule for the e4m3 problem with ``fast_acc`` off (as
shipped before this field) and on, and our bf16 forward of the same shape (its own lookup);
GPU time (L2 flushed, host hidden), interleaved, median of ``--rounds``; errors by relative L2
against the float32 attention of the dequantised inputs where that fits, on random normal
inputs and on one heavy-tailed (Student-t, 3 degrees of freedom) call. Shapes: Llama, Qwen,
Mistral and Gemma-shaped prefills that are not the FP8 tuning grid.

    source .devtk/setup.sh && python3 docs/records/probes/fp8_fast_acc.py [--rounds N]
        [--only I,J]   # SHAPES by index (--only 0 --rounds 1: a JIT warm-up of one shape)
        [--tiles]      # instead: other tiles (with fast_acc) against the lookup's, per shape
        [--d256]       # instead: D 256 calls, the default against the former rules and bf16
        [--isolated]   # (--d256) isolated calls, host time counted, instead of GPU time
"""

import argparse
import math
import sys
from pathlib import Path

import torch

import tiledattention as ta
from tiledattention.tooling import dequantise_fp8, quantise_fp8
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from fp8_bench import rel, student_t  # noqa: E402

SHAPES = [  # name, B, H_q, H_kv, S, D, causal
    ("llama3-8b 4k x2", 2, 32, 8, 4096, 128, True),
    ("llama3-8b 16k", 1, 32, 8, 16384, 128, True),
    ("qwen2.5-7b 3k x3", 3, 28, 4, 3000, 128, True),
    ("mistral-7b 8k", 1, 32, 8, 8192, 128, True),
    ("llama3-70b tp4 8k", 1, 16, 2, 8192, 128, True),
    ("qwen2.5-7b 6k full", 1, 28, 4, 6144, 128, False),
    ("gemma2 D256 4k x2", 2, 8, 4, 4096, 256, True),
    ("D256 8k full", 1, 16, 8, 8192, 256, False),
    ("llama3-8b 2k x8 full", 8, 32, 8, 2048, 128, False),
]


def inputs(b, hq, hkv, s, d, gen, heavy=False):
    make = (lambda shape: student_t(shape, gen)) if heavy else (
        lambda shape: torch.randn(shape, device="cuda", generator=gen))
    reals = [make((b, h, s, d)) for h in (hq, hkv, hkv)]
    quantised = [quantise_fp8(x, hkv) for x in reals]
    return reals, [x for x, _ in quantised], [f for _, f in quantised]


def errors(fns, tags, values, descales, causal):
    """Relative L2 error of each of ``fns[tags]`` against the float32 attention of the
    dequantised inputs, or nothing where that reference would not fit (``{}``)."""
    q8, k8 = values[:2]
    if q8.shape[0] * q8.shape[1] * q8.shape[2] * k8.shape[2] > 2 ** 32:
        return {}
    deq = [dequantise_fp8(x, f) for x, f in zip(values, descales)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *deq, is_causal=causal, enable_gqa=q8.shape[1] != k8.shape[1])
    return {tag: rel(fns[tag](), ref) for tag in tags}


def indices(only, count):
    """``--only``'s indices, or all ``count``."""
    return {int(i) for i in only.split(",")} if only else set(range(count))


def schedules(q8, k8, v8, causal):
    """The lookup's schedule for the call with ``fast_acc`` off and on."""
    looked = ta.explain(q8, k8, v8, causal).schedule
    return {"fp8": looked.replace(fast_acc=False), "fp8 fast": looked.replace(fast_acc=True)}


#: ``--tiles``: fields replacing the lookup's (fast_acc on) at D 128
TILES = {"128x128 occ2": dict(tile_m=128, tile_n=128, occupancy=2, num_ctas=1),
         "128x256 occ1 w8": dict(tile_m=128, tile_n=256, occupancy=1, num_ctas=1,
                                 num_worker_warps=8),
         "64x128 occ2": dict(tile_m=64, tile_n=128, occupancy=2, num_ctas=1,
                             num_worker_warps=None),
         "64x128 occ3": dict(tile_m=64, tile_n=128, occupancy=3, num_ctas=1,
                             num_worker_warps=None),
         "64x256 occ2": dict(tile_m=64, tile_n=256, occupancy=2, num_ctas=1,
                             num_worker_warps=None),
         "128x128 occ2 cta2": dict(tile_m=128, tile_n=128, occupancy=2, num_ctas=2,
                                   num_worker_warps=None)}


#: ``--tiles`` at D 256: the lookup's (``fast_acc`` off there) against it on, and tiles whose
#: e4m3 kernel does not spill with it (sm_90 cubins: no cluster, 64-key steps)
TILES_256 = {"fast_acc": dict(fast_acc=True),
             "no cluster": dict(num_ctas=1),
             "no cluster, fast_acc": dict(num_ctas=1, fast_acc=True),
             "64-key steps, fast_acc": dict(tile_n=64, fast_acc=True),
             "64-key steps, no cluster, fast_acc": dict(tile_n=64, num_ctas=1, fast_acc=True)}


def tiles(only, rounds):
    for i, (name, b, hq, hkv, s, d, causal) in enumerate(SHAPES):
        if i not in only:
            continue
        g = torch.Generator(device="cuda").manual_seed(i)
        _, (q8, k8, v8), (qd, kd, vd) = inputs(b, hq, hkv, s, d, g)
        looked = ta.explain(q8, k8, v8, causal).schedule
        if d <= 128:
            looked = looked.replace(fast_acc=True)
        tried = {"lookup": looked, **{tag: looked.replace(**f) for tag, f in (
            TILES if d <= 128 else TILES_256).items()}}
        fns, errs, want = {}, {}, None
        for tag, sch in tried.items():
            run = (lambda sch=sch: ta.sdpa(q8, k8, v8, causal, q_descale=qd, k_descale=kd,
                                           v_descale=vd, schedule=sch))
            try:
                got = run()
            except Exception as exc:  # an infeasible tile: reported, the sweep goes on
                print(f"  {tag}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                continue
            want = got if want is None else want
            errs[tag] = rel(got, want)
            fns[tag] = run
        times = time_interleaved(fns, rounds=rounds)
        flops = 4 * b * hq * s * s * d / (2 if causal else 1)
        base = times["lookup"].median_ms
        print(f"# {name}: lookup {looked.describe()}", flush=True)
        for tag, tm in times.items():
            print(f"  {tag:20s} {flops / tm.median_ms / 1e9:6.0f} TFLOP/s "
                  f"{base / tm.median_ms:5.2f}x lookup  diff {errs[tag]:.1e}", flush=True)


#: ``--d256``: D 256 prefills that are not in ``SHAPES``
D256 = [("D256 8k causal (32/16)", 1, 32, 16, 8192, 256, True),
        ("D256 2k x4 causal (16/8)", 4, 16, 8, 2048, 256, True),
        ("D256 16k causal (16/2)", 1, 16, 2, 16384, 256, True),
        ("D256 3000 x2 full (16/16)", 2, 16, 16, 3000, 256, False),
        ("D256 4k x2 full (16/4)", 2, 16, 4, 4096, 256, False)]


def former_d256(causal):
    """The sm_90 FP8 D 256 rules before ``fast_acc`` (two-CTA clusters, float32 adds)."""
    if causal:
        return ta.Schedule(tile_m=128, tile_n=128, occupancy=3, num_ctas=2, num_worker_warps=8,
                           exp2=True, approx_div=True, k_latency=4, v_latency=2,
                           kv_sawtooth=True, unchecked_loads=True, paired_tiles=True)
    return ta.Schedule(tile_m=128, tile_n=256, occupancy=2, num_ctas=2, num_worker_warps=8,
                       exp2=True, k_transposed=True, v_latency=2)


def d256(only, rounds, isolated=False):
    """The default against the former D 256 rules and our bf16 forward, with errors
    (``isolated``: each sample an isolated call with the host's time counted)."""
    print("| prefill (e4m3) | fp8 TFLOP/s | former rule | bf16 | fp8 ÷ former | fp8 ÷ bf16 | "
          "err fp8 | err former |\n|---|---|---|---|---|---|---|---|")
    for i, (name, b, hq, hkv, s, d, causal) in enumerate(D256):
        if i not in only:
            continue
        g = torch.Generator(device="cuda").manual_seed(100 + i)
        reals, (q8, k8, v8), (qd, kd, vd) = inputs(b, hq, hkv, s, d, g)
        q, k, v = (x.to(torch.bfloat16) for x in reals)
        fns = {"fp8": lambda: ta.sdpa(q8, k8, v8, causal, q_descale=qd, k_descale=kd,
                                      v_descale=vd),
               "former": lambda: ta.sdpa(q8, k8, v8, causal, q_descale=qd, k_descale=kd,
                                         v_descale=vd, schedule=former_d256(causal)),
               "bf16": lambda: ta.sdpa(q, k, v, causal)}
        errs = errors(fns, ("fp8", "former"), (q8, k8, v8), (qd, kd, vd), causal)
        t = {tag: tm.median_ms for tag, tm in time_interleaved(
            fns, rounds=rounds, host=isolated).items()}
        flops = 4 * b * hq * s * s * d / (2 if causal else 1)
        tf = {tag: flops / ms / 1e9 for tag, ms in t.items()}
        print(f"| {name} | {tf['fp8']:.0f} | {tf['former']:.0f} | {tf['bf16']:.0f} | "
              f"{t['former'] / t['fp8']:.2f} | {t['bf16'] / t['fp8']:.2f} | "
              f"{errs.get('fp8', math.nan):.1e} | {errs.get('former', math.nan):.1e} |",
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--only", default="")
    ap.add_argument("--tiles", action="store_true")
    ap.add_argument("--d256", action="store_true")
    ap.add_argument("--isolated", action="store_true")
    args = ap.parse_args()
    only = indices(args.only, len(SHAPES))
    if args.tiles:
        tiles(only, args.rounds)
        return
    if args.d256:
        d256(indices(args.only, len(D256)), args.rounds, args.isolated)
        return
    table = []
    for i, (name, b, hq, hkv, s, d, causal) in enumerate(SHAPES):
        if i not in only:
            continue
        g = torch.Generator(device="cuda").manual_seed(i)
        reals, (q8, k8, v8), (qd, kd, vd) = inputs(b, hq, hkv, s, d, g)
        q, k, v = (x.to(torch.bfloat16) for x in reals)
        fns = {tag: (lambda sch=sch: ta.sdpa(q8, k8, v8, causal, q_descale=qd, k_descale=kd,
                                              v_descale=vd, schedule=sch))
               for tag, sch in schedules(q8, k8, v8, causal).items()}
        fns["bf16"] = lambda: ta.sdpa(q, k, v, causal)
        errs = errors(fns, ("fp8", "fp8 fast"), (q8, k8, v8), (qd, kd, vd), causal)
        times = time_interleaved(fns, rounds=args.rounds)
        flops = 4 * b * hq * s * s * d / (2 if causal else 1)
        t = {tag: tm.median_ms for tag, tm in times.items()}
        row = (name, *(flops / t[tag] / 1e9 for tag in ("fp8", "fp8 fast", "bf16")),
               t["fp8"] / t["fp8 fast"], t["bf16"] / t["fp8"], t["bf16"] / t["fp8 fast"],
               errs.get("fp8", math.nan), errs.get("fp8 fast", math.nan))
        table.append(row)
        print(" ".join(str(x) if isinstance(x, str) else f"{x:.4g}" for x in row), flush=True)
    g = torch.Generator(device="cuda").manual_seed(99)
    _, (q8, k8, v8), (qd, kd, vd) = inputs(1, 32, 8, 4096, 128, g, heavy=True)
    heavy = errors({tag: (lambda sch=sch: ta.sdpa(q8, k8, v8, True, q_descale=qd, k_descale=kd,
                                                   v_descale=vd, schedule=sch))
                    for tag, sch in schedules(q8, k8, v8, True).items()},
                   ("fp8", "fp8 fast"), (q8, k8, v8), (qd, kd, vd), True)
    print("\n| prefill (e4m3, per-head descales) | fp8 TFLOP/s | fp8 fast_acc TFLOP/s | bf16 "
          "TFLOP/s | fast ÷ default (speed) | fp8 ÷ bf16 | fast ÷ bf16 | err fp8 | "
          "err fast |\n|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r[0]} | {r[1]:.0f} | {r[2]:.0f} | {r[3]:.0f} | {r[4]:.2f} | {r[5]:.2f} | "
              f"{r[6]:.2f} | {r[7]:.1e} | {r[8]:.1e} |")
    for k, col in (("fast ÷ default", 4), ("fp8 ÷ bf16", 5), ("fast ÷ bf16", 6)):
        geo = math.exp(sum(math.log(r[col]) for r in table) / len(table))
        print(f"geometric mean {k}: {geo:.3f}")
    print(f"heavy-tailed B1 H32/8 S4096 D128 causal, err vs the dequantised inputs: "
          f"default {heavy['fp8']:.2e}, fast_acc {heavy['fp8 fast']:.2e}")


if __name__ == "__main__":
    main()
