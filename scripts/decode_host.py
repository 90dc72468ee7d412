"""Eager per-call cost of a warm multi-split decode call: the kept scratch buffers against fresh
ones per call (what ``sdpa`` did before it kept them) and torch's SDPA, interleaved.

    python scripts/decode_host.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import tiledattention as ta
import tiledattention._sdpa as sdpa_module
from overhead import interleaved  # scripts/overhead.py, beside this script


def main() -> None:
    kept = sdpa_module._decode_partials

    def fresh(runtime, shapes, q, device, stream):
        return sdpa_module._new_partials(shapes, q.device)

    print(torch.cuda.get_device_name(), torch.__version__)
    for b, sk in ((1, 4096), (1, 32768), (8, 8192)):
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, 8, sk, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)

        def call(partials):
            sdpa_module._decode_partials = partials
            return ta.sdpa(q, k, v)

        times = interleaved({
            "fresh buffers": lambda: call(fresh), "kept buffers": lambda: call(kept),
            "torch SDPA": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)},
            calls=1000, repeats=7)
        sdpa_module._decode_partials = kept
        print(f"B{b} H32/8 S_k {sk} D128 bf16 ({ta.explain(q, k, v).schedule.describe()}): "
              + ", ".join(f"{name} {us:.1f} µs" for name, us in times.items()))


if __name__ == "__main__":
    main()
