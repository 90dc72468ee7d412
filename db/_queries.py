"""The reading side of ``ScheduleDB``: filtered and paged rows, counts, and the lookup's
candidates, each one query the database answers from an index; tables of the pre-family layout
(revisions 0001-0002) are read without migrating them. The queries are ``_sql``'s, run through
the reader ``ScheduleDB._reading`` gives (``sqlite3`` or SQLAlchemy)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Iterable

from . import _sql
from ._encode import Candidates, decode_record, pick_candidates, problem_key
from ._errors import DatabaseArgumentError, DatabaseUnavailable
from ._legacy import LEGACY_PROBLEM, from_legacy
from ._rows import ScheduleRow
from ._schema import COLUMNS, LEGACY_BASELINE_COLUMNS, OPTIONAL_COLUMNS

if TYPE_CHECKING:
    from ._sql import SqliteReader

__all__ = ["Queries"]


class Queries:
    """Mixed into ``ScheduleDB``, which provides ``_reading``, ``_codecs``, ``_codec``,
    ``_present_columns`` and ``_target``."""

    def get(self, family: str, arch: str, device_name: str, problem: Any) -> ScheduleRow | None:
        """The row of this exact key, or ``None`` (also when it no longer decodes: one warning)."""
        found = self._select({"family": family, "arch": arch, "device_name": device_name,
                              "problem": problem_key(problem)})
        return found[0] if found else None

    def rows(self, *, family: str | None = None, arch: str | None = None,
             device_name: str | None = None, like: Any = None, limit: int | None = None,
             offset: int = 0) -> list[ScheduleRow]:
        """The rows matching every filter that is not ``None``, in key order (``limit`` /
        ``offset``: one page of them). ``like``: only rows that may answer for this problem
        (its ``FamilyCodec.bucket_text``; needs ``family``; an indexed query). A row that no
        longer decodes (e.g. its schedule stopped validating) is skipped with one warning."""
        return self._select(self._filters(family, arch, device_name, like), limit=limit,
                            offset=offset)

    def count(self, *, family: str | None = None, arch: str | None = None,
              device_name: str | None = None, like: Any = None) -> int:
        """How many stored rows ``rows(...)`` with these filters would see (before decoding)."""
        filters = self._filters(family, arch, device_name, like)
        with self._reading() as reader:
            if self._legacy(reader):
                return len(self._select(filters))
            return reader.scalar(*_sql.count_rows(filters, self._codecs))

    def candidates(self, family: str, arch: str, problem: Any, *, template: str,
                   limit: int = 8) -> Candidates:
        """What the lookup needs for ``problem``, in three indexed queries: the GPU-measured rows
        of this exact problem (any device), the ``limit`` nearest GPU-measured rows of its bucket
        by the family's distance terms, both of template ``template``; and how many rows of the
        bucket belong to another template (stale)."""
        codec = self._codec(family)
        with self._reading() as reader:
            if self._legacy(reader):
                return pick_candidates(self._select({"family": family, "arch": arch}), codec,
                                       problem, template=template, limit=limit)
            columns = self._columns(reader)
            usable = {"template_hash": template, "backend": "gpu"}
            # the unique index (family, arch, problem, ...)
            exact = reader.all(*_sql.select_rows(columns, {
                "family": family, "arch": arch, "problem": problem_key(problem), **usable},
                self._codecs))
            # the covering lookup index: ids first, then only those rows
            bucket = {"family": family, "arch": arch, "bucket": codec.bucket_text(problem)}
            ids = reader.column(*_sql.nearest_ids(
                {**bucket, **usable}, self._codecs, codec.weights(), codec.terms(problem),
                limit)) if limit else []
            near = reader.all(*_sql.rows_by_id(columns, ids)) if ids else []
            near = sorted(near, key=lambda r: ids.index(r["id"]))
            stale = reader.scalar(*_sql.count_rows(bucket, self._codecs,
                                                   {"template_hash": template}))
        return Candidates(self._decoded(exact), self._decoded(near), stale)

    def __len__(self) -> int:
        return self.count()

    def _filters(self, family: str | None, arch: str | None, device_name: str | None,
                 like: Any) -> dict[str, Any]:
        filters: dict[str, Any] = {"family": family, "arch": arch, "device_name": device_name}
        if like is not None:
            if family is None:
                raise DatabaseArgumentError("rows(like=...) needs family=")
            filters["bucket"] = self._codec(family).bucket_text(like)
        return {k: v for k, v in filters.items() if v is not None}

    def _legacy(self, reader: "SqliteReader") -> bool:
        """Whether the table has the layout of revision 0001-0002 (read without migrating)."""
        present = self._present_columns(reader)
        return "problem" not in present and set(LEGACY_PROBLEM) <= present

    def _columns(self, reader: "SqliteReader") -> list[str]:
        """The columns to read: those of the table this file has (and the baseline columns of a
        revision-0003 file, not migrated). ``created_at`` comes as the driver gives it: the
        stored text on SQLite, so one malformed value skips its row instead of failing the
        whole query."""
        present = self._present_columns(reader)
        lacking = [name for name in COLUMNS if name not in present
                   and name not in OPTIONAL_COLUMNS]
        if lacking:
            raise DatabaseUnavailable(
                f"{self} lacks the column(s) {lacking}: its schema revision is not one this "
                "tiledattention can read; upgrade tiledattention")
        return [name for name in (*COLUMNS, *LEGACY_BASELINE_COLUMNS) if name in present]

    def _select(self, filters: dict[str, Any], *, limit: int | None = None,
                offset: int = 0) -> list[ScheduleRow]:
        if not self._codecs:
            return []
        with self._reading() as reader:
            if self._legacy(reader):
                present = sorted(self._present_columns(reader))
                records = reader.all(f"SELECT {', '.join(present)} FROM schedules")
                found = from_legacy(records, self._codecs, filters)
                return self._decoded(found[offset:None if limit is None else offset + limit])
            records = reader.all(*_sql.select_rows(self._columns(reader), filters,
                                                   self._codecs, limit=limit, offset=offset))
        return self._decoded(records if limit is not None else records[offset:])

    def _decoded(self, records: Iterable[Any]) -> list[ScheduleRow]:
        rows = []
        for record in records:
            try:
                rows.append(decode_record(record, self._codecs[record["family"]]))
            except (ValueError, TypeError, KeyError) as exc:
                warnings.warn(
                    f"tiledattention: skipping the stored {record.get('family')} schedule for "
                    f"{record.get('problem')} on {record.get('arch')} in {self}: {exc}",
                    RuntimeWarning, stacklevel=3)
        return rows
