"""`Ledger.status_at(run_id, at)`: the status the store had accepted at time `at`,
replayed from the events, equal to what `status()` returned then."""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from ledger import InvalidInput, Ledger, RunNotFound, RunStatus
from tests.support.clock import ManualClock
from tests.support.runs import (
    CONTROLLER,
    OPERATOR,
    RECONCILER,
    REVIEWER,
    SUBMITTER,
    WORKER,
    manifest,
)


def test_status_at_equals_each_status_seen_then(lg: Ledger, clock: ManualClock) -> None:
    snapshots: list[tuple[datetime, RunStatus]] = []
    run_id = lg.submit(
        manifest(
            5,
            review={"decision": "ok"},
            partial_delivery=True,
            tolerated_failures=2,
            max_attempts=2,
        ),
        SUBMITTER,
    ).run_id

    def snap() -> None:
        snapshots.append((clock(), lg.status(run_id)))
        clock.advance(7)

    snap()
    steps = [
        lambda: lg.start(run_id, CONTROLLER),
        lambda: lg.claim(run_id, WORKER, limit=3),
        lambda: lg.heartbeat(lg.items(run_id, state="in_progress")[0].lease),  # type: ignore[arg-type]
        lambda: lg.accept(lg.items(run_id, state="in_progress")[0].lease, evidence={"rows": 3}),  # type: ignore[arg-type]
        lambda: lg.fail_attempt(lg.items(run_id, state="in_progress")[0].lease, "timeout"),  # type: ignore[arg-type]
        lambda: lg.reject(lg.items(run_id, state="in_progress")[0].lease, "bad-row"),  # type: ignore[arg-type]
        lambda: lg.amend(
            run_id, SUBMITTER, "add and withdraw", items=[{"item_id": "extra"}], withdraw=["i4"]
        ),
        lambda: lg.claim(run_id, WORKER, limit=1),
        lambda: lg.pause(run_id, OPERATOR, "maintenance"),  # pausing: a lease is live
        lambda: lg.fail_attempt(
            lg.items(run_id, state="in_progress")[0].lease, "bad", retryable=False
        ),  # type: ignore[arg-type]
        lambda: lg.resume(run_id, OPERATOR, reason="back to work"),
        lambda: lg.claim(run_id, WORKER, limit=5),
        lambda: [lg.accept(i.lease) for i in lg.items(run_id, state="in_progress")],  # type: ignore[arg-type]
        lambda: (
            lg.skip(run_id, "i3", OPERATOR, "not needed")
            if lg.item(run_id, "i3").state != "accepted"
            else None
        ),
        lambda: lg.request_review(run_id, CONTROLLER, "ok"),
        lambda: lg.decide(run_id, REVIEWER, lg.status(run_id).input_version, True, "fine"),
        lambda: lg.complete(run_id, CONTROLLER),
        lambda: lg.repair(run_id, OPERATOR),
    ]
    for step in steps:
        step()
        snap()
    assert sum(a != b for (_t, a), (_u, b) in pairwise(snapshots)) >= 15  # it kept changing
    assert snapshots[-1][1].state == "completed_with_errors" and snapshots[-1][1].links
    for at, seen in snapshots:
        assert lg.status_at(run_id, at) == seen
        # between two commands nothing changed
        assert lg.status_at(run_id, at + timedelta(seconds=3)) == seen


def test_status_at_before_the_run_existed_or_of_no_run(lg: Ledger, clock: ManualClock) -> None:
    created = clock()
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    with pytest.raises(RunNotFound, match="did not exist yet"):
        lg.status_at(run_id, created - timedelta(microseconds=1))
    assert lg.status_at(run_id, created).state == "queued"
    with pytest.raises(RunNotFound):
        lg.status_at("6f1c1d7e-3c59-4a63-9d55-0f6f4b3c2a10", created)
    with pytest.raises(InvalidInput):
        lg.status_at(run_id, created.replace(tzinfo=None))


def test_status_at_shows_links_only_once_they_existed(lg: Ledger, clock: ManualClock) -> None:
    run_id = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    lg.claim(run_id, WORKER)
    clock.advance(10)
    before_fail = clock()
    clock.advance(100)
    lg.reconcile(actor=RECONCILER)  # the lease expired: a retryable item
    lg.fail(run_id, CONTROLLER, "source gone", transient=True)
    failed_at = clock()
    clock.advance(10)
    retry = lg.retry(run_id, SUBMITTER)
    then = lg.status_at(run_id, failed_at)
    assert then.state == "failed" and then.links == [] and then.counts["retryable"] == 1
    assert [link.relation for link in lg.status_at(run_id, clock()).links] == ["retried_by"]
    assert lg.status_at(run_id, clock()) == lg.status(run_id)
    assert lg.status_at(run_id, before_fail).counts["in_progress"] == 1
    assert lg.status_at(retry.run_id, clock()) == lg.status(retry.run_id)


def test_status_at_a_time_before_the_run_says_so_over_http(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from ledger.http import create_app
    from tests.support.runs import finished_run

    lg = Ledger.open(f"sqlite:///{tmp_path}/ledger.db")
    try:
        run_id = finished_run(lg, 1)
        before = (lg.status(run_id).created_at - timedelta(hours=1)).isoformat()
        with TestClient(create_app(lg, tokens_path=tmp_path / "t", public_reads=True)) as client:
            r = client.get(f"/runs/{run_id}", params={"at": before})
        assert r.status_code == 404
        assert r.json()["error"] == "RunNotFound"
        assert "did not exist yet" in r.json()["message"]
        with pytest.raises(RunNotFound, match="did not exist yet"):
            lg.status_at(run_id, lg.status(run_id).created_at - timedelta(hours=1))
    finally:
        lg.close()
