"""``ScheduleRow``: one tuned result (the winner for one key) of any kernel family, its field
spec and its versioned dict form.

The database knows nothing about kernels: a row's ``problem`` and ``schedule`` are the caller's
typed values (frozen objects with ``to_dict()``), and a :class:`FamilyCodec` the caller passes
in turns their stored dict forms back into those values. ``ROW_FIELDS`` is the one spelling of a
row's fields: the dict form, the CSV form (``tuner``) and the SQL table (``_schema``) follow it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ._errors import DatabaseArgumentError, DatabaseMisuse, RecordError

__all__ = ["ScheduleRow", "Provenance", "FamilyCodec", "RowDecoder", "RowField", "ROW_FIELDS",
           "ROW_FORMAT",
           "ARCH_PATTERN", "BACKENDS", "BASELINE_PATTERN", "Baselines", "LEGACY_BASELINES",
           "LEGACY_FAMILY", "MAX_BASELINES", "MAX_TERMS", "OPTIONAL_MS", "PROVENANCE_FIELDS",
           "canonical_json", "check_text", "codec_map"]

#: Version of the dict form of a row (and of the JSON files made of rows). Format 2 added
#: ``family`` (format-1 rows are read as rows of ``LEGACY_FAMILY``), format 3 ``backend``
#: (older rows were all measured on a GPU), format 4 ``baselines_ms`` (a mapping of baseline
#: name to median ms) in place of the fields ``torch_cudnn_ms`` and ``torch_flash_ms``
#: (``LEGACY_BASELINES``: older rows are read into the mapping).
ROW_FORMAT = 4
#: What measured a row: a real GPU, or the tuner's analytic model (never used by the runtime).
BACKENDS = ("gpu", "simulated")
#: Every row written before kernel families existed (row format 1, schema revision 0002) was the
#: prefill forward kernel's.
LEGACY_FAMILY = "forward"
#: Architecture names as cuTile spells them: ``sm_90``, ``sm_100a``.
ARCH_PATTERN = re.compile(r"sm_[0-9]{2,3}[a-z]?")
FAMILY_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")
PROVENANCE_FIELDS = ("template_hash", "cuda_tile", "tileiras", "torch", "driver")
#: The fixed baseline fields of row formats 1-3 (and columns of schema revisions 0001-0003), and
#: the baseline each one timed: what a row of an older file or table holds in ``baselines``.
LEGACY_BASELINES = {"torch_cudnn_ms": "torch-cudnn", "torch_flash_ms": "torch-flash"}
#: A baseline's name: what the family's ``Case.baselines()`` calls it (``torch-cudnn``).
BASELINE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
#: Most baselines one row may carry.
MAX_BASELINES = 16


#: What a message calls the unprintable characters one meets most in hostile or mangled text.
_UNPRINTABLE = {"\x00": "a NUL byte", "\x1b": "an escape character (an ANSI terminal sequence)",
                "\n": "a line break", "\r": "a carriage return", "\t": "a tab"}


def check_text(name: str, value: str, limit: int) -> None:
    """Raise :class:`RecordError` saying what is wrong with the text field ``name``: longer than
    ``limit`` characters, or holding a character that is not printable (NUL, an ANSI escape, a
    line break...), named with its position. A row's text ends up in tables, logs and
    terminals, where such characters hide or rewrite what is shown."""
    if len(value) > limit:
        raise RecordError(f"{name} must be printable text of at most {limit} characters; got "
                          f"{len(value)} characters")
    if value.isprintable():  # the common case, without a loop in Python
        return
    for index, char in enumerate(value):
        if not char.isprintable():
            what = _UNPRINTABLE.get(char, "a character that is not printable")
            raise RecordError(f"{name} must be printable text; got {what} ({char!r}) at "
                              f"character {index + 1} of {len(value)}")


def canonical_json(value: Any) -> str:
    """The one text form of a dict that keys and compares rows: sorted keys, no spaces."""
    return _CANONICAL.encode(value)


#: ``json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)``, without
#: building an encoder per call (keys and records of every row stored or imported use it)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class RowField:
    """One field of a stored row. ``kind``: ``text``, ``record`` (a problem or schedule: a dict
    in JSON, JSON text in CSV and SQL), ``ms`` (a finite float >= 0), ``baselines`` (a mapping of
    baseline name to median ms, the same in JSON, JSON text in CSV and SQL), ``count`` (an int
    >= 1), ``time`` (ISO 8601 with offset) or ``provenance``. ``name`` is the field's name in
    the dict, CSV and SQL forms; ``attr`` the ``ScheduleRow`` attribute when it differs."""

    name: str
    kind: str
    optional: bool = False
    attr: str = ""

    @property
    def attribute(self) -> str:
        return self.attr or self.name


ROW_FIELDS = (
    RowField("family", "text"),
    RowField("arch", "text"),
    RowField("device_name", "text"),
    RowField("backend", "text"),
    RowField("problem", "record"),
    RowField("schedule", "record"),
    RowField("median_ms", "ms"),
    RowField("spread_ms", "ms"),
    RowField("tflops", "ms"),
    RowField("default_ms", "ms", optional=True),
    RowField("baselines_ms", "baselines", optional=True, attr="baselines"),
    RowField("trials", "count"),
    RowField("created_at", "time"),
    RowField("provenance", "provenance"),
)
OPTIONAL_MS = tuple(f.name for f in ROW_FIELDS if f.optional and f.kind == "ms")
_FIELD_NAMES = frozenset(f.name for f in ROW_FIELDS)
_REQUIRED_NAMES = frozenset(f.name for f in ROW_FIELDS if not f.optional)
_MEASURES = tuple(f.name for f in ROW_FIELDS if f.kind == "ms")


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where a measurement came from: the kernel template's identity and the toolchain."""

    template_hash: str  # identity of the family's kernel template (tiledattention.core._identity)
    cuda_tile: str
    tileiras: str
    torch: str
    driver: str  # CUDA driver version as "13.0", or "" when no GPU was involved

    def to_dict(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in PROVENANCE_FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Provenance":
        if not isinstance(data, Mapping):
            raise RecordError(f"provenance must be a mapping; got {type(data).__name__}")
        missing = [n for n in PROVENANCE_FIELDS if n not in data]
        unknown = sorted(set(data) - set(PROVENANCE_FIELDS))
        if missing or unknown:
            raise RecordError(f"provenance lacks {missing}, has unknown {unknown}")
        bad = [n for n in PROVENANCE_FIELDS if not isinstance(data[n], str)]
        if bad:
            raise RecordError(f"provenance fields {bad} must be strings")
        return cls(**{n: data[n] for n in PROVENANCE_FIELDS})

    def toolchain(self) -> tuple[str, str, str]:
        """The part that decides whether timings are comparable."""
        return (self.template_hash, self.cuda_tile, self.tileiras)


#: Distance terms a family may have (one REAL column each in the table).
MAX_TERMS = 4


@dataclass(frozen=True)
class FamilyCodec:
    """What the database needs to know of one kernel family: its name, how to rebuild its typed
    problem and schedule from their dict forms (raising ``ValueError``/``TypeError`` on bad
    input), and its lookup metric: the problem fields and field ratios a stored row must share
    with a problem to answer for it (stored, indexed, as ``bucket``), and the distance terms,
    ``(fields, weight)`` pairs adding ``weight * |log2 prod(a.fields) - log2 prod(b.fields)|``
    (stored as ``term0..`` so the database orders candidates by distance itself)."""

    name: str
    decode_problem: Callable[[Mapping[str, Any]], Any]
    decode_schedule: Callable[[Mapping[str, Any]], Any]
    bucket_fields: tuple[str, ...]
    match_ratios: tuple[tuple[str, str], ...] = ()
    distance_terms: tuple[tuple[tuple[str, ...], float], ...] = ()
    #: the problem dict the distance terms are taken of, from a stored problem's dict (``None``:
    #: the dict itself); a family whose problems have a shape of their own for the lookup
    #: (a sliding window's span) passes it
    term_view: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not FAMILY_PATTERN.fullmatch(self.name):
            raise RecordError(f"family name must match {FAMILY_PATTERN.pattern}; "
                              f"got {self.name!r}")
        if len(self.distance_terms) > MAX_TERMS:
            raise RecordError(f"a family has at most {MAX_TERMS} distance terms; "
                              f"{self.name!r} has {len(self.distance_terms)}")

    def problem_text(self, problem: Any) -> str:
        return canonical_json(problem.to_dict())

    def bucket_text(self, problem: Any) -> str:
        """The fields and reduced ratios a row must share with ``problem``, as JSON."""
        return self.bucket_of(problem.to_dict())

    def terms(self, problem: Any) -> tuple[float, ...]:
        """``log2 prod(fields)`` of each distance term (``term0..`` in the table)."""
        return self.terms_of(problem.to_dict())

    def bucket_of(self, data: Mapping[str, Any]) -> str:
        """:meth:`bucket_text` of the problem whose ``to_dict()`` is ``data``. A bucket field
        missing from ``data`` (an optional field at its default, which ``to_dict`` leaves out)
        is left out of the bucket too, so buckets of problems stored before it existed hold."""
        bucket: dict[str, Any] = {name: data[name] for name in self.bucket_fields
                                  if name in data}
        for num, den in self.match_ratios:
            common = math.gcd(data[num], data[den]) or 1
            bucket[f"{num}/{den}"] = f"{data[num] // common}/{data[den] // common}"
        return canonical_json(bucket)

    def terms_of(self, data: Mapping[str, Any]) -> tuple[float, ...]:
        """:meth:`terms` of the problem whose ``to_dict()`` is ``data``."""
        if self.term_view is not None:
            data = self.term_view(data)
        return tuple(math.log2(math.prod(data[name] for name in names))
                     for names, _ in self.distance_terms)

    def weights(self) -> tuple[float, ...]:
        return tuple(weight for _, weight in self.distance_terms)

    def problem(self, data: Any) -> Any:
        return _decoded("problem", self.decode_problem, data)

    def schedule(self, data: Any) -> Any:
        return _decoded("schedule", self.decode_schedule, data)


def _decoded(what: str, decode: Callable[[Mapping[str, Any]], Any], data: Any) -> Any:
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{what} is not JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise RecordError(f"{what} must be a mapping; got {type(data).__name__}")
    try:
        return decode(data)
    except (ValueError, TypeError) as exc:
        raise RecordError(f"{what}: {exc}") from None


def codec_map(codecs: Iterable[FamilyCodec] | Mapping[str, FamilyCodec]) -> dict[str,
                                                                                 FamilyCodec]:
    """``{name: codec}`` from codecs or a mapping of them."""
    items = codecs.values() if isinstance(codecs, Mapping) else codecs
    found: dict[str, FamilyCodec] = {}
    for codec in items:
        if not isinstance(codec, FamilyCodec):
            raise DatabaseArgumentError(f"codecs must be FamilyCodec values; got "
                                        f"{type(codec).__name__}")
        found[codec.name] = codec
    return found


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Baselines(Mapping[str, float]):
    """Baseline name -> median ms per call, in name order; immutable and hashable (a field of
    the frozen :class:`ScheduleRow`). Compares equal to a dict of the same items. Checked when
    built (:class:`RecordError` naming ``where`` and the bad entry), so a row takes one as it
    is."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, float] | Iterable[tuple[str, float]] = (), *,
                 where: str = "Baselines") -> None:
        value = items if isinstance(items, Mapping) else dict(items)
        if len(value) > MAX_BASELINES:
            raise RecordError(f"{where} holds {len(value)} baselines; at most {MAX_BASELINES}")
        for name, ms in value.items():
            if not isinstance(name, str) or not BASELINE_PATTERN.fullmatch(name):
                raise RecordError(f"{where}: a baseline name must match "
                                  f"{BASELINE_PATTERN.pattern}; got {name!r}")
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) \
                    or not math.isfinite(ms) or ms <= 0:
                raise RecordError(f"{where}[{name!r}] must be a finite number > 0 (ms); got "
                                  f"{ms!r}")
        self._items = dict(sorted((name, float(ms)) for name, ms in value.items()))

    def __getitem__(self, name: str) -> float:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __repr__(self) -> str:
        return f"Baselines({self._items!r})"

    def __reduce__(self) -> tuple:
        return (Baselines, (tuple(self._items.items()),))


def _checked_baselines(value: Any, where: str) -> Baselines:
    """``value`` (a mapping of baseline name to median ms, or ``None`` for none) as
    :class:`Baselines`; :class:`RecordError` naming ``where`` and the bad entry otherwise. A
    ``Baselines`` was checked when built and is taken as it is (a decoded row's, once)."""
    if value is None:
        return Baselines()
    if type(value) is Baselines:  # not a subclass, whose __init__ may skip the checks
        return value
    if not isinstance(value, Mapping):
        raise RecordError(f"{where} must be a mapping of baseline name to median ms; got "
                          f"{type(value).__name__}")
    return Baselines(value, where=where)


@dataclass(frozen=True, kw_only=True)
class ScheduleRow:
    """The best schedule found for one key ``(family, arch, device_name, problem)``, with its
    timings.

    Times are milliseconds per call: ``median_ms`` of the schedule, ``spread_ms`` its
    interquartile range, ``default_ms`` the same problem under the architecture's default
    schedule when it was measured (``None`` otherwise), and ``baselines`` the same problem under
    each baseline the family's case timed (its name, e.g. ``torch-cudnn``, to its median ms; a
    baseline that did not run is absent). ``created_at`` is timezone-aware and normalised to UTC.
    """

    family: str
    arch: str
    device_name: str
    backend: str = "gpu"
    problem: Any
    schedule: Any
    median_ms: float
    spread_ms: float
    tflops: float
    default_ms: float | None = None
    baselines: Mapping[str, float] = field(default_factory=Baselines)
    trials: int
    created_at: datetime = field(default_factory=_utc_now)
    provenance: Provenance

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or not FAMILY_PATTERN.fullmatch(self.family):
            raise RecordError(f"ScheduleRow.family must be a family name; got {self.family!r}")
        if not isinstance(self.arch, str) or not ARCH_PATTERN.fullmatch(self.arch):
            raise RecordError(f"ScheduleRow.arch must look like 'sm_90'; got {self.arch!r}")
        if not isinstance(self.device_name, str) or not self.device_name.strip():
            raise RecordError(
                f"ScheduleRow.device_name must be a non-empty str; got {self.device_name!r}")
        if self.backend not in BACKENDS:
            raise RecordError(f"ScheduleRow.backend must be one of {BACKENDS}; got "
                              f"{self.backend!r}")
        for name in ("problem", "schedule"):
            if not callable(getattr(getattr(self, name), "to_dict", None)):
                raise RecordError(f"ScheduleRow.{name} must have a to_dict(); got "
                                  f"{type(getattr(self, name)).__name__}")
        if not isinstance(self.provenance, Provenance):
            raise RecordError(f"ScheduleRow.provenance must be a Provenance; got "
                              f"{type(self.provenance).__name__}")
        for name in _MEASURES:
            value = getattr(self, name)
            if value is None and name in OPTIONAL_MS:
                continue
            _check_ms(name, value, positive=name not in ("spread_ms", "tflops"))
            object.__setattr__(self, name, float(value))
        object.__setattr__(self, "baselines",
                           _checked_baselines(self.baselines, "ScheduleRow.baselines"))
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise RecordError(f"ScheduleRow.trials must be an int >= 1; got {self.trials!r}")
        if not isinstance(self.created_at, datetime) or self.created_at.tzinfo is None:
            raise RecordError("ScheduleRow.created_at must be a timezone-aware datetime; got "
                              f"{self.created_at!r}")
        object.__setattr__(self, "created_at", self.created_at.astimezone(timezone.utc))

    @property
    def key(self) -> tuple[str, str, str, str]:
        """The database key: one row per ``(family, arch, device_name, problem)``."""
        return (self.family, self.arch, self.device_name, self.problem_text)

    @cached_property
    def problem_text(self) -> str:
        """The problem's canonical JSON (the key's last part, the table's ``problem`` column),
        serialised once per row: the problem is frozen (``RowDecoder`` fills it in from the
        dict form it has already made)."""
        return canonical_json(self.problem.to_dict())

    def describe_key(self) -> str:
        describe = getattr(self.problem, "describe", None)
        shown = describe() if callable(describe) else canonical_json(self.problem.to_dict())
        return f"{self.family} {self.arch} {self.device_name!r} {shown}"

    # -- dict form ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict with the format version under ``"format"``."""
        data: dict[str, Any] = {"format": ROW_FORMAT}
        for f in ROW_FIELDS:
            value = getattr(self, f.attribute)
            if f.kind in ("record", "provenance"):
                value = value.to_dict()
            elif f.kind == "baselines":
                value = dict(value)
            elif f.kind == "time":
                value = value.isoformat()
            data[f.name] = value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any],
                  codecs: Mapping[str, FamilyCodec]) -> "ScheduleRow":
        """Inverse of :meth:`to_dict`. Raises :class:`RecordError` naming the first bad field."""
        if not isinstance(data, Mapping):
            raise RecordError(f"a schedule row must be a mapping; got {type(data).__name__}")
        data = dict(data)
        version = data.pop("format", None)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise RecordError(f"row field 'format' must be an int >= 1; got {version!r}")
        if version > ROW_FORMAT:
            raise RecordError(f"row format {version} is newer than this tiledattention "
                              f"understands ({ROW_FORMAT}); upgrade tiledattention")
        if version == 1:
            if "family" in data:
                raise RecordError("row format 1 has no 'family' field")
            data["family"] = LEGACY_FAMILY
        if version <= 2:
            if "backend" in data:
                raise RecordError(f"row format {version} has no 'backend' field")
            data["backend"] = "gpu"
        if version <= 3:
            data["baselines_ms"] = _legacy_baselines(data, f"row format {version}")
        unknown = data.keys() - _FIELD_NAMES
        if unknown:
            raise RecordError(f"unknown row field(s) {sorted(unknown)}; known: "
                              f"{sorted(_FIELD_NAMES)}")
        missing = _REQUIRED_NAMES - data.keys()
        if missing:
            raise RecordError(f"row lacks field(s) {sorted(missing)}")
        family = data["family"]
        codec = codecs.get(family) if isinstance(family, str) else None
        if codec is None:
            raise RecordError(f"row field 'family': unknown kernel family {family!r}; known: "
                              f"{sorted(codecs)}")
        values: dict[str, Any] = {}
        for f in ROW_FIELDS:
            value = data.get(f.name)
            try:
                values[f.attribute] = _decode_field(f, value, codec)
            except RecordError as exc:
                raise RecordError(f"row field {f.name!r}: {exc}") from None
        return cls(**values)


