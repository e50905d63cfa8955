"""GET endpoints: every read of API.md, as JSON (read-your-writes, like the service)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from itertools import islice
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from ..states import ITEM_STATES, ROLES, RUN_STATES
from ..views import Attempt, ItemStatus, RunStatus, Transition
from .auth import Reader
from .deps import LedgerDep, aware, view_response
from .errors import error_responses
from .visibility import reader_response

router = APIRouter(tags=["reads"], responses=error_responses(401, 422))

RunId = Annotated[str, Path(description="The run's id.")]
MAX_PAGE = 1000

NEXT_AFTER_HEADER = "X-Next-After"


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


# the paged run reads: a page of 1,000 by default, at most 10,000 (issue 14)
RUN_PAGE = 1000
RUN_PAGE_MAX = 10_000
PageLimit = Annotated[
    int,
    Query(
        ge=1,
        le=RUN_PAGE_MAX,
        description=f"Page size (default {RUN_PAGE}, at most {RUN_PAGE_MAX}). When the "
        "page is full, the `X-Next-After` header holds the cursor of the next page.",
    ),
]


def _paged(page: list[Any], limit: int, cursor: Callable[[Any], str], reader: Any) -> JSONResponse:
    """A page as the JSON list, the next cursor in `X-Next-After` when the page is full
    (the body stays a plain list, as before paging, for the page's JS and clients)."""
    headers = {NEXT_AFTER_HEADER: cursor(page[-1])} if len(page) == limit else None
    return reader_response(page, reader, headers=headers)


@router.get(
    "/runs/{run_id}/items",
    response_model=list[ItemStatus],
    summary="A run's items, keyset paged",
    responses=error_responses(404),
)
def run_items(
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
    return _paged(page, limit, lambda i: str(i.item_id), reader)


@router.get(
    "/runs/{run_id}/attempts",
    response_model=list[Attempt],
    summary="A run's attempts, keyset paged",
    responses=error_responses(404),
)
def run_attempts(
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
    return _paged(page, limit, lambda a: f"{a.item_id}:{a.attempt}", reader)


@router.get(
    "/runs/{run_id}/history",
    response_model=list[Transition],
    summary="A run's transitions, keyset paged",
    responses=error_responses(404),
)
def run_history(
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
    return _paged(page, limit, lambda t: str(t.position), reader)


@router.get(
    "/runs/{run_id}/lineage",
    response_model=list[RunStatus],
    summary="Linked runs, root first",
    responses=error_responses(404),
)
def run_lineage(_reader: Reader, lg: LedgerDep, run_id: RunId) -> JSONResponse:
    """`lg.lineage(run_id)`: the original run and its retries, repairs and compensations."""
    return view_response(list(lg.lineage(run_id)))


@router.get("/audit", response_model=list[Transition], summary="The audit trail, keyset paged")
def audit(
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
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> JSONResponse:
    """`lg.audit(...)`: one page. When the page is full, the `X-Next-After` header holds
    the cursor for the next page (pass it as `after`, with the same filters)."""
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
    headers = {NEXT_AFTER_HEADER: str(page[-1].position)} if len(page) == limit else None
    return reader_response(page, reader, headers=headers)
