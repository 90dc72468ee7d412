"""Which schedule a kernel family runs: the resolution chain over tuned results.

Order (the first step that answers wins; ``Resolution.source`` names it):

1. ``exact-device``: a row for this exact key measured on a GPU with this device name;
2. ``exact-arch``: a row for this exact key from another GPU of the same architecture;
3. ``nearest``: the closest tuned problem of the same architecture that shares the family's
   lookup fields (``Family.bucket_fields``, e.g. dtype, causal, head dim) and is
   ``Family.comparable``, by ``Family.distance``; ties go to the faster row;
4. ``shipped``: the same three steps over the pre-tuned table packaged with tiledattention;
5. ``default``: the family's per-architecture default.

Rows whose template identity differs from the family's current one are skipped (their timings
describe other code): the first lookup that meets them in a source says so once, with their
count and the commands that carry them over or re-tune them. Rows whose schedule no longer
validates are skipped with one warning each; a database that cannot be read gives one warning
naming it, and lookups go on without it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Iterable, Protocol

import db

from ._device import DeviceInfo
from ._family import Family, codecs
from .errors import InputValueError

__all__ = ["Resolution", "Resolver", "SOURCES", "pick", "shipped_table"]

SOURCES = ("exact-device", "exact-arch", "nearest", "shipped", "default")


@dataclass(frozen=True)
class Resolution:
    schedule: Any
    source: str  # one of SOURCES
    detail: str  # e.g. the tuned shape a "nearest" answer came from, or the database file


class _Source(Protocol):  # a db.ScheduleDB or db.RowTable
    def rows(self, *, family: str, arch: str, like: Any) -> list[db.ScheduleRow]: ...


def pick(family: Family, rows: Iterable[db.ScheduleRow], problem: Any,
         device_name: str) -> tuple[db.ScheduleRow, str] | None:
    """Steps 1-3 over ``rows`` (already of one family, architecture and bucket)."""
    candidates = [r for r in rows if family.comparable(r.problem, problem)]
    exact = [r for r in candidates if r.problem == problem]
    same_device = [r for r in exact if r.device_name == device_name]
    if same_device:
        return min(same_device, key=lambda r: r.median_ms), "exact-device"
    if exact:
        return min(exact, key=lambda r: r.median_ms), "exact-arch"
    if candidates:
        best = min(candidates, key=lambda r: (family.distance(r.problem, problem), r.median_ms))
        return best, "nearest"
    return None


def shipped_table(arch: str) -> db.RowTable | None:
    """The pre-tuned table packaged as ``tiledattention/pretuned/<arch>.json`` (rows of every
    registered family), or ``None``. Rows that no longer decode are skipped with a warning."""
    if not isinstance(arch, str) or not db.ARCH_PATTERN.fullmatch(arch):
        raise InputValueError(f"arch must look like 'sm_90'; got {arch!r}")
    resource = resources.files("tiledattention").joinpath("pretuned", f"{arch}.json")
    if not resource.is_file():
        return None
    return db.load_rows_text(resource.read_text(encoding="utf-8"),
                             f"tiledattention/pretuned/{arch}.json", codecs(), strict=False)


class Resolver:
    """Resolves schedules from a user database, then the shipped table, then the defaults.

    ``open_user`` / ``open_shipped`` return a row source (``db.ScheduleDB`` / ``db.RowTable``)
    or ``None`` when there is none; each is called at most once, on the first lookup that needs
    it.
    """

    def __init__(self, *, open_user: Callable[[], _Source | None],
                 open_shipped: Callable[[str], _Source | None]) -> None:
        self._open_user = open_user
        self._open_shipped = open_shipped
        self._sources: dict[str, _Source | None] = {}
        self._stale_told: set[tuple[str, str, str]] = set()

    def _source(self, name: str, arch: str) -> _Source | None:
        key = name if name == "user" else f"shipped:{arch}"
        if key not in self._sources:
            try:
                self._sources[key] = (self._open_user() if name == "user"
                                      else self._open_shipped(arch))
            except Exception as exc:  # an unreadable database must not stop attention
                warnings.warn(f"tiledattention: ignoring the schedule database: {exc}",
                              RuntimeWarning, stacklevel=5)
                self._sources[key] = None
        return self._sources[key]

    def _rows(self, source: _Source, family: Family, arch: str,
              problem: Any) -> list[db.ScheduleRow]:
        try:
            rows = source.rows(family=family.name, arch=arch, like=problem)
        except Exception as exc:
            warnings.warn(f"tiledattention: cannot read schedules from {source}: {exc}",
                          RuntimeWarning, stacklevel=5)
            return []
        current = family.template_identity()
        fresh = [r for r in rows if r.provenance.template_hash == current]
        if len(fresh) < len(rows):
            self._tell_stale(source, family, arch, len(rows) - len(fresh), current)
        return fresh

    def _tell_stale(self, source: _Source, family: Family, arch: str, count: int,
                    current: str) -> None:
        told = (str(source), family.name, arch)
        if told in self._stale_told:
            return
        self._stale_told.add(told)
        warnings.warn(
            f"tiledattention: skipping {count} {family.name} schedule(s) for {arch} in {source} "
            f"that were tuned with another kernel template (current {current}); "
            f"`tiledtune restamp --from REV` carries over rows whose compiled code is "
            f"unchanged, `tiledtune search --kernel {family.name} ...` re-tunes the others",
            RuntimeWarning, stacklevel=5)

    def __call__(self, family: Family, problem: Any, device: DeviceInfo) -> Resolution:
        user = self._source("user", device.arch)
        if user is not None:
            found = pick(family, self._rows(user, family, device.arch, problem), problem,
                         device.name)
            if found:
                row, step = found
                return Resolution(row.schedule, step, f"{row.problem.describe()} in {user}")
        shipped = self._source("shipped", device.arch)
        if shipped is not None:
            found = pick(family, self._rows(shipped, family, device.arch, problem), problem,
                         device.name)
            if found:
                row, step = found
                return Resolution(row.schedule, "shipped",
                                  f"{step}: {row.problem.describe()} ({row.device_name})")
        return Resolution(family.default_schedule(device.arch, problem), "default",
                          f"{family.name} default for {device.arch}")
