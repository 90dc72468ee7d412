"""Does a sample's time include the host's launch time? (probe 12)

    python scripts/launch_gap.py [--shape B,H,S,D,yes|no]... [--rounds N]

For each shape and contender (tiledattention's looked-up schedule, torch SDPA with cuDNN and
with flash) this prints the host time of one call (the mean of 200 calls enqueued behind a
busy GPU) and the median kernel time twice, interleaved as
``tuner.measure.time_interleaved`` does: once synchronising after every sample (the GPU is idle
when each sample's L2 flush is enqueued, so a launch path slower than the flush shows up as a
gap inside the sample) and once with all rounds enqueued before one synchronisation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention
from speed_table import parse_shape  # scripts/ is on sys.path when run as a script
from tuner.measure import time_interleaved
from tuner.measure._timing import _Sampler

SHAPES = ["16,16,1024,128,yes", "16,16,1024,128,no", "16,8,1024,256,yes", "16,32,1024,64,no",
          "4,16,4096,128,no"]


def _contenders(q, k, v, causal: bool) -> dict:
    schedule = tiledattention.explain(q, k, v, causal).schedule

    def torch_sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run
    return {"tiledattention": lambda: tiledattention.sdpa(q, k, v, causal, schedule=schedule),
            "torch-cudnn": torch_sdpa(SDPBackend.CUDNN_ATTENTION),
            "torch-flash": torch_sdpa(SDPBackend.FLASH_ATTENTION)}


def host_us(fn, calls: int = 200) -> float:
    """Mean host time of one call while the GPU works through a long queue."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU spinning: the calls below never wait
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def synced_interleaved(fns: dict, rounds: int) -> dict[str, float]:
    """The previous time_interleaved: one synchronisation after every sample."""
    sampler = _Sampler(flush_l2=True)
    samples = {name: [] for name in fns}
    names = list(fns)
    for name in names:
        sampler.batch(fns[name], 3)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name] += sampler.batch(fns[name], 1)
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", type=parse_shape, action="append", default=[])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    shapes = args.shape or [parse_shape(s) for s in SHAPES]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    print("| shape | contender | host us/call | synced ms | queued ms | synced / queued |")
    print("|---|---|---|---|---|---|")
    for b, h, s, d, causal in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(3))
        fns = _contenders(q, k, v, causal)
        host = {name: host_us(fn) for name, fn in fns.items()}
        synced = synced_interleaved(fns, args.rounds)
        queued = {name: timing.median_ms
                  for name, timing in time_interleaved(fns, rounds=args.rounds).items()}
        label = f"B{b} H{h} S{s} D{d} {'causal' if causal else 'full'}"
        for name in fns:
            print(f"| {label} | {name} | {host[name]:.0f} | {synced[name]:.3f} | "
                  f"{queued[name]:.3f} | {synced[name] / queued[name]:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
