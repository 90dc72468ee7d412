"""Rows in JSON files: pre-tuned tables shipped with tiledattention, exports and imports.

File format: ``{"format": 4, "rows": [ScheduleRow.to_dict(), ...]}``, rows sorted by key; a
row's baselines are one field, ``"baselines_ms": {"torch-cudnn": 1.23, ...}``. Older formats
are read: formats 1-3 hold ``torch_cudnn_ms``/``torch_flash_ms`` instead (read into
``baselines_ms`` as ``torch-cudnn``/``torch-flash``), formats 1-2 lack ``backend`` (rows
measured on a GPU) and format 1 ``family`` (rows of the forward kernel).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from ._encode import Candidates, pick_candidates
from ._errors import DatabaseArgumentError, OutputRefused, RecordError
from ._rows import ROW_FORMAT, FamilyCodec, ScheduleRow, canonical_json, codec_map

__all__ = ["RowTable", "load_rows_file", "load_rows_text", "dump_rows", "rows_json_chunks",
           "replaceable_target", "write_bytes_atomic", "write_chunks_atomic", "write_text_atomic"]


def _sort_key(row: ScheduleRow) -> tuple:
    return (row.key, row.median_ms, row.created_at.isoformat())


class RowTable:
    """An in-memory, read-only set of rows with the ``rows(...)`` filter of ``ScheduleDB``
    (``codecs`` are needed for its ``like=`` filter)."""

    def __init__(self, rows: Iterable[ScheduleRow], *, source: str = "<memory>",
                 codecs: Iterable[FamilyCodec] | Mapping[str, FamilyCodec] = ()) -> None:
        self._rows = tuple(sorted(rows, key=_sort_key))
        self._source = source
        self._codecs = codec_map(codecs)

    def rows(self, *, family: str | None = None, arch: str | None = None,
             device_name: str | None = None, like: Any = None, limit: int | None = None,
             offset: int = 0) -> list[ScheduleRow]:
        bucket = None
        if like is not None:
            if family not in self._codecs:
                raise DatabaseArgumentError(f"rows(like=...) needs the family= of a known codec; "
                                            f"got {family!r}")
            codec = self._codecs[family]
            bucket = codec.bucket_text(like)
        found = [r for r in self._rows
                 if (family is None or r.family == family)
                 and (arch is None or r.arch == arch)
                 and (device_name is None or r.device_name == device_name)
                 and (bucket is None or codec.bucket_text(r.problem) == bucket)]
        return found[offset:None if limit is None else offset + limit]

    def count(self, **filters: Any) -> int:
        return len(self.rows(**filters))

    def candidates(self, family: str, arch: str, problem: Any, *, template: str,
                   limit: int = 8) -> Candidates:
        """See ``ScheduleDB.candidates``."""
        return pick_candidates(self.rows(family=family, arch=arch), self._codecs[family],
                               problem, template=template, limit=limit)

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[ScheduleRow]:
        return iter(self._rows)

    def __str__(self) -> str:
        return self._source

    def __repr__(self) -> str:
        return f"RowTable({self._source!r}, {len(self._rows)} rows)"


def load_rows_text(text: str, source: str,
                   codecs: Iterable[FamilyCodec] | Mapping[str, FamilyCodec], *,
                   strict: bool = True) -> RowTable:
    """Rows from the JSON text of a rows file named ``source``. ``strict``: a bad row raises
    :class:`RecordError` (naming the source and the row); otherwise it is skipped with one
    warning."""
    codecs = codec_map(codecs)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{source} is not JSON: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"format", "rows"}:
        raise RecordError(f'{source} must hold {{"format": {ROW_FORMAT}, "rows": [...]}}')
    version = data["format"]
    if isinstance(version, bool) or not isinstance(version, int) or version > ROW_FORMAT:
        raise RecordError(f"{source} has format {version!r}; this tiledattention reads format "
                          f"{ROW_FORMAT} and older: upgrade tiledattention")
    if not isinstance(data["rows"], list):
        raise RecordError(f"{source}: 'rows' must be a list")
    rows = []
    for index, item in enumerate(data["rows"]):
        try:
            rows.append(ScheduleRow.from_dict(item, codecs))
        except RecordError as exc:
            if strict:
                raise RecordError(f"{source}: row {index}: {exc}") from None
            warnings.warn(f"tiledattention: skipping row {index} of {source}: {exc}",
                          RuntimeWarning, stacklevel=3)
    return RowTable(rows, source=source, codecs=codecs)


def load_rows_file(path: str | os.PathLike,
                   codecs: Iterable[FamilyCodec] | Mapping[str, FamilyCodec], *,
                   strict: bool = True) -> RowTable:
    """Read a rows file (see :func:`load_rows_text`)."""
    path = Path(path)
    return load_rows_text(path.read_text(encoding="utf-8"), str(path), codecs, strict=strict)


def rows_json_chunks(rows: Iterable[ScheduleRow]) -> Iterator[str]:
    """The text of a rows file, a row at a time (what :func:`dump_rows` writes): sorted and
    byte-for-byte deterministic for a given set of rows, one row per line (compact JSON, keys
    sorted), so a file stays small, a diff shows the rows that changed, and a reader can take
    it a row at a time."""
    yield f'{{"format": {ROW_FORMAT}, "rows": ['
    separator = "\n"
    for row in sorted(rows, key=_sort_key):
        yield separator + canonical_json(row.to_dict())
        separator = ",\n"
    yield ("" if separator == "\n" else "\n") + "]}\n"


def dump_rows(rows: Iterable[ScheduleRow], path: str | os.PathLike) -> None:
    """Write rows to ``path`` atomically (:func:`write_chunks_atomic`), as
    :func:`rows_json_chunks` gives them."""
    write_chunks_atomic(Path(path), (chunk.encode("utf-8") for chunk in rows_json_chunks(rows)))


def write_text_atomic(path: Path, text: str) -> None:
    """UTF-8 ``text`` to ``path`` atomically (see :func:`write_chunks_atomic`)."""
    write_chunks_atomic(path, [text.encode("utf-8")])


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` atomically (see :func:`write_chunks_atomic`)."""
    write_chunks_atomic(path, [data])


