"""`Ledger.using(conn)` and `AsyncLedger.using(aconn)`: the ledger's writes inside the
caller's own transaction commit and roll back with the caller's writes; a refused command
writes nothing and leaves the caller's transaction usable."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from ledger import AsyncLedger, Ledger
from ledger.core.errors import InvalidInput, NotAuthorized
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest


def _sqlite_path(dsn: str) -> str:
    return dsn[len("sqlite:///") :]


@contextmanager
def caller_connection(dsn: str, check_same_thread: bool = True) -> Iterator[Any]:
    """The service's own connection to the ledger's database, with a table of its own."""
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(_sqlite_path(dsn), check_same_thread=check_same_thread)
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, run_id TEXT)")
        conn.commit()
        try:
            yield conn
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, run_id TEXT)")
            conn.commit()
            yield conn


def _orders(dsn: str) -> list[tuple[str, str]]:
    with caller_connection(dsn) as conn:
        rows = conn.execute("SELECT id, run_id FROM orders ORDER BY id").fetchall()
        return [tuple(r) for r in rows]


def _insert_order(conn: Any, order: str, run_id: str) -> None:
    placeholder = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    conn.execute(
        f"INSERT INTO orders (id, run_id) VALUES ({placeholder}, {placeholder})",  # noqa: S608
        (order, run_id),
    )


class Boom(Exception):
    pass


def test_the_run_commits_with_the_callers_own_writes(dsn: str) -> None:
    with Ledger.open(dsn) as lg, caller_connection(dsn) as conn:
        status = lg.using(conn).submit(manifest(2), SUBMITTER)
        _insert_order(conn, "o-1", status.run_id)
        # not committed yet: another connection sees neither
        assert lg.runs() == []
        conn.commit()
        assert [r.run_id for r in lg.runs()] == [status.run_id]
        assert _orders(dsn) == [("o-1", status.run_id)]
        assert lg.verify().ok


def test_the_run_rolls_back_with_the_callers_own_writes(dsn: str) -> None:
    with Ledger.open(dsn) as lg, caller_connection(dsn) as conn:
        status = lg.using(conn).submit(manifest(2), SUBMITTER)
        _insert_order(conn, "o-1", status.run_id)
        conn.rollback()
        assert lg.runs() == []
        assert _orders(dsn) == []
        # the ledger goes on: the same submit commits on its own
        assert lg.submit(manifest(2), SUBMITTER).state == "queued"
        assert lg.verify().ok


def test_a_refused_command_writes_nothing_and_the_callers_transaction_goes_on(dsn: str) -> None:
    with Ledger.open(dsn) as lg:
        run_id = lg.submit(manifest(2), SUBMITTER).run_id
        before = lg.history(run_id)
        with caller_connection(dsn) as conn:
            _insert_order(conn, "o-1", run_id)
            joined = lg.using(conn)
            with pytest.raises(NotAuthorized):
                joined.start(run_id, WORKER)
            joined.start(run_id, CONTROLLER)
            conn.commit()
        assert _orders(dsn) == [("o-1", run_id)]
        assert [t.command for t in lg.history(run_id)] == [t.command for t in before] + ["start"]


def test_a_connection_without_a_transaction_is_refused(dsn: str) -> None:
    with Ledger.open(dsn) as lg:
        if dsn.startswith("sqlite"):
            conn: Any = sqlite3.connect(_sqlite_path(dsn), isolation_level=None)
        else:
            import psycopg

            conn = psycopg.connect(dsn, autocommit=True)
        try:
            with pytest.raises(InvalidInput, match="autocommit"):
                lg.using(conn).submit(manifest(1), SUBMITTER)
        finally:
            conn.close()
        assert lg.runs() == []


def test_a_connection_to_another_database_is_refused(tmp_path: Any) -> None:
    with Ledger.open(f"sqlite:///{tmp_path}/a.db") as lg:
        other = sqlite3.connect(str(tmp_path / "b.db"))
        try:
            with pytest.raises(InvalidInput, match="not to this ledger"):
                lg.using(other).submit(manifest(1), SUBMITTER)
        finally:
            other.close()


def test_a_keyed_command_in_the_callers_transaction_commits_its_key_with_it(dsn: str) -> None:
    with Ledger.open(dsn) as lg:
        with caller_connection(dsn) as conn:
            first = lg.using(conn).submit(manifest(1), SUBMITTER, idempotency_key="order-7")
            conn.rollback()  # the key goes with the run
        again = lg.submit(manifest(1), SUBMITTER, idempotency_key="order-7")
        assert again.run_id != first.run_id
        assert lg.submit(manifest(1), SUBMITTER, idempotency_key="order-7").run_id == again.run_id


@pytest.mark.postgres
def test_async_using_commits_and_rolls_back_with_the_callers_async_transaction(
    pg_dsn: str,
) -> None:
    import psycopg

    with caller_connection(pg_dsn):
        pass  # the orders table

    async def main() -> None:
        async with await AsyncLedger.open(pg_dsn) as lg:
            async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
                with pytest.raises(Boom):
                    async with aconn.transaction():
                        status = await lg.using(aconn).submit(manifest(2), SUBMITTER)
                        await aconn.execute(
                            "INSERT INTO orders VALUES (%s, %s)", ("o-1", status.run_id)
                        )
                        raise Boom
                assert await lg.runs() == []
                async with aconn.transaction():
                    status = await lg.using(aconn).submit(manifest(2), SUBMITTER)
                    await aconn.execute(
                        "INSERT INTO orders VALUES (%s, %s)", ("o-2", status.run_id)
                    )
                    # the caller's connection's own prepared statements go on working
                    for _ in range(7):
                        await aconn.execute("SELECT count(*) FROM orders", prepare=True)
                assert [r.run_id for r in await lg.runs()] == [status.run_id]
            assert (await lg.verify()).ok
        assert _orders(pg_dsn) == [("o-2", status.run_id)]

    asyncio.run(main())


def test_async_using_on_sqlite_joins_the_callers_sqlite3_transaction(tmp_path: Any) -> None:
    """AsyncLedger makes its sqlite3 calls on its database thread: the caller's connection
    must allow that (check_same_thread=False), or it is refused with the reason."""
    dsn = f"sqlite:///{tmp_path}/ledger.db"

    async def main() -> None:
        async with await AsyncLedger.open(dsn) as lg:
            with caller_connection(dsn) as conn:
                with pytest.raises(InvalidInput, match="check_same_thread=False"):
                    await lg.using(conn).submit(manifest(1), SUBMITTER)
                assert not conn.in_transaction
            with caller_connection(dsn, check_same_thread=False) as conn:
                status = await lg.using(conn).submit(manifest(1), SUBMITTER)
                _insert_order(conn, "o-1", status.run_id)
                conn.rollback()
            assert await lg.runs() == []
            with caller_connection(dsn, check_same_thread=False) as conn:
                status = await lg.using(conn).submit(manifest(1), SUBMITTER)
                _insert_order(conn, "o-1", status.run_id)
                conn.commit()
            assert [r.run_id for r in await lg.runs()] == [status.run_id]

    asyncio.run(main())


def test_async_using_on_sqlite_with_other_commands_waiting_does_not_deadlock(
    tmp_path: Any,
) -> None:
    """A caller's transaction holds the SQLite file's write lock across two commands
    while other tasks' commands wait for it: they wait on the loop, not on the ledger's
    database thread, so the caller's second command still runs and its commit lets them
    through (no busy timeout, no StoreUnavailable)."""
    dsn = f"sqlite:///{tmp_path}/ledger.db"

    async def main() -> None:
        async with await AsyncLedger.open(dsn) as lg:
            with caller_connection(dsn, check_same_thread=False) as conn:
                joined = lg.using(conn)
                first = await joined.submit(manifest(1), SUBMITTER)
                others = [asyncio.create_task(lg.submit(manifest(1), SUBMITTER)) for _ in range(5)]
                await asyncio.sleep(0.05)  # let them start waiting for the lock
                await joined.start(first.run_id, CONTROLLER)
                conn.commit()
            done = await asyncio.wait_for(asyncio.gather(*others), timeout=30)
            assert len(done) == 5
            assert len(await lg.runs()) == 6
            assert (await lg.status(first.run_id)).state == "running"

    asyncio.run(main())
