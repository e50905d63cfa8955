"""Webhooks: a built-in follower per webhook that POSTs each transition, signed.

Signing follows Standard Webhooks (standardwebhooks.com): headers `webhook-id` (the
message id, `evt_<position>`: the same on every retry, so receivers deduplicate on
it), `webhook-timestamp` (Unix seconds of the attempt) and `webhook-signature`
(`v1,` + base64 HMAC-SHA256 over `{id}.{timestamp}.{body}` with the secret's bytes:
a `whsec_<base64>` secret is base64-decoded, as the reference libraries do).

A webhook has an owner: adding, changing (URL, policy, a new secret) and removing one are
operator commands with a reason, each an event of the webhook's own stream in the event
log (who, role, why, when, and what the webhook then was: ledger/core/webhook_events.py),
appended in the transaction that makes the change, hash-chained like a run's events, in
`audit` beside the runs' transitions and in `lg_webhook_changes` (`ledger webhooks
changes`). Its URL is held to a policy (`webhook_policy`), checked
then and before every delivery; its signing secret is stored encrypted with a key
outside the database (`webhook_secrets`) and shown once, when it is made.

Each transition is posted until the receiver answers 2xx, retried with exponential
backoff (doubling up to `max_backoff` seconds) without moving on, so the receiver
sees each run's transitions in order, and a receiver down for an hour gets
everything afterwards. Every attempt is recorded (`ledger webhooks deliveries`).
A transition already delivered (a restart after the POST) is not posted again;
a crash between the POST and its record posts it once more (at least once).
"""

from __future__ import annotations

import base64
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
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from eventsourcing.persistence import StoredEvent

from ledger.commands.uow import commit_stream_events
from ledger.core import args as A
from ledger.core.errors import InvalidInput, LedgerError, NotAuthorized, WebhookNotFound
from ledger.core.rows import iso, parse_dt
from ledger.core.validation import check_identifier
from ledger.core.views import Actor, Transition, _View
from ledger.core.visibility import for_reader
from ledger.core.webhook_events import EVENT_OF_COMMAND, ROLES, webhook_stream_id
from ledger.feed import webhook_secrets as secrets
from ledger.feed.checkpoints import checkpoint, ensure
from ledger.feed.follower import Follower
from ledger.feed.sql import SQL
from ledger.feed.webhook_policy import UrlPolicy, check_allow_host, check_target, check_url
from ledger.feed.webhook_secrets import secret_key
from ledger.projections.writer import Projector
from ledger.reads import feed
from ledger.stores.raw import last_event

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger
    from ledger.stores.base import Tx

log = logging.getLogger("ledger.feed.webhooks")

MAX_URL = 2000
FOLLOWER_PREFIX = "webhook:"
REFRESH_S = 2.0  # the dispatcher looks for added and removed webhooks this often
ROTATION_GRACE_S = 86_400.0  # a replaced secret still signs for this long, by default
MAX_GRACE_S = 30 * 86_400.0

__all__ = [
    "Delivery",
    "Dispatcher",
    "Webhook",
    "WebhookChange",
    "add_webhook",
    "body_of",
    "change_webhook",
    "deliveries",
    "get_webhook",
    "list_webhooks",
    "post_once",
    "rekey_webhooks",
    "remove_webhook",
    "secret_key",
    "sign",
    "webhook_changes",
]


@dataclass(frozen=True)
class Webhook(_View):
    """A webhook: where transitions go, which ones, and how far delivery has got.

    `secret` is set only in what `add_webhook` and a rotating `change_webhook` return:
    the new signing secret, shown that once; every read leaves it None and shows its
    fingerprint."""

    webhook_id: str
    url: str
    run_id: str | None
    kinds: list[str]
    created_at: datetime | None
    position: int  # every matching transition up to here has been delivered
    allow_http: bool = False
    allow_host: str | None = None
    updated_at: datetime | None = None
    secret_fingerprint: str | None = None
    secret: str | None = None


