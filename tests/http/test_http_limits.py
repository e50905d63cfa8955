"""HTTP resource limits: the token is checked before the body is
read, bodies larger than their route needs are refused early, and slow clients are cut
off (headers, body), so anonymous or stalled clients cannot hold memory or
connections."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger
from ledger.http import create_app
from ledger.http.guard import (
    DEFAULT_BODY_BYTES,
    ITEMS_BODY_BYTES,
    LEASE_BODY_BYTES,
    SUBMIT_BODY_BYTES,
    body_limit,
)
from ledger.http.serve import make_server
from ledger.http.tokens import add_token


def _call(
    app: Any, method: str, path: str, headers: dict[str, str], chunks: list[bytes]
) -> tuple[int, dict[str, Any], int]:
    """Drive the ASGI app directly; returns (status, JSON body, how many body chunks it read)."""
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read < len(chunks):
            read += 1
            return {
                "type": "http.request",
                "body": chunks[read - 1],
                "more_body": read < len(chunks),
            }
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), read


@pytest.fixture
def app_and_tokens(tmp_path: Path) -> Iterator[tuple[Any, dict[str, str]]]:
    tokens = tmp_path / "tokens"
    made = {
        role: add_token(f"a-{role}", role, tokens) for role in ("submitter", "operator", "worker")
    }
    lg = Ledger.open("memory://")
    try:
        yield create_app(lg, tokens_path=tokens), made
    finally:
        lg.close()


def test_no_token_means_401_before_the_body_is_read(
    app_and_tokens: tuple[Any, dict[str, str]],
) -> None:
    app, made = app_and_tokens
    big = [b"x" * 1_000_000] * 3
    for headers in (
        {},
        {"Authorization": "Bearer ledger_not-a-known-token"},
        {"Authorization": "Basic abc"},
    ):
        for path in ("/runs", "/runs/r1/pause", "/leases/accept", "/reconcile"):
            status, body, read = _call(
                app, "POST", path, {"Content-Type": "application/json", **headers}, big
            )
            assert (status, body["error"], read) == (401, "Unauthenticated", 0), (path, headers)
    # signing the page in takes its token in the body: it is read (and small)
    status, _body, read = _call(
        app, "POST", "/session", {"Content-Type": "application/json"}, [b'{"token": "nope"}']
    )
    assert (status, read) == (401, 1)
    # with a known token the body is read as usual
    status, body, read = _call(
        app,
        "POST",
        "/runs",
        {"Content-Type": "application/json", "Authorization": f"Bearer {made['submitter']}"},
        [b'{"source_version": "s", "config_version": "c", "items": [{"item_id": "x"}]}'],
    )
    assert (status, read) == (201, 1), body


def test_bodies_larger_than_the_route_needs_are_refused_early(
    app_and_tokens: tuple[Any, dict[str, str]],
) -> None:
    app, made = app_and_tokens
    assert SUBMIT_BODY_BYTES > ITEMS_BODY_BYTES > LEASE_BODY_BYTES > DEFAULT_BODY_BYTES
    assert body_limit("POST", "/runs") == SUBMIT_BODY_BYTES
    assert body_limit("POST", "/runs/r/amend") == ITEMS_BODY_BYTES
    assert body_limit("POST", "/leases/accept") == LEASE_BODY_BYTES
    assert body_limit("POST", "/runs/r/pause") == DEFAULT_BODY_BYTES
    auth = {"Content-Type": "application/json", "Authorization": f"Bearer {made['operator']}"}
    # a declared length over the limit: refused without reading
    for path, limit in (
        ("/runs/r/pause", DEFAULT_BODY_BYTES),
        ("/leases/accept", LEASE_BODY_BYTES),
    ):
        status, body, read = _call(
            app, "POST", path, {**auth, "Content-Length": str(limit + 1)}, [b"{}"]
        )
        assert (status, body["error"], read) == (413, "PayloadTooLarge", 0)
    # a streamed body: refused as soon as it passes the limit, not at its end
    chunk = b" " * 16_384
    status, body, read = _call(app, "POST", "/runs/r/pause", auth, [chunk] * 100)
    assert (status, body["error"]) == (413, "PayloadTooLarge")
    assert read == DEFAULT_BODY_BYTES // len(chunk) + 1
    # under the limit the route answers for itself (here: no such run)
    status, body, _ = _call(app, "POST", "/runs/r/pause", auth, [b'{"reason": "x"}'])
    assert status == 404


# -- slow clients against a real server -------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[int, str]]:
    tokens = tmp_path / "tokens"
    token = add_token("olga", "operator", tokens)
    lg = Ledger.open("memory://")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = make_server(
        lg,
        port=port,
        tokens_path=tokens,
        log_level="warning",
        header_timeout=0.5,
        read_idle_seconds=0.5,
        read_total_seconds=2.0,
        keep_alive_seconds=1,
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not srv.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        yield port, token
    finally:
        srv.should_exit = True
        thread.join(timeout=20)
        lg.close()


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """Everything the server sent until it closed the connection; fails if it did not
    close within `seconds`."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        pytest.fail(f"the server still held the connection after {seconds} s: {received[:200]!r}")
    return received


def test_stalled_headers_and_bodies_are_cut_off(server: tuple[int, str]) -> None:
    port, token = server
    socks = []
    try:
        # 40 clients that never finish their headers, and 40 that never finish their body
        for k in range(80):
            s = socket.create_connection(("127.0.0.1", port))
            socks.append(s)
            if k % 2:
                s.sendall(
                    b"POST /runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
                )
            else:
                s.sendall(
                    b"POST /runs/r/pause HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Authorization: Bearer "
                    + token.encode()
                    + b'\r\nContent-Length: 1000\r\n\r\n{"rea'
                )
        for k, s in enumerate(socks):
            got = _closed_within(s, 10.0)
            if k % 2 == 0:
                assert got.startswith(b"HTTP/1.1 408"), got[:200]
                assert b"RequestTimeout" in got
            else:
                assert got == b""  # no request was ever complete: just closed
    finally:
        for s in socks:
            s.close()


def test_a_prompt_client_is_served_as_before(server: tuple[int, str]) -> None:
    port, token = server
    with socket.create_connection(("127.0.0.1", port)) as s:
        body = b'{"reason": "x"}'
        s.sendall(
            b"POST /runs/r/pause HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer "
            + token.encode()
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )
        got = _closed_within(s, 10.0)
    assert got.startswith(b"HTTP/1.1 404"), got[:200]
