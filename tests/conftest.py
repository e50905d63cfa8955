"""Shared fixtures: one behavioural suite over every store.

`store_dsn` is parametrised over memory, a SQLite file and PostgreSQL (a fresh
database per test; marked `postgres`, so `-m postgres` selects those).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ledger import Actor, Ledger
from tests.support.clock import ManualClock
from tests.support.pg_fixtures import *  # noqa: F403  (pg_server, pg_databases, pg_template_dsn, pg_dsn)


def _install_schema(dsn: str) -> None:
    # the template database gets the ledger schema once; every test database clones it
    Ledger.open(dsn).close()


from tests.support import pgserver  # noqa: E402

if _install_schema not in pgserver.TEMPLATE_INITIALIZERS:
    pgserver.TEMPLATE_INITIALIZERS.append(_install_schema)

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=STORES)
def store_dsn(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A DSN for an empty ledger on each store."""
    kind = request.param
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def lg(store_dsn: str, clock: ManualClock) -> Iterator[Ledger]:
    """A ledger on each store with a manual clock."""
    ledger = Ledger.open(store_dsn, clock=clock)
    try:
        yield ledger
    finally:
        ledger.close()


SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")
WORKER = Actor("w1", "worker")
REVIEWER = Actor("rita", "reviewer")
OPERATOR = Actor("olga", "operator")
RECONCILER = Actor("rec", "reconciler")


def manifest(n: int = 3, **policy: Any) -> dict[str, Any]:
    """A small valid manifest with items i0..i{n-1}."""
    return {
        "source_version": "exports/2026-11-28",
        "config_version": "cfg-1",
        "scope": "test",
        "items": [{"item_id": f"i{k}", "payload": {"n": k}} for k in range(n)],
        "policy": policy,
    }


def finished_run(lg: Ledger, n: int = 3) -> str:
    """A run of `n` items, each claimed and accepted, then completed (succeeded)."""
    run_id = lg.submit(manifest(n), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    for lease in lg.claim(run_id, WORKER, limit=n):
        lg.accept(lease)
    lg.complete(run_id, CONTROLLER)
    return run_id


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`hold()`: a `HeldInTransaction` (tests/stores/test_postgres.py) for this test: the next
    command it starts stops inside its transaction once its run is loaded. The hook on
    the run's load is undone after the test."""
    from tests.stores.test_postgres import HeldInTransaction

    return lambda: HeldInTransaction(monkeypatch)
