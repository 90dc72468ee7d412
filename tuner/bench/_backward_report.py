"""Reports of ``tiledtune bench --kernel backward``: the markdown summary and terminal tables.

The rows are ordinary :class:`BenchResult` records (``kernel="backward"``), two per contender
and point: ``phase`` ``"backward"`` (the backward pass alone) and ``"forward+backward"`` (one
training step of attention), so the CSV and ``--report-only`` are the other grids'. TFLOP/s
counts the backward as 2.5x the forward's FLOPs and the step as 3.5x; since every contender of
a phase does the same FLOPs, ``÷ X`` (X's median time over the contender's, > 1: the contender
is faster) is also the ratio of TFLOP/s. Geometric means take only the points where both rows
ran; the points left out are listed, never averaged. Nothing here touches a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from db import write_bytes_atomic

from ._backward_grid import BACKWARD_CONTENDERS, BACKWARD_PHASES
from ._report import MATMUL_SIZE, BenchResult, RunInfo, contenders_of, geomean, header_lines

__all__ = ["BASELINES", "TARGET", "backward_points", "backward_rich_tables",
           "backward_speedup_table", "by_shape_table", "is_backward", "point_label",
           "render_backward_markdown", "speedup", "write_backward_summary"]

#: The torch backends the other contenders are compared with, in column order.
BASELINES = ("torch-flash", "torch-cudnn", "torch-efficient")
_SHORT = {"torch-flash": "flash", "torch-cudnn": "cuDNN", "torch-efficient": "efficient"}
#: Issue 17's goal: tiledattention's backward TFLOP/s over torch-flash's, geometric mean.
TARGET = ("tiledattention", "backward", "torch-flash", 1.2)


def is_backward(results: Sequence[BenchResult]) -> bool:
    """Whether ``results`` come from the backward grid (``--report-only`` picks the report)."""
    return any(r.kernel == "backward" for r in results)


def point_label(r: BenchResult) -> str:
    return (f"{r.dtype} D{r.head_dim} {'causal' if r.causal else 'full'} S{r.seqlen} "
            f"B{r.batch} H{r.heads}")


def backward_points(results: Sequence[BenchResult]
                    ) -> dict[tuple, dict[str, dict[str, BenchResult]]]:
    """``{(dtype, D, causal, S, B, H): {phase: {contender: result}}}``, in measured order."""
    table: dict[tuple, dict[str, dict[str, BenchResult]]] = {}
    for r in results:
        key = (r.dtype, r.head_dim, r.causal, r.seqlen, r.batch, r.heads)
        table.setdefault(key, {}).setdefault(r.phase, {})[r.contender] = r
    return table


def _ok(r: BenchResult | None) -> bool:
    return r is not None and r.status == "ok"


def speedup(r: BenchResult | None, base: BenchResult | None) -> float | None:
    """``base``'s median time over ``r``'s (> 1: ``r`` is faster); ``None`` unless both ran."""
    return base.median_ms / r.median_ms if _ok(r) and _ok(base) else None


def _others(results: Sequence[BenchResult]) -> list[str]:
    return [c for c in contenders_of(results, BACKWARD_CONTENDERS) if c not in BASELINES]


def _baselines(results: Sequence[BenchResult]) -> list[str]:
    present = {r.contender for r in results}
    return [b for b in BASELINES if b in present]


def _why(row: dict[str, BenchResult], name: str, base: str) -> str:
    missing = [(n, row.get(n)) for n in (name, base) if not _ok(row.get(n))]
    return ", ".join(f"{n}: {r.status if r else 'not run'}" for n, r in missing)


def backward_speedup_table(results: Sequence[BenchResult]
                           ) -> dict[tuple[str, str], dict[str, tuple]]:
    """Per (contender other than torch's, phase) and torch baseline: ``(geometric mean of the
    speed-ups, points where both ran, [(label, why) of the points left out])``."""
    points = backward_points(results)
    table: dict[tuple[str, str], dict[str, tuple]] = {}
    for name in _others(results):
        for phase in BACKWARD_PHASES:
            per = {}
            for base in _baselines(results):
                ratios, left = [], []
                for rows in points.values():
                    row = rows.get(phase, {})
                    if name not in row and base not in row:
                        continue
                    x = speedup(row.get(name), row.get(base))
                    if x is None:
                        any_row = next(iter(row.values()))
                        left.append((point_label(any_row), _why(row, name, base)))
                    else:
                        ratios.append(x)
                per[base] = (geomean(ratios), len(ratios), left)
            table[(name, phase)] = per
    return table


def by_shape_table(results: Sequence[BenchResult], name: str = "tiledattention",
                   phase: str = "backward") -> dict[tuple[int, bool], dict[str, tuple]]:
    """``{(D, causal): {baseline: (geometric mean over dtypes and S, points)}}`` for one
    contender's phase (the README's table shape)."""
    groups: dict[tuple[int, bool], dict[str, list[float]]] = {}
    for (dtype, d, causal, s, b, h), rows in backward_points(results).items():
        row = rows.get(phase, {})
        per = groups.setdefault((d, causal), {base: [] for base in _baselines(results)})
        for base in per:
            x = speedup(row.get(name), row.get(base))
            if x is not None:
                per[base].append(x)
    return {key: {base: (geomean(v), len(v)) for base, v in per.items()}
            for key, per in sorted(groups.items())}


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _per_point(results: Sequence[BenchResult]):
    """Per point: (label on the first row only, contender, {phase: result}, numbers or None)
    for the per-point tables; numbers are formatted for the phases that ran."""
    baselines = [b for b in ("torch-flash", "torch-cudnn") if b in _baselines(results)]
    contenders = contenders_of(results, BACKWARD_CONTENDERS)
    for rows in backward_points(results).values():
        label = point_label(next(iter(next(iter(rows.values())).values())))
        out = []
        for name in contenders:
            mine = {phase: rows.get(phase, {}).get(name) for phase in BACKWARD_PHASES}
            if not any(mine.values()):
                continue
            numbers = {}
            for phase, r in mine.items():
                if _ok(r):
                    numbers[phase] = {"ms": f"{r.median_ms:.3f}", "tflops": f"{r.tflops:.0f}"}
                    numbers[phase].update({b: _x(speedup(r, rows[phase].get(b)))
                                           for b in baselines})
            out.append((label, name, mine, numbers, baselines))
            label = ""
        yield out


def _status(mine: dict, phase: str) -> str:
    r = mine.get(phase)
    return r.status if r is not None else ""


def _target_lines(table: dict) -> list[str]:
    name, phase, base, goal = TARGET
    per = table.get((name, phase), {})
    if base not in per:
        return []
    value, n, left = per[base]
    verdict = "—" if value is None else ("met" if value >= goal else "not met")
    lines = ["## Target", "",
             f"`{name}` {phase} TFLOP/s ÷ `{base}`'s, geometric mean over the {n} points "
             f"where both ran: **{_x(value)}** (issue 17 asks for at least {goal}: {verdict})."]
    cudnn = per.get("torch-cudnn")
    if cudnn is not None:
        lines[-1] += f" ÷ `torch-cudnn`: {_x(cudnn[0])} over {cudnn[1]} points."
    if left:
        lines.append(f"Left out: {_left_text(left)}.")
    return lines + [""]


def _left_text(entries: list[tuple[str, str]]) -> str:
    """The points left out of a mean and why; one reason for all of them is said once."""
    whys = {why for _, why in entries}
    if len(entries) > 1 and len(whys) == 1:
        return f"{len(entries)} points ({whys.pop()}): " + ", ".join(l for l, _ in entries)
    return f"{len(entries)} point(s): " + "; ".join(f"{label} ({why})" for label, why in entries)


def render_backward_markdown(results: Sequence[BenchResult], info: RunInfo) -> str:
    contenders = contenders_of(results, BACKWARD_CONTENDERS)
    points = backward_points(results)
    lines = header_lines(results, info, "tiledattention backward benchmark", len(points),
                         contenders)
    if info.matmul_tflops:
        lines.append(f"- bf16 matrix product ({MATMUL_SIZE}³, torch.matmul), measured in this run "
                     "before and after the grid: "
                     + " / ".join(f"{x:.1f}" for x in info.matmul_tflops) + " TFLOP/s")
    lines += [
        "",
        "bwd: the backward pass alone (dQ, dK, dV from dO; the forward ran before, outside the "
        "timed region; torch: `torch.autograd.grad(out, (q, k, v), dO, retain_graph=True)`); "
        "fwd+bwd: one forward and backward step. ms: median time of one call (CUDA events; the "
        "L2 is flushed before every sample, outside the timed region; with --interleave, the "
        "default here, the contenders of a point take turns sample by sample). TFLOP/s counts "
        "the backward as 2.5x the forward's 4·B·H·S²·D (FlashAttention's count; only the "
        "unmasked part when causal) and a step as 3.5x. ÷ flash, ÷ cuDNN: torch-flash's and "
        "torch-cudnn's time over the contender's (> 1: the contender is faster). Rows that are "
        "not numbers name the status; the notes give the reasons. Points where a contender "
        "cannot run are listed, never averaged.",
        "",
    ]
    table = backward_speedup_table(results)
    lines += _target_lines(table)
    lines += ["## Per point", "",
              "| point | contender | bwd ms | bwd TFLOP/s | bwd ÷ flash | bwd ÷ cuDNN | "
              "fwd+bwd ms | fwd+bwd TFLOP/s | fwd+bwd ÷ flash | fwd+bwd ÷ cuDNN |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for point in _per_point(results):
        for label, name, mine, numbers, baselines in point:
            cells = []
            for phase in BACKWARD_PHASES:
                n = numbers.get(phase)
                if n is None:
                    cells += [_status(mine, phase) or "—"] + ["—"] * 3
                else:
                    cells += [n["ms"], n["tflops"]] + [n.get(b, "—") for b in
                                                       ("torch-flash", "torch-cudnn")]
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
    lines.append("")

    if table:
        bases = _baselines(results)
        lines += ["## Geometric mean speed-up (over the points where both ran)", "",
                  "| contender | phase | " + " | ".join(f"÷ {_SHORT[b]} | points"
                                                       for b in bases) + " |",
                  "|---|---|" + "---|---|" * len(bases)]
        for (name, phase), per in table.items():
            cells = [name, phase]
            for base in bases:
                value, n, _ = per[base]
                cells += [_x(value), str(n)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        shapes = by_shape_table(results)
        if "tiledattention" in contenders and shapes:
            lines += ["## `tiledattention` backward by head dim and mask (over dtypes and S)",
                      "", "| D | mask | " + " | ".join(f"÷ {_SHORT[b]}" for b in bases) + " |",
                      "|---|---|" + "---|" * len(bases)]
            for (d, causal), per in shapes.items():
                lines.append(f"| {d} | {'causal' if causal else 'full'} | "
                             + " | ".join(_x(per[b][0]) for b in bases) + " |")
            lines.append("")
        left = []
        for (name, phase), per in table.items():
            if not any(n for _, n, _ in per.values()):  # never ran: the notes say why
                left.append(f"- {name} {phase}: no point where it and a baseline both ran")
                continue
            left += [f"- {name} {phase} ÷ {base}: {_left_text(entries)}"
                     for base, (_, _, entries) in per.items() if entries]
        if left:
            lines += ["## Left out of the means", ""] + left + [""]

    scheduled = [(point_label(r), r) for rows in points.values()
                 for r in rows.get("backward", {}).values() if r.schedule]
    if scheduled:
        lines += ["## Schedules", ""]
        lines += [f"- {label}, {r.contender}: {r.schedule} ({r.lookup_source or 'unknown'})"
                  for label, r in scheduled]
        lines.append("")

    notes = _grouped_notes(results)
    if notes:
        lines += ["## Notes", ""] + notes + [""]
    return "\n".join(lines)


def _grouped_notes(results: Sequence[BenchResult]) -> list[str]:
    """One line per (contender, status, reason, phases): the points it applies to."""
    per_point: dict[tuple, list[str]] = {}
    for r in results:
        if r.status != "ok":
            per_point.setdefault((r.contender, point_label(r), r.status, r.reason), []).append(
                r.phase)
    grouped: dict[tuple, list[str]] = {}
    for (name, label, status, reason), phases in per_point.items():
        which = "both phases" if len(set(phases)) == len(BACKWARD_PHASES) else ", ".join(phases)
        grouped.setdefault((name, status, reason, which), []).append(label)
    return [f"- {name}, {which}, {status}" + (f": {reason}" if reason else "")
            + f" — at {', '.join(labels)}"
            for (name, status, reason, which), labels in grouped.items()]


def write_backward_summary(results: Sequence[BenchResult], info: RunInfo,
                           path: str | os.PathLike) -> Path:
    path = Path(path)
    write_bytes_atomic(path, render_backward_markdown(results, info).encode())
    return path


def backward_rich_tables(results: Sequence[BenchResult]):
    """Rich tables for the terminal: a row per point and contender (bwd and fwd+bwd ms and
    TFLOP/s, backward speed-ups over flash and cuDNN), then the geometric means."""
    from rich.table import Table

    table = Table(title="tiledtune bench --kernel backward")
    columns = ("point", "contender", "bwd ms", "bwd TFLOP/s", "÷ flash", "÷ cuDNN",
               "fwd+bwd ms", "fwd+bwd TFLOP/s")
    for column in columns:
        table.add_column(column, justify="left" if column in ("point", "contender")
                         else "right")
    for point in _per_point(results):
        for label, name, mine, numbers, baselines in point:
            bwd, step = numbers.get("backward"), numbers.get("forward+backward")

            def dim(phase: str) -> str:
                status = _status(mine, phase)
                return f"[{'red' if status == 'wrong' else 'dim'}]{status}[/]"
            cells = ([bwd["ms"], bwd["tflops"], bwd.get("torch-flash", ""),
                      bwd.get("torch-cudnn", "")] if bwd else [dim("backward"), "", "", ""])
            cells += [step["ms"], step["tflops"]] if step else [dim("forward+backward"), ""]
            table.add_row(label, name, *cells)
        table.add_section()
    means = Table(title="geomean speed-up (> 1: faster than the baseline)")
    bases = _baselines(results)
    for column in ["contender", "phase"] + [c for b in bases for c in (f"÷ {_SHORT[b]}",
                                                                       "points")]:
        means.add_column(column, justify="left" if column in ("contender", "phase")
                         else "right")
    for (name, phase), per in backward_speedup_table(results).items():
        means.add_row(name, phase, *(cell for b in bases
                                     for cell in (_x(per[b][0]), str(per[b][1]))))
    return [table, means]
