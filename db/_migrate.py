"""Alembic, configured in code (no ``alembic.ini``): known revisions and in-place upgrades."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = ["known_revisions", "head_revision", "upgrade", "downgrade"]

_SCRIPT_LOCATION = Path(__file__).parent / "migrations"


def _config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_SCRIPT_LOCATION))
    return config


@functools.lru_cache(maxsize=1)
def _script():
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


def known_revisions() -> frozenset[str]:
    return frozenset(s.revision for s in _script().walk_revisions())


def head_revision() -> str:
    return _script().get_current_head()


def upgrade(connection: "Connection", revision: str = "head") -> None:
    """Run the migrations up to ``revision`` on ``connection``, inside its open transaction
    (the caller commits)."""
    from alembic import command

    config = _config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def downgrade(connection: "Connection", revision: str) -> None:
    """Undo the migrations after ``revision`` on ``connection``, inside its open transaction
    (the caller commits). Tests and recovery only: ``ScheduleDB`` never downgrades."""
    from alembic import command

    config = _config()
    config.attributes["connection"] = connection
    command.downgrade(config, revision)
