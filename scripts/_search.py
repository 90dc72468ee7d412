"""What the ``tune_*_shipped.py`` scripts share: one ``tiledtune search`` command over keys."""

from __future__ import annotations

import subprocess
import sys


def search(kernel: str, keys: list[str], options) -> int:
    """Print and (unless ``options.dry_run``) run ``tiledtune search`` of ``kernel`` on sm_90
    over ``keys`` (``--problem`` values), with the options :func:`add_search_options` parsed
    into ``options`` (the database, trials, timeout, space); its exit status (0 on a dry
    run)."""
    cmd = [sys.executable, "-m", "tuner.cli", "search", "--kernel", kernel, "--device", "sm_90",
           "--space", options.space, "--trials", str(options.trials), "--db", options.db]
    if options.timeout:
        cmd += ["--timeout", options.timeout]
    for key in keys:
        cmd += ["--problem", key]
    print(f"{len(keys)} keys:", " ".join(cmd), flush=True)
    return 0 if options.dry_run else subprocess.call(cmd)


def problem_arg(fields: dict) -> str:
    """A ``--problem`` value: ``field=value,...``."""
    return ",".join(f"{k}={str(v).lower()}" for k, v in fields.items())


def problem_args(problems: list[dict]) -> list[str]:
    """The ``--problem`` values of ``problems`` (each a ``tiledattention.Problem``'s fields,
    checked by building it: a bad key fails here, not in the search)."""
    import tiledattention as ta

    for fields in problems:
        ta.Problem(**fields)
    return [problem_arg(fields) for fields in problems]


def add_search_options(parser, trials: int = 6) -> None:
    """The options every ``tune_*_shipped.py`` passes to :func:`search` (the named space:
    ``compact`` unless asked)."""
    parser.add_argument("--db", required=True)
    parser.add_argument("--trials", type=int, default=trials)
    parser.add_argument("--timeout", default=None, help="per key, e.g. 30s (tiledtune's syntax)")
    parser.add_argument("--space", default="compact", choices=("compact", "full"),
                        help="the named search space (tiledtune search --space)")
    parser.add_argument("--dry-run", action="store_true")
