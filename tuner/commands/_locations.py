"""Where ``tiledtune search`` writes: the schedule database, the Optuna study storage, and how a
location is shown (passwords masked, paths absolute)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["db_location", "storage_location", "shown_location", "same_database",
           "is_runtime_database"]


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


def same_database(a: str, b: str) -> bool:
    """Whether locations ``a`` and ``b`` name one database: the same file (paths resolved), or
    the same URL."""
    if "://" in a or "://" in b:
        return a.strip() == b.strip()
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def is_runtime_database(location: str | None) -> bool:
    """Whether ``location`` (``--db``; ``None``: not given) is the database the runtime reads
    (``$TILEDATTN_DB``, or the user cache's): where simulated rows never go (``import`` rejects
    them, ``search --backend simulated`` refuses to run)."""
    from tiledattention import database_location

    return location is None or same_database(location, database_location())
