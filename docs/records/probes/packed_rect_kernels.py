"""Where a packed batch's backward loses to the rectangle of its tokens (issue 50): each GPU
kernel's time (torch's profiler, mean of 10 calls) of ``varlen_attn``'s forward and backward on
a batch of ``packed_batches.py`` beside ``sdpa`` on the rectangle (the same tokens as
sequences of the mean length), kernels by name (``backward_onepass_timing.kernel_times``).

    source .devtk/setup.sh && python3 docs/records/probes/packed_rect_kernels.py [--only a,b]

``--ncu``: one backward of each (the packed call, then the rectangle's), after a warm-up,
inside ``cudaProfilerStart``/``Stop``, for Nsight Compute to profile only those kernels:

    source .devtk/setup.sh && ncu --profile-from-start off -k regex:attention_bwd_d \\
        --section SpeedOfLight --section WarpStateStats --section LaunchStats \\
        --section Occupancy --section SchedulerStats \\
        python3 docs/records/probes/packed_rect_kernels.py --ncu --only encoder
"""

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts"))
from backward_onepass_timing import kernel_times  # noqa: E402
from packed_batches import batches, contenders  # noqa: E402


def profiled(name, bwd):
    """One backward of ours and one of the rectangle's, each alone in a profiled range."""
    for who in ("tiledattention", "rectangle"):
        bwd[who]()  # the JIT compiles outside the profiled ranges
    torch.cuda.synchronize()
    for who in ("tiledattention", "rectangle"):
        print(f"# profiled: {name} backward, {who}", flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        bwd[who]()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="encoder,encoder-d128,near-equal,pretrain")
    ap.add_argument("--ncu", action="store_true")
    args = ap.parse_args()
    chosen = batches()
    for name in args.only.split(","):
        lengths, hq, hkv, d, causal, dtype = chosen[name]
        fwd, bwd, errs, _ = contenders(lengths, hq, hkv, d, causal, dtype)
        if args.ncu:
            profiled(name, bwd)
            continue
        mean = round(sum(lengths) / len(lengths))
        print(f"# {name}: {len(lengths)} seqs, {sum(lengths)} tokens (rectangle: "
              f"{max(1, round(sum(lengths) / mean))} x {mean}), H {hq}/{hkv} D {d} causal "
              f"{causal} {dtype}", flush=True)
        for phase, fns in (("fwd", fwd), ("bwd", bwd)):
            for who in ("tiledattention", "rectangle"):
                times = kernel_times(fns[who], calls=10)
                print(f"  {phase} {who}: {sum(times.values()):.1f} us in all; " + "; ".join(
                    f"{k} {t:.1f}" for k, t in sorted(times.items(), key=lambda kv: -kv[1])),
                    flush=True)


if __name__ == "__main__":
    main()
