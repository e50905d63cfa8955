"""Several processes open the same EMPTY database at the same moment: the schema is
created exactly once, nobody fails, and everyone ends up at the latest version.

Without serialisation this is a real race (concurrent `CREATE TABLE IF NOT EXISTS`
/ `CREATE TYPE` on PostgreSQL fail with unique violations on the catalogs); the
store takes a transaction-scoped advisory lock around its migrations.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ledger import Ledger
from ledger.stores.base import SCHEMA_VERSION
from ledger.stores.postgres import _SCHEMA_LOCK
from tests.stores.test_migrations import (
    empty_databases,
    pg_catalog,
    schema_version_pg,
    schema_version_sqlite,
    sqlite_catalog,
)

# Fresh processes (nothing inherited from pytest), forked from a server that has
# imported the ledger once, so starting six of them is cheap.
FRESH = multiprocessing.get_context("forkserver")
FRESH.set_forkserver_preload(
    ["ledger.stores.postgres", "ledger.stores.sqlite", "tests.stores.test_schema_race"]
)
OPENERS = 6
ROUNDS = 10
WAIT = 120.0  # a bound on waiting for a child or a lock, never a timing assertion


@pytest.fixture
def empty_pg(pg_server: Any) -> Iterator[Callable[[], str]]:
    """Makes EMPTY databases (no template schema): returns their DSNs; drops them after."""
    yield from empty_databases(pg_server)


def _opener(dsns: list[str], barrier: Any, out: Any) -> None:
    """Round after round: wait for every opener (and the parent), then all open at once."""
    # the store modules are imported already (preloaded), so the processes race on opening
    for r, dsn in enumerate(dsns):
        barrier.wait(WAIT)
        try:
            Ledger.open(dsn).close()
            out.put((r, None))
        except Exception:
            out.put((r, traceback.format_exc()))


def open_all_at_once(
    dsns: list[str], prepare: Callable[[int], None], check: Callable[[int], None]
) -> None:
    """OPENERS fresh processes open `dsns[r]` all at the same moment, round after round:
    `prepare(r)` empties the database before a round, `check(r)` inspects it after."""
    barrier = FRESH.Barrier(OPENERS + 1)
    out: Any = FRESH.Queue()
    procs = [
        FRESH.Process(target=_opener, args=(dsns, barrier, out), daemon=True)
        for _ in range(OPENERS)
    ]
    for p in procs:
        p.start()
    try:
        for r in range(len(dsns)):
            prepare(r)
            barrier.wait(WAIT)
            failures = []
            for _ in procs:
                try:
                    got, failure = out.get(timeout=WAIT)
                except queue.Empty:
                    raise AssertionError("an opener process did not report back") from None
                assert got == r
                if failure is not None:
                    failures.append(failure)
            assert failures == [], (
                f"round {r}: {len(failures)} of {OPENERS} opens failed:\n{failures[0]}"
            )
            check(r)
    finally:
        barrier.abort()  # children still waiting (after a failure) stop at once
        for p in procs:
            p.join(WAIT)
            if p.is_alive():
                p.kill()
                p.join(10)
        out.close()
        out.join_thread()


def creator_transactions(dsn: str) -> set[int]:
    """The transaction ids that created the schema's relations (pg_class.xmin)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT DISTINCT xmin::text::bigint FROM pg_class "
            "WHERE relnamespace = 'public'::regnamespace"
        ).fetchall()
    return {r[0] for r in rows}


@pytest.mark.postgres
def test_processes_opening_an_empty_pg_database_at_once(
    empty_pg: Callable[[], str], pg_dsn: str
) -> None:
    want = pg_catalog(pg_dsn)  # the fresh schema (the template's)
    dsn = empty_pg()  # a new database without the template's schema

    def empty_it(r: int) -> None:
        if r:  # later rounds: the same database, emptied again
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DROP SCHEMA public CASCADE")
                conn.execute("CREATE SCHEMA public")
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute(
                "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace"
            ).fetchone() == (0,)

    def check(r: int) -> None:
        assert schema_version_pg(dsn) == SCHEMA_VERSION
        assert pg_catalog(dsn) == want
        # one transaction created every table, index, type and sequence: exactly once
        assert len(creator_transactions(dsn)) == 1

    open_all_at_once([dsn] * ROUNDS, empty_it, check)


@pytest.mark.postgres
def test_the_advisory_lock_is_what_serialises_schema_creation(empty_pg: Callable[[], str]) -> None:
    """While another session holds the schema lock, an opener waits and creates nothing."""
    dsn = empty_pg()
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            Ledger.open(dsn).close()
        except BaseException as e:
            errors.append(e)

    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (_SCHEMA_LOCK,))
        opener = threading.Thread(target=open_it)
        opener.start()
        try:
            deadline = time.monotonic() + WAIT
            while not holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND objid = %s AND database = (SELECT oid FROM pg_database "
                "WHERE datname = current_database())",
                (_SCHEMA_LOCK,),
            ).fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the opener never waited for the schema lock"
                time.sleep(0.01)
            tables = holder.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
            ).fetchone()
            assert tables == (0,)  # it waits before creating anything
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (_SCHEMA_LOCK,))
            opener.join(WAIT)
    assert not opener.is_alive() and errors == []
    assert schema_version_pg(dsn) == SCHEMA_VERSION


def test_processes_opening_an_empty_sqlite_file_at_once(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    Ledger.open(f"sqlite:///{fresh}").close()
    want = sqlite_catalog(fresh)
    paths = [tmp_path / f"race{k}.db" for k in range(ROUNDS // 2)]

    def check(r: int) -> None:
        assert schema_version_sqlite(paths[r]) == SCHEMA_VERSION
        assert sqlite_catalog(paths[r]) == want

    open_all_at_once([f"sqlite:///{p}" for p in paths], lambda r: None, check)
