"""The one place that reads the environment. Two settings: ``TILEDATTN_DB`` and
``TILEDATTN_LOCK_WAIT``."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["database_location", "simulated_database_location", "cubin_cache", "lock_wait_s",
           "check_location", "DB_ENV_VAR", "LOCK_WAIT_ENV_VAR"]

DB_ENV_VAR = "TILEDATTN_DB"
LOCK_WAIT_ENV_VAR = "TILEDATTN_LOCK_WAIT"


def _cache() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache) / "tiledattention"


def database_location() -> str:
    """The user's schedule database: ``$TILEDATTN_DB`` (a file path or an SQLAlchemy URL), else
    ``$XDG_CACHE_HOME/tiledattention/schedules.sqlite`` (``~/.cache`` by default)."""
    value = os.environ.get(DB_ENV_VAR, "").strip()
    if value:
        return value
    return str(_cache() / "schedules.sqlite")


def cubin_cache() -> Path:
    """Where ``tiledtune warm`` keeps the cubin bundles it builds for this machine's calls, and
    the runtime reads them: ``cubins/`` in the cache (``$XDG_CACHE_HOME/tiledattention``)."""
    return _cache() / "cubins"


def simulated_database_location() -> str:
    """Where ``tiledtune search --backend simulated`` stores results when no ``--db`` is named:
    a file of its own that the runtime never reads (``simulated-schedules.sqlite`` in the
    cache)."""
    return str(_cache() / "simulated-schedules.sqlite")


def lock_wait_s() -> float | None:
    """``$TILEDATTN_LOCK_WAIT``: seconds a schedule database waits, in all, for a lock another
    process holds before it gives up (``None`` when unset: the database's default, a few
    seconds); :class:`~tiledattention.errors.InputValueError` when it is not a number >= 0."""
    import math

    from ..errors import InputValueError

    text = os.environ.get(LOCK_WAIT_ENV_VAR, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise InputValueError(f"{LOCK_WAIT_ENV_VAR} must be a number of seconds >= 0 (the "
                              f"longest wait for another process's database lock); got {text!r}")
    return value


def check_location(location: object, where: str) -> str | None:
    """``location`` as a database location (a path as ``str`` or ``os.PathLike``, an SQLAlchemy
    URL, or ``None`` for the default); :class:`~tiledattention.errors.InputTypeError` naming
    ``where`` when it is of another type, :class:`~tiledattention.errors.InputValueError` when
    it is blank."""
    from ..errors import InputTypeError, InputValueError

    if location is None:
        return None
    text = os.fspath(location) if isinstance(location, os.PathLike) else location
    if not isinstance(text, str):
        raise InputTypeError(f"{where} must be a path (str or os.PathLike), an SQLAlchemy URL "
                             f"string, or None for the default database; got "
                             f"{type(location).__name__}")
    if not text.strip():
        raise InputValueError(f"{where} must be a path or an SQLAlchemy URL, or None for the "
                              f"default database; got {location!r}")
    return text
