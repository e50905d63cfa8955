"""Fencing: a worker whose lease is gone (expired, expired and re-claimed, fenced by a
failed run) gets `LeaseLost` for every write and writes nothing.

The worker "pauses" (a GC pause, a network stall) by the test moving the injected
clock past its lease; no test sleeps.
"""

from __future__ import annotations

import pytest

from ledger import Actor, Lease, LeaseLost, Ledger
from ledger.service.ledger import Outcome
from tests.support.clock import ManualClock
from tests.support.drive import event_count
from tests.support.runs import CONTROLLER, OPERATOR, RECONCILER, running

WORKER_A = Actor("worker-a", "worker")
WORKER_B = Actor("worker-b", "worker")


WRITES = [
    ("heartbeat", lambda lg, lease: lg.heartbeat(lease)),
    ("accept", lambda lg, lease: lg.accept(lease, evidence={"receipt": "r"})),
    ("reject", lambda lg, lease: lg.reject(lease, "rule-x", detail="late")),
    ("fail_attempt", lambda lg, lease: lg.fail_attempt(lease, "boom")),
    ("fail_attempt_final", lambda lg, lease: lg.fail_attempt(lease, "boom", retryable=False)),
]


def assert_fenced(lg: Ledger, lease: Lease) -> None:
    """Every write with `lease` raises LeaseLost and leaves the event log unchanged."""
    before = event_count(lg)
    item_before = lg.item(lease.run_id, lease.item_id)
    for name, write in WRITES:
        with pytest.raises(LeaseLost) as err:
            write(lg, lease)
        assert lease.item_id in str(err.value), name
        assert event_count(lg) == before, f"{name} wrote an event with a lost lease"
    # the batched path reports the loss instead of raising, and writes nothing either
    (result,) = lg.record([Outcome(lease, "accept")])
    assert isinstance(result, LeaseLost)
    assert event_count(lg) == before
    assert lg.item(lease.run_id, lease.item_id) == item_before


def test_paused_worker_cannot_write_after_its_lease_expired(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 1, lease_seconds=30)
    (lease,) = lg.claim(run_id, WORKER_A)
    clock.advance(30.001)  # the worker stalls just past its lease; nobody reconciled yet
    assert lg.item(run_id, "i0").state == "in_progress"
    assert_fenced(lg, lease)
    # the reconciler later expires it as lease_expired; the stale worker never wrote
    assert lg.reconcile().expired_leases == 1
    (attempt,) = lg.attempts(run_id, "i0")
    assert attempt.outcome == "lease_expired" and attempt.lease_token == lease.token


def test_lease_is_live_up_to_its_expiry_and_heartbeats_extend_it(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 2, lease_seconds=30)
    first, second = lg.claim(run_id, WORKER_A, limit=2)
    clock.advance(20)
    second = lg.heartbeat(second)  # expires 30 s from now
    clock.advance(10)  # exactly first's expiry: still live, and the reconciler agrees
    assert lg.reconcile().expired_leases == 0
    assert lg.accept(first).state == "accepted"
    clock.advance(19)
    assert lg.accept(second).state == "accepted"


def test_stale_worker_cannot_write_after_the_item_was_reclaimed(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, lease_seconds=10, max_attempts=5)
    (stale,) = lg.claim(run_id, WORKER_A)
    clock.advance(11)
    assert lg.reconcile().expired_leases == 1
    (fresh,) = lg.claim(run_id, WORKER_B)
    assert fresh.item_id == stale.item_id and fresh.attempt == 2 and fresh.token != stale.token

    assert_fenced(lg, stale)
    item = lg.item(run_id, "i0")
    assert (
        item.state == "in_progress" and item.lease is not None and item.lease.token == fresh.token
    )

    # the new holder is unaffected by the stale worker's attempts
    assert lg.heartbeat(fresh).token == fresh.token
    assert lg.accept(fresh, evidence={"by": "b"}).state == "accepted"
    assert [(a.attempt, a.worker_id, a.outcome) for a in lg.attempts(run_id, "i0")] == [
        (1, "worker-a", "lease_expired"),
        (2, "worker-b", "accepted"),
    ]
    # and after the item is final the stale lease is still dead
    assert_fenced(lg, stale)


def test_stale_lease_is_not_revived_by_a_token_for_an_older_attempt(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, lease_seconds=10, max_attempts=5)
    (a1,) = lg.claim(run_id, WORKER_A)
    clock.advance(11)
    lg.reconcile()
    (b2,) = lg.claim(run_id, WORKER_B)
    # a lease forged from the old one but claiming the new attempt number
    forged = Lease(a1.run_id, a1.item_id, a1.token, a1.worker_id, b2.attempt, b2.expires_at)
    assert_fenced(lg, forged)
    # and the new token presented by the other worker id is checked by token, not by id
    assert lg.accept(b2).state == "accepted"


def test_expired_lease_cannot_write_even_if_not_yet_reclaimed_while_run_is_canceling(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 2, lease_seconds=10)
    (lease, other) = lg.claim(run_id, WORKER_A, limit=2)
    assert lg.cancel(run_id, OPERATOR, "stop").state == "canceling"
    lg.accept(other)  # in-flight outcomes before expiry are kept
    clock.advance(11)
    assert_fenced(lg, lease)
    report = lg.reconcile()
    assert report.expired_leases == 1 and report.finished_cancels == 1
    assert lg.status(run_id).state == "canceled"
    assert {i.item_id: i.state for i in lg.items(run_id)} == {"i0": "skipped", "i1": "accepted"}


def test_failed_run_fences_live_leases(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 1, lease_seconds=60)
    (lease,) = lg.claim(run_id, WORKER_A)
    lg.fail(
        run_id, CONTROLLER, "source vanished", transient=True, failure_reason="input_unavailable"
    )
    (attempt,) = lg.attempts(run_id, "i0")
    assert attempt.outcome == "abandoned"
    before = event_count(lg)
    for _name, write in WRITES:
        with pytest.raises(LeaseLost):
            write(lg, lease)
    assert event_count(lg) == before


def test_reconciler_with_a_late_clock_does_not_expire_a_live_lease(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, lease_seconds=30)
    (lease,) = lg.claim(run_id, WORKER_A)
    # a reconciler passing an explicit time before expiry changes nothing
    assert lg.reconcile(now=clock()).expired_leases == 0  # (a later one is refused: rule 14)
    clock.advance(29)
    assert lg.accept(lease).state == "accepted"
    clock.advance(3600)
    before = event_count(lg)
    assert lg.reconcile(actor=RECONCILER).expired_leases == 0
    assert event_count(lg) == before


def test_each_lease_of_a_claim_has_its_own_unguessable_token(lg: Ledger) -> None:
    """A token is the item's fence: 128 random bits, never shared within a batch or
    reused by the next attempt, so a stale worker cannot present another's."""
    run_id = running(lg, n=20, backoff_seconds=0)
    first = lg.claim(run_id, WORKER_A, limit=20)
    tokens = [lease.token for lease in first]
    assert len(first) == 20 and len(set(tokens)) == 20
    assert all(len(t) == 32 and int(t, 16) >= 0 for t in tokens)
    lg.record([Outcome(lease, "fail", error="again") for lease in first])
    again = lg.claim(run_id, WORKER_B, limit=20)
    assert not set(tokens) & {lease.token for lease in again}
