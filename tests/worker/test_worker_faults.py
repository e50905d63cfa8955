"""A worker process whose database faults (a locked or unusable SQLite file; PostgreSQL
cancelling every statement after 1 ms) sees only the ledger's typed errors: opening the
ledger and working a run either succeed or raise `StoreUnavailable`, never a driver's
or eventsourcing's exception."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ledger import Accepted, Lease, Ledger, LedgerError, Worker
from ledger.core.errors import StoreUnavailable
from tests.support.runs import running

STATEMENT_TIMEOUT_1MS = "options=-c%20statement_timeout%3D1"


def _with_param(dsn: str, param: str) -> str:
    return dsn + ("&" if "?" in dsn else "?") + param


def _accept(lease: Lease) -> Accepted:
    return Accepted()


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give up on a busy store after moments, not the production minute."""
    monkeypatch.setattr("ledger.stores.sqlite.BUSY_TIMEOUT_S", 0.05)
    monkeypatch.setattr("ledger.commands.idempotency.RETRY_DELAYS", (0.01,))


@pytest.mark.usefixtures("quick_retries")
def test_a_worker_on_a_locked_sqlite_file_gets_a_typed_error(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(dsn) as lg:
        run_id = running(lg, 3)
        holder = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # another process writes and does not let go
            with pytest.raises(StoreUnavailable, match="locked"):
                Worker(lg, run_id, _accept, worker_id="w-locked").run()
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert {i.state for i in lg.items(run_id)} == {"pending"}  # nothing was written


@pytest.mark.parametrize("content", [b"not a database, only text " * 40, None], ids=["text", "dir"])
def test_opening_a_file_that_is_no_ledger_is_a_typed_error(
    tmp_path: Path, content: bytes | None
) -> None:
    path = tmp_path / "ledger.db"
    if content is None:
        path.mkdir()  # a directory where the file should be
    else:
        path.write_bytes(content)
    with pytest.raises(StoreUnavailable):
        Ledger.open(f"sqlite:///{path}")


@pytest.mark.postgres
def test_opening_and_working_under_1ms_statement_timeouts_gives_typed_errors(
    pg_dsn: str,
) -> None:
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 20)
    starved = _with_param(pg_dsn, STATEMENT_TIMEOUT_1MS)
    opened = refused = 0
    for _ in range(10):  # the first queries of a new pool (type adapters) time out too
        try:
            with Ledger.open(starved) as lg:
                opened += 1
                try:
                    Worker(lg, run_id, _accept, worker_id="w-starved", max_idle=0.1).run()
                except LedgerError as e:
                    assert isinstance(e, StoreUnavailable), e
        except StoreUnavailable:
            refused += 1
    assert opened + refused == 10
