"""The change feed over HTTP: `GET /events` (paged JSON) and `GET /events/stream`
(Server-Sent Events: `id:` is the position, `Last-Event-ID` resumes). Same auth as
every read."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRouter

from ledger.core.views import Actor, Transition
from ledger.http.auth import Reader
from ledger.http.deps import LedgerDep
from ledger.http.errors import error_responses
from ledger.http.paged import EventsPage, page_response
from ledger.http.reads import MAX_PAGE
from ledger.http.visibility import for_reader
from ledger.reads import feed

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
) -> JSONResponse:
    """`lg.events(after, run_id, kinds, limit)`: transitions in position order. `next` is
    the cursor to pass as `after` for the next page (also on a short page: everything up
    to it has been seen), also in the `X-Next-After` and `Link` headers. Lease tokens are
    shown only to their holder and to operators, as on every read."""
    position = feed.check_position(after)
    flt = feed.FeedFilter.of(run_id, kinds)
    with lg.store.read() as tx:
        if flt.run_id is not None:
            feed.check_run(tx, flt.run_id)
        found, cursor = feed.page(tx, position, flt, limit)
    return page_response(request, found, cursor, reader)


def _frame(t: Transition, reader: Actor | None) -> bytes:
    (doc,) = for_reader([t.to_dict()], reader)
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return f"id: {t.position}\nevent: transition\ndata: {data}\n\n".encode()


_STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "An event stream"},
    **error_responses(404),
}


@router.get(
    "/events/stream",
    summary="The change feed as Server-Sent Events",
    response_class=StreamingResponse,
    responses=_STREAM_RESPONSES,
)
def stream(
    reader: Reader,
    lg: LedgerDep,
    after: After = None,
    run_id: RunFilter = None,
    kinds: Kinds = None,
    limit: Annotated[
        int | None, Query(ge=1, description="End the stream after this many transitions.")
    ] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> StreamingResponse:
    """Each transition as an event (`event: transition`, `id:` its position, `data:` its
    JSON) as it commits, starting after `Last-Event-ID` (a reconnecting EventSource sends
    it), else after `after`, else from now. A comment line every 15 s keeps the stream
    alive; it ends after 5 minutes (the browser reconnects where it left off)."""
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
    return StreamingResponse(
        _events(lg, start, flt, limit, reader),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _events(
    lg: Ledger, cursor: int, flt: feed.FeedFilter, limit: int | None, reader: Actor | None
) -> Iterator[bytes]:
    waiter = feed.Waiter(lg.store)
    sent = 0
    ends = time.monotonic() + STREAM_MAX_S
    try:
        yield b"retry: 2000\n\n"
        while time.monotonic() < ends:
            with lg.store.read() as tx:
                found, cursor = feed.page(tx, cursor, flt, MAX_PAGE)
            for t in found:
                yield _frame(t, reader)
                sent += 1
                if limit is not None and sent >= limit:
                    return
            if len(found) == MAX_PAGE:
                continue
            if not waiter.wait(cursor, min(KEEPALIVE_S, max(0.0, ends - time.monotonic()))):
                yield b": keep-alive\n\n"
    finally:
        waiter.close()
