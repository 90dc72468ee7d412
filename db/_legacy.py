"""Reading a table of schema revision 0001-0002 (before kernel families) without migrating it:
the runtime's lookup opens the user database read-only, so it must understand the old layout,
where every row was the forward kernel's and the problem had a column per field."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ._rows import LEGACY_FAMILY, FamilyCodec, canonical_json

__all__ = ["LEGACY_PROBLEM", "legacy_columns", "from_legacy"]

#: The problem columns of schema revisions 0001-0002, when every row was the forward kernel's
#: (``LEGACY_FAMILY``); a lookup still reads such a file without migrating it.
LEGACY_PROBLEM = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype",
                   "causal")


def legacy_columns(present: frozenset[str]) -> list[Any]:
    from sqlalchemy import Boolean, Integer, String, column, table

    from ._schema import TABLE_NAME, schedules

    legacy = {"causal": Boolean(), "dtype": String()}
    return list(table(TABLE_NAME, *[
        column(name, schedules.c[name].type if name in schedules.c else
               legacy.get(name, Integer())) for name in sorted(present)]).c)


def from_legacy(records: Iterable[Any], codecs: Mapping[str, FamilyCodec],
                 key: tuple[str, str, str, str] | None, filters: dict[str, Any]) -> list[dict]:
    """Records of a revision-0001/0002 table in the current shape, filtered and ordered."""
    codec = codecs.get(LEGACY_FAMILY)
    if codec is None:
        return []
    found = []
    for record in records:
        problem = {name: record[name] for name in LEGACY_PROBLEM}
        problem["causal"] = bool(problem["causal"])
        converted = {**record, "family": LEGACY_FAMILY, "problem": canonical_json(problem),
                     "bucket": canonical_json({n: problem[n] for n in codec.bucket_fields})}
        if key is not None and (converted["family"], converted["arch"],
                                converted["device_name"], converted["problem"]) != key:
            continue
        if all(converted[name] == value for name, value in filters.items()):
            found.append(converted)
    return sorted(found, key=lambda r: (r["family"], r["arch"], r["device_name"], r["problem"]))
