"""A webhook delivery goes where its URL says and nowhere else, ends by its deadline,
and carries no lease token: a redirect is a failed attempt (never followed), a receiver
trickling its answer is cut off at the delivery's total deadline, and bodies carry the
fingerprints reads show instead of tokens. Receivers listen on 127.0.0.1 only."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ledger import Ledger
from ledger.core.visibility import FINGERPRINT_PREFIX
from ledger.feed.webhooks import body_of, post_once
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest

WAIT = 60.0  # a bound on waiting, never a timing assertion


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def elsewhere() -> Iterator[tuple[ThreadingHTTPServer, list[str]]]:
    """A second local server that records every request it gets."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(f"GET {self.path}")
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    for server in _serve(Handler):
        yield server, seen


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failed_attempt_and_is_not_followed(
    status: int, elsewhere: tuple[ThreadingHTTPServer, list[str]]
) -> None:
    target, seen = elsewhere
    location = f"http://127.0.0.1:{target.server_address[1]}/admin/drop-all-tables"

    class Redirecting(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(status)
            self.send_header("location", location)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    for server in _serve(Redirecting):
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        answer, error = post_once(url, {"content-type": "application/json"}, b"{}", 10.0)
    assert answer == status
    assert error is not None and "redirect not followed" in error and location in error
    assert seen == []


def test_a_trickling_receiver_is_cut_off_at_the_deadline() -> None:
    """The receiver sends its status line, then one header byte at a time, each well
    within a socket read timeout; the delivery still ends at its total deadline."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    cut = threading.Event()
    sent: list[int] = []

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for n in range(600):  # at most a minute of trickling
                try:
                    conn.sendall(b"x")
                except OSError:
                    break
                sent.append(n)
                if cut.wait(0.1):
                    break
            cut.set()

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        answer, error = post_once(f"http://127.0.0.1:{port}/hook", {}, b"{}", 0.5)
        cut.set()
        thread.join(WAIT)
    finally:
        listener.close()
    assert answer is None
    assert error is not None and "deadline" in error
    assert len(sent) < 600  # cut while the receiver was still trickling


def test_a_webhook_body_carries_lease_fingerprints_not_tokens() -> None:
    with Ledger.open("memory://") as lg:
        run_id = lg.submit(manifest(1), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        [lease] = lg.claim(run_id, WORKER)
        lg.accept(lease)
        transitions = lg.history(run_id)
    bodies = [body_of(t) for t in transitions]
    assert any(lease.token in json.dumps(t.to_dict()) for t in transitions)  # the raw read has it
    for body in bodies:
        assert lease.token.encode() not in body
    evidence = [json.loads(b)["data"].get("evidence") or {} for b in bodies]
    tokens = [e["lease_token"] for e in evidence if "lease_token" in e]
    assert tokens and all(t.startswith(FINGERPRINT_PREFIX) for t in tokens)
