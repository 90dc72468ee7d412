"""The tuner's errors: catch :class:`TunerError` for the tuner's, ``TiledAttentionError`` for
every error of the project (``TunerError`` derives from it, and so does ``db.DatabaseError``).

Which error is which, by who can act on it:

- the user (a command line, a file, the environment): :class:`UsageError`,
  :class:`StudyMismatchError`, :class:`StorageError`, :class:`UnreadableFile`,
  :class:`RestampError`, :class:`HubBuildError`, :class:`ProfileUnavailable`. ``tiledtune``
  prints these as one line and exits with status 2
  (:data:`USER_ERRORS` lists them with the runtime's and the database's of the same kind);
- the measurement (a candidate's worker crashed, hung or could not be captured):
  :class:`MeasurementError` and its subclasses. The search turns them into failed trials;
- the calling code: :class:`TunerValueError`, :class:`TunerTypeError`,
  :class:`NotMeasuredError` (a function of the tuner called with arguments it cannot take).
  When one reaches ``tiledtune`` it is a bug: a traceback and exit status 1.

Errors about a value are also ``ValueError`` (a type: ``TypeError``), as Python code expects.
"""

from __future__ import annotations

from db import DatabaseUnavailable, OutputRefused, RecordError, SchemaTooNew
from tiledattention import InputValueError, ScheduleDatabaseError, TiledAttentionError

__all__ = ["TunerError", "UsageError", "StudyMismatchError", "UnreadableFile", "StorageError",
           "RestampError", "HubBuildError", "ProfileUnavailable", "MeasurementError",
           "WorkerDied", "WorkerTimeout",
           "GraphCaptureError", "TunerValueError", "TunerTypeError", "NotMeasuredError",
           "NotRunnable", "USER_ERRORS", "PeerUnavailable"]


class TunerError(TiledAttentionError):
    """Base class of every error the tuner raises on purpose."""


# -- the user's ---------------------------------------------------------------------------

class UsageError(TunerError, ValueError):
    """A bad option or argument of a ``tiledtune`` command, or options that contradict each
    other; the message names the flag and says what to give instead."""


class StudyMismatchError(TunerError, ValueError):
    """An existing study was measured otherwise than this search would measure (another
    backend, device, kernel template or timing mode: ``tuner.search._identity``): its times
    cannot be mixed with new ones."""


class UnreadableFile(TunerError, ValueError):
    """A whole file of rows is rejected (too large, not text, not JSON/CSV, wrong structure)."""


class StorageError(TunerError, RuntimeError):
    """The Optuna study storage (``--storage``, or the SQLite file beside the database) cannot
    be opened; the message names it (password masked) and the reason."""


class RestampError(TunerError, RuntimeError):
    """``restamp`` cannot run the old revision's code (not a git checkout, the old code failed,
    or another copy of the package was imported)."""


class ProfileUnavailable(TunerError, RuntimeError):
    """``tiledtune profile`` cannot profile here (no GPU, no ``ncu``, no permission to read the
    performance counters, or ncu failed): the message says which and how to fix it."""


class HubBuildError(TunerError, RuntimeError):
    """The sources cannot be laid out as a Hub kernel (the message says which file and why)."""


# -- the measurement's --------------------------------------------------------------------

class MeasurementError(TunerError, RuntimeError):
    """A request to the measuring worker process failed; raised as such when the request raised
    in the worker (the message ends with the worker's error)."""


class NotRunnable(MeasurementError):
    """A benchmark contender cannot run here, for a reason known before running it (a torch
    without the function, a problem it does not take)."""


class PeerUnavailable(TunerError, RuntimeError):
    """Another library's benchmark contender (FlashAttention-4) is not installed here: its row
    says ``unavailable`` with this reason."""


class WorkerDied(MeasurementError):
    """The worker process died (or could not start) during a request."""


class WorkerTimeout(MeasurementError):
    """A request to the worker process passed its deadline; the worker was killed."""


class GraphCaptureError(MeasurementError):
    """A launch that cannot be captured into a CUDA graph (graph timing)."""


# -- the calling code's -------------------------------------------------------------------

class TunerValueError(TunerError, ValueError):
    """A tuner function got an argument of the right type and a wrong value (an empty sample, a
    landscape whose schedules do not match its outcomes, ...)."""


class TunerTypeError(TunerError, TypeError):
    """A tuner function got an argument of a type it cannot take."""


class NotMeasuredError(TunerError, KeyError):
    """A schedule picked for a shape has no measured time for that shape (lookup policies'
    regret); a ``KeyError`` as a missing entry is."""

    def __str__(self) -> str:  # KeyError's own would show the message in quotes
        return str(self.args[0]) if self.args else ""


#: What ``tiledtune`` reports as one line ``tiledtune COMMAND: ...`` and exit status 2: errors
#: whose cause is what the user gave (options, problems, files, databases, studies) or their
#: environment, with a message saying what to change. Everything else that escapes a command
#: is a bug (``tuner.cli``).
USER_ERRORS: tuple[type[Exception], ...] = (
    UsageError, StudyMismatchError, StorageError, UnreadableFile, RestampError, HubBuildError,
    ProfileUnavailable, InputValueError, ScheduleDatabaseError, DatabaseUnavailable, SchemaTooNew, RecordError,
    OutputRefused)
