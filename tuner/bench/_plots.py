"""PNG plots of ``tiledtune bench`` results, one writer for every family: a figure is a grid of
panels (one per kind of point: dtype, head dim, mask, and for decode batch, heads and query
length), the length of the keys on a log₂ x axis and a line per series. What differs per family
is data (:data:`PLOTS`): the files, the figure of merit (TFLOP/s, or the share of the run's copy
rate) and the speed-ups drawn (a contender's over a baseline: the baseline's time over its).

matplotlib is optional (the ``bench`` extra): :class:`PlotsUnavailable` without it. Every PNG is
kept under ``MAX_PNG_BYTES`` by lowering its resolution.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from db import write_bytes_atomic

from ..errors import TunerError, TunerValueError
from ._peers import FA4
from ._report import contenders_of, kernel_of, speedup
from ._results import BenchResult

__all__ = ["MAX_PNG_BYTES", "PAGED_PLOTS", "PLOTS", "Plot", "PlotsUnavailable", "RAGGED_PLOTS",
           "VARIANT_PLOTS", "new_figure", "save_png", "write_plots"]

MAX_PNG_BYTES = 200 * 1024
_PLOT_DPIS = (90, 72, 60, 48, 36)


class PlotsUnavailable(TunerError):
    """matplotlib is not installed (``pip install 'tiledattention[bench]'``)."""


def _layer_panel(r: BenchResult) -> tuple:
    return (r.dtype, r.head_dim, r.mask)


@dataclass(frozen=True)
class Plot:
    """One figure: ``name`` (``{dtype}`` in it: a file per dtype); without ``against`` a line
    per contender of its TFLOP/s (``copy``: its GB/s as a share of the run's copy rate), with
    ``against`` a line per contender (``only`` that one) and baseline of its speed-up."""

    name: str
    ylabel: str
    against: tuple[str, ...] = ()
    only: str | None = None
    copy: bool = False
    panel: Callable[[BenchResult], tuple] = _layer_panel
    xlabel: str = "S (keys)"


PLOTS = {
    "forward": (Plot("tflops_{dtype}.png", "TFLOP/s"),
                Plot("ratio_cudnn_{dtype}.png", "÷ torch-cudnn", against=("torch-cudnn",))),
    "decode": (Plot("decode_copy_share.png", "% of copy bandwidth", copy=True, panel=lambda r: (
        r.dtype, r.head_dim, r.mask, f"B{r.batch}", f"H{r.heads}/{r.heads_kv}",
        f"S_q{r.seqlen_q}")),),
    "backward": (Plot("backward_tflops.png", "TFLOP/s"),
                 Plot("backward_speedup.png", "tiledattention speed-up", only="tiledattention",
                      against=("torch-flash", "torch-cudnn", FA4))),
}


def _variant_panel(r: BenchResult) -> tuple:
    return (r.dtype, f"D{r.head_dim}", f"H{r.heads}/{r.heads_kv}", r.mask)


_VARIANT_SPEEDUP = Plot("variants_speedup_{dtype}.png", "tiledattention speed-up",
                        only="tiledattention", against=("flex", "sdpa-mask", "varlen", FA4),
                        panel=_variant_panel)
#: The figures of a run with variant points (a window, a softcap, sinks), per family:
#: tiledattention's speed-up over each variant contender, a panel per kind of point (decode:
#: also its share of the copy rate).
VARIANT_PLOTS = {
    "forward": (_VARIANT_SPEEDUP,),
    "backward": (_VARIANT_SPEEDUP,),
    "decode": (PLOTS["decode"][0], _VARIANT_SPEEDUP),
}


def _ragged_panel(r: BenchResult) -> tuple:
    """Ragged points by head shape and the buckets' nominal token count (sequences x longest):
    a line over the longest sequence's length."""
    return (r.dtype, f"D{r.head_dim}", f"H{r.heads}/{r.heads_kv}", r.mask,
            f"{r.batch * r.seqlen // 1024}k-token buckets")


_RAGGED_X = "longest sequence (keys)"
_RAGGED = (Plot("ragged_tflops_{dtype}.png", "TFLOP/s (valid tokens)", panel=_ragged_panel,
                xlabel=_RAGGED_X),
           Plot("ragged_speedup_{dtype}.png", "tiledattention speed-up", only="tiledattention",
                against=("torch-varlen", "cudnn-padded", "efficient-padded", FA4),
                panel=_ragged_panel, xlabel=_RAGGED_X))
#: The figures of a run with ragged points (``--preset ragged``), per family: TFLOP/s on the
#: valid tokens, and tiledattention's speed-up over each ragged contender.
RAGGED_PLOTS = {"forward": _RAGGED, "backward": _RAGGED}


def _paged_panel(r: BenchResult) -> tuple:
    """Paged points by head shape, entries and page size: a line over the longest cache."""
    return (r.dtype, f"D{r.head_dim}", f"H{r.heads}/{r.heads_kv}", f"B{r.batch}",
            f"page {r.page_size}")


_PAGED_X = "longest cache (keys)"
#: The figures of a run with paged points (``--preset paged``, decode): each contender's GB/s
#: of the valid K/V bytes as a share of the run's copy rate, and tiledattention's speed-up
#: over each paged contender.
PAGED_PLOTS = {"decode": (
    Plot("paged_copy_share.png", "% of copy bandwidth (valid K/V)", copy=True,
         panel=_paged_panel, xlabel=_PAGED_X),
    Plot("paged_speedup_{dtype}.png", "tiledattention speed-up", only="tiledattention",
         against=("torch-varlen-paged", "cudnn-padded-cache", FA4), panel=_paged_panel,
         xlabel=_PAGED_X))}


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotsUnavailable("matplotlib is not installed, so no plots were drawn; "
                               "install it with: pip install 'tiledattention[bench]'") from None
    return Figure


def new_figure(**kwargs):
    """A matplotlib ``Figure(**kwargs)`` (no pyplot state); :class:`PlotsUnavailable` without
    matplotlib."""
    return _figure_class()(**kwargs)


def save_png(fig, path: str | os.PathLike, max_bytes: int = MAX_PNG_BYTES, *,
             palette: bool = False) -> Path:
    """Save ``fig`` at the highest of ``_PLOT_DPIS`` that stays under ``max_bytes`` (written
    atomically); ``palette``: as a 64-colour palette PNG (a fraction of the size, for plots
    kept in the repository)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(path)
    FigureCanvasAgg(fig)
    data = b""
    for dpi in _PLOT_DPIS:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
        data = buffer.getvalue()
        if palette:
            from PIL import Image  # matplotlib's own dependency

            buffer = io.BytesIO()
            Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=64).save(buffer, "PNG")
            data = buffer.getvalue()
        if len(data) <= max_bytes:
            break
    if len(data) > max_bytes:
        raise TunerValueError(f"{path.name} is {len(data) // 1024} KiB even at dpi "
                              f"{_PLOT_DPIS[-1]}; the limit is {max_bytes // 1024} KiB")
    write_bytes_atomic(path, data)
    return path


def _series(plot: Plot, rows: Sequence[BenchResult], names: list[str], copy: float | None):
    """``{label: [(panel, S, y)]}`` of one figure."""
    phases = list(dict.fromkeys(r.phase for r in rows))
    at = {(r.point, r.phase, r.contender): r for r in rows}
    lines: dict[str, list] = {}
    for name in ([plot.only] if plot.only else names):
        for base in plot.against or (None,):
            for phase in phases if plot.against else phases[:1]:
                label = name if base is None else f"{name} ÷ {base}"
                label += f" ({phase})" if plot.against and len(phases) > 1 else ""
                for r in (r for r in rows if r.contender == name and r.phase == phase):
                    if base is not None:
                        y = speedup(r, at.get((r.point, phase, base)))
                    elif r.status != "ok":
                        y = None
                    else:
                        y = r.tflops if not plot.copy else (100 * r.gbps / copy if copy
                                                            else r.gbps)
                    if y is not None:
                        lines.setdefault(label, []).append((plot.panel(r), r.seqlen, y))
    return lines


def _draw(Figure, plot: Plot, rows: Sequence[BenchResult], lines: dict, ylabel: str):
    panels = sorted({plot.panel(r) for r in rows})
    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    fig = Figure(figsize=(4.2 * ncols, 2.8 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    for i, (label, points) in enumerate(lines.items()):
        for ax, panel in zip(axes, panels):
            xy = sorted((s, y) for p, s, y in points if p == panel)
            if xy:
                ax.plot(*zip(*xy), marker="o", markersize=3, linewidth=1.1, label=label,
                        color=f"C{i % 10}")
    for ax, panel in zip(axes, panels):
        seqlens = sorted({r.seqlen for r in rows if plot.panel(r) == panel})
        if plot.against or (plot.copy and "%" in ylabel):
            ax.axhline(1.0 if plot.against else 100.0, color="grey", linewidth=0.8,
                       linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqlens, labels=[f"{s // 1024}k" if s >= 1024 and s % 1024 == 0
                                       else str(s) for s in seqlens])
        ax.minorticks_off()
        ax.set_title(" ".join(str(p) for p in panel), fontsize=8)
        ax.set_xlabel(plot.xlabel, fontsize=7)
        ax.set_ylabel(ylabel, fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(True, alpha=0.3)
    if lines:
        fig.legend(loc="outside lower center", fontsize=7, ncol=min(4, len(lines)))
    return fig


def write_plots(results: Sequence[BenchResult], out_dir: str | os.PathLike,
                copy_gbps: Sequence[float] = (), *, max_bytes: int = MAX_PNG_BYTES
                ) -> tuple[list[Path], list[str]]:
    """Write the figures of the rows' family (:data:`PLOTS`, or :data:`PAGED_PLOTS` when some
    rows are of paged points, :data:`RAGGED_PLOTS` when some are of ragged points,
    :data:`VARIANT_PLOTS` when some are of variant points);
    ``copy_gbps``: the run's copy
    rates (the faster is the share's 100%). Returns the files written and messages about
    figures left out or drawn otherwise. Raises :class:`PlotsUnavailable` without matplotlib."""
    Figure = _figure_class()
    kernel, names = kernel_of(results), contenders_of(results)
    copy = max(copy_gbps) if copy_gbps else None
    written: list[Path] = []
    messages: list[str] = []
    plots = (PAGED_PLOTS if any(r.page_size for r in results)
             else RAGGED_PLOTS if any(r.ragged for r in results)
             else VARIANT_PLOTS if any(r.variant for r in results) else PLOTS)
    for plot in plots.get(kernel, plots.get("forward", ())):
        split = "{dtype}" in plot.name
        for dtype in sorted({r.dtype for r in results}) if split else [None]:
            rows = [r for r in results if dtype is None or r.dtype == dtype]
            name = plot.name.format(dtype=dtype)
            lines = _series(plot, rows, names, copy)
            ylabel = plot.ylabel if not plot.copy or copy else "GB/s"
            if plot.copy and not copy:
                messages.append(f"{name} shows GB/s: the run has no copy rate")
            if not lines and plot.against:
                messages.append(f"no {name}: {' and '.join(plot.against)} and "
                                f"{plot.only or 'the contenders'} never both ran")
                continue
            if not lines:
                messages.append(f"{name} has no measured point")
            path = Path(out_dir) / name
            save_png(_draw(Figure, plot, rows, lines, ylabel), path, max_bytes)
            written.append(path)
    return written, messages
