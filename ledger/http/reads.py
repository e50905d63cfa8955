"""GET endpoints: every read of the Python API, as JSON (read-your-writes, like the service)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from itertools import islice
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse

from ledger.core.states import ITEM_STATES, ROLES, RUN_STATES
from ledger.core.views import RunStatus, Transition
from ledger.http.auth import Reader
from ledger.http.deps import LedgerDep, aware, view_response
from ledger.http.errors import error_responses
from ledger.http.paged import AttemptsPage, ItemsPage, TransitionsPage, page_response

router = APIRouter(tags=["reads"], responses=error_responses(401, 422))

RunId = Annotated[str, Path(description="The run's id.")]
MAX_PAGE = 1000


@router.get("/runs", response_model=list[RunStatus], summary="Runs, newest first")
def list_runs(
    _reader: Reader,
    lg: LedgerDep,
    state: Annotated[
        str | None,
        Query(description="Only runs in this state.", json_schema_extra={"enum": list(RUN_STATES)}),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> JSONResponse:
    """`lg.runs(state, limit)`: run statuses, newest first."""
    return view_response(list(lg.runs(state=state, limit=limit)))


@router.get(
    "/runs/{run_id}",
    response_model=RunStatus,
    summary="A run's status",
    responses=error_responses(404),
)
def run_status(
    _reader: Reader,
    lg: LedgerDep,
    run_id: RunId,
    at: Annotated[
        datetime | None,
        Query(description="The status as accepted at this time (ISO 8601; UTC when no offset)."),
    ] = None,
) -> JSONResponse:
    """`lg.status(run_id)`, or `lg.status_at(run_id, at)` with `at`."""
    when = aware(at)
    if when is not None:
        status: RunStatus = lg.status_at(run_id, when)
    else:
        status = lg.status(run_id)
    return view_response(status)


# the paged reads: a page of 1,000 by default, at most 10,000 (a bounded cost per request); the body is
# `{"items": [...], "next": cursor | null}` (ledger/http/paged.py)
RUN_PAGE = 1000
RUN_PAGE_MAX = 10_000
PageLimit = Annotated[
    int,
    Query(
        ge=1,
        le=RUN_PAGE_MAX,
        description=f"Page size (default {RUN_PAGE}, at most {RUN_PAGE_MAX}). When the "
        "page is full, `next` in the body (and the `X-Next-After` and `Link` headers) "
        "holds the cursor of the next page.",
    ),
]


def _next(page: list[Any], limit: int, cursor: Callable[[Any], str | int]) -> str | int | None:
    """The next page's cursor: the last value's key when the page is full."""
    return cursor(page[-1]) if len(page) == limit else None


@router.get(
    "/runs/{run_id}/items",
    response_model=ItemsPage,
    summary="A run's items, keyset paged",
    responses=error_responses(404),
)
def run_items(
    request: Request,
    reader: Reader,
    lg: LedgerDep,
    run_id: RunId,
    state: Annotated[
        str | None,
        Query(
            description="Only items in this state.", json_schema_extra={"enum": list(ITEM_STATES)}
        ),
    ] = None,
    after: Annotated[
        str | None, Query(description="Keyset cursor: the `item_id` of the last item seen.")
    ] = None,
    limit: PageLimit = RUN_PAGE,
) -> JSONResponse:
    """`lg.items(run_id, state, limit, after)`: one page in manifest order."""
    page = lg.items(run_id, state=state, limit=limit, after=after)
    return page_response(request, page, _next(page, limit, lambda i: str(i.item_id)), reader)


@router.get(
    "/runs/{run_id}/attempts",
    response_model=AttemptsPage,
    summary="A run's attempts, keyset paged",
    responses=error_responses(404),
)
def run_attempts(
    request: Request,
    reader: Reader,
    lg: LedgerDep,
    run_id: RunId,
    item_id: Annotated[str | None, Query(description="Only this item's attempts.")] = None,
    after: Annotated[
        str | None,
        Query(description="Keyset cursor: `<item_id>:<attempt>` of the last attempt seen."),
    ] = None,
    limit: PageLimit = RUN_PAGE,
) -> JSONResponse:
    """`lg.attempts(run_id, item_id, limit, after)`: one page, oldest first."""
    page = lg.attempts(run_id, item_id=item_id, limit=limit, after=after)
    return page_response(
        request, page, _next(page, limit, lambda a: f"{a.item_id}:{a.attempt}"), reader
    )


@router.get(
    "/runs/{run_id}/history",
    response_model=TransitionsPage,
    summary="A run's transitions, keyset paged",
    responses=error_responses(404),
)
def run_history(
    request: Request,
    reader: Reader,
    lg: LedgerDep,
    run_id: RunId,
    after: Annotated[
        int | None,
        Query(
            ge=0,
            le=2**63 - 1,
            description="Keyset cursor: the `position` of the last transition seen.",
        ),
    ] = None,
    limit: PageLimit = RUN_PAGE,
) -> JSONResponse:
    """`lg.history(run_id, limit, after)`: one page of transitions in position order."""
    page = lg.history(run_id, limit=limit, after=after)
    return page_response(request, page, _next(page, limit, lambda t: int(t.position)), reader)


@router.get(
    "/runs/{run_id}/lineage",
    response_model=list[RunStatus],
    summary="Linked runs, root first",
    responses=error_responses(404),
)
def run_lineage(_reader: Reader, lg: LedgerDep, run_id: RunId) -> JSONResponse:
    """`lg.lineage(run_id)`: the original run and its retries, repairs and compensations."""
    return view_response(list(lg.lineage(run_id)))


@router.get("/audit", response_model=TransitionsPage, summary="The audit trail, keyset paged")
def audit(
    request: Request,
    reader: Reader,
    lg: LedgerDep,
    run_id: Annotated[str | None, Query(description="Only this run's transitions.")] = None,
    actor: Annotated[
        str | None, Query(description="Only transitions made by this actor id.")
    ] = None,
    role: Annotated[str | None, Query(json_schema_extra={"enum": list(ROLES)})] = None,
    state: Annotated[str | None, Query(description="Only transitions into this state.")] = None,
    since: Annotated[datetime | None, Query(description="From this time (ISO 8601).")] = None,
    until: Annotated[datetime | None, Query(description="Up to this time (ISO 8601).")] = None,
    newest_first: bool = False,
    after: Annotated[
        int | None,
        Query(
            ge=0,
            le=2**63 - 1,
            description="Keyset cursor: the `position` of the last transition seen.",
        ),
    ] = None,
    limit: PageLimit = RUN_PAGE,
) -> JSONResponse:
    """`lg.audit(...)`: one page. When the page is full, `next` holds the cursor for the
    next page (pass it as `after`, with the same filters). Webhook changes are in it
    (`run_id` empty, `command` `webhook_add`, `webhook_change`, `webhook_rotate`,
    `webhook_remove` or `webhook_rekey`, the webhook in `evidence`) unless `run_id` or
    `state` is given."""
    transitions = lg.audit(
        run_id=run_id,
        actor=actor,
        role=role,
        state=state,
        since=aware(since),
        until=aware(until),
        newest_first=newest_first,
        after=after,
        limit=limit,
    )
    page: list[Transition] = list(islice(transitions, limit))
    return page_response(request, page, _next(page, limit, lambda t: int(t.position)), reader)
