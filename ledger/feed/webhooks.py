"""Webhooks: a built-in follower per webhook that POSTs each transition, signed.

Signing follows Standard Webhooks (standardwebhooks.com): headers `webhook-id` (the
message id, `evt_<position>`: the same on every retry, so receivers deduplicate on
it), `webhook-timestamp` (Unix seconds of the attempt) and `webhook-signature`
(`v1,` + base64 HMAC-SHA256 over `{id}.{timestamp}.{body}` with the secret's bytes:
a `whsec_<base64>` secret is base64-decoded, as the reference libraries do).

Each transition is posted until the receiver answers 2xx, retried with exponential
backoff (doubling up to `max_backoff` seconds) without moving on, so the receiver
sees each run's transitions in order, and a receiver down for an hour gets
everything afterwards. Every attempt is recorded (`ledger webhooks deliveries`).
A transition already delivered (a restart after the POST) is not posted again;
a crash between the POST and its record posts it once more (at least once).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import http.client
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ledger.core.errors import InvalidInput, LedgerError, WebhookNotFound
from ledger.core.rows import iso, parse_dt
from ledger.core.validation import check_identifier
from ledger.core.views import Transition, _View
from ledger.core.visibility import for_reader
from ledger.feed.checkpoints import checkpoint, ensure
from ledger.feed.follower import Follower
from ledger.feed.sql import SQL
from ledger.reads import feed

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

log = logging.getLogger("ledger.feed.webhooks")

MAX_URL = 2000
MIN_SECRET_BYTES = 16
FOLLOWER_PREFIX = "webhook:"
REFRESH_S = 2.0  # the dispatcher looks for added and removed webhooks this often


@dataclass(frozen=True)
class Webhook(_View):
    """A webhook: where transitions go, which ones, and how far delivery has got."""

    webhook_id: str
    url: str
    run_id: str | None
    kinds: list[str]
    created_at: datetime | None
    position: int  # every matching transition up to here has been delivered


@dataclass(frozen=True)
class Delivery(_View):
    """One delivery attempt: what the receiver answered, when."""

    webhook_id: str
    position: int
    attempt: int
    message_id: str
    status: int | None  # the HTTP status; None when no answer came (refused, timed out)
    ok: bool
    error: str | None
    at: datetime | None
    duration_ms: int


def secret_key(secret: Any) -> bytes:
    """The HMAC key of a secret: `whsec_<base64>` (or bare base64), at least 16 bytes."""
    if not isinstance(secret, str) or not secret:
        raise InvalidInput("the webhook secret must be text: whsec_<base64>")
    text = secret.strip().removeprefix("whsec_")
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            "the webhook secret must be whsec_ followed by base64 (Standard Webhooks); e.g. "
            'python -c \'import base64,secrets; print("whsec_" + '
            "base64.b64encode(secrets.token_bytes(32)).decode())'"
        ) from None
    if len(key) < MIN_SECRET_BYTES:
        raise InvalidInput(f"the webhook secret must hold at least {MIN_SECRET_BYTES} bytes")
    return key


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value."""
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def message_id(t: Transition) -> str:
    return f"evt_{t.position}"


