"""How a command says that something went wrong: one line on standard error, prefixed with the
command's name (a message's own line breaks, e.g. SQLite's integrity report, are joined)."""

from __future__ import annotations

import sys

__all__ = ["say"]


def say(command: str, message: object) -> None:
    print(f"tiledtune {command}: {' '.join(str(message).split())}", file=sys.stderr)
