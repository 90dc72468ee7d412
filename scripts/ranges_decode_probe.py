"""A padded batch's generation step through ``sdpa(..., ranges=)`` against plain decode over the
full cache (GPU): B 4, H 32/8, D 128, bf16, one query row, caches of S, S/2, 7 and S - 100
valid keys (left padding), S in 1k and 32k; interleaved timing, median of 20.

    python scripts/ranges_decode_probe.py
"""

from __future__ import annotations

import torch

import tiledattention
from tuner.measure import time_interleaved


def main() -> None:
    b, h, hkv, d = 4, 32, 8, 128
    for s in (1024, 32768):
        q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        ranges = torch.tensor([[0] * b, [1] * b, [0, s // 2, s - 7, 100], [s] * b],
                              device="cuda", dtype=torch.int32)
        times = time_interleaved({
            "ranges": lambda: tiledattention.sdpa(q, k, k, "bottom_right", ranges=ranges),
            "plain full cache": lambda: tiledattention.sdpa(q, k, k)}, rounds=20)
        print(f"S_k {s}: " + ", ".join(f"{name} {t.median_ms * 1e3:.1f} us"
                                        for name, t in times.items()))


if __name__ == "__main__":
    main()
