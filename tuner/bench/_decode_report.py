"""Reports of ``tiledtune bench --kernel decode``: the markdown summary and the terminal tables.

The rows are ordinary :class:`BenchResult` records (``kernel="decode"``; ``heads`` is H_q and
``seqlen`` S_k, with ``heads_kv``, ``seqlen_q`` and ``bottom_right`` set), so the CSV and
``--report-only`` are the forward grid's. A decode kernel streams K and V once, so its figure of
merit is bandwidth: GB/s (Q, K, V read and the output written, once each, in the input dtype)
and that as a share of the run's device-to-device copy rate (``RunInfo.copy_gbps``). Speed-ups
are a baseline's median time over the contender's (> 1: the contender is faster), against
cuDNN and against the faster of torch's flash and efficient backends at each point; geometric
means take only the points where both ran. Nothing here touches a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from db import write_bytes_atomic

from ._decode_grid import DECODE_CONTENDERS
from ._report import COPY_BYTES, BenchResult, RunInfo, contenders_of, geomean, header_lines

__all__ = [
    "FA_BACKENDS", "baseline", "decode_key", "decode_points", "decode_rich_tables", "is_decode",
    "mask_name", "point_label", "render_decode_markdown", "speedup", "speedup_table",
    "write_decode_summary",
]

CUDNN = "torch-cudnn"
#: The backends whose faster one is the "flash/efficient" baseline at each point.
FA_BACKENDS = ("torch-flash", "torch-efficient")
_BASELINES = ("cuDNN", "flash/efficient")


def is_decode(results: Sequence[BenchResult]) -> bool:
    """Whether ``results`` come from the decode grid (``--report-only`` picks the report)."""
    return any(r.kernel == "decode" for r in results)


def decode_key(r: BenchResult) -> tuple:
    """The grid point of a decode row: (dtype, B, H_q, H_kv, S_q, S_k, D, causal, bottom_right)."""
    return (r.dtype, r.batch, r.heads, r.heads_kv, r.seqlen_q, r.seqlen, r.head_dim, r.causal,
            r.bottom_right)


def mask_name(r: BenchResult) -> str:
    return ("bottom-right" if r.bottom_right else "top-left") if r.causal else "none"


def point_label(r: BenchResult) -> str:
    return (f"B{r.batch} H{r.heads}/{r.heads_kv} S_q{r.seqlen_q} S_k{r.seqlen} D{r.head_dim} "
            f"{r.dtype} {mask_name(r)}")


def decode_points(results: Sequence[BenchResult]) -> dict[tuple, dict[str, BenchResult]]:
    """``{decode_key: {contender: result}}`` in the order the points were measured."""
    table: dict[tuple, dict[str, BenchResult]] = {}
    for r in results:
        table.setdefault(decode_key(r), {})[r.contender] = r
    return table


def _ok(r: BenchResult | None) -> bool:
    return r is not None and r.status == "ok"


def baseline(row: dict[str, BenchResult], which: str) -> BenchResult | None:
    """``which`` ("cuDNN" or "flash/efficient") at one point: the measured row, for the latter
    the faster of torch-flash and torch-efficient; ``None`` when none ran."""
    if which == "cuDNN":
        return row.get(CUDNN) if _ok(row.get(CUDNN)) else None
    ran = [row[n] for n in FA_BACKENDS if _ok(row.get(n))]
    return min(ran, key=lambda r: r.median_ms) if ran else None


def speedup(r: BenchResult | None, base: BenchResult | None) -> float | None:
    """``base``'s median time over ``r``'s (> 1: ``r`` is faster); ``None`` unless both ran."""
    return base.median_ms / r.median_ms if _ok(r) and _ok(base) else None


def speedup_table(results: Sequence[BenchResult]
                  ) -> dict[str, dict[str, tuple[float | None, int]]]:
    """Per contender other than the baselines: ``{"cuDNN" | "flash/efficient": (geometric mean
    of the speed-ups, number of points where both ran)}``."""
    points = decode_points(results)
    table = {}
    for name in contenders_of(results, DECODE_CONTENDERS):
        if name == CUDNN or name in FA_BACKENDS:
            continue
        table[name] = {}
        for which in _BASELINES:
            ratios = [speedup(row.get(name), baseline(row, which)) for row in points.values()]
            ratios = [x for x in ratios if x is not None]
            table[name][which] = (geomean(ratios), len(ratios))
    return table


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _per_point(points: dict, contenders: Sequence[str], copy: float | None):
    """Per point, its rows for the per-point tables: (label, the first row only; contender;
    result; its formatted numbers, ``None`` unless the result is ``ok``)."""
    for row in points.values():
        label = point_label(next(iter(row.values())))
        cudnn, fa = baseline(row, "cuDNN"), baseline(row, "flash/efficient")
        out = []
        for name in contenders:
            r = row.get(name)
            if r is None:
                continue
            numbers = None
            if r.status == "ok":
                numbers = {"us": f"{1000 * r.median_ms:.1f}", "tflops": f"{r.tflops:.2f}",
                           "gbps": f"{r.gbps:.0f}", "copy": _pct(r.gbps / copy if copy else None),
                           "cudnn": _x(speedup(r, cudnn)), "fa": _x(speedup(r, fa))}
            out.append((label, name, r, numbers))
            label = ""
        yield out


def render_decode_markdown(results: Sequence[BenchResult], info: RunInfo) -> str:
    contenders = contenders_of(results, DECODE_CONTENDERS)
    points = decode_points(results)
    copy = max(info.copy_gbps) if info.copy_gbps else None
    lines = header_lines(results, info, "tiledattention decode benchmark", len(points),
                         contenders)
    if copy is not None:
        lines.append(f"- device-to-device copy ({COPY_BYTES / 2**30:g} GiB, `dst.copy_(src)`), "
                     "measured in this run before and after the grid: "
                     + " / ".join(f"{x:.0f}" for x in info.copy_gbps)
                     + f" GB/s of bytes read + written; shares are of the faster, {copy:.0f}")
    lines += [
        "",
        "µs: median time of one call (CUDA events; the L2 is flushed before every sample, "
        "outside the timed region; with --interleave, the default here, the contenders of a "
        "point take turns sample by sample). GB/s: Q, K and V read and the output written, once each, "
        "in the input dtype, per second (1e9 bytes); % copy: that over the copy rate. TFLOP/s "
        "counts 4·B·H_q·S_q·S_k·D (only the unmasked part when causal). ÷ cuDNN, ÷ FA: cuDNN's "
        "time, and the faster of torch-flash's and torch-efficient's, over the contender's "
        "(> 1: the contender is faster). Rows that are not numbers name the status; the notes "
        "give the reasons. Unavailable backends are listed, never averaged.",
        "",
        "## Per point", "",
        "| point | contender | µs | TFLOP/s | GB/s | % copy | ÷ cuDNN | ÷ FA |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for point in _per_point(points, contenders, copy):
        for label, name, r, n in point:
            cells = ([n["us"], n["tflops"], n["gbps"], n["copy"], n["cudnn"], n["fa"]] if n
                     else [r.status] + ["—"] * 5)
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
    lines.append("")

    if copy is not None:
        lines += ["## Share of the copy bandwidth", "",
                  "| point | " + " | ".join(contenders) + " |",
                  "|---|" + "---|" * len(contenders)]
        for row in points.values():
            cells = [_pct(r.gbps / copy) if _ok(r) else (r.status if r else "")
                     for r in (row.get(c) for c in contenders)]
            lines.append(f"| {point_label(next(iter(row.values())))} | "
                         + " | ".join(cells) + " |")
        lines.append("")

    table = speedup_table(results)
    if table:
        lines += ["## Geometric mean speed-up (over the points where both ran)", "",
                  "| contender | ÷ cuDNN | points | ÷ flash/efficient | points |",
                  "|---|---|---|---|---|"]
        for name, per in table.items():
            cells = [name]
            for which in _BASELINES:
                value, n = per[which]
                cells += [_x(value), str(n)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")

    scheduled = [(point_label(r), r) for row in points.values() for r in row.values()
                 if r.schedule]
    if scheduled:
        lines += ["## Schedules", ""]
        lines += [f"- {label}, {r.contender}: {r.schedule} ({r.lookup_source or 'unknown'})"
                  for label, r in scheduled]
        lines.append("")

    notes = [r for r in results if r.status != "ok"]
    if notes:
        lines += ["## Notes", ""]
        lines += [f"- {r.contender}, {point_label(r)}: {r.note}" for r in notes]
        lines.append("")
    return "\n".join(lines)


def write_decode_summary(results: Sequence[BenchResult], info: RunInfo,
                         path: str | os.PathLike) -> Path:
    path = Path(path)
    write_bytes_atomic(path, render_decode_markdown(results, info).encode())
    return path


def decode_rich_tables(results: Sequence[BenchResult], copy_gbps: Sequence[float] = ()):
    """Rich tables for the terminal: a row per point and contender (µs, share of the copy rate,
    speed-ups over cuDNN and flash/efficient), then the geometric-mean speed-ups."""
    from rich.table import Table

    contenders = contenders_of(results, DECODE_CONTENDERS)
    copy = max(copy_gbps) if copy_gbps else None
    table = Table(title="tiledtune bench --kernel decode")
    for column in ("point", "contender", "µs", "% copy", "÷ cuDNN", "÷ FA"):
        table.add_column(column, justify="left" if column in ("point", "contender")
                         else "right")
    for point in _per_point(decode_points(results), contenders, copy):
        for label, name, r, n in point:
            cells = ([n["us"], n["copy"], n["cudnn"], n["fa"]] if n else
                     [f"[{'red' if r.status == 'wrong' else 'dim'}]{r.status}[/]", "", "", ""])
            table.add_row(label, name, *cells)
        table.add_section()
    speedups = Table(title="geomean speed-up (> 1: faster than the baseline)")
    for column in ("contender", "÷ cuDNN", "points", "÷ flash/efficient", "points"):
        speedups.add_column(column, justify="left" if column == "contender" else "right")
    for name, per in speedup_table(results).items():
        speedups.add_row(name, *(cell for which in _BASELINES
                                 for cell in (_x(per[which][0]), str(per[which][1]))))
    return [table, speedups]
