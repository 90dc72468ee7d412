"""PNG plots of ``tiledtune bench --kernel backward`` results (matplotlib, optional: the
``bench`` extra; :class:`PlotsUnavailable` without it):

- ``backward_tflops.png``: backward TFLOP/s against S, a panel per head dim (rows) and dtype x
  mask (columns), a line per contender;
- ``backward_speedup.png``: tiledattention's speed-up over torch-flash and torch-cudnn (their
  time over ours), backward (solid) and forward+backward (dashed), same panels.

Each PNG is kept under ``MAX_PNG_BYTES`` by lowering its resolution.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ._backward_grid import BACKWARD_CONTENDERS
from ._backward_report import backward_points, speedup
from ._plots import MAX_PNG_BYTES, _figure_class, _save_small, _short
from ._report import BenchResult, contenders_of

__all__ = ["write_backward_plots"]

_SPEEDUPS = (("torch-flash", "backward", "-"), ("torch-cudnn", "backward", "-"),
             ("torch-flash", "forward+backward", "--"), ("torch-cudnn", "forward+backward", "--"))


def _panels(points: dict) -> tuple[list[int], list[tuple[str, bool]]]:
    dims = sorted({key[1] for key in points})
    columns = sorted({(key[0], key[2]) for key in points})
    return dims, columns


def _axes(Figure, dims, columns):
    fig = Figure(figsize=(max(6.0, 3.4 * len(columns)), 2.6 * len(dims)), layout="constrained")
    return fig, fig.subplots(len(dims), len(columns), squeeze=False, sharex=True)


def _style(ax, seqlens: list[int], title: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    if seqlens:
        ax.set_xticks(seqlens, labels=[_short(s) for s in seqlens])
        ax.minorticks_off()
    ax.set_title(title, fontsize=8)
    ax.set_xlabel("S", fontsize=7)
    ax.set_ylabel(ylabel, fontsize=7)
    ax.tick_params(labelsize=6)
    ax.grid(True, alpha=0.3)


def _legend(fig, ncol: int) -> bool:
    """One legend under the panels (``ncol`` columns at most, fewer on a narrow figure)."""
    handles, labels = [], []
    for ax in fig.axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h), labels.append(label)
    if handles:
        width = fig.get_figwidth()
        fig.legend(handles, labels, loc="outside lower center", fontsize=7,
                   ncol=max(1, min(ncol, len(labels), int(width // 2.2))))
    return bool(handles)


def _series(points: dict, dtype: str, d: int, causal: bool):
    """(S, rows by phase) of one panel, by S."""
    keys = sorted((k for k in points if (k[0], k[1], k[2]) == (dtype, d, causal)),
                  key=lambda k: k[3])
    return [(k[3], points[k]) for k in keys]


def write_backward_plots(results: Sequence[BenchResult], out_dir: str | os.PathLike, *,
                         max_bytes: int = MAX_PNG_BYTES) -> tuple[list[Path], list[str]]:
    """Write ``backward_tflops.png`` and (when tiledattention and a baseline ran)
    ``backward_speedup.png``; returns the files written and messages about plots left out."""
    Figure = _figure_class()
    out_dir = Path(out_dir)
    points = backward_points(results)
    dims, columns = _panels(points)
    contenders = contenders_of(results, BACKWARD_CONTENDERS)
    written: list[Path] = []
    messages: list[str] = []

    fig, axes = _axes(Figure, dims, columns)
    for i, d in enumerate(dims):
        for j, (dtype, causal) in enumerate(columns):
            series = _series(points, dtype, d, causal)
            for c, name in enumerate(contenders):  # one colour per contender in every panel
                xs = [s for s, rows in series
                      if rows.get("backward", {}).get(name) is not None
                      and rows["backward"][name].status == "ok"]
                ys = [rows["backward"][name].tflops for s, rows in series if s in xs]
                if xs:
                    axes[i][j].plot(xs, ys, marker="o", markersize=3, linewidth=1.1, label=name,
                                    color=f"C{c}")
            _style(axes[i][j], [s for s, _ in series],
                   f"{dtype} D={d} {'causal' if causal else 'full'}", "backward TFLOP/s")
    if not _legend(fig, 5):
        messages.append("backward TFLOP/s plot has no measured point")
    path = out_dir / "backward_tflops.png"
    _save_small(fig, path, max_bytes)
    written.append(path)

    fig, axes = _axes(Figure, dims, columns)
    for i, d in enumerate(dims):
        for j, (dtype, causal) in enumerate(columns):
            series = _series(points, dtype, d, causal)
            for c, (base, phase, line) in enumerate(_SPEEDUPS):
                xs, ys = [], []
                for s, rows in series:
                    row = rows.get(phase, {})
                    x = speedup(row.get("tiledattention"), row.get(base))
                    if x is not None:
                        xs.append(s), ys.append(x)
                if xs:
                    axes[i][j].plot(xs, ys, linestyle=line, marker="o", markersize=3,
                                    linewidth=1.1, label=f"{phase} vs {base}", color=f"C{c % 2}")
            axes[i][j].axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
            _style(axes[i][j], [s for s, _ in series],
                   f"{dtype} D={d} {'causal' if causal else 'full'}", "tiledattention speed-up")
    if _legend(fig, 4):
        path = out_dir / "backward_speedup.png"
        _save_small(fig, path, max_bytes)
        written.append(path)
    else:
        messages.append("no backward speed-up plot: tiledattention and torch-flash or "
                        "torch-cudnn never both ran")
    return written, messages
