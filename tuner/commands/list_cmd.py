"""``tiledtune list``: a table of the stored schedules."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, help="schedule database (path or SQLAlchemy URL)")
    parser.add_argument("--arch", default=None, help="only this architecture, e.g. sm_90")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from db import ScheduleDB
    from tiledattention._settings import database_location

    location = args.db or database_location()
    db = ScheduleDB.open_for_lookup(location)
    console = Console()
    if db is None:
        console.print(f"no schedule database at {location}")
        return 0
    with db:
        rows = db.rows(arch=args.arch)
    table = Table(title=f"{len(rows)} schedules in {db}")
    for col in ("arch", "device", "key", "schedule", "ms", "TFLOP/s", "vs default", "vs cuDNN",
                "trials", "when"):
        table.add_column(col)
    for r in rows:
        vs = _ratio_to(r.median_ms)
        table.add_row(r.arch, r.device_name, r.problem.describe(), r.schedule.describe(),
                      f"{r.median_ms:.3f}", f"{r.tflops:.0f}", vs(r.default_ms),
                      vs(r.torch_cudnn_ms), str(r.trials), r.created_at.strftime("%Y-%m-%d %H:%M"))
    console.print(table)
    return 0


def _ratio_to(median_ms: float):
    """``other_ms -> "1.23x"``: how much slower another contender was than the stored row."""
    return lambda other: f"{other / median_ms:.2f}x" if other else "-"
