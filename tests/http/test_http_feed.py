"""The change feed over HTTP on SQLite and PostgreSQL: `GET /events` pages by position
with the same auth as every read; `GET /events/stream` sends each transition as a
Server-Sent Event whose id is its position, and `Last-Event-ID` resumes after it."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from ledger import Ledger
from ledger.http import add_token, create_app
from ledger.http.serve import make_server
from ledger.http.visibility import for_reader
from tests.support.runs import finished_run

WAIT = 30.0  # a bound on waiting, never a timing assertion


def test_events_pages_by_position_with_the_read_auth(dsn: str, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    token = add_token("olga", "operator", tokens)
    with Ledger.open(dsn) as lg:
        a = finished_run(lg, 2)
        finished_run(lg, 1)
        client = TestClient(create_app(lg, tokens_path=tokens))
        auth = {"Authorization": f"Bearer {token}"}
        assert client.get("/events").status_code == 401
        assert client.get("/events", headers={"Authorization": "Bearer nope"}).status_code == 401
        every = [t.to_dict() for t in lg.events()]
        got: list[dict[str, Any]] = []
        after = 0
        while True:
            r = client.get("/events", params={"after": after, "limit": 3}, headers=auth)
            assert r.status_code == 200
            page = r.json()["items"]
            got += page
            after = r.json()["next"]
            assert r.headers["X-Next-After"] == str(after)
            if len(page) < 3:
                break
        assert got == every
        assert after == every[-1]["position"]
        r = client.get("/events", params={"run_id": a, "kind": ["accepted"]}, headers=auth)
        assert [t["to_state"] for t in r.json()["items"]] == ["accepted", "accepted"]
        for bad in ({"after": -1}, {"after": 2**63}, {"kind": "bogus"}, {"limit": 0}):
            r = client.get("/events", params=bad, headers=auth)
            assert r.status_code == 422, bad
            assert r.json()["error"] == "InvalidInput"
        assert client.get("/events", params={"run_id": "nope"}, headers=auth).status_code == 404
        assert (
            client.get("/events/stream", params={"kind": "bogus"}, headers=auth).status_code == 422
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def server(dsn: str, tmp_path: Path) -> Iterator[tuple[str, Ledger]]:
    lg = Ledger.open(dsn)
    port = _free_port()
    srv = make_server(
        lg, port=port, public_reads=True, tokens_path=tmp_path / "t", log_level="warning"
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while not srv.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}", lg
    finally:
        srv.should_exit = True
        thread.join(WAIT)
        lg.close()


def _read_events(response: httpx.Response, n: int) -> list[tuple[int, dict[str, Any]]]:
    out: list[tuple[int, dict[str, Any]]] = []
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if "data" in event:
                assert event.get("event") == "transition"
                out.append((int(event["id"]), json.loads(event["data"])))
                if len(out) == n:
                    return out
            event = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(": ")
            event[field] = value
    return out


def test_the_stream_sends_commits_as_they_happen_and_resumes(server: tuple[str, Ledger]) -> None:
    url, lg = server
    before = finished_run(lg, 1)
    head = lg.events()[-1].position
    with httpx.Client(timeout=WAIT) as http:
        with http.stream("GET", url + "/events/stream") as r:  # from now on
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            timer = threading.Timer(0.2, lambda: finished_run(lg, 2))
            timer.start()
            got = _read_events(r, 3)
            timer.join()
        fresh = lg.events(after=head)
        assert [p for p, _ in got] == [t.position for t in fresh[:3]]
        # an anonymous reader (--public-reads) sees lease tokens as fingerprints
        assert [d for _, d in got] == for_reader([t.to_dict() for t in fresh[:3]], None)
        assert all(d["run_id"] != before for _, d in got)
        # a reconnect with Last-Event-ID starts right after it
        resume = got[1][0]
        with http.stream(
            "GET",
            url + "/events/stream",
            params={"limit": 2},
            headers={"Last-Event-ID": str(resume)},
        ) as r:
            again = _read_events(r, 2)
        assert [p for p, _ in again] == [t.position for t in fresh[2:4]]
        # a filtered stream from the start, ended by limit
        with http.stream(
            "GET", url + "/events/stream", params={"after": 0, "kind": "succeeded", "limit": 2}
        ) as r:
            done = _read_events(r, 2)
        assert [d["to_state"] for _, d in done] == ["succeeded", "succeeded"]
        r = http.get(url + "/events/stream", headers={"Last-Event-ID": "-5"})
        assert r.status_code == 422
