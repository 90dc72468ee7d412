"""The reading side of ``ScheduleDB``: filtered and paged rows, counts, and the lookup's
candidates, each one query the database answers from an index; tables of the pre-family layout
(revisions 0001-0002) are read without migrating them."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Iterable

from ._encode import Candidates, decode_record, pick_candidates, problem_key
from ._errors import DatabaseArgumentError, DatabaseUnavailable
from ._legacy import LEGACY_PROBLEM, from_legacy, legacy_columns
from ._rows import ScheduleRow

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = ["Queries"]


class Queries:
    """Mixed into ``ScheduleDB``, which provides ``_transaction``, ``_codecs``, ``_codec``,
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
        from sqlalchemy import func, select

        from ._schema import schedules as t

        filters = self._filters(family, arch, device_name, like)
        with self._transaction(write=False) as connection:
            if self._legacy(connection):
                return len(self._select(filters))
            query = select(func.count()).select_from(t).where(*self._where(t, filters))
            return connection.execute(query).scalar_one()

    def candidates(self, family: str, arch: str, problem: Any, *, template: str,
                   limit: int = 8) -> Candidates:
        """What the lookup needs for ``problem``, in three indexed queries: the GPU-measured rows
        of this exact problem (any device), the ``limit`` nearest GPU-measured rows of its bucket
        by the family's distance terms, both of template ``template``; and how many rows of the
        bucket belong to another template (stale)."""
        from sqlalchemy import func, select

        from ._schema import TERM_COLUMNS, schedules as t

        codec = self._codec(family)
        with self._transaction(write=False) as connection:
            if self._legacy(connection):
                return pick_candidates(self._select({"family": family, "arch": arch}), codec,
                                       problem, template=template, limit=limit)
            usable = (t.c.template_hash == template, t.c.backend == "gpu")
            # the unique index (family, arch, problem, ...)
            exact = connection.execute(self._query(t, connection).where(
                *self._where(t, {"family": family, "arch": arch, "problem": problem_key(
                    problem)}), *usable)).mappings().all()
            # the covering lookup index: ids first, then only those rows
            bucket = self._where(t, {"family": family, "arch": arch,
                                     "bucket": codec.bucket_text(problem)})
            distance = sum(weight * func.abs(t.c[column] - value) for column, weight, value in
                           zip(TERM_COLUMNS, codec.weights(), codec.terms(problem)))
            ids = connection.execute(select(t.c.id).where(*bucket, *usable).order_by(
                distance, t.c.median_ms).limit(limit)).scalars().all() if limit else []
            near = connection.execute(self._query(t, connection).where(t.c.id.in_(ids))
                                      ).mappings().all() if ids else []
            near = sorted(near, key=lambda r: ids.index(r["id"]))
            stale = connection.execute(select(func.count()).select_from(t).where(
                *bucket, t.c.template_hash != template)).scalar_one()
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

    def _where(self, t: Any, filters: dict[str, Any]) -> list[Any]:
        return [t.c[name] == value for name, value in filters.items()] + [
            t.c.family.in_(sorted(self._codecs))]

    def _legacy(self, connection: "Connection") -> bool:
        """Whether the table has the layout of revision 0001-0002 (read without migrating)."""
        present = self._present_columns(connection)
        return "problem" not in present and set(LEGACY_PROBLEM) <= present

    def _query(self, t: Any, connection: "Connection") -> Any:
        """``SELECT`` of the columns this file has (and the baseline columns of a revision-0003
        file, not migrated); ``created_at`` as stored text on SQLite, so one malformed value
        skips its row instead of failing the whole query."""
        from sqlalchemy import Float, String, column, select, type_coerce

        from ._schema import LEGACY_BASELINE_COLUMNS, OPTIONAL_COLUMNS

        present = self._present_columns(connection)
        lacking = [c.name for c in t.c if c.name not in present
                   and c.name not in OPTIONAL_COLUMNS]
        if lacking:
            raise DatabaseUnavailable(
                f"{self} lacks the column(s) {lacking}: its schema revision is not one this "
                "tiledattention can read; upgrade tiledattention")
        columns = [type_coerce(c, String).label(c.name) if c.name == "created_at"
                   and self._target.sqlite else c for c in t.c if c.name in present]
        # unbound columns: rendered by name in the one table's SELECT, adding no FROM
        columns += [column(name, Float) for name in LEGACY_BASELINE_COLUMNS if name in present]
        return select(*columns)

    def _select(self, filters: dict[str, Any], *, limit: int | None = None,
                offset: int = 0) -> list[ScheduleRow]:
        from sqlalchemy import select

        from ._schema import KEY_COLUMNS, schedules as t

        if not self._codecs:
            return []
        with self._transaction(write=False) as connection:
            if self._legacy(connection):
                records = connection.execute(select(*legacy_columns(
                    self._present_columns(connection)))).mappings().all()
                found = from_legacy(records, self._codecs, filters)
                return self._decoded(found[offset:None if limit is None else offset + limit])
            query = self._query(t, connection).where(*self._where(t, filters)).order_by(
                *[t.c[name] for name in KEY_COLUMNS]).offset(offset or None).limit(limit)
            records = connection.execute(query).mappings().all()
        return self._decoded(records)

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
