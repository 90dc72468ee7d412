"""The identity of a schedule database: a random UUID stored in it (table
``tiledattention_database``, made by schema revision 0005 with the schema or by the migration
of an older one). It tells one database from another at the same path (the first deleted and
made again) and from another beside it, which a path cannot: what belongs to one database
(``tiledtune search``'s study of a key) keys on it."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from ._errors import DatabaseArgumentError

if TYPE_CHECKING:
    from ._store import ScheduleDB

__all__ = ["IDENTITY_TABLE", "database_identity"]

#: The table of revision 0005 holding the database's identity (one row, column ``identity``).
IDENTITY_TABLE = "tiledattention_database"


def database_identity(store: "ScheduleDB") -> str | None:
    """The identity of ``store``: the UUID its identity table holds. A store opened for writing
    always has one (written now into a table found empty, e.g. emptied by hand); one opened
    read-only answers ``None`` when it holds none (a file of a revision before 0005, read as it
    is: readers change nothing)."""
    from ._store import ScheduleDB

    if not isinstance(store, ScheduleDB):
        raise DatabaseArgumentError(f"database_identity() takes a ScheduleDB; got "
                                    f"{type(store).__name__}")
    with store._reading() as reader:
        if IDENTITY_TABLE in reader.tables():
            found = reader.column(f"SELECT identity FROM {IDENTITY_TABLE} ORDER BY identity")
            if found:
                return str(found[0])
    if store.read_only:
        return None
    return store._write(_ensure_identity)


def _ensure_identity(connection) -> str:
    """The identity in the table (made when missing), writing one when there is none: inside
    the write transaction, so that concurrent writers agree on the first one written."""
    from sqlalchemy import text

    connection.execute(text(f"CREATE TABLE IF NOT EXISTS {IDENTITY_TABLE} "
                            "(identity VARCHAR(36) NOT NULL PRIMARY KEY)"))
    found = connection.execute(text(f"SELECT identity FROM {IDENTITY_TABLE} "
                                    "ORDER BY identity")).scalars().first()
    if found is not None:
        return str(found)
    made = str(uuid.uuid4())
    connection.execute(text(f"INSERT INTO {IDENTITY_TABLE} (identity) VALUES (:identity)"),
                       {"identity": made})
    return made
