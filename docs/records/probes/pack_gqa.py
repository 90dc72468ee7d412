"""The forward with a K/V group's query heads packed into one tile (``Schedule.pack_gqa``)
against the same schedule unpacked, on packed variable-length batches and on dense calls of
few queries (chunked prefill, speculative verification), GPU time (``time_interleaved``: one
call between events, a spin ahead hides the host, the L2 flushed), contenders interleaved,
medians. Each contender's output is checked against the float32 reference first.

- ``default``: ``varlen_attn`` / ``sdpa`` as they resolve a schedule (the lookup);
- ``unpacked``: ragged calls: the resolved schedule with ``pack_gqa`` off; dense calls: the
  forward family's default rules' tiles, unpacked;
- ``packed``: the same with ``pack_gqa`` on;
- ``flash-attn-4`` (dense calls, where importable): FlashAttention-4's ``flash_attn_func`` on its
  own ``[B, S, H, D]`` layout.

    source .devtk/setup.sh && python3 docs/records/probes/pack_gqa.py [--only NAME] [--rounds N]
    source .devtk/setup.sh && python3 docs/records/probes/pack_gqa.py --d64 --occ3
    source .devtk/setup.sh && python3 docs/records/probes/pack_gqa.py --prefill
"""

import argparse

import torch

import tiledattention as ta
from tiledattention import FORWARD
from tiledattention.core._problem import Problem
from tiledattention.kernels.forward import _launch
from tiledattention.tooling import varlen_reference
from tuner.measure import time_interleaved

from packed_batches import log_uniform, rel, uniform  # this directory's probe: its helpers

PACK = [None]  # the ragged launches' schedule fields (set per contender; None: as resolved)
_plain_ragged_launch = _launch.ragged_launch


def _ragged_launch(problem, schedule, *args, **kwargs):
    if PACK[0] is not None:
        schedule = schedule.replace(**PACK[0])
    return _plain_ragged_launch(problem, schedule, *args, **kwargs)


_launch.ragged_launch = _ragged_launch


OCC3 = [False]  # also time the packed schedule at three CTAs an SM (``--occ3``)


def ragged_batches():
    g = torch.Generator().manual_seed(52)
    # name: (lengths, H_q, H_kv, D, causal, dtype)
    return {
        "vit-gqa4": (uniform(g, 80, 50, 300), 32, 8, 128, False, torch.bfloat16),
        "chat-short-gqa4": (uniform(g, 64, 16, 512), 32, 8, 128, True, torch.bfloat16),
        "mqa-short": (uniform(g, 128, 8, 160), 16, 1, 128, True, torch.bfloat16),
        "mqa-mix": (log_uniform(g, 40, 16, 3000), 16, 1, 128, True, torch.bfloat16),
        "gqa8-d64-short": (uniform(g, 100, 20, 300), 16, 2, 64, True, torch.float16),
        "sft-gqa4": (log_uniform(g, 24, 60, 6000), 32, 8, 128, True, torch.bfloat16),
        "near-equal-gqa4": (uniform(g, 16, 1900, 2100), 32, 8, 128, True, torch.float16),
    }


def dense_calls():
    # name: (B, H_q, H_kv, S_q, S_k, D, dtype): bottom-right causal (a chunk at the end)
    return {
        "verify-B8-q32-4k": (8, 32, 8, 32, 4096, 128, torch.bfloat16),
        "chunk-B1-q64-16k-gqa8": (1, 64, 8, 64, 16384, 128, torch.bfloat16),
        "chunk-B4-q128-8k-gqa8": (4, 32, 4, 128, 8192, 128, torch.float16),
        "chunk-B2-q256-32k-gqa4": (2, 32, 8, 256, 32768, 128, torch.bfloat16),
        "mqa-B16-q48-2k-d64": (16, 16, 1, 48, 2048, 64, torch.bfloat16),
        "verify-B4-q24-8k": (4, 32, 8, 24, 8192, 128, torch.bfloat16),
        "verify-B8-q32-mqa": (8, 16, 1, 32, 3000, 128, torch.float16),
        "verify-B2-q32-d64-gqa8": (2, 16, 2, 32, 6000, 64, torch.bfloat16),
        "verify-B8-q40-4k": (8, 32, 8, 40, 4096, 128, torch.bfloat16),
        "chunk-B8-q64-2k-gqa4": (8, 32, 8, 64, 2000, 128, torch.bfloat16),
    }


