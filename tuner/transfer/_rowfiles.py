"""Rows in exchange files: the CSV form of a row (one column per ``db.ROW_FIELDS`` field,
problem and schedule as JSON cells, provenance spread over its five columns) and the reading of
JSON or CSV files for ``tiledtune import`` (every row validated on its own, before anything is
written). Files are read a chunk at a time, whatever their size or JSON layout, so an export
of any size reads back; only a single row longer than ``MAX_ROW_CHARS`` rejects a file.

CSV format 2 adds the ``family`` column and keeps the problem in one JSON cell; format-1 files
(the forward kernel's, with one column per problem field) are still read. From row format 4 a
row's baselines are one column, ``baselines_ms``, holding a JSON object of baseline name to
median ms (``{"torch-cudnn":1.23,"torch-flash":2.5}``; ``{}`` when none ran); files of older
formats, with the columns ``torch_cudnn_ms`` and ``torch_flash_ms`` instead, are still read (into
``baselines_ms``, as ``torch-cudnn`` and ``torch-flash``).

Hostile values are rejected row by row, with the field named: integers outside signed 64 bits
(what SQL stores; JSON and CSV read them as Python ints of any size, ``10**400`` included, which
later conversions turn into ``OverflowError`` or truncation), numbers that are not finite
(``1e400`` reads as ``inf``), ``true``/``false`` where the typed value holds an int, a JSON
object naming a key twice (Python's ``json`` would keep the last silently), and numbers that
cannot be a measurement (``_plausible``: a time faster than the architecture's fastest GPU can
run the problem, a timestamp in the future).

Text cells of the CSV form that a spreadsheet would run as a formula (starting with ``=``, ``+``,
``-``, ``@``, a tab or a carriage return) are written with a ``'`` in front, as OWASP advises
against CSV injection; a text cell that starts with ``'`` gets one more, so reading removes exactly
one ``'`` before such a character and every row reads back unchanged.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from db import LEGACY_BASELINES, PROVENANCE_FIELDS, ROW_FIELDS, ROW_FORMAT, FamilyCodec, \
    RecordError, RowDecoder, ScheduleRow, canonical_json, check_text
from tiledattention import ARCHITECTURES

from ..errors import UnreadableFile
from ._plausible import implausible

__all__ = ["CSV_COLUMNS", "MAX_ROW_CHARS", "MAX_TEXT", "UnreadableFile", "csv_chunks",
           "rows_to_csv", "read_rows"]

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
    #: how many were ever made (and JSON objects naming a key twice, :func:`_object`): a
    #: reader that sees it unchanged across a row's reading knows that every number of the row
    #: fits, and every key is named once, without looking (only ever counts up)
    made = 0

    def __init__(self, text: str, why: str) -> None:
        self.text, self.why = text, why
        _Unrepresentable.made += 1

    def __repr__(self) -> str:
        return _shown(self.text)


def _shown(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:12]}...{text[-6:]} ({len(text)} characters)"


_OUT_OF_INT64 = f"outside the signed 64-bit range {INT_MIN}..{INT_MAX}"
_NOT_FINITE = "infinite or NaN as a 64-bit float"


def _parse_int(text: str) -> int | _Unrepresentable:
    if len(text) <= 18:  # every int of 18 characters is within int64: the common case, fast
        return int(text)
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


class _Duplicated(dict):
    """A JSON object that names a key more than once (its last value of each key), with the keys
    named more than once: :func:`_check_numbers` rejects the row that holds one, naming the key
    (which of the values was meant cannot be known)."""

    __slots__ = ("duplicates",)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object from its ``(key, value)`` pairs (``object_pairs_hook``): a dict, or a
    :class:`_Duplicated` when a key comes twice."""
    made = dict(pairs)
    if len(made) == len(pairs):
        return made
    counted: dict[str, int] = {}
    for key, _ in pairs:
        counted[key] = counted.get(key, 0) + 1
    marked = _Duplicated(made)
    marked.duplicates = [key for key, n in counted.items() if n > 1]
    _Unrepresentable.made += 1  # the row holding it takes the checked path, as for a number
    return marked


def _loads(text: str) -> Any:
    """``json.loads`` that keeps out-of-range numbers as :class:`_Unrepresentable` and marks
    objects with a repeated key (:class:`_Duplicated`)."""
    return _DECODER.decode(text)


#: ``json.loads(text, parse_int=..., ...)`` makes a decoder per call; it holds no state
_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float,
                            parse_constant=_parse_constant, object_pairs_hook=_object)


