"""The roofline picture of one or two profiles: each profile's point (the problem's flops per
DRAM byte, its TFLOP/s) under the roofs of the same GPU's measured matrix-product rate and copy
bandwidth. A small palette PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ._report import Ceilings, Profile

__all__ = ["roofline_png"]


def roofline_png(profiles: Sequence[Profile], ceilings: Ceilings, path: str | Path) -> Path:
    """Draw ``profiles`` (their totals) against ``ceilings`` into ``path``;
    ``tuner.bench._plots.PlotsUnavailable`` without matplotlib."""
    from ..bench._plots import new_figure, save_png

    fig = new_figure(figsize=(5.5, 3.8))
    ax = fig.add_subplot(1, 1, 1)
    ridge = ceilings.tflops * 1e3 / ceilings.gbps  # FLOP per byte where the roofs meet
    points = [(p, p.rows()[-1]) for p in profiles]
    lo = min([ridge / 100] + [t["intensity"] / 3 for _, t in points if t.get("intensity")])
    hi = max([ridge * 30] + [t["intensity"] * 3 for _, t in points if t.get("intensity")])
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(ceilings.tflops, x * ceilings.gbps / 1e3) for x in xs], color="black",
            linewidth=1.2, label=f"roofs: {ceilings.tflops:.0f} TFLOP/s bf16 matmul, "
                                 f"{ceilings.gbps:.0f} GB/s copy")
    for (profile, total), marker in zip(points, "os^D"):
        if total.get("intensity") and total.get("tflops"):
            ax.plot([total["intensity"]], [total["tflops"]], marker, markersize=8,
                    label=f"{profile.label}: {profile.schedule} ({total['tflops']:.0f} TFLOP/s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per DRAM byte")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{profiles[0].family} {profiles[0].problem}", fontsize=8)
    ax.legend(fontsize=6, loc="lower right")
    ax.grid(True, which="both", linewidth=0.3)
    fig.tight_layout()
    return save_png(fig, path, palette=True)