def d64_batches():
    g = torch.Generator().manual_seed(53)
    return {
        "d64-gqa4-near-equal": (uniform(g, 24, 900, 1100), 16, 4, 64, True, torch.bfloat16),
        "d64-gqa8-short": (uniform(g, 100, 20, 300), 16, 2, 64, True, torch.float16),
        "d64-llama1b-sft": (log_uniform(g, 32, 50, 4000), 32, 8, 64, True, torch.bfloat16),
        "d64-gqa4-full": (uniform(g, 64, 50, 600), 16, 4, 64, False, torch.bfloat16),
    }


def d64_calls():
    return {
        "d64-mqa-B16-q48-2k": (16, 16, 1, 48, 2048, 64, torch.bfloat16),
        "d64-verify-B8-q24-4k": (8, 32, 8, 24, 4096, 64, torch.bfloat16),
    }


def prefill_calls():
    # name: (B, H_q, H_kv, S, D, dtype, causal): self-attention prefills
    return {
        "prefill-B1-H32/8-8k-causal": (1, 32, 8, 8192, 128, torch.bfloat16, True),
        "prefill-B2-H64/8-4k-causal": (2, 64, 8, 4096, 128, torch.bfloat16, True),
        "prefill-B4-H32/8-2k-causal-fp16": (4, 32, 8, 2048, 128, torch.float16, True),
        "prefill-B1-H16/2-16k-causal": (1, 16, 2, 16384, 128, torch.bfloat16, True),
        "prefill-B8-H32/8-1k-causal": (8, 32, 8, 1000, 128, torch.bfloat16, True),
        "prefill-B2-H32/8-4k-full": (2, 32, 8, 4096, 128, torch.bfloat16, False),
        "prefill-B1-H16/4-8k-causal-d256": (1, 16, 4, 8192, 256, torch.bfloat16, True),
    }


