"""The split kernel's last CTA merges its row (issue 49, item 1), second attempt: partials
stored plain, the count an acquire-release atomic at device scope, and the merge's loads
relaxed at device scope (``LDG.E.128.STRONG.GPU`` in the sm_90 SASS: no TMA, no ``LDGSTS``,
so no load can be issued by the producer warps or served from a stale L1 line), the block
merge's arithmetic (``_merged_block``) chunk by chunk. The first attempt (weak loads) read
stale partials in 132-244 of 1000-2000 launches (``paged/issue49/README.md`` section 1).

For each call (bf16, D 128): ``--stress N`` launches at random cache lengths (up to the
call's), partials and output NaN-poisoned before each, the merging launch beside the default
(two kernels: split, block merge) on the same inputs; counts launches whose outputs differ
bit for bit, the worst relative L2 of either against the float32 reference (every 50th
launch), and the counters left. Then GPU time (L2 flushed, interleaved, medians) of the
default, the merging form and cuDNN, with the share of the copy rate, and the loop view
(calls back to back, the host's time counted, per call).

    source .devtk/setup.sh && python3 docs/records/probes/decode_merge.py [--stress 2000]
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention as ta
from tiledattention.kernels.decode._launch import launch, launches, new_partials, partial_shapes
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import copy_rate  # noqa: E402

#: (B, H_q, H_kv, keys)
POINTS = ((1, 32, 8, 4096), (1, 32, 8, 8192), (1, 32, 8, 32768), (2, 16, 4, 24000),
          (4, 28, 4, 6000), (1, 8, 1, 50000))


def plans(p, schedule):
    """The default's launches and the same schedule merging in the split kernel."""
    return launches(p, schedule, None), launches(p, schedule.replace(combine="last"), None)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stress", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    copy_gbps = copy_rate()
    stream = torch.cuda.current_stream()
    gen = torch.Generator(device="cuda").manual_seed(1)
    table = []
    for b, hq, hkv, sk in POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                       head_dim=128, dtype="bf16", causal=False)
        schedule = ta.DECODE.default_schedule("sm_90", p)
        default, merged = plans(p, schedule)
        q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        parts = [new_partials(partial_shapes(plan), q.device) for plan in (default, merged)]
        counters = parts[1][2]
        outs = [torch.empty_like(q) for _ in range(2)]

        def run(which, length):
            kk, vv = k[:, :, :length], v[:, :, :length]
            launch(stream, (default, merged)[which], q, kk, vv, outs[which], 0, parts[which])

        differ, worst = 0, [0.0, 0.0]
        lengths = torch.randint(1, sk + 1, (args.stress,),
                                generator=torch.Generator().manual_seed(b * sk))
        for i, length in enumerate(lengths.tolist()):
            for x in (*parts[0], *parts[1][:2], *outs):
                x.fill_(float("nan"))
            run(0, length)
            run(1, length)
            if not torch.equal(outs[0], outs[1]):
                differ += 1
            if i % 50 == 0:
                kk, vv = k[:, :, :length].float(), v[:, :, :length].float()
                ref = F.scaled_dot_product_attention(q.float(), kk, vv,
                                                     enable_gqa=hq != hkv)
                for j in range(2):
                    err = ((outs[j].float() - ref).norm() / ref.norm()).item()
                    worst[j] = max(worst[j], err if err == err else float("inf"))
        torch.cuda.synchronize()
        left = int(counters.abs().sum())

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)

        fns = {"default": lambda: run(0, sk), "merged": lambda: run(1, sk), "cudnn": cudnn}
        times = {name: t.median_ms * 1e3 for name, t in
                 time_interleaved(fns, rounds=args.rounds).items()}
        loop = {name: t.median_ms * 1e3 for name, t in
                time_interleaved(fns, rounds=args.rounds, flush_l2=False, loop=True).items()}
        kv_bytes = 2 * b * hkv * sk * 128 * 2
        name = f"B{b} H{hq}/{hkv} {sk} keys"
        line = (f"{name}: splits {schedule.splits}, {args.stress} launches, {differ} differ, "
                f"worst rel. L2 default {worst[0]:.2e} merged {worst[1]:.2e}, counters left "
                f"{left}; µs default {times['default']:.1f} merged {times['merged']:.1f} "
                f"cuDNN {times['cudnn']:.1f}; loop (host counted) µs default "
                f"{loop['default']:.1f} merged {loop['merged']:.1f} cuDNN {loop['cudnn']:.1f}")
        print(line, flush=True)
        table.append((name, schedule.splits, differ, worst, left, times,
                      kv_bytes / 1e3 / copy_gbps, loop))
    print("\n| call | splits | launches differing | worst err default / merged | µs default | "
          "µs merged | merged ÷ default (speed) | cuDNN µs | % of copy default / merged | "
          "loop µs default / merged / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, splits, differ, worst, left, t, copy_us, loop in table:
        print(f"| {name} | {splits} | {differ} of {args.stress} (counters left {left}) | "
              f"{worst[0]:.1e} / {worst[1]:.1e} | {t['default']:.1f} | {t['merged']:.1f} | "
              f"{t['default'] / t['merged']:.3f} | {t['cudnn']:.1f} | "
              f"{100 * copy_us / t['default']:.1f} / {100 * copy_us / t['merged']:.1f} | "
              f"{loop['default']:.1f} / {loop['merged']:.1f} / {loop['cudnn']:.1f} |")


if __name__ == "__main__":
    main()
