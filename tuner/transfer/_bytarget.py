"""The generator of ``tiledtune export --format bytarget``: tuned rows -> one importable module.

The module it writes needs nothing but the standard library. It holds

* ``KERNEL_OPTIONS``: per kernel option (``occupancy``, ``num_ctas``, ``opt_level``) the value to
  use per architecture and a ``default``, and ``OCCUPANCY`` / ``NUM_CTAS`` / ``OPT_LEVEL`` built
  from it as ``cuda.tile.ByTarget`` objects (``None`` when cuda.tile cannot be imported: the plain
  data stays usable in ``KERNEL_OPTIONS``);
* ``SCHEDULES``: per architecture, one entry per tuned shape bucket (dtype, causal, head_dim,
  group, seqlen_q, seqlen_k, batch_heads) with the winning schedule: tile sizes and the other
  compile-time constants cannot be a ``ByTarget`` (CUTILE_NOTES.md), so they need a host table;
* ``select(arch, dtype, causal, head_dim, seqlen_q, seqlen_k, batch_heads=None, group=1)``: the
  exact bucket, else the nearest one with the same dtype/causal/head_dim/group, by the distance of
  ``tiledattention._lookup.shape_distance`` (copied into the module; tests check they agree).

Choices:

* One winner per bucket and architecture: the fastest row (several GPUs of one architecture, or
  several ``batch``/``heads`` splits of one ``batch*heads``, may share a bucket). This is what
  ``_lookup.pick`` answers for a device name that has no rows of its own.
* Per-architecture kernel-option value: the value that won the most buckets of that architecture;
  ``default``: the value that won the most buckets over all exported architectures. Ties go to the
  value of ``Schedule()``'s default if it is among the tied ones, else to the smallest value.
* The output is a pure function of the rows and the source name: no timestamp, sorted tables,
  so the same database gives the same bytes whatever order the rows were inserted in.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Iterable, Sequence

from db import ScheduleRow
from tiledattention._problem import Problem
from tiledattention._schedule import Schedule

__all__ = ["KERNEL_OPTIONS", "bucket_of", "build_schedules", "choose_kernel_options",
           "render_module"]

#: ``ct.kernel`` options exported as ``ByTarget`` values, and the module-level names they get.
KERNEL_OPTIONS = {"occupancy": "OCCUPANCY", "num_ctas": "NUM_CTAS", "opt_level": "OPT_LEVEL"}
_BUCKET_FIELDS = ("dtype", "causal", "head_dim", "group", "seqlen_q", "seqlen_k", "batch_heads")
_WIDTH = 99


def _arch_order(arch: str) -> tuple[int, str]:
    digits = "".join(ch for ch in arch[3:] if ch.isdigit())
    return (int(digits) if digits else 0, arch)


def bucket_of(problem: Problem) -> tuple:
    """The shape bucket of a problem, in ``_BUCKET_FIELDS`` order."""
    return (problem.dtype, problem.causal, problem.head_dim, problem.group_size,
            problem.seqlen_q, problem.seqlen_k, problem.batch * problem.heads_q)


def _winner_order(row: ScheduleRow) -> tuple:
    # fastest first; the full key and the schedule make the choice total (deterministic)
    return (row.median_ms, row.key, row.schedule.to_json())


def build_schedules(rows: Iterable[ScheduleRow]) -> dict[str, list[dict[str, Any]]]:
    """``{arch: [entry, ...]}``, entries sorted by bucket, one (the fastest row) per bucket."""
    best: dict[tuple[str, tuple], ScheduleRow] = {}
    for row in rows:
        slot = (row.arch, bucket_of(row.problem))
        if slot not in best or _winner_order(row) < _winner_order(best[slot]):
            best[slot] = row
    table: dict[str, list[dict[str, Any]]] = {}
    for (arch, bucket), row in sorted(best.items(), key=lambda kv: (_arch_order(kv[0][0]),
                                                                   kv[0][1])):
        entry = dict(zip(_BUCKET_FIELDS, bucket))  # fixed order: the output must not vary
        entry.update(median_ms=row.median_ms, device=row.device_name,
                     schedule=row.schedule.to_dict())
        table.setdefault(arch, []).append(entry)
    return table


def _most_common(counts: Counter, option: str) -> int:
    top = max(counts.values())
    tied = sorted(value for value, n in counts.items() if n == top)
    preferred = getattr(Schedule(), option)
    return preferred if preferred in tied else tied[0]


def choose_kernel_options(table: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """``{option: {"default": v, "by_arch": {arch: v}}}`` from the buckets each value won."""
    result = {}
    for option in KERNEL_OPTIONS:
        overall: Counter = Counter()
        by_arch = {}
        for arch in sorted(table, key=_arch_order):
            counts = Counter(entry["schedule"][option] for entry in table[arch])
            overall.update(counts)
            by_arch[arch] = _most_common(counts, option)
        result[option] = {"default": _most_common(overall, option), "by_arch": by_arch}
    return result


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
    for prov in provenances:
        lines.append("#   " + " ".join(f"{k}={_clean(v) or '-'}" for k, v in prov))
    return lines


def _py(value: Any) -> str:
    """A scalar as a Python literal; strings in double quotes (JSON escapes are valid Python)."""
    if isinstance(value, str):
        return json.dumps(value)
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    raise TypeError(f"cannot write {type(value).__name__} into the module")


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


_DOC = '''"""Tuned tiledattention schedules per GPU architecture (generated, see the header).

