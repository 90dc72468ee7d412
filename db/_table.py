"""Rows in JSON files: the pre-tuned table shipped with tiledattention, exports and imports.

File format: ``{"format": 1, "rows": [ScheduleRow.to_dict(), ...]}``, rows sorted by key.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from importlib import resources
from pathlib import Path
from typing import Iterable, Iterator

from ._rows import ARCH_PATTERN, ROW_FORMAT, ScheduleRow

__all__ = ["RowTable", "load_rows_file", "dump_rows", "shipped_table", "filter_rows"]


def filter_rows(rows: Iterable[ScheduleRow], *, arch: str | None = None,
                device_name: str | None = None, dtype: str | None = None,
                causal: bool | None = None, head_dim: int | None = None) -> list[ScheduleRow]:
    """The rows matching every filter that is not ``None``."""
    return [r for r in rows
            if (arch is None or r.arch == arch)
            and (device_name is None or r.device_name == device_name)
            and (dtype is None or r.problem.dtype == dtype)
            and (causal is None or r.problem.causal == causal)
            and (head_dim is None or r.problem.head_dim == head_dim)]


def _sort_key(row: ScheduleRow) -> tuple:
    return (row.key, row.median_ms, row.created_at.isoformat())


class RowTable:
    """An in-memory, read-only set of rows with the ``rows(...)`` filter of ``ScheduleDB``."""

    def __init__(self, rows: Iterable[ScheduleRow], *, source: str = "<memory>") -> None:
        self._rows = tuple(sorted(rows, key=_sort_key))
        self._source = source

    def rows(self, *, arch: str | None = None, device_name: str | None = None,
             dtype: str | None = None, causal: bool | None = None,
             head_dim: int | None = None) -> list[ScheduleRow]:
        return filter_rows(self._rows, arch=arch, device_name=device_name, dtype=dtype,
                           causal=causal, head_dim=head_dim)

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[ScheduleRow]:
        return iter(self._rows)

    def __str__(self) -> str:
        return self._source

    def __repr__(self) -> str:
        return f"RowTable({self._source!r}, {len(self._rows)} rows)"


def _parse(text: str, source: str, *, strict: bool) -> RowTable:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} is not JSON: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"format", "rows"}:
        raise ValueError(f'{source} must hold {{"format": {ROW_FORMAT}, "rows": [...]}}')
    version = data["format"]
    if isinstance(version, bool) or not isinstance(version, int) or version > ROW_FORMAT:
        raise ValueError(f"{source} has format {version!r}; this tiledattention reads format "
                         f"{ROW_FORMAT} and older: upgrade tiledattention")
    if not isinstance(data["rows"], list):
        raise ValueError(f"{source}: 'rows' must be a list")
    rows = []
    for index, item in enumerate(data["rows"]):
        try:
            rows.append(ScheduleRow.from_dict(item))
        except ValueError as exc:
            if strict:
                raise ValueError(f"{source}: row {index}: {exc}") from None
            warnings.warn(f"tiledattention: skipping row {index} of {source}: {exc}",
                          RuntimeWarning, stacklevel=3)
    return RowTable(rows, source=source)


def load_rows_file(path: str | os.PathLike, *, strict: bool = True) -> RowTable:
    """Read a rows file. ``strict``: a bad row raises ``ValueError`` (naming the file and the
    row); otherwise it is skipped with one warning."""
    path = Path(path)
    return _parse(path.read_text(encoding="utf-8"), str(path), strict=strict)


def dump_rows(rows: Iterable[ScheduleRow], path: str | os.PathLike) -> None:
    """Write rows to ``path`` atomically (temp file + ``os.replace``); the output is sorted and
    byte-for-byte deterministic for a given set of rows."""
    items = [row.to_dict() for row in sorted(rows, key=_sort_key)]
    write_text_atomic(Path(path), json.dumps({"format": ROW_FORMAT, "rows": items},
                                             sort_keys=True, indent=1, allow_nan=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """UTF-8 ``text`` to ``path`` atomically (see :func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` through a temp file in the same directory and ``os.replace``: readers see
    the old file or the new one, never a half-written one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; tables and reports are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def shipped_table(arch: str) -> RowTable | None:
    """The pre-tuned table packaged as ``tiledattention/pretuned/<arch>.json``, or ``None``.

    Rows that no longer decode (e.g. a schedule field that changed) are skipped with a warning.
    """
    if not isinstance(arch, str) or not ARCH_PATTERN.fullmatch(arch):
        raise ValueError(f"arch must look like 'sm_90'; got {arch!r}")
    resource = resources.files("tiledattention").joinpath("pretuned", f"{arch}.json")
    if not resource.is_file():
        return None
    return _parse(resource.read_text(encoding="utf-8"),
                  f"tiledattention/pretuned/{arch}.json", strict=False)
