"""What is stuck, on whom (rule 19 of the rule book), on every store with the injected clock.

`lg.overview()` counts every open run (not the newest N); each signal is checked
where it starts and where it stops: activity on items keeps a run from being
stalled, an expired lease puts the run on the reconciler until it is reconciled.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from ledger import Ledger
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, RECONCILER, SUBMITTER, WORKER, manifest


def started(lg: Ledger, n: int = 4, **policy: object) -> str:
    run_id = lg.submit(manifest(n, **policy), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    return run_id


def test_recent_item_activity_keeps_a_run_from_being_stalled(
    lg: Ledger, clock: ManualClock
) -> None:
    busy = started(lg, 4, lease_seconds=3600)
    idle = started(lg, 4, lease_seconds=3600)
    clock.advance(20 * 60)  # both runs' own state is 20 minutes old
    (lease,) = lg.claim(busy, WORKER)
    lg.accept(lease)
    ov = lg.overview()
    assert ov.by_waiting_on["workers"] == 2
    assert ov.stalled == 1
    assert [s.run_id for s in ov.stuck] == [idle]
    assert ov.stuck[0].stalled and ov.stuck[0].last_activity_at == clock() - timedelta(minutes=20)
    # activity on the idle run ends its stall; the busy one stays fine until 15 minutes pass
    (lease,) = lg.claim(idle, WORKER)
    assert lg.overview().stalled == 0
    clock.advance(15 * 60 + 1)
    assert lg.overview().stalled == 2  # the idle run's lease is still live: workers own it
    lg.heartbeat(lease)  # a heartbeat is not a transition: no activity recorded
    assert lg.overview().stalled == 2


def test_an_expired_lease_waits_on_the_reconciler_until_reconciled(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = started(lg, 3, lease_seconds=30)
    leases = lg.claim(run_id, WORKER, limit=3)
    lg.accept(leases[0])
    clock.advance(29)
    ov = lg.overview()
    assert ov.by_waiting_on["workers"] == 1 and ov.expired_leases == 0
    clock.advance(2)  # the worker died: its two leases are past their expiry
    ov = lg.overview()
    assert ov.by_waiting_on == {
        "reconciler": 1,
        "reviewer": 0,
        "operator": 0,
        "controller": 0,
        "workers": 0,
    }
    assert ov.expired_leases == 2 and ov.runs_with_expired_leases == 1
    assert ov.oldest_wait["reconciler"].since == leases[1].expires_at
    assert ov.oldest_wait["reconciler"].seconds == 1.0
    assert ov.stuck[0].run_id == run_id and ov.stuck[0].expired_leases == 2
    lg.reconcile(actor=RECONCILER)
    ov = lg.overview()
    assert ov.by_waiting_on["reconciler"] == 0 and ov.by_waiting_on["workers"] == 1
    assert ov.expired_leases == 0 and ov.stuck == []


def test_the_overview_counts_runs_beyond_the_newest_500(lg: Ledger, clock: ManualClock) -> None:
    review = started(lg, 1, review={"decision": "sign-off"})
    (lease,) = lg.claim(review, WORKER)
    lg.accept(lease)
    lg.request_review(review, CONTROLLER, "sign-off")
    clock.advance(60)
    for _ in range(505):
        newer = lg.submit(manifest(1), SUBMITTER).run_id
        lg.fail(newer, CONTROLLER, "not needed", transient=False)
    assert review not in {r.run_id for r in lg.runs(limit=500)}
    ov = lg.overview()
    assert ov.open_runs == 1
    assert ov.by_state["awaiting_review"] == 1
    assert ov.by_waiting_on["reviewer"] == 1
    assert ov.oldest_wait["reviewer"].run_id == review
    assert ov.oldest_wait["reviewer"].seconds == 60.0
    assert ov.items_by_state["accepted"] == 1  # items of open runs only


def test_owners_by_state_and_items(lg: Ledger, clock: ManualClock) -> None:
    lg.submit(manifest(2), SUBMITTER)  # queued: the controller
    done = started(lg, 1)  # every item final: the controller again
    (lease,) = lg.claim(done, WORKER)
    lg.accept(lease)
    held = started(lg, 2, max_attempts=1)  # only quarantined left: a reviewer
    for lease in lg.claim(held, WORKER, limit=2):
        lg.fail_attempt(lease, "bad row", retryable=False)
    ov = lg.overview()
    assert ov.open_runs == 3
    assert ov.by_state["queued"] == 1 and ov.by_state["running"] == 2
    assert ov.by_waiting_on["controller"] == 2 and ov.by_waiting_on["reviewer"] == 1
    assert ov.items_by_state["quarantined"] == 2 and ov.items_by_state["pending"] == 2
    assert ov.stalled == 0 and ov.stuck == []


def test_board_pages_open_runs_first_and_filters_by_owner(lg: Ledger, clock: ManualClock) -> None:
    old_done = lg.submit(manifest(1), SUBMITTER).run_id
    lg.fail(old_done, CONTROLLER, "not needed", transient=False)
    dead = started(lg, 2, lease_seconds=30)
    lg.claim(dead, WORKER, limit=2)
    idle = started(lg, 2, lease_seconds=3600)
    queued = lg.submit(manifest(1), SUBMITTER).run_id
    clock.advance(16 * 60)
    page = lg.board(limit=2)
    assert [r.run_id for r in page.runs] == [queued, idle]
    assert page.next_after is not None
    rest = lg.board(limit=2, after=page.next_after)
    assert [r.run_id for r in rest.runs] == [dead] and rest.next_after is None
    assert [r.run_id for r in lg.board(terminal=True).runs] == [old_done]
    (row,) = lg.board(waiting_on="reconciler").runs
    assert row.run_id == dead and row.expired_leases == 2
    (row,) = lg.board(stalled=True).runs
    assert row.run_id == idle and row.waiting_on == "workers"
    assert lg.board(state="queued").runs[0].waiting_on == "controller"


def test_run_page_reads_one_page_and_mark_expired_leases(lg: Ledger, clock: ManualClock) -> None:
    from ledger.reads import runpage

    run_id = started(lg, 5, lease_seconds=30)
    leases = lg.claim(run_id, WORKER, limit=3)
    lg.accept(leases[0])
    clock.advance(31)
    first = runpage.item_page(lg.store, run_id, limit=2)
    assert [i.item_id for i in first.items] == ["i0", "i1"] and first.total == 5
    assert first.items[1].lease_expired and not first.items[0].lease_expired
    rest = runpage.item_page(lg.store, run_id, after=first.next_after, limit=10)
    assert [i.item_id for i in rest.items] == ["i2", "i3", "i4"] and rest.next_after is None
    assert [i.lease_expired for i in rest.items] == [True, False, False]
    assert runpage.item_page(lg.store, run_id, state="in_progress").total == 2
    page = runpage.attempt_page(lg.store, run_id, limit=2)
    assert page.total == 3 and len(page.attempts) == 2 and page.next_after is not None
    older = runpage.attempt_page(lg.store, run_id, after=page.next_after, limit=2)
    seen = [a.item_id for a in page.attempts + older.attempts]
    assert sorted(seen) == ["i0", "i1", "i2"] and older.next_after is None
    expired = {a.item_id for a in page.attempts + older.attempts if a.lease_expired}
    assert expired == {"i1", "i2"}
    lg.reconcile(actor=RECONCILER)
    assert not any(i.lease_expired for i in runpage.item_page(lg.store, run_id).items)
    row = runpage.board_row(lg.store, run_id)
    assert row.waiting_on == "workers" and row.expired_leases == 0


def test_run_page_counts_attempts_up_to_a_cap(lg: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run page's attempt count reads at most ATTEMPT_COUNT_CAP + 1 index entries
    (a refresh never counts every attempt of a large run) and says when there are more."""
    from ledger.reads import runpage

    monkeypatch.setattr(runpage, "ATTEMPT_COUNT_CAP", 3)
    run_id = started(lg, 5)
    lg.claim(run_id, WORKER, limit=3)
    page = runpage.attempt_page(lg.store, run_id, limit=2)
    assert (page.total, page.total_capped) == (3, False)
    lg.claim(run_id, WORKER, limit=2)
    page = runpage.attempt_page(lg.store, run_id, limit=2)
    assert (page.total, page.total_capped, len(page.attempts)) == (3, True, 2)
    assert page.to_dict()["total_capped"] is True


def test_policy_stall_seconds_sets_the_threshold(lg: Ledger, clock: ManualClock) -> None:
    quick = started(lg, 2, stall_seconds=60)
    slow = started(lg, 2)  # the default, 900 s
    clock.advance(61)
    (row,) = lg.board(stalled=True).runs
    assert row.run_id == quick
    assert lg.status(quick).policy["stall_seconds"] == 60.0
    assert "stall_seconds" not in lg.status(slow).policy  # unset: left out of the digest
    clock.advance(900)
    assert {r.run_id for r in lg.board(stalled=True).runs} == {quick, slow}
