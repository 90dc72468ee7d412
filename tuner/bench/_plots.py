"""PNG plots of ``tiledtune bench`` results: TFLOP/s and the ratio to cuDNN against S (forward
grid); the share of the copy bandwidth per point and contender (decode grid).

matplotlib is optional (the ``bench`` extra): it is imported only by :func:`write_plots`, which
raises :class:`PlotsUnavailable` when it is missing. Every PNG is kept under ``MAX_PNG_BYTES``
by lowering its resolution.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Sequence

from db import write_bytes_atomic

from ._decode_grid import DECODE_CONTENDERS
from ._decode_report import decode_points, point_label
from ._report import BenchResult, by_point, contenders_of

__all__ = ["MAX_PNG_BYTES", "PlotsUnavailable", "write_decode_plots", "write_plots"]

MAX_PNG_BYTES = 200 * 1024
_PLOT_DPIS = (90, 72, 60, 48, 36)
_BASELINE = "torch-cudnn"  # the ratio plot divides by this one


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed (``pip install 'tiledattention[bench]'``)."""


def _save_small(fig, path: Path, max_bytes: int) -> None:
    """Save ``fig`` at the highest of ``_PLOT_DPIS`` that stays under ``max_bytes``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    data = b""
    for dpi in _PLOT_DPIS:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
        data = buffer.getvalue()
        if len(data) <= max_bytes:
            break
    if len(data) > max_bytes:
        raise RuntimeError(f"{path.name} is {len(data) // 1024} KiB even at dpi "
                           f"{_PLOT_DPIS[-1]}; the limit is {max_bytes // 1024} KiB")
    write_bytes_atomic(path, data)


def _short(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _panel_grid(keys: Sequence[tuple]) -> tuple[list[int], list[bool]]:
    return sorted({k[1] for k in keys}), sorted({k[2] for k in keys})


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotsUnavailable("matplotlib is not installed, so no plots were drawn; "
                               "install it with: pip install 'tiledattention[bench]'") from None
    return Figure


def write_decode_plots(results: Sequence[BenchResult], out_dir: str | os.PathLike,
                       copy_gbps: Sequence[float] = (), *, max_bytes: int = MAX_PNG_BYTES
                       ) -> tuple[list[Path], list[str]]:
    """Write ``decode_copy_share.png``: per point (x) and contender (a marker each), the share
    of the run's copy rate (the faster of ``copy_gbps``) its GB/s reach; GB/s itself when the
    run measured no copy rate. Returns the files written and messages, like :func:`write_plots`."""
    Figure = _figure_class()
    points = decode_points(results)
    copy = max(copy_gbps) if copy_gbps else None
    contenders = contenders_of(results, DECODE_CONTENDERS)
    labels = [point_label(next(iter(row.values()))) for row in points.values()]
    fig = Figure(figsize=(max(6.0, 0.55 * len(labels) + 2), 4.6), layout="constrained")
    ax = fig.subplots()
    markers = "os^vDP*X"
    for i, name in enumerate(contenders):
        xs, ys = [], []
        for x, row in enumerate(points.values()):
            r = row.get(name)
            if r is not None and r.status == "ok":
                xs.append(x), ys.append(100 * r.gbps / copy if copy else r.gbps)
        if xs:
            ax.plot(xs, ys, marker=markers[i % len(markers)], markersize=4, linewidth=0.8,
                    label=name)
    if copy:
        ax.axhline(100.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(labels)), labels=labels, rotation=60, ha="right", fontsize=6)
    ax.set_ylabel(f"% of copy bandwidth ({copy:.0f} GB/s)" if copy else "GB/s", fontsize=8)
    ax.set_title("decode: bytes moved per second" + (" as a share of a device copy" if copy
                                                     else ""), fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, alpha=0.3)
    messages = [] if copy else ["decode plot shows GB/s: the run has no copy rate"]
    if ax.get_legend_handles_labels()[0]:
        fig.legend(loc="outside lower center", ncol=min(6, len(contenders)), fontsize=7)
    else:
        messages.append("decode plot has no measured point")
    path = Path(out_dir) / "decode_copy_share.png"
    _save_small(fig, path, max_bytes)
    return [path], messages


def write_plots(results: Sequence[BenchResult], out_dir: str | os.PathLike, *,
                max_bytes: int = MAX_PNG_BYTES) -> tuple[list[Path], list[str]]:
    """Write ``tflops_<dtype>.png`` (TFLOP/s vs S, a panel per (D, mask), a line per
    contender) and ``ratio_cudnn_<dtype>.png`` (TFLOP/s ÷ torch-cudnn's) per dtype.

    Returns the files written and messages about plots left out. Raises
    :class:`PlotsUnavailable` without matplotlib."""
    Figure = _figure_class()
    out_dir = Path(out_dir)
    contenders = contenders_of(results)
    index = by_point(results)
    written: list[Path] = []
    messages: list[str] = []
    for dtype in sorted({k[0] for k in index}):
        keys = [k for k in index if k[0] == dtype]
        dims, masks = _panel_grid(keys)
        for kind in ("tflops", "ratio"):
            if kind == "ratio" and not any(
                    r.contender == _BASELINE and r.status == "ok" and r.dtype == dtype
                    for r in results):
                messages.append(f"no ratio-to-cuDNN plot for {dtype}: {_BASELINE} has no "
                                f"measured point")
                continue
            fig = Figure(figsize=(4.2 * len(masks), 3.0 * len(dims)), layout="constrained")
            axes = fig.subplots(len(dims), len(masks), squeeze=False, sharex=True)
            for i, d in enumerate(dims):
                for j, causal in enumerate(masks):
                    ax = axes[i][j]
                    seqlens = sorted(k[3] for k in keys if k[1] == d and k[2] == causal)
                    for name in contenders:
                        xs, ys = [], []
                        for s in seqlens:
                            row = index[(dtype, d, causal, s)]
                            r, base = row.get(name), row.get(_BASELINE)
                            if r is None or r.status != "ok":
                                continue
                            if kind == "tflops":
                                xs.append(s), ys.append(r.tflops)
                            elif base is not None and base.status == "ok":
                                xs.append(s), ys.append(r.tflops / base.tflops)
                        if xs:
                            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2,
                                    label=name)
                    if kind == "ratio":
                        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
                    ax.set_xscale("log", base=2)
                    if seqlens:
                        ax.set_xticks(seqlens, labels=[_short(s) for s in seqlens])
                        ax.minorticks_off()
                    ax.set_title(f"{dtype} D={d} {'causal' if causal else 'full'}",
                                 fontsize=9)
                    ax.set_xlabel("S", fontsize=8)
                    ax.set_ylabel("TFLOP/s" if kind == "tflops" else f"÷ {_BASELINE}",
                                  fontsize=8)
                    ax.tick_params(labelsize=7)
                    ax.grid(True, alpha=0.3)
            handles, labels = [], []
            for ax in fig.axes:
                for h, label in zip(*ax.get_legend_handles_labels()):
                    if label not in labels:
                        handles.append(h), labels.append(label)
            if handles:
                fig.legend(handles, labels, loc="outside lower center",
                           ncol=min(4, len(labels)), fontsize=7)
            name = f"tflops_{dtype}.png" if kind == "tflops" else f"ratio_cudnn_{dtype}.png"
            path = out_dir / name
            _save_small(fig, path, max_bytes)
            written.append(path)
    return written, messages
