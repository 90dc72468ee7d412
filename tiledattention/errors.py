"""The exception hierarchy of tiledattention: catch ``TiledAttentionError`` to catch ours."""

from __future__ import annotations

__all__ = ["TiledAttentionError", "ScheduleError", "UnsupportedProblemError", "CompileError"]


class TiledAttentionError(Exception):
    """Base class of every error this project raises on purpose."""


class ScheduleError(TiledAttentionError, ValueError):
    """A schedule value is impossible (names the field, the expected range and the value)."""


class UnsupportedProblemError(TiledAttentionError, ValueError):
    """The inputs describe an attention problem the kernel does not support."""


class CompileError(TiledAttentionError, RuntimeError):
    """cuTile / tileiras failed to compile a schedule for an architecture."""
