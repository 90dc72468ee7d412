"""Results of ``tiledtune bench``: the record of one measurement, its CSV form and the markdown
summary.

Everything here works on a list of :class:`BenchResult` (one per contender × grid point) and
never touches a GPU, so reports can be tested on synthetic results and re-rendered from a CSV
(``load_results``). The PNG plots are in ``_plots``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable, Sequence

from db import write_bytes_atomic, write_text_atomic

from ._grid import CONTENDERS

__all__ = [
    "BenchResult", "RunInfo", "COPY_BYTES", "MATMUL_SIZE", "STATUSES", "CSV_COLUMNS", "by_point",
    "contenders_of", "geomean", "header_lines", "load_results", "ratio_table",
    "render_markdown", "write_csv", "write_run_info", "write_summary",
]

#: ``ok``: measured and correct; ``wrong``: ran but failed the accuracy check (not timed);
#: ``unavailable``: raised (unsupported shape, no kernel, out of memory...); ``skipped``: not
#: run on purpose (e.g. the S×S scores would not fit the memory budget).
STATUSES = ("ok", "wrong", "unavailable", "skipped")
#: Side of the square bf16 matrix product whose rate the summary compares with.
MATMUL_SIZE = 8192
#: Bytes of the device-to-device copy whose rate the decode summary compares with (1 GiB).
COPY_BYTES = 1 << 30
_REFERENCE = "tiledattention"  # the ratio tables compare this contender with every other


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """One contender at one grid point. Timing fields are ``None`` unless ``status == "ok"``.

    ``heads`` is H_q and ``seqlen`` S_k; ``heads_kv`` and ``seqlen_q`` are ``None`` in the
    forward grid's rows (self-attention: H_kv = H_q, S_q = S_k), set in the decode grid's."""

    contender: str
    status: str
    reason: str = ""
    kernel: str = "forward"  # the family whose grid the row belongs to (``--kernel``)
    #: what was timed when a grid times more than one thing per contender and point (the
    #: backward grid: "backward" or "forward+backward"); "" for the forward and decode grids
    phase: str = ""
    batch: int
    heads: int
    heads_kv: int | None = None
    seqlen_q: int | None = None
    seqlen: int
    head_dim: int
    dtype: str
    causal: bool
    bottom_right: bool = False  # causal aligned bottom-right (torch's causal_lower_right)
    median_ms: float | None = None
    spread_ms: float | None = None
    samples: int | None = None
    tflops: float | None = None
    gbps: float | None = None  # Q+K+V read and the output written, once each, per second / 1e9
    rel_err: float | None = None
    schedule: str = ""  # Schedule.describe() of tiledattention rows
    lookup_source: str = ""  # Resolution.source ("exact-device", ..., "default"), or "forced"
    lookup_detail: str = ""
    device: str = ""
    arch: str = ""
    driver: str = ""
    torch_version: str = ""
    cuda_tile_version: str = ""
    sm_clock: str = ""  # as nvidia-smi reports it, e.g. "1980 MHz"; "" when unknown
    mem_clock: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"BenchResult.status must be one of {STATUSES}; "
                             f"got {self.status!r}")
        if self.status == "ok" and (self.tflops is None or self.median_ms is None):
            raise ValueError("an ok BenchResult needs median_ms and tflops")

    @property
    def key(self) -> tuple[str, int, bool, int]:
        """(dtype, head_dim, causal, seqlen): the grid point (B and H follow from the grid)."""
        return (self.dtype, self.head_dim, self.causal, self.seqlen)

    @property
    def mask(self) -> str:
        return ("causal-br" if self.bottom_right else "causal") if self.causal else "full"

    @property
    def note(self) -> str:
        """``status: reason`` for rows that were not measured."""
        return f"{self.status}: {self.reason}" if self.reason else self.status


CSV_COLUMNS = tuple(f.name for f in fields(BenchResult))
_INT_FIELDS = ("batch", "heads", "heads_kv", "seqlen_q", "seqlen", "head_dim", "samples")
_FLOAT_FIELDS = ("median_ms", "spread_ms", "tflops", "gbps", "rel_err")
_BOOL_FIELDS = ("causal", "bottom_right")


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """What the summary header says about the run besides what the rows carry."""

    command: str
    date: str
    #: bf16 matrix-product rates measured in the run (before and after the grid), TFLOP/s
    matmul_tflops: tuple[float, ...] = ()
    #: device-to-device copy rates measured in the run (before and after the grid), GB/s of
    #: bytes read plus bytes written
    copy_gbps: tuple[float, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "RunInfo":
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("run info must be a JSON object")
        return cls(command=str(data.get("command", "")), date=str(data.get("date", "")),
                   matmul_tflops=tuple(float(x) for x in data.get("matmul_tflops", ())),
                   copy_gbps=tuple(float(x) for x in data.get("copy_gbps", ())))


# -- CSV -----------------------------------------------------------------------------------------

def write_csv(results: Iterable[BenchResult], path: str | os.PathLike) -> Path:
    """Write one row per result (atomically); floats keep full precision (``repr``)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for result in results:
        row = asdict(result)
        for name, value in row.items():
            if value is None:
                row[name] = ""
            elif isinstance(value, bool):
                row[name] = "yes" if value else "no"
            elif isinstance(value, float):
                row[name] = repr(value)
        writer.writerow(row)
    path = Path(path)
    write_bytes_atomic(path, buffer.getvalue().encode())
    return path


