"""Rows in exchange files: the CSV form of a row (one column per ``db.ROW_FIELDS`` field,
problem and schedule as JSON cells, provenance spread over its five columns) and the reading of
JSON or CSV files for ``tiledtune import`` (every row validated on its own, before anything is
written).

CSV format 2 adds the ``family`` column and keeps the problem in one JSON cell; format-1 files
(the forward kernel's, with one column per problem field) are still read. From row format 4 a
row's baselines are one column, ``baselines_ms``, holding a JSON object of baseline name to
median ms (``{"torch-cudnn":1.23,"torch-flash":2.5}``; ``{}`` when none ran); files of older
formats, with the columns ``torch_cudnn_ms`` and ``torch_flash_ms`` instead, are still read (into
``baselines_ms``, as ``torch-cudnn`` and ``torch-flash``).

Hostile values are rejected row by row, with the field named: integers outside signed 64 bits
(what SQL stores; JSON and CSV read them as Python ints of any size, ``10**400`` included, which
later conversions turn into ``OverflowError`` or truncation), numbers that are not finite
(``1e400`` reads as ``inf``), and ``true``/``false`` where the typed value holds an int.

Text cells of the CSV form that a spreadsheet would run as a formula (starting with ``=``, ``+``,
``-``, ``@``, a tab or a carriage return) are written with a ``'`` in front, as OWASP advises
against CSV injection; a text cell that starts with ``'`` gets one more, so reading removes exactly
one ``'`` before such a character and every row reads back unchanged.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Iterator, Mapping

from db import LEGACY_BASELINES, PROVENANCE_FIELDS, ROW_FIELDS, ROW_FORMAT, FamilyCodec, \
    RecordError, ScheduleRow, canonical_json, check_text
from tiledattention import ARCHITECTURES

from ..errors import UnreadableFile

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
#: Columns of files of row formats 1-3 that later formats dropped (their baselines, which
#: ``ScheduleRow.from_dict`` reads into ``baselines_ms``): optional times.
_EARLIER_COLUMNS = {name: "ms" for name in LEGACY_BASELINES}
#: Columns that files of older row formats lack: ``backend`` came with row format 3. A row
#: without it is read as its format says (``ScheduleRow.from_dict``: "gpu" for formats 1 and 2,
#: rejected for format 3).
_LATER_COLUMNS = {"backend"} & set(_KINDS)
_INT_TEXT = re.compile(r"[+-]?[0-9]+")

#: Integers a row may hold: signed 64-bit, what SQL (SQLite's INTEGER, PostgreSQL's BIGINT) keeps.
INT_MIN, INT_MAX = -2**63, 2**63 - 1
#: Characters that make a spreadsheet read a cell as a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_QUOTE = "'"
#: CSV columns that hold free text (not numbers, times or JSON): these are neutralised.
TEXT_COLUMNS = (*(f.name for f in ROW_FIELDS if f.kind == "text"), *PROVENANCE_FIELDS)


class _Unrepresentable:
    """A number read from a file that no row can hold: an integer beyond 64 bits (kept as its
    text, so that nothing converts it, however many digits it has) or a float that overflows to
    infinity or is NaN. ``_check_numbers`` rejects the row that holds one, naming the field."""

    __slots__ = ("text", "why")

    def __init__(self, text: str, why: str) -> None:
        self.text, self.why = text, why

    def __repr__(self) -> str:
        return _shown(self.text)


def _shown(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:12]}...{text[-6:]} ({len(text)} characters)"


_OUT_OF_INT64 = f"outside the signed 64-bit range {INT_MIN}..{INT_MAX}"
_NOT_FINITE = "infinite or NaN as a 64-bit float"


def _parse_int(text: str) -> int | _Unrepresentable:
    # 20 characters hold every int64 ("-9223372036854775808"); longer text (after leading zeros)
    # is out of range and is never converted: int() of more than 4300 digits raises ValueError.
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > 19:
        return _Unrepresentable(text, _OUT_OF_INT64)
    value = int(text)
    return value if INT_MIN <= value <= INT_MAX else _Unrepresentable(text, _OUT_OF_INT64)


def _parse_float(text: str) -> float | _Unrepresentable:
    value = float(text)
    return value if math.isfinite(value) else _Unrepresentable(text, _NOT_FINITE)


def _parse_constant(text: str) -> _Unrepresentable:  # NaN, Infinity, -Infinity
    return _Unrepresentable(text, _NOT_FINITE)


def _loads(text: str) -> Any:
    """``json.loads`` that keeps out-of-range numbers as :class:`_Unrepresentable`."""
    return json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                      parse_constant=_parse_constant)


def _check_numbers(data: Any) -> None:
    """Raise :class:`RecordError` naming the first field of ``data`` (nested: ``problem.batch``)
    that holds a number no row can hold. Iterative: a file may nest as deep as JSON allows."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend((f"{path}.{key}" if path else str(key), item)
                         for key, item in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))
        elif isinstance(value, _Unrepresentable):
            expected = ("an integer within signed 64 bits" if value.why == _OUT_OF_INT64
                        else "a finite number")
            raise RecordError(f"{path or 'row'} must be {expected}; got {_shown(value.text)} "
                              f"({value.why})")
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            raise RecordError(f"{path or 'row'} must be an integer within signed 64 bits; got "
                              f"{_shown(str(value))} ({_OUT_OF_INT64})")
        elif isinstance(value, float) and not math.isfinite(value):
            raise RecordError(f"{path or 'row'} must be a finite number; got {value!r} "
                              f"({_NOT_FINITE})")


