"""GPU timing a kernel engineer can trust: CUDA events, warm-up, L2 flushed, median and spread.

Each sample: read a scratch buffer larger than the L2 (outside the timed region), spin the GPU
for ~0.2 ms while the host enqueues the rest, record a start event, run, record an end event. The flush *reads*: overwriting the buffer would leave the
L2 full of dirty lines whose write-back (50 MB on an H100: ~17 µs of DRAM time) lands inside
the next timed run and inflates every short, memory-bound kernel's time. Samples are collected in batches and read after one
synchronisation, so the host never sits between two launches. Sampling stops once the median's
95% confidence half-width is within ``rel_precision`` of it (or a sample / time cap is hit).
``time_interleaved`` times several contenders round-robin, sample by sample, so drift of clocks
or of a neighbour's load hits all of them alike: use it to decide near-ties.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

__all__ = ["Timing", "summarize", "time_cuda", "time_interleaved"]

_L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current L2 (H100: 50 MB, B200: 126 MB)
#: GPU cycles of a spin kernel before each sample's start event (~0.2 ms at 2 GHz): the host
#: enqueues the sample meanwhile, so the timed region holds GPU work only.
_HOST_HEAD_START_CYCLES = 400_000


@dataclass(frozen=True)
class Timing:
    median_ms: float
    spread_ms: float  # interquartile range
    mean_ms: float
    min_ms: float
    samples: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(samples_ms: list[float]) -> Timing:
    if not samples_ms:
        raise ValueError("summarize needs at least one sample")
    ordered = sorted(samples_ms)
    if len(ordered) >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4)
    else:
        q1 = q3 = ordered[len(ordered) // 2]
    return Timing(median_ms=statistics.median(ordered), spread_ms=q3 - q1,
                  mean_ms=statistics.fmean(ordered), min_ms=ordered[0], samples=len(ordered))


def _median_halfwidth(samples: list[float]) -> float:
    """95% half-width of the median, from the order statistics' binomial bounds."""
    n = len(samples)
    ordered = sorted(samples)
    k = max(0, int(n / 2 - 1.96 * math.sqrt(n) / 2))
    return (ordered[min(n - 1, n - 1 - k)] - ordered[k]) / 2


class _Sampler:
    def __init__(self, flush_l2: bool) -> None:
        import torch

        self._torch = torch
        self._scratch = (torch.zeros(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
                         if flush_l2 else None)
        self._sleep = getattr(torch.cuda, "_sleep", None)  # a spin kernel; private but long-lived

    def enqueue(self, fn: Callable[[], object]) -> tuple[object, object]:
        """Flush L2, then ``fn`` between two events; nothing waits for the GPU."""
        torch = self._torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if self._scratch is not None:
            self._scratch.max()  # reads 256 MB: evicts with clean lines
        if self._sleep is not None:
            # keep the GPU busy while the host enqueues the run: a contender whose launch path
            # takes longer than the flush (torch's SDPA backend switch, say) would otherwise
            # leave the GPU idle after the start event and be charged its host time
            self._sleep(_HOST_HEAD_START_CYCLES)
        start.record()
        fn()
        end.record()
        return start, end

    def batch(self, fn: Callable[[], object], count: int) -> list[float]:
        events = [self.enqueue(fn) for _ in range(count)]
        self._torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]


def time_cuda(fn: Callable[[], object], *, warmup_ms: float = 30.0, min_samples: int = 10,
              max_samples: int = 200, max_seconds: float = 2.0, rel_precision: float = 0.01,
              flush_l2: bool = True) -> Timing:
    """Time ``fn`` (which enqueues GPU work on torch's current stream)."""
    import torch

    sampler = _Sampler(flush_l2)
    fn()
    torch.cuda.synchronize()
    deadline = time.perf_counter() + warmup_ms / 1000
    while time.perf_counter() < deadline:
        sampler.batch(fn, 2)
    samples: list[float] = []
    stop_at = time.perf_counter() + max_seconds
    batch = min_samples
    while True:
        samples += sampler.batch(fn, batch)
        if len(samples) >= max_samples or time.perf_counter() > stop_at:
            break
        median = statistics.median(samples)
        if _median_halfwidth(samples) <= rel_precision * median:
            break
        batch = min(len(samples), max_samples - len(samples))
    return summarize(samples)


def time_interleaved(fns: Mapping[str, Callable[[], object]], *, rounds: int = 30,
                     flush_l2: bool = True) -> dict[str, Timing]:
    """Time every contender once per round, in rotating order; median per contender.

    All rounds are enqueued before the one synchronisation, so the host runs ahead of the GPU
    and a sample does not include the host's time to launch it (synchronising after each
    sample would charge a contender whose launch path is slower than the L2 flush before it).
    """
    import torch

    sampler = _Sampler(flush_l2)
    names = list(fns)
    for name in names:  # warm-up
        sampler.batch(fns[name], 3)
    events: dict[str, list] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            events[name].append(sampler.enqueue(fns[name]))
    torch.cuda.synchronize()
    return {name: summarize([start.elapsed_time(end) for start, end in pairs])
            for name, pairs in events.items()}
