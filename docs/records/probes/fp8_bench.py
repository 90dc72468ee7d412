"""FP8 against bf16 on the GPU (issue 52), every contender interleaved in one run:

- prefill: ``tiledattention.sdpa`` of e4m3 q, k, v with per-head descale factors (the lookup's
  schedule; the call's V transpose counted) against our bf16 forward and torch's cuDNN backend
  on the same shapes; errors by relative L2 against the float32 attention of the dequantised
  inputs (and bf16's against its own inputs), on random and on heavy-tailed (Student-t, 3
  degrees of freedom) inputs;
- decode over an FP8 K/V cache (bf16 queries): ours against our bf16 decode and cuDNN on the
  same shape, with the share of the device-to-device copy rate (measured in the same run) at
  which each reads its cache's bytes.

Two timing views: GPU time (L2 flushed before every sample; the host hidden) and a loop of
calls back to back with the host's time counted (``time_interleaved(loop=True)``).

    source .devtk/setup.sh && python3 docs/records/probes/fp8_bench.py [--rounds N]
"""

import argparse
import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention as ta
from tiledattention.tooling import dequantise_fp8, quantise_fp8
from tuner.measure import time_interleaved

PREFILL = [  # name, B, H_q, H_kv, S, D, causal
    ("llama3-8b 8k", 1, 32, 8, 8192, 128, True),
    ("llama3-8b 32k", 1, 32, 8, 32768, 128, True),
    ("qwen2.5-7b 4k x4", 4, 28, 4, 4096, 128, True),
    ("mistral-7b 2k x8", 8, 32, 8, 2048, 128, True),
    ("llama3-70b tp8 16k", 1, 8, 1, 16384, 128, True),
    ("gemma2 D256 8k x2", 2, 16, 8, 8192, 256, True),
    ("qwen2.5-7b 8k full", 1, 28, 4, 8192, 128, False),
    ("llama3-8b 4k full x2", 2, 32, 8, 4096, 128, False),
    ("D256 4k full x2", 2, 16, 8, 4096, 256, False),
]
DECODE = [  # name, B, H_q, H_kv, S_k, D
    ("B1 32k", 1, 32, 8, 32768, 128),
    ("B1 128k", 1, 32, 8, 131072, 128),
    ("B1 8k", 1, 32, 8, 8192, 128),
    ("B8 8k", 8, 32, 8, 8192, 128),
    ("B32 4k", 32, 32, 8, 4096, 128),
    ("B64 2k qwen", 64, 28, 4, 2048, 128),
    ("B16 16k D256", 16, 16, 8, 16384, 256),
]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def student_t(shape, gen):
    x = torch.randn(shape, device="cuda", generator=gen)
    chi2 = sum(torch.randn(shape, device="cuda", generator=gen) ** 2 for _ in range(3))
    return x / (chi2 / 3).sqrt()


