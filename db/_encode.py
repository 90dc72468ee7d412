"""Rows to and from table records, and the lookup's candidates computed in Python (for JSON row
tables and for tables of the pre-family layout, which the database cannot order itself)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Iterable, NamedTuple

from ._errors import DatabaseArgumentError, RecordError
from ._rows import (LEGACY_BASELINES, MAX_TERMS, PROVENANCE_FIELDS, Baselines, FamilyCodec,
                    Provenance, ScheduleRow, canonical_json)

__all__ = ["Candidates", "problem_key", "row_values", "decode_record", "pick_candidates"]


class Candidates(NamedTuple):
    """What a row source offers the lookup for one problem (see ``ScheduleDB.candidates``)."""

    exact: list[ScheduleRow]  # this problem, any device, current template, measured on a GPU
    nearest: list[ScheduleRow]  # the closest of its bucket by the family's distance terms
    stale: int  # rows of its bucket from another template


def problem_key(problem: Any) -> str:
    to_dict = getattr(problem, "to_dict", None)
    if not callable(to_dict):
        raise DatabaseArgumentError(f"problem must be a problem value with to_dict(); got "
                                    f"{type(problem).__name__}")
    return canonical_json(to_dict())


def row_values(row: ScheduleRow, codec: FamilyCodec,
               texts: dict[int, tuple[Any, str]] | None = None) -> dict[str, Any]:
    """The table record of ``row``. ``texts``: a cache of schedule texts and provenance
    columns the caller keeps for a batch of rows (``id(value) -> (value, its columns)``; the
    rows of an import file share a few hundred schedule objects and a few provenances, and
    serialising one costs more than the rest of a record)."""
    problem = row.problem.to_dict()
    values = {"family": row.family, "arch": row.arch, "device_name": row.device_name,
              "backend": row.backend, "problem": row.problem_text,
              "bucket": codec.bucket_of(problem)}
    values.update(zip(TERM_NAMES, codec.terms_of(problem)))
    schedule, provenance = row.schedule, row.provenance
    if texts is None:
        texts = {}
    known = texts.get(id(schedule))
    if known is None or known[0] is not schedule:
        # the entry keeps the value alive: its id stays its own
        known = texts[id(schedule)] = (schedule, canonical_json(schedule.to_dict()))
    values.update(schedule=known[1], median_ms=row.median_ms, spread_ms=row.spread_ms,
                  tflops=row.tflops, default_ms=row.default_ms,
                  baselines_ms=_baselines_text(row.baselines), trials=row.trials,
                  created_at=row.created_at)
    known = texts.get(id(provenance))
    if known is None or known[0] is not provenance:
        known = texts[id(provenance)] = (provenance, provenance.to_dict())
    values.update(known[1])
    return values


#: ``term0..``, as many as a family has distance terms.
TERM_NAMES = tuple(f"term{i}" for i in range(MAX_TERMS))


def _baselines_text(baselines: Any) -> str:
    """``canonical_json(dict(baselines))``, ``"{}"`` when there are none. A ``Baselines``
    (every row's: ``ScheduleRow`` checks it) holds names of ``BASELINE_PATTERN`` (nothing JSON
    escapes) in sorted order and finite floats, whose JSON is their ``repr``: written at once."""
    if not baselines:
        return "{}"
    if type(baselines) is not Baselines:
        return canonical_json(dict(baselines))
    return "{" + ",".join([f'"{name}":{ms!r}' for name, ms in baselines._items.items()]) + "}"


def _created_at(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite: the stored text (see ScheduleDB._query)
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise RecordError(f"created_at must be a time; got {value!r}") from None
    if not isinstance(value, datetime):
        raise RecordError(f"created_at must be a time; got {value!r}")
    if value.tzinfo is None:  # SQLite stores the UTC wall time without an offset
        value = value.replace(tzinfo=timezone.utc)
    return value


def _baselines(record: Any) -> dict[str, Any]:
    """The baselines of a table record: its ``baselines_ms`` JSON text, or, in a table of
    revision 0001-0003 (read without migrating it), its ``torch_cudnn_ms``/``torch_flash_ms``
    columns (those not NULL)."""
    text = record.get("baselines_ms")
    if text is not None:
        try:
            return json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise RecordError(f"baselines_ms is not JSON: {exc}") from None
    return {name: record[old] for old, name in LEGACY_BASELINES.items()
            if record.get(old) is not None}


def decode_record(record: Any, codec: FamilyCodec) -> ScheduleRow:
    """The row of a table record (``RecordError``/``ValueError`` when it does not decode)."""
    return ScheduleRow(
        family=record["family"], arch=record["arch"], device_name=record["device_name"],
        backend=record.get("backend") or "gpu",
        problem=codec.problem(record["problem"]), schedule=codec.schedule(record["schedule"]),
        median_ms=record["median_ms"], spread_ms=record["spread_ms"], tflops=record["tflops"],
        default_ms=record.get("default_ms"), baselines=_baselines(record),
        trials=record["trials"],
        created_at=_created_at(record["created_at"]),
        provenance=Provenance.from_dict({name: record[name] for name in PROVENANCE_FIELDS}),
    )


def pick_candidates(rows: Iterable[ScheduleRow], codec: FamilyCodec, problem: Any, *,
                    template: str, limit: int) -> Candidates:
    """``Candidates`` of ``problem`` among ``rows`` (already of its family and architecture)."""
    bucket, key = codec.bucket_text(problem), problem_key(problem)
    mine = codec.terms(problem)
    weights = codec.weights()
    same = [r for r in rows if codec.bucket_text(r.problem) == bucket]
    usable = [r for r in same if r.provenance.template_hash == template and r.backend == "gpu"]

    def distance(row: ScheduleRow) -> float:
        return sum(w * abs(a - b) for w, a, b in zip(weights, codec.terms(row.problem), mine))

    return Candidates(
        exact=[r for r in usable if problem_key(r.problem) == key],
        nearest=sorted(usable, key=lambda r: (distance(r), r.median_ms))[:limit],
        stale=sum(r.provenance.template_hash != template for r in same))