def _numbers_fit(data: Any) -> bool:
    """Whether every number in ``data`` is one a row can hold: :func:`_check_numbers`' test
    without the field names, a few times faster (exact types first; an import checks every
    row)."""
    stack = [data]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is str or kind is bool or value is None:
            continue
        if kind is int:
            if not INT_MIN <= value <= INT_MAX:
                return False
        elif kind is float:
            if not math.isfinite(value):
                return False
        elif kind is dict:
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
        elif isinstance(value, _Unrepresentable):
            return False
        elif isinstance(value, (Mapping, list, int, float)):  # subclasses: the full check
            return False
    return True


def _check_numbers(data: Any) -> None:
    """Raise :class:`RecordError` naming the first field of ``data`` (nested: ``problem.batch``)
    that holds a number no row can hold. Iterative: a file may nest as deep as JSON allows."""
    if _numbers_fit(data):
        return
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Duplicated):
            raise RecordError(f"{path or 'the row'} names the key "
                              f"{', '.join(map(repr, value.duplicates))} more than once; a JSON "
                              "object's keys must be distinct (which value is meant cannot be "
                              "known)")
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
    return "".join(csv_chunks(rows))


#: Rows per piece of :func:`csv_chunks`.
_CSV_ROWS_A_CHUNK = 500


def csv_chunks(rows) -> Iterator[str]:
    """:func:`rows_to_csv`'s text in pieces of ``_CSV_ROWS_A_CHUNK`` rows (the header first), for
    writers that stream it."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    # QUOTE_MINIMAL quotes a cell holding the line terminator "\n" but not one holding "\r",
    # which readers (csv.reader, spreadsheets) take for a line break: the rest of the cell would
    # start a new line, and a cell, of its own, past the neutralising quote
    quote_all = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writerow(CSV_COLUMNS)
    ordered = sorted(rows, key=lambda r: (r.key, r.median_ms, r.created_at.isoformat()))
    for start in range(0, len(ordered), _CSV_ROWS_A_CHUNK):
        for row in ordered[start:start + _CSV_ROWS_A_CHUNK]:
            data = row.to_dict()
            flat = {**data, **data["provenance"]}
            cells = [_neutralised(_cell(flat[name])) if name in TEXT_COLUMNS
                     else _cell(flat[name]) for name in CSV_COLUMNS]
            (quote_all if any("\r" in cell for cell in cells) else writer).writerow(cells)
        yield out.getvalue()
        out.seek(0)
        out.truncate()
    if out.tell():  # no rows: the header alone
        yield out.getvalue()


# -- reading ---------------------------------------------------------------------------------

#: Characters read from a file at a time (files have no size limit: they are read a chunk at a
#: time, so an export of any size the database holds reads back).
_CHUNK = 1 << 20
#: Longest row accepted: one JSON value of a file, or one line of a CSV file (a row is about
#: 1,000 characters); a file holding a longer one is rejected whole, unread past it.
MAX_ROW_CHARS = 1 << 20
#: Characters looked at to tell JSON from CSV in a file whose name says neither.
_SNIFF = 64 * 1024


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


class _JsonReader:
    """The values of a JSON text read a chunk at a time: ``peek`` the next structural character,
    ``take`` it, or decode the ``value`` that starts there (``_loads``' number rules). Only one
    value and the chunk it started in are held, whatever the file's size or layout."""

    _SPACE = re.compile(r"[ \t\n\r]*")

    def __init__(self, file: io.TextIOBase) -> None:
        self._file = file
        self._buffer = ""
        self._at = 0  # next character of _buffer
        self._before = 0  # characters of the file before _buffer
        self._ended = False
        #: whether every number of the last ``value`` fits a row (``_numbers_fit``); when
        #: ``False``, ``_Unrepresentable`` values may be in it
        self.fits = False
        # numbers as the standard decoder reads them (no Python call per number); a value
        # holding one a row cannot hold is decoded again with ``_loads``' rules
        # (``_numbers_fit``), so that its error names the text as the file spells it
        self._plain = json.JSONDecoder(object_pairs_hook=_object).raw_decode
        self._decode = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float,
                                        parse_constant=_parse_constant,
                                        object_pairs_hook=_object).raw_decode

    def _more(self) -> bool:
        """Append the next chunk to what is not consumed yet; ``False`` at the end."""
        if self._ended:
            return False
        chunk = self._file.read(_CHUNK)
        if not chunk:
            self._ended = True
            return False
        self._before += self._at
        self._buffer = self._buffer[self._at:] + chunk
        self._at = 0
        return True

    def error(self, message: str, at: int | None = None, *,
              what: str = "not JSON: ") -> UnreadableFile:
        where = self._before + (self._at if at is None else at)
        return UnreadableFile(f"{what}{message} (character {where})")

    def peek(self) -> str:
        """The next character that is not white space ("" at the end)."""
        while True:
            self._at = self._SPACE.match(self._buffer, self._at).end()
            if self._at < len(self._buffer) or not self._more():
                return self._buffer[self._at:self._at + 1]

    def take(self, char: str, after: str) -> None:
        found = self.peek()
        if found != char:
            raise self.error(f"expected {char!r} {after}; "
                             + (f"got {found!r}" if found else "the text ends"))
        self._at += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = self._plain(self._buffer, self._at)
                plain = _numbers_fit(value)  # else a number no row can hold
            except (ValueError, RecursionError):
                # JSON errors, ints of more digits than int() converts, NaN, numbers out of
                # range: the reading below, by _loads' rules, says which
                plain = False
            # at the buffer's end a number may go on, and a long value is refused: both below
            if plain and end < len(self._buffer) and end - self._at <= MAX_ROW_CHARS:
                self._at = end
                self.fits = True
                return value
            self.fits = False
            try:
                value, end = self._decode(self._buffer, self._at)
            except json.JSONDecodeError as exc:
                # the value may only go on in the next chunk: read on, up to one row's length
                if len(self._buffer) - self._at <= MAX_ROW_CHARS and self._more():
                    continue
                if len(self._buffer) - self._at > MAX_ROW_CHARS:
                    raise self.error(f"a value longer than the limit of {MAX_ROW_CHARS} "
                                     f"characters for one row, or not JSON ({exc.msg})",
                                     self._at, what="") from None
                raise self.error(exc.msg, exc.pos) from None
            except RecursionError:
                raise self.error("nested too deeply") from None
            if end == len(self._buffer) and self._more():  # a number may go on
                continue
            if end - self._at > MAX_ROW_CHARS:
                raise self.error(f"a value longer than the limit of {MAX_ROW_CHARS} characters "
                                 "for one row", what="")
            self._at = end
            return value


