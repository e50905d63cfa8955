"""Schema v7 moves an open run's item counts off its row: a database written
before it (every run's counts in its lg_runs row, no lg_run_counts) upgrades to the same
statuses, verifies (its projections equal a rebuild from the events: rule 10), and its
runs go on to the end."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ledger import Ledger
from ledger.stores.base import SCHEMA_VERSION
from tests.support.old_transitions import transitions_as_table
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest


def some_runs(lg: Ledger) -> list[str]:
    """An open run with items in every state, a succeeded run, a canceled run."""
    open_run = lg.submit(manifest(8, max_attempts=3), SUBMITTER).run_id
    lg.start(open_run, CONTROLLER)
    a, b, c, d, _e = lg.claim(open_run, WORKER, limit=5)
    lg.accept(a)
    lg.accept(b)
    lg.fail_attempt(c, "boom")
    lg.reject(d, "bad_row")
    lg.amend(open_run, SUBMITTER, "two more", items=[{"item_id": "x1"}, {"item_id": "x2"}])
    lg.skip(open_run, "i7", OPERATOR, "not needed")

    done = lg.submit(manifest(3), SUBMITTER).run_id
    lg.start(done, CONTROLLER)
    for le in lg.claim(done, WORKER, limit=3):
        lg.accept(le)
    lg.complete(done, CONTROLLER)

    canceled = lg.submit(manifest(4), SUBMITTER).run_id
    lg.start(canceled, CONTROLLER)
    [live] = lg.claim(canceled, WORKER, limit=1)
    assert lg.cancel(canceled, SUBMITTER, reason="stop").state == "canceling"
    lg.accept(live)
    return [open_run, done, canceled]


def as_v6(execute: Callable[..., Any], statuses: dict[str, Any], mark: str) -> None:
    """Put the database in the shape schema v6 had: each run's counts in its row (and the
    hashes in their own table, as before v11, the transitions in theirs, as before v17, the
    open attempts as rows, as before v18)."""
    from tests.stores.test_attempts_migration import open_attempts_as_rows
    from tests.stores.test_hash_migration import hashes_as_v10

    dialect = "sqlite" if mark == "?" else "postgres"
    open_attempts_as_rows(execute)
    hashes_as_v10(execute, dialect)
    transitions_as_table(execute, dialect)  # v7 counts from them
    for run_id, status in statuses.items():
        execute(
            f"UPDATE lg_runs SET counts = {mark} WHERE run_id = {mark}",  # noqa: S608 (test's own SQL)
            (json.dumps(status.counts, sort_keys=True, separators=(",", ":")), run_id),
        )
    execute("DROP TABLE lg_run_counts")
    # and without what versions after it added that a second run would find already there
    execute("DROP TABLE lg_webhook_changes")
    for column in ("allow_http", "allow_host", "previous_secret", "previous_until", "updated_at"):
        execute(f"ALTER TABLE lg_webhooks DROP COLUMN {column}")
    execute("UPDATE ledger_meta SET value = '6' WHERE key = 'schema_version'")


def check_upgraded(dsn: str, runs: list[str], before: dict[str, Any]) -> None:
    with Ledger.open(dsn) as lg:
        for run_id in runs:
            now = lg.status(run_id)
            was = before[run_id]
            assert (now.state, now.revision, now.counts) == (was.state, was.revision, was.counts)
        report = lg.verify()
        assert report.ok, report.problems
        open_run = runs[0]
        while leases := lg.claim(open_run, WORKER, limit=10):
            for le in leases:
                lg.accept(le)
        for item in lg.items(open_run, state="in_progress"):
            assert item.lease is not None
        status = lg.status(open_run)
        # i4 still under the lease claimed before the upgrade (in progress), the rest final
        assert status.counts["in_progress"] == 1
        assert status.counts["accepted"] == 2 + 5  # i0, i1; then i2 (retried), i5, i6, x1, x2
        assert lg.verify().ok


def test_sqlite_v6_database_upgrades_to_the_same_counts(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    dsn = f"sqlite:///{db}"
    with Ledger.open(dsn) as lg:
        runs = some_runs(lg)
        before = {r: lg.status(r) for r in runs}
    conn = sqlite3.connect(db)
    try:
        as_v6(conn.execute, before, "?")
        conn.commit()
    finally:
        conn.close()
    check_upgraded(dsn, runs, before)
    conn = sqlite3.connect(db)
    try:
        [(version,)] = conn.execute(
            "SELECT value FROM ledger_meta WHERE key = 'schema_version'"
        ).fetchall()
    finally:
        conn.close()
    assert int(version) == SCHEMA_VERSION


@pytest.mark.postgres
def test_pg_v6_database_upgrades_to_the_same_counts(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg:
        runs = some_runs(lg)
        before = {r: lg.status(r) for r in runs}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        as_v6(conn.execute, before, "%s")
    check_upgraded(pg_dsn, runs, before)
