"""Where a small decode call's time goes (issue 49): the split kernel, the gap, the combine.

Runs each call's default schedule (and ``--also`` schedules) ``--calls`` times under
``torch.profiler`` (CUPTI kernel records), the L2 flushed before each call by a 256 MB write,
and prints per call the medians of: the split kernel's duration, the gap from its end to the
combine's start, the combine's duration, and the span from the split's start to the combine's
end; beside it the same for torch's cuDNN decode (its kernels summed, first start to last end).

    source .devtk/setup.sh && python3 docs/records/probes/decode_timeline.py [--calls 30]
"""

import argparse
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import tiledattention as ta

CALLS = [  # B, H_q, H_kv, S_k, D
    (1, 32, 8, 4096, 128),
    (1, 32, 8, 8192, 128),
    (1, 32, 8, 32768, 128),
    (1, 8, 1, 50000, 64),
]


def kernels_per_call(fn, calls, flush):
    """``[[(name, start_us, end_us), ...] per call]`` of the kernels ``fn`` launches."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush()
            fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                    key=lambda e: e.time_range.start)
    out, cur = [], None
    for e in events:
        name = e.name
        if "flush" in name or name.startswith("void at::native::vectorized_elementwise") \
                and "FillFunctor" in name:
            cur = []
            out.append(cur)
            continue
        if cur is not None:
            cur.append((name, e.time_range.start, e.time_range.end))
    return [c for c in out if c]


def summary(per_call):
    first = [c[0] for c in per_call]
    last = [c[-1] for c in per_call]
    med = statistics.median
    row = {"first kernel": med([e - s for _, s, e in first]),
           "span": med([c[-1][2] - c[0][1] for c in per_call]),
           "kernels": len(per_call[0])}
    if row["kernels"] >= 2:
        row["gap"] = med([c[1][1] - c[0][2] for c in per_call])
        row["last kernel"] = med([e - s for _, s, e in last])
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    buf = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")

    def flush():
        buf.fill_(1)

    print("| call | who | kernels | first kernel µs | gap µs | last kernel µs | span µs |\n"
          "|---|---|---|---|---|---|---|")
    for b, hq, hkv, sk, d in CALLS:
        g = torch.Generator(device="cuda").manual_seed(sk)
        q, k, v = (torch.randn(bb, h, s, d, device="cuda", generator=g).to(torch.bfloat16)
                   for bb, h, s in ((b, hq, 1), (b, hkv, sk), (b, hkv, sk)))
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                       head_dim=d, dtype="bf16", causal=False)
        default = ta.DECODE.default_schedule("sm_90", p)
        who = {f"ours {default.describe()}": lambda: ta.sdpa(q, k, v),
               "ours block_pdl": lambda: ta.sdpa(
                   q, k, v, schedule=default.replace(combine="block_pdl"))}

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, enable_gqa=hq != hkv)
        who["cuDNN"] = cudnn
        for name, fn in who.items():
            r = summary(kernels_per_call(fn, args.calls, flush))
            print(f"| B{b} H{hq}/{hkv} {sk} D{d} | {name} | {r['kernels']} | "
                  f"{r['first kernel']:.1f} | {r.get('gap', 0):.1f} | "
                  f"{r.get('last kernel', 0):.1f} | {r['span']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
