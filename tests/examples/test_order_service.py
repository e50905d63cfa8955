"""The example service (examples/order_service/app.py), run as its users would run it:
FastAPI's lifespan opens the AsyncLedger, an order and its run commit together, workers
and the in-database follower finish the order, the read model answers; on SQLite and
PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from examples.order_service.app import create_app
from ledger import Ledger

WAIT = 60.0  # a bound on waiting for the service's tasks, never a timing assertion


def _until_shipped(client: TestClient, order_id: str, lines: int) -> dict[str, Any]:
    give_up = time.monotonic() + WAIT
    while True:
        body: dict[str, Any] = client.get(f"/orders/{order_id}").json()
        if body.get("state") == "succeeded" and body.get("shipped") == lines:
            return body
        if time.monotonic() > give_up:
            pytest.fail(f"order {order_id} not finished in {WAIT}s: {body}")
        time.sleep(0.05)


def test_orders_are_saved_with_their_runs_and_finished_by_the_service(dsn: str) -> None:
    with TestClient(create_app(dsn)) as client:
        made = client.post(
            "/orders", json={"order_id": "o-1", "customer": "c", "lines": ["a", "b", "c"]}
        )
        assert made.status_code == 201, made.text
        run_id = made.json()["run_id"]
        body = _until_shipped(client, "o-1", 3)
        assert body["run_id"] == run_id
        # a second order with the same id: refused, and no run of it is kept
        again = client.post("/orders", json={"order_id": "o-1", "customer": "c", "lines": ["x"]})
        assert again.status_code == 409
        assert client.get("/orders/nope").status_code == 404
    with Ledger.open(dsn) as lg:
        assert [r.run_id for r in lg.runs()] == [run_id]
        assert lg.status(run_id).state == "succeeded"
        # the follower completed the run: its complete is in the history, by the service
        complete = [t for t in lg.history(run_id) if t.command == "complete"]
        assert [t.actor_id for t in complete] == ["order-service"]
        assert lg.verify().ok


def test_many_orders_at_once(dsn: str) -> None:
    with TestClient(create_app(dsn)) as client:
        for k in range(8):
            made = client.post(
                "/orders", json={"order_id": f"o-{k}", "customer": "c", "lines": ["a", "b"]}
            )
            assert made.status_code == 201, made.text
        for k in range(8):
            _until_shipped(client, f"o-{k}", 2)