def _check_version(version: Any) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version \
            <= ROW_FORMAT:
        raise UnreadableFile(f"file format {version!r}; this tiledattention reads 1.."
                             f"{ROW_FORMAT} (upgrade it for newer files)")


def _json_items(file: io.TextIOBase) -> Iterator[tuple[int, Any, bool]]:
    """The rows of ``{"format": N, "rows": [...]}``, one at a time, in any layout (``tiledtune
    export`` writes one row a line), as ``(index, row, whether its numbers fit)``; anything
    else at the top rejects the file whole."""
    top = f'expected {{"format": {ROW_FORMAT}, "rows": [...]}} at the top'
    reader = _JsonReader(file)
    start = reader.peek()
    if start != "{":
        if start and start in '["-0123456789tfn':
            reader.value()  # valid JSON of another shape, or the JSON error
            raise UnreadableFile(top)
        raise reader.error("expected a JSON object; " + (f"got {start!r}" if start
                                                          else "the file is empty"))
    reader.take("{", "at the top")
    seen: set[str] = set()
    if reader.peek() == "}":
        raise UnreadableFile(top)
    while True:
        key = reader.value()
        if key not in ("format", "rows") or key in seen:
            raise UnreadableFile(top)
        seen.add(key)
        reader.take(":", f"after {json.dumps(key)}")
        if key == "format":
            _check_version(reader.value())
        elif reader.peek() != "[":
            reader.value()
            raise UnreadableFile("'rows' must be a list")
        else:
            reader.take("[", "")
            if reader.peek() == "]":
                reader.take("]", "")
            else:
                for index in itertools.count():
                    value = reader.value()
                    yield index, value, reader.fits
                    if reader.peek() == "]":
                        reader.take("]", "")
                        break
                    reader.take(",", "or ']' after a row")
        if reader.peek() == "}":
            reader.take("}", "")
            break
        reader.take(",", "or '}' in the top-level object")
    if reader.peek():
        raise reader.error("extra data after the top-level object")
    if seen != {"format", "rows"}:
        raise UnreadableFile(top)


