"""Which schedule ``sdpa`` runs: the resolution chain over tuned results.

Order (the first step that answers wins; ``Resolution.source`` names it):

1. ``exact-device``: a row for this exact key measured on a GPU with this device name;
2. ``exact-arch``: a row for this exact key from another GPU of the same architecture;
3. ``nearest``: the closest tuned shape of the same architecture with the same dtype, causal
   flag, head dim and GQA ratio. Distance: ``|log2 S_q - log2 S_q'| + |log2 S_k - log2 S_k'| +
   0.5·|log2(B·H_q) - log2(B'·H_q')|`` (sequence length moves the best tiles more than batch or
   heads do); ties go to the faster row;
4. ``shipped``: the same three steps over the pre-tuned table packaged with tiledattention;
5. ``default``: the per-architecture default of ``search_spaces``.

Rows whose kernel-template hash differs from the running template are skipped (their timings
describe other code), as are rows whose schedule no longer validates (each with one warning).
A database that cannot be read gives one warning naming it; lookups then go on without it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from ._device import DeviceInfo
from .forward._problem import Problem
from ._provenance import Provenance, template_hash
from .forward._schedule import Schedule

__all__ = ["Resolution", "Resolver", "SOURCES", "shape_distance"]

SOURCES = ("exact-device", "exact-arch", "nearest", "shipped", "default")


@dataclass(frozen=True)
class Resolution:
    schedule: Schedule
    source: str  # one of SOURCES
    detail: str  # e.g. the tuned shape a "nearest" answer came from, or the database file


class _Row(Protocol):  # what the resolver needs of a stored row (``db.ScheduleRow``)
    device_name: str
    problem: Problem
    schedule: Schedule
    median_ms: float
    provenance: Provenance


def shape_distance(a: Problem, b: Problem) -> float:
    return (abs(math.log2(a.seqlen_q) - math.log2(b.seqlen_q))
            + abs(math.log2(a.seqlen_k) - math.log2(b.seqlen_k))
            + 0.5 * abs(math.log2(a.batch * a.heads_q) - math.log2(b.batch * b.heads_q)))


def _comparable(a: Problem, b: Problem) -> bool:
    return (a.dtype == b.dtype and a.causal == b.causal and a.head_dim == b.head_dim
            and a.group_size == b.group_size)


def pick(rows: Iterable[_Row], problem: Problem, device_name: str) -> tuple[_Row, str] | None:
    """Steps 1-3 over ``rows`` (already restricted to one architecture)."""
    candidates = [r for r in rows if _comparable(r.problem, problem)]
    exact = [r for r in candidates if r.problem == problem]
    same_device = [r for r in exact if r.device_name == device_name]
    if same_device:
        return min(same_device, key=lambda r: r.median_ms), "exact-device"
    if exact:
        return min(exact, key=lambda r: r.median_ms), "exact-arch"
    if candidates:
        best = min(candidates, key=lambda r: (shape_distance(r.problem, problem), r.median_ms))
        return best, "nearest"
    return None


class Resolver:
    """Resolves schedules from a user database, then the shipped table, then the defaults.

    ``open_user`` / ``open_shipped`` return an object with ``rows(arch=..., dtype=..., causal=...,
    head_dim=...)`` (a ``db.ScheduleDB``), or ``None`` when there is none; each is called at most
    once, on the first lookup that needs it. ``default`` maps (arch, problem) to a schedule.
    """

    def __init__(self, *, open_user: Callable[[], object | None],
                 open_shipped: Callable[[str], object | None],
                 default: Callable[[str, Problem], Schedule]) -> None:
        self._open_user = open_user
        self._open_shipped = open_shipped
        self._default = default
        self._sources: dict[str, object | None] = {}

    def _source(self, name: str, arch: str) -> object | None:
        key = name if name == "user" else f"shipped:{arch}"
        if key not in self._sources:
            try:
                self._sources[key] = (self._open_user() if name == "user"
                                      else self._open_shipped(arch))
            except Exception as exc:  # an unreadable database must not stop attention
                warnings.warn(f"tiledattention: ignoring the schedule database: {exc}",
                              RuntimeWarning, stacklevel=4)
                self._sources[key] = None
        return self._sources[key]

    def _rows(self, source: object, arch: str, problem: Problem) -> list[_Row]:
        try:
            rows = source.rows(arch=arch, dtype=problem.dtype, causal=problem.causal,
                               head_dim=problem.head_dim)
        except Exception as exc:
            warnings.warn(f"tiledattention: cannot read schedules from {source}: {exc}",
                          RuntimeWarning, stacklevel=4)
            return []
        current = template_hash()
        return [r for r in rows if r.provenance.template_hash == current]

    def __call__(self, problem: Problem, device: DeviceInfo) -> Resolution:
        user = self._source("user", device.arch)
        if user is not None:
            found = pick(self._rows(user, device.arch, problem), problem, device.name)
            if found:
                row, step = found
                return Resolution(row.schedule, step, f"{row.problem.describe()} in {user}")
        shipped = self._source("shipped", device.arch)
        if shipped is not None:
            found = pick(self._rows(shipped, device.arch, problem), problem, device.name)
            if found:
                row, step = found
                return Resolution(row.schedule, "shipped",
                                  f"{step}: {row.problem.describe()} ({row.device_name})")
        return Resolution(self._default(device.arch, problem), "default",
                          f"search_spaces default for {device.arch}")
