"""Shared fixtures, for the tests in every folder: one behavioural suite over every store.

`store_dsn` is parametrised over memory, a SQLite file and PostgreSQL (a fresh
database per test; marked `postgres`, so `-m postgres` selects those); `dsn` over the
two that outlive one connection, a SQLite file and PostgreSQL. The helpers they use
live in tests/support/.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ledger import Ledger
from tests.support.clock import ManualClock
from tests.support.pg_fixtures import *  # noqa: F403  (pg_server, pg_databases, pg_template_dsn, pg_dsn)
from tests.support.stores import FILE_STORES, STORES, dsn_for


def _install_schema(dsn: str) -> None:
    # the template database gets the ledger schema once; every test database clones it
    Ledger.open(dsn).close()


from tests.support import pgserver  # noqa: E402

if _install_schema not in pgserver.TEMPLATE_INITIALIZERS:
    pgserver.TEMPLATE_INITIALIZERS.append(_install_schema)


@pytest.fixture(params=STORES)
def store_dsn(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A DSN for an empty ledger on each store."""
    return dsn_for(request.param, request, tmp_path)


@pytest.fixture(params=FILE_STORES)
def dsn(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A DSN for an empty ledger on a store that outlives one connection (a SQLite file
    that is not made yet, or a fresh PostgreSQL database), for tests whose processes,
    commands or servers each open it."""
    return dsn_for(request.param, request, tmp_path)


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


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`hold()`: a `HeldInTransaction` (tests/support/hold.py) for this test: the next
    command it starts stops inside its transaction once its run is loaded. The hook on
    the run's load is undone after the test."""
    from tests.support.hold import HeldInTransaction

    return lambda: HeldInTransaction(monkeypatch)


@pytest.fixture
def webhook_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """A webhook encryption key in LEDGER_WEBHOOK_KEYS for this test (and the processes it
    starts): webhook secrets are stored encrypted with it."""
    from ledger.feed.webhook_secrets import KEY_FILE_ENV, KEYS_ENV, new_key

    key = new_key()
    monkeypatch.setenv(KEYS_ENV, key)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    return key
