"""The generator of ``tiledtune export --format bytarget``: tuned rows -> one importable module.

The module it writes needs nothing but the standard library. Per kernel family it holds

* ``KERNEL_OPTIONS[family]``: per kernel option the family's schedules have (``occupancy``,
  ``num_ctas``, ``opt_level``) the value to use per architecture and a ``default``, and
  ``BY_TARGET[family]`` the same as ``cuda.tile.ByTarget`` objects (``None`` when cuda.tile cannot
  be imported: the plain data stays usable);
* ``SCHEDULES[family][arch]``: one entry per tuned problem with the winning schedule: tile sizes
  and the other compile-time constants cannot be a ``ByTarget`` (CUTILE_NOTES.md), so they need a
  host table;
* ``LOOKUP[family]``: the family's lookup metric as data (``Family.bucket_fields``,
  ``match_ratios``, ``distance_terms``), and ``select(family, arch, **problem)``: the exact
  problem, else the nearest entry by that metric, as the runtime's lookup picks it.

Choices:

* One winner per problem and architecture: the fastest row (several GPUs of one architecture may
  share a problem). This is what ``tiledattention.tooling.pick`` answers for a device name that
  has no rows of its own.
* Rows of the simulated backend (``backend`` ``simulated``: a model's numbers, which the runtime
  never uses) are never presented as tuned: a GPU-measured row wins its problem over any
  simulated one, an entry that is simulated says so (``"backend": "simulated"``), and the header
  and the docstring count them (a module of simulated rows only is titled "SIMULATED").
* Per-architecture kernel-option value: the value that won the most problems of that
  architecture; ``default``: the value that won the most problems over all exported
  architectures. Ties go to the value of the family's default-constructed schedule if it is among
  the tied ones, else to the smallest value.
* The output is a pure function of the rows and the source name: no timestamp, sorted tables,
  so the same database gives the same bytes whatever order the rows were inserted in.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Iterable, Sequence

from db import ScheduleRow, canonical_json
from tiledattention import get_family

from ..errors import TunerTypeError, TunerValueError

__all__ = ["KERNEL_OPTIONS", "build_schedules", "choose_kernel_options", "render_module"]

#: ``ct.kernel`` options exported as ``ByTarget`` values.
KERNEL_OPTIONS = ("occupancy", "num_ctas", "opt_level")
_WIDTH = 99


def _arch_order(arch: str) -> tuple[int, str]:
    digits = "".join(ch for ch in arch[3:] if ch.isdigit())
    return (int(digits) if digits else 0, arch)


def _winner_order(row: ScheduleRow) -> tuple:
    # GPU-measured first, then the fastest; the full key and the schedule make the choice total
    # (deterministic)
    return (row.backend != "gpu", row.median_ms, row.key, canonical_json(row.schedule.to_dict()))


def build_schedules(rows: Iterable[ScheduleRow]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``{family: {arch: [entry, ...]}}``, entries sorted by problem, one (the fastest row) per
    problem."""
    best: dict[tuple[str, str, str], ScheduleRow] = {}
    for row in rows:
        slot = (row.family, row.arch, canonical_json(row.problem.to_dict()))
        if slot not in best or _winner_order(row) < _winner_order(best[slot]):
            best[slot] = row
    table: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for (family, arch, _), row in sorted(best.items(), key=lambda kv: (
            kv[0][0], _arch_order(kv[0][1]), kv[0][2])):
        entry = {"problem": dict(sorted(row.problem.to_dict().items())),
                 "median_ms": row.median_ms, "device": row.device_name,
                 "schedule": row.schedule.to_dict()}
        if row.default_ms is not None:  # the lookup's transfer rule reads it
            entry["default_ms"] = row.default_ms
        if row.backend != "gpu":
            entry["backend"] = row.backend
        table.setdefault(family, {}).setdefault(arch, []).append(entry)
    return table


def _most_common(counts: Counter, preferred: Any) -> Any:
    top = max(counts.values())
    tied = sorted(value for value, n in counts.items() if n == top)
    return preferred if preferred in tied else tied[0]


