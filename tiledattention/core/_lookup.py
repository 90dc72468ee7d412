"""Which schedule a kernel family runs: the resolution chain over tuned results.

Order (the first step that answers wins; ``Resolution.source`` names it):

1. ``exact-device``: a row of the user database for this exact key, measured on a GPU with this
   device name;
2. ``exact-arch``: a row of the user database for this exact key from another GPU of the same
   architecture;
3. ``shipped``: a row of the pre-tuned table packaged with tiledattention for this exact key;
4. ``nearest``: the closest tuned problem of the same architecture in either source that shares
   the family's lookup bucket (``Family.bucket_fields``, ``match_ratios``) and is
   ``Family.comparable``, by ``Family.distance``, within ``Family.nearest_limit``, whose row
   may transfer to this problem (``Family.transfer_refusal``: it beat the default on its own
   key, its grid's dimensions are close enough, its tiles do not pad this problem much more);
   ties go to the faster row (``detail`` names the problem and the source);
5. ``default``: the family's per-architecture default (``detail`` says why the nearest tuned
   row, if any, did not transfer).

Only rows measured on a GPU count (never the simulated backend's). Rows whose template identity
differs from the family's current one are skipped (their timings describe other code): the first
lookup that meets them in a source says so once, with their count and the commands that carry
them over or re-tune them. The database answers each step with an indexed query
(``ScheduleDB.candidates``), so a lookup costs the same in a small and in a large database. Rows
whose schedule no longer validates are skipped with one warning each; a database that cannot be
read gives one warning naming it, and lookups go on without it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Iterable, Protocol

import db

from ._device import DeviceInfo
from ._family import Family, codecs
from ..errors import InputValueError

__all__ = ["Resolution", "Resolver", "SOURCES", "pick", "shipped_table"]

SOURCES = ("exact-device", "exact-arch", "shipped", "nearest", "default")


@dataclass(frozen=True)
class Resolution:
    schedule: Any
    source: str  # one of SOURCES
    detail: str  # e.g. the tuned shape a "nearest" answer came from, or the database file
    family: str = ""  # the kernel family whose schedule this is


class _Source(Protocol):  # a db.ScheduleDB or db.RowTable
    def candidates(self, family: str, arch: str, problem: Any, *, template: str,
                   limit: int = 8) -> db.Candidates: ...


def pick(family: Family, rows: Iterable[db.ScheduleRow], problem: Any,
         device_name: str) -> tuple[db.ScheduleRow, str] | None:
    """Steps 1, 2 and 4 over ``rows`` (already of one family, architecture and bucket)."""
    candidates = [r for r in rows if r.backend == "gpu" and family.comparable(r.problem, problem)]
    exact = [r for r in candidates if r.problem == problem]
    candidates = [r for r in candidates if family.near_enough(r.problem, problem)]
    same_device = [r for r in exact if r.device_name == device_name]
    if same_device:
        return min(same_device, key=lambda r: r.median_ms), "exact-device"
    if exact:
        return min(exact, key=lambda r: r.median_ms), "exact-arch"
    row, _ = _nearest(family, candidates, problem)
    return None if row is None else (row, "nearest")


def _nearest(family: Family, rows: Iterable[db.ScheduleRow], problem: Any
             ) -> tuple[db.ScheduleRow | None, list[tuple[db.ScheduleRow, str]]]:
    """The closest row (ties: the faster) that may transfer to ``problem``, or ``None``; and
    the closer rows that may not, each with the reason."""
    refused = []
    for row in sorted(rows, key=lambda r: (family.distance(r.problem, problem), r.median_ms)):
        why = family.transfer_refusal(row.problem, row.schedule, row.median_ms, row.default_ms,
                                      problem)
        if why is None:
            return row, refused
        refused.append((row, why))
    return None, refused


def shipped_table(arch: str) -> db.RowTable | None:
    """The pre-tuned table packaged as ``tiledattention/pretuned/<arch>.json`` (rows of every
    registered family), or ``None``. Rows that no longer decode are skipped with a warning."""
    if not isinstance(arch, str) or not db.ARCH_PATTERN.fullmatch(arch):
        raise InputValueError(f"arch must look like 'sm_90'; got {arch!r}")
    resource = resources.files("tiledattention").joinpath("pretuned", f"{arch}.json")
    if not resource.is_file():
        return None
    return _shipped_rows(resource.read_text(encoding="utf-8"),
                         f"tiledattention/pretuned/{arch}.json")


def _shipped_rows(text: str, source: str) -> db.RowTable:
    """The GPU-measured rows of a shipped table's text (a simulated row is never shipped)."""
    table = db.load_rows_text(text, source, codecs(), strict=False)
    return db.RowTable([r for r in table if r.backend == "gpu"], source=source, codecs=codecs())


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

    def _candidates(self, source: _Source, family: Family, arch: str,
                    problem: Any) -> db.Candidates:
        current = family.template_identity()
        try:
            found = source.candidates(family.name, arch, problem, template=current)
        except Exception as exc:
            warnings.warn(f"tiledattention: cannot read schedules from {source}: {exc}",
                          RuntimeWarning, stacklevel=5)
            return db.Candidates([], [], 0)
        if found.stale:
            self._tell_stale(source, family, arch, found.stale, current)
        comparable = [r for r in found.nearest if family.near_enough(r.problem, problem)]
        return db.Candidates(found.exact, comparable, found.stale)

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
        sources = [(name, source) for name in ("user", "shipped")
                   if (source := self._source(name, device.arch)) is not None]
        found = {name: self._candidates(source, family, device.arch, problem)
                 for name, source in sources}
        shown = dict(sources)
        exact = pick(family, found["user"].exact, problem, device.name) \
            if "user" in found else None
        if exact is not None:  # steps 1-2 (pick answers nothing else from exact rows)
            row, step = exact
            return Resolution(row.schedule, step, f"{row.problem.describe()} in {shown['user']}",
                              family.name)
        shipped = found.get("shipped")
        if shipped is not None and shipped.exact:
            row = min(shipped.exact, key=lambda r: r.median_ms)
            return Resolution(row.schedule, "shipped",
                              f"{row.problem.describe()} ({row.device_name})", family.name)
        near = [(r, name) for name, c in found.items() for r in c.nearest]
        row, refused = _nearest(family, [r for r, _ in near], problem)
        if row is not None:
            where = next(name for r, name in near if r is row)
            return Resolution(row.schedule, "nearest",
                              f"{row.problem.describe()} in {shown[where]}", family.name)
        detail = f"{family.name} default for {device.arch}" + (f" ({device.name})"
                                                               if device.name else "")
        if refused:
            closest, why = refused[0]
            detail += (f"; the nearest tuned row ({closest.problem.describe()}) does not "
                       f"transfer: {why}")
        return Resolution(family.device_default(device, problem), "default", detail,
                          family.name)
