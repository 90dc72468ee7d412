"""What every family's schedule type shares: a versioned plain-dict form, JSON, a stable key,
``replace``, and the field checks that name the field, the range and the value."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, ClassVar, Mapping

from ..errors import ScheduleError

__all__ = ["ScheduleValue"]


class ScheduleValue:
    """Mixin of a frozen schedule dataclass; ``FORMAT`` is the dict form's version and ``LABEL``
    names the type in messages (``"decode"`` gives "a decode schedule ...", ``""`` plain "a
    schedule ...": the prefill forward's, the first family). ``ADDED_FIELDS`` are fields added
    to the dict form after its format was first written, whose default is what the kernel did
    before they existed: only they may be missing from a dict. ``OMITTED_AT_DEFAULT``, a subset
    of them, are left out of the dict form at their default, so a schedule that does not use
    them keeps the dict, JSON and :attr:`key` it had before they existed."""

    FORMAT: ClassVar[int]
    LABEL: ClassVar[str]
    ADDED_FIELDS: ClassVar[tuple[str, ...]] = ()
    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _what(cls) -> str:
        return f"{cls.LABEL} schedule" if cls.LABEL else "schedule"

    def to_dict(self) -> dict[str, Any]:
        # the fields are scalars: a shallow dict is asdict()'s result without its deep copy
        # (to_dict runs for every row an import checks or stores)
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for f in dataclasses.fields(self):
            if f.name in self.OMITTED_AT_DEFAULT and data[f.name] == f.default:
                del data[f.name]
        return {"format": self.FORMAT, **data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """Inverse of :meth:`to_dict`; rejects unknown fields, newer formats and a dict that
        lacks a field other than ``ADDED_FIELDS``: a stored schedule names every field, and a
        default filled in for one would describe a kernel other than the one measured."""
        what = cls._what()
        if not isinstance(data, Mapping):
            raise ScheduleError(f"a {what} must be a mapping; got {type(data).__name__}")
        data = dict(data)
        version = data.pop("format", cls.FORMAT)
        if not isinstance(version, int) or version > cls.FORMAT:
            raise ScheduleError(f"{what} format {version!r} is newer than this tiledattention "
                                f"understands ({cls.FORMAT}); upgrade tiledattention")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ScheduleError(f"unknown {what} field(s) {unknown}; known: {sorted(known)}")
        schedule = cls(**data)  # a bad value is named first
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in data and f.name not in cls.ADDED_FIELDS]
        if missing:
            added = (f" but the ones added since ({', '.join(cls.ADDED_FIELDS)}), which read "
                     f"as their defaults" if cls.ADDED_FIELDS else "")
            raise ScheduleError(f"{what} lacks field(s) {missing}; a stored {what} of format "
                                f"{cls.FORMAT} names every field{added}")
        return schedule

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Any:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"a {cls._what()} must be JSON; {exc}") from None
        return cls.from_dict(data)

    @property
    def key(self) -> str:
        """Stable short identifier: equal schedules have equal keys across processes."""
        return hashlib.sha1(self.to_json().encode()).hexdigest()[:12]

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)

    def _check_int(self, name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScheduleError(f"{type(self).__name__}.{name} must be an int; got {value!r}")

    def _check_int_range(self, name: str, value: Any, lo: int, hi: int,
                         extra: str = "") -> None:
        """``extra``: what else the field may hold, in words (``" or None"``)."""
        self._check_int(name, value)
        if not lo <= value <= hi:
            raise ScheduleError(f"{type(self).__name__}.{name} must be in {lo}..{hi}{extra}; "
                                f"got {value}")

    def _check_bools(self) -> None:
        """Every field annotated ``bool`` holds a bool (not 0/1 or a string)."""
        for f in dataclasses.fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise ScheduleError(f"{type(self).__name__}.{f.name} must be a bool; got "
                                    f"{getattr(self, f.name)!r}")

    def _check_choice(self, name: str, value: Any, choices: tuple) -> None:
        self._check_int(name, value)
        if value not in choices:
            raise ScheduleError(f"{type(self).__name__}.{name} must be one of {list(choices)}; "
                                f"got {value!r}")
