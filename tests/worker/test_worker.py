"""The Worker helper against the real Ledger: outcomes, heartbeats, cancel, pause, lost leases."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ledger import Accepted, Actor, Lease, Ledger, Quarantine, Rejected, Worker
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, items_from_one, running

WAIT = 10.0  # seconds; a bound on waiting for another thread, never a timing assertion


def states(lg: Ledger, run_id: str) -> dict[str, str]:
    return {item.item_id: item.state for item in lg.items(run_id)}


def test_outcomes_are_recorded(lg: Ledger) -> None:
    run_id = running(lg, 5, max_attempts=3, manifest_of=items_from_one)
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def handle(lease: Lease) -> Accepted | Rejected | Quarantine:
        with lock:
            calls[lease.item_id] = calls.get(lease.item_id, 0) + 1
            n = calls[lease.item_id]
        if lease.item_id == "i1":
            return Accepted(evidence={"receipt": "r-1"}, stage="delivered")
        if lease.item_id == "i2":
            return Rejected("amount_positive", detail="amount is -3", stage="validate")
        if lease.item_id == "i3":
            return Quarantine("checksum mismatch", stage="parse")
        if lease.item_id == "i4" and n == 1:
            raise ConnectionError("upstream reset the connection")
        if lease.item_id == "i5":
            raise ValueError("always broken")
        return Accepted()

    summary = Worker(lg, run_id, handle, worker_id="w-test", concurrency=2).run()

    assert states(lg, run_id) == {
        "i1": "accepted",
        "i2": "rejected",
        "i3": "quarantined",
        "i4": "accepted",
        "i5": "quarantined",
    }
    assert calls == {"i1": 1, "i2": 1, "i3": 1, "i4": 2, "i5": 3}
    assert (summary.claimed, summary.accepted, summary.rejected) == (8, 2, 1)
    # i4 failed once, i5 twice (retryable), then i5's third failure quarantined it
    assert (summary.retryable, summary.quarantined, summary.lease_lost) == (3, 2, 0)
    assert summary.stopped == "nothing left to claim"
    attempts = lg.attempts(run_id, item_id="i4")
    assert [a.outcome for a in attempts] == ["failed", "accepted"]
    assert attempts[0].error is not None and "ConnectionError" in attempts[0].error
    assert attempts[0].worker_id == "w-test"
    assert [a.outcome for a in lg.attempts(run_id, item_id="i3")] == ["failed"]
    assert lg.attempts(run_id, item_id="i1")[0].stage == "delivered"


def test_a_handler_returning_nothing_is_a_failed_attempt_not_a_success(lg: Ledger) -> None:
    run_id = running(lg, 1, max_attempts=1, manifest_of=items_from_one)
    summary = Worker(lg, run_id, lambda lease: None, concurrency=1).run()  # type: ignore[arg-type,return-value]
    assert states(lg, run_id) == {"i1": "quarantined"}
    assert summary.accepted == 0 and summary.quarantined == 1
    error = lg.attempts(run_id)[0].error
    assert error is not None and "expected Accepted" in error


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    give_up = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > give_up:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


def test_heartbeats_extend_the_lease(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 1, lease_seconds=30, manifest_of=items_from_one)
    first_expiry: list[datetime] = []

    def handle(lease: Lease) -> Accepted:
        first_expiry.append(lease.expires_at)
        clock.advance(20)  # two thirds of the lease: a heartbeat is due
        wait_for(lambda: _lease_expiry(lg, run_id) > lease.expires_at, "a heartbeat")
        clock.advance(20)  # 40 s after the claim: the first lease would have expired
        return Accepted(evidence={"ok": True})

    summary = Worker(lg, run_id, handle, concurrency=1, heartbeat_every=0.01).run()

    assert summary.heartbeats >= 1
    assert summary.lease_lost == 0
    assert states(lg, run_id) == {"i1": "accepted"}
    assert clock() > first_expiry[0]


def _lease_expiry(lg: Ledger, run_id: str) -> datetime:
    (item,) = lg.items(run_id)
    assert item.lease is not None
    return item.lease.expires_at


def test_without_heartbeats_an_expired_lease_is_lost_and_nothing_is_written(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, lease_seconds=30, manifest_of=items_from_one)

    def handle(lease: Lease) -> Accepted:
        clock.advance(40)  # past the lease; the worker never heartbeats (interval 1 h)
        return Accepted()

    summary = Worker(
        lg, run_id, handle, worker_id="w1", concurrency=1, heartbeat_every=3600, max_idle=0
    ).run()

    assert summary.lease_lost == 1
    assert summary.accepted == summary.retryable == summary.quarantined == 0
    (item,) = lg.items(run_id)
    assert item.state == "in_progress"  # the record lags reality; the reconciler expires it
    assert [a.outcome for a in lg.attempts(run_id)] == [None]
    lg.reconcile()
    assert [a.outcome for a in lg.attempts(run_id)] == ["lease_expired"]


def test_a_fenced_lease_stops_the_worker_writing(lg: Ledger) -> None:
    run_id = running(lg, 3, manifest_of=items_from_one)

    def handle(lease: Lease) -> Accepted:
        lg.fail(
            run_id,
            CONTROLLER,
            "source export vanished",
            transient=True,
            failure_reason="input_unavailable",
        )
        return Accepted()

    summary = Worker(lg, run_id, handle, worker_id="w1", concurrency=1).run()

    assert summary.claimed == 1 and summary.lease_lost == 1 and summary.accepted == 0
    assert summary.run_state == "failed"
    assert [a.outcome for a in lg.attempts(run_id)] == ["abandoned"]
    # the worker's only write was its claim
    assert [t.to_state for t in lg.audit(run_id=run_id) if t.actor_id == "w1"] == ["in_progress"]


def test_cancel_stops_claiming_and_keeps_the_in_flight_outcome(lg: Ledger) -> None:
    run_id = running(lg, 5, manifest_of=items_from_one)
    handled: list[str] = []

    def handle(lease: Lease) -> Accepted:
        handled.append(lease.item_id)
        outcome = lg.cancel(run_id, OPERATOR, "customer withdrew")
        assert outcome.state == "canceling" and outcome.in_flight == 1
        return Accepted(evidence={"sent": True})

    summary = Worker(lg, run_id, handle, concurrency=1).run()

    assert len(handled) == 1
    assert summary.claimed == 1 and summary.accepted == 1
    assert summary.stopped == "run is canceled"  # the in-flight outcome ended the cancel
    status = lg.status(run_id)
    assert status.state == "canceled"
    assert status.counts.get("accepted") == 1 and status.counts.get("skipped") == 4


def test_pause_stops_claiming(lg: Ledger) -> None:
    run_id = running(lg, 4, manifest_of=items_from_one)
    paused = threading.Event()

    def handle(lease: Lease) -> Accepted:
        if lease.item_id == "i1":
            lg.pause(run_id, OPERATOR, "maintenance window")
            paused.set()
        else:  # i2 finishes only after the pause, so no slot frees up before it
            assert paused.wait(WAIT)
        return Accepted()

    summary = Worker(lg, run_id, handle, concurrency=2).run()

    assert summary.claimed == 2 and summary.accepted == 2
    # pausing when the claim saw i2 still in flight, paused when both had finished
    assert summary.stopped in ("run is pausing", "run is paused")
    status = lg.status(run_id)
    assert status.state == "paused"
    assert status.counts.get("pending") == 2


def test_worker_on_a_run_that_is_not_running_returns_at_once(lg: Ledger) -> None:
    run_id = lg.submit(
        {"source_version": "s", "config_version": "c", "items": [{"item_id": "a"}]}, SUBMITTER
    ).run_id
    calls: list[Lease] = []

    def handle(lease: Lease) -> Accepted:
        calls.append(lease)
        return Accepted()

    summary = Worker(lg, run_id, handle).run()
    assert calls == [] and summary.claimed == 0
    assert summary.stopped == "run is queued" and summary.run_state == "queued"


def test_concurrency_bounds_the_leases_held(lg: Ledger) -> None:
    run_id = running(lg, 9, manifest_of=items_from_one)
    live = 0
    peak = 0
    lock = threading.Lock()
    release = threading.Event()

    def handle(lease: Lease) -> Accepted:
        nonlocal live, peak
        with lock:
            live += 1
            peak = max(peak, live)
            if peak == 3:
                release.set()
        release.wait(WAIT)
        with lock:
            live -= 1
        return Accepted()

    summary = Worker(lg, run_id, handle, concurrency=3).run()
    assert peak == 3
    assert summary.accepted == 9
    assert lg.status(run_id).counts.get("accepted") == 9


def test_with_every_thread_busy_the_worker_tops_up_its_prefetch_in_large_claims(lg: Ledger) -> None:
    run_id = running(lg, 60, manifest_of=items_from_one)
    worker: Worker
    claims: list[tuple[int, int]] = []  # (leases held when claiming, limit asked)
    real_claim = lg.claim

    def claim(run: str, actor: Actor, limit: int = 1, **kw: Any) -> list[Lease]:
        claims.append((len(worker._in_flight), limit))
        return real_claim(run, actor, limit=limit, **kw)

    lg.claim = claim  # type: ignore[method-assign]
    worker = Worker(lg, run_id, lambda lease: Accepted(), concurrency=2, prefetch=10)
    summary = worker.run()
    assert summary.accepted == 60 and lg.status(run_id).counts.get("accepted") == 60
    assert claims[0] == (0, 10)
    # a claim either keeps a thread from idling or refills at least half the queue (4 of 8)
    assert all(held < 2 or limit >= 4 for held, limit in claims), claims
    assert all(held + limit <= 10 for held, limit in claims)


def test_a_lease_taken_over_is_lost_and_the_worker_writes_nothing(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, lease_seconds=30, manifest_of=items_from_one)
    other = Actor("w2", "worker")

    def handle(lease: Lease) -> Accepted:
        clock.advance(31)  # the lease expires while this handler is slow
        lg.reconcile()  # the reconciler expires it: the item is retryable again
        (taken,) = lg.claim(run_id, other)  # and another worker takes it over
        assert taken.token != lease.token
        return Accepted(evidence={"late": True})

    summary = Worker(
        lg, run_id, handle, worker_id="w1", concurrency=1, heartbeat_every=3600, max_idle=0
    ).run()

    assert summary.lease_lost == 1
    assert summary.accepted == summary.retryable == summary.quarantined == 0
    (item,) = lg.items(run_id)
    assert item.state == "in_progress" and item.lease is not None
    assert item.lease.worker_id == "w2"
    assert [(a.worker_id, a.outcome) for a in lg.attempts(run_id)] == [
        ("w1", "lease_expired"),
        ("w2", None),
    ]


def test_the_batched_record_path_and_the_one_by_one_path_agree(lg: Ledger) -> None:
    """Without `Ledger.record` (an older core) the worker writes each outcome itself."""

    class WithoutRecord:
        def __init__(self, inner: Ledger) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "record":
                raise AttributeError(name)
            return getattr(self._inner, name)

    def handle(lease: Lease) -> Accepted | Rejected:
        if lease.item_id in ("i2", "i4"):
            return Rejected("odd_one_out")
        return Accepted()

    batched = running(lg, 6, manifest_of=items_from_one)
    one_by_one = running(lg, 6, manifest_of=items_from_one)
    a = Worker(lg, batched, handle, concurrency=3).run()
    proxy: Any = WithoutRecord(lg)
    b = Worker(proxy, one_by_one, handle, concurrency=3).run()
    assert states(lg, batched) == states(lg, one_by_one)
    assert (a.accepted, a.rejected) == (b.accepted, b.rejected) == (4, 2)


def test_evidence_the_ledger_refuses_becomes_a_failed_attempt(lg: Ledger) -> None:
    run_id = running(lg, 2, max_attempts=1, manifest_of=items_from_one)

    def handle(lease: Lease) -> Accepted:
        if lease.item_id == "i1":
            return Accepted(evidence={"when": datetime(2026, 1, 1)})  # not JSON
        return Accepted()

    summary = Worker(lg, run_id, handle, concurrency=2).run()
    assert states(lg, run_id) == {"i1": "quarantined", "i2": "accepted"}
    assert summary.accepted == 1 and summary.quarantined == 1
    error = lg.attempts(run_id, item_id="i1")[0].error
    assert error is not None and "refused" in error


def test_a_conflicting_write_is_retried(lg: Ledger) -> None:
    """Conflict means nothing of ours was written: the worker writes again."""
    from ledger import Conflict

    class ConflictOnce:
        def __init__(self, inner: Ledger) -> None:
            self._inner = inner
            self.conflicts = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def record(self, outcomes: Any) -> Any:
            if not self.conflicts:
                self.conflicts += 1
                raise Conflict("another writer changed the run first", 1, "running")
            return self._inner.record(outcomes)

    run_id = running(lg, 3, manifest_of=items_from_one)
    proxy = ConflictOnce(lg)
    summary = Worker(proxy, run_id, lambda lease: Accepted(), concurrency=3).run()  # type: ignore[arg-type]
    assert proxy.conflicts == 1
    assert summary.accepted == 3 and summary.errors == []
    assert states(lg, run_id) == {"i1": "accepted", "i2": "accepted", "i3": "accepted"}


def test_a_worker_without_an_id_names_its_user_host_and_process(lg: Ledger) -> None:
    import os
    import socket

    run_id = running(lg, 1, manifest_of=items_from_one)
    worker = Worker(lg, run_id, lambda lease: Accepted(), concurrency=1)
    worker.run()
    assert worker.worker_id.endswith(f"@{socket.gethostname()}:{os.getpid()}")
    assert [a.worker_id for a in lg.attempts(run_id)] == [worker.worker_id]
