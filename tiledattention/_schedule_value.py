"""What the decode and backward schedule types share: a versioned plain-dict form, JSON, a
stable key, ``replace``, and the field checks that name the field, the range and the value."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, ClassVar, Mapping

from .errors import ScheduleError

__all__ = ["ScheduleValue"]


class ScheduleValue:
    """Mixin of a frozen schedule dataclass; ``FORMAT`` is the dict form's version and ``LABEL``
    names the type in messages (``"decode"`` gives "a decode schedule ..."). ``ADDED_FIELDS``
    are fields added to the dict form after its format was first written, whose default is
    what the kernel did before they existed: only they may be missing from a dict."""

    FORMAT: ClassVar[int]
    LABEL: ClassVar[str]
    ADDED_FIELDS: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        # the fields are scalars: a shallow dict is asdict()'s result without its deep copy
        return {"format": self.FORMAT, **{f.name: getattr(self, f.name)
                                          for f in dataclasses.fields(self)}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """Inverse of :meth:`to_dict`; rejects unknown fields, newer formats and a dict that
        lacks a field other than ``ADDED_FIELDS``: a stored schedule names every field, and a
        default filled in for one would describe a kernel other than the one measured."""
        if not isinstance(data, Mapping):
            raise ScheduleError(f"a {cls.LABEL} schedule must be a mapping; got "
                                f"{type(data).__name__}")
        data = dict(data)
        version = data.pop("format", cls.FORMAT)
        if not isinstance(version, int) or version > cls.FORMAT:
            raise ScheduleError(f"{cls.LABEL} schedule format {version!r} is newer than this "
                                f"tiledattention understands ({cls.FORMAT})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ScheduleError(f"unknown {cls.LABEL} schedule field(s) {unknown}; known: "
                                f"{sorted(known)}")
        schedule = cls(**data)  # a bad value is named first
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in data and f.name not in cls.ADDED_FIELDS]
        if missing:
            added = (f" but the ones added since ({', '.join(cls.ADDED_FIELDS)})"
                     if cls.ADDED_FIELDS else "")
            raise ScheduleError(f"{cls.LABEL} schedule lacks field(s) {missing}; a stored "
                                f"{cls.LABEL} schedule of format {cls.FORMAT} names every "
                                f"field{added}")
        return schedule

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def key(self) -> str:
        """Stable short identifier: equal schedules have equal keys across processes."""
        return hashlib.sha1(self.to_json().encode()).hexdigest()[:12]

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)

    def _check_int_range(self, name: str, value: Any, lo: int, hi: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScheduleError(f"{type(self).__name__}.{name} must be an int; got {value!r}")
        if not lo <= value <= hi:
            raise ScheduleError(f"{type(self).__name__}.{name} must be in {lo}..{hi}; got "
                                f"{value}")

    def _check_bools(self) -> None:
        """Every field annotated ``bool`` holds a bool (not 0/1 or a string)."""
        for f in dataclasses.fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise ScheduleError(f"{type(self).__name__}.{f.name} must be a bool; got "
                                    f"{getattr(self, f.name)!r}")

    def _check_choice(self, name: str, value: Any, choices: tuple) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value not in choices:
            raise ScheduleError(f"{type(self).__name__}.{name} must be one of {list(choices)}; "
                                f"got {value!r}")
