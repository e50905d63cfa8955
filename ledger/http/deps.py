"""Shared request dependencies: the application service and time parameters."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger


def ledger_of(request: Request) -> Ledger:
    """The `Ledger` this app serves (one per app, shared by every request thread)."""
    lg: Ledger = request.app.state.ledger
    return lg


LedgerDep = Annotated["Ledger", Depends(ledger_of)]


def command_ledger_of(
    request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="Optional. A repeat of the request with the same key returns the first "
            "response and writes nothing; the same key with another command or other arguments "
            "is refused (422). Keys are global to the ledger: use a UUID.",
        ),
    ] = None,
) -> Ledger:
    """The ledger for a command route; with an `Idempotency-Key` header, the command the
    route makes carries that key (`Ledger.keyed`)."""
    lg = ledger_of(request)
    return lg if idempotency_key is None else lg.keyed(idempotency_key)


CommandLedgerDep = Annotated["Ledger", Depends(command_ledger_of)]


def aware(value: datetime | None) -> datetime | None:
    """Times without an offset are taken as UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def view_response(
    value: Any, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    """A view (or list of views) as JSON, exactly as its `to_dict()` gives it, so the API,
    the CLI's `--json` and library users see the same documents. The route's
    `response_model` still documents the shape."""
    if isinstance(value, list):
        content: Any = [v.to_dict() for v in value]
    else:
        content = value.to_dict()
    return JSONResponse(content=content, status_code=status_code, headers=headers)
