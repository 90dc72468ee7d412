"""On a fresh checkout: does sdpa pick the shipped table's rows, and run at their speed?

    python scripts/shipped_check.py

For a few shapes: what ``tiledattention.explain`` answers (with no user database), then the
looked-up schedule, the default schedule and torch SDPA (cuDNN pinned) timed interleaved in one
run. Also the machine's two floors: a bf16 matrix product's rate and a device-to-device copy's
bandwidth.
"""

from __future__ import annotations

import tempfile

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention
from tiledattention import FORWARD, problem_from_arrays
from tuner.measure import time_cuda, time_interleaved

SHAPES = [(4, 16, 4096, 128, True), (4, 16, 4096, 128, False), (4, 8, 4096, 256, False),
          (1, 8, 16384, 256, True), (2, 32, 8192, 64, True), (8, 16, 2048, 128, False)]


def floors() -> str:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    t = time_cuda(lambda: a @ b, flush_l2=False)
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    c = time_cuda(lambda: dst.copy_(src), flush_l2=False)
    return (f"bf16 matmul 8192^3: {2 * 8192 ** 3 / (t.median_ms * 1e-3) / 1e12:.0f} TFLOP/s; "
            f"device copy 2 GiB: {2 * src.numel() / (c.median_ms * 1e-3) / 1e9:.0f} GB/s "
            f"(read + write)")


def main() -> None:
    tiledattention.use_database(tempfile.mkdtemp() + "/none.sqlite")  # no user database
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    print(f"device: {torch.cuda.get_device_name()} ({arch}); {floors()}")
    print("| shape | lookup | schedule | looked-up TFLOP/s | default TFLOP/s | cuDNN TFLOP/s | "
          "looked-up / default | looked-up / cuDNN |")
    print("|---|---|---|---|---|---|---|---|")
    for b, h, s, d, causal in SHAPES:
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        problem, _ = problem_from_arrays(q, k, v, causal, None)
        found = tiledattention.explain(q, k, v, causal=causal)
        default = FORWARD.default_schedule(arch, problem)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        t = time_interleaved({
            "looked-up": lambda: tiledattention.sdpa(q, k, v, causal=causal),
            "default": lambda: tiledattention.sdpa(q, k, v, causal=causal, schedule=default),
            "cudnn": cudnn}, rounds=25)
        tf = {n: problem.flops / (x.median_ms * 1e-3) / 1e12 for n, x in t.items()}
        print(f"| {problem.describe()} | {found.source}: {found.detail} | "
              f"{found.schedule.describe()} | {tf['looked-up']:.0f} | {tf['default']:.0f} | "
              f"{tf['cudnn']:.0f} | {tf['looked-up'] / tf['default']:.2f} | "
              f"{tf['looked-up'] / tf['cudnn']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
