"""Schema v18 writes an attempt's row once, when the attempt ends; the open attempt is the
item row's lease, with `lg_items.lease_started_at`. A database written before it holds an
lg_attempts row for each open attempt (finished_at NULL): it upgrades to the same attempts
read the same way, verifies (its projections equal a rebuild from the events), and its
open attempts end with the rows they began with."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from ledger import Ledger
from tests.support.clock import ManualClock
from tests.support.runs import OPERATOR, WORKER, running

Execute = Callable[..., Any]


def open_attempts_as_rows(execute: Execute) -> None:
    """Put the attempts in the shape schema versions 1-17 had: an lg_attempts row for each
    open attempt (the claim wrote it), no lease_started_at on the item rows nor its index (for tests
    that write with this release and then make the database look older)."""
    execute(
        "INSERT INTO lg_attempts (run_id, item_id, attempt, worker_id, lease_token, started_at, "
        "expires_at) SELECT run_id, item_id, attempts, lease_worker, lease_token, "
        "lease_started_at, lease_expires_at FROM lg_items WHERE state = 'in_progress'"
    )
    execute("DROP INDEX IF EXISTS lg_items_leased")
    execute("ALTER TABLE lg_items DROP COLUMN lease_started_at")


def lease_started_column_added(execute: Execute) -> None:
    """The item rows' lease_started_at on a database opened at an older version, so that
    this release can write there (`open_attempts_as_rows` takes it away again)."""
    execute("ALTER TABLE lg_items ADD COLUMN lease_started_at TEXT")


@contextmanager
def raw(dsn: str) -> Iterator[Execute]:
    """The database's own connection, outside the ledger, committing each statement."""
    if dsn.startswith("sqlite:///"):
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"), isolation_level=None)
        try:
            yield lambda sql, params=(): conn.execute(sql, params).fetchall()
        finally:
            conn.close()
        return
    with psycopg.connect(dsn, autocommit=True) as pg:

        def execute(sql: str, params: Any = ()) -> Any:
            cur = pg.execute(sql.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else None

        yield execute


def open_rows(execute: Execute) -> int:
    [(n,)] = execute("SELECT COUNT(*) FROM lg_attempts WHERE finished_at IS NULL")
    return int(n)


def test_open_attempts_upgrade_to_the_item_rows(dsn: str) -> None:
    clock = ManualClock()
    with Ledger.open(dsn, clock=clock) as lg:
        run = running(lg, 4, max_attempts=3)
        first, second, third = lg.claim(run, WORKER, limit=3)
        lg.accept(first)
        lg.fail_attempt(second, "flaky")  # retried below: attempt 2 open
        clock.advance(20)
        lg.heartbeat(third)  # an open attempt whose expiry moved
        clock.advance(20)
        retried = lg.claim(run, WORKER, limit=2)
        fenced = running(lg, 2)
        [abandoned] = lg.claim(fenced, WORKER, limit=1)
        before = {r: lg.attempts(r) for r in (run, fenced)}
        assert [a.finished_at for a in before[fenced]] == [None]
        assert {(a.item_id, a.attempt) for a in before[run] if a.finished_at is None} == {
            ("i1", 2),
            ("i2", 1),
            ("i3", 1),
        }
    with raw(dsn) as execute:
        open_attempts_as_rows(execute)
        execute("UPDATE ledger_meta SET value = '17' WHERE key = 'schema_version'")
        assert open_rows(execute) == 4  # third, the retried item's second, i3, fenced i0
    with Ledger.open(dsn, clock=clock) as lg:
        with raw(dsn) as execute:
            assert open_rows(execute) == 0  # their attempts are the item rows' leases
        assert {r: lg.attempts(r) for r in (run, fenced)} == before
        assert lg.verify().ok  # the rows equal a rebuild's
        clock.advance(5)
        for lease in [third, *retried]:
            lg.accept(lease)
        lg.fail(fenced, OPERATOR, "stop", transient=True)  # fences the live lease: abandoned
        after = {r: lg.attempts(r) for r in (run, fenced)}
        for r, attempts in before.items():
            for was, now in zip(attempts, after[r], strict=True):
                assert (now.worker_id, now.lease_token, now.started_at, now.expires_at) == (
                    was.worker_id,
                    was.lease_token,
                    was.started_at,
                    was.expires_at,
                )
                assert now.finished_at is not None
        assert after[fenced][0].outcome == "abandoned"
        assert abandoned.token == after[fenced][0].lease_token
        assert lg.verify().ok
