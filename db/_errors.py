"""Errors of the schedule database, and the root of the project's error hierarchy.

``db`` is the bottom layer: it imports nothing from the rest of the project, and the rest
imports it. The project's root error, :class:`TiledAttentionError`, is therefore defined here
and re-exported by ``tiledattention.errors`` (its public home, where users catch it); every
error of ``db``, ``tiledattention``, ``search_spaces`` and ``tuner`` derives from it, so one
``except TiledAttentionError`` catches them all. ``db``'s own errors derive from
:class:`DatabaseError`; ``tiledattention`` and ``tuner`` turn them into their own errors or
messages where they reach a user.
"""

from __future__ import annotations

__all__ = ["TiledAttentionError", "DatabaseError", "DatabaseUnavailable", "DatabaseLocked",
           "SchemaTooNew",
           "RecordError", "DatabaseArgumentError", "DatabaseMisuse", "OutputRefused"]


class TiledAttentionError(Exception):
    """Base class of every error this project raises on purpose (import it from
    ``tiledattention``)."""


class DatabaseError(TiledAttentionError):
    """Base class of every error ``db`` raises on purpose."""


class DatabaseUnavailable(DatabaseError, RuntimeError):
    """A schedule database cannot be opened or read: not SQLite, corrupt, or not ours.

    The message names the file (or the URL, password masked) and says what was wrong.
    """


class DatabaseLocked(DatabaseUnavailable):
    """Another process held a SQLite database's lock for longer than this one waits
    (``db._locks``): the message names the file, the process holding the lock where it can be
    found, and what to do. A :class:`DatabaseUnavailable`, so whoever reports those as one line
    reports this too."""


class SchemaTooNew(DatabaseError, RuntimeError):
    """The database was written by a newer tiledattention: it can be read, not written."""


class RecordError(DatabaseError, ValueError):
    """A row (or its dict / JSON / CSV form) is malformed; the message names the field."""


class DatabaseArgumentError(DatabaseError, TypeError):
    """A ``db`` function got an argument of the wrong kind (a caller's bug: ``put()`` of
    something not a ``ScheduleRow``, ``rows(like=...)`` without its family, ...)."""


class DatabaseMisuse(DatabaseError, RuntimeError):
    """``db`` used in a way it does not support: a closed store, the migrations run other
    than through ``db._migrate.upgrade``, a row field of a kind the codec does not know."""


class OutputRefused(DatabaseError, OSError):
    """A file write (``write_bytes_atomic`` and the writers built on it) refused before
    anything was written: the path is a directory, a device, a FIFO or a socket (an atomic
    write would replace it with a regular file), or a file this process may not write. An
    ``OSError``, as the failures of the write itself are; the message names the path and what
    it is."""