#: What a path that is not a regular file is, for messages.
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"))


def replaceable_target(path: str | os.PathLike) -> tuple[Path, int | None]:
    """Where an atomic write of ``path`` goes, and the permission bits to give it: a symlink is
    followed to its target (written in its place; the link stays a link); a path that exists
    must be a regular file this process may write (:class:`OutputRefused` otherwise: a
    directory, a device such as ``/dev/stdout`` or ``/dev/null``, a FIFO or a socket would be
    replaced by a regular file). The bits are the existing file's (``None``: a new file)."""
    path = Path(path)
    try:
        found = os.stat(path)  # follows links, /proc/self/fd's included
    except FileNotFoundError:  # a new file, or a link to one: created where the link points
        return Path(os.path.realpath(path)), None
    if not stat.S_ISREG(found.st_mode):
        what = next((name for test, name in _KINDS if test(found.st_mode)),
                    "not a regular file")
        raise OutputRefused(f"{path} is {what}, not a regular file: nothing written (an "
                            "atomic write replaces only a regular file)")
    target = Path(os.path.realpath(path))
    if not os.access(target, os.W_OK):
        raise OutputRefused(f"{path} is a read-only file: nothing written (make it writable "
                            "or write elsewhere)")
    return target, stat.S_IMODE(found.st_mode)


def write_chunks_atomic(path: Path, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` through a temp file beside the target and ``os.replace``: readers see
    the old file or the new one, never a half-written one. The target is
    :func:`replaceable_target`'s: a symlink is written through, a directory, device, FIFO,
    socket or read-only file refused before anything is written; a replaced file keeps its
    permission bits (a new one gets 0644)."""
    target, mode = replaceable_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp makes 0600; tables and reports are meant to be shared
        os.fchmod(fd, 0o644 if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
