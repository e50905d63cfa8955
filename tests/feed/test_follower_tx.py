"""The transaction an in-database follower's handler runs in: what the handler
may do with `tx`, on every store, and on PostgreSQL how few round trips a batch costs.

A batch is `store.write()`: on PostgreSQL a pipelined transaction whose BEGIN is not
waited for and whose COMMIT goes with the last statements (ledger/stores/postgres.py
`_pipelined_transaction`). So a statement the handler queued and never read fails only
at the end: the batch must still be rolled back whole, the checkpoint not moved, and the
connection given back clean.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg._pipeline_base import BasePipeline

from ledger import Ledger, Transition
from ledger.feed.follower import Follower
from tests.support.runs import finished_run


def _table(lg: Ledger) -> None:
    with lg.store.write() as tx:
        tx.execute("CREATE TABLE seen (position BIGINT PRIMARY KEY)")


def _rows(lg: Ledger) -> list[int]:
    with lg.store.read() as tx:
        return [int(r["position"]) for r in tx.fetchall("SELECT position FROM seen ORDER BY 1")]


def test_a_handler_reads_its_own_writes_and_its_results(lg: Ledger) -> None:
    _table(lg)
    finished_run(lg)
    counts: list[int] = []

    def project(batch: list[Transition], tx: Any) -> None:
        tx.executemany("INSERT INTO seen (position) VALUES (?)", [(t.position,) for t in batch])
        row = tx.fetchone("SELECT COUNT(*) AS n FROM seen")
        assert row is not None
        counts.append(int(row["n"]))

    with Follower(lg, "reads", project, batch=2) as f:
        f.catch_up()
    every = [t.position for t in lg.events()]
    assert counts == [min(2 * k, len(every)) for k in range(1, len(counts) + 1)]
    assert _rows(lg) == every


def test_a_write_failing_only_at_commit_rolls_the_batch_back(lg: Ledger) -> None:
    """The handler's last statement is queued, never read: on PostgreSQL its error comes
    with the COMMIT's answer. The batch is undone, the checkpoint stays, and the next
    batch (and every command) runs on a clean connection."""
    _table(lg)
    finished_run(lg)
    every = [t.position for t in lg.events()]
    with lg.store.write() as tx:
        tx.execute("INSERT INTO seen (position) VALUES (?)", (every[3],))  # in the way

    def clash(batch: list[Transition], tx: Any) -> None:
        tx.executemany("INSERT INTO seen (position) VALUES (?)", [(t.position,) for t in batch])

    with Follower(lg, "clash", clash, batch=2) as f:
        assert f.run_once() == 2
        with pytest.raises(Exception, match=r"(?i)unique"):
            f.run_once()  # the second batch holds every[3]
        assert f.position == every[1]
        assert _rows(lg) == [every[0], every[1], every[3]]
        with lg.store.write() as tx:
            tx.execute("DELETE FROM seen WHERE position = ?", (every[3],))
        for _ in range(4):  # every pooled connection is usable, none left in a transaction
            finished_run(lg, 1)
        f.catch_up()
    assert _rows(lg) == [t.position for t in lg.events()]


@pytest.fixture
def pg_lg(pg_dsn: str) -> Iterator[Ledger]:
    with Ledger.open(pg_dsn) as lg:
        yield lg


@pytest.mark.postgres
def test_a_handler_on_postgresql_has_savepoints_and_cannot_commit_early(pg_lg: Ledger) -> None:
    lg = pg_lg
    _table(lg)
    finished_run(lg)
    every = [t.position for t in lg.events()]

    def with_savepoint(batch: list[Transition], tx: Any) -> None:
        for t in batch:
            tx.execute("INSERT INTO seen (position) VALUES (?)", (t.position,))
        with pytest.raises(psycopg.errors.UniqueViolation), tx.conn.transaction():
            tx.conn.execute("INSERT INTO seen (position) VALUES (%s)", (batch[0].position,))
        # the savepoint undid only its own statement: the batch goes on and commits

    def early_commit(batch: list[Transition], tx: Any) -> None:
        tx.execute("INSERT INTO seen (position) VALUES (?)", (batch[0].position,))
        tx.conn.commit()  # would commit the rows without the checkpoint: refused

    with Follower(lg, "savepoints", with_savepoint, batch=2) as f:
        assert f.run_once() == 2
        assert _rows(lg) == every[:2]
        f.handler = early_commit
        with pytest.raises(Exception, match="commit"):
            f.run_once()
        assert f.position == every[1]
        assert _rows(lg) == every[:2]
    for _ in range(4):  # every pooled connection is back, usable
        with lg.store.write() as tx:
            assert tx.conn.autocommit  # as the pool makes them: BEGIN is the block's own
            assert tx.fetchall("SELECT COUNT(*) AS n FROM seen") == [{"n": 2}]


@pytest.mark.postgres
def test_a_handler_may_choose_a_commit_that_does_not_wait_for_the_disk(pg_lg: Ledger) -> None:
    """The README's opt-in for a rebuildable projection: the batch still commits with its
    checkpoint, only without waiting for the flush."""
    lg = pg_lg
    _table(lg)
    finished_run(lg)
    settings: list[str] = []
    setting = "SELECT current_setting('synchronous_commit') AS s"
    with lg.store.write() as tx:
        server_default = tx.fetchone(setting)  # "off" on the test suite's own servers

    def project(batch: list[Transition], tx: Any) -> None:
        tx.execute("SET LOCAL synchronous_commit = off")
        tx.executemany("INSERT INTO seen (position) VALUES (?)", [(t.position,) for t in batch])
        row = tx.fetchone(setting)
        assert row is not None
        settings.append(row["s"])

    with Follower(lg, "relaxed", project, batch=2) as f:
        f.catch_up()
        assert f.position == lg.events()[-1].position
    assert set(settings) == {"off"}
    assert _rows(lg) == [t.position for t in lg.events()]
    for _ in range(4):  # SET LOCAL ended with each batch's transaction
        with lg.store.write() as tx:
            assert tx.fetchone(setting) == server_default


class _Syncs:
    """Counts the pipeline syncs psycopg sends: one round trip each."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        enqueue = BasePipeline._enqueue_sync

        def counted(pipeline: BasePipeline) -> None:
            self.n += 1
            enqueue(pipeline)

        monkeypatch.setattr(BasePipeline, "_enqueue_sync", counted)


@pytest.mark.postgres
def test_an_in_database_batch_costs_two_round_trips(
    pg_lg: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN goes with the checkpoint's and the page's read, the checkpoint's write with
    the COMMIT (bench case 10: psycopg's transaction block took five)."""
    lg = pg_lg
    _table(lg)
    finished_run(lg)

    def project(batch: list[Transition], tx: Any) -> None:
        tx.executemany("INSERT INTO seen (position) VALUES (?)", [(t.position,) for t in batch])

    with Follower(lg, "trips", project, batch=2) as f:
        f.run_once()  # the lock, the checkpoint row, the first batch
        syncs = _Syncs(monkeypatch)
        assert f.run_once() == 2
        assert syncs.n == 2
        syncs.n = 0
        with lg.store.write() as tx:  # a write that reads nothing: one round trip
            tx.execute("INSERT INTO seen (position) VALUES (?)", (-1,))
        assert syncs.n == 1
