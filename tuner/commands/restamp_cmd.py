"""``tiledtune restamp``: carry rows over a kernel-template change that left their code alone.

    tiledtune restamp --from c518f0c  # the user database
    tiledtune restamp --from c518f0c --file tiledattention/pretuned/sm_90.json

Every row whose template identity is not the current one is compiled (compile-only, for its own
architecture) with the code of git revision ``--from`` and with the code installed now; rows
whose ``.text`` sections are identical get the current identity, the others are listed with the
``tiledtune search`` command that re-tunes them. Exit status: 0 nothing left to re-tune, 1 some
rows need re-tuning, 2 the revision, database or file unusable (a missing database is never
created).
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
    from tiledattention import database_location, open_database
    from tiledattention.tooling import codecs

    from ..errors import USER_ERRORS
    from ..transfer import describe_row, restamp

    location = args.db or database_location()
    try:
        if args.file is not None:
            rows = list(load_rows_file(Path(args.file), codecs()))
        else:
            # read through a read-only opening, which creates nothing: a missing database is
            # said so, never made (an empty one would then shadow the shipped tables in export)
            database = open_database(location, read_only=True)
            if database is None:
                say("restamp", f"no schedule database at {location}: nothing to re-stamp (pass "
                               "--db, or --file for a rows file such as "
                               "tiledattention/pretuned/sm_90.json)")
                return 2
            with database:
                rows = database.rows()
        result = restamp(rows, args.revision, workers=max(1, args.jobs))
        if not args.dry_run and result.restamped:
            if args.file is None:
                with open_database(location) as database:
                    for row in result.restamped:
                        database.put(row, force=True)
            else:
                kept = [r for r, _ in result.retune]
                dump_rows(result.current + result.restamped + kept, Path(args.file))
    except (*USER_ERRORS, OSError) as exc:
        say("restamp", exc)
        return 2
    verb = "would re-stamp" if args.dry_run else "re-stamped"
    print(f"{len(result.current)} row(s) already current; {verb} {len(result.restamped)}; "
          f"{len(result.retune)} need re-tuning")
    for row, why in result.retune:
        print(f"  re-tune: {describe_row(row)}: {why}")
    if result.retune:
        print("re-tune them with `tiledtune search --kernel NAME --device ARCH ...` on a GPU of "
              "their architecture")
    return 1 if result.retune else 0
