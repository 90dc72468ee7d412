from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_user_database(tmp_path, monkeypatch):
    """GPU tests run against an empty, throw-away schedule database (defaults + shipped table)."""
    import tiledattention

    tiledattention.use_database(str(tmp_path / "absent.sqlite"))
    yield
    tiledattention.use_database(None)
