"""What needs attention first, what each owner has to do, and which runs can still succeed,
on every store: the order `ledger top` and the operator page share (`board(order=
"attention")`), and an ETA only for a running run that can still succeed."""

from __future__ import annotations

import pytest

from ledger import Ledger
from ledger.cli.top import overview_rows
from ledger.core import states as S
from ledger.core.errors import InvalidInput
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER, manifest


def started(lg: Ledger, n: int = 4, **policy: object) -> str:
    run_id = lg.submit(manifest(n, **policy), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    return run_id


def test_runs_in_the_attention_order_of_ledger_top(lg: Ledger, clock: ManualClock) -> None:
    # written oldest first, so newest first would be the reverse of what needs attention
    review = started(lg, 1, review={"decision": "sign-off"})
    (lease,) = lg.claim(review, WORKER)
    lg.accept(lease)
    lg.request_review(review, CONTROLLER, "sign-off", reviewer=REVIEWER.id)
    clock.advance(60)
    paused = started(lg, 2)
    lg.pause(paused, OPERATOR, "maintenance")
    clock.advance(60)
    queued = lg.submit(manifest(1), SUBMITTER).run_id
    clock.advance(60)
    dead = started(lg, 2, lease_seconds=30)
    lg.claim(dead, WORKER, limit=1)
    clock.advance(60)
    busy = started(lg, 3, lease_seconds=3600)
    clock.advance(60)
    idle = started(lg, 2, stall_seconds=30)
    clock.advance(31)  # the idle run stalls; the dead run's lease has expired
    (lease,) = lg.claim(busy, WORKER)
    lg.accept(lease)

    page = lg.board(order="attention")
    order = [r.run_id for r in page.runs]
    # stuck first (longest wait first: the expired lease, then the stalled run), then the
    # longest waits on a person, then the runs whose workers are working
    assert order == [dead, idle, review, paused, queued, busy]
    assert [r.waiting_on for r in page.runs] == [
        "reconciler",
        "workers",
        "reviewer",
        "operator",
        "controller",
        "workers",
    ]
    steps = {r.run_id: r.next_step for r in page.runs}
    assert steps[review] == "reviewer: approve or reject"
    assert steps[paused] == "operator: resume or cancel the run"
    assert steps[queued] == "controller: start the run (or cancel it)"
    assert steps[dead].startswith("reconciler: ")
    assert steps[busy] == "workers: claim and finish the open items"
    # ledger top lists its runs in the same order
    top = [row[0] for row in overview_rows(lg.overview(), markup=False)]
    assert top == [r for r in order if r in top] and top[:3] == [dead, idle, review]
    # pages by rank, the order kept across pages
    first = lg.board(order="attention", limit=4)
    assert [r.run_id for r in first.runs] == order[:4] and first.next_after == 4
    rest = lg.board(order="attention", limit=4, after=first.next_after)
    assert [r.run_id for r in rest.runs] == order[4:] and rest.next_after is None
    # filters apply before the ranking
    assert [r.run_id for r in lg.board(order="attention", waiting_on="workers").runs] == [
        idle,
        busy,
    ]
    # newest first stays the default
    assert [r.run_id for r in lg.board().runs] == [idle, busy, dead, queued, paused, review]
    with pytest.raises(InvalidInput, match="order"):
        lg.board(order="oldest")


def test_a_running_run_waiting_on_its_controller_says_what_to_do(lg: Ledger) -> None:
    done = started(lg, 1)
    (lease,) = lg.claim(done, WORKER)
    lg.accept(lease)
    lost = started(lg, 2)
    for lease in lg.claim(lost, WORKER, limit=2):
        lg.reject(lease, "bad-row")
    rows = {r.run_id: r for r in lg.board().runs}
    assert rows[done].waiting_on == rows[lost].waiting_on == "controller"
    assert rows[done].can_succeed and rows[done].next_step == S.next_step(S.RUNNING, "controller")
    assert rows[done].next_step == "controller: complete or repair the run"
    assert not rows[lost].can_succeed
    assert rows[lost].next_step == "controller: fail the run, then repair it"


def test_an_eta_only_for_runs_that_can_still_succeed(lg: Ledger, clock: ManualClock) -> None:
    # each run: 5 items, 2 finished in the last minute (a rate), 3 still to do
    def progressed(rejected: int, **policy: object) -> str:
        run_id = started(lg, 5, **policy)
        leases = lg.claim(run_id, WORKER, limit=2)
        for k, lease in enumerate(leases):
            if k < rejected:
                lg.reject(lease, "bad-row")
            else:
                lg.accept(lease)
        return run_id

    healthy = progressed(0)
    lost = progressed(1)  # one required item rejected, no partial delivery
    tolerated = progressed(1, partial_delivery=True, tolerated_failures=1)
    beyond = progressed(2, partial_delivery=True, tolerated_failures="20%")  # 1 of 5 tolerated
    within = progressed(1, partial_delivery=True, tolerated_failures="20%")
    paused = progressed(0)
    lg.pause(paused, OPERATOR, "maintenance")
    quarantined = started(lg, 3, max_attempts=1)
    (lease,) = lg.claim(quarantined, WORKER)
    lg.fail_attempt(lease, "boom")
    (lease,) = lg.claim(quarantined, WORKER)
    lg.accept(lease)
    clock.advance(30)

    rows = {r.run_id: r for r in lg.board().runs}
    for run_id in (healthy, tolerated, within):
        assert rows[run_id].can_succeed, run_id
        assert rows[run_id].eta is not None and rows[run_id].rate > 0, run_id
    for run_id in (lost, beyond, quarantined):
        assert not rows[run_id].can_succeed, run_id
        assert rows[run_id].rate > 0 and rows[run_id].remaining_required > 0, run_id
        assert rows[run_id].eta is None, run_id
    assert rows[paused].can_succeed and rows[paused].rate > 0
    assert rows[paused].eta is None  # a paused run moves no item
    # the status read agrees
    assert lg.status(lost).eta is None and lg.status(healthy).eta is not None
