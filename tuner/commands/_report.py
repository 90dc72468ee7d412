"""What the commands share: where output goes, how a command says that something went wrong,
the ``--json`` form of results, and the argument types more than one command takes.

Streams: a command's *results* (its tables, the JSON document of ``--json``, the files it wrote)
go to standard output; progress bars, warnings, notes and errors go to standard error, so
``tiledtune list > rows.txt`` or ``tiledtune search ... --json | jq`` get the results alone.

- :func:`say`: an error or note, one line on standard error prefixed ``tiledtune COMMAND:`` (a
  message's own line breaks, e.g. SQLite's integrity report, are joined).
- :func:`results_console` / :func:`log_console`: rich consoles for standard output / standard
  error. On a terminal they use its width; elsewhere (a pipe, a log file, CI) they have no width
  limit and no colour, so nothing is wrapped at 80 columns.
- :func:`print_table`: a rich table on a console, never cut to ``…``: on a terminal a cell that
  does not fit wraps inside its column; elsewhere the table is printed at its natural width,
  trailing blanks stripped.
- :func:`add_json_option` / :func:`print_json`: ``--json``, and the one JSON document a command
  then prints on standard output (``{"command": ..., "format": JSON_FORMAT, ...}``).
- Argument types that name their accepted range (argparse puts the flag in front of the message):
  :func:`count`, :func:`int_at_least`, :func:`positive_int`, :func:`nonempty`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import sys
from typing import Any, Mapping

__all__ = ["say", "count", "int_at_least", "positive_int", "nonempty", "results_console",
           "log_console", "print_table", "add_json_option", "print_json", "plain", "JSON_FORMAT"]

#: Version of the ``--json`` documents (a key's removal or change of meaning bumps it; new keys
#: do not).
JSON_FORMAT = 1
#: Console width when the output is not a terminal: wide enough for any table we print, so rich
#: never shrinks a column (a table is printed at its natural width, see ``print_table``).
_UNLIMITED = 100_000


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


def int_at_least(minimum: int, maximum: int | None = None):
    """An argparse type: an integer in ``minimum..maximum`` (argparse prefixes the message with
    the flag: ``argument --trials: expected an integer >= 1; got '0'``)."""
    if maximum is None:
        expected = f"an integer >= {minimum}"
    else:
        expected = f"an integer in {minimum}..{maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"  # argparse shows a type's name in some errors
    return parse


positive_int = int_at_least(1)


def nonempty(text: str) -> str:
    """An argparse type: a string that is not empty or blank (``--db ""`` is refused rather than
    read as "the default")."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a non-empty value; got {text!r}")
    return text


# -- streams -----------------------------------------------------------------------------------

def _console(stderr: bool):
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if console.is_terminal:
        return console
    # a pipe, a file, CI: no width limit (rich would otherwise take 80 columns or $COLUMNS and
    # cut every table to fit), no colour; soft wrap: a long line stays one line
    return Console(stderr=stderr, highlight=False, width=_UNLIMITED, soft_wrap=True)


def results_console():
    """A rich console for a command's results, on standard output."""
    return _console(stderr=False)


def log_console():
    """A rich console for progress, warnings and notes, on standard error."""
    return _console(stderr=True)


def print_table(console, table) -> None:
    """Print a rich ``Table`` in full. On a terminal, cells too wide for it wrap inside their
    column (never ``…``); elsewhere the table is printed at its natural width and its lines'
    trailing blanks (rich pads titles to the table's width) are stripped."""
    for column in table.columns:
        column.overflow = "fold"
        column.no_wrap = False
    if console.is_terminal:
        console.print(table)
        return
    with console.capture() as captured:
        console.print(table, soft_wrap=False)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    console.file.write(text + "\n")
    console.file.flush()


# -- --json ------------------------------------------------------------------------------------

def add_json_option(parser: argparse.ArgumentParser, what: str = "the results") -> None:
    """Add ``--json`` to a command's parser (``args.json`` is then true or false)."""
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as one JSON document on standard output instead of "
                             "tables (progress and messages stay on standard error)")


def plain(value: Any) -> Any:
    """``value`` as JSON-able data: objects with ``to_dict()`` and dataclasses become dicts,
    tuples and sets lists, paths and other objects strings, datetimes ISO 8601 text; a float
    that is not finite (an unmeasured ``inf``) becomes ``None`` (JSON has no infinity)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [plain(v) for v in items]
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return plain(to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    return str(value)


def print_json(command: str, data: Mapping[str, Any]) -> None:
    """Print ``{"command": command, "format": JSON_FORMAT, **data}`` (through :func:`plain`) as
    one indented JSON document and a newline on standard output. Nothing else of the command
    goes to standard output when ``--json`` is given."""
    document = {"command": command, "format": JSON_FORMAT, **plain(dict(data))}
    sys.stdout.write(json.dumps(document, indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()
