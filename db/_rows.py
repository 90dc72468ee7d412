"""``ScheduleRow``: one tuned result (the winner for one key), and its versioned dict form."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

from tiledattention._problem import Problem
from tiledattention._provenance import Provenance
from tiledattention._schedule import Schedule

__all__ = ["ScheduleRow", "ROW_FORMAT", "ARCH_PATTERN"]

#: Version of the dict form of a row (and of the JSON files made of rows).
ROW_FORMAT = 1
#: Architecture names as cuTile spells them: ``sm_90``, ``sm_100a``.
ARCH_PATTERN = re.compile(r"sm_[0-9]{2,3}[a-z]?")

_PROBLEM_FIELDS = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "dtype",
                   "causal")
_OPTIONAL_MS = ("default_ms", "torch_cudnn_ms", "torch_flash_ms")


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True, kw_only=True)
class ScheduleRow:
    """The best schedule found for one key ``(arch, device_name, problem)``, with its timings.

    Times are milliseconds per call: ``median_ms`` of the schedule, ``spread_ms`` its
    interquartile range, and the same problem under the architecture's default schedule and under
    PyTorch's cuDNN / flash backends when they were measured (``None`` otherwise).
    ``created_at`` is timezone-aware and normalised to UTC.
    """

    arch: str
    device_name: str
    problem: Problem
    schedule: Schedule
    median_ms: float
    spread_ms: float
    tflops: float
    default_ms: float | None = None
    torch_cudnn_ms: float | None = None
    torch_flash_ms: float | None = None
    trials: int
    created_at: datetime = field(default_factory=_utc_now)
    provenance: Provenance

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or not ARCH_PATTERN.fullmatch(self.arch):
            raise ValueError(f"ScheduleRow.arch must look like 'sm_90'; got {self.arch!r}")
        if not isinstance(self.device_name, str) or not self.device_name.strip():
            raise ValueError(
                f"ScheduleRow.device_name must be a non-empty str; got {self.device_name!r}")
        for name, cls in (("problem", Problem), ("schedule", Schedule),
                          ("provenance", Provenance)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"ScheduleRow.{name} must be a {cls.__name__}; got "
                                 f"{type(getattr(self, name)).__name__}")
        for name in ("median_ms", "spread_ms", "tflops", *_OPTIONAL_MS):
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_MS:
                continue
            _check_ms(name, value, positive=name != "spread_ms" and name != "tflops")
            object.__setattr__(self, name, float(value))
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ValueError(f"ScheduleRow.trials must be an int >= 1; got {self.trials!r}")
        if not isinstance(self.created_at, datetime) or self.created_at.tzinfo is None:
            raise ValueError("ScheduleRow.created_at must be a timezone-aware datetime; got "
                             f"{self.created_at!r}")
        object.__setattr__(self, "created_at", self.created_at.astimezone(timezone.utc))

    @property
    def key(self) -> tuple:
        """The database key: one row per ``(arch, device_name, dtype, causal, shape...)``."""
        p = self.problem
        return (self.arch, self.device_name, p.dtype, p.causal, p.batch, p.heads_q, p.heads_kv,
                p.seqlen_q, p.seqlen_k, p.head_dim)

    def describe_key(self) -> str:
        return f"{self.arch} {self.device_name!r} {self.problem.describe()}"

    # -- dict form ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict with the format version under ``"format"``."""
        return {
            "format": ROW_FORMAT,
            "arch": self.arch,
            "device_name": self.device_name,
            "problem": {name: getattr(self.problem, name) for name in _PROBLEM_FIELDS},
            "schedule": self.schedule.to_dict(),
            "median_ms": self.median_ms,
            "spread_ms": self.spread_ms,
            "tflops": self.tflops,
            "default_ms": self.default_ms,
            "torch_cudnn_ms": self.torch_cudnn_ms,
            "torch_flash_ms": self.torch_flash_ms,
            "trials": self.trials,
            "created_at": self.created_at.isoformat(),
            "provenance": self.provenance.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ScheduleRow":
        """Inverse of :meth:`to_dict`. Raises ``ValueError`` naming the first bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a schedule row must be a mapping; got {type(data).__name__}")
        data = dict(data)
        version = data.pop("format", None)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"row field 'format' must be an int >= 1; got {version!r}")
        if version > ROW_FORMAT:
            raise ValueError(f"row format {version} is newer than this tiledattention "
                             f"understands ({ROW_FORMAT}); upgrade tiledattention")
        known = {"arch", "device_name", "problem", "schedule", "median_ms", "spread_ms", "tflops",
                 *_OPTIONAL_MS, "trials", "created_at", "provenance"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown row field(s) {unknown}; known: {sorted(known)}")
        optional = set(_OPTIONAL_MS)
        missing = sorted(known - optional - set(data))
        if missing:
            raise ValueError(f"row lacks field(s) {missing}")

        def typed(name: str, types: type | tuple[type, ...]) -> Any:
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, types):
                names = types.__name__ if isinstance(types, type) else \
                    " or ".join(t.__name__ for t in types)
                raise ValueError(f"row field {name!r} must be {names}; got {value!r}")
            return value

        def number(name: str) -> float:
            return float(typed(name, (int, float)))

        for name in ("problem", "schedule", "provenance"):
            typed(name, dict)
        try:
            problem = _problem_from_dict(data["problem"])
        except ValueError as exc:
            raise ValueError(f"row field 'problem': {exc}") from None
        try:
            schedule = Schedule.from_dict(data["schedule"])
        except ValueError as exc:
            raise ValueError(f"row field 'schedule': {exc}") from None
        try:
            provenance = Provenance.from_dict(data["provenance"])
        except ValueError as exc:
            raise ValueError(f"row field 'provenance': {exc}") from None
        try:
            created_at = datetime.fromisoformat(typed("created_at", str))
        except ValueError:
            raise ValueError("row field 'created_at' must be an ISO 8601 time; got "
                             f"{data['created_at']!r}") from None
        if created_at.tzinfo is None:
            raise ValueError("row field 'created_at' must carry a UTC offset; got "
                             f"{data['created_at']!r}")
        return cls(
            arch=typed("arch", str), device_name=typed("device_name", str), problem=problem,
            schedule=schedule, median_ms=number("median_ms"), spread_ms=number("spread_ms"),
            tflops=number("tflops"),
            **{name: None if data.get(name) is None else number(name) for name in _OPTIONAL_MS},
            trials=typed("trials", int), created_at=created_at, provenance=provenance,
        )


def _problem_from_dict(data: Mapping[str, Any]) -> Problem:
    unknown = sorted(set(data) - set(_PROBLEM_FIELDS))
    missing = [name for name in _PROBLEM_FIELDS if name not in data]
    if unknown or missing:
        raise ValueError(f"expected fields {list(_PROBLEM_FIELDS)}; unknown {unknown}, "
                         f"missing {missing}")
    return Problem(**data)  # Problem checks every type itself (UnsupportedProblemError)


def _check_ms(name: str, value: Any, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"ScheduleRow.{name} must be a finite number {bound}; got {value!r}")
