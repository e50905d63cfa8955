"""The change feed over HTTP: `GET /events` (paged JSON) and `GET /events/stream`
(Server-Sent Events: `id:` is the position, `Last-Event-ID` resumes). Same auth as
every read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRouter

from ledger.core.views import Actor, Transition
from ledger.http.auth import SESSION_COOKIE, Gate, Reader, gate_of
from ledger.http.deps import LedgerDep
from ledger.http.errors import error_responses
from ledger.http.paged import EventsPage, page_response
from ledger.http.reads import MAX_PAGE
from ledger.http.streams import RETRY_AFTER_S, REVOKE_CHECK_S, FeedHub, StreamRefused
from ledger.http.visibility import for_reader
from ledger.reads import feed
from ledger.reads import payloads as payloads_of

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

router = APIRouter(tags=["feed"], responses=error_responses(401, 422))

KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing an idle stream
STREAM_MAX_S = 300.0  # then the stream ends; EventSource reconnects with Last-Event-ID

After = Annotated[
    int | None,
    Query(ge=0, le=feed.MAX_POSITION, description="Start after this position (a cursor)."),
]
RunFilter = Annotated[str | None, Query(description="Only this run's transitions.")]
Kinds = Annotated[
    list[str] | None,
    Query(alias="kind", description="Only transitions whose command or new state is one of these."),
]
Payloads = Annotated[
    bool,
    Query(
        description="Give each item transition its item's payload as it stood at that "
        "transition (`payload`, left out when null)."
    ),
]


@router.get(
    "/events",
    response_model=EventsPage,
    summary="The change feed, paged by position",
    responses=error_responses(404),
)
def events(
    request: Request,
    reader: Reader,
    lg: LedgerDep,
    after: After = None,
    run_id: RunFilter = None,
    kinds: Kinds = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    payloads: Payloads = False,
) -> JSONResponse:
    """`lg.events(after, run_id, kinds, limit, payloads)`: transitions in position order. `next` is
    the cursor to pass as `after` for the next page (also on a short page: everything up
    to it has been seen), also in the `X-Next-After` and `Link` headers. Lease tokens are
    shown only to their holder and to operators, as on every read."""
    position = feed.check_position(after)
    flt = feed.FeedFilter.of(run_id, kinds)
    with lg.store.read() as tx:
        if flt.run_id is not None:
            feed.check_run(tx, flt.run_id)
        found, cursor = feed.page(tx, position, flt, limit)
        if payloads:
            payloads_of.attach(tx, found)
    return page_response(request, found, cursor, reader)


def _frame(t: Transition, reader: Actor | None) -> bytes:
    (doc,) = for_reader([t.to_dict()], reader)
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return f"id: {t.position}\nevent: transition\ndata: {data}\n\n".encode()


_STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "An event stream"},
    **error_responses(404),
}


class _Stream(StreamingResponse):
    """A StreamingResponse that gives its stream slot back however it ends (also when the
    client left before the first byte, and the stream never started)."""

    def __init__(self, content: Any, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


def presented_token(request: Request) -> str | None:
    """The token a reader presented (bearer, else the page's session cookie); None when
    the read is anonymous."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie and gate_of(request).tokens.lookup(cookie) is not None:
        return cookie
    return None


@router.get(
    "/events/stream",
    summary="The change feed as Server-Sent Events",
    response_class=StreamingResponse,
    responses=_STREAM_RESPONSES,
)
def stream(
    request: Request,
    reader: Reader,
    lg: LedgerDep,
    after: After = None,
    run_id: RunFilter = None,
    kinds: Kinds = None,
    limit: Annotated[
        int | None, Query(ge=1, description="End the stream after this many transitions.")
    ] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    payloads: Payloads = False,
) -> StreamingResponse:
    """Each transition as an event (`event: transition`, `id:` its position, `data:` its
    JSON) as it commits, starting after `Last-Event-ID` (a reconnecting EventSource sends
    it), else after `after`, else from now. A comment line every 15 s keeps the stream
    alive; it ends after 5 minutes (the browser reconnects where it left off), at once
    when the token is revoked, and when the server stops. At most 4 streams per token and
    64 per server are open at once: past that, 429 or 503 with `Retry-After`."""
    flt = feed.FeedFilter.of(run_id, kinds)
    start: int | None = None
    if last_event_id is not None and last_event_id.strip():
        try:
            start = int(last_event_id.strip())
        except ValueError:
            start = -1
        start = feed.check_position(start, "Last-Event-ID")
    elif after is not None:
        start = feed.check_position(after)
    with lg.store.read() as tx:
        if flt.run_id is not None:
            feed.check_run(tx, flt.run_id)
        if start is None:
            start = feed.head(tx)
    hub: FeedHub = request.app.state.feed_hub
    token = presented_token(request)
    slot = hub.slot(token)
    try:
        slot.__enter__()
    except StreamRefused as refused:
        name = "TooManyStreams" if refused.status == 429 else "Unavailable"
        return JSONResponse(  # type: ignore[return-value]
            {"error": name, "message": refused.message},
            status_code=refused.status,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            slot.__exit__(None, None, None)

    gate = gate_of(request)
    return _Stream(
        _events(hub, lg, start, flt, limit, reader, token, gate, payloads),
        release,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _page(
    lg: Ledger, cursor: int, flt: feed.FeedFilter, payloads: bool = False
) -> tuple[list[Transition], int]:
    with lg.store.read() as tx:
        found, cursor = feed.page(tx, cursor, flt, MAX_PAGE)
        if payloads:
            payloads_of.attach(tx, found)
        return found, cursor


async def _events(
    hub: FeedHub,
    lg: Ledger,
    cursor: int,
    flt: feed.FeedFilter,
    limit: int | None,
    reader: Actor | None,
    token: str | None,
    gate: Gate,
    payloads: bool = False,
) -> AsyncIterator[bytes]:
    clock = asyncio.get_running_loop().time
    ends = clock() + STREAM_MAX_S
    keepalive_at = clock() + KEEPALIVE_S
    sent = 0
    yield b"retry: 2000\n\n"
    while clock() < ends and not hub.closed.is_set():
        if token is not None and gate.tokens.lookup(token) is None:
            return  # revoked: no more transitions for it
        found, cursor = await hub.read(_page, lg, cursor, flt, payloads)
        for t in found:
            yield _frame(t, reader)
            sent += 1
            if limit is not None and sent >= limit:
                return
        if len(found) == MAX_PAGE:
            continue
        now = clock()
        wait = min(REVOKE_CHECK_S, ends - now, keepalive_at - now)
        if await hub.wait_past(cursor, max(wait, 0.0)):
            continue
        if clock() >= keepalive_at:
            yield b": keep-alive\n\n"
            keepalive_at = clock() + KEEPALIVE_S