@dataclass(frozen=True)
class WebhookChange(_View):
    """One recorded command on a webhook: who, in which role, why, when, and what the
    webhook was after it (`command`: add, change, rotate, remove, rekey). `position` is
    its event's in the event log (None: recorded before the log held webhook changes)."""

    webhook_id: str
    version: int
    command: str
    actor_id: str
    role: str
    reason: str
    at: datetime | None
    url: str
    run_id: str | None
    kinds: list[str]
    allow_http: bool
    allow_host: str | None
    secret_fingerprint: str | None
    position: int | None = None


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


# -- the commands --------------------------------------------------------------------


def _operator(actor: Any, command: str) -> Actor:
    who = A.actor(actor)
    if who.role not in ROLES:
        raise NotAuthorized(
            f"role {who.role!r} may not {command} webhooks; allowed: {', '.join(ROLES)}"
        )
    return who


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be true or false, not {value!r}")
    return value


def _record(
    tx: Tx, actor: Actor, command: str, reason: str, row: dict[str, Any], secret: str | None
) -> None:
    """The command as the next event of the webhook's stream (ledger/core/webhook_events.py),
    with the webhook as it now is: appended, hash-chained and projected into
    lg_webhook_changes in this transaction, as a run's command appends its events."""
    stream = webhook_stream_id(row["webhook_id"])
    last = last_event(tx, stream)
    now = tx.now()
    if last is not None:  # a stream's times never go backwards (a clock stepped back)
        before = tx.store.decode(
            StoredEvent(stream, last.version, last.topic, last.state)
        ).timestamp
        now = max(now, before)
    event = EVENT_OF_COMMAND[command](
        originator_id=stream,
        originator_version=(last.version if last is not None else 0) + 1,
        timestamp=now,
        webhook_id=row["webhook_id"],
        command=command,
        actor_id=actor.id,
        role=actor.role,
        reason=reason,
        url=row["url"],
        run_filter=row["run_id"],
        kinds=json.loads(row["kinds"]) if row["kinds"] else [],
        allow_http=bool(row["allow_http"]),
        allow_host=row["allow_host"],
        secret_fingerprint=None if secret is None else secrets.fingerprint(secret),
    )
    commit_stream_events(tx, Projector(), [event])


def add_webhook(
    lg: Ledger,
    actor: Actor,
    url: str,
    *,
    reason: str,
    secret: str | None = None,
    run_id: str | None = None,
    kinds: Any = None,
    after: int | None = None,
    allow_http: bool = False,
    allow_host: str | None = None,
) -> Webhook:
    """Register a webhook (operator role, with a reason); it is sent the matching
    transitions after `after` (default: the feed's head now, so only what happens from
    here on). The URL is held to the policy (`ledger.feed.webhook_policy`): https, and a
    host whose addresses are all public unless `allow_host` names it; plain http only
    with `allow_http`. Without `secret` the ledger makes one. The secret is stored
    encrypted and returned in `Webhook.secret` this once."""
    policy = UrlPolicy(_flag(allow_http, "allow_http"), check_allow_host(allow_host))
    reason = A.reason(reason, required=True)
    check_url(url, policy)
    if secret is not None:
        secret_key(secret)
        secret = secret.strip()
    flt = feed.FeedFilter.of(run_id, kinds)
    start = None if after is None else feed.check_position(after)
    actor = _operator(actor, "add")
    check_target(url, policy)  # its host's addresses, now
    secret = secret or secrets.new_secret()
    stored = secrets.seal(secret)  # before anything is written: a key must be configured
    webhook_id = "wh_" + uuid.uuid4().hex[:16]
    with lg.store.write() as tx:
        if flt.run_id is not None:
            feed.check_run(tx, flt.run_id)
        position = feed.head(tx) if start is None else start
        now = iso(tx.now())
        tx.execute(
            SQL.sql(tx, "add_webhook"),
            (
                webhook_id,
                url,
                stored,
                flt.run_id,
                flt.kinds_json(),
                now,
                int(policy.allow_http),
                policy.allow_host,
                now,
            ),
        )
        ensure(tx, FOLLOWER_PREFIX + webhook_id, flt, position)
        row = tx.fetchone(SQL.sql(tx, "webhook"), (webhook_id,))
        assert row is not None
        _record(tx, actor, "add", reason, row, secret)
    return _webhook(row, position, secret=secret)


