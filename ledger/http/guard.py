"""Resource limits at the HTTP edge, before FastAPI reads a byte of the body.

`RequestGuard` (ASGI middleware):

- **Token first.** A `POST` (every command) needs a known bearer token in its
  `Authorization` header; without one it is answered 401 before the body is read,
  so anonymous clients cannot make the server buffer or parse anything. Only
  `POST /session` (signing the page in: the token is the body) is exempt.
- **Per-route body limits.** A body larger than its route can need is refused with
  413, from its `Content-Length` or as soon as the streamed body passes the limit:
  `POST /runs` (a manifest) takes the most; the commands whose body model carries
  manifest items (amend, repair, compensate: read from the command registry) less;
  lease commands (evidence, an echoed payload) less again; the rest a few KiB of
  reasons.
- **Read deadline.** Each chunk of a body must arrive within `READ_IDLE_SECONDS`
  and the whole body within `READ_TOTAL_SECONDS`; a slow or stalled client gets 408
  and its connection is closed. (A client that stalls while sending its *headers*
  is closed by the server's protocol, see serve.py.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledger.core.validation import MAX_MANIFEST_BYTES

if TYPE_CHECKING:
    from ledger.commands.registry import CommandSpec

KiB = 1024
MiB = 1024 * KiB
# The largest manifest plus room for the JSON around it.
SUBMIT_BODY_BYTES = MAX_MANIFEST_BYTES + 64 * KiB
ITEMS_BODY_BYTES = 8 * MiB
LEASE_BODY_BYTES = 256 * KiB
SESSION_BODY_BYTES = 4 * KiB
DEFAULT_BODY_BYTES = 64 * KiB
READ_IDLE_SECONDS = 10.0
READ_TOTAL_SECONDS = 60.0

# A body field of manifest items (or corrected ones) makes a route an items route.
ITEM_FIELDS = frozenset({"items", "corrections"})


def item_routes(commands: Mapping[str, CommandSpec]) -> tuple[str, ...]:
    """The last path segments (`/amend`, `/repair`, `/compensate`) of the run commands
    whose body model (in the command registry) carries manifest items."""
    from ledger.commands.registry import Http

    return tuple(
        "/" + str(spec.http_path).rsplit("/", 1)[1]
        for spec in commands.values()
        if isinstance(spec.http, Http)
        and spec.http.body is not None
        and ITEM_FIELDS & set(spec.http.body.model_fields)
    )


@cache
def _item_routes() -> tuple[str, ...]:
    from ledger.commands.registry import COMMANDS

    return item_routes(COMMANDS)


def body_limit(method: str, path: str) -> int:
    """The largest body `method path` accepts, in bytes."""
    if method == "POST" and path.rstrip("/") == "/runs":
        return SUBMIT_BODY_BYTES
    if path.startswith("/runs/") and path.rstrip("/").endswith(_item_routes()):
        return ITEMS_BODY_BYTES
    if path.startswith("/leases/"):
        return LEASE_BODY_BYTES
    if path.rstrip("/") == "/session":
        return SESSION_BODY_BYTES
    return DEFAULT_BODY_BYTES


def needs_token(method: str, path: str) -> bool:
    """Whether the request must carry a known bearer token before its body is read."""
    return method == "POST" and path.rstrip("/") != "/session"


class BodyRefused(HTTPException):
    """Raised inside `receive` (FastAPI lets HTTPExceptions through while it reads a
    body, so the app's handlers answer it): 413 or 408, and the connection closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message, headers={"Connection": "close"})
        self.message = message


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, credentials = bytes(value).decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                return str(credentials.strip())
            return None
    return None


@dataclass
class ReadDeadline:
    """How long a request body may take (read at each request: `make_server` sets it)."""

    idle_seconds: float = READ_IDLE_SECONDS
    total_seconds: float = READ_TOTAL_SECONDS


class RequestGuard:
    """ASGI middleware: token before body, per-route body limits, read deadlines.
    `gate` is the app's `auth.Gate` (its tokens file is the authority)."""

    def __init__(self, app: ASGIApp, gate: Any, deadline: ReadDeadline) -> None:
        self.app = app
        self.gate = gate
        self.deadline = deadline

    async def _answer(self, send: Send, status: int, name: str, message: str) -> None:
        body = json.dumps({"error": name, "message": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="ledger"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET")
        path = scope.get("path", "/")
        if needs_token(method, path):
            token = _bearer(scope)
            if token is None:
                await self._answer(
                    send,
                    401,
                    "Unauthenticated",
                    "this command needs a bearer token (Authorization: Bearer <token>)",
                )
                return
            if self.gate.tokens.lookup(token) is None:
                await self._answer(send, 401, "Unauthenticated", "unknown bearer token")
                return
        limit = body_limit(method, path)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await self._answer(
                        send, 413, "PayloadTooLarge", f"request body is larger than {limit} bytes"
                    )
                    return
        seen = 0
        started = False
        idle, total = self.deadline.idle_seconds, self.deadline.total_seconds
        deadline = time.monotonic() + total

        body_done = False

        async def guarded_receive() -> Message:
            nonlocal seen, body_done
            if body_done:
                # the body is in: what comes now is the client going away (a streaming
                # response listens for it for as long as it streams), with no deadline
                return await receive()
            wait = min(idle, deadline - time.monotonic())
            try:
                message = await asyncio.wait_for(receive(), timeout=max(wait, 0.001))
            except TimeoutError:
                raise BodyRefused(
                    408,
                    f"the request body did not arrive in time (each part within "
                    f"{idle:g} s, all of it within {total:g} s)",
                ) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyRefused(413, f"request body is larger than {limit} bytes")
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, tracking_send)
        except BodyRefused as refused:
            # raised outside FastAPI's handlers (e.g. by a plain ASGI route)
            if not started:
                name = "RequestTimeout" if refused.status_code == 408 else "PayloadTooLarge"
                await self._answer(send, refused.status_code, name, refused.message)
