"""A webhook has an owner and a fence: only an operator adds, changes or removes one, with
a reason recorded beside who, in which role and when; its URL is held to a policy
(https; no loopback, private, link-local or metadata address unless the operator allows
that host), checked at registration and again before every delivery on the addresses
its host resolves to then; its signing secret is stored encrypted with a key kept
outside the database and shown once, when it is made.

Receivers listen on 127.0.0.1 only; names are resolved by a stand-in resolver, never DNS."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import standardwebhooks

from ledger import InvalidInput, Ledger, NotAuthorized
from ledger.feed import webhook_policy
from ledger.feed.webhook_secrets import KEYS_ENV, new_key, new_secret
from ledger.feed.webhooks import (
    Dispatcher,
    add_webhook,
    change_webhook,
    deliveries,
    get_webhook,
    list_webhooks,
    rekey_webhooks,
    remove_webhook,
    webhook_changes,
)
from tests.support.cli import cli
from tests.support.clock import ManualClock
from tests.support.runs import OPERATOR, REVIEWER, SUBMITTER, WORKER, finished_run

pytestmark = pytest.mark.usefixtures("webhook_key")

WAIT = 60.0  # a bound on waiting, never a timing assertion
LOCAL = {"allow_http": True, "allow_host": "127.0.0.1"}
PUBLIC = ipaddress.ip_address("93.184.216.34")  # a public address; never connected to here


def _until(what: str, check: Callable[[], Any]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Names resolve to what the test puts here (a literal address resolves to itself)."""
    table: dict[str, list[Any]] = {}
    real = webhook_policy.resolve

    def resolve(host: str, port: int) -> list[Any]:
        if host in table:
            return list(table[host])
        return real(host, port)

    monkeypatch.setattr(webhook_policy, "resolve", resolve)
    return table


class Receiver:
    """An HTTP server on 127.0.0.1 that answers 204 and keeps what it was sent."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@contextmanager
def delivering(lg: Ledger) -> Iterator[Dispatcher]:
    """A dispatcher delivering to the ledger's webhooks until the block ends."""
    d = Dispatcher(lg, timeout=2.0, base_backoff=0.02, max_backoff=0.1)
    d.start()
    try:
        yield d
    finally:
        d.stop()


# -- the owner -----------------------------------------------------------------------


def test_only_an_operator_adds_changes_or_removes_a_webhook(dsn: str) -> None:
    with Ledger.open(dsn) as lg:
        for actor in (SUBMITTER, WORKER, REVIEWER):
            with pytest.raises(NotAuthorized, match="operator"):
                add_webhook(lg, actor, "http://127.0.0.1:9/", reason="mine", **LOCAL)
        assert list_webhooks(lg) == [] and webhook_changes(lg) == []  # nothing written
        with pytest.raises(InvalidInput, match="reason"):
            add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", reason="  ", **LOCAL)
        hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", reason="ops feed", **LOCAL)
        for actor in (SUBMITTER, WORKER):
            with pytest.raises(NotAuthorized):
                change_webhook(lg, actor, hook.webhook_id, reason="x", rotate_secret=True)
            with pytest.raises(NotAuthorized):
                remove_webhook(lg, actor, hook.webhook_id, reason="x")
            with pytest.raises(NotAuthorized):
                rekey_webhooks(lg, actor, reason="x")
        assert [h.webhook_id for h in list_webhooks(lg)] == [hook.webhook_id]
        assert get_webhook(lg, hook.webhook_id).secret_fingerprint == hook.secret_fingerprint
        assert [c.command for c in webhook_changes(lg)] == ["add"]


