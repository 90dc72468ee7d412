"""Module globals that import their module on first use.

``import tiledattention`` (and the tools that only read schedules: ``tiledtune list``,
``explain``, ``export``) must not pay for cuda.tile, numpy and the kernels, about a third of a
command's start-up. A module that launches kernels binds ``ct = lazy_module("cuda.tile",
globals(), "ct")``: the first attribute read (``ct.launch``) imports cuda.tile and puts the
module itself in that global, so every later read is a plain module global's, with nothing in
between on the warm path.

Kernel modules are not bound so: a launcher imports its kernels by name inside the function
that launches or compiles them (``from ._kernel import attention_fwd``), which an editor can
follow, and which costs nothing once the module is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["lazy_module"]


class _LazyModule:
    __slots__ = ("_name", "_namespace", "_alias")

    def __init__(self, name: str, namespace: dict, alias: str) -> None:
        self._name = name
        self._namespace = namespace
        self._alias = alias

    def __getattr__(self, attribute: str) -> Any:
        module = importlib.import_module(self._name)
        self._namespace[self._alias] = module
        return getattr(module, attribute)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def lazy_module(name: str, namespace: dict, alias: str) -> Any:
    """A stand-in for module ``name`` to bind as ``namespace[alias]`` (a module's
    ``globals()``): its first attribute read imports the module and rebinds the global."""
    return _LazyModule(name, namespace, alias)