def load_results(path: str | os.PathLike) -> list[BenchResult]:
    """Read a CSV written by :func:`write_csv` back into results (to re-render reports)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read bench results {path}: {exc.strerror}") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in ("contender", "status", "batch", "heads", "seqlen", "head_dim",
                           "dtype", "causal") if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"{path} is not a tiledtune bench CSV: it lacks columns {missing}")
    known = set(CSV_COLUMNS)
    results = []
    for line, row in enumerate(reader, start=2):
        values: dict = {}
        try:
            for name, raw in row.items():
                if name not in known:
                    continue  # a column of a newer version: ignore it
                raw = raw or ""
                if name in _INT_FIELDS:
                    values[name] = int(raw) if raw else None
                elif name in _FLOAT_FIELDS:
                    values[name] = float(raw) if raw else None
                elif name in _BOOL_FIELDS:
                    if raw == "" and name != "causal":
                        continue  # left empty: the field's default
                    if raw not in ("yes", "no"):
                        raise ValueError(f"{name} must be yes or no; got {raw!r}")
                    values[name] = raw == "yes"
                elif name == "kernel" and not raw:
                    continue
                else:
                    values[name] = raw
            results.append(BenchResult(**values))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}, line {line}: {exc}") from None
    return results


# -- numbers -------------------------------------------------------------------------------------

def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def contenders_of(results: Sequence[BenchResult], order: Sequence[str] = CONTENDERS
                  ) -> list[str]:
    """The contenders present in ``results``: known ones in ``order`` (default the forward
    grid's ``CONTENDERS``), then others by name."""
    present = {r.contender for r in results}
    return [c for c in order if c in present] + sorted(present - set(order))


def by_point(results: Sequence[BenchResult]) -> dict[tuple, dict[str, BenchResult]]:
    """``{BenchResult.key: {contender: result}}``: the results of each grid point."""
    table: dict[tuple, dict[str, BenchResult]] = defaultdict(dict)
    for r in results:
        table[r.key][r.contender] = r
    return table


def ratio_table(results: Sequence[BenchResult], reference: str = _REFERENCE
                ) -> dict[tuple[int, bool], dict[str, float | None]]:
    """Geometric mean over dtypes and sequence lengths of ``TFLOP/s(reference) / TFLOP/s(c)``
    per (head_dim, causal) and contender ``c``; points where either is not ok are left out
    (``None`` when no point is left)."""
    ratios: dict[tuple[int, bool], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (dtype, d, causal, s), row in by_point(results).items():
        ref = row.get(reference)
        for name, r in row.items():
            if name == reference:
                continue
            ratios[(d, causal)][name]  # keep the column even when nothing is comparable
            if ref is not None and ref.status == "ok" and r.status == "ok":
                ratios[(d, causal)][name].append(ref.tflops / r.tflops)
    return {key: {name: geomean(vals) for name, vals in per.items()}
            for key, per in sorted(ratios.items())}


# -- markdown ------------------------------------------------------------------------------------

def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _cell(r: BenchResult | None) -> str:
    if r is None:
        return ""
    if r.status == "ok":
        return f"{r.tflops:.1f}"
    return r.status


def _unique(values: Iterable[str]) -> str:
    seen = [v for v in dict.fromkeys(values) if v]
    return ", ".join(seen) if seen else "unknown"


def header_lines(results: Sequence[BenchResult], info: RunInfo, title: str, points: int,
                 contenders: Sequence[str]) -> list[str]:
    """The summary's title and run description (command, date, device, versions, clocks)."""
    return [
        f"# {title}", "",
        f"- command: `{info.command}`",
        f"- date: {info.date}",
        f"- device: {_unique(r.device for r in results)} ({_unique(r.arch for r in results)})",
        f"- driver: {_unique(r.driver for r in results)}; torch "
        f"{_unique(r.torch_version for r in results)}; cuda-tile "
        f"{_unique(r.cuda_tile_version for r in results)}",
        f"- GPU clocks (SM / memory): {_unique(r.sm_clock for r in results)} / "
        f"{_unique(r.mem_clock for r in results)}",
        f"- points: {points}; contenders: {', '.join(contenders)}",
    ]


def render_markdown(results: Sequence[BenchResult], info: RunInfo) -> str:
    """The summary: header, TFLOP/s per (dtype, D, mask), ratios, geomeans, notes."""
    contenders = contenders_of(results)
    index = by_point(results)
    lines = header_lines(results, info, "tiledattention benchmark", len(index), contenders)
    if info.matmul_tflops:
        lines.append(f"- bf16 matrix product ({MATMUL_SIZE}³, torch.matmul), measured in this run "
                     "before and after the grid: "
                     + " / ".join(f"{x:.1f}" for x in info.matmul_tflops) + " TFLOP/s")
    lines += [
        "",
        "TFLOP/s counts 4·B·H·S_q·S_k·D, only the unmasked part when causal (higher is better). "
        f"A ratio column is TFLOP/s of `{_REFERENCE}` over the contender's (> 1: "
        f"`{_REFERENCE}` is faster). Cells that are not numbers name the status; the notes "
        "at the end give the reasons.",
        "",
    ]
    others = [c for c in contenders if c != _REFERENCE]
    has_ref = _REFERENCE in contenders
    groups = sorted({(k[0], k[1], k[2]) for k in index}, key=lambda g: (g[0], g[1], g[2]))
    for dtype, d, causal in groups:
        keys = sorted(k for k in index if k[:3] == (dtype, d, causal))
        mask = "causal" if causal else "full"
        lines += [f"## {dtype}, D={d}, {mask}", ""]
        head = ["S", "B×H"] + contenders + ([f"÷ {c}" for c in others] if has_ref else [])
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for key in keys:
            row = index[key]
            any_row = next(iter(row.values()))
            cells = [str(key[3]), f"{any_row.batch}×{any_row.heads}"]
            cells += [_cell(row.get(c)) for c in contenders]
            if has_ref:
                ref = row.get(_REFERENCE)
                for c in others:
                    r = row.get(c)
                    ok = ref is not None and r is not None and ref.status == r.status == "ok"
                    cells.append(f"{ref.tflops / r.tflops:.2f}" if ok else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        schedules = [(k[3], index[k][_REFERENCE]) for k in keys
                     if _REFERENCE in index[k] and index[k][_REFERENCE].schedule]
        if schedules:
            lines.append("Schedules of `tiledattention`: " + "; ".join(
                f"S={s}: {r.schedule} ({r.lookup_source})" for s, r in schedules) + ".")
            lines.append("")

    if has_ref and others:
        table = ratio_table(results)
        lines += [f"## Geometric mean of `{_REFERENCE}` ÷ contender (over dtypes and S)", ""]
        head = ["D", "mask"] + others
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (d, causal), per in table.items():
            cells = [str(d), "causal" if causal else "full"]
            cells += [_fmt(per.get(c), 2) for c in others]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")

    if has_ref and info.matmul_tflops:
        lines += _matmul_fraction_section(index, max(info.matmul_tflops))

    notes = [r for r in results if r.status != "ok"]
    if notes:
        lines += ["## Notes", ""]
        for r in sorted(notes, key=lambda r: (r.key, contenders.index(r.contender))):
            lines.append(f"- {r.contender}, {r.dtype} D={r.head_dim} {r.mask} S={r.seqlen} "
                         f"(B={r.batch}, H={r.heads}): {r.note}")
        lines.append("")
    return "\n".join(lines)


def _matmul_fraction_section(index, matmul: float) -> list[str]:
    """`tiledattention`'s TFLOP/s as a share of the (faster) matrix-product rate of the run."""
    seqlens = sorted({k[3] for k in index})
    lines = [f"## `{_REFERENCE}` as a share of the matrix-product rate ({matmul:.1f} TFLOP/s)",
             "", "| dtype | D | mask | " + " | ".join(f"S={s}" for s in seqlens) + " |",
             "|" + "---|" * (3 + len(seqlens))]
    for dtype, d, causal in sorted({k[:3] for k in index}):
        cells = [dtype, str(d), "causal" if causal else "full"]
        for s in seqlens:
            r = index.get((dtype, d, causal, s), {}).get(_REFERENCE)
            cells.append(f"{100 * r.tflops / matmul:.0f}%" if r is not None and r.status == "ok"
                         else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def write_run_info(info: RunInfo, path: str | os.PathLike) -> Path:
    path = Path(path)
    write_text_atomic(path, info.to_json() + "\n")
    return path


def write_summary(results: Sequence[BenchResult], info: RunInfo,
                  path: str | os.PathLike) -> Path:
    path = Path(path)
    write_bytes_atomic(path, render_markdown(results, info).encode())
    return path
