"""The body of every paged HTTP read: one object
`{"items": [...], "next": <cursor> | null}`.

`items` is the page (items, attempts or transitions, in the read's order) and `next`
is the cursor of the next page, to pass back as `after` with the same filters: the
last value's key when the page is full (`null` on a page shorter than `limit`, the
last one), so a client never has to parse a header. The change feed (`/events`)
always gives `next`: the position up to which everything has been seen.

The same cursor is in the `X-Next-After` header (its only place before the body had
it; left out when the cursor is not printable ASCII, which a header cannot carry) and
in a `Link: <...>; rel="next"` header (RFC 8288; the request's own path and query with
`after` replaced, percent-encoded, so any cursor fits).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ledger.core.views import Actor, Attempt, ItemStatus, Transition
from ledger.http.visibility import for_reader

NEXT_AFTER_HEADER = "X-Next-After"

T = TypeVar("T")
C = TypeVar("C")

_NEXT = (
    "The cursor of the next page: pass it as `after` (with the same filters). "
    "Null on a page shorter than `limit`, the last one."
)


class _Page(BaseModel, Generic[T, C]):
    items: list[T] = Field(description="The page, in the read's order.")
    next: C | None = Field(description=_NEXT)


class ItemsPage(_Page[ItemStatus, str]):
    """A page of a run's items in manifest order; `next` is the last `item_id`."""


class AttemptsPage(_Page[Attempt, str]):
    """A page of a run's attempts, oldest first; `next` is `<item_id>:<attempt>`."""


class TransitionsPage(_Page[Transition, int]):
    """A page of transitions in position order (newest first on `/audit` with
    `newest_first`); `next` is the last `position`."""


class EventsPage(_Page[Transition, int]):
    """A page of the change feed in position order; `next` is always set: the position
    to pass as `after` for the next page (on a short page too: everything up to it has
    been seen)."""

    next: int = Field(description="The position to pass as `after` for the next page (always set).")


def _header_safe(cursor: str) -> bool:
    return cursor.isascii() and cursor.isprintable()


def next_link(request: Request, cursor: str) -> str:
    """The request's path and query with `after` set to `cursor`, percent-encoded ASCII."""
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes) and raw.isascii():
        path = raw.decode("ascii")
    else:
        path = quote(request.scope.get("root_path", "") + request.scope["path"], safe="/")
    query = urlencode(
        [
            *((k, v) for k, v in request.query_params.multi_items() if k != "after"),
            ("after", cursor),
        ]
    )
    return f"{path}?{query}"


def page_response(
    request: Request,
    values: Iterable[Any],
    next_cursor: str | int | None,
    reader: Actor | None = None,
    mask: bool = True,
) -> JSONResponse:
    """A page as `{"items": [...], "next": ...}`, lease tokens masked for `reader` (unless
    `mask` is off), with the cursor also in `X-Next-After` and `Link` when there is one."""
    docs = [v.to_dict() for v in values]
    body = {"items": for_reader(docs, reader) if mask else docs, "next": next_cursor}
    headers: dict[str, str] = {}
    if next_cursor is not None:
        text = str(next_cursor)
        if _header_safe(text):
            headers[NEXT_AFTER_HEADER] = text
        headers["Link"] = f'<{next_link(request, text)}>; rel="next"'
    return JSONResponse(content=body, headers=headers or None)