def test_every_webhook_command_is_recorded_with_who_why_and_when(
    lg: Ledger, clock: ManualClock
) -> None:
    t0 = clock()
    hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/a", reason="billing wants runs", **LOCAL)
    clock.advance(60)
    change_webhook(lg, OPERATOR, hook.webhook_id, url="http://127.0.0.1:9/b", reason="moved")
    clock.advance(60)
    rotated = change_webhook(lg, OPERATOR, hook.webhook_id, rotate_secret=True, reason="leak")
    clock.advance(60)
    remove_webhook(lg, OPERATOR, hook.webhook_id, reason="billing retired it")
    changes = webhook_changes(lg, hook.webhook_id)
    assert [(c.version, c.command, c.actor_id, c.role, c.reason) for c in changes] == [
        (4, "remove", OPERATOR.id, "operator", "billing retired it"),
        (3, "rotate", OPERATOR.id, "operator", "leak"),
        (2, "change", OPERATOR.id, "operator", "moved"),
        (1, "add", OPERATOR.id, "operator", "billing wants runs"),
    ]
    assert [c.at for c in changes] == [t0 + timedelta(seconds=s) for s in (180, 120, 60, 0)]
    assert [c.url for c in changes] == ["http://127.0.0.1:9/b"] * 3 + ["http://127.0.0.1:9/a"]
    fingerprints = [c.secret_fingerprint for c in changes]
    assert fingerprints[3] == fingerprints[2] == hook.secret_fingerprint
    assert (
        fingerprints[1] == fingerprints[0] == rotated.secret_fingerprint != hook.secret_fingerprint
    )
    # no record holds a secret
    text = json.dumps([c.to_dict() for c in changes])
    assert hook.secret is not None and rotated.secret is not None
    assert hook.secret not in text and rotated.secret not in text
    assert list_webhooks(lg) == []


# -- the URL policy ------------------------------------------------------------------

REFUSED = [
    ("http://example.org/hook", "https"),
    ("https://127.0.0.1/hook", "loopback"),
    ("https://[::1]/hook", "loopback"),
    ("https://[::ffff:127.0.0.1]/hook", "loopback"),
    ("https://localhost/hook", "loopback"),
    ("https://10.1.2.3/hook", "private"),
    ("https://172.16.0.9/hook", "private"),
    ("https://192.168.1.1/hook", "private"),
    ("https://[fc00::1]/hook", "private"),
    ("https://169.254.1.1/hook", "link-local"),
    ("https://169.254.169.254/latest/meta-data/", "metadata"),
    ("https://[fd00:ec2::254]/", "metadata"),
    ("https://metadata.google.internal/computeMetadata/v1/", "metadata"),
    ("https://0.0.0.0/hook", "unspecified"),
    ("https://100.64.0.1/hook", "public"),
    ("https://ops:hunter2@example.org/hook", "password"),
]


@pytest.mark.parametrize(("url", "why"), REFUSED, ids=[u for u, _ in REFUSED])
def test_the_url_policy_refuses_and_nothing_is_written(
    lg: Ledger, resolver: dict[str, list[Any]], url: str, why: str
) -> None:
    resolver["example.org"] = [PUBLIC]
    with pytest.raises(InvalidInput, match=why):
        add_webhook(lg, OPERATOR, url, reason="try")
    assert list_webhooks(lg) == [] and webhook_changes(lg) == []


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://[::1]/hook",
        "https://10.1.2.3/",
        "https://169.254.169.254/",
    ],
)
def test_the_operator_may_allow_a_named_host_and_only_that_host(lg: Ledger, url: str) -> None:
    host = url.split("/")[2].strip("[]")
    hook = add_webhook(lg, OPERATOR, url, reason="in-cluster receiver", allow_host=host)
    assert hook.allow_host == host
    with pytest.raises(InvalidInput, match="must be the URL's own host"):
        add_webhook(lg, OPERATOR, url, reason="x", allow_host="receiver.internal")
    with pytest.raises(InvalidInput, match="https"):  # allowing a host is not allowing http
        add_webhook(lg, OPERATOR, url.replace("https", "http"), reason="x", allow_host=host)


def test_a_change_is_held_to_the_policy_too(lg: Ledger, resolver: dict[str, list[Any]]) -> None:
    resolver["hooks.example.org"] = [PUBLIC]
    hook = add_webhook(lg, OPERATOR, "https://hooks.example.org/in", reason="feed")
    with pytest.raises(InvalidInput, match="metadata"):
        change_webhook(lg, OPERATOR, hook.webhook_id, url="https://169.254.169.254/", reason="x")
    with pytest.raises(InvalidInput, match="https"):
        change_webhook(lg, OPERATOR, hook.webhook_id, url="http://hooks.example.org/", reason="x")
    assert get_webhook(lg, hook.webhook_id).url == "https://hooks.example.org/in"
    assert [c.command for c in webhook_changes(lg)] == ["add"]


