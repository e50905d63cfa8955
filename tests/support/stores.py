"""The stores a test runs on, as pytest parameters (the fixtures in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

# stores that outlive one connection: a SQLite file, PostgreSQL (marked `postgres`)
FILE_STORES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]
STORES = [pytest.param("memory", id="memory"), *FILE_STORES]


def dsn_for(kind: str, request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A DSN for an empty ledger on store `kind` (PostgreSQL: a fresh database)."""
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn
