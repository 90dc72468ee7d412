"""Alembic environment of the schedule database, driven only from ``db._migrate``.

There is no ``alembic.ini``: ``db._migrate`` builds the Alembic ``Config`` in code and passes an
open connection (already inside the caller's write transaction) as ``config.attributes
["connection"]``. Offline (``--sql``) mode is not supported.
"""

from __future__ import annotations

from alembic import context

from db._errors import DatabaseMisuse
from db._schema import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:
    raise DatabaseMisuse("db migrations run through db._migrate.upgrade(connection, revision)")
context.configure(connection=connection, version_table=VERSION_TABLE, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
