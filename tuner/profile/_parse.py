"""Nsight Compute's raw CSV page (``ncu --import REPORT --csv --page raw``) into one record per
profiled kernel launch: a header row of metric names, a row of their units, then one row per
launch. Numbers come with thousands separators ("1,287,456") and, unless ncu printed base
units, scaled units ("us", "Mbyte"): records hold times in ns and sizes in bytes."""

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
        """The kernel's name without cuTile's specialisation suffix (``_Kt2_A4bf16_...``)."""
        return re.split(r"_Kt\d+(?:_|$)|_[A-Z]\d", self.name, maxsplit=1)[0] or self.name

    def number(self, metric: str) -> float | None:
        value = self.values.get(metric)
        return value if isinstance(value, float) else None


#: unit prefixes ncu scales numbers by (its "auto" units; ``--print-units base`` prints none):
#: unit -> (base unit, factor)
_SCALED = {"ns": ("ns", 1.0), "nsecond": ("ns", 1.0), "us": ("ns", 1e3), "usecond": ("ns", 1e3),
           "ms": ("ns", 1e6), "msecond": ("ns", 1e6), "s": ("ns", 1e9), "second": ("ns", 1e9),
           "byte": ("byte", 1.0), "Kbyte": ("byte", 1e3), "Mbyte": ("byte", 1e6),
           "Gbyte": ("byte", 1e9), "Tbyte": ("byte", 1e12),
           "byte/block": ("byte/block", 1.0), "Kbyte/block": ("byte/block", 1e3),
           "Mbyte/block": ("byte/block", 1e6)}


def _value(text: str, unit: str) -> tuple[float | str, str]:
    """``text`` as a number in the base unit of ``unit`` (ns, bytes), and that unit."""
    text = text.strip()
    try:
        number = float(text.replace(",", ""))
    except ValueError:
        return text, unit
    base, factor = _SCALED.get(unit, (unit, 1.0))
    return number * factor, base


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
        units = units + [""] * (len(header) - len(units))
        read = {name: _value(cell, unit) for name, cell, unit in zip(header, row, units)}
        values = {name: value for name, (value, _) in read.items()}
        records.append(KernelRecord(name=str(values["Kernel Name"]), values=values,
                                    units={name: unit for name, (_, unit) in read.items()}))
    if not records:
        raise UnreadableFile(f"{source}: the raw page lists no kernel launch (no kernel ran "
                             f"between cudaProfilerStart and cudaProfilerStop?)")
    return records