def prefill_contenders(b, hq, hkv, s, d, dtype, causal):
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, hq, s, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=dtype, generator=g)
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
                      dtype="bf16" if dtype == torch.bfloat16 else "fp16", causal=causal)
    base = FORWARD.default_schedule("sm_90", problem).replace(pack_gqa=False)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(hq // hkv, 1),
        v.float().repeat_interleave(hq // hkv, 1), is_causal=causal)
    fns = {"default": lambda: ta.sdpa(q, k, v, causal),
           "unpacked": lambda: ta.sdpa(q, k, v, causal, schedule=base),
           "packed": lambda: ta.sdpa(q, k, v, causal, schedule=base.replace(pack_gqa=True))}
    pairs = s * (s + 1) // 2 if causal else s * s
    return fns, {name: rel(fn(), ref) for name, fn in fns.items()}, 4 * b * hq * d * pairs


def _fa4():
    """FlashAttention-4's ``flash_attn_func`` where importable, else None."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception:  # not installed here
        return None
    return flash_attn_func


def ragged_contenders(lengths, hq, hkv, d, causal, dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    t = sum(lengths)
    q = torch.randn(t, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(t, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(t, hkv, d, device="cuda", dtype=dtype, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device="cuda")
    longest = max(lengths)
    ref = varlen_reference(q.float(), k.float(), v.float(), cu, cu, causal=causal)

    def call(fields):
        def run():
            PACK[0] = fields
            return ta.varlen_attn(q, k, v, cu, cu, longest, longest, is_causal=causal,
                                  enable_gqa=True)
        return run
    fns = {"default": call(None), "unpacked": call(dict(pack_gqa=False)),
           "packed": call(dict(pack_gqa=True))}
    if OCC3[0]:
        fns["packed-occ3"] = call(dict(pack_gqa=True, occupancy=3))
    flops = 4 * hq * d * sum(n * (n + 1) // 2 if causal else n * n for n in lengths)
    return fns, {name: rel(fn(), ref) for name, fn in fns.items()}, flops


def dense_contenders(b, hq, hkv, sq, sk, d, dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype, generator=g)
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                      dtype="bf16" if dtype == torch.bfloat16 else "fp16", causal=True,
                      bottom_right=True)
    base = FORWARD.default_schedule("sm_90", problem).replace(pack_gqa=False)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(hq // hkv, 1),
        v.float().repeat_interleave(hq // hkv, 1),
        attn_mask=torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq))
    fns = {"default": lambda: ta.sdpa(q, k, v, "bottom_right"),
           "unpacked": lambda: ta.sdpa(q, k, v, "bottom_right", schedule=base),
           "packed": lambda: ta.sdpa(q, k, v, "bottom_right",
                                     schedule=base.replace(pack_gqa=True))}
    if OCC3[0]:
        fns["packed-occ3"] = lambda: ta.sdpa(q, k, v, "bottom_right",
                                             schedule=base.replace(pack_gqa=True, occupancy=3))
    fa4 = _fa4()
    if fa4 is not None:  # on its own [B, S, H, D] layout, made contiguous outside the timing
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

        def flash():
            out = fa4(qt, kt, vt, causal=True)  # FlashAttention aligns causal bottom-right
            return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
        fns["flash-attn-4"] = flash
    flops = 4 * b * hq * d * sum(min(sk, sk - sq + i + 1) for i in range(sq))
    return fns, {name: rel(fn(), ref) for name, fn in fns.items()}, flops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--occ3", action="store_true",
                    help="add the packed schedule at three CTAs an SM (packed-occ3)")
    ap.add_argument("--d64", action="store_true", help="the D 64 set of grouped calls")
    ap.add_argument("--prefill", action="store_true", help="dense self-attention prefills")
    ap.add_argument("--dense", action="store_true", help="the dense calls of few queries only")
    args = ap.parse_args()
    OCC3[0] = args.occ3
    only = set(filter(None, args.only.split(",")))
    rows = []
    if args.prefill:
        todo = [(n, prefill_contenders, c) for n, c in prefill_calls().items()]
    elif args.dense:
        todo = [(n, dense_contenders, c) for n, c in dense_calls().items()]
        todo += [(n, dense_contenders, c) for n, c in d64_calls().items()]
    elif args.d64:
        todo = [(n, ragged_contenders, c) for n, c in d64_batches().items()]
        todo += [(n, dense_contenders, c) for n, c in d64_calls().items()]
    else:
        todo = [(n, ragged_contenders, c) for n, c in ragged_batches().items()]
        todo += [(n, dense_contenders, c) for n, c in dense_calls().items()]
    for name, make, case in todo:
        if only and name not in only:
            continue
        fns, errs, flops = make(*case)
        times = time_interleaved(fns, rounds=args.rounds)
        ms = {n: t.median_ms for n, t in times.items()}
        print(f"{name}: " + ", ".join(f"{n} {ms[n] * 1e3:.1f} us ({flops / ms[n] / 1e9:.0f} "
                                       f"TF/s, err {errs[n]:.1e})" for n in fns), flush=True)
        rows.append((name, ms, errs))
    print("\n| call | unpacked us | packed us | packed speed-up | default us | "
          "packed occ3 speed-up | FA4 us | FA4 / default | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, ms, errs in rows:
        occ3 = f"{ms['unpacked'] / ms['packed-occ3']:.3f}" if "packed-occ3" in ms else ""
        fa4 = (f"{ms['flash-attn-4'] * 1e3:.1f} | {ms['flash-attn-4'] / ms['default']:.3f}"
               if "flash-attn-4" in ms else " | ")
        print(f"| {name} | {ms['unpacked'] * 1e3:.1f} | {ms['packed'] * 1e3:.1f} | "
              f"{ms['unpacked'] / ms['packed']:.3f} | {ms['default'] * 1e3:.1f} | {occ3} | "
              f"{fa4} | {max(errs.values()):.1e} |")


if __name__ == "__main__":
    main()
