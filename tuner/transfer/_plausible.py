"""Whether an imported row's numbers are physically possible: the one table of what the fastest
GPU of each architecture can do, and the checks ``tiledtune import`` makes of a row with it.

A call cannot take less time than its floating-point work at the device's peak matrix rate, nor
(when its data cannot sit in the L2 cache) than its bytes at the device's copy rate. A row whose
time beats either bound was not measured (a typo, a unit slip, a hand-edited or hostile file),
and the better-wins rule of the merge would let it replace every real row of its key. The
bounds are generous on purpose: twice the datasheet figures of the *fastest* part of the row's
architecture (whatever its ``device_name`` says), so no real measurement comes near them.

Also refused: a ``created_at`` more than :data:`CLOCK_SKEW` in the future (a row from a year
9999 would outlive every later measurement wherever the newest row is preferred).

Only rows measured on a GPU (``backend`` ``gpu``) are held to the physical bounds: simulated
rows carry an analytic model's numbers, which the runtime never uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from db import ScheduleRow

__all__ = ["Peak", "PEAKS", "MARGIN", "CLOCK_SKEW", "BEYOND_L2_BYTES", "implausible"]


@dataclass(frozen=True)
class Peak:
    """The datasheet rates of an architecture's fastest part: dense bf16/fp16 tensor-core
    TFLOP/s (fp32 accumulation) and DRAM bandwidth in GB/s."""

    part: str
    tflops: float
    gbps: float


#: The fastest part of each architecture tileiras knows (``tiledattention.ARCHITECTURES``): the
#: vendors' dense (not sparse) datasheet figures, rounded up, written down from their product
#: pages, not measured by us; :data:`MARGIN` absorbs an error in them. sm_88 has no published part:
#: sm_86's figures.
PEAKS: dict[str, Peak] = {
    "sm_80": Peak("A100 SXM 80GB", 312, 2039),
    "sm_86": Peak("RTX A6000 / RTX 3090 Ti", 160, 1008),
    "sm_87": Peak("Jetson AGX Orin 64GB", 70, 205),
    "sm_88": Peak("(as sm_86)", 160, 1008),
    "sm_89": Peak("L40S / RTX 6000 Ada / RTX 4090", 366, 1008),
    "sm_90": Peak("H100 SXM / H200 / GH200", 989, 4900),
    "sm_100": Peak("B200 / GB200", 2500, 8000),
    "sm_103": Peak("B300 / GB300", 2500, 8000),
    "sm_110": Peak("Jetson Thor", 260, 273),
    "sm_120": Peak("RTX PRO 6000 Blackwell / RTX 5090", 504, 1792),
    "sm_121": Peak("DGX Spark (GB10)", 125, 273),
}
#: How far beyond a peak a row's implied rate must be to be refused.
MARGIN = 2.0
#: A problem moving more bytes than this cannot be served from any GPU's L2 (B200's holds
#: 126 MB), so its time is bounded by the copy rate; smaller ones may be timed with a warm L2.
BEYOND_L2_BYTES = 256 * 2**20
#: How far in the future a row's ``created_at`` may lie (clocks of two machines disagree).
CLOCK_SKEW = timedelta(days=1)


def implausible(row: ScheduleRow, now: datetime) -> str | None:
    """Why ``row`` cannot be a measurement (``None`` when it can): a time below what its
    architecture's fastest part needs for the problem's FLOPs or (beyond any L2) bytes, a
    TFLOP/s above that part's peak (each by more than :data:`MARGIN`), a ``created_at`` beyond
    :data:`CLOCK_SKEW` after ``now`` (timezone-aware)."""
    if row.created_at > now + CLOCK_SKEW:
        return (f"created_at {row.created_at.isoformat()} is in the future (now "
                f"{now.isoformat(timespec='seconds')}; at most {CLOCK_SKEW.days} day of clock "
                "skew is allowed)")
    peak = PEAKS.get(row.arch)
    if row.backend != "gpu" or peak is None:
        return None
    most = MARGIN * peak.tflops
    if row.tflops > most:
        return (f"tflops {row.tflops:g} is over {MARGIN:g}x the {peak.tflops:g} TFLOP/s peak "
                f"of the fastest {row.arch} GPU ({peak.part}): not a measurement")
    flops = _flops(row)
    nbytes = _bytes(row)
    fastest_ms = max(flops / (most * 1e12) * 1e3,
                     nbytes / (MARGIN * peak.gbps * 1e9) * 1e3 if nbytes > BEYOND_L2_BYTES
                     else 0.0)
    for name, ms in (("median_ms", row.median_ms), ("default_ms", row.default_ms),
                     *((f"baselines_ms[{k!r}]", v) for k, v in row.baselines.items())):
        if ms is not None and ms < fastest_ms:
            return (f"{name} {ms:g} is faster than physically possible: {_work(flops, nbytes)} "
                    f"take at least {fastest_ms:.3g} ms at {MARGIN:g}x the peak of the fastest "
                    f"{row.arch} GPU ({peak.part}: {peak.tflops:g} TFLOP/s, {peak.gbps:g} GB/s)")
    return None


def _flops(row: ScheduleRow) -> float:
    from tiledattention import get_family

    return float(get_family(row.family).flops(row.problem))


def _bytes(row: ScheduleRow) -> int:
    """The bytes one call moves at least (the bench's count, ``tuner.bench.problem_bytes``)."""
    from ..bench import problem_bytes

    try:
        return int(problem_bytes(row.problem))
    except (AttributeError, TypeError, ValueError):  # a family's problem it does not count
        return 0


def _work(flops: float, nbytes: Any) -> str:
    text = f"{flops:.3g} FLOPs"
    return text + (f" and {nbytes / 1e9:.3g} GB" if nbytes > BEYOND_L2_BYTES else "")