def body_of(t: Transition) -> bytes:
    """The POSTed document: `type` (`run.<state>` or `item.<state>`), `timestamp`, `data`."""
    doc = {
        "type": f"{'item' if t.item_id is not None else 'run'}.{t.to_state}",
        "timestamp": t.at.isoformat(),
        # a receiver is no lease holder: lease tokens go as their fingerprints, as in reads
        "data": for_reader([t.to_dict()], None)[0],
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise InvalidInput(f"the webhook URL must be 1-{MAX_URL} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"the webhook URL must be http:// or https:// with a host, not {url!r}")
    return url


def add_webhook(
    lg: Ledger,
    url: str,
    secret: str,
    run_id: str | None = None,
    kinds: Any = None,
    after: int | None = None,
) -> Webhook:
    """Register a webhook; it is sent the matching transitions after `after` (default:
    the feed's head now, so only what happens from here on)."""
    url = _check_url(url)
    secret_key(secret)
    flt = feed.FeedFilter.of(run_id, kinds)
    start = None if after is None else feed.check_position(after)
    webhook_id = "wh_" + uuid.uuid4().hex[:16]
    with lg.store.write() as tx:
        if flt.run_id is not None:
            feed.check_run(tx, flt.run_id)
        position = feed.head(tx) if start is None else start
        now = iso(tx.now())
        tx.execute(
            SQL.sql(tx, "add_webhook"),
            (webhook_id, url, secret.strip(), flt.run_id, flt.kinds_json(), now),
        )
        ensure(tx, FOLLOWER_PREFIX + webhook_id, flt, position)
    return get_webhook(lg, webhook_id)


def _webhook(row: dict[str, Any], position: int | None) -> Webhook:
    return Webhook(
        webhook_id=row["webhook_id"],
        url=row["url"],
        run_id=row["run_id"],
        kinds=json.loads(row["kinds"]) if row["kinds"] else [],
        created_at=parse_dt(row["created_at"]),
        position=position or 0,
    )


def get_webhook(lg: Ledger, webhook_id: str) -> Webhook:
    check_identifier(webhook_id, "webhook_id")
    with lg.store.read() as tx:
        row = tx.fetchone(SQL.sql(tx, "webhook"), (webhook_id,))
        if row is None:
            raise WebhookNotFound(webhook_id)
        return _webhook(row, checkpoint(tx, FOLLOWER_PREFIX + webhook_id))


def list_webhooks(lg: Ledger) -> list[Webhook]:
    """Every webhook, oldest first, with its delivery position."""
    with lg.store.read() as tx:
        rows = tx.fetchall(SQL.sql(tx, "webhooks"))
        return [_webhook(r, checkpoint(tx, FOLLOWER_PREFIX + r["webhook_id"])) for r in rows]


def remove_webhook(lg: Ledger, webhook_id: str) -> None:
    """Stop delivering to a webhook; its delivery records stay."""
    check_identifier(webhook_id, "webhook_id")
    with lg.store.write() as tx:
        gone = tx.fetchall(SQL.sql(tx, "remove_webhook"), (webhook_id,))
        if not gone:
            raise WebhookNotFound(webhook_id)
        tx.execute(SQL.sql(tx, "remove_follower"), (FOLLOWER_PREFIX + webhook_id,))


def deliveries(lg: Ledger, webhook_id: str | None = None, limit: int = 100) -> list[Delivery]:
    """Delivery attempts, newest first (of one webhook, or all)."""
    limit = feed.check_limit(limit)
    if webhook_id is not None:
        check_identifier(webhook_id, "webhook_id")
    with lg.store.read() as tx:
        if webhook_id is None:
            rows = tx.fetchall(SQL.sql(tx, "deliveries"), (limit,))
        else:
            rows = tx.fetchall(SQL.sql(tx, "deliveries_of_webhook"), (webhook_id, limit))
    return [
        Delivery(
            webhook_id=r["webhook_id"],
            position=int(r["position"]),
            attempt=int(r["attempt"]),
            message_id=r["message_id"],
            status=r["status"],
            ok=bool(r["ok"]),
            error=r["error"],
            at=parse_dt(r["at"]),
            duration_ms=int(r["duration_ms"]),
        )
        for r in rows
    ]


class _Stopped(Exception):
    """The dispatcher is stopping, or the webhook was removed."""


class Dispatcher:
    """Delivers to every webhook, one thread (and one follower) per webhook, until
    `stop()`. `timeout`: seconds a receiver has to answer; backoff from `base_backoff`
    doubling to `max_backoff` seconds."""

    def __init__(
        self,
        lg: Ledger,
        timeout: float = 10.0,
        base_backoff: float = 0.5,
        max_backoff: float = 300.0,
        batch: int = 100,
    ) -> None:
        self.lg = lg
        self.timeout = timeout
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.batch = batch
        self._stop = threading.Event()
        self._threads: dict[str, tuple[threading.Thread, Follower]] = {}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Deliver in a background thread (what `ledger serve` does)."""
        self._thread = threading.Thread(target=self.run, name="ledger-webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for _, follower in list(self._threads.values()):
            follower.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.timeout + 5)
        for thread, _ in list(self._threads.values()):
            thread.join(timeout=self.timeout + 5)

    def run(self) -> None:
        """Until `stop()`: start a delivering thread for each webhook, end the thread of
        each removed one."""
        while not self._stop.is_set():
            try:
                hooks = {h.webhook_id: h for h in list_webhooks(self.lg)}
            except LedgerError as e:
                log.warning("webhooks: cannot list webhooks: %s", e)
                hooks = {}
            for webhook_id, (thread, follower) in list(self._threads.items()):
                if webhook_id not in hooks:
                    follower.stop()
                if not thread.is_alive():
                    del self._threads[webhook_id]
            for webhook_id in hooks:
                if webhook_id not in self._threads:
                    self._spawn(webhook_id)
            self._stop.wait(REFRESH_S)

    def _spawn(self, webhook_id: str) -> None:
        with self.lg.store.read() as tx:
            row = tx.fetchone(SQL.sql(tx, "webhook"), (webhook_id,))
        if row is None:
            return
        key = secret_key(row["secret"])
        kinds = json.loads(row["kinds"]) if row["kinds"] else None
        url = row["url"]

        def handler(found: list[Transition]) -> None:
            for t in found:
                self._deliver(webhook_id, url, key, t)

        follower = Follower(
            self.lg,
            FOLLOWER_PREFIX + webhook_id,
            handler,
            run_id=row["run_id"],
            kinds=kinds,
            batch=self.batch,
            in_database=False,
            wait=True,
            stop=self._stop,  # the dispatcher's stop ends the follower's waits too
        )

        def loop() -> None:
            try:
                follower.run()
            except _Stopped:
                pass
            except LedgerError as e:  # removed meanwhile, lost its lock, database down
                log.warning("webhook %s: delivery stopped: %s", webhook_id, e)
            finally:
                follower.close()

        thread = threading.Thread(target=loop, name=f"webhook-{webhook_id}", daemon=True)
        self._threads[webhook_id] = (thread, follower)
        thread.start()

    def _deliver(self, webhook_id: str, url: str, key: bytes, t: Transition) -> None:
        """POST one transition until a 2xx answer (or stop), recording each attempt."""
        with self.lg.store.read() as tx:
            row = tx.fetchone(SQL.sql(tx, "delivery_tries"), (webhook_id, t.position))
        if row is not None and row["ok"]:
            return  # delivered before a restart
        attempt = int(row["n"] or 0) if row is not None else 0
        delay = self.base_backoff
        body = body_of(t)
        msg_id = message_id(t)
        while True:
            if self._stop.is_set():
                raise _Stopped
            attempt += 1
            status, error, ms = self._post(url, key, msg_id, body)
            ok = status is not None and 200 <= status < 300
            with self.lg.store.write() as tx:
                tx.execute(
                    SQL.sql(tx, "record_delivery"),
                    (
                        webhook_id,
                        t.position,
                        attempt,
                        msg_id,
                        status,
                        int(ok),
                        error,
                        iso(tx.now()),
                        ms,
                    ),
                )
                if not ok and tx.fetchone(SQL.sql(tx, "webhook_exists"), (webhook_id,)) is None:
                    raise _Stopped
            if ok:
                return
            log.info("webhook %s: %s attempt %d failed: %s", webhook_id, msg_id, attempt, error)
            if self._stop.wait(delay):
                raise _Stopped
            delay = min(delay * 2, self.max_backoff)

    def _post(
        self, url: str, key: bytes, msg_id: str, body: bytes
    ) -> tuple[int | None, str | None, int]:
        """(status, error, milliseconds) of one POST, signed at the time it is made.

        `timeout` bounds the whole delivery (connect, send, answer), not each socket
        read: a receiver trickling its answer is cut off at the deadline and the attempt
        fails. A redirect is never followed: a 3xx is a failed attempt (the receiver did
        not take the body, and a signed request must not go where the URL does not say)."""
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "run-ledger-webhooks",
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(key, msg_id, timestamp, body),
        }
        started = time.monotonic()
        status, error = post_once(url, headers, body, self.timeout)
        ms = int((time.monotonic() - started) * 1000)
        return status, error, ms


ANSWER_BYTES = 65536  # of a receiver's answer, read and dropped


def post_once(
    url: str, headers: dict[str, str], body: bytes, deadline_s: float
) -> tuple[int | None, str | None]:
    """POST `body` to `url` once: (status, error). No redirect is followed; the whole
    exchange ends by `deadline_s` seconds (the connection is shut at the deadline)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, f"not an http(s) URL: {url!r}"[:500]
    conn_type = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_type(parts.hostname, parts.port, timeout=deadline_s)
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(deadline_s, cut)
    timer.daemon = True
    timer.start()
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    try:
        conn.request("POST", target, body=body, headers=headers)
        response = conn.getresponse()
        status = int(response.status)
        response.read(ANSWER_BYTES)
    except (http.client.HTTPException, OSError, ValueError) as e:
        if expired.is_set():
            return None, f"no complete answer within the delivery deadline of {deadline_s:g} s"
        return None, f"{type(e).__name__}: {e}"[:500]
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():
        return None, f"no complete answer within the delivery deadline of {deadline_s:g} s"
    if 300 <= status < 400:
        where = response.getheader("location") or "no location"
        return status, f"HTTP {status}: redirect not followed ({where[:200]})"
    if not 200 <= status < 300:
        return status, f"HTTP {status}"
    return status, None