Kernel options, for ``@ct.kernel(occupancy=OCCUPANCY, num_ctas=NUM_CTAS, opt_level=OPT_LEVEL)``:
``cuda.tile.ByTarget`` objects whose value per architecture is the one that won the most tuned
shapes there, and whose ``default`` won the most shapes overall. They are ``None`` when cuda.tile
cannot be imported; ``KERNEL_OPTIONS`` holds the same values as plain data.

Tile sizes and the other compile-time constants cannot be a ``ByTarget``: ``select()`` returns the
schedule tuned for a shape (``tiledattention.Schedule.from_dict`` reads it). This module needs
nothing but the Python standard library.
"""'''

_CODE = '''


def _by_target(option):
    if ct is None:
        return None
    values = KERNEL_OPTIONS[option]
    return ct.ByTarget(default=values["default"], **values["by_arch"])


{by_target}


def shape_distance(seqlen_q, seqlen_k, batch_heads, entry):
    """Distance of a shape to a tuned bucket (``tiledattention._lookup.shape_distance``):
    |log2 Sq - log2 Sq'| + |log2 Sk - log2 Sk'| + 0.5 |log2 BH - log2 BH'|; the last term is
    left out when ``batch_heads`` is None."""
    distance = (abs(math.log2(seqlen_q) - math.log2(entry["seqlen_q"]))
                + abs(math.log2(seqlen_k) - math.log2(entry["seqlen_k"])))
    if batch_heads is not None:
        distance += 0.5 * abs(math.log2(batch_heads) - math.log2(entry["batch_heads"]))
    return distance


def select(arch, dtype, causal, head_dim, seqlen_q, seqlen_k, batch_heads=None, group=1):
    """The schedule (a dict) tuned for this shape on ``arch`` ("sm_90"): the exact bucket, else
    the nearest one with the same dtype, causal flag, head_dim and group size (query heads per
    K/V head); ties go to the faster row. ``None`` when ``arch`` has no such bucket.
    ``batch_heads`` is batch * query heads; ``None`` ignores it."""
    for name, value in (("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k), ("group", group),
                        ("batch_heads", batch_heads)):
        if value is None and name == "batch_heads":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"select(): {{name}} must be a positive int; got {{value!r}}")
    best = None
    for entry in SCHEDULES.get(arch, ()):
        if (entry["dtype"] != dtype or entry["causal"] != causal
                or entry["head_dim"] != head_dim or entry["group"] != group):
            continue
        rank = (shape_distance(seqlen_q, seqlen_k, batch_heads, entry), entry["median_ms"])
        if best is None or rank < best[0]:
            best = (rank, entry)
    return None if best is None else dict(best[1]["schedule"])
'''


def render_module(rows: Sequence[ScheduleRow], *, source: str) -> str:
    """The text of the module for ``rows`` (which must not be empty); checked to compile."""
    rows = list(rows)
    if not rows:
        raise ValueError("render_module() needs at least one row")
    table = build_schedules(rows)
    archs = sorted(table, key=_arch_order)
    options = choose_kernel_options(table)
    parts = [
        "\n".join(_header(rows, source, archs)),
        _DOC,
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
        '__all__ = ["ARCHITECTURES", "KERNEL_OPTIONS", "OCCUPANCY", "NUM_CTAS", "OPT_LEVEL",',
        '           "SCHEDULES", "select", "shape_distance"]',
        "",
        "#: Architectures with tuned rows.",
        f"ARCHITECTURES = ({', '.join(_py(a) for a in archs)},)",
        "",
        "#: option -> the value that won the most tuned shapes, per architecture and overall.",
        "KERNEL_OPTIONS = " + _literal(options, len("KERNEL_OPTIONS = ")),
        "",
        "#: arch -> one entry per tuned shape bucket (batch_heads = batch * query heads; group =",
        "#: query heads per K/V head), with the winning schedule and its median time.",
        "SCHEDULES = {",
    ]
    for arch in archs:
        parts.append(f"    {_py(arch)}: [")
        for entry in table[arch]:
            parts.append("        " + _literal(entry, 8) + ",")
        parts.append("    ],")
    parts.append("}")
    by_target = "\n".join(f'{name} = _by_target("{option}")'
                          for option, name in KERNEL_OPTIONS.items())
    text = "\n".join(parts) + _CODE.format(by_target=by_target)
    compile(text, "<bytarget module>", "exec")  # a generator bug must not reach the file
    return text
