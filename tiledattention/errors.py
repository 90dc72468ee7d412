"""The exception hierarchy of tiledattention: catch ``TiledAttentionError`` to catch ours (the
schedule database's ``db.DatabaseError`` and the tuner's ``tuner.errors.TunerError`` derive from
it too).

Errors about a caller's input are also ``TypeError`` or ``ValueError`` (what Python code expects
of bad arguments); messages name the argument, what was expected and what came.
"""

from __future__ import annotations

# The root is defined in ``db``, the bottom layer every package imports (``db`` imports nothing
# of ours), so that ``db.DatabaseError`` can derive from it too: one ``except
# TiledAttentionError`` catches the errors of tiledattention, search_spaces, tuner and db.
# This module is its public home.
from db import TiledAttentionError

__all__ = ["TiledAttentionError", "InputTypeError", "InputValueError", "ScheduleError",
           "UnsupportedProblemError", "UnknownFamilyError", "CompileError", "KernelArgumentError",
           "ScheduleDatabaseError", "UnsupportedOperationError", "CompileRequiredError",
           "LaunchOutOfMemoryError"]


class InputTypeError(TiledAttentionError, TypeError):
    """An argument has the wrong type (a tensor of another library, a dtype we do not take...)."""


class InputValueError(TiledAttentionError, ValueError):
    """An argument has the right type and a wrong value (a shape, a device, a stride...)."""


class ScheduleError(InputValueError):
    """A schedule value is impossible (names the field, the expected range and the value)."""


class UnsupportedProblemError(InputValueError):
    """The inputs describe an attention problem the kernel does not support."""


class UnknownFamilyError(InputValueError):
    """No kernel family of that name is registered."""


class CompileError(TiledAttentionError, RuntimeError):
    """cuTile / tileiras failed to compile a schedule for an architecture."""


class CompileRequiredError(CompileError):
    """A call needs a kernel that no shipped cubin holds, and compiling is switched off
    (``TILEDATTENTION_JIT=0``); names the kernel and its constants."""


class KernelArgumentError(TiledAttentionError, TypeError):
    """A kernel's launch arguments do not match its signature (a launcher bug or a cuda-tile
    whose kernel objects changed shape)."""


class UnsupportedOperationError(TiledAttentionError, RuntimeError):
    """The operation exists in PyTorch but not (yet) here, e.g. a backward pass."""


class LaunchOutOfMemoryError(TiledAttentionError, RuntimeError):
    """The GPU had no memory left for a kernel's launch (the driver finds a kernel's local
    memory, where its spilled values live, for every thread that may be resident). The
    message begins ``"CUDA out of memory."`` as torch's own do, so code that catches those by
    their text (transformers' and accelerate's batch-size finders) treats it alike; its
    ``__cause__`` is cuTile's error."""


class ScheduleDatabaseError(TiledAttentionError, RuntimeError):
    """A schedule database named by the caller cannot be used (the message says which and why)."""
