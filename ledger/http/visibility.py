"""Lease tokens are shown only to their holder and to operators.

A lease token is the authority to write an item's outcome; a read (items,
attempts, history, audit) must not hand it to every reader, least of all to
anonymous ones under `--public-reads`. Other readers see a fingerprint instead:
`fp:` and 12 hex digits of the token's SHA-256, enough to tell leases apart in an
investigation, useless as a token. The Python API and the CLI (which hold the
database itself) show tokens as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi.responses import JSONResponse

from ledger.core.states import OPERATOR, WORKER
from ledger.core.views import Actor

FINGERPRINT_PREFIX = "fp:"


def fingerprint(token: str) -> str:
    """What a reader who does not hold the lease sees instead of its token."""
    return FINGERPRINT_PREFIX + hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()[:12]


def _may_see(reader: Actor | None, holder: Any) -> bool:
    if reader is None:
        return False
    if reader.role == OPERATOR:
        return True
    return reader.role == WORKER and isinstance(holder, str) and holder == reader.id


def _masked(doc: dict[str, Any], reader: Actor | None) -> dict[str, Any]:
    """One read document (an item, attempt or transition) as `reader` may see it."""
    lease = doc.get("lease")
    if (
        isinstance(lease, Mapping)
        and isinstance(lease.get("token"), str)
        and not _may_see(reader, lease.get("worker_id"))
    ):
        doc = {**doc, "lease": {**lease, "token": fingerprint(lease["token"])}}
    token = doc.get("lease_token")
    if isinstance(token, str) and not _may_see(reader, doc.get("worker_id")):
        doc = {**doc, "lease_token": fingerprint(token)}
    evidence = doc.get("evidence")
    if isinstance(evidence, Mapping) and isinstance(evidence.get("lease_token"), str):
        holder = doc.get("actor_id") if doc.get("role") == WORKER else None
        if not _may_see(reader, holder):
            doc = {
                **doc,
                "evidence": {**evidence, "lease_token": fingerprint(evidence["lease_token"])},
            }
    return doc


def for_reader(docs: Iterable[dict[str, Any]], reader: Actor | None) -> list[dict[str, Any]]:
    """`docs` with every lease token `reader` may not see replaced by its fingerprint."""
    if reader is not None and reader.role == OPERATOR:
        return list(docs)
    return [_masked(doc, reader) for doc in docs]


def reader_response(
    values: Iterable[Any], reader: Actor | None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """A list of views as JSON, lease tokens masked for `reader`."""
    return JSONResponse(content=for_reader((v.to_dict() for v in values), reader), headers=headers)
