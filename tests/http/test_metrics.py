"""`GET /metrics` parsed with prometheus_client's own parser, checked against the ledger;
`GET /overview` as JSON; both are reads (a token unless reads are public)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from ledger import Ledger
from ledger.http import add_token, create_app
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, RECONCILER, SUBMITTER, WORKER, manifest


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Ledger, ManualClock, TestClient, str]]:
    clock = ManualClock()
    lg = Ledger.open(f"sqlite:///{tmp_path}/ledger.db", clock=clock)
    token = add_token("prom", "operator", tmp_path / "tokens")
    # overview_max_age=0: each scrape reads the ledger as it is (no snapshot)
    app = create_app(lg, tokens_path=tmp_path / "tokens", overview_max_age=0)
    with TestClient(app) as client:
        yield lg, clock, client, token
    lg.close()


def scrape(client: TestClient, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        assert family.name.startswith("ledger_"), family.name
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_match_the_ledger(served: tuple[Ledger, ManualClock, TestClient, str]) -> None:
    lg, clock, client, token = served
    dead = lg.submit(manifest(4, lease_seconds=30), SUBMITTER).run_id
    lg.start(dead, CONTROLLER)
    leases = lg.claim(dead, WORKER, limit=3)
    lg.accept(leases[0])
    review = lg.submit(manifest(1, review={"decision": "ok"}), SUBMITTER).run_id
    lg.start(review, CONTROLLER)
    (lease,) = lg.claim(review, WORKER)
    lg.accept(lease)
    lg.request_review(review, CONTROLLER, "ok")
    lg.submit(manifest(2), SUBMITTER)
    clock.advance(100)  # the dead run's two leases expire; 100 s of waiting on the reviewer

    m = scrape(client, token)
    assert m[("ledger_open_runs", (("state", "running"),))] == 1
    assert m[("ledger_open_runs", (("state", "queued"),))] == 1
    assert m[("ledger_open_runs", (("state", "awaiting_review"),))] == 1
    assert m[("ledger_open_runs_waiting", (("waiting_on", "reconciler"),))] == 1
    assert m[("ledger_open_runs_waiting", (("waiting_on", "reviewer"),))] == 1
    assert m[("ledger_open_runs_waiting", (("waiting_on", "controller"),))] == 1
    assert m[("ledger_open_runs_waiting", (("waiting_on", "workers"),))] == 0
    assert m[("ledger_oldest_wait_seconds", (("waiting_on", "reviewer"),))] == 100.0
    assert m[("ledger_oldest_wait_seconds", (("waiting_on", "reconciler"),))] == 70.0
    assert m[("ledger_expired_leases", ())] == 2
    assert m[("ledger_stalled_runs", ())] == 0
    assert m[("ledger_items", (("state", "in_progress"),))] == 2
    assert m[("ledger_items", (("state", "pending"),))] == 3  # 1 of the dead run + 2 queued
    assert m[("ledger_items", (("state", "accepted"),))] == 2
    assert m[("ledger_lease_expirations_total", ())] == 0

    lg.reconcile(actor=RECONCILER)
    m = scrape(client, token)
    assert m[("ledger_lease_expirations_total", ())] == 2
    assert m[("ledger_expired_leases", ())] == 0
    assert m[("ledger_open_runs_waiting", (("waiting_on", "workers"),))] == 1
    by_command = Counter(t.command for t in lg.audit())
    for command, n in by_command.items():
        assert m[("ledger_transitions_total", (("command", command),))] == n
    # counted once: a third scrape adds nothing that was not written
    assert scrape(client, token)[("ledger_transitions_total", (("command", "claim"),))] == 4

    # the HTTP API's own requests, labelled by route template
    client.get(f"/runs/{dead}", headers={"Authorization": f"Bearer {token}"})
    client.get("/runs/not-a-run", headers={"Authorization": f"Bearer {token}"})
    client.get("/nowhere")
    m = scrape(client, token)
    route = (("method", "GET"), ("route", "/runs/{run_id}"))
    assert m[("ledger_http_requests_total", (*route, ("status", "200")))] == 1
    assert m[("ledger_http_requests_total", (*route, ("status", "404")))] == 1
    assert m[("ledger_http_request_duration_seconds_count", route)] == 2
    unmatched = (("method", "GET"), ("route", "unmatched"), ("status", "404"))
    assert m[("ledger_http_requests_total", unmatched)] == 1
    metrics_route = (("method", "GET"), ("route", "/metrics"), ("status", "200"))
    assert m[("ledger_http_requests_total", metrics_route)] == 3


def test_overview_and_metrics_are_reads(
    served: tuple[Ledger, ManualClock, TestClient, str],
) -> None:
    lg, _clock, client, token = served
    lg.submit(manifest(1), SUBMITTER)
    assert client.get("/metrics").status_code == 401
    assert client.get("/overview").status_code == 401
    body = client.get("/overview", headers={"Authorization": f"Bearer {token}"}).json()
    assert body["open_runs"] == 1
    assert body["by_waiting_on"]["controller"] == 1
    assert body["oldest_wait"]["controller"]["run_id"] == lg.runs()[0].run_id


def test_follower_lag_appears_once_followers_exist(
    served: tuple[Ledger, ManualClock, TestClient, str],
) -> None:
    from ledger.feed.follower import Follower

    lg, clock, client, token = served
    run_id = lg.submit(manifest(3), SUBMITTER).run_id
    assert not [k for k in scrape(client, token) if k[0].startswith("ledger_follower")]
    handled: list[object] = []
    with Follower(lg, "mailer", lambda batch: handled.extend(batch), batch=1) as follower:
        follower.run_once()  # registers the follower and hands it one transition
        lg.start(run_id, CONTROLLER)
        clock.advance(30)
        m = scrape(client, token)
        behind = len(list(lg.audit())) - len(handled)
        assert behind == 1
        assert m[("ledger_follower_lag_events", (("follower", "mailer"),))] == behind
        assert m[("ledger_follower_lag_seconds", (("follower", "mailer"),))] == 30.0
        follower.catch_up()
    m = scrape(client, token)
    assert m[("ledger_follower_lag_events", (("follower", "mailer"),))] == 0
    assert m[("ledger_follower_lag_seconds", (("follower", "mailer"),))] == 0.0
