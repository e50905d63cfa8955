"""Webhooks against a local receiver (127.0.0.1, a random port) that fails, hangs, goes
down and recovers: every transition is delivered, each signature verifies with the
Standard Webhooks reference library, order is kept, and every attempt is recorded."""

from __future__ import annotations

import base64
import secrets
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import standardwebhooks

from ledger import InvalidInput, Ledger, RunNotFound, WebhookNotFound
from ledger.core.visibility import for_reader
from ledger.feed.webhooks import (
    Dispatcher,
    add_webhook,
    deliveries,
    list_webhooks,
    remove_webhook,
    sign,
)
from tests.support.runs import OPERATOR, finished_run

WAIT = 60.0  # a bound on waiting, never a timing assertion
# the receivers here listen on this machine: the operator allows that host, and http
LOCAL = {"allow_http": True, "allow_host": "127.0.0.1", "reason": "a receiver on this machine"}

pytestmark = pytest.mark.usefixtures("webhook_key")


def _secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class Receiver:
    """An HTTP server whose answer the test sets: "fail" (500), "hang" (answers after
    the sender's timeout), "ok" (204). `stop()` and `start()` take it down and back up
    on the same port."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.mode = "ok"
        self.requests: list[tuple[dict[str, str], bytes, str]] = []  # headers, body, answer
        self._server: ThreadingHTTPServer | None = None
        self.lock = threading.Lock()

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                mode = receiver.mode
                with receiver.lock:
                    receiver.requests.append(
                        ({k.lower(): v for k, v in self.headers.items()}, body, mode)
                    )
                if mode == "hang":
                    time.sleep(1.5)
                self.send_response(500 if mode == "fail" else 204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


def _until(what: str, check: Any) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_delivery_survives_a_failing_hanging_and_down_receiver(dsn: str) -> None:
    receiver = Receiver()
    receiver.start()
    secret = _secret()
    with Ledger.open(dsn) as lg:
        finished_run(lg, 1)  # before the webhook: not sent
        hook = add_webhook(lg, OPERATOR, receiver.url, secret=secret, **LOCAL)
        assert hook.position == lg.events()[-1].position
        dispatcher = Dispatcher(lg, timeout=0.5, base_backoff=0.02, max_backoff=0.2)
        dispatcher.start()
        try:
            receiver.mode = "fail"
            runs = [finished_run(lg, 2), finished_run(lg, 1)]
            _until("3 failures", lambda: sum(r[2] == "fail" for r in receiver.requests) >= 3)
            receiver.mode = "hang"
            _until("2 timeouts", lambda: sum(r[2] == "hang" for r in receiver.requests) >= 2)
            receiver.stop()  # down: connections refused
            failed = len(deliveries(lg, hook.webhook_id, limit=10_000))
            _until(
                "refused attempts",
                lambda: len(deliveries(lg, hook.webhook_id, limit=10_000)) >= failed + 3,
            )
            receiver.mode = "ok"
            receiver.start()
            runs.append(finished_run(lg, 3))
            wanted = lg.events(after=hook.position)
            _until(
                "everything delivered",
                lambda: list_webhooks(lg)[0].position == wanted[-1].position,
            )
        finally:
            dispatcher.stop()
            receiver.stop()

    verifier = standardwebhooks.Webhook(secret)
    for headers, body, _ in receiver.requests:
        doc = verifier.verify(body, headers)  # raises unless the signature is right
        assert headers["webhook-id"] == f"evt_{doc['data']['position']}"
    answered = [
        verifier.verify(body, headers)["data"]
        for headers, body, mode in receiver.requests
        if mode == "ok"
    ]
    # every transition after the webhook was added, once answered, in position order, with
    # lease tokens as the fingerprints reads show (a receiver holds no lease)
    assert answered == for_reader([t.to_dict() for t in wanted], None)
    for run_id in runs:
        mine = [d["position"] for d in answered if d["run_id"] == run_id]
        assert mine == sorted(mine) and mine
    # every attempt recorded: the 500s, the timeouts and refusals (no status), the 2xx
    with Ledger.open(dsn) as again:
        attempts = deliveries(again, hook.webhook_id, limit=10_000)
    statuses = {a.status for a in attempts}
    assert {500, None, 204} <= statuses
    assert sum(a.ok for a in attempts) == len(wanted)
    assert all(a.error for a in attempts if not a.ok)
    first = min(t.position for t in wanted)
    assert max(a.attempt for a in attempts if a.position == first) >= 7


def test_signature_is_the_standard_webhooks_one() -> None:
    secret = _secret()
    key = base64.b64decode(secret.removeprefix("whsec_"))
    body = b'{"type":"run.queued"}'
    ours = sign(key, "evt_1", 1_700_000_000, body)
    theirs = standardwebhooks.Webhook(secret).sign(
        "evt_1", datetime.fromtimestamp(1_700_000_000, UTC), body.decode()
    )
    assert ours == theirs


def test_bad_webhooks_are_refused_and_nothing_is_written(dsn: str) -> None:
    with Ledger.open(dsn) as lg:
        finished_run(lg, 1)
        for url in ("ftp://x/", "not a url", "http://", "", "http://h/" + "x" * 2001):
            with pytest.raises(InvalidInput):
                add_webhook(lg, OPERATOR, url, secret=_secret(), **LOCAL)
        for secret in ("", "whsec_!!!", "whsec_" + base64.b64encode(b"short").decode()):
            with pytest.raises(InvalidInput):
                add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", secret=secret, **LOCAL)
        with pytest.raises(InvalidInput):
            add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", kinds=["bogus"], **LOCAL)
        with pytest.raises(RunNotFound):
            add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", run_id="nope", **LOCAL)
        with pytest.raises(WebhookNotFound):
            remove_webhook(lg, OPERATOR, "wh_nope", reason="gone")
        assert list_webhooks(lg) == []
        hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", kinds=["succeeded"], **LOCAL)
        assert [h.webhook_id for h in list_webhooks(lg)] == [hook.webhook_id]
        remove_webhook(lg, OPERATOR, hook.webhook_id, reason="done")
        assert list_webhooks(lg) == []
