"""What the ``tune_*_shipped.py`` scripts share: one ``tiledtune search`` command over keys."""

from __future__ import annotations

import subprocess
import sys


def search(kernel: str, keys: list[str], db: str, trials: int, timeout: str | None,
           dry_run: bool) -> int:
    """Print and (unless ``dry_run``) run ``tiledtune search`` of ``kernel`` on sm_90's compact
    space over ``keys`` (``--problem`` values); its exit status (0 on a dry run)."""
    cmd = [sys.executable, "-m", "tuner.cli", "search", "--kernel", kernel, "--device", "sm_90",
           "--space", "compact", "--trials", str(trials), "--db", db]
    if timeout:
        cmd += ["--timeout", timeout]
    for key in keys:
        cmd += ["--problem", key]
    print(f"{len(keys)} keys:", " ".join(cmd), flush=True)
    return 0 if dry_run else subprocess.call(cmd)


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
    """The options every ``tune_*_shipped.py`` passes to :func:`search`."""
    parser.add_argument("--db", required=True)
    parser.add_argument("--trials", type=int, default=trials)
    parser.add_argument("--timeout", default=None, help="per key, e.g. 30s (tiledtune's syntax)")
    parser.add_argument("--dry-run", action="store_true")
