"""`GET /overview` (what is stuck, on whom) and `GET /metrics` (Prometheus text format).

Both are reads: open to anonymous callers only with `public_reads`, else they need a
bearer token (a Prometheus scrape config passes one with `authorization:`). Both answer
from one overview snapshot per app (`OverviewSnapshot`, read again at most every
`OVERVIEW_MAX_AGE` seconds, its age in `age_seconds`), so looping scrapers and open
operator pages cost the store one overview per interval, whatever their number. Each app
has its own metrics registry (no process-global state): the ledger collector and the
HTTP request counter and latency histogram, labelled by route template so the label
set stays bounded whatever paths clients ask for.
"""

from __future__ import annotations

import time
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledger.core.states import RUN_STATES
from ledger.http import board
from ledger.http.auth import Reader
from ledger.http.deps import LedgerDep, view_response
from ledger.http.errors import error_responses
from ledger.http.metrics import LedgerCollector
from ledger.reads.board import MAX_LIMIT, ORDERS, BoardPage
from ledger.reads.overview import Overview, OverviewSnapshot
from ledger.reads.signals import OWNERS

router = APIRouter(tags=["operator"], responses=error_responses(401))

OVERVIEW_MAX_AGE = 2.0  # seconds: how stale /overview and /metrics may be
REQUESTS = "ledger_http_requests"  # exposed as ledger_http_requests_total
LATENCY = "ledger_http_request_duration_seconds"

# Every label value comes from a fixed set, whatever a client sends: a method is one of
# HTTP's own (anything else is "other"), a route is a route template (or "unmatched"),
# a status is one of HTTP's registered codes (else "other"). So the number of series is
# bounded by the routes, not by the traffic.
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)
STATUSES = frozenset(str(int(s)) for s in HTTPStatus)
OTHER = "other"


def method_label(method: object) -> str:
    """The request method as a metric label: one of `METHODS`, else "other"."""
    return method if isinstance(method, str) and method in METHODS else OTHER


def status_label(status: int) -> str:
    """The response status as a metric label: a registered HTTP status, else "other"."""
    text = str(status)
    return text if text in STATUSES else OTHER


@router.get("/overview", response_model=Overview, summary="Open runs: what is stuck, on whom")
def get_overview(_reader: Reader, request: Request) -> JSONResponse:
    """`lg.overview()`: open runs by state and waiting_on, the oldest wait per owner,
    stalled runs and expired leases, across every run of the ledger; from a snapshot at
    most a few seconds old (`age_seconds`)."""
    snapshot: OverviewSnapshot = request.app.state.overview_snapshot
    return view_response(snapshot.get())


@router.get("/board", response_model=BoardPage, summary="Runs with who they wait on, keyset paged")
def get_board(
    _reader: Reader,
    lg: LedgerDep,
    state: Annotated[
        str | None,
        Query(description="Only runs in this state.", json_schema_extra={"enum": list(RUN_STATES)}),
    ] = None,
    waiting_on: Annotated[
        str | None,
        Query(
            description="Only runs waiting on this owner.", json_schema_extra={"enum": list(OWNERS)}
        ),
    ] = None,
    stalled: Annotated[bool, Query(description="Only stalled runs.")] = False,
    terminal: Annotated[bool, Query(description="Terminal runs instead of open ones.")] = False,
    after: Annotated[
        int | None,
        Query(ge=0, le=2**63 - 1, description="Cursor: `next_after` of the previous page."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    order: Annotated[
        str,
        Query(
            description="`newest` first (keyset pages), or by `attention` as `ledger top` "
            "ranks runs (pages by rank).",
            json_schema_extra={"enum": list(ORDERS)},
        ),
    ] = "newest",
) -> JSONResponse:
    """`lg.board(...)`: open runs (or terminal ones) newest first or by attention, each with
    waiting_on, what its owner has to do, the person where known, waiting since, last
    activity, stalled, rate, an ETA (only for a running run that can still succeed) and
    expired leases."""
    return view_response(lg.board(state, waiting_on, stalled, terminal, after, limit, order))


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Text format 0.0.4"}},
)
def get_metrics(_reader: Reader, request: Request) -> Response:
    """Every `ledger_` metric: the ledger's state at this instant and this server's requests."""
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class RequestMetrics:
    """ASGI middleware counting requests and timing them, by method, route and status."""

    def __init__(self, app: ASGIApp, requests: Counter, latency: Histogram) -> None:
        self.app = app
        self.requests = requests
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            # the router records the matched route in the scope; unmatched paths share one label
            route: Any = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = method_label(scope.get("method"))
            self.requests.labels(method, path, status_label(status[0])).inc()
            self.latency.labels(method, path).observe(time.perf_counter() - started)


def install(app: FastAPI, overview_max_age: float = OVERVIEW_MAX_AGE) -> None:
    """Give `app` its overview snapshot, metrics registry, the request middleware and the
    routes."""
    registry = CollectorRegistry()
    lg = app.state.ledger  # None only for openapi_document, which never reads
    snapshot = OverviewSnapshot(lg.store if lg is not None else None, overview_max_age)
    app.state.overview_snapshot = snapshot
    registry.register(LedgerCollector(app.state.ledger, snapshot))
    requests = Counter(
        REQUESTS,
        "HTTP requests answered, by method, route template and status.",
        ["method", "route", "status"],
        registry=registry,
    )
    latency = Histogram(
        LATENCY,
        "HTTP request latency in seconds, by method and route template.",
        ["method", "route"],
        registry=registry,
    )
    app.state.metrics_registry = registry
    app.add_middleware(RequestMetrics, requests=requests, latency=latency)
    app.include_router(router)
    app.include_router(board.router)
