"""Errors of the schedule database. ``db`` is persistence and imports nothing from the rest of
the project, so it has its own root, :class:`DatabaseError`; ``tiledattention`` and ``tuner``
turn these into their own errors or messages where they reach a user."""

from __future__ import annotations

__all__ = ["DatabaseError", "DatabaseUnavailable", "SchemaTooNew", "RecordError"]


class DatabaseError(Exception):
    """Base class of every error ``db`` raises on purpose."""


class DatabaseUnavailable(DatabaseError, RuntimeError):
    """A schedule database cannot be opened or read: not SQLite, corrupt, or not ours.

    The message names the file (or the URL, password masked) and says what was wrong.
    """


class SchemaTooNew(DatabaseError, RuntimeError):
    """The database was written by a newer tiledattention: it can be read, not written."""


class RecordError(DatabaseError, ValueError):
    """A row (or its dict / JSON / CSV form) is malformed; the message names the field."""
