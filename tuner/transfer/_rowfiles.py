"""Rows in exchange files: the CSV form of a row (one column per ``db.ROW_FIELDS`` field,
problem and schedule as JSON cells, provenance spread over its five columns) and the reading of
JSON or CSV files for ``tiledtune import`` (every row validated on its own, before anything is
written).

CSV format 2 adds the ``family`` column and keeps the problem in one JSON cell; format-1 files
(the forward kernel's, with one column per problem field) are still read.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any, Iterator, Mapping

from db import PROVENANCE_FIELDS, ROW_FIELDS, ROW_FORMAT, FamilyCodec, RecordError, ScheduleRow, \
    canonical_json
from tiledattention import ARCHITECTURES

__all__ = ["CSV_COLUMNS", "MAX_FILE_BYTES", "MAX_TEXT", "UnreadableFile", "rows_to_csv",
           "read_rows"]

#: Larger files are rejected whole, unread.
MAX_FILE_BYTES = 50 * 1024 * 1024
#: Longest accepted device name or provenance string.
MAX_TEXT = 256

#: Columns of the CSV form, in order.
CSV_COLUMNS = ("format", *(name for f in ROW_FIELDS
                           for name in (PROVENANCE_FIELDS if f.kind == "provenance" else (f.name,))))
_KINDS = {f.name: f.kind for f in ROW_FIELDS}
_OPTIONAL = {f.name for f in ROW_FIELDS if f.optional}
_INT_TEXT = re.compile(r"[+-]?[0-9]+")


class UnreadableFile(Exception):
    """The whole file is rejected (too large, not text, not JSON/CSV, wrong structure)."""


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back to the same float
    if isinstance(value, dict):
        return canonical_json(value)
    return str(value)


def rows_to_csv(rows) -> str:
    """The CSV text of ``rows`` (sorted like ``db.dump_rows``), header first."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in sorted(rows, key=lambda r: (r.key, r.median_ms, r.created_at.isoformat())):
        data = row.to_dict()
        flat = {**data, **data["provenance"]}
        writer.writerow([_cell(flat[name]) for name in CSV_COLUMNS])
    return out.getvalue()


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
    raise UnreadableFile("neither JSON (a {\"format\": 2, \"rows\": [...]} object) nor CSV "
                         "(a header starting with 'format,'); name it .json or .csv")


def _json_items(text: str) -> Iterator[tuple[int, Any]]:
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
    kind = _KINDS.get(name)
    if name in _OPTIONAL and text == "":
        return None
    if name in PROVENANCE_FIELDS:
        return text  # version strings and hashes stay text, even when all digits
    if name == "format" or kind == "count" or kind is None:
        if _INT_TEXT.fullmatch(text.strip()):
            return int(text)
        if kind is None:  # a format-1 problem column
            return {"true": True, "false": False}.get(text, text)
        return text
    if kind == "ms":
        try:
            return float(text)
        except ValueError:
            return text
    if kind == "record":
        try:
            return json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            raise RecordError(f"column {name!r} must hold a JSON object; got {text[:80]!r}") \
                from None
    return text


def _csv_items(text: str) -> Iterator[tuple[int, Any]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise UnreadableFile("empty CSV file")
        legacy = "family" not in header and "problem" not in header  # format 1
        columns = [c for c in CSV_COLUMNS if not (legacy and c in ("family", "problem"))]
        missing = [c for c in columns if c not in _OPTIONAL and c not in header]
        unknown = [c for c in header if c not in CSV_COLUMNS] if not legacy else []
        if missing or unknown or len(set(header)) != len(header):
            raise UnreadableFile(f"CSV header must name the columns {list(CSV_COLUMNS)}; "
                                 f"missing {missing}, unknown {unknown}")
        for index, cells in enumerate(reader):
            if len(cells) != len(header):
                yield index, RecordError(f"has {len(cells)} cells; the header has "
                                         f"{len(header)}")
                continue
            try:
                flat = {name: _csv_value(name, cell) for name, cell in zip(header, cells)}
            except RecordError as exc:
                yield index, exc
                continue
            data = {name: value for name, value in flat.items()
                    if name in _KINDS or name == "format"}
            data["provenance"] = {name: flat[name] for name in PROVENANCE_FIELDS}
            if legacy:  # format 1: every column that is not a row field is a problem field
                data["problem"] = {name: value for name, value in flat.items()
                                   if name not in CSV_COLUMNS}
            yield index, data
    except csv.Error as exc:
        raise UnreadableFile(f"not CSV: {exc}") from None


def _check_row(data: Any, codecs: Mapping[str, FamilyCodec]) -> ScheduleRow:
    """``ScheduleRow`` from one item, or :class:`RecordError` with the reason."""
    if isinstance(data, Exception):
        raise data
    try:
        row = ScheduleRow.from_dict(data, codecs)
    except (TypeError, KeyError, AttributeError, OverflowError, ValueError) as exc:
        raise RecordError(f"malformed row: {exc}") from None
    if row.arch not in ARCHITECTURES:
        raise RecordError(f"unknown architecture {row.arch!r}; expected one of "
                          f"{', '.join(ARCHITECTURES)}")
    for name, value in (("device_name", row.device_name), *row.provenance.to_dict().items()):
        if len(value) > MAX_TEXT or not value.isprintable():
            raise RecordError(f"{name} must be printable text of at most {MAX_TEXT} "
                              f"characters; got {len(value)} characters")
    return row


def read_rows(path: Path, codecs: Mapping[str, FamilyCodec]
              ) -> tuple[list[tuple[int, ScheduleRow]], list[str]]:
    """The valid rows of a file, as ``(index, ScheduleRow)``, and the rejections as
    ``"row N: reason"``. Raises :class:`UnreadableFile` when the file as a whole is unusable."""
    text = _read_text(path)
    items = _json_items(text) if _kind(path, text) == "json" else _csv_items(text)
    accepted: list[tuple[int, ScheduleRow]] = []
    rejected: list[str] = []
    seen: dict[tuple, int] = {}
    for index, item in items:
        try:
            row = _check_row(item, codecs)
        except RecordError as exc:
            rejected.append(f"row {index}: {exc}")
            continue
        if row.key in seen:
            rejected.append(f"row {index}: duplicate key {row.describe_key()} (row "
                            f"{seen[row.key]} has it; the first is kept)")
            continue
        seen[row.key] = index
        accepted.append((index, row))
    return accepted, rejected
