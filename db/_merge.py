"""The rule that decides whether an incoming row replaces the stored row of its key: a row the
runtime would use is never replaced by one it would ignore; otherwise the faster row of one
toolchain wins."""

from __future__ import annotations

import math
from typing import Any

from ._rows import Provenance, ScheduleRow

__all__ = ["verdict"]


def verdict(stored: Any, row: ScheduleRow, current: Provenance | None) -> tuple[str, str]:
    """What ``ScheduleDB.merge`` does with ``row`` over the ``stored`` record."""
    mine = row.provenance.toolchain()
    theirs = (stored["template_hash"], stored["cuda_tile"], stored["tileiras"])
    if current is not None:
        def usable(backend: str, template: str) -> bool:
            return backend == "gpu" and template == current.template_hash

        row_ok = usable(row.backend, mine[0])
        stored_ok = usable(stored["backend"], theirs[0])
        if row_ok and not stored_ok:
            return "replaced", (f"the stored row was {stored['backend']}-measured with template "
                                f"{theirs[0]}, which the runtime ignores")
        if not row_ok:
            why = ("simulated" if row.backend != "gpu"
                   else f"tuned with template {mine[0]}, not the current {current.template_hash}")
            return "skipped", f"the runtime would ignore it: {why}"
    elif row.backend != stored["backend"]:
        return ("replaced", "a GPU measurement over a simulated one") if row.backend == "gpu" \
            else ("skipped", "a simulated measurement never replaces a GPU one")
    if mine != theirs:
        now = None if current is None else current.toolchain()
        if now is not None and mine == now:
            return "replaced", f"the stored row was measured with another toolchain {theirs}"
        if now is not None and theirs == now:
            return "skipped", f"measured with another toolchain {mine}"
        return "skipped", (f"its toolchain {mine} differs from the stored row's {theirs}: "
                           "timings not comparable; --force overwrites")
    stored_ms = stored["median_ms"]
    if isinstance(stored_ms, bool) or not isinstance(stored_ms, (int, float)) \
            or not math.isfinite(stored_ms) or stored_ms <= 0:
        # written by hand or by another tool: the readers skip that row (it does not decode)
        return "replaced", f"the stored row's median_ms {stored_ms!r} is not a time in ms"
    if row.median_ms < stored["median_ms"]:
        return "improved", f"{stored['median_ms']:.4g} -> {row.median_ms:.4g} ms"
    return "kept", f"the stored row is as fast ({stored['median_ms']:.4g} ms)"