_UNCHANGED: Any = object()


def change_webhook(
    lg: Ledger,
    actor: Actor,
    webhook_id: str,
    *,
    reason: str,
    url: str | None = None,
    allow_http: bool | None = None,
    allow_host: str | None = _UNCHANGED,
    rotate_secret: bool = False,
    secret: str | None = None,
    grace_seconds: float = ROTATION_GRACE_S,
) -> Webhook:
    """Change a webhook's URL or policy, or give it a new signing secret (operator role,
    with a reason). `allow_host=None` takes an allowed host back. `rotate_secret` makes a
    new secret (or takes `secret`), returned in `Webhook.secret` this once; deliveries
    are signed with both the new and the replaced secret for `grace_seconds` (Standard
    Webhooks: a receiver accepts either signature), so the receiver can switch over."""
    check_identifier(webhook_id, "webhook_id")
    reason = A.reason(reason, required=True)
    if allow_http is not None:
        _flag(allow_http, "allow_http")
    if allow_host is not _UNCHANGED:
        allow_host = check_allow_host(allow_host)
    _flag(rotate_secret, "rotate_secret")
    if secret is not None:
        secret_key(secret)
        secret = secret.strip()
        rotate_secret = True
    if (
        isinstance(grace_seconds, bool)
        or not isinstance(grace_seconds, (int, float))
        or not 0 <= grace_seconds <= MAX_GRACE_S
    ):
        raise InvalidInput(f"grace_seconds must be a number from 0 to {MAX_GRACE_S:g}")
    if url is None and allow_http is None and allow_host is _UNCHANGED and not rotate_secret:
        raise InvalidInput("nothing to change: give a url, allow_http, allow_host or a new secret")
    with lg.store.read() as tx:
        if tx.fetchone(SQL.sql(tx, "webhook"), (webhook_id,)) is None:
            raise WebhookNotFound(webhook_id)
    actor = _operator(actor, "change")
    new_secret = (secret or secrets.new_secret()) if rotate_secret else None
    with lg.store.write() as tx:
        row = tx.fetchone(SQL.sql(tx, "webhook_locked"), (webhook_id,))
        if row is None:
            raise WebhookNotFound(webhook_id)
        policy = UrlPolicy(
            bool(row["allow_http"]) if allow_http is None else allow_http,
            row["allow_host"] if allow_host is _UNCHANGED else allow_host,
        )
        target = row["url"] if url is None else url
        check_target(target, policy)  # the URL and policy as they will be, resolved now
        now = tx.now()
        stored, previous, until = row["secret"], row["previous_secret"], row["previous_until"]
        if new_secret is not None:
            previous = secrets.reseal(stored) if grace_seconds > 0 else None
            until = iso(now + timedelta(seconds=grace_seconds)) if grace_seconds > 0 else None
            stored = secrets.seal(new_secret)
        tx.execute(
            SQL.sql(tx, "change_webhook"),
            (
                target,
                stored,
                int(policy.allow_http),
                policy.allow_host,
                previous,
                until,
                iso(now),
                webhook_id,
            ),
        )
        row = tx.fetchone(SQL.sql(tx, "webhook"), (webhook_id,))
        assert row is not None
        command = "rotate" if new_secret is not None else "change"
        _record(tx, actor, command, reason, row, _secret_or_none(row["secret"]))
        position = checkpoint(tx, FOLLOWER_PREFIX + webhook_id)
    return _webhook(row, position, secret=new_secret)


