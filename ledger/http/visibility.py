"""Lease tokens in HTTP reads: masked for every reader but their holder and operators
(`ledger.core.visibility`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi.responses import JSONResponse

from ledger.core.views import Actor
from ledger.core.visibility import FINGERPRINT_PREFIX, fingerprint, for_reader


def reader_response(
    values: Iterable[Any], reader: Actor | None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """A list of views as JSON, lease tokens masked for `reader`."""
    return JSONResponse(content=for_reader((v.to_dict() for v in values), reader), headers=headers)


__all__ = ["FINGERPRINT_PREFIX", "fingerprint", "for_reader", "reader_response"]
