"""What the commands share: how a command says that something went wrong (one line on standard
error, prefixed with the command's name; a message's own line breaks, e.g. SQLite's integrity
report, are joined), and the argument types more than one command takes."""

from __future__ import annotations

import argparse
import sys

__all__ = ["say", "count"]


def say(command: str, message: object) -> None:
    print(f"tiledtune {command}: {' '.join(str(message).split())}", file=sys.stderr)


def count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0; got {text!r}")
    return value