def _check_bools(given: Any, typed: Mapping[str, Any], path: str) -> None:
    """Raise :class:`RecordError` where ``given`` (a record as the file spelt it) has a bool and
    the typed value's dict form an int, or the other way round: ``True == 1`` in Python, so a
    decoder that tests ``isinstance(value, int)`` lets ``true`` through as 1."""
    if not isinstance(given, Mapping):
        return
    for key, value in given.items():
        if key not in typed:
            continue
        want = typed[key]
        if isinstance(value, bool) != isinstance(want, bool) and isinstance(value, int) \
                and isinstance(want, int):
            expected = "a bool" if isinstance(want, bool) else "an int"
            raise RecordError(f"{path}.{key} must be {expected}; got {json.dumps(value)}")


def _neutralised(text: str) -> str:
    """``text`` as a CSV text cell: a ``'`` in front of a formula character or a ``'``."""
    return _QUOTE + text if text.startswith((*FORMULA_START, _QUOTE)) else text


def _unneutralised(text: str) -> str:
    """Inverse of :func:`_neutralised`: one ``'`` off, only where ``_neutralised`` put one."""
    if text.startswith(_QUOTE) and text[1:].startswith((*FORMULA_START, _QUOTE)):
        return text[1:]
    return text


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
    # QUOTE_MINIMAL quotes a cell holding the line terminator "\n" but not one holding "\r",
    # which readers (csv.reader, spreadsheets) take for a line break: the rest of the cell would
    # start a new line, and a cell, of its own, past the neutralising quote
    quote_all = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writerow(CSV_COLUMNS)
    for row in sorted(rows, key=lambda r: (r.key, r.median_ms, r.created_at.isoformat())):
        data = row.to_dict()
        flat = {**data, **data["provenance"]}
        cells = [_neutralised(_cell(flat[name])) if name in TEXT_COLUMNS else _cell(flat[name])
                 for name in CSV_COLUMNS]
        (quote_all if any("\r" in cell for cell in cells) else writer).writerow(cells)
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
        data = _loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
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


def _csv_value(name: str, text: str, legacy: bool = False) -> Any:
    """A cell to the type of the dict form; text that does not convert is passed on unchanged,
    so ``ScheduleRow.from_dict`` names the field and the bad value. Text cells lose the ``'``
    that :func:`rows_to_csv` put in front of a formula character (format-1 files never had one).
    """
    kind = _KINDS.get(name) or _EARLIER_COLUMNS.get(name)
    if (name in _OPTIONAL or name in _EARLIER_COLUMNS) and text == "":
        return None
    if name in TEXT_COLUMNS:
        # version strings and hashes stay text, even when all digits
        return text if legacy else _unneutralised(text)
    if name == "format" or kind == "count" or kind is None:
        if _INT_TEXT.fullmatch(text.strip()):
            return _parse_int(text.strip())
        if kind is None:  # a format-1 problem column
            return {"true": True, "false": False}.get(text, text)
        return text
    if kind == "ms":
        try:
            value = float(text)
        except ValueError:
            return text
        return value if math.isfinite(value) else _Unrepresentable(text, _NOT_FINITE)
    if kind in ("record", "baselines"):
        try:
            return _loads(text)
        except (ValueError, RecursionError):
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
        missing = [c for c in columns
                   if c not in _OPTIONAL and c not in _LATER_COLUMNS and c not in header]
        unknown = [c for c in header if c not in CSV_COLUMNS and c not in _EARLIER_COLUMNS] \
            if not legacy else []
        if missing or unknown or len(set(header)) != len(header):
            raise UnreadableFile(f"CSV header must name the columns {list(CSV_COLUMNS)}; "
                                 f"missing {missing}, unknown {unknown}")
        for index, cells in enumerate(reader):
            if len(cells) != len(header):
                yield index, RecordError(f"has {len(cells)} cells; the header has "
                                         f"{len(header)}")
                continue
            try:
                flat = {name: _csv_value(name, cell, legacy)
                        for name, cell in zip(header, cells)}
            except RecordError as exc:
                yield index, exc
                continue
            data = {name: value for name, value in flat.items()
                    if name in _KINDS or name in _EARLIER_COLUMNS or name == "format"}
            data["provenance"] = {name: flat[name] for name in PROVENANCE_FIELDS}
            if legacy:  # format 1: every column that is not a row field is a problem field
                data["problem"] = {name: value for name, value in flat.items()
                                   if name not in CSV_COLUMNS and name not in _EARLIER_COLUMNS}
            yield index, data
    except csv.Error as exc:
        raise UnreadableFile(f"not CSV: {exc}") from None


def _check_row(data: Any, codecs: Mapping[str, FamilyCodec]) -> ScheduleRow:
    """``ScheduleRow`` from one item, or :class:`RecordError` with the reason."""
    if isinstance(data, Exception):
        raise data
    if isinstance(data, Mapping):
        data = dict(data)
        for name in ("problem", "schedule"):  # JSON text in a JSON row: read it as we read files
            if isinstance(data.get(name), str):
                try:
                    data[name] = _loads(data[name])
                except RecursionError:
                    raise RecordError(f"{name} is not JSON: nested too deeply") from None
                except ValueError:
                    pass  # ScheduleRow.from_dict names the JSON error
    _check_numbers(data)
    try:
        row = ScheduleRow.from_dict(data, codecs)
    except (TypeError, KeyError, AttributeError, OverflowError, ValueError) as exc:
        raise RecordError(f"malformed row: {exc}") from None
    for name in ("problem", "schedule"):
        _check_bools(data.get(name), getattr(row, name).to_dict(), name)
    if row.arch not in ARCHITECTURES:
        raise RecordError(f"unknown architecture {row.arch!r}; expected one of "
                          f"{', '.join(ARCHITECTURES)}")
    for name, value in (("device_name", row.device_name), *row.provenance.to_dict().items()):
        check_text(name, value, MAX_TEXT)
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
