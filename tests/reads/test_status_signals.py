"""rule 19 of the rule book in the status read, on every store with the injected clock: who owns the
delay (and which person), since when, the latest run or item activity, stalled, rate
and ETA. Each signal is checked where it starts and where it stops."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ledger import InvalidInput, Ledger
from ledger.cli.entry import main
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, RECONCILER, REVIEWER, SUBMITTER, WORKER, manifest


def started(lg: Ledger, n: int = 4, **policy: object) -> str:
    run_id = lg.submit(manifest(n, **policy), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    return run_id


def test_item_activity_counts_and_keeps_a_run_from_stalling(lg: Ledger, clock: ManualClock) -> None:
    run_id = started(lg, 4, lease_seconds=3600)
    start = clock()
    clock.advance(20 * 60)
    (lease,) = lg.claim(run_id, WORKER)
    status = lg.status(run_id)
    assert status.updated_at == start  # the run's own state is 20 minutes old ...
    assert status.last_activity_at == clock()  # ... but an item moved just now
    assert status.waiting_on == "workers" and status.waiting_on_actors == ["w1"]
    assert status.waiting_since == start and not status.stalled
    clock.advance(15 * 60)
    assert not lg.status(run_id).stalled  # exactly 900 s: not yet
    clock.advance(1)
    assert lg.status(run_id).stalled
    lg.heartbeat(lease)  # a heartbeat is not a transition
    assert lg.status(run_id).stalled
    lg.accept(lease)
    status = lg.status(run_id)
    assert not status.stalled and status.last_activity_at == clock()
    assert status.waiting_on_actors == []  # nobody holds a lease now


def test_stalled_only_while_waiting_on_workers(lg: Ledger, clock: ManualClock) -> None:
    run_id = started(lg, 1, stall_seconds=60)
    (lease,) = lg.claim(run_id, WORKER)
    lg.accept(lease)  # every item final: the controller's turn, not the workers'
    clock.advance(3600)
    status = lg.status(run_id)
    assert status.waiting_on == "controller" and not status.stalled
    assert status.waiting_since == clock() - timedelta(seconds=3600)
    other = started(lg, 1, stall_seconds=60)
    clock.advance(61)
    assert lg.status(other).stalled  # the policy's threshold, not the default 900 s


def test_an_expired_lease_waits_on_the_reconciler_until_reconciled(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = started(lg, 3, lease_seconds=30)
    leases = lg.claim(run_id, WORKER, limit=2)
    clock.advance(30)
    status = lg.status(run_id)
    assert status.waiting_on == "workers" and status.expired_leases == 0  # expiry is not yet
    clock.advance(1)
    status = lg.status(run_id)
    assert status.waiting_on == "reconciler"
    assert status.expired_leases == 2
    assert status.waiting_since == leases[0].expires_at
    assert lg.runs()[0].waiting_on == "reconciler"  # the list says the same
    lg.reconcile(actor=RECONCILER)
    status = lg.status(run_id)
    assert status.waiting_on == "workers" and status.expired_leases == 0
    assert status.last_activity_at == clock()  # the reconciler's transitions are activity


def test_a_review_routed_to_a_person_names_them(lg: Ledger, clock: ManualClock) -> None:
    run_id = started(lg, 1, review={"decision": "sign-off"})
    (lease,) = lg.claim(run_id, WORKER)
    lg.accept(lease)
    clock.advance(10)
    asked = clock()
    status = lg.request_review(run_id, CONTROLLER, "sign-off", reviewer="rita")
    assert status.waiting_on == "reviewer" and status.waiting_on_actors == ["rita"]
    assert status.review is not None and status.review["reviewer"] == "rita"
    clock.advance(3600)
    status = lg.status(run_id)
    assert status.waiting_since == asked and not status.stalled
    lg.decide(run_id, REVIEWER, status.input_version, True, "ok")
    assert lg.status(run_id).waiting_on_actors == []
    with pytest.raises(InvalidInput):
        lg.request_review(run_id, CONTROLLER, "sign-off", reviewer="bad\nid")


def test_rate_and_eta_over_the_last_five_minutes(lg: Ledger, clock: ManualClock) -> None:
    m = manifest(6)
    m["items"][5]["required"] = False
    run_id = lg.submit(m, SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    assert lg.status(run_id).rate == 0.0 and lg.status(run_id).eta is None
    for _ in range(3):
        clock.advance(60)
        (lease,) = lg.claim(run_id, WORKER)
        lg.accept(lease)
    status = lg.status(run_id)
    assert status.rate == 0.6  # 3 items in 5 minutes
    # 2 required items remain (the optional one does not hold the run up): 2 / 0.6 per minute
    assert status.eta == clock() + timedelta(minutes=2 / 0.6)
    clock.advance(3 * 60 + 1)  # the first accept (at minute 1) leaves the window
    assert lg.status(run_id).rate == 0.4
    clock.advance(5 * 60)
    status = lg.status(run_id)
    assert status.rate == 0.0 and status.eta is None


def test_a_past_status_has_the_signals_of_its_last_change(lg: Ledger, clock: ManualClock) -> None:
    run_id = started(lg, 2, lease_seconds=30)
    lg.claim(run_id, WORKER)
    seen = lg.status(run_id)
    clock.advance(31)
    assert lg.status(run_id).waiting_on == "reconciler"
    past = lg.status_at(run_id, clock())  # nothing changed since the claim
    assert past == seen and past.waiting_on == "workers" and past.waiting_on_actors == ["w1"]
    assert past.last_activity_at == clock() - timedelta(seconds=31)


def test_cli_status_shows_the_delay(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    dsn = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(dsn) as lg:
        run_id = started(lg, 1, review={"decision": "sign-off"})
        (lease,) = lg.claim(run_id, WORKER)
        lg.accept(lease)
    capsys.readouterr()
    assert (
        main(
            [
                "--dsn",
                dsn,
                "--as",
                "ctl:controller",
                "request-review",
                run_id,
                "--decision",
                "sign-off",
                "--reviewer",
                "rita",
            ]
        )
        == 0
    )
    assert main(["--dsn", dsn, "status", run_id]) == 0
    out = capsys.readouterr().out
    assert "reviewer (rita)" in out
    for label in ("started", "waiting since", "last activity", "rate", "eta"):
        assert label in out, label
    with Ledger.open(dsn) as lg:
        lg.fail(run_id, CONTROLLER, "supplier gone", transient=False)
    assert main(["--dsn", dsn, "status", run_id]) == 0
    out = capsys.readouterr().out
    assert "stopped" in out and "stop reason" in out and "supplier gone" in out
