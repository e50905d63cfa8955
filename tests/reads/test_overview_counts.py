"""The overview read from the counts the writes keep equals the rule applied to every open
run (`overview_recount`), after random command sequences on every store, and again after
the projections are rebuilt from the events; the server's snapshot says how old it is."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from ledger import Actor, Ledger, LedgerError
from ledger.reads.overview import OverviewSnapshot, overview, overview_recount
from tests.support.clock import ManualClock
from tests.support.runs import (
    CONTROLLER,
    OPERATOR,
    RECONCILER,
    REVIEWER,
    SUBMITTER,
    manifest,
)
from tests.support.waiting import wait_until

WORKERS = (Actor("w1", "worker"), Actor("w2", "worker"))
POLICIES: tuple[dict[str, Any], ...] = (
    {},
    {"lease_seconds": 20, "max_attempts": 1},
    {"stall_seconds": 45},
    {"partial_delivery": True, "tolerated_failures": 1},
    {"review": {"decision": "sign-off"}},
)


def _step(
    lg: Ledger, clock: ManualClock, rnd: random.Random, runs: list[str], leases: list[Any]
) -> None:
    move = rnd.choice(
        (
            "submit",
            "submit",
            "start",
            "start",
            "claim",
            "claim",
            "finish",
            "finish",
            "finish",
            "pause",
            "resume",
            "cancel",
            "complete",
            "review",
            "approve",
            "withdraw",
            "release",
            "reconcile",
            "wait",
            "wait",
        )
    )
    run_id = rnd.choice(runs) if runs else None
    try:
        if move == "submit" or run_id is None:
            runs.append(
                lg.submit(manifest(rnd.randint(1, 4), **rnd.choice(POLICIES)), SUBMITTER).run_id
            )
        elif move == "start":
            lg.start(run_id, CONTROLLER)
        elif move == "claim":
            leases.extend(lg.claim(run_id, rnd.choice(WORKERS), limit=rnd.randint(1, 3)))
        elif move == "finish" and leases:
            lease = leases.pop(rnd.randrange(len(leases)))
            how = rnd.random()
            if how < 0.5:
                lg.accept(lease)
            elif how < 0.7:
                lg.reject(lease, "bad-row")
            else:
                lg.fail_attempt(lease, "boom")
        elif move == "pause":
            lg.pause(run_id, OPERATOR, "maintenance")
        elif move == "resume":
            lg.resume(run_id, OPERATOR, "back")
        elif move == "cancel":
            lg.cancel(run_id, OPERATOR, "not needed")
        elif move == "complete":
            lg.complete(run_id, CONTROLLER)
        elif move == "review":
            lg.request_review(run_id, CONTROLLER, "sign-off", reviewer=REVIEWER.id)
        elif move == "approve":
            lg.approve(run_id, REVIEWER, lg.status(run_id).input_version)
        elif move == "withdraw":
            lg.amend(run_id, OPERATOR, "fewer", withdraw=[f"i{rnd.randint(0, 3)}"])
        elif move == "release":
            lg.release(run_id, f"i{rnd.randint(0, 3)}", OPERATOR, "try again")
        elif move == "reconcile":
            lg.reconcile(actor=RECONCILER)
        elif move == "wait":
            clock.advance(rnd.choice((5, 30, 60, 1000)))
    except LedgerError:
        pass  # an illegal move in this state: refused, nothing written


@pytest.mark.parametrize(
    "seed", [3, 5, 7]
)  # between them: every owner, expired, pausing, canceling
def test_the_counted_overview_equals_a_full_recount(
    lg: Ledger, clock: ManualClock, seed: int
) -> None:
    rnd = random.Random(seed)
    runs: list[str] = []
    leases: list[Any] = []
    for k in range(160):
        _step(lg, clock, rnd, runs, leases)
        if k % 8 == 7:
            assert overview(lg.store) == overview_recount(lg.store), k
    ov = overview(lg.store)
    assert ov.open_runs > 0 and sum(ov.items_by_state.values()) > 0
    assert ov == lg.overview()
    lg.rebuild_projections()
    assert overview(lg.store) == overview_recount(lg.store) == ov


def test_every_owner_and_signal_counted_without_reading_each_run(
    lg: Ledger, clock: ManualClock
) -> None:
    # one run of each kind, and many runs whose workers are working: those are counted, and
    # listed only when among the longest waits
    review = lg.submit(manifest(1, review={"decision": "sign-off"}), SUBMITTER).run_id
    lg.start(review, CONTROLLER)
    (lease,) = lg.claim(review, WORKERS[0])
    lg.accept(lease)
    lg.request_review(review, CONTROLLER, "sign-off", reviewer=REVIEWER.id)
    quarantined = lg.submit(manifest(1, max_attempts=1), SUBMITTER).run_id
    lg.start(quarantined, CONTROLLER)
    (lease,) = lg.claim(quarantined, WORKERS[0])
    lg.fail_attempt(lease, "boom")
    dead = lg.submit(manifest(2, lease_seconds=10), SUBMITTER).run_id
    lg.start(dead, CONTROLLER)
    lg.claim(dead, WORKERS[0])
    idle = lg.submit(manifest(2, stall_seconds=30), SUBMITTER).run_id
    lg.start(idle, CONTROLLER)
    busy = []
    for _ in range(30):
        run_id = lg.submit(manifest(2), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        busy.append(run_id)
    queued = [lg.submit(manifest(1), SUBMITTER).run_id for _ in range(25)]
    clock.advance(31)
    ov = overview(lg.store)
    assert ov == overview_recount(lg.store)
    assert ov.by_waiting_on == {
        "reconciler": 1,
        "reviewer": 2,
        "operator": 0,
        "controller": 25,
        "workers": 31,
    }
    assert ov.stalled == 1 and [s.run_id for s in ov.stuck] == [dead, idle]
    assert ov.oldest_wait["controller"].run_id == queued[0]
    assert len(ov.longest_waiting) == 20


def test_the_snapshot_is_read_again_after_its_age_and_says_how_old_it_is(
    lg: Ledger, clock: ManualClock
) -> None:
    now = [100.0]
    snapshot = OverviewSnapshot(lg.store, max_age=2.0, clock=lambda: now[0], background=False)
    first = snapshot.get()
    assert first.open_runs == 0 and first.age_seconds == 0.0
    lg.submit(manifest(1), SUBMITTER)
    now[0] += 1.5
    again = snapshot.get()
    assert again.open_runs == 0  # the snapshot, not the store
    assert again.age_seconds == 1.5 and again.at == first.at
    now[0] += 0.5
    fresh = snapshot.get()
    assert fresh.open_runs == 1 and fresh.age_seconds == 0.0
    assert OverviewSnapshot(lg.store, max_age=0).get().open_runs == 1


def test_many_stalled_runs_are_counted_and_the_first_listed(lg: Ledger, clock: ManualClock) -> None:
    dead = lg.submit(manifest(2, lease_seconds=10), SUBMITTER).run_id
    lg.start(dead, CONTROLLER)
    lg.claim(dead, WORKERS[0])
    busy = []
    for _ in range(30):
        run_id = lg.submit(manifest(2), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        busy.append(run_id)
    clock.advance(901)  # every running run is quiet past the default threshold
    lg.claim(busy[3], WORKERS[1])  # but this one
    ov = overview(lg.store)
    assert ov == overview_recount(lg.store)
    assert ov.stalled == 29 and ov.by_waiting_on["reconciler"] == 1
    assert [s.run_id for s in ov.stuck] == [dead, *[r for r in busy if r != busy[3]]][:20]


def test_a_stale_snapshot_answers_at_once_while_the_next_is_read(
    lg: Ledger, clock: ManualClock
) -> None:
    now = [100.0]
    snapshot = OverviewSnapshot(lg.store, max_age=2.0, clock=lambda: now[0])
    assert snapshot.get().open_runs == 0  # the first read of all waits for the store
    lg.submit(manifest(1), SUBMITTER)
    now[0] += 3
    stale = snapshot.get()  # answered from the old one, a background read started
    assert stale.open_runs == 0 and stale.age_seconds == 3.0
    wait_until(lambda: snapshot.get().open_runs == 1, "the background read", timeout=30)


def _rows_fetched(lg: Ledger) -> int:
    """The rows every statement of one `overview()` returns to Python."""
    fetched = [0]
    real_read = lg.store.read

    @contextmanager
    def read() -> Iterator[Any]:
        with real_read() as tx:
            fetchall, fetchone = tx.fetchall, tx.fetchone

            def counted_all(sql: str, params: Any = ()) -> list[dict[str, Any]]:
                rows = fetchall(sql, params)
                fetched[0] += len(rows)
                return rows

            def counted_one(sql: str, params: Any = ()) -> dict[str, Any] | None:
                row = fetchone(sql, params)
                fetched[0] += row is not None
                return row

            tx.fetchall, tx.fetchone = counted_all, counted_one  # type: ignore[method-assign]
            yield tx

    lg.store.read = read  # type: ignore[method-assign]
    try:
        overview(lg.store)
    finally:
        del lg.store.read
    return fetched[0]


def test_quiet_running_runs_are_counted_without_reading_each_one(
    lg: Ledger, clock: ManualClock
) -> None:
    # running runs whose own row and items have been quiet past the default threshold are
    # all stalled: they are counted by the store, and only the first few come back to be
    # listed, so the rows read stay the same when their number triples
    own = lg.submit(manifest(1, stall_seconds=60), SUBMITTER).run_id
    lg.start(own, CONTROLLER)
    running = [own]
    fetched = {}
    for total in (60, 150):
        while len(running) < total:
            running.append(lg.submit(manifest(2), SUBMITTER).run_id)
            lg.start(running[-1], CONTROLLER)
        clock.advance(901)
        ov = overview(lg.store)
        assert ov == overview_recount(lg.store)
        assert ov.stalled == total and len(ov.stuck) == 20 and ov.stuck[0].run_id == own
        fetched[total] = _rows_fetched(lg)
    assert fetched[60] == fetched[150]


@pytest.mark.parametrize("seed", [11, 13])
def test_many_quiet_runs_of_every_kind_equal_a_full_recount(
    lg: Ledger, clock: ManualClock, seed: int
) -> None:
    # more runs than the stuck list holds, quiet past the default threshold or their own,
    # with dead leases among them: the stalled count, the first stalled listed (from the
    # store's count and from the runs with their own threshold, in seq order) and every
    # owner equal the rule applied to each run
    rnd = random.Random(seed)
    runs: list[str] = []
    leases: list[Any] = []
    for _ in range(40):
        policy = rnd.choice(({}, {}, {"stall_seconds": 60}, {"stall_seconds": 2000}))
        runs.append(lg.submit(manifest(rnd.randint(1, 3), **policy), SUBMITTER).run_id)
        if rnd.random() < 0.8:
            lg.start(runs[-1], CONTROLLER)
    for k in range(120):
        _step(lg, clock, rnd, runs, leases)
        if k % 30 == 29:
            clock.advance(rnd.choice((61, 901, 2001)))
            ov = overview(lg.store)
            assert ov == overview_recount(lg.store), k
    assert ov.stalled > 20, ov.stalled