def remove_webhook(lg: Ledger, actor: Actor, webhook_id: str, *, reason: str) -> None:
    """Stop delivering to a webhook (operator role, with a reason); its delivery records
    and its recorded changes stay."""
    check_identifier(webhook_id, "webhook_id")
    reason = A.reason(reason, required=True)
    with lg.store.read() as tx:
        if tx.fetchone(SQL.sql(tx, "webhook"), (webhook_id,)) is None:
            raise WebhookNotFound(webhook_id)
    actor = _operator(actor, "remove")
    with lg.store.write() as tx:
        row = tx.fetchone(SQL.sql(tx, "webhook_locked"), (webhook_id,))
        if row is None:
            raise WebhookNotFound(webhook_id)
        _record(tx, actor, "remove", reason, row, _secret_or_none(row["secret"]))
        tx.execute(SQL.sql(tx, "remove_webhook"), (webhook_id,))
        tx.execute(SQL.sql(tx, "remove_follower"), (FOLLOWER_PREFIX + webhook_id,))


def rekey_webhooks(lg: Ledger, actor: Actor, *, reason: str) -> int:
    """Encrypt every stored secret (a plaintext one from before encryption too) with the
    first configured key, after a key rotation (operator role, with a reason); returns
    how many webhooks it re-encrypted. Then the old key can be dropped."""
    reason = A.reason(reason, required=True)
    actor = _operator(actor, "rekey")
    with lg.store.write() as tx:
        rows = tx.fetchall(SQL.sql(tx, "webhook_secrets"))
        for r in rows:
            previous = r["previous_secret"]
            tx.execute(
                SQL.sql(tx, "reseal_webhook"),
                (
                    secrets.reseal(r["secret"]),
                    None if previous is None else secrets.reseal(previous),
                    r["webhook_id"],
                ),
            )
            row = tx.fetchone(SQL.sql(tx, "webhook"), (r["webhook_id"],))
            assert row is not None
            _record(tx, actor, "rekey", reason, row, secrets.unseal(row["secret"]))
    return len(rows)


def _secret_or_none(stored: str) -> str | None:
    """The secret of a stored form, for its fingerprint; None when no key opens it."""
    try:
        return secrets.unseal(stored)
    except InvalidInput:
        return None


# -- the reads -----------------------------------------------------------------------


def _webhook(row: dict[str, Any], position: int | None, secret: str | None = None) -> Webhook:
    shown = secret if secret is not None else _secret_or_none(row["secret"])
    return Webhook(
        webhook_id=row["webhook_id"],
        url=row["url"],
        run_id=row["run_id"],
        kinds=json.loads(row["kinds"]) if row["kinds"] else [],
        created_at=parse_dt(row["created_at"]),
        position=position or 0,
        allow_http=bool(row.get("allow_http")),
        allow_host=row.get("allow_host"),
        updated_at=parse_dt(row.get("updated_at") or row["created_at"]),
        secret_fingerprint=None if shown is None else secrets.fingerprint(shown),
        secret=secret,
    )


def get_webhook(lg: Ledger, webhook_id: str) -> Webhook:
    """One webhook, without its secret (its fingerprint only)."""
    check_identifier(webhook_id, "webhook_id")
    with lg.store.read() as tx:
        row = tx.fetchone(SQL.sql(tx, "webhook"), (webhook_id,))
        if row is None:
            raise WebhookNotFound(webhook_id)
        return _webhook(row, checkpoint(tx, FOLLOWER_PREFIX + webhook_id))


def list_webhooks(lg: Ledger) -> list[Webhook]:
    """Every webhook, oldest first, with its delivery position (never its secret)."""
    with lg.store.read() as tx:
        rows = tx.fetchall(SQL.sql(tx, "webhooks"))
        return [_webhook(r, checkpoint(tx, FOLLOWER_PREFIX + r["webhook_id"])) for r in rows]