def _lines(file: io.TextIOBase) -> Iterator[str]:
    """The lines of a text file opened with ``newline=""`` (what ``csv`` reads), each at most
    ``MAX_ROW_CHARS`` characters."""
    while True:
        line = file.readline(MAX_ROW_CHARS + 1)
        if not line:
            return
        if len(line) > MAX_ROW_CHARS:
            raise UnreadableFile(f"a line longer than the limit of {MAX_ROW_CHARS} characters "
                                 "for one row")
        yield line


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


def _same(text: str) -> str:
    return text


def _text_cell(text: str) -> str:
    return _unneutralised(text) if text.startswith(_QUOTE) else text


def _cell_reader(name: str, legacy: bool) -> Callable[[str], Any]:
    """:func:`_csv_value` of the column ``name``, with the common cells read at once: plain
    digits, finite floats, text without a ``'`` in front; a JSON cell read once per distinct
    text (a file's rows share their schedules). Anything else goes to ``_csv_value``."""
    kind = _KINDS.get(name) or _EARLIER_COLUMNS.get(name)
    if name in TEXT_COLUMNS:
        return _same if legacy else _text_cell
    if name == "format" or kind == "count":
        def read_int(text: str) -> Any:
            if len(text) <= 18 and text.isdecimal() and text.isascii():
                return int(text)  # what _parse_int(text.strip()) gives
            return _csv_value(name, text, legacy)
        return read_int
    if kind == "ms":
        optional = name in _OPTIONAL or name in _EARLIER_COLUMNS

        def read_ms(text: str) -> Any:
            if optional and text == "":
                return None
            try:
                value = float(text)
            except ValueError:
                return text
            return value if math.isfinite(value) else _Unrepresentable(text, _NOT_FINITE)
        return read_ms
    if kind == "time":
        return _same  # what _csv_value gives: the text, read by ScheduleRow.from_dict
    if kind in ("record", "baselines"):
        read: dict[str, Any] = {}  # JSON cells are read-only from here on

        def read_json(text: str) -> Any:
            value = read.get(text)
            if value is None:
                made = _Unrepresentable.made
                value = _csv_value(name, text, legacy)
                # a value holding an _Unrepresentable is made afresh (and counted) each time
                if len(read) < _CELLS_REMEMBERED and _Unrepresentable.made == made:
                    read[text] = value
            return value
        return read_json
    return lambda text: _csv_value(name, text, legacy)


#: Distinct JSON cells a column's reading remembers.
_CELLS_REMEMBERED = 4096


def _csv_items(lines: Iterator[str]) -> Iterator[tuple[int, Any, bool]]:
    reader = csv.reader(lines)
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
        readers = [_cell_reader(name, legacy) for name in header]
        fields = [name for name in header
                  if name in _KINDS or name in _EARLIER_COLUMNS or name == "format"]
        extra = [name for name in header  # format 1: the problem's columns
                 if name not in CSV_COLUMNS and name not in _EARLIER_COLUMNS]
        for index, cells in enumerate(reader):
            if len(cells) != len(header):
                yield index, RecordError(f"has {len(cells)} cells; the header has "
                                         f"{len(header)}"), True
                continue
            made = _Unrepresentable.made
            try:
                flat = {name: read(cell) for name, read, cell in zip(header, readers, cells)}
            except RecordError as exc:
                yield index, exc, True
                continue
            fits = _Unrepresentable.made == made
            data = {name: flat[name] for name in fields}
            data["provenance"] = {name: flat[name] for name in PROVENANCE_FIELDS}
            if legacy:  # format 1: every column that is not a row field is a problem field
                data["problem"] = {name: flat[name] for name in extra}
            yield index, data, fits
    except csv.Error as exc:
        raise UnreadableFile(f"not CSV: {exc}") from None


def _check_row(data: Any, codecs: Mapping[str, FamilyCodec]) -> ScheduleRow:
    """``ScheduleRow`` from one item, or :class:`RecordError` with the reason."""
    if isinstance(data, Exception):
        raise data
    if isinstance(data, Mapping):
        _check_numbers(data)  # as the file has it: a key named twice at the top is lost below
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


#: Distinct schedules a file's reading remembers per family (a file holds few: rows share them).
_SCHEDULES_REMEMBERED = 4096


