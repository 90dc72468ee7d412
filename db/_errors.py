"""Errors of the schedule database (part of tiledattention's exception hierarchy)."""

from __future__ import annotations

from tiledattention.errors import TiledAttentionError

__all__ = ["DatabaseUnavailable", "SchemaTooNew"]


class DatabaseUnavailable(TiledAttentionError, RuntimeError):
    """A schedule database cannot be opened or read: not SQLite, corrupt, or not ours.

    The message names the file (or the URL, password masked) and says what was wrong.
    """


class SchemaTooNew(TiledAttentionError, RuntimeError):
    """The database was written by a newer tiledattention: it can be read, not written."""
