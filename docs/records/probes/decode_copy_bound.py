"""What a B1 decode call's bytes cost the device on their own (issue 49: "B1 decode over 32k keys
at least 85% of the copy rate; over 8k keys at least 60%", the rate a 1 GiB copy reaches): the
default decode call and cuDNN's beside a device copy of exactly the call's K/V bytes and a
read-only pass over them (a float32 sum), interleaved, the L2 flushed before each sample, GPU
time. Each line's share is of the 1 GiB copy rate measured in the same run: the decode calls'
on the K/V bytes read once, the copy's on its bytes read + written, the sum's on its bytes read.
A copy of the same bytes is what a call that only streams them could at best do.

    source .devtk/setup.sh && python3 docs/records/probes/decode_copy_bound.py [--rounds 20]
"""

import argparse
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import copy_rate  # noqa: E402

#: (B, H_q, H_kv, keys, D): the issue's B1 caches and two more
POINTS = ((1, 32, 8, 4096, 128), (1, 32, 8, 8192, 128), (1, 32, 8, 16384, 128),
          (1, 32, 8, 32768, 128), (1, 8, 1, 65536, 128), (1, 64, 8, 12000, 128))


def main():
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    copy_gbps = copy_rate()
    print("| call | K/V MB | default µs | % of copy | cuDNN µs | copy of the bytes µs | "
          "its % of copy | sum of the bytes µs | its % of copy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b, hq, hkv, sk, d in POINTS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                       dtype="bf16", causal=False)
        case = ta.DECODE.case(p, 0)
        kv_bytes = b * hkv * sk * d * 2 * 2
        src = torch.randn(kv_bytes // 2, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        fns = {"default": case.launcher(ta.DECODE.default_schedule("sm_90", p)),
               "torch-cudnn": case.baselines()["torch-cudnn"],
               "copy": lambda: dst.copy_(src),
               "sum": lambda: src.sum(dtype=torch.float32)}
        error = case.error(fns["default"])
        t = {name: timing.median_ms * 1e-3 for name, timing
             in time_interleaved(fns, rounds=args.rounds).items()}

        def share(nbytes, seconds):
            return 100 * nbytes / seconds / 1e9 / copy_gbps

        print(f"| {p.describe()} (err {error:.1e}) | {kv_bytes / 1e6:.1f} | "
              f"{t['default'] * 1e6:.1f} | {share(kv_bytes, t['default']):.1f} | "
              f"{t['torch-cudnn'] * 1e6:.1f} | {t['copy'] * 1e6:.1f} | "
              f"{share(2 * kv_bytes, t['copy']):.1f} | {t['sum'] * 1e6:.1f} | "
              f"{share(kv_bytes, t['sum']):.1f} |")


if __name__ == "__main__":
    main()
