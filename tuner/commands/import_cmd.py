"""``tiledtune import``: merge exported schedule files (JSON or CSV) into the database.

Every row is validated before anything is written: a row of the wrong shape or types, of an
architecture tileiras does not know, with a schedule that does not validate, with absurdly long
strings, or repeating a key already seen in the same file (the first is kept) is rejected with its
reason and writes nothing. Accepted rows go through ``ScheduleDB.put`` one transaction each, under
the better-wins rule (``--force`` overwrites). Files over ``MAX_FILE_BYTES``, not UTF-8, not JSON
or CSV, or without the expected top-level structure are rejected whole.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .export_cmd import CSV_COLUMNS

__all__ = ["configure", "run", "MAX_FILE_BYTES", "MAX_TEXT", "FileReport", "read_rows"]

#: Larger files are rejected whole, unread.
MAX_FILE_BYTES = 50 * 1024 * 1024
#: Longest accepted device name or provenance string.
MAX_TEXT = 256

_OPTIONAL_COLUMNS = ("default_ms", "torch_cudnn_ms", "torch_flash_ms")
_INT_COLUMNS = ("format", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim",
                "trials")
_FLOAT_COLUMNS = ("median_ms", "spread_ms", "tflops", *_OPTIONAL_COLUMNS)
_PROBLEM_COLUMNS = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype",
                    "causal")
_PROVENANCE_COLUMNS = ("template_hash", "cuda_tile", "tileiras", "torch", "driver")
_INT_TEXT = re.compile(r"[+-]?[0-9]+")

EXIT_OK, EXIT_REJECTED, EXIT_UNREADABLE = 0, 1, 2


class UnreadableFile(Exception):
    """The whole file is rejected (too large, not text, not JSON/CSV, wrong structure)."""


@dataclass
class FileReport:
    name: str
    counts: dict[str, int] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)  # "row N: reason"
    error: str | None = None  # the whole file was rejected


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "Each row is validated first; a bad row is rejected with its reason and writes\n"
        "nothing. Accepted rows are merged with the better-wins rule: added (new key),\n"
        "improved (faster), replaced (stored row from another toolchain), forced (--force),\n"
        "kept (stored row as fast or faster).\n"
        f"Files over {MAX_FILE_BYTES // (1024 * 1024)} MB, not UTF-8, or not JSON/CSV are "
        "rejected whole.\n"
        "exit status: 0 every row accepted; 1 some rows rejected; 2 a file (or the database)\n"
        "could not be read at all")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="files written by `tiledtune export --format json|csv`")
    parser.add_argument("--db", metavar="PATH_OR_URL", default=None,
                        help="schedule database (default: $TILEDATTN_DB or "
                             "~/.cache/tiledattention/schedules.sqlite)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite stored rows even when they are faster")


# -- reading ---------------------------------------------------------------------------------

def _read_text(path: Path) -> str:
    try:
        if not path.is_file():
            raise UnreadableFile("not a regular file" if path.exists() else "no such file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UnreadableFile(f"{size} bytes, larger than the limit of {MAX_FILE_BYTES}")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise UnreadableFile(f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:  # grew while we looked
        raise UnreadableFile(f"larger than the limit of {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"not UTF-8 text, so neither JSON nor CSV ({exc.reason} at byte "
                             f"{exc.start})") from None


def _kind(path: Path, text: str) -> str:
    suffix = path.suffix.lower()
    if suffix in (".json", ".csv"):
        return suffix[1:]
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return "json"
    if stripped.split("\n", 1)[0].strip().startswith("format,"):
        return "csv"
    raise UnreadableFile("neither JSON (a {\"format\": 1, \"rows\": [...]} object) nor CSV "
                         "(a header starting with 'format,'); name it .json or .csv")


def _json_items(text: str) -> Iterator[tuple[int, Any]]:
    from db import ROW_FORMAT

    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UnreadableFile(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"format", "rows"}:
        raise UnreadableFile(f'expected {{"format": {ROW_FORMAT}, "rows": [...]}} at the top')
    version = data["format"]
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version \
            <= ROW_FORMAT:
        raise UnreadableFile(f"file format {version!r}; this tiledattention reads 1.."
                             f"{ROW_FORMAT} (upgrade it for newer files)")
    if not isinstance(data["rows"], list):
        raise UnreadableFile("'rows' must be a list")
    yield from enumerate(data["rows"])


def _csv_value(name: str, text: str) -> Any:
    """A cell to the type of the dict form; text that does not convert is passed on unchanged,
    so ``ScheduleRow.from_dict`` names the field and the bad value."""
    if name in _OPTIONAL_COLUMNS and text == "":
        return None
    if name in _INT_COLUMNS:
        return int(text) if _INT_TEXT.fullmatch(text.strip()) else text
    if name in _FLOAT_COLUMNS:
        try:
            return float(text)
        except ValueError:
            return text
    if name == "causal":
        return {"true": True, "false": False}.get(text, text)
    if name == "schedule":
        try:
            return json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            raise ValueError(f"column 'schedule' must hold a JSON object; got {text[:80]!r}") \
                from None
    return text


def _csv_items(text: str) -> Iterator[tuple[int, Any]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise UnreadableFile("empty CSV file")
        required = set(CSV_COLUMNS) - set(_OPTIONAL_COLUMNS)
        missing = [c for c in CSV_COLUMNS if c in required and c not in header]
        unknown = [c for c in header if c not in CSV_COLUMNS]
        if missing or unknown or len(set(header)) != len(header):
            raise UnreadableFile(f"CSV header must name the columns {list(CSV_COLUMNS)}; "
                                 f"missing {missing}, unknown {unknown}")
        for index, cells in enumerate(reader):
            if len(cells) != len(header):
                yield index, ValueError(f"has {len(cells)} cells; the header has {len(header)}")
                continue
            try:
                flat = {name: _csv_value(name, cell) for name, cell in zip(header, cells)}
            except ValueError as exc:
                yield index, exc
                continue
            data = {name: flat[name] for name in flat
                    if name not in _PROBLEM_COLUMNS and name not in _PROVENANCE_COLUMNS}
            data["problem"] = {name: flat[name] for name in _PROBLEM_COLUMNS}
            data["provenance"] = {name: flat[name] for name in _PROVENANCE_COLUMNS}
            yield index, data
    except csv.Error as exc:
        raise UnreadableFile(f"not CSV: {exc}") from None


def _check_row(data: Any) -> Any:
    """``ScheduleRow`` from one item, or ``ValueError`` with the reason."""
    from db import ScheduleRow
    from tiledattention._compile import ARCHITECTURES

    if isinstance(data, Exception):
        raise data
    try:
        row = ScheduleRow.from_dict(data)
    except (TypeError, KeyError, AttributeError, OverflowError) as exc:
        raise ValueError(f"malformed row: {type(exc).__name__}: {exc}") from None
    if row.arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {row.arch!r}; expected one of "
                         f"{', '.join(ARCHITECTURES)}")
    for name, value in (("device_name", row.device_name), *row.provenance.to_dict().items()):
        if len(value) > MAX_TEXT or not value.isprintable():
            raise ValueError(f"{name} must be printable text of at most {MAX_TEXT} characters; "
                             f"got {len(value)} characters")
    return row


def read_rows(path: Path) -> tuple[list[tuple[int, Any]], list[str]]:
    """The valid rows of a file, as ``(index, ScheduleRow)``, and the rejections as
    ``"row N: reason"``. Raises :class:`UnreadableFile` when the file as a whole is unusable."""
    text = _read_text(path)
    items = _json_items(text) if _kind(path, text) == "json" else _csv_items(text)
    accepted: list[tuple[int, Any]] = []
    rejected: list[str] = []
    seen: dict[tuple, int] = {}
    for index, item in items:
        try:
            row = _check_row(item)
        except ValueError as exc:
            rejected.append(f"row {index}: {exc}")
            continue
        if row.key in seen:
            rejected.append(f"row {index}: duplicate key {row.describe_key()} (row "
                            f"{seen[row.key]} has it; the first is kept)")
            continue
        seen[row.key] = index
        accepted.append((index, row))
    return accepted, rejected


# -- command -----------------------------------------------------------------------------------

def _report(reports: list[FileReport], outcomes: tuple[str, ...]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    errors = Console(stderr=True, soft_wrap=True, highlight=False)
    for report in reports:
        if report.error:
            errors.print(f"{report.name}: file rejected: {report.error}", markup=False)
        for reason in report.rejected:
            errors.print(f"{report.name}: {reason}", markup=False)
    table = Table(title="tiledtune import")
    table.add_column("file", overflow="fold")
    for outcome in (*outcomes, "rejected"):
        table.add_column(outcome, justify="right")
    for report in reports:
        rejected = "file" if report.error else str(len(report.rejected))
        table.add_row(report.name, *(str(report.counts.get(o, 0)) for o in outcomes), rejected)
    if len(reports) > 1:
        table.add_row("total", *(str(sum(r.counts.get(o, 0) for r in reports))
                                 for o in outcomes),
                      str(sum(len(r.rejected) for r in reports)))
    console.print(table)


def run(args: argparse.Namespace) -> int:
    from db import PUT_OUTCOMES, DatabaseUnavailable, ScheduleDB, SchemaTooNew
    from tiledattention._settings import database_location

    location = args.db or database_location()
    reports = []
    parsed = []
    for name in args.files:
        report = FileReport(name=name)
        reports.append(report)
        try:
            rows, report.rejected = read_rows(Path(name))
        except UnreadableFile as exc:
            report.error = str(exc)
            continue
        parsed.append((report, rows))
    if any(rows for _, rows in parsed):
        try:
            database = ScheduleDB(location)
        except (DatabaseUnavailable, ValueError) as exc:
            print(f"tiledtune import: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE
        with database:
            for report, rows in parsed:
                for index, row in rows:
                    try:
                        outcome = database.put(row, force=args.force)
                    except (DatabaseUnavailable, SchemaTooNew) as exc:
                        print(f"tiledtune import: {exc}", file=sys.stderr)
                        _report(reports, PUT_OUTCOMES)
                        return EXIT_UNREADABLE
                    report.counts[outcome] = report.counts.get(outcome, 0) + 1
    _report(reports, PUT_OUTCOMES)
    if any(r.error for r in reports):
        return EXIT_UNREADABLE
    if any(r.rejected for r in reports):
        return EXIT_REJECTED
    return EXIT_OK
