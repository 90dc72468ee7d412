"""GPU timing a kernel engineer can trust: CUDA events, warm-up, L2 flushed, median and spread.

Each sample: read a scratch buffer larger than the L2 (outside the timed region), spin the GPU
for ~0.2 ms while the host enqueues the rest, record a start event, run, record an end event. The flush *reads*: overwriting the buffer would leave the
L2 full of dirty lines whose write-back (50 MB on an H100: ~17 µs of DRAM time) lands inside
the next timed run and inflates every short, memory-bound kernel's time. Samples are collected in batches and read after one
synchronisation, so the host never sits between two launches. Sampling stops once the median's
95% confidence half-width is within ``rel_precision`` of it (or a sample / time cap is hit).
``time_interleaved`` times several contenders round-robin, sample by sample, so drift of clocks
or of a neighbour's load hits all of them alike: use it to decide near-ties.

A :class:`TimingMode` says how a launch is timed, to match how the kernel will be deployed:
``launch="stream"`` (above: each launch enqueued by the host between two events), ``"graph"``
(the launch captured into a ``torch.cuda.CUDAGraph`` and replayed, as in a model served from
CUDA graphs: no host launch path, back-to-back kernels) or ``"host"`` (an isolated call from an
idle GPU with the host's time counted: the GPU drained, then the host clock from the call to
the end of its GPU work, ``torch.cuda.synchronize``; what one call costs a host-bound caller,
which the other two modes leave out) or ``"loop"`` (steady state with the host's time counted:
calls back to back between two events, no flush and no spin ahead of them, so a host slower
than the GPU sets the pace, as in a training or serving loop of eager calls; a warm L2 only),
and ``l2="cold"`` (the flush above before every timed
launch: inputs come from DRAM) or ``"warm"`` (no flush: inputs stay L2-resident from the
previous launch, as when a kernel runs again on the same tensors).

* graph, warm: ``N`` launches captured back to back in one graph; a sample is one replay between
  two events (after the spin), divided by ``N`` (``N`` from the warm-up time: replays of about
  1 ms, at most 64 launches).
* graph, cold: ``N`` pairs (flush, start event, launch, end event) in one graph, the events
  recorded *inside* the graph (event record nodes: ``torch.cuda.Event(external=True)``), so each
  launch is timed on its own and the flush never enters a timed interval. (Subtracting the
  replay time of a flush-only graph from one of flush+launch pairs would also work, but the
  difference of two large, noisy times is far noisier than the launch it estimates (a 256 MB
  flush takes ~80 µs on an H100; a decode launch, 10 µs), and the flush after a launch also
  writes back the launch's dirty output, which the flush-only graph lacks.) A torch without
  in-graph event records is refused (:func:`graph_cold_unsupported`).
"""

from __future__ import annotations

import inspect
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

from ..errors import GraphCaptureError, TunerValueError

__all__ = ["GraphCaptureError", "LAUNCHES", "L2_STATES", "TIE_REL_FLOOR", "Timing", "TimingMode",
           "first_line", "graph_cold_unsupported", "summarize", "tie_noise_ms", "time_cuda",
           "time_interleaved", "within_noise"]

#: The least L2 flush: larger than any current L2 (H100: 50 MB, B200: 126 MB); a device whose
#: L2 is larger than half of it gets twice its L2 (``L2_cache_size``)
_L2_FLUSH_BYTES = 256 * 1024 * 1024
#: GPU cycles of a spin kernel before each sample's start event (~0.2 ms at 2 GHz): the host
#: enqueues the sample meanwhile, so the timed region holds GPU work only.
_HOST_HEAD_START_CYCLES = 400_000
#: graph mode: launches captured per graph, so that a replay takes about this long ...
_GRAPH_REPLAY_MS = 1.0
#: ... and at most this many
_GRAPH_MAX_LAUNCHES = 64

LAUNCHES = ("stream", "graph", "host", "loop")
L2_STATES = ("cold", "warm")
#: the tie rule's floor: medians closer than this share of the faster one are a tie
TIE_REL_FLOOR = 0.01


