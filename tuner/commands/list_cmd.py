"""``tiledtune list``: a table of the stored schedules, one page at a time.

    tiledtune list                                  # the first 50 rows, in key order
    tiledtune list --kernel forward --arch sm_90 --device "NVIDIA H100 80GB HBM3"
    tiledtune list --offset 50 --limit 100          # the next page
    tiledtune list --json | jq '.rows[].schedule'   # for scripts

Filters and the page are database queries, so the first page of a large database comes as fast
as that of a small one. The table (or the ``--json`` document) goes to standard output; when that
is not a terminal the table is printed in full at its natural width. Exit status: 0 shown (or no
database), 2 the database cannot be used.
"""

from __future__ import annotations

import argparse
import warnings

from ._problems import parse_arch
from ._report import (add_json_option, count, nonempty, print_json, print_table,
                      results_console, say)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Show the stored schedules, one page at a time (filters and the page "
                          "are database queries).")
    parser.add_argument("--db", type=nonempty, default=None, metavar="PATH_OR_URL",
                        help="schedule database (path or SQLAlchemy URL; default: "
                             "$TILEDATTN_DB or the user cache)")
    parser.add_argument("--arch", type=parse_arch, default=None, metavar="SM_XX",
                        help="only this architecture, e.g. sm_90")
    parser.add_argument("--kernel", default=None, metavar="NAME",
                        help="only this kernel family (default: every family)")
    parser.add_argument("--device", default=None, metavar="NAME", help="only this device name")
    parser.add_argument("--limit", type=count, default=50, metavar="N",
                        help="rows per page (default 50; 0: every row)")
    parser.add_argument("--offset", type=count, default=0, metavar="N",
                        help="skip this many rows first (the next page: --offset 50)")
    add_json_option(parser, "the page of rows (each in the export format)")


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from tiledattention import database_location, get_family, open_database

    from ..errors import USER_ERRORS

    console = results_console()
    location = args.db or database_location()
    filters = {"arch": args.arch, "device_name": args.device}
    try:
        filters["family"] = None if args.kernel is None else get_family(args.kernel).name
        db = open_database(location, read_only=True)
        if db is None:
            if args.json:
                print_json("list", {"database": location, "exists": False, "total": 0,
                                    "offset": args.offset, "limit": args.limit, "rows": [],
                                    "next_offset": None})
            else:
                console.print(f"no schedule database at {location}{_simulated_hint(args)}",
                              markup=False)
            return 0
        with db, warnings.catch_warnings(record=True) as skipped:
            warnings.simplefilter("always")
            total = db.count(**filters)
            rows = db.rows(**filters, limit=args.limit or None, offset=args.offset)
    except USER_ERRORS as exc:
        say("list", exc)
        return 2
    for warning in skipped:  # rows that no longer decode: one line each
        say("list", warning.message)
    more = args.offset + len(rows) < total
    if args.json:
        print_json("list", {"database": str(db), "exists": True, "total": total,
                            "offset": args.offset, "limit": args.limit, "rows": rows,
                            "next_offset": args.offset + len(rows) if more else None})
        return 0
    page = f"rows {args.offset + 1}-{args.offset + len(rows)} of " if rows else "0 of "
    table = Table(title=f"{page}{total} schedules in {db}")
    # a column per baseline the page's rows hold (the names their families' cases gave them)
    baselines = sorted({name for r in rows for name in r.baselines})
    for col in ("kernel", "arch", "device", "backend", "key", "schedule", "ms", "TFLOP/s",
                "vs default", *(f"vs {name}" for name in baselines), "trials", "when"):
        table.add_column(col)
    for r in rows:
        vs = _ratio_to(r.median_ms)
        table.add_row(r.family, r.arch, r.device_name, r.backend, r.problem.describe(),
                      r.schedule.describe(), f"{r.median_ms:.4g}", f"{r.tflops:.0f}",
                      vs(r.default_ms), *(vs(r.baselines.get(name)) for name in baselines),
                      str(r.trials), r.created_at.strftime("%Y-%m-%d %H:%M"))
    print_table(console, table)
    if more:
        console.print(f"next page: --offset {args.offset + len(rows)}")
    return 0


def _simulated_hint(args: argparse.Namespace) -> str:
    """Where ``search --backend simulated`` put its rows, when the user database is missing
    and they exist (a new user's first search is often a simulated one)."""
    from pathlib import Path

    from tiledattention.tooling import simulated_database_location

    simulated = simulated_database_location()
    if args.db is not None or "://" in simulated or not Path(simulated).exists():
        return ""
    return (f"; simulated searches wrote to {simulated} (tiledtune list --db {simulated})")


def _ratio_to(median_ms: float):
    """``other_ms -> "1.23x"``: how much slower another contender was than the stored row."""
    return lambda other: f"{other / median_ms:.2f}x" if other else "-"
