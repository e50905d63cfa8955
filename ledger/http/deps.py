"""Shared request dependencies: the application service and time parameters."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request

if TYPE_CHECKING:
    from ..service import Ledger


def ledger_of(request: Request) -> Ledger:
    """The `Ledger` this app serves (one per app, shared by every request thread)."""
    lg: Ledger = request.app.state.ledger
    return lg


LedgerDep = Annotated[Any, Depends(ledger_of)]


def aware(value: datetime | None) -> datetime | None:
    """Times without an offset are taken as UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
