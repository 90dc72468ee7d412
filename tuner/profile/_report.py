"""A profile's summary: per kernel and in total, what the table shows (module ``__init__``),
read against the GPU's measured ceilings; the table, the side-by-side comparison of two
profiles, and the JSON document."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _metrics as m
from ._parse import KernelRecord

__all__ = ["Ceilings", "Profile", "profile_table", "compare_table", "paired_rows"]

#: how far apart two values must be (as a ratio) for the comparison to highlight them
DIFFERENT = 0.05


@dataclass(frozen=True)
class Ceilings:
    """The GPU's own ceilings, measured where the profile ran: the bf16 matrix-product rate
    (TFLOP/s) and the device-to-device copy rate (GB/s of bytes read plus written)."""

    tflops: float
    gbps: float


@dataclass(frozen=True)
class Profile:
    """One schedule's launches of one problem under Nsight Compute."""

    label: str  # which schedule: "looked-up", "default", "given"
    family: str
    problem: str  # Problem.describe()
    schedule: str  # Schedule.describe()
    flops: float  # the problem's matrix-product flops (the family's count)
    kernels: tuple[KernelRecord, ...]
    ceilings: Ceilings | None = None
    occupancy_hint: int | None = None

    def rows(self) -> list[dict[str, Any]]:
        """One summary per launch, then ``total`` (times and bytes summed, TFLOP/s of the
        problem's flops over the summed time)."""
        rows = [_summary(k, self.occupancy_hint) for k in self.kernels]
        total_us = sum(r["time_us"] or 0.0 for r in rows)
        dram = sum(r["dram_bytes"] or 0.0 for r in rows)
        total = {"kernel": "total", "time_us": total_us, "dram_bytes": dram,
                 "gbps": dram / total_us / 1e3 if total_us else None,
                 "tflops": self.flops / total_us / 1e6 if total_us else None,
                 "intensity": self.flops / dram if dram else None}
        if len(rows) == 1:
            rows[0].update(tflops=total["tflops"], intensity=total["intensity"])
        for row in rows + [total]:
            if self.ceilings is not None:
                row["tflops_share"] = _share(row.get("tflops"), self.ceilings.tflops)
                row["gbps_share"] = _share(row.get("gbps"), self.ceilings.gbps)
        return rows + [total]

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "family": self.family, "problem": self.problem,
                "schedule": self.schedule, "flops": self.flops,
                "ceilings": None if self.ceilings is None else
                {"tflops": self.ceilings.tflops, "gbps": self.ceilings.gbps},
                "kernels": self.rows()}


def _share(value: float | None, ceiling: float) -> float | None:
    return None if value is None or not ceiling else value / ceiling


def _summary(k: KernelRecord, hint: int | None) -> dict[str, Any]:
    time_ns = k.number(m.TIME)
    time_us = None if time_ns is None else time_ns / 1e3
    dram = sum(k.number(x) or 0.0 for x in (m.DRAM_READ, m.DRAM_WRITE))
    l2 = k.number(m.L2_BYTES)
    limits = {word: k.number(metric) for metric, word in m.OCCUPANCY_LIMITS.items()
              if k.number(metric) is not None}
    blocks = min(limits.values()) if limits else None
    stalls = sorted(((r, k.number(m.stall_metric(r)) or 0.0) for r in m.STALL_REASONS
                     if r != "selected"), key=lambda rv: -rv[1])
    spills = sum(k.number(x) or 0.0 for x in (m.LOCAL_LOAD, m.LOCAL_STORE))
    shared = sum(k.number(x) or 0.0 for x in m.SHARED)
    grid = k.values.get("Grid Size") or k.number(m.GRID)
    return {
        "kernel": k.short_name, "time_us": time_us, "dram_bytes": dram,
        "gbps": dram / time_us / 1e3 if time_us else None,
        "l2_gbps": l2 / time_us / 1e3 if time_us and l2 is not None else None,
        "tensor_pipe_pct": k.number(m.TENSOR_PIPE), "lsu_pipe_pct": k.number(m.LSU_PIPE),
        "l1_pct": k.number(m.L1_THROUGHPUT), "dram_pct": k.number(m.DRAM_THROUGHPUT),
        "l2_pct": k.number(m.L2_THROUGHPUT), "sm_pct": k.number(m.SM_THROUGHPUT),
        "occupancy_pct": k.number(m.ACHIEVED_OCCUPANCY),
        "theoretical_occupancy_pct": k.number(m.THEORETICAL_OCCUPANCY),
        "blocks_per_sm": blocks, "occupancy_hint": hint,
        "limited_by": [w for w, v in limits.items() if v == blocks],
        "registers": k.number(m.REGISTERS), "shared_bytes": shared, "spill_bytes": spills,
        "stalls": [[r, v] for r, v in stalls[:3]],
        "grid": str(grid), "block": str(k.values.get("Block Size") or k.number(m.BLOCK)),
        "cluster": k.number(m.CLUSTER), "waves": k.number(m.WAVES),
    }


