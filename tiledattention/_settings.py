"""The one place that reads the environment. One setting: ``TILEDATTN_DB``."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["database_location", "simulated_database_location", "DB_ENV_VAR"]

DB_ENV_VAR = "TILEDATTN_DB"


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


def simulated_database_location() -> str:
    """Where ``tiledtune search --backend simulated`` stores results when no ``--db`` is named:
    a file of its own that the runtime never reads (``simulated-schedules.sqlite`` in the
    cache)."""
    return str(_cache() / "simulated-schedules.sqlite")
