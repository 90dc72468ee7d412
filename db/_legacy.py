"""Reading a table of schema revision 0001-0002 (before kernel families) without migrating it:
the runtime's lookup opens the user database read-only, so it must understand the old layout,
where every row was the forward kernel's and the problem had a column per field."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ._rows import LEGACY_FAMILY, FamilyCodec, canonical_json

__all__ = ["LEGACY_PROBLEM", "from_legacy"]

#: The problem columns of schema revisions 0001-0002, when every row was the forward kernel's
#: (``LEGACY_FAMILY``); a lookup still reads such a file without migrating it.
LEGACY_PROBLEM = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype",
                   "causal")


class _Fields:
    """A problem's dict form, for ``FamilyCodec`` methods that take a problem value."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def to_dict(self) -> dict[str, Any]:
        return self._data


def from_legacy(records: Iterable[Any], codecs: Mapping[str, FamilyCodec],
                filters: Mapping[str, Any]) -> list[dict]:
    """Records of a revision-0001/0002 table in the current shape, filtered, in key order."""
    codec = codecs.get(LEGACY_FAMILY)
    if codec is None:
        return []
    found = []
    for record in records:
        problem = {name: record[name] for name in LEGACY_PROBLEM}
        problem["causal"] = bool(problem["causal"])
        converted = {**record, "family": LEGACY_FAMILY, "backend": "gpu",
                     "problem": canonical_json(problem),
                     "bucket": codec.bucket_text(_Fields(problem))}
        if all(converted.get(name) == value for name, value in filters.items()):
            found.append(converted)
    return sorted(found, key=lambda r: (r["family"], r["arch"], r["problem"], r["device_name"]))