@dataclass(frozen=True, kw_only=True)
class TimingMode:
    """How a launch is timed: ``launch`` one of :data:`LAUNCHES`, ``l2`` "cold" or "warm"
    (``"loop"`` runs its calls back to back: a warm L2 only)."""

    launch: str = "stream"
    l2: str = "cold"

    def __post_init__(self) -> None:
        if self.launch not in LAUNCHES:
            raise TunerValueError(f"timing launch must be one of {', '.join(LAUNCHES)}; got "
                                  f"{self.launch!r}")
        if self.l2 not in L2_STATES:
            raise TunerValueError(f"timing L2 state must be one of {', '.join(L2_STATES)}; got "
                                  f"{self.l2!r}")
        if self.loop and self.flush_l2:
            raise TunerValueError("loop launches run back to back, each on the L2 the one "
                                  "before left: they take a warm L2 (l2='warm'), not a cold one")

    @property
    def graph(self) -> bool:
        return self.launch == "graph"

    @property
    def host(self) -> bool:
        return self.launch == "host"

    @property
    def loop(self) -> bool:
        return self.launch == "loop"

    @property
    def flush_l2(self) -> bool:
        return self.l2 == "cold"

    def timing_kwargs(self) -> dict[str, bool]:
        """The keywords of :func:`time_cuda` and :func:`time_interleaved` for this mode."""
        return {"graph": self.graph, "flush_l2": self.flush_l2, "host": self.host,
                "loop": self.loop}

    def to_dict(self) -> dict[str, str]:
        return {"launch": self.launch, "l2": self.l2}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TimingMode":
        if not isinstance(data, Mapping) or set(data) - {"launch", "l2"}:
            raise TunerValueError(f"a timing mode is a mapping of 'launch' and 'l2'; got "
                                  f"{data!r}")
        return cls(**data)

    def describe(self) -> str:
        """E.g. ``stream launches, cold L2``: what the command-line flags say."""
        if self.host:
            return f"isolated calls with host time, {self.l2} L2"
        if self.loop:
            return "back-to-back calls with host time, warm L2"
        return f"{self.launch} launches, {self.l2} L2"


def graph_cold_unsupported() -> str | None:
    """Why this torch cannot time graph launches with a cold L2 (the reason), or ``None``.
    Needs no GPU: it reads ``torch.cuda.Event``'s signature."""
    import torch

    try:
        params = inspect.signature(torch.cuda.Event.__new__).parameters
    except (TypeError, ValueError):  # a signature Python cannot read: try at run time
        return None
    if "external" in params:
        return None
    return (f"torch {torch.__version__} cannot record timing events inside a CUDA graph "
            "(torch.cuda.Event(external=True) is newer)")


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
        raise TunerValueError("summarize needs at least one sample")
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


def tie_noise_ms(a: Timing, b: Timing) -> float:
    """95% half-width of the difference of two medians, from what each timing recorded: its
    interquartile range and sample count (sigma ~ IQR / 1.349; the standard error of a median
    ~ 1.2533 sigma / sqrt(n), as for a normal distribution; the IQR keeps outliers out)."""
    def stderr(t: Timing) -> float:
        return 1.2533 * (t.spread_ms / 1.349) / math.sqrt(max(1, t.samples))

    return 1.96 * math.hypot(stderr(a), stderr(b))


def within_noise(best: Timing, other: Timing, *, rel_floor: float = TIE_REL_FLOOR) -> bool:
    """Whether ``other`` is as fast as ``best`` within the measured noise: its median exceeds
    ``best``'s by at most ``max(rel_floor * best.median_ms, tie_noise_ms(best, other))``. The
    floor covers what one run's samples cannot show (clocks and placement of another run)."""
    allowed = max(rel_floor * best.median_ms, tie_noise_ms(best, other))
    return other.median_ms - best.median_ms <= allowed


def _flush_bytes(torch) -> int:
    """At least twice the device's L2 (``L2_cache_size``), and never less than 256 MiB (also
    what a torch that does not say gets)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 0) or 0
    return max(_L2_FLUSH_BYTES, 2 * int(l2))


class _Sampler:
    def __init__(self, flush_l2: bool) -> None:
        import torch

        self._torch = torch
        self._scratch = (torch.zeros(_flush_bytes(torch) // 4, dtype=torch.int32, device="cuda")
                         if flush_l2 else None)
        self._sleep = getattr(torch.cuda, "_sleep", None)  # a spin kernel; private but long-lived

    def flush(self) -> None:
        """Evict the L2 by reading the scratch buffer (clean lines: nothing to write back)."""
        if self._scratch is not None:
            self._scratch.max()

    def head_start(self) -> None:
        if self._sleep is not None:
            # keep the GPU busy while the host enqueues the run: a contender whose launch path
            # takes longer than the flush (torch's SDPA backend switch, say) would otherwise
            # leave the GPU idle after the start event and be charged its host time
            self._sleep(_HOST_HEAD_START_CYCLES)

    def enqueue(self, fn: Callable[[], object]) -> tuple[object, object]:
        """Flush L2, then ``fn`` between two events; nothing waits for the GPU."""
        torch = self._torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.flush()
        self.head_start()
        start.record()
        fn()
        end.record()
        return start, end

    def batch(self, fn: Callable[[], object], count: int) -> list[float]:
        events = [self.enqueue(fn) for _ in range(count)]
        self._torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    def loop(self, fn: Callable[[], object], count: int, calls: int) -> list[float]:
        """``count`` samples of ``calls`` calls back to back between two events (ms a call),
        neither flush nor spin ahead of them, the samples one after another and one
        synchronisation at the end: the GPU's pace, or the host's where it is slower (module
        docstring: loop)."""
        torch = self._torch
        events = []
        for _ in range(count):
            start, end = (torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / calls for start, end in events]

    def isolated(self, fn: Callable[[], object], count: int) -> list[float]:
        """``count`` samples of one call from an idle GPU, host time counted: flush, drain the
        GPU, then the host clock (ms) from the call until its GPU work has finished."""
        synchronize, clock = self._torch.cuda.synchronize, time.perf_counter
        samples = []
        for _ in range(count):
            self.flush()
            synchronize()
            start = clock()
            fn()
            synchronize()
            samples.append((clock() - start) * 1e3)
        return samples


def first_line(exc: BaseException, limit: int = 500) -> str:
    """``Type: first line of the message``, at most ``limit`` characters."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:limit]