def test_a_host_that_resolves_elsewhere_at_delivery_is_not_sent_to(
    dsn: str,
    resolver: dict[str, list[Any]],
) -> None:
    """DNS rebinding: public at registration, loopback at delivery. The attempt is recorded
    as failed, naming the address, and no connection is made."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[Any] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        with Ledger.open(dsn) as lg:
            resolver["hooks.example.org"] = [PUBLIC]
            hook = add_webhook(
                lg, OPERATOR, f"https://hooks.example.org:{port}/in", reason="partner"
            )
            resolver["hooks.example.org"] = [ipaddress.ip_address("127.0.0.1")]  # rebound
            finished_run(lg, 1)
            with delivering(lg):
                _until("two refused attempts", lambda: len(deliveries(lg, hook.webhook_id)) >= 2)
            for d in deliveries(lg, hook.webhook_id):
                assert not d.ok and d.status is None
                assert d.error is not None and "127.0.0.1" in d.error and "loopback" in d.error
    finally:
        stop.set()
        thread.join(WAIT)
        listener.close()
    assert accepted == []


def test_delivery_connects_to_the_address_it_checked(
    dsn: str,
    resolver: dict[str, list[Any]],
    receiver: Receiver,
) -> None:
    """The name resolves (here) only through the checked lookup: the POST reaches the
    receiver at that address, with the URL's host in `Host`."""
    resolver["receiver.internal"] = [ipaddress.ip_address("127.0.0.1")]
    url = f"http://receiver.internal:{receiver.port}/in"
    with Ledger.open(dsn) as lg:
        with pytest.raises(InvalidInput, match="loopback"):
            add_webhook(lg, OPERATOR, url, reason="x", allow_http=True)
        hook = add_webhook(
            lg, OPERATOR, url, reason="in-cluster", allow_http=True, allow_host="receiver.internal"
        )
        finished_run(lg, 1)
        with delivering(lg):
            _until("a delivery", lambda: receiver.requests)
        headers, body = receiver.requests[0]
        assert headers["host"] == f"receiver.internal:{receiver.port}"
        assert hook.secret is not None
        standardwebhooks.Webhook(hook.secret).verify(body.decode(), headers)


# -- the secret ----------------------------------------------------------------------


def _stored_secret(lg: Ledger, webhook_id: str) -> str:
    with lg.store.read() as tx:
        row = tx.fetchone("SELECT secret FROM lg_webhooks WHERE webhook_id = ?", (webhook_id,))
    assert row is not None
    return str(row["secret"])


def test_the_secret_is_encrypted_at_rest_and_shown_once(lg: Ledger) -> None:
    hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", reason="feed", **LOCAL)
    secret = hook.secret
    assert secret is not None and secret.startswith("whsec_")
    stored = _stored_secret(lg, hook.webhook_id)
    assert stored.startswith("fernet:") and secret not in stored
    assert secret.removeprefix("whsec_") not in stored
    reads = [get_webhook(lg, hook.webhook_id), *list_webhooks(lg)]
    for read in reads:
        assert read.secret is None
        assert read.secret_fingerprint == hook.secret_fingerprint
        assert secret not in json.dumps(read.to_dict())
    given = new_secret()
    other = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", reason="f", secret=given, **LOCAL)
    assert other.secret == given and given not in _stored_secret(lg, other.webhook_id)


def test_without_a_key_no_webhook_is_added(lg: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEYS_ENV)
    with pytest.raises(InvalidInput, match=KEYS_ENV):
        add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", reason="feed", **LOCAL)
    assert list_webhooks(lg) == [] and webhook_changes(lg) == []


