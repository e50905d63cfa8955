"""Event streams cannot starve the server (every client on 127.0.0.1, bounded in count
and time): streams wait on the event loop, not on the request pool's threads; per-token
and global caps answer 429/503 with Retry-After; a stream outlives the request-body
deadline and ends cleanly when its time is up, at once when its token is revoked, and
when the server stops."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ledger import Ledger
from ledger.http import feed as http_feed
from ledger.http.serve import make_server
from ledger.http.streams import StreamLimits
from ledger.http.tokens import add_token, revoke_tokens
from tests.support.pgserver import free_port
from tests.support.runs import finished_run

WAIT = 60.0  # a bound on waiting, never a timing assertion


class Served:
    def __init__(self, tmp_path: Path, limits: StreamLimits, **kwargs: float) -> None:
        self.lg = Ledger.open(f"sqlite:///{tmp_path}/ledger.db")
        self.tokens = tmp_path / "tokens"
        self.token = add_token("ops", "operator", self.tokens)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.srv = make_server(
            self.lg, port=self.port, tokens_path=self.tokens, log_level="warning", **kwargs
        )
        self.srv.config.app.state.feed_hub.slots.limits = limits  # type: ignore[union-attr]
        self.thread = threading.Thread(target=self.srv.run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + WAIT
        while not self.srv.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "no uvicorn"
            time.sleep(0.02)

    def stop(self) -> None:
        self.srv.should_exit = True
        self.thread.join(WAIT)
        assert not self.thread.is_alive()
        self.lg.close()

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path, StreamLimits(per_token=60, total=60))
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _open_streams(
    s: Served, n: int, tokens: list[str]
) -> tuple[list[httpx.Response], list[httpx.Client]]:
    clients, responses = [], []
    for k in range(n):
        client = httpx.Client(timeout=WAIT)
        clients.append(client)
        request = client.build_request(
            "GET", s.url + "/events/stream", headers=s.auth(tokens[k % len(tokens)])
        )
        r = client.send(request, stream=True)
        responses.append(r)
    return responses, clients


def _close(responses: list[httpx.Response], clients: list[httpx.Client]) -> None:
    for r in responses:
        r.close()
    for c in clients:
        c.close()


def test_open_streams_hold_no_request_threads(served: Served) -> None:
    """50 streams (more than the 40 threads of the request pool) stay open while commands
    and reads are answered, and the process's threads do not grow with the streams."""
    finished_run(served.lg, 1)
    before = threading.active_count()
    responses, clients = _open_streams(served, 50, [served.token])
    try:
        assert [r.status_code for r in responses] == [200] * 50
        with httpx.Client(timeout=WAIT) as http:
            for _ in range(5):
                assert http.get(served.url + "/runs", headers=served.auth()).status_code == 200
        # the watcher thread and the streams' page readers, not a thread per stream
        assert threading.active_count() - before < 15
    finally:
        _close(responses, clients)


def test_caps_answer_429_per_token_and_503_in_all(tmp_path: Path) -> None:
    s = Served(tmp_path, StreamLimits(per_token=2, total=3))
    s.start()
    other = add_token("ann", "operator", s.tokens)
    responses, clients = _open_streams(s, 2, [s.token])
    try:
        with httpx.Client(timeout=WAIT) as http:
            r = http.get(s.url + "/events/stream", headers=s.auth())
            assert r.status_code == 429
            assert r.headers["retry-after"].isdigit()
            assert r.json()["error"] == "TooManyStreams"
            more, more_clients = _open_streams(s, 1, [other])
            responses += more
            clients += more_clients
            assert more[0].status_code == 200
            r = http.get(
                s.url + "/events/stream", headers=s.auth(add_token("bo", "operator", s.tokens))
            )
            assert r.status_code == 503
            assert r.headers["retry-after"].isdigit()
        _close(responses[:1], clients[:1])  # one ends: its slot is free again
        deadline = time.monotonic() + WAIT
        while s.srv.config.app.state.feed_hub.open_streams() > 2:  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        again, again_clients = _open_streams(s, 1, [s.token])
        responses += again
        clients += again_clients
        assert again[0].status_code == 200
    finally:
        _close(responses, clients)
        s.stop()


def test_a_stream_outlives_the_body_deadline_and_ends_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With the request-body deadline at 0.3 s, a stream still delivers a transition
    committed after it, keeps alive, and ends by itself at its lifetime with a complete
    chunked body and nothing logged as an error."""
    monkeypatch.setattr(http_feed, "STREAM_MAX_S", 2.0)
    monkeypatch.setattr(http_feed, "KEEPALIVE_S", 0.2)
    s = Served(tmp_path, StreamLimits(), read_idle_seconds=0.3, read_total_seconds=0.3)
    s.start()
    caplog.set_level(logging.ERROR)
    try:
        lines: list[str] = []
        with (
            httpx.Client(timeout=WAIT) as http,
            http.stream("GET", s.url + "/events/stream", headers=s.auth()) as r,
        ):
            assert r.status_code == 200
            # read to the stream's own end: an incomplete chunked body would raise here
            for line in r.iter_lines():
                if line.startswith(": keep-alive") and ": keep-alive" not in lines:
                    finished_run(s.lg, 1)  # committed after the body deadline passed
                lines.append(line)
        assert ": keep-alive" in lines
        assert "event: transition" in lines
    finally:
        s.stop()
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert errors == [], [rec.getMessage() for rec in errors]


def test_a_revoked_tokens_stream_ends_at_once(served: Served) -> None:
    token = add_token("temp", "operator", served.tokens)
    ended = threading.Event()
    with httpx.Client(timeout=WAIT) as http:
        with http.stream("GET", served.url + "/events/stream", headers=served.auth(token)) as r:
            assert r.status_code == 200

            def drain() -> None:
                for _ in r.iter_bytes():
                    pass
                ended.set()

            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
            assert not ended.wait(0.5)  # open while the token stands
            revoke_tokens("temp", served.tokens)
            assert ended.wait(WAIT)
            reader.join(WAIT)
        # and it is refused afresh
        assert (
            http.get(served.url + "/events/stream", headers=served.auth(token)).status_code == 401
        )


def test_streams_end_when_the_server_stops(tmp_path: Path) -> None:
    s = Served(tmp_path, StreamLimits())
    s.start()
    responses, clients = _open_streams(s, 3, [s.token])
    ended = [threading.Event() for _ in responses]

    def drain(r: httpx.Response, done: threading.Event) -> None:
        try:
            for _ in r.iter_bytes():
                pass
        except httpx.HTTPError:
            pass
        done.set()

    readers = [
        threading.Thread(target=drain, args=(r, e), daemon=True)
        for r, e in zip(responses, ended, strict=True)
    ]
    for t in readers:
        t.start()
    try:
        s.stop()
        assert all(e.wait(WAIT) for e in ended)
    finally:
        _close(responses, clients)
