"""Where a packed batch's backward loses to the rectangle of its tokens (issue 50): each GPU
kernel's time (torch's profiler, mean of 10 calls) of ``varlen_attn``'s forward and backward on
a batch of ``packed_batches.py`` beside ``sdpa`` on the rectangle (the same tokens as
sequences of the mean length), kernels by name (``backward_onepass_timing.kernel_times``).

    source .devtk/setup.sh && python3 docs/records/probes/packed_rect_kernels.py [--only a,b]
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts"))
from backward_onepass_timing import kernel_times  # noqa: E402
from packed_batches import batches, contenders  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="encoder,encoder-d128,near-equal,pretrain")
    args = ap.parse_args()
    chosen = batches()
    for name in args.only.split(","):
        lengths, hq, hkv, d, causal, dtype = chosen[name]
        fwd, bwd, errs, _ = contenders(lengths, hq, hkv, d, causal, dtype)
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