def webhook_changes(
    lg: Ledger, webhook_id: str | None = None, limit: int = 100
) -> list[WebhookChange]:
    """The recorded commands on webhooks, newest first (of one webhook, or all)."""
    limit = feed.check_limit(limit)
    with lg.store.read() as tx:
        if webhook_id is None:
            rows = tx.fetchall(SQL.sql(tx, "webhook_changes"), (limit,))
        else:
            check_identifier(webhook_id, "webhook_id")
            rows = tx.fetchall(SQL.sql(tx, "webhook_changes_of_webhook"), (webhook_id, limit))
    return [
        WebhookChange(
            webhook_id=r["webhook_id"],
            version=int(r["version"]),
            command=r["command"],
            actor_id=r["actor_id"],
            role=r["role"],
            reason=r["reason"],
            at=parse_dt(r["at"]),
            url=r["url"],
            run_id=r["run_id"],
            kinds=json.loads(r["kinds"]) if r["kinds"] else [],
            allow_http=bool(r["allow_http"]),
            allow_host=r["allow_host"],
            secret_fingerprint=r["secret_fingerprint"],
            position=None if r.get("position") is None else int(r["position"]),
        )
        for r in rows
    ]


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


# -- delivery ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """Where and how one attempt goes, read from the webhook's row just before it."""

    url: str
    policy: UrlPolicy
    keys: list[bytes]  # the current secret's, then a replaced one's still in its grace


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
        kinds = json.loads(row["kinds"]) if row["kinds"] else None

        def handler(found: list[Transition]) -> None:
            for t in found:
                self._deliver(webhook_id, t)

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

    def _target(self, webhook_id: str) -> _Target:
        """The webhook as it is now (a change applies from the next attempt on), its
        secrets decrypted; _Stopped when it was removed."""
        with self.lg.store.read() as tx:
            row = tx.fetchone(SQL.sql(tx, "webhook"), (webhook_id,))
            now = tx.now()
        if row is None:
            raise _Stopped
        keys = [secret_key(secrets.unseal(row["secret"]))]
        until = parse_dt(row.get("previous_until"))
        if row.get("previous_secret") and until is not None and now < until:
            keys.append(secret_key(secrets.unseal(row["previous_secret"])))
        policy = UrlPolicy(bool(row.get("allow_http")), row.get("allow_host"))
        return _Target(row["url"], policy, keys)

    def _deliver(self, webhook_id: str, t: Transition) -> None:
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
            status, error, ms = self._attempt(webhook_id, msg_id, body)
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

    def _attempt(
        self, webhook_id: str, msg_id: str, body: bytes
    ) -> tuple[int | None, str | None, int]:
        """(status, error, milliseconds) of one attempt: the webhook's URL checked against
        its policy on the addresses its host resolves to now (a refusal is a failed
        attempt that sends nothing), then one POST to the address checked."""
        started = time.monotonic()
        try:
            target = self._target(webhook_id)
            address = check_target(target.url, target.policy)
        except InvalidInput as e:  # refused by the policy, or no key opens the secret
            return None, f"not sent: {e}"[:500], int((time.monotonic() - started) * 1000)
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "run-ledger-webhooks",
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            # one signature per live secret: during a rotation's grace a receiver that
            # knows either one verifies the message (Standard Webhooks)
            "webhook-signature": " ".join(sign(k, msg_id, timestamp, body) for k in target.keys),
        }
        status, error = post_once(target.url, headers, body, self.timeout, address=str(address))
        return status, error, int((time.monotonic() - started) * 1000)


ANSWER_BYTES = 65536  # of a receiver's answer, read and dropped


def post_once(
    url: str,
    headers: dict[str, str],
    body: bytes,
    deadline_s: float,
    address: str | None = None,
) -> tuple[int | None, str | None]:
    """POST `body` to `url` once: (status, error). No redirect is followed; the whole
    exchange ends by `deadline_s` seconds (the connection is shut at the deadline). With
    `address`, the connection goes to that address (the one the policy checked), the
    URL's host still named in `Host` and, for https, in TLS (SNI and the certificate)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, f"not an http(s) URL: {url!r}"[:500]
    conn_type = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_type(parts.hostname, parts.port, timeout=deadline_s)
    if address is not None:
        pinned = address

        def connect(where: tuple[str, int], timeout: float, source: Any = None) -> socket.socket:
            return socket.create_connection((pinned, where[1]), timeout, source)

        conn._create_connection = connect  # type: ignore[attr-defined]
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
