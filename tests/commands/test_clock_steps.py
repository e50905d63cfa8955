"""A backward step of the store's clock (an NTP step, a restored VM) freezes no work: an
item scheduled or leased by the clock as it read before the step is claimable (or its
lease ends at the next reconcile pass) by the clock as it reads after it, the claim or
expiry records the step, and the status says workers only while a worker can claim."""

from __future__ import annotations

from datetime import timedelta

from ledger import Ledger
from ledger.core import states as S
from tests.support.clock import ManualClock
from tests.support.runs import WORKER, running

HOUR = 3600


def _claim_evidence(lg: Ledger, run_id: str) -> dict[str, object]:
    claims = [t for t in lg.history(run_id) if t.command == "claim"]
    return claims[-1].evidence


def test_a_failed_item_stays_claimable_after_the_clock_steps_back(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, backoff_seconds=30)
    (lease,) = lg.claim(run_id, WORKER)
    lg.fail_attempt(lease, "flaky upstream")
    clock.advance(-HOUR)  # before the failure was recorded
    status = lg.status(run_id)
    assert status.counts[S.RETRYABLE] == 1
    assert status.waiting_on == "workers"
    # what the status says is true: a worker can claim it now, not in an hour
    (again,) = lg.claim(run_id, WORKER)
    assert again.attempt == 2
    assert again.expires_at == clock() + timedelta(seconds=60)  # a lease on today's clock
    step = _claim_evidence(lg, run_id)["clock_stepped_back"]
    assert isinstance(step, dict) and step["clock"] < step["scheduled"]


def test_backoff_after_the_step_is_kept_by_the_clock_as_it_reads(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, backoff_seconds=30)
    (lease,) = lg.claim(run_id, WORKER)
    clock.advance(-HOUR)
    lg.fail_attempt(lease, "flaky upstream")  # the failure comes after the step
    assert lg.claim(run_id, WORKER) == []  # its backoff holds...
    clock.advance(30)
    assert [x.attempt for x in lg.claim(run_id, WORKER)] == [2]  # ...30 s, not an hour


def test_an_expired_lease_reconciled_before_the_step_leaves_its_item_claimable(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, lease_seconds=10)
    lg.claim(run_id, WORKER)  # the worker dies
    clock.advance(11)
    assert lg.reconcile().expired_leases == 1
    clock.advance(-HOUR)
    assert lg.status(run_id).waiting_on == "workers"
    assert [x.attempt for x in lg.claim(run_id, WORKER)] == [2]


def test_a_lease_granted_before_the_step_ends_at_the_next_reconcile(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, lease_seconds=10)
    lg.claim(run_id, WORKER)  # the worker dies
    clock.advance(5)
    clock.advance(-HOUR)  # its lease would look live for an hour more
    report = lg.reconcile()
    assert report.expired_leases == 1
    expire = [t for t in lg.history(run_id) if t.command == "expire"][-1]
    assert "clock_stepped_back" in expire.evidence
    assert lg.status(run_id).waiting_on == "workers"
    assert [x.attempt for x in lg.claim(run_id, WORKER)] == [2]


def test_a_lease_granted_after_the_step_lives_its_lease_seconds_on_the_new_clock(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 2, lease_seconds=10)
    first, _ = lg.claim(run_id, WORKER, limit=2)
    lg.fail_attempt(first, "retry me")
    clock.advance(-HOUR)
    (lease,) = lg.claim(run_id, WORKER)  # the item's stream stays at its later time
    assert lease.expires_at == clock() + timedelta(seconds=10)
    assert lg.reconcile().expired_leases == 1  # the other one, granted before the step
    clock.advance(9)
    assert lg.heartbeat(lease).expires_at == clock() + timedelta(seconds=10)
    assert lg.reconcile().expired_leases == 0  # a holder that beats keeps its lease
    clock.advance(11)
    assert lg.reconcile().expired_leases == 1  # and one that stops loses it 10 s on