def _remembering_schedules(codecs: Mapping[str, FamilyCodec]) -> dict[str, FamilyCodec]:
    """``codecs`` whose schedule decoding builds (and validates) each distinct schedule once:
    the rows of a file share a few hundred schedules, and validating one costs more than the
    rest of its row. The dict form is remembered with each value's type, so ``true`` and ``1``
    stay apart; a form that does not hash (a list in it) or that fails is decoded every time;
    a form is a mapping (``_decoded`` checked)."""
    def remembering(decode: Callable[[Mapping[str, Any]], Any]) -> Callable:
        built: dict[tuple, Any] = {}

        def decode_schedule(data: Mapping[str, Any]) -> Any:
            try:  # keys in their order (a file writes them in one order), values, their types
                form = (tuple(data), tuple(data.values()), tuple(map(type, data.values())))
                schedule = built.get(form)
            except TypeError:  # an unhashable value
                return decode(data)
            if schedule is None:
                schedule = decode(data)
                if len(built) < _SCHEDULES_REMEMBERED:
                    built[form] = schedule
            return schedule
        return decode_schedule

    return {name: dataclasses.replace(codec, decode_schedule=remembering(codec.decode_schedule))
            for name, codec in codecs.items()}


def read_rows(path: Path, codecs: Mapping[str, FamilyCodec]
              ) -> tuple[list[tuple[int, ScheduleRow]], list[str]]:
    """The valid rows of a file, as ``(index, ScheduleRow)``, and the rejections as
    ``"row N: reason"``. Raises :class:`UnreadableFile` when the file as a whole is unusable."""
    try:
        if not path.is_file():
            raise UnreadableFile("not a regular file" if path.exists() else "no such file")
        raw = open(path, "rb")
    except OSError as exc:
        raise UnreadableFile(f"cannot read it: {exc.strerror or exc}") from None
    with io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as file:
        try:
            kind = _kind(path, file.read(_SNIFF))
            file.seek(0)
            return _checked_rows(_json_items(file) if kind == "json"
                                 else _csv_items(_lines(file)), codecs)
        except UnicodeDecodeError as exc:
            raise UnreadableFile(f"not UTF-8 text, so neither JSON nor CSV ({exc.reason})") \
                from None
        except OSError as exc:
            raise UnreadableFile(f"cannot read it: {exc.strerror or exc}") from None


def _quick_checks(name: str, given: Any, typed: Any) -> None:
    """What :func:`_check_row` checks beyond ``ScheduleRow.from_dict``, as ``db.RowDecoder``'s
    ``check``: raises (any exception) where ``_check_row`` would reject the row."""
    if name in ("problem", "schedule"):
        for key, value in given.items():  # the same types: nothing for _check_bools to find
            if type(value) is not type(typed.get(key, value)):
                _check_bools(given, typed, name)
                return
    elif name == "arch":
        if given not in ARCHITECTURES:
            raise RecordError(f"unknown architecture {given!r}")
    elif name == "device_name":
        check_text(name, given, MAX_TEXT)
    elif name == "provenance":
        for field, value in typed.items():
            check_text(field, value, MAX_TEXT)
    else:
        raise RecordError(f"no check of {name!r}")  # a field db.RowDecoder added: slow path


def _checked_rows(items: Iterator[tuple[int, Any, bool]], codecs: Mapping[str, FamilyCodec]
                  ) -> tuple[list[tuple[int, ScheduleRow]], list[str]]:
    """Each item checked: ``db.RowDecoder.quick`` takes the plainly valid rows (of a file's
    few distinct schedules and provenances, each checked once), ``_check_row`` all others, and
    says why one is rejected; then whether its numbers can be a measurement
    (``_plausible.implausible``)."""
    from datetime import datetime, timezone

    quick = RowDecoder(codecs, check=_quick_checks).quick
    codecs = _remembering_schedules(codecs)
    accepted: list[tuple[int, ScheduleRow]] = []
    rejected: list[str] = []
    seen: dict[tuple, int] = {}
    now = datetime.now(timezone.utc)
    for index, item, fits in items:
        row = quick(item) if fits or _numbers_fit(item) else None
        if row is None:
            try:
                row = _check_row(item, codecs)
            except RecordError as exc:
                rejected.append(f"row {index}: {exc}")
                continue
        why = implausible(row, now)
        if why is not None:
            rejected.append(f"row {index}: {why}")
            continue
        key = row.key  # a property that serialises the problem: once
        if key in seen:
            rejected.append(f"row {index}: duplicate key {row.describe_key()} (row "
                            f"{seen[key]} has it; the first is kept)")
            continue
        seen[key] = index
        accepted.append((index, row))
    return accepted, rejected
