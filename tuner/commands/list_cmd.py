"""``tiledtune list``: a table of the stored schedules, one page at a time.

    tiledtune list                                  # the first 50 rows, in key order
    tiledtune list --kernel forward --arch sm_90 --device "NVIDIA H100 80GB HBM3"
    tiledtune list --offset 50 --limit 100          # the next page

Filters and the page are database queries, so the first page of a large database comes as fast
as that of a small one. Exit status: 0 shown (or no database), 2 the database cannot be used.
"""

from __future__ import annotations

import argparse
import warnings

from ._report import count, say


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, help="schedule database (path or SQLAlchemy URL)")
    parser.add_argument("--arch", default=None, help="only this architecture, e.g. sm_90")
    parser.add_argument("--kernel", default=None, metavar="NAME",
                        help="only this kernel family (default: every family)")
    parser.add_argument("--device", default=None, metavar="NAME", help="only this device name")
    parser.add_argument("--limit", type=count, default=50, metavar="N",
                        help="rows per page (default 50; 0: every row)")
    parser.add_argument("--offset", type=count, default=0, metavar="N",
                        help="skip this many rows first (the next page: --offset 50)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from db import DatabaseError
    from tiledattention import TiledAttentionError, database_location, get_family, open_database

    console = Console()
    location = args.db or database_location()
    filters = {"arch": args.arch, "device_name": args.device}
    try:
        filters["family"] = None if args.kernel is None else get_family(args.kernel).name
        db = open_database(location, read_only=True)
        if db is None:
            console.print(f"no schedule database at {location}")
            return 0
        with db, warnings.catch_warnings(record=True) as skipped:
            warnings.simplefilter("always")
            total = db.count(**filters)
            rows = db.rows(**filters, limit=args.limit or None, offset=args.offset)
    except (TiledAttentionError, DatabaseError) as exc:
        say("list", exc)
        return 2
    for warning in skipped:  # rows that no longer decode: one line each
        say("list", warning.message)
    page = f"rows {args.offset + 1}-{args.offset + len(rows)} of " if rows else "0 of "
    table = Table(title=f"{page}{total} schedules in {db}")
    for col in ("kernel", "arch", "device", "backend", "key", "schedule", "ms", "TFLOP/s",
                "vs default", "vs cuDNN", "trials", "when"):
        table.add_column(col)
    for r in rows:
        vs = _ratio_to(r.median_ms)
        table.add_row(r.family, r.arch, r.device_name, r.backend, r.problem.describe(),
                      r.schedule.describe(), f"{r.median_ms:.3f}", f"{r.tflops:.0f}",
                      vs(r.default_ms), vs(r.torch_cudnn_ms), str(r.trials),
                      r.created_at.strftime("%Y-%m-%d %H:%M"))
    console.print(table)
    if args.offset + len(rows) < total:
        console.print(f"next page: --offset {args.offset + len(rows)}")
    return 0


def _ratio_to(median_ms: float):
    """``other_ms -> "1.23x"``: how much slower another contender was than the stored row."""
    return lambda other: f"{other / median_ms:.2f}x" if other else "-"
