"""``tiledtune list``: a table of the stored schedules."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, help="schedule database (path or SQLAlchemy URL)")
    parser.add_argument("--arch", default=None, help="only this architecture, e.g. sm_90")
    parser.add_argument("--kernel", default=None, metavar="NAME",
                        help="only this kernel family (default: every family)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from db import DatabaseError
    from tiledattention import TiledAttentionError, database_location, get_family, open_database

    console = Console()
    location = args.db or database_location()
    try:
        family = None if args.kernel is None else get_family(args.kernel).name
        db = open_database(location, read_only=True)
        if db is None:
            console.print(f"no schedule database at {location}")
            return 0
        with db:
            rows = db.rows(family=family, arch=args.arch)
    except (TiledAttentionError, DatabaseError) as exc:
        Console(stderr=True).print(f"tiledtune list: {exc}", markup=False)
        return 2
    table = Table(title=f"{len(rows)} schedules in {db}")
    for col in ("kernel", "arch", "device", "key", "schedule", "ms", "TFLOP/s", "vs default",
                "vs cuDNN", "trials", "when"):
        table.add_column(col)
    for r in rows:
        vs = _ratio_to(r.median_ms)
        table.add_row(r.family, r.arch, r.device_name, r.problem.describe(), r.schedule.describe(),
                      f"{r.median_ms:.3f}", f"{r.tflops:.0f}", vs(r.default_ms),
                      vs(r.torch_cudnn_ms), str(r.trials), r.created_at.strftime("%Y-%m-%d %H:%M"))
    console.print(table)
    return 0


def _ratio_to(median_ms: float):
    """``other_ms -> "1.23x"``: how much slower another contender was than the stored row."""
    return lambda other: f"{other / median_ms:.2f}x" if other else "-"