def choose_kernel_options(family: str, by_arch: dict[str, list[dict[str, Any]]]
                          ) -> dict[str, dict[str, Any]]:
    """``{option: {"default": v, "by_arch": {arch: v}}}`` from the problems each value won, for
    the kernel options ``family``'s schedules have."""
    base = get_family(family).schedule_type().to_dict()
    result = {}
    for option in (o for o in KERNEL_OPTIONS if o in base):
        overall: Counter = Counter()
        chosen = {}
        for arch in sorted(by_arch, key=_arch_order):
            counts = Counter(entry["schedule"][option] for entry in by_arch[arch])
            overall.update(counts)
            chosen[arch] = _most_common(counts, base[option])
        result[option] = {"default": _most_common(overall, base[option]), "by_arch": chosen}
    return result


def _lookup_spec(family: str) -> dict[str, Any]:
    f = get_family(family)
    variants = list(getattr(f.problem_type, "VARIANT_FIELDS", ()))
    return {"bucket_fields": list(f.bucket_fields) + variants,
            "optional": dict(getattr(f.problem_type, "OPTIONAL_FIELDS", {})),
            "match_ratios": [list(pair) for pair in f.match_ratios],
            "distance_terms": [[list(names), weight] for names, weight in f.distance_terms],
            "nearest_limit": None if math.isinf(f.nearest_limit) else f.nearest_limit,
            "transfer_margin": f.transfer_margin,
            "transfer_limits": [[list(names), limit] for names, limit in f.transfer_limits],
            "padding_terms": [list(term) for term in f.padding_terms],
            "ragged_exact": list(f.ragged_exact)}


def _clean(text: str) -> str:
    """A string safe inside a ``#`` comment (no line breaks or control characters)."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(text))


def _header(rows: Sequence[ScheduleRow], source: str, archs: list[str]) -> list[str]:
    devices = sorted({row.device_name for row in rows})
    provenances = sorted({tuple(row.provenance.to_dict().items()) for row in rows})
    lines = [
        "# Generated by `tiledtune export --format bytarget`. Do not edit: regenerate it.",
        f"# Source database: {_clean(source)}",
        f"# Rows: {len(rows)}; architectures: {', '.join(archs)}",
        f"# Devices: {'; '.join(_clean(d) for d in devices)}",
        f"# Provenance ({len(provenances)} distinct):",
    ]
    simulated = sum(row.backend != "gpu" for row in rows)
    if simulated:
        lines[1:1] = [f"# SIMULATED: {simulated} of {len(rows)} rows come from the simulated "
                      "backend (`tiledtune search --backend",
                      "# simulated`, a model of the kernels): NOT measured on a GPU, never tuned; "
                      "do not deploy them."]
    for prov in provenances:
        lines.append("#   " + " ".join(f"{k}={_clean(v) or '-'}" for k, v in prov))
    return lines


def _py(value: Any) -> str:
    """A scalar or list as a Python literal; strings in double quotes (JSON escapes are valid
    Python)."""
    if isinstance(value, str):
        return json.dumps(value)
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    raise TunerTypeError(f"cannot write {type(value).__name__} into the module")


def _literal(data: dict, col: int) -> str:
    """``data`` as a dict literal that starts at column ``col``: items in ``data``'s order, packed
    greedily into lines of at most ``_WIDTH`` characters, a nested dict starting a new line."""
    lines: list[str] = []
    line = " " * col + "{"
    items = list(data.items())
    for i, (key, value) in enumerate(items):
        tail = "}" if i == len(items) - 1 else ","
        head = f"{_py(key)}: "
        fresh = line.endswith("{") or not line.strip()
        if isinstance(value, dict):
            if not fresh:
                lines.append(line)
                line = " " * (col + 1)
            sub = _literal(value, len(line) + len(head)).split("\n")
            line += head + sub[0]
            if len(sub) > 1:
                lines.append(line)
                lines.extend(sub[1:-1])
                line = sub[-1]
            line += tail
            continue
        item = head + _py(value) + tail
        if not fresh and len(line) + 1 + len(item) > _WIDTH:
            lines.append(line)
            line = " " * (col + 1) + item
        else:
            line += ("" if fresh else " ") + item
    if not items:
        line += "}"
    lines.append(line)
    return "\n".join(lines)[col:]


_DOC = '''"""Tuned tiledattention schedules per kernel family and GPU architecture (generated, see
the header).

Kernel options, for ``@ct.kernel(occupancy=..., num_ctas=..., opt_level=...)``:
``BY_TARGET[family][option]``, ``cuda.tile.ByTarget`` objects whose value per architecture is the
one that won the most tuned problems there, and whose ``default`` won the most problems overall.
They are ``None`` when cuda.tile cannot be imported; ``KERNEL_OPTIONS`` holds the same values as
plain data.