def test_a_plaintext_secret_keeps_signing_and_rekey_encrypts_it_under_a_new_key(
    dsn: str,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    webhook_key: str,
) -> None:
    url = f"http://127.0.0.1:{receiver.port}/in"
    legacy = new_secret()
    with Ledger.open(dsn) as lg:
        hook = add_webhook(lg, OPERATOR, url, reason="feed", secret=legacy, **LOCAL)
        with lg.store.write() as tx:  # as a webhook added before secrets were encrypted
            tx.execute(
                "UPDATE lg_webhooks SET secret = ? WHERE webhook_id = ?", (legacy, hook.webhook_id)
            )
        assert get_webhook(lg, hook.webhook_id).secret_fingerprint == hook.secret_fingerprint
        finished_run(lg, 1)
        with delivering(lg):
            _until("deliveries", lambda: len(receiver.requests) >= 4)
        for headers, body in receiver.requests:
            standardwebhooks.Webhook(legacy).verify(body.decode(), headers)
        # a new key first, the old one still there to decrypt; rekey; then the old one goes
        fresh = new_key()
        monkeypatch.setenv(KEYS_ENV, f"{fresh},{webhook_key}")
        assert rekey_webhooks(lg, OPERATOR, reason="key rotation") == 1
        sealed = _stored_secret(lg, hook.webhook_id)
        assert sealed.startswith("fernet:") and legacy not in sealed
        monkeypatch.setenv(KEYS_ENV, fresh)
        assert get_webhook(lg, hook.webhook_id).secret_fingerprint == hook.secret_fingerprint
        assert [c.command for c in webhook_changes(lg, hook.webhook_id)] == ["rekey", "add"]
        seen = len(receiver.requests)
        finished_run(lg, 1)
        with delivering(lg):
            _until("deliveries after the rekey", lambda: len(receiver.requests) >= seen + 4)
        for headers, body in receiver.requests[seen:]:
            standardwebhooks.Webhook(legacy).verify(body.decode(), headers)


def test_a_rotated_secret_signs_beside_the_old_one_during_its_grace(
    dsn: str, receiver: Receiver
) -> None:
    url = f"http://127.0.0.1:{receiver.port}/in"
    with Ledger.open(dsn) as lg:
        hook = add_webhook(lg, OPERATOR, url, reason="feed", **LOCAL)
        rotated = change_webhook(lg, OPERATOR, hook.webhook_id, rotate_secret=True, reason="r")
        assert rotated.secret is not None and rotated.secret != hook.secret
        assert get_webhook(lg, hook.webhook_id).secret is None
        finished_run(lg, 1)
        with delivering(lg):
            _until("deliveries", lambda: len(receiver.requests) >= 4)
        for headers, body in receiver.requests:
            assert len(headers["webhook-signature"].split()) == 2
            for secret in (hook.secret, rotated.secret):
                assert secret is not None
                standardwebhooks.Webhook(secret).verify(body.decode(), headers)


def test_the_command_line_asks_for_an_operator_and_a_reason(dsn: str) -> None:
    Ledger.open(dsn).close()
    url = "http://127.0.0.1:9/in"
    refused = cli(
        dsn, "--as", "sam:submitter", "webhooks", "add", url, "--reason", "x",
        "--allow-http", "--allow-host", "127.0.0.1",
    )  # fmt: skip
    assert refused.exit_code != 0 and "operator" in refused.output
    assert cli(dsn, "--as", "olga:operator", "webhooks", "add", url).exit_code != 0  # no reason
    added = cli(
        dsn, "--as", "olga:operator", "webhooks", "add", url, "--reason", "ops feed",
        "--allow-http", "--allow-host", "127.0.0.1", "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    hook = json.loads(added.stdout)
    assert hook["secret"].startswith("whsec_")
    listed = cli(dsn, "webhooks", "list", "--json")
    assert listed.exit_code == 0 and hook["secret"] not in listed.stdout
    assert hook["secret_fingerprint"] in listed.stdout
    removed = cli(
        dsn, "--as", "olga:operator", "webhooks", "remove", hook["webhook_id"], "--reason", "done"
    )
    assert removed.exit_code == 0, removed.output
    changes = json.loads(cli(dsn, "webhooks", "changes", "--json").stdout)
    assert [(c["command"], c["actor_id"], c["role"], c["reason"]) for c in changes] == [
        ("remove", "olga", "operator", "done"),
        ("add", "olga", "operator", "ops feed"),
    ]
    assert datetime.fromisoformat(changes[0]["at"]).tzinfo is not None
    assert all(hook["secret"] not in json.dumps(c) for c in changes)
