"""The runtime's memory: which schedule each (family, problem, device) resolved to, the
launch plans the families' entry points built for call signatures they saw before, and the
scratch buffers (workspaces) their launches reuse.

All are bounded dicts owned by one :class:`Runtime` object (``tiledattention.runtime()``), so
``use_database`` or ``clear()`` forgets them together: at most ``max_resolutions``,
``max_plans`` and ``max_workspaces`` entries (oldest first out), so a process that meets endless
shapes (a decode loop with a growing cache, say) holds a fixed amount of memory.

The process's runtime is this module's (:func:`runtime`, :func:`use_database`; the package
facade re-exports them), so the entry points inside the package reach it without importing the
facade.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable

from ._device import DeviceInfo, device_info
from ._family import Family, codecs
from ._lookup import Resolver, shipped_table
from ._settings import check_location, database_location, lock_wait_s
from ..errors import ScheduleDatabaseError

__all__ = ["Runtime", "runtime", "use_database", "open_database", "current"]


class Runtime:
    """Remembers ``resolve(family, problem, device)``'s answers and the families' launch plans.

    ``resolve`` is called once per (family, problem, device) and its answer kept: a repeated call
    costs a dict lookup.

    ``plan(signature)`` is the plan stored for a call ``signature`` (``None`` when there is
    none): the plan dict's own ``get``, bound once, so a warm call's lookup is one C call with no
    Python frame of ours. ``workspace(key)`` is the same for scratch buffers kept between calls.
    """

    def __init__(self, resolve: Callable[[Family, Any, DeviceInfo], Any], *,
                 max_plans: int = 4096, max_resolutions: int = 4096,
                 max_workspaces: int = 16) -> None:
        self._resolve = resolve
        self._memo: OrderedDict[tuple[str, Any, int], Any] = OrderedDict()
        self._plans: OrderedDict[Hashable, Any] = OrderedDict()
        self.plan: Callable[[Hashable], Any] = self._plans.get  # clear() keeps this dict
        self._workspaces: OrderedDict[Hashable, Any] = OrderedDict()
        self.workspace: Callable[[Hashable], Any] = self._workspaces.get
        self._max_plans = max_plans
        self._max_resolutions = max_resolutions
        self._max_workspaces = max_workspaces

    def resolution(self, family: Family, problem: Any, device_index: int) -> Any:
        key = (family.name, problem, device_index)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._resolve(family, problem, device_info(device_index))
            if len(self._memo) > self._max_resolutions:
                self._memo.popitem(last=False)
        return found

    def sizes(self) -> tuple[int, int]:
        """(resolutions, plans) held now."""
        return len(self._memo), len(self._plans)

    def keep_plan(self, signature: Hashable, plan: Any) -> None:
        self._plans[signature] = plan
        if len(self._plans) > self._max_plans:
            self._plans.popitem(last=False)

    def keep_workspace(self, key: Hashable, buffers: Any) -> None:
        """Keep a call's scratch buffers (``workspace(key)`` returns them), the
        ``max_workspaces`` most recently kept at most: the caller keys them so that no two
        uses of one set can overlap in time (the decode family: by stream and thread)."""
        self._workspaces[key] = buffers
        if len(self._workspaces) > self._max_workspaces:
            self._workspaces.popitem(last=False)

    def clear(self) -> None:
        """Forget resolutions, plans and workspaces (e.g. after new schedules were stored)."""
        self._memo.clear()
        self._plans.clear()
        self._workspaces.clear()


#: The process's runtime (``None`` until first used). Read it as ``_runtime.current`` (a module
#: attribute: ``sdpa``'s warm path reads it without a call) and set it with :func:`use_database`.
current: Runtime | None = None


def open_database(location: str | None = None, *, read_only: bool = False) -> Any:
    """The schedule database at ``location`` (a path or SQLAlchemy URL; ``None``: the default,
    ``$TILEDATTN_DB`` or the user cache) with every registered family's codec: a
    ``db.ScheduleDB``. ``read_only``: ``None`` when a SQLite file does not exist."""
    import db

    location = check_location(location, "open_database(location)")
    where = location if location is not None else database_location()
    wait = lock_wait_s()
    try:
        if read_only:
            return db.ScheduleDB.open_for_lookup(where, codecs=codecs(), lock_wait_s=wait)
        return db.ScheduleDB(where, codecs=codecs(), lock_wait_s=wait)
    except db.DatabaseError as exc:
        raise ScheduleDatabaseError(str(exc)) from exc


def _make_runtime(location: str | None) -> Runtime:
    resolver = Resolver(open_user=lambda: open_database(location, read_only=True),
                        open_shipped=shipped_table)
    return Runtime(resolver)


def runtime() -> Runtime:
    """The process's runtime (created on first use, reading ``TILEDATTN_DB``)."""
    global current
    if current is None:
        current = _make_runtime(None)
    return current


def use_database(location: str | None) -> None:
    """Look schedules up in ``location`` (a path or SQLAlchemy URL; ``None``: the default) from
    now on; forgets memoised lookups."""
    global current
    current = _make_runtime(check_location(location, "use_database(location)"))
