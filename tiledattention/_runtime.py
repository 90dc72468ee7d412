"""The runtime's memory: which schedule each (family, problem, device) resolved to, the
launch plans the families' entry points built for call signatures they saw before, and the
scratch buffers (workspaces) their launches reuse.

All are bounded dicts owned by one :class:`Runtime` object (``tiledattention.runtime()``), so
``use_database`` or ``clear()`` forgets them together: at most ``max_resolutions``,
``max_plans`` and ``max_workspaces`` entries (oldest first out), so a process that meets endless
shapes (a decode loop with a growing cache, say) holds a fixed amount of memory.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable

from ._device import DeviceInfo, device_info
from ._family import Family

__all__ = ["Runtime"]


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
