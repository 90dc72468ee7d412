"""``tiledtune export``: stored schedules to a ``ByTarget`` Python module, a JSON or a CSV file.

* ``bytarget``: a self-contained module (``tuner._bytarget``) with ``OCCUPANCY`` / ``NUM_CTAS`` /
  ``OPT_LEVEL`` as ``cuda.tile.ByTarget`` values, a per-architecture ``SCHEDULES`` table and a
  stdlib-only ``select()``.
* ``json``: lossless rows with provenance, ``{"format": 4, "rows": [...]}`` (``db.dump_rows``);
  a row's baselines are one mapping, ``"baselines_ms": {"torch-cudnn": 1.23, ...}``.
* ``csv``: the same rows, one column per field (``CSV_COLUMNS``), the problem, the schedule and
  the baselines as JSON in one column each; ``tiledtune import`` reads it back losslessly.

Where the rows come from (``--source``): ``user``, the schedule database (``--db``);
``shipped``, the pre-tuned tables packaged with tiledattention (``tiledattention/pretuned/``,
today sm_90), so a new user can export ``ct.ByTarget`` tables before tuning anything; ``both``,
the two together, as the runtime's lookup sees them. Without ``--source``: the user database
when there is one, else the shipped tables (said on standard error). With ``both``, a key held
by both (same family, architecture, device and problem) keeps one row, by the database's merge
rule: a row the runtime would use before one it would ignore, then the faster.

In every format only rows of the current kernel template are exported (the runtime's lookup
ignores the others) unless ``--include-stale``.

Every file is written atomically (temp file + ``os.replace``) and deterministically: the same rows
give the same bytes. A symlink is written through (its target replaced, the link kept); a
directory, device (``/dev/stdout``, ``/dev/null``), FIFO, socket or read-only file is refused in
one line before anything is read. ``-o -`` writes to standard output (``--format`` says which
format), a row at a time. Exit status: 0 written, 1 nothing to export, 2 the database or the
output could not be used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator, Sequence

from ._problems import parse_arch_list
from ._report import say

__all__ = ["configure", "run", "FORMATS", "SOURCES", "parse_archs"]

FORMATS = ("bytarget", "json", "csv")
#: ``--source`` values: the user database, the shipped tables, or both
SOURCES = ("user", "shipped", "both")
_SUFFIXES = {".py": "bytarget", ".json": "json", ".csv": "csv"}


def parse_archs(values: Sequence[str] | None) -> list[str] | None:
    """``["sm_90,sm_121", "sm_90"]`` (each ``--arch``) -> ``["sm_90", "sm_121"]``, each checked
    by the commands' one architecture validator (``argparse.ArgumentTypeError`` names the
    accepted architectures and what came)."""
    if not values:
        return None
    return list(dict.fromkeys(arch for value in values for arch in parse_arch_list(value)))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "formats:\n"
        "  bytarget  importable Python module: OCCUPANCY/NUM_CTAS/OPT_LEVEL as ct.ByTarget,\n"
        "            SCHEDULES per architecture and select(); needs only the stdlib\n"
        "  json      lossless rows with provenance (read back by `tiledtune import`)\n"
        "  csv       lossless rows, one column per field, schedule as JSON in one column\n"
        "sources:\n"
        "  user      the schedule database (--db)\n"
        "  shipped   the tables packaged with tiledattention (tiledattention/pretuned/)\n"
        "  both      the two; a key in both keeps the faster row (a row the runtime\n"
        "            would use before one it would ignore)\n"
        "  default   user when the database exists, else shipped\n"
        "exit status: 0 written; 1 nothing matched the selection; 2 the database or the\n"
        "output file could not be used")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="output format (default: from the suffix of -o: .py, .json, .csv)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="file to write (replaced atomically; a symlink is written "
                             "through); - for standard output (with --format)")
    parser.add_argument("--arch", action="append", metavar="SM_LIST",
                        help="only these architectures, comma-separated (e.g. sm_90,sm_121); "
                             "may be repeated")
    parser.add_argument("--db", metavar="PATH_OR_URL", default=None,
                        help="schedule database (default: $TILEDATTN_DB or "
                             "~/.cache/tiledattention/schedules.sqlite)")
    parser.add_argument("--kernel", default=None, metavar="NAME",
                        help="only this kernel family's rows (default: every family)")
    parser.add_argument("--source", choices=SOURCES, default=None,
                        help="rows of the user database, the shipped tables or both (default: "
                             "user when the database exists, else shipped)")
    parser.add_argument("--include-stale", action="store_true",
                        help="also export rows tuned with another kernel template (the runtime "
                             "ignores those)")


def _fail(message: str, code: int) -> int:
    say("export", message)
    return code


def _shipped_rows(archs: list[str] | None, families: list[str] | None) -> dict[str, list]:
    """The shipped tables' rows (of ``families``) for ``archs`` (default: every architecture
    that has a table), by table name."""
    from tiledattention import ARCHITECTURES, shipped_table

    found = {}
    for arch in archs or ARCHITECTURES:
        table = shipped_table(arch)
        if table is not None:
            found[str(table)] = [r for r in table if families is None or r.family in families]
    return found


def _merge(rows: list) -> tuple[list, int]:
    """One row per key (``ScheduleRow.key``), by the database's merge rule: a row the runtime
    would use (GPU-measured, current template) before one it would ignore, then the faster;
    returns the rows and how many were dropped."""
    from tiledattention import get_family

    current = {f: get_family(f).template_identity() for f in {r.family for r in rows}}

    def rank(r) -> tuple:
        usable = r.backend == "gpu" and r.provenance.template_hash == current[r.family]
        return (not usable, r.median_ms)

    best: dict = {}
    for r in rows:
        key = r.key  # a property that serialises the problem: once per row
        if key not in best or rank(r) < rank(best[key]):
            best[key] = r
    return list(best.values()), len(rows) - len(best)


def run(args: argparse.Namespace) -> int:
    from db import OutputRefused, replaceable_target
    from tiledattention import database_location, get_family, open_database

    from ..errors import USER_ERRORS

    to_stdout = args.output == "-"
    output = Path(args.output)
    shown = "standard output" if to_stdout else str(output)
    fmt = args.format or (None if to_stdout else _SUFFIXES.get(output.suffix.lower()))
    if fmt is None:
        what = ("-o - (standard output) has no suffix to tell the format by" if to_stdout
                else f"cannot tell the format of {output} from its suffix")
        return _fail(f"{what}; pass --format {{{','.join(FORMATS)}}}", 2)
    if not to_stdout:
        try:  # refused before anything is read: a directory, a device, a FIFO, ...
            replaceable_target(output)
        except OutputRefused as exc:
            return _fail(f"{exc}; -o - writes to standard output", 2)
        except OSError as exc:
            return _fail(f"cannot write {output}: {exc}", 2)
    try:
        archs = parse_archs(args.arch)
    except argparse.ArgumentTypeError as exc:
        return _fail(f"--arch: {exc}", 2)
    location = args.db or database_location()
    try:
        families = None if args.kernel is None else [get_family(args.kernel).name]
        database = (None if args.source == "shipped"
                    else open_database(location, read_only=True))
    except USER_ERRORS as exc:
        return _fail(str(exc), 2)
    chosen = args.source or ("user" if database is not None else "shipped")
    rows: list = []
    names: list[str] = []
    if database is None and chosen == "user":
        return _fail(f"no schedule database at {location}: nothing to export (tune with "
                     "`tiledtune search`, pass --db, or --source shipped for the tables "
                     "packaged with tiledattention)", 1)
    if database is None and args.source != "shipped":
        say("export", f"no schedule database at {location}: exporting the shipped tables "
                      + ("only" if chosen == "both" else "instead"))
    if database is not None:
        with database:
            names.append(str(database))
            try:
                rows = [r for arch in archs or [None] for r in database.rows(arch=arch)
                        if families is None or r.family in families]
            except USER_ERRORS as exc:
                return _fail(str(exc), 2)
    if chosen in ("shipped", "both"):
        shipped = _shipped_rows(archs, families)
        names += list(shipped)
        rows, merged = _merge(rows + [r for table in shipped.values() for r in table])
        if merged:
            say("export", f"{merged} key(s) in both the database and the shipped tables: "
                          "kept the faster row of each (a row the runtime would use before "
                          "one it would ignore)")
    source = " + ".join(names) or f"the shipped tables (none for {', '.join(archs or [])})"
    if archs is not None:
        for arch in archs:
            if not any(r.arch == arch for r in rows):
                print(f"tiledtune export: warning: no rows for {arch} in {source}",
                      file=sys.stderr)
    stale = 0
    if not args.include_stale:
        current = {r.family: get_family(r.family).template_identity() for r in rows}
        kept = [r for r in rows if r.provenance.template_hash == current[r.family]]
        stale = len(rows) - len(kept)
        if stale:
            print(f"tiledtune export: skipping {stale} row(s) tuned with another kernel template "
                  f"(current: {', '.join(f'{k} {v}' for k, v in sorted(current.items()))}); "
                  "--include-stale exports them", file=sys.stderr)
        rows = kept
    if not rows:
        selection = f" for {', '.join(archs)}" if archs else ""
        extra = f" ({stale} stale row(s) skipped)" if stale else ""
        hint = ("; --source shipped exports the tables packaged with tiledattention"
                if chosen == "user" else "")
        return _fail(f"no schedules{selection} in {source}{extra}: nothing to export; "
                     f"nothing written to {shown}{hint}", 1)
    chunks = _chunks(fmt, rows, source)
    if to_stdout:
        return _to_stdout(chunks, f"wrote {len(rows)} row(s) from {source} to standard output "
                                  f"({fmt})")
    from db import write_chunks_atomic

    try:
        write_chunks_atomic(output, (chunk.encode("utf-8") for chunk in chunks))
    except OutputRefused as exc:  # it changed since the check above
        return _fail(f"{exc}; -o - writes to standard output", 2)
    except OSError as exc:
        return _fail(f"cannot write {output}: {exc}", 2)
    print(f"wrote {len(rows)} row(s) from {source} to {output} ({fmt})")
    return 0


def _chunks(fmt: str, rows: list, source: str) -> Iterator[str]:
    """The text of the export in pieces (a row or a few hundred at a time for JSON and CSV), the
    same bytes whether they go to a file or to standard output."""
    from db import rows_json_chunks

    from ..transfer import csv_chunks, render_module

    if fmt == "json":
        return rows_json_chunks(rows)
    if fmt == "csv":
        return csv_chunks(rows)
    return iter([render_module(rows, source=source)])


def _to_stdout(chunks: Iterator[str], done: str) -> int:
    """Write ``chunks`` to standard output (the binary stream: the bytes a file would hold);
    the summary goes to standard error, so the output is only the export."""
    import os

    out = sys.stdout.buffer
    try:
        sys.stdout.flush()
        for chunk in chunks:
            out.write(chunk.encode("utf-8"))
        out.flush()
    except BrokenPipeError:  # the reader went away (`| head`): no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _fail("standard output was closed before the export was written in full", 2)
    except OSError as exc:
        return _fail(f"cannot write to standard output: {exc}", 2)
    say("export", done)
    return 0