class _Graph:
    """``fn`` captured ``launches`` times into one CUDA graph (module docstring: graph, warm and
    graph, cold); :meth:`take` replays it and answers per-launch times in ms."""

    def __init__(self, sampler: _Sampler, fn: Callable[[], object], launches: int,
                 cold: bool) -> None:
        import torch

        self._torch = torch
        self._sampler = sampler
        self.launches = launches
        self.cold = cold
        try:
            # torch's recipe: a launch outside the capture, on a side stream, first (lazy
            # initialisation, e.g. a library handle or a JIT compile, must not be captured)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            self._events = ([(torch.cuda.Event(enable_timing=True, external=True),
                              torch.cuda.Event(enable_timing=True, external=True))
                             for _ in range(launches)] if cold else [])
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):  # captures on a side stream of its own
                for i in range(launches):
                    if cold:
                        sampler.flush()
                        self._events[i][0].record()
                    fn()
                    if cold:
                        self._events[i][1].record()
            self.graph.replay()  # the first replay uploads the graph: not a sample
            torch.cuda.synchronize()
        except Exception as exc:  # a launch path that cannot be captured (or replayed)
            raise GraphCaptureError(
                f"cannot time in a CUDA graph: {first_line(exc, 300)}") from exc

    def take(self, replays: int) -> list[float]:
        """Per-launch times of ``replays`` replays: one sample per replay (graph, warm: the
        replay between two events outside the graph, over ``launches``), or ``launches``
        samples per replay (graph, cold: the events inside the graph, read after each replay,
        as the next replay records them again)."""
        torch = self._torch
        if self.cold:
            samples: list[float] = []
            for _ in range(replays):
                self.graph.replay()
                torch.cuda.synchronize()
                samples += [start.elapsed_time(end) for start, end in self._events]
            return samples
        events = []
        for _ in range(replays):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            self._sampler.head_start()  # the host's graph launch is not charged
            start.record()
            self.graph.replay()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / self.launches for start, end in events]


def _launches(single_ms: float) -> int:
    """Launches per graph so that a replay takes about ``_GRAPH_REPLAY_MS`` (and calls per
    loop sample, which takes as long where the GPU sets the pace)."""
    if not single_ms > 0:
        return _GRAPH_MAX_LAUNCHES
    return max(1, min(_GRAPH_MAX_LAUNCHES, math.ceil(_GRAPH_REPLAY_MS / single_ms)))


def _check_mode(graph: bool, flush_l2: bool, host: bool = False, loop: bool = False) -> None:
    """Refuse a timing mode that cannot be: two of graph, host and loop launches together, loop
    launches with a cold L2, or graph launches with a cold L2 on a torch without in-graph event
    records."""
    if graph + host + loop > 1:
        raise TunerValueError("a launch is timed from a graph, as an isolated call with host "
                              "time or in a loop of calls, not two of them")
    if loop and flush_l2:
        raise TunerValueError("loop launches run back to back: they take a warm L2 "
                              "(flush_l2=False)")
    if graph and flush_l2:
        why = graph_cold_unsupported()
        if why is not None:
            raise GraphCaptureError(f"graph timing with a cold L2: {why}")


