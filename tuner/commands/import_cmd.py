"""``tiledtune import``: merge exported schedule files (JSON or CSV) into the database.

Every row is validated before anything is written: a row of the wrong shape or types, of an
architecture tileiras does not know, with a schedule that does not validate, with absurdly long
strings, naming a JSON key twice, with numbers no measurement can have (a time faster than the
architecture's fastest GPU runs the problem, a date in the future: ``transfer._plausible``), or
repeating a key already seen in the same file (the first is kept), or simulated (``backend``
``simulated``) on its way into the database the runtime reads, is rejected with its reason and
writes nothing. Accepted rows go through ``ScheduleDB.merge_many``, ``BATCH_ROWS`` a
transaction, under the better-wins rule of ``ScheduleDB.merge`` (``--force`` overwrites). Files
are read a chunk at a time (no size limit); files not UTF-8, not JSON or CSV, without the
expected top-level structure, or holding one row longer than ``MAX_ROW_CHARS`` are rejected
whole.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..transfer import MAX_ROW_CHARS, UnreadableFile, read_rows
from ._locations import is_runtime_database
from ._report import nonempty, print_table, results_console, say

__all__ = ["configure", "run", "FileReport"]

EXIT_OK, EXIT_REJECTED, EXIT_UNREADABLE = 0, 1, 2
#: Rows merged per write transaction: large enough that a commit's cost vanishes, small enough
#: that a search writing to the same database waits well under a second for the lock.
BATCH_ROWS = 2000


@dataclass
class FileReport:
    name: str
    counts: dict[str, int] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)  # "row N: reason"
    notes: list[str] = field(default_factory=list)  # "row N: skipped: why" (and replaced)
    error: str | None = None  # the whole file was rejected


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "Each row is validated first; a bad row is rejected with its reason and writes\n"
        "nothing: among others, a JSON key named twice, a date more than a day ahead, and a\n"
        "time shorter than the fastest GPU of the row's architecture would need at twice\n"
        "its peak rate. A row the runtime would use is never replaced by one it would ignore.\n"
        "Outcomes: added (new key); improved / kept (same toolchain, the faster wins);\n"
        "replaced (the stored row was stale, simulated or of an older toolchain); skipped\n"
        "(the imported row is stale, simulated, or of another toolchain; the reason is\n"
        "printed); forced (--force).\n"
        "Simulated rows (backend 'simulated') are rejected for the database the runtime\n"
        "reads (no --db, or --db $TILEDATTN_DB): give --db another file for them.\n"
        "Files of any size are read a chunk at a time; a file not UTF-8, not JSON/CSV, or\n"
        f"with a row over {MAX_ROW_CHARS // 1024} K characters is rejected whole.\n"
        "exit status: 0 every row accepted; 1 some rows rejected; 2 a file (or the database)\n"
        "could not be read at all")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="files written by `tiledtune export --format json|csv`")
    parser.add_argument("--db", metavar="PATH_OR_URL", type=nonempty, default=None,
                        help="schedule database (default: $TILEDATTN_DB or "
                             "~/.cache/tiledattention/schedules.sqlite)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite stored rows even when they are faster")


# -- command -----------------------------------------------------------------------------------

def _report(reports: list[FileReport], outcomes: tuple[str, ...]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = results_console()  # the outcome table; the rows' reasons go to standard error
    errors = Console(stderr=True, soft_wrap=True, highlight=False)
    for report in reports:
        if report.error:
            errors.print(f"{report.name}: file rejected: {report.error}", markup=False)
        for reason in report.rejected:
            errors.print(f"{report.name}: {reason}", markup=False)
        for note in report.notes:
            errors.print(f"{report.name}: {note}", markup=False)
    table = Table(title="tiledtune import")
    table.add_column("file", overflow="fold")
    for outcome in (*outcomes, "rejected"):
        table.add_column(outcome, justify="right")
    for report in reports:
        rejected = "file" if report.error else str(len(report.rejected))
        table.add_row(report.name, *(str(report.counts.get(o, 0)) for o in outcomes), rejected)
    if len(reports) > 1:
        table.add_row("total", *(str(sum(r.counts.get(o, 0) for r in reports))
                                 for o in outcomes),
                      str(sum(len(r.rejected) for r in reports)))
    print_table(console, table)


def _refuse_simulated(parsed: list, location: str | None) -> list:
    """``parsed`` without its simulated rows (``backend`` ``simulated``: a model's numbers, not
    GPU measurements) when ``location`` is the database the runtime reads (no ``--db``, or
    ``$TILEDATTN_DB``'s): each is rejected with the way out (``--db`` another file, e.g. the
    one ``search --backend simulated`` writes to). Other databases take them, marked by their
    backend, which the lookup and ``export --format bytarget`` go by."""
    from tiledattention import database_location
    from tiledattention.tooling import simulated_database_location

    runtime = database_location()
    if not is_runtime_database(location):
        return parsed
    kept = []
    for report, rows in parsed:
        for index, row in rows:
            if row.backend == "simulated":
                report.rejected.append(
                    f"row {index}: a simulated row (backend 'simulated', not measured on a GPU) "
                    f"is not imported into {runtime}, the database the runtime reads; import "
                    f"it with --db {simulated_database_location()} (or another file)")
        kept.append((report, [(i, r) for i, r in rows if r.backend != "simulated"]))
    return kept


def run(args: argparse.Namespace) -> int:
    from db import PUT_OUTCOMES
    from tiledattention import get_family, open_database
    from tiledattention.tooling import codecs, current_provenance

    from ..errors import USER_ERRORS

    known = codecs()
    current: dict = {}  # family -> the provenance a measurement would carry now
    reports = []
    parsed = []
    for name in args.files:
        report = FileReport(name=name)
        reports.append(report)
        try:
            rows, report.rejected = read_rows(Path(name), known)
        except UnreadableFile as exc:
            report.error = str(exc)
            continue
        parsed.append((report, rows))
    parsed = _refuse_simulated(parsed, args.db)
    if any(rows for _, rows in parsed):
        try:
            database = open_database(args.db)
        except USER_ERRORS as exc:
            say("import", exc)
            return EXIT_UNREADABLE
        with database:
            for report, rows in parsed:
                for family in {row.family for _, row in rows} - set(current):
                    current[family] = current_provenance(get_family(family))
                # one write transaction per batch (ScheduleDB.merge_many): the same rule as a
                # merge of each row, thousands of rows a second
                for start in range(0, len(rows), BATCH_ROWS):
                    batch = rows[start:start + BATCH_ROWS]
                    try:
                        outcomes = database.merge_many([row for _, row in batch],
                                                       force=args.force, current=current)
                    except USER_ERRORS as exc:
                        say("import", exc)
                        _report(reports, PUT_OUTCOMES)
                        return EXIT_UNREADABLE
                    for (index, _), (outcome, why) in zip(batch, outcomes):
                        report.counts[outcome] = report.counts.get(outcome, 0) + 1
                        if outcome in ("skipped", "replaced"):
                            report.notes.append(f"row {index}: {outcome}: {why}")
    _report(reports, PUT_OUTCOMES)
    if any(r.error for r in reports):
        return EXIT_UNREADABLE
    if any(r.rejected for r in reports):
        return EXIT_REJECTED
    return EXIT_OK
