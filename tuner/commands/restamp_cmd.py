"""``tiledtune restamp``: carry rows over a kernel-template change that left their code alone.

    tiledtune restamp --from c518f0c                      # the user database
    tiledtune restamp --from c518f0c --file tiledattention/pretuned/sm_90.json

Every row whose template identity is not the current one is compiled (compile-only, for its own
architecture) with the code of git revision ``--from`` and with the code installed now; rows
whose ``.text`` sections are identical get the current identity, the others are listed with the
``tiledtune search`` command that re-tunes them. Exit status: 0 nothing left to re-tune, 1 some
rows need re-tuning, 2 the revision, the database or the file could not be used.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ._report import nonempty, positive_int, say


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 2)[2]
    parser.add_argument("--from", dest="revision", required=True, metavar="REV",
                        help="the code that tuned the stale rows: a git revision of this "
                             "repository, or a directory holding its tiledattention/ package")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", metavar="PATH_OR_URL", type=nonempty, default=None,
                       help="schedule database (default: $TILEDATTN_DB or the user cache)")
    where.add_argument("--file", metavar="JSON", type=nonempty, default=None,
                       help="a rows file (e.g. the shipped table), rewritten in place")
    parser.add_argument("--jobs", type=positive_int, default=max(1, os.cpu_count() or 1),
                        metavar="N", help="parallel compile processes (default: the CPU count)")
    parser.add_argument("--dry-run", action="store_true", help="report only; write nothing")


def run(args: argparse.Namespace) -> int:
    from db import dump_rows, load_rows_file
    from tiledattention import open_database
    from tiledattention.tooling import codecs

    from ..errors import USER_ERRORS
    from ..transfer import describe_row, restamp

    try:
        if args.file is not None:
            rows = list(load_rows_file(Path(args.file), codecs()))
            database = None
        else:
            database = open_database(args.db)
            rows = database.rows()
        result = restamp(rows, args.revision, workers=max(1, args.jobs))
        if not args.dry_run:
            if database is not None:
                for row in result.restamped:
                    database.put(row, force=True)
            elif result.restamped:
                kept = [r for r, _ in result.retune]
                dump_rows(result.current + result.restamped + kept, Path(args.file))
    except (*USER_ERRORS, OSError) as exc:
        say("restamp", exc)
        return 2
    finally:
        if args.file is None and "database" in locals() and database is not None:
            database.close()
    verb = "would re-stamp" if args.dry_run else "re-stamped"
    print(f"{len(result.current)} row(s) already current; {verb} {len(result.restamped)}; "
          f"{len(result.retune)} need re-tuning")
    for row, why in result.retune:
        print(f"  re-tune: {describe_row(row)}: {why}")
    if result.retune:
        print("re-tune them with `tiledtune search --kernel NAME --device ARCH ...` on a GPU of "
              "their architecture")
    return 1 if result.retune else 0
