"""The state database both ways: SQLite in a test directory and a real PostgreSQL
(tests/support/postgres.py, one server for the session, a fresh schema per test)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import Postgres, available, postgres_server


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    if os.geteuid() != 0 or not available():
        pytest.skip("PostgreSQL needs root (to drop to the postgres user) and Debian's postgresql")
    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a store keeps its tables: a SQLite file, or the PostgreSQL URL of an empty schema."""
    if request.param == "sqlite":
        return tmp_path / "sandgate.db"
    server: Postgres = request.getfixturevalue("postgres")
    server.run("DROP SCHEMA public CASCADE", "CREATE SCHEMA public")
    return server.url
