"""Probe (issue 47): the one-pass backward's delta kernel (row sums of dO * O; zeros into the
float32 dQ accumulator) against what its bytes should cost. On an H200 it took 170 µs at B2 H32
S4096 D128 (268 MB: 1.6 TB/s); FlashAttention-4's preprocess of the call, 70 µs. Hypothesis:
too few bytes in flight; a higher occupancy hint or wider row tiles fix it. Each variant timed
interleaved (CUDA events around back-to-back launches, median of rounds) beside a device copy
of the same bytes and torch's fill of the accumulator; the dQ-scale and partials' sum kernels
at 64 and 128 rows too (their own bytes: read the µs, not the TB/s column).

    source .devtk/setup.sh && python3 docs/records/probes/delta_kernel.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

SHAPES = [(2, 32, 4096, 128), (16, 12, 512, 64), (1, 16, 5000, 256)]
VARIANTS = [(64, 1), (64, 2), (64, 4), (128, 1), (128, 2), (32, 4), (32, 8)]  # (TILE, occupancy)


def main() -> int:
    import cuda.tile as ct
    import torch

    from tiledattention.kernels.backward import _kernel as kernels

    rounds = 15
    for b, h, s, d in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        out, grad_out = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                                     generator=gen) for _ in range(2))
        delta = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        accum = torch.empty(b, h, s, d, device="cuda", dtype=torch.float32)
        moved = 2 * out.nbytes + accum.nbytes + delta.nbytes
        src = torch.empty(moved // 2, device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        stream = torch.cuda.current_stream()
        runs = {"copy of the bytes": lambda: dst.copy_(src), "accum.zero_()": accum.zero_}
        for tile, occ in VARIANTS:
            kernel = kernels.attention_bwd_delta.replace_hints(occupancy=occ)
            grid = ((s + tile - 1) // tile, b * h, 1)

            def run(kernel=kernel, grid=grid, tile=tile):
                ct.launch(stream, grid, kernel, (out, grad_out, delta, accum, tile, d))

            runs[f"delta TILE {tile} occ {occ}"] = run
        dq = torch.empty_like(out)
        parts = torch.randn(2 * b, h, s, d, device="cuda", generator=gen)
        for tile in (64, 128):
            grid = ((s + tile - 1) // tile, b * h, 1)

            def scale(grid=grid, tile=tile):
                ct.launch(stream, grid, kernels.attention_bwd_dq_scale, (accum, dq, 0.1, tile, d))

            def add(grid=grid, tile=tile):
                ct.launch(stream, grid, kernels.attention_bwd_sum, (parts, dq, 2, tile, d))

            runs[f"dq_scale TILE {tile}"] = scale
            runs[f"sum of 2 TILE {tile}"] = add
        want = (out.float() * grad_out.float()).sum(-1)
        samples = {name: [] for name in runs}
        for name, fn in runs.items():
            fn()
        torch.cuda.synchronize()
        for _ in range(rounds):
            for name, fn in runs.items():
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                for _ in range(10):
                    fn()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end) / 10 * 1e3)
        err = ((delta - want).norm() / want.norm()).item()
        zeros = bool((accum == 0).all())
        print(f"\nB{b} H{h} S{s} D{d}: {moved / 1e6:.0f} MB moved (the copy: half read, half "
              f"written); last delta rel err {err:.1e}, accumulator zeroed {zeros}")
        for name in sorted(samples, key=lambda n: statistics.median(samples[n])):
            us = statistics.median(samples[name])
            print(f"  {name:<24} {us:8.1f} µs  {moved / us / 1e6:6.2f} TB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