Tile sizes and the other compile-time constants cannot be a ``ByTarget``: ``select()`` returns the
schedule tuned for a problem (the family's schedule type's ``from_dict`` reads it). This module
needs nothing but the Python standard library.
"""'''

_CODE = '''


def _by_target(values):
    if ct is None:
        return None
    return ct.ByTarget(default=values["default"], **values["by_arch"])


BY_TARGET = {family: {option: _by_target(values) for option, values in options.items()}
             for family, options in KERNEL_OPTIONS.items()}


def full(family, problem):
    """``problem`` (a dict) with ``family``'s optional fields at their defaults where absent."""
    return {**LOOKUP[family]["optional"], **problem}


def lookup_shape(problem):
    """The shape the lookup measures a full problem dict by (``Problem.lookup_shape``): a
    sliding window's problem by the window's span, its other rows as batch."""
    left, right = problem.get("window_left", -1), problem.get("window_right", -1)
    if left < 0 and right < 0:
        return problem
    sq, sk = problem["seqlen_q"], problem["seqlen_k"]
    right = 0 if problem["causal"] else (right if right >= 0 else sk)
    span = (left if left >= 0 else sk) + right + 1
    rows, keys = min(sq, span), min(sk, span)
    return {**problem, "batch": problem["batch"] * -(-sq // rows), "seqlen_q": rows,
            "seqlen_k": keys}


def distance(family, a, b):
    """The lookup distance between two problems (dicts) of ``family``: the sum over
    ``LOOKUP[family]["distance_terms"]`` of weight * |log2 prod(a[fields]) - log2 prod(b[fields])|
    on their ``lookup_shape``, or ``None`` when they differ in a bucket field or a matched
    ratio."""
    spec = LOOKUP[family]
    a, b = full(family, a), full(family, b)
    if any(a[name] != b[name] for name in spec["bucket_fields"]):
        return None
    if any(a[n] * b[d] != b[n] * a[d] for n, d in spec["match_ratios"]):
        return None
    a, b = lookup_shape(a), lookup_shape(b)
    total = 0.0
    for names, weight in spec["distance_terms"]:
        total += weight * abs(math.log2(math.prod(a[n] for n in names))
                              - math.log2(math.prod(b[n] for n in names)))
    return total


def _padding(terms, problem, schedule):
    """The share of the tiles' work on ``problem`` that is not padding (``padding_terms``)."""
    share = 1.0
    for field, tile_field, divisor_field in terms:
        length = problem[field]
        parts = schedule[divisor_field] if divisor_field else 1
        tile = schedule[tile_field]
        per_part = -(-length // parts)
        share *= length / (parts * tile * -(-per_part // tile))
    return share


def transfers(family, entry, problem):
    """Whether ``entry``, tuned for another problem, may answer for ``problem``: a ragged
    problem only with the entry's own values of ``ragged_exact``; it beat the
    default on its own key by ``transfer_margin``, differs by at most the ``transfer_limits``
    (log2 of a product of fields), and keeps that margin once scaled by the padding its tiles
    add on ``problem`` (``padding_terms``)."""
    spec = LOOKUP[family]
    if entry.get("default_ms") is None:
        return False
    stored = full(family, entry["problem"])
    if problem.get("ragged") and any(stored[n] != problem[n] for n in spec["ragged_exact"]):
        return False  # a ragged row answers only for its own values of these
    gain = entry["default_ms"] / entry["median_ms"]
    stored, problem = lookup_shape(stored), lookup_shape(problem)
    for names, limit in spec["transfer_limits"]:
        if abs(math.log2(math.prod(stored[n] for n in names))
               - math.log2(math.prod(problem[n] for n in names))) > limit + 1e-9:
            return False
    terms, schedule = spec["padding_terms"], entry["schedule"]
    scaled = min(gain, gain * _padding(terms, problem, schedule)
                 / _padding(terms, stored, schedule))
    return scaled >= spec["transfer_margin"]


def select(family, arch, **problem):
    """The schedule (a dict) tuned for ``problem`` (every field of the family's problem, by
    name) on ``arch`` ("sm_90"): the exact problem, else the nearest comparable one within
    ``LOOKUP[family]["nearest_limit"]`` (``None``: any distance) that ``transfers``; ties go to
    the faster row. ``None`` when ``arch`` has no such entry (use the family's default then)."""
    if family not in SCHEDULES:
        raise ValueError(f"select(): family must be one of {sorted(SCHEDULES)}; got {family!r}")
    optional = LOOKUP[family]["optional"]
    fields = set(SCHEDULES[family][next(iter(SCHEDULES[family]))][0]["problem"]) | set(optional)
    if not fields - set(optional) <= set(problem) <= fields:
        raise ValueError(f"select(): give exactly the fields {sorted(fields - set(optional))}"
                         f" (and any of the optional {sorted(optional)}); got {sorted(problem)}")
    problem = full(family, problem)
    for names, _ in LOOKUP[family]["distance_terms"]:
        for name in names:
            value = problem[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"select(): {name} must be a positive int; got {value!r}")
    found = []
    for entry in SCHEDULES[family].get(arch, ()):
        stored = full(family, entry["problem"])
        d = distance(family, problem, stored)
        limit = LOOKUP[family].get("nearest_limit")
        if d is None or (limit is not None and d > limit and stored != problem):
            continue
        found.append(((stored != problem, d, entry["median_ms"]), entry))
    for (other, _, _), entry in sorted(found, key=lambda item: item[0]):  # exact first
        if not other or transfers(family, entry, problem):
            return dict(entry["schedule"])
    return None
'''


def _doc(table: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """The module's docstring: "Tuned ..." only when every entry was measured on a GPU."""
    entries = [e for by_arch in table.values() for found in by_arch.values() for e in found]
    simulated = sum("backend" in e for e in entries)
    if not simulated:
        return _DOC
    if simulated == len(entries):
        title = ("SIMULATED tiledattention schedules per kernel family and GPU architecture: NOT\n"
                 "measured on a GPU (the simulated backend's model; generated, see the header). "
                 "For\ntrying the tools only, never for deployment.\n")
    else:
        title = ("tiledattention schedules per kernel family and GPU architecture (generated, see "
                 f"the\nheader): {len(entries) - simulated} tuned on a GPU and {simulated} "
                 'SIMULATED ("backend": "simulated" in SCHEDULES:\nNOT measured on a GPU, for '
                 "trying the tools only).\n")
    return '"""' + title + _DOC.split("\n", 2)[2]


def render_module(rows: Sequence[ScheduleRow], *, source: str) -> str:
    """The text of the module for ``rows`` (which must not be empty); checked to compile."""
    rows = list(rows)
    if not rows:
        raise TunerValueError("render_module() needs at least one row")
    table = build_schedules(rows)
    archs = sorted({arch for by_arch in table.values() for arch in by_arch}, key=_arch_order)
    options = {family: choose_kernel_options(family, by_arch) for family, by_arch in table.items()}
    lookup = {family: _lookup_spec(family) for family in table}
    parts = [
        "\n".join(_header(rows, source, archs)),
        _doc(table),
        "",
        "from __future__ import annotations",
        "",
        "import math",
        "",
        "try:  # optional: only the ByTarget objects need it",
        "    import cuda.tile as ct",
        "except (ImportError, OSError):",
        "    ct = None",
        "",
        '__all__ = ["ARCHITECTURES", "BY_TARGET", "KERNEL_OPTIONS", "LOOKUP", "SCHEDULES",',
        '           "distance", "transfers", "select"]',
        "",
        "#: Architectures with tuned rows.",
        f"ARCHITECTURES = ({', '.join(_py(a) for a in archs)},)",
        "",
        "#: family -> option -> the value that won the most tuned problems, per architecture and",
        "#: overall.",
        "KERNEL_OPTIONS = " + _literal(options, len("KERNEL_OPTIONS = ")),
        "",
        "#: family -> its lookup metric (see distance()).",
        "LOOKUP = " + _literal(lookup, len("LOOKUP = ")),
        "",
        "#: family -> arch -> one entry per tuned problem, with the winning schedule and its",
        "#: median time.",
        "SCHEDULES = {",
    ]
    for family, by_arch in table.items():
        parts.append(f"    {_py(family)}: {{")
        for arch in sorted(by_arch, key=_arch_order):
            parts.append(f"        {_py(arch)}: [")
            for entry in by_arch[arch]:
                parts.append("            " + _literal(entry, 12) + ",")
            parts.append("        ],")
        parts.append("    },")
    parts.append("}")
    text = "\n".join(parts) + _CODE
    compile(text, "<bytarget module>", "exec")  # a generator bug must not reach the file
    return text
