"""Request bodies are parsed as strict JSON (ledger.core.validation.strict_loads), the same
rule as the Python API and the CLI: no NaN or Infinity, no duplicate keys, no lone
surrogate escapes, bounded depth. Starlette's `Request.json()` would take all of
those; a refusal here is a 400 naming what was wrong."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from ledger.core.errors import InvalidInput
from ledger.core.validation import MAX_MANIFEST_BYTES, strict_loads


def strict_body(raw: bytes, max_bytes: int = MAX_MANIFEST_BYTES) -> Any:
    """The body's JSON value, or HTTP 400 with the boundary's message."""
    try:
        return strict_loads(raw, "request body", max_bytes)
    except InvalidInput as e:
        raise HTTPException(400, e.message) from None


class StrictRequest(Request):
    """A request whose `json()` is strict."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_body(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An APIRoute whose handlers see a `StrictRequest`, so FastAPI's own body parsing
    (for the pydantic body models) is strict too."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictRequest(request.scope, request.receive))

        return strict_handler
