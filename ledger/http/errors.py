"""Typed ledger errors -> HTTP statuses, and JSON bodies for every refusal.

Every error response has the body `{"error": Type, "message": ...}` (the ledger
error's own `to_dict()`, so `Conflict` also carries `current_revision` and
`current_state`, and so on). Bad input is a 400 or 422, never a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from ledger.core.errors import (
    CommitUncertain,
    Conflict,
    IllegalTransition,
    InvalidInput,
    InvariantViolated,
    ItemNotFound,
    LeaseLost,
    LedgerError,
    NotAuthorized,
    RunNotFound,
    StaleReview,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

# First match along the error's class hierarchy wins (AlreadyTerminal and
# NotComplete are IllegalTransitions; ManifestInvalid is an InvalidInput).
STATUS_BY_ERROR: dict[type[LedgerError], int] = {
    InvalidInput: 422,
    RunNotFound: 404,
    ItemNotFound: 404,
    NotAuthorized: 403,
    Conflict: 409,
    StaleReview: 409,
    LeaseLost: 409,
    IllegalTransition: 409,
    # the ledger's own pre-commit rule check refused a command: a bug in a command's checks
    InvariantViolated: 500,
    # the database is down or the connection dropped: try again (with the same key)
    StoreUnavailable: 503,
    CommitUncertain: 503,
}

_NAME_BY_STATUS = {
    400: "InvalidInput",
    401: "Unauthenticated",
    403: "NotAuthorized",
    404: "NotFound",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
    422: "InvalidInput",
}


class ErrorBody(BaseModel):
    """The body of every error response."""

    model_config = ConfigDict(extra="allow")

    error: str
    message: str


class Unauthenticated(Exception):
    """No bearer token, or one the tokens file does not know: 401."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def status_for(error: LedgerError) -> int:
    """The HTTP status of a typed ledger error (400 for a type this table lacks)."""
    for cls in type(error).__mro__:
        status = STATUS_BY_ERROR.get(cls)
        if status is not None:
            return status
    return 400


def error_response(
    status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(status_code=status, content=body, headers=headers)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc)


def _validation_body(exc: RequestValidationError) -> tuple[int, dict[str, Any]]:
    # Never echo `input`: it may be bytes that are not UTF-8, or a huge document.
    errors = [
        {"field": _field(e.get("loc", ())), "message": str(e.get("msg", "invalid"))}
        for e in list(exc.errors())[:20]
    ]
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        detail = (
            ctx.get("error", "JSON decode error") if isinstance(ctx, dict) else "JSON decode error"
        )
        return 400, {
            "error": "InvalidInput",
            "message": f"request body is not valid JSON: {detail}",
            "errors": errors,
        }
    message = f"{errors[0]['field']}: {errors[0]['message']}" if errors else "invalid request"
    return 422, {"error": "InvalidInput", "message": message, "errors": errors}


async def _on_ledger_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LedgerError)
    return error_response(status_for(exc), exc.to_dict())


async def _on_unauthenticated(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Unauthenticated)
    return error_response(
        401,
        {"error": "Unauthenticated", "message": exc.message},
        headers={"WWW-Authenticate": 'Bearer realm="ledger"'},
    )


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    status, body = _validation_body(exc)
    return error_response(status, body)


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else "request refused"
    if exc.status_code == 400 and detail == "There was an error parsing the body":
        detail = "request body could not be parsed (it must be UTF-8 JSON)"
    name = _NAME_BY_STATUS.get(exc.status_code, "HTTPError")
    return error_response(exc.status_code, {"error": name, "message": detail}, headers=exc.headers)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # A bug, not bad input: log it (the request line holds no token) and say little.
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(
        500, {"error": "InternalError", "message": "internal error; see the server log"}
    )


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every refusal into `{"error", "message"}`."""
    app.add_exception_handler(LedgerError, _on_ledger_error)
    app.add_exception_handler(Unauthenticated, _on_unauthenticated)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unexpected)


# For the OpenAPI document: the error statuses an endpoint may answer.
def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
        400: "Malformed request (not JSON, not UTF-8)",
        401: "No bearer token, or an unknown one (for a command: checked before the body is read)",
        403: "NotAuthorized: this role may never make this command",
        404: "RunNotFound or ItemNotFound",
        409: "Conflict, StaleReview, LeaseLost, IllegalTransition, AlreadyTerminal or NotComplete",
        408: "The request body did not arrive in time",
        413: "Request body too large for this route",
        422: "InvalidInput or ManifestInvalid",
    }
    return {s: {"model": ErrorBody, "description": descriptions[s]} for s in statuses}
