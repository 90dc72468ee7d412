"""The summary of a ``tiledtune bench`` run (``summary.md``) and its tables on the terminal.

One writer serves every family: :func:`render_markdown` groups the rows by point, phase and
contender and runs the sections of the rows' family's :class:`Layout`; a layout says what
differs per family: the title and the explanation, how a point is named, the figures of a
per-point table (time, TFLOP/s, and for a memory-bound kernel GB/s and the share of the copy
rate), the baselines speed-ups are taken against, and which sections follow. A speed-up is a
baseline's median time over the contender's (> 1: the contender is faster; for one problem that
is also the ratio of TFLOP/s); geometric means take only the points where both ran, and the
points left out are listed, never averaged. Runs with variant points (``--preset variants``),
ragged points (``--preset ragged``) and paged points (``--preset paged``) get layouts of their
own (:func:`variant_layout`, :func:`ragged_layout`, :func:`paged_layout`). Every table of the
summary is also a rich table for the terminal (:func:`rich_tables`). Nothing here touches a
GPU.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from db import write_text_atomic

from ._paged import PAGED_CONTENDERS
from ._peers import FA4, PEER_CONTENDERS
from ._presets import PRESETS
from ._ragged import RAGGED_CONTENDERS
from ._results import COPY_BYTES, MATMUL_SIZE, BenchResult, RunInfo
from ._variants import VARIANT_CONTENDERS

__all__ = ["LAYOUTS", "Layout", "contenders_of", "geomean", "kernel_of", "paged_keys",
           "paged_layout", "ragged_layout", "ragged_tokens", "render_markdown", "rich_tables",
           "speedup", "variant_layout", "write_summary"]

REFERENCE = "tiledattention"  # the contender whose speed-ups the tables show


def geomean(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def _ok(r: BenchResult | None) -> bool:
    return r is not None and r.status == "ok"


def speedup(r: BenchResult | None, base: BenchResult | None) -> float | None:
    """``base``'s median time over ``r``'s (> 1: ``r`` is faster); ``None`` unless both ran."""
    return base.median_ms / r.median_ms if _ok(r) and _ok(base) else None


def _best(row: dict[str, BenchResult], names: Sequence[str]) -> BenchResult | None:
    """The fastest of ``names`` that ran at a point (``None``: none did)."""
    ran = [row[n] for n in names if _ok(row.get(n))]
    return min(ran, key=lambda r: r.median_ms) if ran else None


def _first(phases: dict[str, dict[str, BenchResult]]) -> BenchResult:
    """The first row of a point (any phase, any contender)."""
    return next(iter(next(iter(phases.values())).values()))


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def _unique(values: Iterable[str]) -> str:
    seen = [v for v in dict.fromkeys(values) if v]
    return ", ".join(seen) if seen else "unknown"


def kernel_of(results: Sequence[BenchResult]) -> str:
    """The family whose grid the rows come from (``--report-only`` picks the layout by it)."""
    return next((r.kernel for r in results if r.kernel != "forward"), "forward")


def contenders_of(results: Sequence[BenchResult]) -> list[str]:
    """The contenders present in ``results``: in the order of their family's preset (then the
    variant contenders', the ragged ones', the paged ones', the other libraries'), then others (older runs' names) by
    name."""
    preset = PRESETS.get(kernel_of(results))
    order = (preset.order if preset else ()) + VARIANT_CONTENDERS + RAGGED_CONTENDERS \
        + PAGED_CONTENDERS + PEER_CONTENDERS
    present = {r.contender for r in results}
    return [c for c in order if c in present] + sorted(present - set(order))


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What a family's summary shows. ``label``: a point's name in tables and notes;
    ``order``: sorts points (``None``: as measured); ``phases``: the phases shown, with their
    column prefixes; ``time``: (header, factor from ms, digits); ``bandwidth``: GB/s and % copy
    columns; ``baselines``: (short name, contenders: the fastest that ran counts) of the
    per-point speed-ups, ``means`` those of the geometric means; ``sections``: in order."""

    title: str
    intro: str
    label: Callable[[BenchResult], str]
    sections: tuple[Callable[["_Doc"], None], ...]
    order: Callable[[BenchResult], Any] | None = None
    phases: tuple[tuple[str, str], ...] = (("", ""),)
    time: tuple[str, float, int] = ("ms", 1.0, 3)
    tflops_digits: int = 1
    bandwidth: bool = False
    baselines: tuple[tuple[str, tuple[str, ...]], ...] = ()
    means: tuple[tuple[str, tuple[str, ...]], ...] = ()
    grouped_notes: bool = False


class _Doc:
    """The summary being written: rows by point, phase and contender; lines and tables."""

    def __init__(self, results: Sequence[BenchResult], info: RunInfo, layout: Layout,
                 kernel: str) -> None:
        self.results, self.info, self.layout = results, info, layout
        self.contenders = contenders_of(results)
        self.target = PRESETS[kernel].target if kernel in PRESETS else None
        ordered = sorted(results, key=layout.order) if layout.order else results
        self.points: dict[tuple, dict[str, dict[str, BenchResult]]] = {}
        for r in ordered:
            self.points.setdefault(r.point, {}).setdefault(r.phase, {})[r.contender] = r
        self.phases = [p for p, _ in layout.phases if any(r.phase == p for r in results)]
        self.copy = max(info.copy_gbps) if info.copy_gbps else None
        self.lines: list[str] = []
        self.tables: list[tuple[str, list[str], list[list[str]]]] = []
        self._means: dict | None = None

    def table(self, title: str, head: list[str], rows: list[list[str]]) -> None:
        self.tables.append((title, head, rows))
        self.lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        self.lines += ["| " + " | ".join(cells) + " |" for cells in rows] + [""]

    def ours(self) -> list[str]:
        """The contenders speed-ups are reported for: all but the baselines of the means."""
        baselines = {n for _, names in self.layout.means for n in names}
        return [c for c in self.contenders if c not in baselines]

    def means(self) -> dict[tuple[str, str], dict[str, tuple]]:
        """``{(contender, phase): {baseline: (geometric mean, points, [(label, why) left
        out])}}`` over the baselines present in the rows."""
        if self._means is None:
            bases = [(s, n) for s, n in self.layout.means if set(n) & set(self.contenders)]
            self._means = {(name, phase): {"/".join(names): self._mean(name, phase, names)
                                           for _, names in bases}
                           for name in self.ours() for phase in self.phases}
        return self._means

    def _mean(self, name: str, phase: str, names: Sequence[str]) -> tuple:
        ratios, left = [], []
        for phases in self.points.values():
            row = phases.get(phase, {})
            if name not in row and not set(names) & set(row):
                continue
            x = speedup(row.get(name), _best(row, names))
            if x is not None:
                ratios.append(x)
                continue
            missing = [(n, row.get(n)) for n in (name, *names) if not _ok(row.get(n))]
            why = ", ".join(f"{n}: {r.status if r else 'not run'}" for n, r in missing)
            left.append((self.layout.label(next(iter(row.values()))), why))
        return geomean(ratios), len(ratios), left


# -- sections --------------------------------------------------------------------------------------

def _header(doc: _Doc) -> None:
    results, info = doc.results, doc.info
    doc.lines += [
        f"# {doc.layout.title}", "",
        f"- command: `{info.command}`",
        f"- date: {info.date}",
        *([f"- commit: {info.describe_commit()}"] if info.commit is not None else []),
        f"- device: {_unique(r.device for r in results)} ({_unique(r.arch for r in results)})",
        f"- driver: {_unique(r.driver for r in results)}; torch "
        f"{_unique(r.torch_version for r in results)}; cuda-tile "
        f"{_unique(r.cuda_tile_version for r in results)}",
        f"- GPU clocks (SM / memory): {_unique(r.sm_clock for r in results)} / "
        f"{_unique(r.mem_clock for r in results)}",
        f"- points: {len(doc.points)}; contenders: {', '.join(doc.contenders)}",
    ]
    if info.matmul_tflops:
        doc.lines.append(f"- bf16 matrix product ({MATMUL_SIZE}³, torch.matmul), measured in "
                         "this run before and after the grid: "
                         + " / ".join(f"{x:.1f}" for x in info.matmul_tflops) + " TFLOP/s")
    if doc.copy is not None:
        doc.lines.append(f"- device-to-device copy ({COPY_BYTES / 2**30:g} GiB, "
                         "`dst.copy_(src)`), measured in this run before and after the grid: "
                         + " / ".join(f"{x:.0f}" for x in info.copy_gbps)
                         + f" GB/s of bytes read + written; shares are of the faster, "
                           f"{doc.copy:.0f}")
    fa4 = FA4 in doc.contenders and any(FA4 in names for _, names in doc.layout.baselines)
    doc.lines += ["", doc.layout.intro + (_FA4_NOTE if fa4 else ""), ""]


def _groups(doc: _Doc) -> None:
    """A table per (dtype, D, mask): TFLOP/s per length and contender, and the reference's
    speed-up over each other contender; then the reference's schedules."""
    names, others = doc.contenders, [c for c in doc.contenders if c != REFERENCE]
    has_ref = REFERENCE in names
    for group in dict.fromkeys(_first(phases).key[:3] for phases in doc.points.values()):
        dtype, d, causal = group
        rows, schedules = [], []
        for phases in doc.points.values():
            row, first = phases.get("", {}), _first(phases)
            if first.key[:3] != group:
                continue
            cells = [str(first.seqlen), f"{first.batch}×{first.heads}"]
            cells += ["" if row.get(c) is None else f"{row[c].tflops:.1f}" if _ok(row[c])
                      else row[c].status for c in names]
            if has_ref:
                cells += [_x(speedup(row.get(REFERENCE), row.get(c))) for c in others]
                if REFERENCE in row and row[REFERENCE].schedule:
                    r = row[REFERENCE]
                    schedules.append(f"S={first.seqlen}: {r.schedule} ({r.lookup_source})")
            rows.append(cells)
        head = ["S", "B×H"] + names + ([f"÷ {c}" for c in others] if has_ref else [])
        doc.table(f"{dtype}, D={d}, {'causal' if causal else 'full'}", head, rows)
        if schedules:
            doc.lines += [f"Schedules of `{REFERENCE}`: " + "; ".join(schedules) + ".", ""]


def _by_shape(doc: _Doc, title: str, against: Sequence[str], heads: Sequence[str]) -> None:
    """The reference's geometric-mean speed-up over each of ``against`` per (D, mask)."""
    phase = doc.phases[0] if doc.phases else ""
    groups: dict[tuple[int, bool], dict[str, list]] = {}
    for phases in doc.points.values():
        row, first = phases.get(phase, {}), _first(phases)
        per = groups.setdefault((first.head_dim, first.causal), {c: [] for c in against})
        for c in against:
            per[c].append(speedup(row.get(REFERENCE), row.get(c)))
    doc.table(title, ["D", "mask"] + list(heads),
              [[str(d), "causal" if causal else "full"] + [_x(geomean(per[c])) for c in against]
               for (d, causal), per in sorted(groups.items())])


def _ratio_means(doc: _Doc) -> None:
    if REFERENCE in doc.contenders and (others := [c for c in doc.contenders if c != REFERENCE]):
        _by_shape(doc, f"Geometric mean of `{REFERENCE}` ÷ contender (over dtypes and S)",
                  others, others)


def _matmul_share(doc: _Doc) -> None:
    """The reference's TFLOP/s as a share of the (faster) matrix-product rate of the run."""
    if REFERENCE not in doc.contenders or not doc.info.matmul_tflops:
        return
    matmul = max(doc.info.matmul_tflops)
    rows = [r for phases in doc.points.values() for r in phases[""].values()]
    seqlens = sorted({r.seqlen for r in rows})
    share = {r.key: f"{100 * r.tflops / matmul:.0f}%" for r in rows
             if r.contender == REFERENCE and _ok(r)}
    doc.table(f"`{REFERENCE}` as a share of the matrix-product rate ({matmul:.1f} TFLOP/s)",
              ["dtype", "D", "mask"] + [f"S={s}" for s in seqlens],
              [[dtype, str(d), "causal" if causal else "full"]
               + [share.get((dtype, d, causal, s), "—") for s in seqlens]
               for dtype, d, causal in sorted({r.key[:3] for r in rows})])


def _target(doc: _Doc) -> None:
    if doc.target is None:
        return
    name, phase, base, goal, source = doc.target
    per = doc.means().get((name, phase), {})
    if base not in per:
        return
    value, n, left = per[base]
    verdict = "—" if value is None else ("met" if value >= goal else "not met")
    doc.lines += ["## Target", "",
                  f"`{name}` {phase} TFLOP/s ÷ `{base}`'s, geometric mean over the {n} points "
                  f"where both ran: **{_x(value)}** ({source} asks for at least {goal}: "
                  f"{verdict})."]
    for other in ("torch-cudnn", FA4):
        if other in per:
            doc.lines[-1] += f" ÷ `{other}`: {_x(per[other][0])} over {per[other][1]} points."
    doc.lines += [f"Left out: {_left_text(left)}."] if left else []
    doc.lines.append("")


def _left_text(entries: list[tuple[str, str]]) -> str:
    """The points left out of a mean and why; one reason for all of them is said once."""
    whys = {why for _, why in entries}
    if len(entries) > 1 and len(whys) == 1:
        return f"{len(entries)} points ({whys.pop()}): " + ", ".join(l for l, _ in entries)
    return f"{len(entries)} point(s): " + "; ".join(f"{label} ({why})" for label, why in entries)


def _per_point(doc: _Doc) -> None:
    """A row per point and contender: per phase its time, TFLOP/s, (GB/s, % copy) and
    speed-ups over the layout's baselines."""
    lay = doc.layout
    unit, factor, digits = lay.time
    columns = [unit, "TFLOP/s"] + (["GB/s", "% copy"] if lay.bandwidth else [])
    columns += [f"÷ {short}" for short, _ in lay.baselines]
    prefix = dict(lay.phases)
    rows = []
    for phases in doc.points.values():
        label = doc.layout.label(_first(phases))
        for name in doc.contenders:
            mine = {p: phases.get(p, {}).get(name) for p in doc.phases}
            if not any(mine.values()):
                continue
            cells = [label, name]
            for p, r in mine.items():
                if not _ok(r):
                    cells += [r.status if r else "—"] + ["—"] * (len(columns) - 1)
                    continue
                cells += [f"{factor * r.median_ms:.{digits}f}", f"{r.tflops:.{lay.tflops_digits}f}"]
                if lay.bandwidth:
                    cells += [f"{r.gbps:.0f}", _pct(r.gbps / doc.copy if doc.copy else None)]
                cells += [_x(speedup(r, _best(phases[p], names))) for _, names in lay.baselines]
            rows.append(cells)
            label = ""
    doc.table("Per point", ["point", "contender"]
              + [prefix[p] + c for p in doc.phases for c in columns], rows)


def _copy_share(doc: _Doc) -> None:
    if doc.copy is not None:
        cell = lambda r: _pct(r.gbps / doc.copy) if _ok(r) else r.status if r else ""  # noqa: E731
        doc.table("Share of the copy bandwidth", ["point"] + doc.contenders, [
            [doc.layout.label(_first(p))] + [cell(p.get(doc.phases[0], {}).get(c)) for c in
                                             doc.contenders] for p in doc.points.values()])


def _means(doc: _Doc) -> None:
    """Geometric-mean speed-ups per contender (and phase) over each baseline; with the
    reference's by head dim and mask and the points left out where the layout has phases."""
    table = doc.means()
    if not table:
        return
    phased = len(doc.layout.phases) > 1
    shorts = [s for s, n in doc.layout.means if set(n) & set(doc.contenders)]
    head = ["contender"] + (["phase"] if phased else [])
    doc.table("Geometric mean speed-up (over the points where both ran)",
              head + [c for s in shorts for c in (f"÷ {s}", "points")],
              [[name] + ([phase] if phased else [])
               + [c for value, n, _ in per.values() for c in (_x(value), str(n))]
               for (name, phase), per in table.items()])
    if not phased:
        return
    if REFERENCE in doc.contenders:
        bases = [n[0] for s, n in doc.layout.means if set(n) & set(doc.contenders)]
        _by_shape(doc, f"`{REFERENCE}` {doc.phases[0]} by head dim and mask (over dtypes and S)",
                  bases, [f"÷ {s}" for s in shorts])
    left = []
    for (name, phase), per in table.items():
        if not any(n for _, n, _ in per.values()):  # never ran: the notes say why
            left.append(f"- {name} {phase}: no point where it and a baseline both ran")
            continue
        left += [f"- {name} {phase} ÷ {base}: {_left_text(entries)}"
                 for base, (_, _, entries) in per.items() if entries]
    if left:
        doc.lines += ["## Left out of the means", ""] + left + [""]


def _schedules(doc: _Doc) -> None:
    phase = doc.phases[0] if doc.phases else ""
    scheduled = [r for phases in doc.points.values() for r in phases.get(phase, {}).values()
                 if r.schedule]
    if scheduled:
        doc.lines += ["## Schedules", ""] + [
            f"- {doc.layout.label(r)}, {r.contender}: {r.schedule} "
            f"({r.lookup_source or 'unknown'})" for r in scheduled] + [""]


def _notes(doc: _Doc) -> None:
    label, notes = doc.layout.label, [r for r in doc.results if r.status != "ok"]
    if doc.layout.grouped_notes:  # one line per (contender, status, reason, phases)
        per_point: dict[tuple, list[str]] = {}
        for r in notes:
            per_point.setdefault((r.contender, label(r), r.status, r.reason), []).append(r.phase)
        grouped: dict[tuple, list[str]] = {}
        for (name, where, status, reason), phases in per_point.items():
            which = ("both phases" if len(set(phases)) == len(doc.layout.phases)
                     else ", ".join(phases))
            grouped.setdefault((name, status, reason, which), []).append(where)
        lines = [f"- {name}, {which}, {status}" + (f": {reason}" if reason else "")
                 + f" — at {', '.join(where)}"
                 for (name, status, reason, which), where in grouped.items()]
    else:
        if doc.layout.order:
            notes.sort(key=lambda r: (doc.layout.order(r), doc.contenders.index(r.contender)))
        lines = [f"- {r.contender}, {label(r)}: {r.note}" for r in notes]
    if lines:
        doc.lines += ["## Notes", ""] + lines + [""]


# -- the layouts ---------------------------------------------------------------------------------

def _lengths(r: BenchResult) -> str:
    """``S``, or ``S_q x S_k`` where they differ."""
    return str(r.seqlen) if r.seqlen_q in (None, r.seqlen) else f"{r.seqlen_q}x{r.seqlen}"


def _heads(r: BenchResult) -> str:
    """``H``, or ``H_q/H_kv`` for grouped heads."""
    return str(r.heads) if r.heads_kv in (None, r.heads) else f"{r.heads}/{r.heads_kv}"


_TORCH_MEANS = (("flash", ("torch-flash",)), ("cuDNN", ("torch-cudnn",)),
                ("efficient", ("torch-efficient",)))
#: Speed-ups over FlashAttention-4 (``_peers``): a baseline of every layout with baselines,
#: where the rows have it (:func:`_with_fa4`; the forward's tables divide by every contender
#: already). Runs without it render as before.
_FA4 = (("FA4", (FA4,)),)
_FA4_NOTE = (f" ÷ FA4: `{FA4}`'s time (FlashAttention-4, `flash_attn.cute`, on its own "
             "[B, S, H, D] layout made outside the timing) over the contender's, where it ran.")
LAYOUTS = {
    "forward": Layout(
        title="tiledattention benchmark", order=lambda r: r.key,
        label=lambda r: f"{r.dtype} D={r.head_dim} {r.mask} S={r.seqlen} (B={r.batch}, "
                        f"H={r.heads})",
        intro="TFLOP/s counts 4·B·H·S_q·S_k·D, only the unmasked part when causal (higher is "
              f"better). A ratio column is TFLOP/s of `{REFERENCE}` over the contender's (> 1: "
              f"`{REFERENCE}` is faster). Cells that are not numbers name the status; the notes "
              "at the end give the reasons.",
        sections=(_header, _groups, _ratio_means, _matmul_share, _notes)),
    "decode": Layout(
        title="tiledattention decode benchmark", time=("µs", 1000.0, 1), tflops_digits=2,
        label=lambda r: f"B{r.batch} H{r.heads}/{r.heads_kv} S_q{r.seqlen_q} S_k{r.seqlen} "
                        f"D{r.head_dim} {r.dtype} " + ("none" if not r.causal else
                                                       "bottom-right" if r.bottom_right
                                                       else "top-left")
                        + (f" kv-{r.kv_dtype}" if r.kv_dtype else ""),
        intro="µs: median time of one call (CUDA events; the L2 is flushed before every sample, "
              "outside the timed region; with --interleave, the default here, the contenders of "
              "a point take turns sample by sample). GB/s: Q, K and V read and the output "
              "written, once each, in the input dtype, per second (1e9 bytes); % copy: that over "
              "the copy rate. TFLOP/s counts 4·B·H_q·S_q·S_k·D (only the unmasked part when "
              "causal). ÷ cuDNN, ÷ FA: cuDNN's time, and the faster of torch-flash's and "
              "torch-efficient's, over the contender's (> 1: the contender is faster). Rows that "
              "are not numbers name the status; the notes give the reasons. Unavailable backends "
              "are listed, never averaged.",
        bandwidth=True,
        baselines=(("cuDNN", ("torch-cudnn",)), ("FA", ("torch-flash", "torch-efficient"))),
        means=(("cuDNN", ("torch-cudnn",)), ("flash/efficient", ("torch-flash",
                                                                  "torch-efficient"))),
        sections=(_header, _per_point, _copy_share, _means, _schedules, _notes)),
    "backward": Layout(
        title="tiledattention backward benchmark", tflops_digits=0, grouped_notes=True,
        label=lambda r: f"{r.dtype} D{r.head_dim} {r.mask} S{_lengths(r)} B{r.batch} "
                        f"H{_heads(r)}",
        phases=(("backward", "bwd "), ("forward+backward", "fwd+bwd ")),
        intro="bwd: the backward pass alone (dQ, dK, dV from dO; the forward ran before, outside "
              "the timed region; torch: `torch.autograd.grad(out, (q, k, v), dO, "
              "retain_graph=True)`); fwd+bwd: one forward and backward step. ms: median time of "
              "one call (CUDA events; the L2 is flushed before every sample, outside the timed "
              "region; with --interleave, the default here, the contenders of a point take turns "
              "sample by sample). TFLOP/s counts the backward as 2.5x the forward's 4·B·H·S²·D "
              "(FlashAttention's count; only the unmasked part when causal) and a step as 3.5x. "
              "÷ flash, ÷ cuDNN: torch-flash's and torch-cudnn's time over the contender's (> 1: "
              "the contender is faster). Rows that are not numbers name the status; the notes "
              "give the reasons. Points where a contender cannot run are listed, never averaged.",
        baselines=_TORCH_MEANS[:2], means=_TORCH_MEANS,
        sections=(_header, _target, _per_point, _means, _schedules, _notes)),
}


_VARIANT_BASELINES = (("flex", ("flex",)), ("sdpa-mask", ("sdpa-mask",)),
                      ("varlen", ("varlen",)))


def variant_layout(kernel: str, contenders: Sequence[str]) -> Layout:
    """The layout of a run with variant points (a window, a softcap, sinks): the family's
    title, units and point names with the variant spelled out, a per-point table with the
    speed-ups over FlexAttention, SDPA with the materialised mask and ``varlen_attn`` (and over
    torch's backends where plain points ran too), the geometric means over those, schedules
    and notes; only baselines present in the run get columns."""
    base = LAYOUTS.get(kernel, LAYOUTS["forward"])
    present = tuple((short, names) for short, names in
                    _VARIANT_BASELINES + (base.means or _TORCH_MEANS[:2])
                    if set(names) & set(contenders))
    what = {"backward": "bwd: the backward pass alone (dQ, dK, dV from dO; the forward ran "
                        "before, outside the timed region; the other contenders: "
                        "`torch.autograd.grad(out, (q, k, v), dO, retain_graph=True)`); TFLOP/s "
                        "counts it as 2.5x the forward's visible pairs.",
            "decode": "µs: median time of one call; GB/s: Q read and the output written, and "
                      "the K and V of the keys the window lets some query see, once each; % "
                      "copy: that over the run's copy rate."}.get(
        kernel, "ms: median time of one call; TFLOP/s counts 4·B·H_q·D per visible (query, "
                "key) pair (the causal mask and the window applied).")
    intro = (f"Variant points: a sliding window `win(left,right)` (-1: unbounded; aligned "
             f"bottom-right where `br`), a logit softcap `capC`, attention `sinks`. {what} "
             "Contenders besides tiledattention's: `flex` (torch.compile'd FlexAttention, its "
             "BlockMask built once outside the timing, the softcap as its score_mod, sinks "
             "through its log-sum-exp), `sdpa-mask` (SDPA with the materialised boolean mask "
             "on the efficient backend; windows only) and `varlen` (`varlen_attn` with "
             "`window_size`; windows only, where the installed torch has it); every one is "
             "checked against the float32 reference before timing (rel L2 error within the "
             "family's tolerance). A `÷ X` column is X's time over the contender's (> 1: the "
             "contender is faster). Rows that are not numbers name the status; the notes give "
             "the reasons.")
    sections = (_header, _per_point) + ((_copy_share,) if base.bandwidth else ()) + (
        _means, _schedules, _notes)
    return Layout(title=f"{base.title}: variants (window, softcap, sinks)", intro=intro,
                  label=lambda r: f"{r.dtype} D{r.head_dim} {r.mask} S{_lengths(r)} "
                                  f"B{r.batch} H{_heads(r)}",
                  sections=sections, phases=base.phases[:1], time=base.time,
                  tflops_digits=base.tflops_digits, bandwidth=base.bandwidth,
                  baselines=present, means=present)


def ragged_tokens(r: BenchResult) -> int:
    """Query tokens of a ragged row's batch: the sequences its family's ragged case packs
    (``_ragged.case_lengths``: ``batch`` of 1, 3/4, 1/2, 1/4 of the longest, ``seqlen_q``)."""
    import types

    from ._ragged import valid_tokens

    longest = r.seqlen if r.seqlen_q is None else r.seqlen_q
    return valid_tokens(types.SimpleNamespace(batch=r.batch, seqlen_q=longest,
                                              seqlen_k=r.seqlen))


def _ragged_label(r: BenchResult) -> str:
    """``bf16 D128 causal H32/8 L1024 B16 (10240 tokens)`` for a ragged row (``L``: the
    longest sequence, ``B`` sequences); other rows as in the variant layout."""
    if not r.ragged:
        return f"{r.dtype} D{r.head_dim} {r.mask} S{_lengths(r)} B{r.batch} H{_heads(r)}"
    longest = str(r.seqlen) if r.seqlen_q in (None, r.seqlen) else f"{r.seqlen_q}x{r.seqlen}"
    return (f"{r.dtype} D{r.head_dim} {r.mask} H{_heads(r)} L{longest} B{r.batch} "
            f"({ragged_tokens(r)} tokens)")


_RAGGED_BASELINES = (("varlen", ("torch-varlen",)), ("cuDNN padded", ("cudnn-padded",)),
                     ("efficient padded", ("efficient-padded",)))


def ragged_layout(kernel: str, contenders: Sequence[str]) -> Layout:
    """The layout of a run with ragged points (``--preset ragged``): the family's title, units
    and phase, a point named by its longest sequence, sequences and valid tokens, a per-point
    table with the speed-ups over ``varlen_attn`` and the padded batch's cuDNN and efficient
    SDPA, the geometric means over those, schedules and notes; only baselines present in the
    run get columns."""
    base = LAYOUTS.get(kernel, LAYOUTS["forward"])
    present = tuple((short, names) for short, names in _RAGGED_BASELINES
                    if set(names) & set(contenders))
    what = ("bwd: the backward pass alone (dQ, dK, dV from dO; the forward ran before, outside "
            "the timed region; the other contenders: `torch.autograd.grad(out, (q, k, v), dO, "
            "retain_graph=True)` with their own layout as the leaves); TFLOP/s counts it as "
            "2.5x the forward's." if kernel == "backward" else "ms: median time of one call.")
    intro = (
        "Ragged points: a bucket of packed variable-length sequences (`Problem.ragged`, "
        "looked up by the longest length and the token count rounded up to powers of two); "
        "its family's case packs `B` sequences of 1, 3/4, 1/2 and 1/4 of the longest length "
        f"`L`, in turn (tokens: their sum), the mask within each sequence. {what} TFLOP/s "
        "count 4·H_q·D per attended (query, key) pair of the valid tokens only (each "
        "sequence its own causal triangle; padding counts for nothing), for every contender "
        "alike. `tiledattention` rows time the family's ragged launch on a range table built "
        "once (what the tuner times; `tiledattention.varlen_attn` adds its host work). "
        "Contenders besides tiledattention's: `torch-varlen` "
        "(`torch.nn.attention.varlen.varlen_attn` on the packed tensors, where the installed "
        "torch has it; K/V heads repeated, outside the timing, on a torch without "
        "`enable_gqa`), `cudnn-padded` and `efficient-padded` (SDPA on the batch padded to "
        "its longest sequence with the boolean padding and causal mask, both built outside "
        "the timing, on the cuDNN or the efficient backend; K/V heads repeated for the "
        "efficient one). Every one is checked against the float32 reference before timing "
        "(rel L2 error within the family's tolerance). A `÷ X` column is X's time over the "
        "contender's (> 1: the contender is faster). Rows that are not numbers name the "
        "status; the notes give the reasons.")
    return Layout(title=f"{base.title}: ragged batches", intro=intro, label=_ragged_label,
                  sections=(_header, _per_point, _means, _schedules, _notes),
                  phases=base.phases[:1], time=base.time, tflops_digits=base.tflops_digits,
                  baselines=present, means=present)


def paged_keys(r: BenchResult) -> int:
    """Keys of a paged row's caches: those its family's paged case holds
    (``_paged.case_lengths``: ``batch`` of 1, 3/4, 1/2, 1/4 of the longest ``seqlen``, at
    least ``seqlen_q`` each)."""
    import types

    from ._paged import valid_keys

    return valid_keys(types.SimpleNamespace(batch=r.batch, seqlen_q=r.seqlen_q or 1,
                                            seqlen_k=r.seqlen))


def _paged_label(r: BenchResult) -> str:
    """``bf16 D128 H32/8 B16 L32768 page64 (327680 keys)`` for a paged row (``L``: the longest
    cache, ``B`` entries; ``S_q`` named where an entry has more than one query row); other rows
    as in the decode layout."""
    if not r.page_size:
        return LAYOUTS["decode"].label(r)
    rows = f" S_q{r.seqlen_q}" if r.seqlen_q not in (None, 1) else ""
    mask = "" if r.mask in ("causal-br", "full") else f" {r.mask}"
    return (f"{r.dtype} D{r.head_dim} H{_heads(r)} B{r.batch}{rows} L{r.seqlen} "
            f"page{r.page_size}{mask} ({paged_keys(r)} keys)")


_PAGED_BASELINES = (("varlen paged", ("torch-varlen-paged",)),
                    ("cuDNN padded", ("cudnn-padded-cache",)))


def paged_layout(kernel: str, contenders: Sequence[str]) -> Layout:
    """The layout of a run with paged points (``--preset paged``): the decode family's title
    and units, a point named by its entries, longest cache, page size and valid keys, a
    per-point table with GB/s of the valid K/V bytes, their share of the run's copy rate and
    the speed-ups over ``varlen_attn`` with a block table and cuDNN's SDPA on the padded caches,
    the share of the copy rate per contender, the geometric means, schedules and notes; only
    baselines present in the run get columns."""
    base = LAYOUTS.get(kernel, LAYOUTS["decode"])
    present = tuple((short, names) for short, names in _PAGED_BASELINES
                    if set(names) & set(contenders))
    intro = (
        "Paged points: a decode step over a paged K/V cache (`Problem.page_size`, looked up "
        "by its bucket: the entries and the longest cache rounded up to powers of two, the "
        "page size exact); its family's case holds `B` caches of 1, 3/4, 1/2 and 1/4 of the "
        "longest `L` keys, in turn (keys: their sum), in shuffled pages of `page` tokens "
        "(NaN in every unused page), each entry's queries the last of its keys (causal, "
        "bottom-right). µs: median time of one call (CUDA events; the L2 is flushed before "
        "every sample, outside the timed region; with --interleave, the default here, the "
        "contenders of a point take turns sample by sample). GB/s: the valid K/V bytes (the "
        "caches' keys × H_kv × D × 2 bytes, for K and for V; not the padding, the pages' "
        "unused tails, nor Q and the output) per second (1e9 bytes), for every contender "
        "alike; % copy: that over the run's copy rate (bytes read + written: 100% reads the "
        "valid cache in the time a copy of it takes). TFLOP/s count 4·H_q·D per attended "
        "(query, key) pair of the valid keys. `tiledattention` rows time the decode family's "
        "paged launch (the kernels read the pages in place; what the tuner times). "
        "Contenders besides tiledattention's: `torch-varlen-paged` "
        "(`torch.nn.attention.varlen.varlen_attn` on the pools with `block_table=` and "
        "`seqused_k=`, where the installed torch's takes a block table) and "
        "`cudnn-padded-cache` (SDPA's cuDNN backend on the caches gathered into a batch "
        "padded to the longest, `[B, H_kv, L, D]`, with a boolean key-padding mask "
        "`[B, 1, 1, L]` and `enable_gqa=True`, both built outside the timing: what a "
        "serving user without a paged kernel runs). Every one is checked against the "
        "float32 reference before timing (rel L2 error within the family's tolerance). A "
        "`÷ X` column is X's time over the contender's (> 1: the contender is faster). Rows "
        "that are not numbers name the status; the notes give the reasons.")
    return Layout(title=f"{base.title}: paged K/V cache", intro=intro, label=_paged_label,
                  sections=(_header, _per_point, _copy_share, _means, _schedules, _notes),
                  phases=base.phases[:1], time=base.time, tflops_digits=base.tflops_digits,
                  bandwidth=True, baselines=present, means=present)


def _with_fa4(layout: Layout, contenders: Sequence[str]) -> Layout:
    """``layout`` with FlashAttention-4 as one more baseline of its per-point speed-ups and
    geometric means where the rows have it and the layout has baselines."""
    if FA4 not in contenders or not layout.baselines or any(
            FA4 in names for _, names in layout.baselines):
        return layout
    return dataclasses.replace(layout, baselines=layout.baselines + _FA4,
                               means=layout.means + _FA4 if layout.means else layout.means)


def render_markdown(results: Sequence[BenchResult], info: RunInfo) -> str:
    """The summary of ``results`` in the layout of their family."""
    return "\n".join(_render(results, info).lines)


def _render(results: Sequence[BenchResult], info: RunInfo) -> _Doc:
    kernel = kernel_of(results)
    layout = (paged_layout(kernel, contenders_of(results)) if any(r.page_size for r in results)
              else ragged_layout(kernel, contenders_of(results))
              if any(r.ragged for r in results)
              else variant_layout(kernel, contenders_of(results))
              if any(r.variant for r in results) else LAYOUTS.get(kernel, LAYOUTS["forward"]))
    doc = _Doc(results, info, _with_fa4(layout, contenders_of(results)), kernel)
    for section in doc.layout.sections:
        section(doc)
    return doc


def write_summary(results: Sequence[BenchResult], info: RunInfo,
                  path: str | os.PathLike) -> Path:
    path = Path(path)
    write_text_atomic(path, render_markdown(results, info))
    return path


def rich_tables(results: Sequence[BenchResult], info: RunInfo) -> list[Any]:
    """The summary's tables as rich tables (statuses coloured), for the terminal."""
    from rich.table import Table
    from rich.text import Text

    styles = {"wrong": "red", "unavailable": "dim", "skipped": "dim"}
    tables = []
    for title, head, rows in _render(results, info).tables:
        table = Table(title=f"{title} (tiledtune bench --kernel {kernel_of(results)})")
        for i, column in enumerate(head):
            table.add_column(column, justify="left" if i < 2 else "right")
        for cells in rows:
            table.add_row(*(Text(c, style=styles.get(c, "")) for c in cells))
        tables.append(table)
    return tables
