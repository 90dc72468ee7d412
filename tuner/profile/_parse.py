"""Nsight Compute's raw CSV page (``ncu --import REPORT --csv --page raw``) into one record per
profiled kernel launch: a header row of metric names, a row of their units, then one row per
launch. Numbers come with thousands separators ("1,287,456"); "n/a" is missing."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

from ..errors import UnreadableFile

__all__ = ["KernelRecord", "parse_raw_csv"]

_FIRST_COLUMNS = ("ID", "Process ID", "Process Name")


@dataclass(frozen=True)
class KernelRecord:
    """One profiled launch: its kernel's name and every metric ncu reported for it."""

    name: str
    values: dict[str, float | str] = field(repr=False)
    units: dict[str, str] = field(repr=False)

    @property
    def short_name(self) -> str:
        """The kernel's name without cuTile's specialisation suffix (``_A4bf16_...``)."""
        return re.split(r"_[A-Z]\d", self.name, maxsplit=1)[0] or self.name

    def number(self, metric: str) -> float | None:
        value = self.values.get(metric)
        return value if isinstance(value, float) else None


def _value(text: str) -> float | str:
    text = text.strip()
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def parse_raw_csv(text: str, source: str = "ncu output") -> list[KernelRecord]:
    """The launches of ``text``; :class:`UnreadableFile` naming ``source`` when it holds no
    raw page (ncu's own lines before the header are skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith('"' + '","'.join(_FIRST_COLUMNS) + '"')), None)
    if start is None:
        raise UnreadableFile(f"{source} holds no Nsight Compute raw page (a CSV header starting "
                             f"{', '.join(_FIRST_COLUMNS)}): was it written with --csv --page "
                             f"raw?")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, units, launches = rows[0], rows[1] if len(rows) > 1 else [], rows[2:]
    if "Kernel Name" not in header:
        raise UnreadableFile(f"{source}: the raw page has no 'Kernel Name' column")
    records = []
    for row in launches:
        if len(row) != len(header):
            continue  # a line the profiled program printed after the page
        values = {name: _value(cell) for name, cell in zip(header, row)}
        records.append(KernelRecord(name=str(values["Kernel Name"]), values=values,
                                    units=dict(zip(header, units))))
    if not records:
        raise UnreadableFile(f"{source}: the raw page lists no kernel launch (no kernel ran "
                             f"between cudaProfilerStart and cudaProfilerStop?)")
    return records