def prefill(rounds):
    rows = []
    for i, (name, b, hq, hkv, s, d, causal) in enumerate(PREFILL):
        g = torch.Generator(device="cuda").manual_seed(i)
        reals = [torch.randn(b, h, s, d, device="cuda", generator=g) for h in (hq, hkv, hkv)]
        quantised = [quantise_fp8(x, hkv) for x in reals]
        q8, k8, v8 = (x for x, _ in quantised)
        qd, kd, vd = (f for _, f in quantised)
        q, k, v = (x.to(torch.bfloat16) for x in reals)
        fns = {
            "fp8": lambda: ta.sdpa(q8, k8, v8, causal, q_descale=qd, k_descale=kd,
                                   v_descale=vd),
            "bf16": lambda: ta.sdpa(q, k, v, causal),
        }

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=hq != hkv)
        fns["cudnn"] = cudnn
        deq = [dequantise_fp8(x, f) for x, f in ((q8, qd), (k8, kd), (v8, vd))]
        if s * s * b * hq <= 2 ** 34:  # the float32 reference fits
            ref8 = torch.nn.functional.scaled_dot_product_attention(
                *deq, is_causal=causal, enable_gqa=hq != hkv)
            ref16 = torch.nn.functional.scaled_dot_product_attention(
                *reals, is_causal=causal, enable_gqa=hq != hkv)
            err8, err16 = rel(fns["fp8"](), ref8), rel(fns["bf16"](), ref16)
            del ref8, ref16
        else:
            err8 = err16 = float("nan")
        gpu = time_interleaved(fns, rounds=rounds)
        loop = time_interleaved(fns, rounds=max(3, rounds // 2), flush_l2=False, loop=True)
        flops = 4 * b * hq * s * s * d / (2 if causal else 1)
        t = {n: gpu[n].median_ms for n in fns}
        tl = {n: loop[n].median_ms for n in fns}
        row = dict(name=name, tflops8=flops / t["fp8"] / 1e9, tflops16=flops / t["bf16"] / 1e9,
                   x_bf16=t["bf16"] / t["fp8"], x_cudnn=t["cudnn"] / t["fp8"],
                   loop_x_bf16=tl["bf16"] / tl["fp8"], err8=err8, err16=err16)
        print(f"{name}: fp8 {t['fp8']:.3f} ms ({row['tflops8']:.0f} TFLOP/s), bf16 "
              f"{t['bf16']:.3f} ms ({row['tflops16']:.0f}), cuDNN {t['cudnn']:.3f}; "
              f"x bf16 {row['x_bf16']:.2f} (loop {row['loop_x_bf16']:.2f}), x cuDNN "
              f"{row['x_cudnn']:.2f}; err fp8 {err8:.2e} bf16 {err16:.2e}", flush=True)
        rows.append(row)
    # heavy-tailed inputs on one shape: the error a user with outliers sees
    g = torch.Generator(device="cuda").manual_seed(99)
    b, hq, hkv, s, d = 1, 32, 8, 4096, 128
    reals = [student_t((b, h, s, d), g) for h in (hq, hkv, hkv)]
    quantised = [quantise_fp8(x, hkv) for x in reals]
    deq = [dequantise_fp8(x, f) for x, f in quantised]
    out = ta.sdpa(*(x for x, _ in quantised), True, q_descale=quantised[0][1],
                  k_descale=quantised[1][1], v_descale=quantised[2][1])
    heavy_deq = rel(out, torch.nn.functional.scaled_dot_product_attention(
        *deq, is_causal=True, enable_gqa=True))
    heavy_real = rel(out, torch.nn.functional.scaled_dot_product_attention(
        *reals, is_causal=True, enable_gqa=True))
    bf16_real = rel(ta.sdpa(*(x.to(torch.bfloat16) for x in reals), True),
                    torch.nn.functional.scaled_dot_product_attention(
                        *reals, is_causal=True, enable_gqa=True))
    print(f"heavy-tailed B1 H32/8 S4096 D128 causal: fp8 err vs dequantised {heavy_deq:.2e}, "
          f"vs the unquantised inputs {heavy_real:.2e}; bf16 vs unquantised {bf16_real:.2e}")
    return rows


def decode(rounds):
    rows = []
    for i, (name, b, hq, hkv, sk, d) in enumerate(DECODE):
        g = torch.Generator(device="cuda").manual_seed(100 + i)
        q = torch.randn(b, hq, 1, d, device="cuda", generator=g).to(torch.bfloat16)
        reals = [torch.randn(b, hkv, sk, d, device="cuda", generator=g) for _ in range(2)]
        (k8, kd), (v8, vd) = (quantise_fp8(x, hkv) for x in reals)
        k, v = (x.to(torch.bfloat16) for x in reals)
        fns = {"fp8": lambda: ta.sdpa(q, k8, v8, k_descale=kd, v_descale=vd),
               "bf16": lambda: ta.sdpa(q, k, v)}

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                        enable_gqa=hq != hkv)
        fns["cudnn"] = cudnn
        bytes8 = 2 * k8.numel()  # the FP8 cache's K and V bytes
        src = torch.ones(bytes8 // 4, dtype=torch.int32, device="cuda")
        dst = torch.empty_like(src)
        fns["copy"] = lambda: dst.copy_(src)  # reads and writes bytes8 each
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), dequantise_fp8(k8, kd), dequantise_fp8(v8, vd), enable_gqa=hq != hkv)
        err = rel(fns["fp8"](), ref)
        gpu = time_interleaved(fns, rounds=rounds)
        loop = time_interleaved(fns, rounds=max(3, rounds // 2), flush_l2=False, loop=True)
        t = {n: gpu[n].median_ms for n in fns}
        rate = 2 * bytes8 / (t["copy"] * 1e-3) / 1e9  # GB/s read plus written by the copy
        tl = {n: loop[n].median_ms for n in fns}
        row = dict(name=name, us8=t["fp8"] * 1e3, us16=t["bf16"] * 1e3,
                   x_bf16=t["bf16"] / t["fp8"], x_cudnn=t["cudnn"] / t["fp8"],
                   loop_x_bf16=tl["bf16"] / tl["fp8"],
                   copy8=bytes8 / (t["fp8"] * 1e-3) / 1e9 / rate,
                   copy16=2 * bytes8 / (t["bf16"] * 1e-3) / 1e9 / rate, err=err)
        print(f"decode {name}: fp8 {row['us8']:.1f} us ({row['copy8']:.0%} of copy), bf16 "
              f"{row['us16']:.1f} us ({row['copy16']:.0%}), cuDNN {t['cudnn'] * 1e3:.1f} us; "
              f"x bf16 {row['x_bf16']:.2f} (loop {row['loop_x_bf16']:.2f}, "
              f"{tl['fp8'] * 1e3:.1f} vs {tl['bf16'] * 1e3:.1f} us), x cuDNN "
              f"{row['x_cudnn']:.2f}; err {err:.1e}", flush=True)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--only", choices=("prefill", "decode"), default=None)
    args = ap.parse_args()
    pre = [] if args.only == "decode" else prefill(args.rounds)
    dec = [] if args.only == "prefill" else decode(args.rounds)
    print("\n| prefill | fp8 TFLOP/s | bf16 TFLOP/s | fp8 x bf16 (GPU) | x bf16 (loop) | "
          "x cuDNN | err fp8 | err bf16 |\n|---|---|---|---|---|---|---|---|")
    for r in pre:
        print(f"| {r['name']} | {r['tflops8']:.0f} | {r['tflops16']:.0f} | {r['x_bf16']:.2f} | "
              f"{r['loop_x_bf16']:.2f} | {r['x_cudnn']:.2f} | {r['err8']:.1e} | "
              f"{r['err16']:.1e} |")
    if pre:
        geo = math.exp(sum(math.log(r["x_bf16"]) for r in pre) / len(pre))
        print(f"geometric mean fp8 x bf16 (GPU): {geo:.3f}")
    print("\n| decode | fp8 us | bf16 us | fp8 x bf16 (GPU) | x bf16 (loop) | x cuDNN | "
          "fp8 share of copy | bf16 share | err |\n|---|---|---|---|---|---|---|---|---|")
    for r in dec:
        print(f"| {r['name']} | {r['us8']:.1f} | {r['us16']:.1f} | {r['x_bf16']:.2f} | "
              f"{r['loop_x_bf16']:.2f} | {r['x_cudnn']:.2f} | {r['copy8']:.0%} | "
              f"{r['copy16']:.0%} | {r['err']:.1e} |")


if __name__ == "__main__":
    main()