def time_cuda(fn: Callable[[], object], *, warmup_ms: float = 30.0, min_samples: int = 10,
              max_samples: int = 200, max_seconds: float = 2.0, rel_precision: float = 0.01,
              flush_l2: bool = True, graph: bool = False, host: bool = False,
              loop: bool = False) -> Timing:
    """Time ``fn`` (which enqueues GPU work on torch's current stream). ``flush_l2``: a cold
    L2 before every launch; ``graph``: launches replayed from a CUDA graph (module docstring;
    :class:`GraphCaptureError` when ``fn`` cannot be captured); ``host``: isolated calls with
    the host's time counted; ``loop``: calls back to back with the host's time counted (a
    sample of about a millisecond of GPU time, per call)."""
    import torch

    _check_mode(graph, flush_l2, host, loop)
    sampler = _Sampler(flush_l2)
    fn()
    torch.cuda.synchronize()
    deadline = time.perf_counter() + warmup_ms / 1000
    warm: list[float] = []
    while time.perf_counter() < deadline:
        warm += sampler.batch(fn, 2)
    if graph:
        single = statistics.median(warm or sampler.batch(fn, 3))
        captured = _Graph(sampler, fn, _launches(single), cold=flush_l2)
        take = captured.take
        per_take = captured.launches if flush_l2 else 1  # samples one replay gives
    elif host:
        take = lambda count: sampler.isolated(fn, count)  # noqa: E731
        per_take = 1
    elif loop:
        calls = _launches(statistics.median(warm or sampler.batch(fn, 3)))
        take = lambda count: sampler.loop(fn, count, calls)  # noqa: E731
        per_take = 1
    else:
        take = lambda count: sampler.batch(fn, count)  # noqa: E731
        per_take = 1
    samples: list[float] = []
    stop_at = time.perf_counter() + max_seconds
    batch = min_samples
    while True:
        samples += take(max(1, math.ceil(batch / per_take)))
        if len(samples) >= max_samples or time.perf_counter() > stop_at:
            break
        median = statistics.median(samples)
        if _median_halfwidth(samples) <= rel_precision * median:
            break
        batch = min(len(samples), max_samples - len(samples))
    return summarize(samples)


def round_order(names: list[str], r: int) -> list[str]:
    """The contenders' order in round ``r``: a shuffle seeded by the round, so that no
    contender always follows the same one (an isolated call that always came after a device
    copy of 134 MB read 7% slower than the same call after itself on an H200,
    ``docs/records/probes/isolated_aa.py``), and every run orders its rounds alike."""
    order = list(names)
    random.Random(r).shuffle(order)
    return order


def time_interleaved(fns: Mapping[str, Callable[[], object]], *, rounds: int = 30,
                     flush_l2: bool = True, graph: bool = False, host: bool = False,
                     loop: bool = False) -> dict[str, Timing | str]:
    """Time every contender once per round, in an order shuffled per round
    (:func:`round_order`); median per contender.

    All rounds are enqueued before the one synchronisation, so the host runs ahead of the GPU
    and a sample does not include the host's time to launch it (synchronising after each
    sample would charge a contender whose launch path is slower than the L2 flush before it).

    With ``graph`` each contender is captured into a graph of its own (module docstring) and a
    round replays each graph once, synchronising after each replay (the host's launch is never
    timed in graph mode: in-graph events, or a spin ahead of the replay), until every contender
    has ``rounds`` samples. A contender that cannot be captured maps to the reason, a string.

    With ``host`` each sample is an isolated call with the host's time counted (module
    docstring), the contenders in each round's order; with ``loop`` a sample is
    about a millisecond (of GPU time) of calls back to back, host time counted, per call.
    """
    import torch

    _check_mode(graph, flush_l2, host, loop)
    sampler = _Sampler(flush_l2)
    names = list(fns)
    warm = {name: sampler.batch(fns[name], 3) for name in names}  # warm-up
    if graph:
        return _interleaved_graphs(sampler, fns, warm, rounds, flush_l2)
    if host or loop:
        if loop:
            calls = {name: _launches(statistics.median(warm[name])) for name in names}
            take = lambda name: sampler.loop(fns[name], 1, calls[name])  # noqa: E731
        else:
            take = lambda name: sampler.isolated(fns[name], 1)  # noqa: E731
        samples: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in round_order(names, r):
                samples[name] += take(name)
        return {name: summarize(samples[name]) for name in names}
    events: dict[str, list] = {name: [] for name in names}
    for r in range(rounds):
        for name in round_order(names, r):
            events[name].append(sampler.enqueue(fns[name]))
    torch.cuda.synchronize()
    return {name: summarize([start.elapsed_time(end) for start, end in pairs])
            for name, pairs in events.items()}


def _interleaved_graphs(sampler: _Sampler, fns: Mapping[str, Callable[[], object]],
                        warm: Mapping[str, list[float]], rounds: int,
                        cold: bool) -> dict[str, Timing | str]:
    result: dict[str, Timing | str] = {}
    graphs: dict[str, _Graph] = {}
    for name, fn in fns.items():
        try:
            graphs[name] = _Graph(sampler, fn, _launches(statistics.median(warm[name])), cold)
        except GraphCaptureError as exc:
            result[name] = str(exc)
    names = list(graphs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    r = 0
    while names and min(len(v) for v in samples.values()) < rounds:
        for name in round_order(names, r):
            if len(samples[name]) < rounds:
                samples[name] += graphs[name].take(1)
        r += 1
    result.update({name: summarize(samples[name]) for name in names})
    return {name: result[name] for name in fns}  # the contenders' order
