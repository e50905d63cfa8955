"""The operator page's reads of one run: its board row, and its items and attempts one
keyset page at a time (`ledger/reads/runpage.py`), so a big run costs one page per refresh."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from ledger.core.states import ITEM_STATES
from ledger.http.auth import Reader
from ledger.http.deps import LedgerDep, view_response
from ledger.http.errors import error_responses
from ledger.reads import runpage
from ledger.reads.board import BoardRow

router = APIRouter(tags=["operator"], responses=error_responses(401, 404, 422))

RunId = Annotated[str, Path(description="The run's id.")]


@router.get("/board/{run_id}", response_model=BoardRow, summary="One run's board row")
def board_run(_reader: Reader, lg: LedgerDep, run_id: RunId) -> JSONResponse:
    """The run's state, counts and who it waits on, since when, rate and ETA."""
    return view_response(runpage.board_row(lg.store, run_id))


@router.get(
    "/board/{run_id}/items", response_model=runpage.ItemPage, summary="A page of a run's items"
)
def board_items(
    _reader: Reader,
    lg: LedgerDep,
    run_id: RunId,
    state: Annotated[
        str | None,
        Query(
            description="Only items in this state.", json_schema_extra={"enum": list(ITEM_STATES)}
        ),
    ] = None,
    after: Annotated[
        int | None, Query(ge=0, le=2**63 - 1, description="`next_after` of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=runpage.MAX_LIMIT)] = 100,
) -> JSONResponse:
    """Items in manifest order, with expired leases marked by the store's clock."""
    return view_response(runpage.item_page(lg.store, run_id, state, after, limit))


@router.get(
    "/board/{run_id}/attempts",
    response_model=runpage.AttemptPage,
    summary="A page of a run's attempts, newest first",
)
def board_attempts(
    _reader: Reader,
    lg: LedgerDep,
    run_id: RunId,
    after: Annotated[
        str | None, Query(max_length=300, description="`next_after` of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=runpage.MAX_LIMIT)] = 50,
) -> JSONResponse:
    """Attempts newest first; an attempt still open past its lease's expiry is `lease_expired`."""
    return view_response(runpage.attempt_page(lg.store, run_id, after, limit))
