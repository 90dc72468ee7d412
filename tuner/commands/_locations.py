"""Where ``tiledtune search`` writes: the schedule database, the Optuna study storage, and how a
location is shown (passwords masked, paths absolute)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["db_location", "storage_location", "shown_location"]


def db_location(args) -> str:
    """The schedule database: ``--db``; else the user database the runtime reads, except for
    the simulated backend, whose results go to a file of their own unless ``--db`` names one."""
    from tiledattention import database_location
    from tiledattention.tooling import simulated_database_location

    if args.db:
        return args.db
    return simulated_database_location() if args.backend == "simulated" else database_location()


def storage_location(args, db: str) -> str:
    """The Optuna study storage: ``--storage``; a server database's own URL; else an SQLite
    file beside the schedule database."""
    if args.storage:
        return args.storage
    if "://" in db and not db.startswith("sqlite"):
        return db
    path = Path(db.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.with_name('tiledtune-studies.sqlite')}"


def shown_location(url: str) -> str:
    """A database location as it may be shown: a password in a URL masked
    (``postgresql://user:***@host/db``), a relative file path made absolute."""
    if "://" not in url:
        return str(Path(url).expanduser().absolute())
    if url.startswith("sqlite:///") and url[len("sqlite:///"):] not in ("", ":memory:"):
        return "sqlite:///" + str(Path(url[len("sqlite:///"):]).expanduser().absolute())
    return re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", url)
