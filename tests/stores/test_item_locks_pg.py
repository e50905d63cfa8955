"""PostgreSQL: item commands of one run do not wait for each other.

Claims and outcomes hold the run's row FOR SHARE while it is running, so workers of one
run write side by side; run commands (cancel, pause, complete, amend, ...) hold it FOR
UPDATE, so a claim still never commits after a committed cancel or pause (rule 6) and a
pausing or canceling run still ends in the transaction that ends its last live lease.
Claims pass over items another claim holds (rule 3: never two live leases on one item).
Item commands never move the run's revision, so compare-and-set on runs keeps working
(rule 2). The tests hold one command inside its transaction (the run loaded and locked)
and watch the others in pg_stat_activity; no timing assertions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from ledger import Ledger
from ledger.core.views import Actor
from ledger.service.ledger import Outcome
from tests.support.hold import STOPS, WAIT, HeldInTransaction, lock_waiters
from tests.support.runs import OPERATOR, SUBMITTER, WORKER, running
from tests.support.waiting import start_thread, wait_until

pytestmark = pytest.mark.postgres

OTHER = Actor("w2", "worker")


def test_item_commands_of_one_run_go_on_while_a_claim_holds_the_run(
    pg_dsn: str, hold: Callable[[], HeldInTransaction]
) -> None:
    with Ledger.open(pg_dsn) as held_lg, Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 10)
        [first, second, third] = lg.claim(run_id, OTHER, limit=3)
        before = lg.status(run_id).revision

        held = hold()
        held.start(lambda: held_lg.claim(run_id, WORKER, limit=3))  # inside, run locked
        # while that claim holds the run, the other worker claims, accepts, heartbeats,
        # fails and records: each returns (none waits for the held transaction)
        more = lg.claim(run_id, OTHER, limit=2)
        assert len(more) == 2
        assert lg.accept(first).state == "accepted"
        lg.heartbeat(second)
        assert lg.fail_attempt(third, "flaky").state == "retryable"
        [done, _] = lg.record([Outcome(lease, "accept") for lease in (second, more[0])])
        assert not isinstance(done, Exception), done
        assert lock_waiters(pg_dsn) == 0

        leases = held.release()
        assert not isinstance(leases, Exception), leases
        assert len(leases) == 3
        taken = {le.item_id for le in (first, second, third, *more)}
        # it leased none of the items the other worker held or had finished
        assert not {le.item_id for le in leases} & (taken - {third.item_id})
        status = lg.status(run_id)
        assert status.revision == before  # item commands leave the run's revision alone
        assert status.counts["accepted"] == 3
        assert status.counts["in_progress"] == 4  # more[1] and the held claim's three
        assert sum(status.counts.values()) == 10
        assert lg.verify().ok


def test_a_claim_passes_over_items_another_transaction_holds(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 6)
        with psycopg.connect(pg_dsn) as conn:
            # another claim in flight holds i0 and i1 (locked, not yet committed)
            conn.execute(
                "SELECT item_id FROM lg_items WHERE run_id = %s AND item_id IN ('i0', 'i1') "
                "FOR UPDATE",
                (run_id,),
            )
            leases = lg.claim(run_id, WORKER, limit=3)  # returns: it does not wait for them
            assert [le.item_id for le in leases] == ["i2", "i3", "i4"]
            conn.rollback()
        assert [le.item_id for le in lg.claim(run_id, WORKER, limit=3)] == ["i0", "i1", "i5"]


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "idempotency_key"])
@pytest.mark.parametrize("stop", sorted(STOPS))
def test_the_last_lease_ending_behind_a_stop_ends_the_run_in_its_transaction(
    stop: str, keyed: bool, pg_dsn: str, hold: Callable[[], HeldInTransaction]
) -> None:
    command, draining = STOPS[stop]
    finished = {"cancel": ("cancel_finished", "canceled"), "pause": ("pause_finished", "paused")}
    with Ledger.open(pg_dsn) as stopper, Ledger.open(pg_dsn) as worker:
        run_id = running(worker, 3)
        [lease] = worker.claim(run_id, WORKER, limit=1)
        held = hold()
        held.start(lambda: command(stopper, run_id))  # the stop has the run, not committed

        accepted: list[Any] = []
        key = {"idempotency_key": f"accept-{stop}"} if keyed else {}
        t = start_thread(lambda: worker.accept(lease, **key), accepted)
        wait_until(lambda: lock_waiters(pg_dsn), "the accept to wait for the stop's row lock")
        assert accepted == []

        result = held.release()
        t.join(WAIT)
        assert not isinstance(result, Exception), result
        assert result.state == draining  # it saw the live lease
        [item] = accepted
        assert not isinstance(item, Exception), item
        assert item.state == "accepted"

        status = worker.status(run_id)
        end_command, end_state = finished[stop]
        assert status.state == end_state
        assert status.counts["in_progress"] == 0 and status.counts["accepted"] == 1
        history = worker.history(run_id)
        [accept_at] = [t.position for t in history if t.command == "accept"]
        [end_at] = [t.position for t in history if t.command == end_command]
        # the run ended in the accept's transaction: nothing lies between them
        assert [t.command for t in history if accept_at <= t.position <= end_at] == [
            "accept",
            end_command,
        ]
        assert worker.verify().ok


def test_compare_and_set_on_the_run_survives_workers(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 4)
        read = lg.status(run_id).revision
        for le in lg.claim(run_id, WORKER, limit=4):
            lg.accept(le)
        # the operator's pause with the revision read before the workers' commands applies
        assert lg.pause(run_id, OPERATOR, expected_revision=read, reason="hold").state == "paused"
        assert lg.status(run_id).revision == read + 1


def test_every_count_of_an_open_run_equals_its_items(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 30, max_attempts=2)
        for k, le in enumerate(lg.claim(run_id, WORKER, limit=20)):
            if k % 3 == 0:
                lg.accept(le)
            elif k % 3 == 1:
                lg.fail_attempt(le, "boom")
        lg.amend(run_id, SUBMITTER, "one more", items=[{"item_id": "extra"}])
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(
                "SELECT state, count(*) FROM lg_items WHERE run_id = %s GROUP BY state",
                (run_id,),
            ).fetchall()
        want = {state: n for state, n in rows}
        got = {s: n for s, n in lg.status(run_id).counts.items() if n}
        assert got == want