# -- rendering ----------------------------------------------------------------------------------
#: (label, row key, format) of each line of the table
LINES = (
    ("time (µs)", "time_us", "{:.1f}"),
    ("TFLOP/s", "tflops", "{:.0f}"),
    ("  of the matmul ceiling", "tflops_share", "{:.0%}"),
    ("DRAM GB/s (read + write)", "gbps", "{:.0f}"),
    ("  of the copy ceiling", "gbps_share", "{:.0%}"),
    ("FLOP per DRAM byte", "intensity", "{:.0f}"),
    ("tensor pipe (% active)", "tensor_pipe_pct", "{:.1f}"),
    ("LSU pipe (% active)", "lsu_pipe_pct", "{:.1f}"),
    ("L1 throughput (%)", "l1_pct", "{:.1f}"),
    ("DRAM throughput (%)", "dram_pct", "{:.1f}"),
    ("L2 throughput (%)", "l2_pct", "{:.1f}"),
    ("L2 GB/s", "l2_gbps", "{:.0f}"),
    ("occupancy achieved (%)", "occupancy_pct", "{:.1f}"),
    ("occupancy theoretical (%)", "theoretical_occupancy_pct", "{:.1f}"),
    ("blocks per SM (limit)", "blocks_per_sm", "{:.0f}"),
    ("  limited by", "limited_by", "{}"),
    ("  occupancy hint", "occupancy_hint", "{}"),
    ("registers per thread", "registers", "{:.0f}"),
    ("shared memory per block (B)", "shared_bytes", "{:.0f}"),
    ("spilled bytes (local ld + st)", "spill_bytes", "{:.0f}"),
    ("top stalls (warps per issue)", "stalls", "{}"),
    ("grid", "grid", "{}"),
    ("block", "block", "{}"),
    ("cluster size", "cluster", "{:.0f}"),
    ("waves per SM", "waves", "{:.2f}"),
)


def _cell(value: Any, fmt: str) -> str:
    if value is None or value == []:
        return "-"
    if isinstance(value, list):
        if value and isinstance(value[0], list):
            return ", ".join(f"{r} {v:.2f}" for r, v in value)
        return ", ".join(map(str, value))
    return fmt.format(value)


def profile_table(profile: Profile):
    """A rich table: one line per measure, one column per launch and the total."""
    from rich.table import Table

    rows = profile.rows()
    table = Table(title=f"{profile.family} {profile.problem} | {profile.schedule} "
                        f"({profile.label})", title_justify="left")
    table.add_column("")
    for row in rows:
        table.add_column(_header(row["kernel"]), justify="right")
    for label, key, fmt in LINES:
        if all(row.get(key) is None for row in rows):
            continue
        table.add_row(label, *[_cell(row.get(key), fmt) for row in rows])
    return table


#: the longest kernel name a table's column header shows whole (library kernels such as
#: cuDNN's run to a hundred characters and more; the JSON keeps them whole)
HEADER_CHARS = 40


def _header(name: str) -> str:
    """``name`` as a column header: its start and its end (where a library's kernel names
    put their tile shape) around an ellipsis when longer than :data:`HEADER_CHARS`."""
    if len(name) <= HEADER_CHARS:
        return name
    head = (HEADER_CHARS - 1) // 2
    return f"{name[:head]}…{name[-(HEADER_CHARS - 1 - head):]}"


def paired_rows(a: Profile, b: Profile) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The rows :func:`compare_table` sets side by side: launch by launch (by position) when
    both profiles launch as many kernels, else each one's longest launch (a PyTorch backend
    may launch other kernels than ours); then the totals."""
    rows_a, rows_b = a.rows(), b.rows()
    if len(rows_a) == len(rows_b):
        return list(zip(rows_a, rows_b))

    def longest(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return max(rows[:-1], key=lambda r: r["time_us"] or 0.0)
    return [(longest(rows_a), longest(rows_b)), (rows_a[-1], rows_b[-1])]


def compare_table(a: Profile, b: Profile):
    """Two profiles of one problem side by side (:func:`paired_rows`); a number that differs
    by more than :data:`DIFFERENT` is highlighted, a text that differs too."""
    from rich.table import Table

    table = Table(title=f"{a.family} {a.problem}: A = {a.schedule} ({a.label}), "
                        f"B = {b.schedule} ({b.label})", title_justify="left")
    table.add_column("")
    pairs = paired_rows(a, b)
    for ra, rb in pairs:
        name = (_header(ra["kernel"]) if ra["kernel"] == rb["kernel"]
                else f"{_header(ra['kernel'])}/{_header(rb['kernel'])}")
        table.add_column(f"{name} A", justify="right")
        table.add_column(f"{name} B", justify="right")
        table.add_column("B/A", justify="right")
    for label, key, fmt in LINES:
        if all(r.get(key) is None for pair in pairs for r in pair):
            continue
        cells = []
        for ra, rb in pairs:
            va, vb = ra.get(key), rb.get(key)
            ratio, differs = "", _cell(va, fmt) != _cell(vb, fmt)
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va:
                ratio = f"{vb / va:.2f}"
                differs = abs(vb / va - 1) > DIFFERENT
            style = "[bold yellow]" if differs else ""
            end = "[/]" if differs else ""
            cells += [f"{style}{_cell(va, fmt)}{end}", f"{style}{_cell(vb, fmt)}{end}",
                      f"{style}{ratio}{end}"]
        table.add_row(label, *cells)
    return table