def _legacy_baselines(data: dict[str, Any], what: str) -> dict[str, Any]:
    """Take the fixed baseline fields of a row of format 1-3 out of ``data`` (its dict form)
    as the mapping that replaced them: ``{"torch-cudnn": ..., "torch-flash": ...}`` of those
    not ``None``."""
    if "baselines_ms" in data:
        raise RecordError(f"{what} has no 'baselines_ms' field (it has torch_cudnn_ms and "
                          "torch_flash_ms)")
    found = {}
    for old, name in LEGACY_BASELINES.items():
        value = data.pop(old, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(f"row field {old!r}: must be a number; got {value!r}")
        found[name] = value
    return found


def _decode_field(f: RowField, value: Any, codec: FamilyCodec) -> Any:
    if f.kind == "baselines":
        if isinstance(value, str):  # JSON text (CSV cells, SQL columns)
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise RecordError(f"is not JSON: {exc}") from None
        return _checked_baselines(value, f.name)
    if value is None and f.optional:
        return None
    if f.kind == "text":
        if not isinstance(value, str):
            raise RecordError(f"must be a str; got {value!r}")
        return value
    if f.kind == "record":
        return codec.problem(value) if f.name == "problem" else codec.schedule(value)
    if f.kind == "provenance":
        return Provenance.from_dict(value)
    if f.kind == "ms":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(f"must be a number; got {value!r}")
        return float(value)
    if f.kind == "count":
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"must be an int; got {value!r}")
        return value
    if f.kind == "time":
        if not isinstance(value, str):
            raise RecordError(f"must be an ISO 8601 time; got {value!r}")
        try:
            created = datetime.fromisoformat(value)
        except ValueError:
            raise RecordError(f"must be an ISO 8601 time; got {value!r}") from None
        if created.tzinfo is None:
            raise RecordError(f"must carry a UTC offset; got {value!r}")
        return created
    raise DatabaseMisuse(f"unknown field kind {f.kind}")  # ROW_FIELDS is ours: a bug


def _check_ms(name: str, value: Any, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise RecordError(f"ScheduleRow.{name} must be a finite number {bound}; got {value!r}")


#: The keys of a row's dict form as :meth:`ScheduleRow.to_dict` writes it now: the rows
#: :class:`RowDecoder` takes its quick path for.
_CURRENT_KEYS = frozenset({"format", *_FIELD_NAMES})
_PROVENANCE_KEYS = frozenset(PROVENANCE_FIELDS)
#: Types of schedule values a decoded schedule is remembered by: equal values of these types
#: are interchangeable (not so floats: ``0.0 == -0.0``).
_EXACT_TYPES = frozenset({int, bool, str, type(None)})
#: Distinct values of each kind a decoder remembers (a file's rows share a few hundred).
_REMEMBERED = 4096
_INFINITY = math.inf
_REFUSED = object()


class RowDecoder:
    """:meth:`ScheduleRow.from_dict` for the many rows of a file: the same checks, the same
    rows, the same errors, a few times faster. What rows share is checked once: the text fields
    of a key, a schedule (by its dict form: keys, values and their types), a provenance.

    :meth:`quick` takes a row of the current format whose fields all have their exact types
    and checks what ``from_dict`` and ``ScheduleRow.__post_init__`` check, each once (the
    dataclass's checks would run again after ``from_dict``'s), and gives the row or ``None``:
    ``None`` for any row it does not take, and for every row that fails a check, so that the
    caller's ``from_dict`` names the error exactly as it always has. ``check(name, given,
    typed)`` is a caller's further test, raising to refuse the row (``None`` from ``quick``
    too): of ``arch`` and ``device_name`` (the text), ``provenance``, ``schedule`` and
    ``problem`` (``typed`` their ``to_dict()``, ``given`` what the row holds); its verdicts
    on all but the problem are remembered with the value. Keep :meth:`quick` in step with
    ``from_dict``, ``_decode_field`` and ``__post_init__`` (``test_row_decoder`` compares them
    on hostile rows)."""

    def __init__(self, codecs: Iterable[FamilyCodec] | Mapping[str, FamilyCodec], *,
                 check: Callable[[str, Any, Any], None] | None = None) -> None:
        self._codecs = codec_map(codecs)
        self._check = check
        self._names: dict[tuple[str, str, str, str], Any] = {}  # -> codec or _REFUSED
        self._schedules: dict[tuple, Any] = {}  # (family, keys, values, types) -> schedule
        self._provenances: dict[tuple[str, ...], Any] = {}  # values -> Provenance

    def __call__(self, data: Any) -> ScheduleRow:
        """``ScheduleRow.from_dict(data, codecs)`` (the caller's ``check`` aside)."""
        row = self.quick(data)
        return row if row is not None else ScheduleRow.from_dict(data, self._codecs)

    def quick(self, data: Any) -> ScheduleRow | None:
        """The row of ``data`` when it is plainly valid, else ``None`` (see the class)."""
        if type(data) is not dict or data.keys() != _CURRENT_KEYS:
            return None
        version = data["format"]
        names = (data["family"], data["arch"], data["device_name"], data["backend"])
        if type(version) is not int or version != ROW_FORMAT or type(names[0]) is not str \
                or type(names[1]) is not str or type(names[2]) is not str \
                or type(names[3]) is not str:
            return None
        codec = self._names.get(names)
        if codec is None:
            codec = self._remember(self._names, names, self._name_codec(names))
        if codec is _REFUSED:
            return None
        median, spread, tflops, default = (data["median_ms"], data["spread_ms"],
                                           data["tflops"], data["default_ms"])
        # _check_ms: median and default > 0, spread and tflops >= 0, all finite (no NaN)
        if type(median) is not float or not 0.0 < median < _INFINITY \
                or type(spread) is not float or not 0.0 <= spread < _INFINITY \
                or type(tflops) is not float or not 0.0 <= tflops < _INFINITY \
                or default is not None and (type(default) is not float
                                            or not 0.0 < default < _INFINITY):
            return None
        trials, created = data["trials"], data["created_at"]
        if type(trials) is not int or trials < 1 or type(created) is not str:
            return None
        given = data["baselines_ms"]
        if type(given) is not dict:
            return None
        try:
            baselines = Baselines(given, where="baselines_ms")
            created_at = datetime.fromisoformat(created)
        except Exception:  # noqa: BLE001 - from_dict says what is wrong
            return None
        if created_at.tzinfo is None:
            return None
        provenance = self._provenance(data["provenance"])
        schedule = self._schedule(codec, data["schedule"])
        if provenance is None or schedule is None:
            return None
        given = data["problem"]
        if type(given) is not dict:
            return None
        try:
            problem = codec.decode_problem(given)
            if not self._record(problem):
                return None
            typed = problem.to_dict()
            if self._check is not None:
                self._check("problem", given, typed)
            text = canonical_json(typed)
        except Exception:  # noqa: BLE001 - from_dict (or the caller's check) says what
            return None
        row = object.__new__(ScheduleRow)
        row.__dict__.update(
            family=names[0], arch=names[1], device_name=names[2], backend=names[3],
            problem=problem, schedule=schedule, median_ms=median, spread_ms=spread,
            tflops=tflops, default_ms=default, baselines=baselines, trials=trials,
            created_at=created_at.astimezone(timezone.utc), provenance=provenance,
            problem_text=text)
        return row

    @staticmethod
    def _remember(memory: dict, key: Any, value: Any) -> Any:
        if len(memory) < _REMEMBERED:
            memory[key] = value
        return value

    @staticmethod
    def _record(value: Any) -> bool:
        """``__post_init__``'s test of a problem or schedule: a callable ``to_dict``."""
        return callable(getattr(value, "to_dict", None))

    def _name_codec(self, names: tuple[str, str, str, str]) -> Any:
        family, arch, device_name, backend = names
        codec = self._codecs.get(family)
        if codec is None or not FAMILY_PATTERN.fullmatch(family) \
                or not ARCH_PATTERN.fullmatch(arch) or not device_name.strip() \
                or backend not in BACKENDS:
            return _REFUSED
        if self._check is not None:
            try:
                self._check("arch", arch, arch)
                self._check("device_name", device_name, device_name)
            except Exception:  # noqa: BLE001 - the caller's slow path says what
                return _REFUSED
        return codec

    def _provenance(self, given: Any) -> Provenance | None:
        if type(given) is not dict or given.keys() != _PROVENANCE_KEYS:
            return None
        values = tuple(given[name] for name in PROVENANCE_FIELDS)
        if any(type(value) is not str for value in values):
            return None
        found = self._provenances.get(values)
        if found is None:
            found = Provenance(**dict(zip(PROVENANCE_FIELDS, values)))
            if self._check is not None:
                try:
                    self._check("provenance", given, found.to_dict())
                except Exception:  # noqa: BLE001
                    found = _REFUSED
            self._remember(self._provenances, values, found)
        return None if found is _REFUSED else found

    def _schedule(self, codec: FamilyCodec, given: Any) -> Any:
        if type(given) is not dict:
            return None
        types = tuple(map(type, given.values()))
        form = (codec.name, tuple(given), tuple(given.values()), types) \
            if _EXACT_TYPES.issuperset(types) else None
        found = None if form is None else self._schedules.get(form)
        if found is None:
            try:
                found = codec.decode_schedule(given)
                if not self._record(found):
                    found = _REFUSED
                elif self._check is not None:
                    self._check("schedule", given, found.to_dict())
            except Exception:  # noqa: BLE001 - from_dict (or the caller's check) says what
                found = _REFUSED
            if form is not None:
                self._remember(self._schedules, form, found)
        return None if found is _REFUSED else found
