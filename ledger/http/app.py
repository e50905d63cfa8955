"""`create_app(lg, tokens_path=None, public_reads=False) -> FastAPI`: the HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ledger.core.manifest import Manifest
from ledger.core.note import Signer
from ledger.http import commands, docs, feed, operator, page, proofs, reads
from ledger.http.auth import Gate
from ledger.http.errors import install_error_handlers
from ledger.http.guard import SUBMIT_BODY_BYTES, ReadDeadline, RequestGuard
from ledger.http.streams import FeedHub
from ledger.http.tokens import TokenFile

CHECKPOINT_KEY_ENV = "LEDGER_CHECKPOINT_KEY"  # the key's text, as `ledger checkpoint sign` reads it

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

TITLE = "run-ledger"
API_VERSION = "1"
# The largest body of any route (a manifest plus room for the JSON around it).
MAX_BODY_BYTES = SUBMIT_BODY_BYTES

DESCRIPTION = """\
The durable, auditable record of runs and items, over HTTP: the reads and
commands of the `Ledger` service (the documentation in `docs/`: reference and rule book).

Authentication: `Authorization: Bearer <token>`, a token made by
`ledger token add ACTOR_ID ROLE`; it stands for that actor and role. Reads are
open without a token only when the server runs with `--public-reads`.

Errors have the body `{"error": Type, "message": ...}`: 400 or 422 invalid
input (InvalidInput, ManifestInvalid), 401 no or unknown token, 403
NotAuthorized, 404 RunNotFound or ItemNotFound, 409 Conflict, StaleReview,
LeaseLost, IllegalTransition, AlreadyTerminal or NotComplete.
"""


def _openapi_schema(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    # The submit body is read raw (so the ledger's ManifestInvalid names the field);
    # document it with the manifest model itself.
    definitions = Manifest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in definitions.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components["Manifest"] = definitions
    app.openapi_schema = schema
    return schema


def create_app(
    lg: Ledger,
    tokens_path: str | os.PathLike[str] | None = None,
    public_reads: bool = False,
    checkpoint_key: str | None = None,
) -> FastAPI:
    """The ASGI app serving `lg`: JSON reads and commands, `/openapi.json`, and the
    operator page at `/`.

    `tokens_path`: the tokens file (else `$LEDGER_TOKENS`, else `./ledger.tokens`);
    a missing file means no tokens (every command is a 401), a malformed one raises
    `InvalidInput` here. `public_reads`: anonymous callers may read and see the page.
    `checkpoint_key`: the text of a checkpoint signing key (else `$LEDGER_CHECKPOINT_KEY`,
    else none): `GET /checkpoint` is then signed (proofs.py); a malformed key raises here.
    The caller keeps ownership of `lg` (closing the app does not close it).
    """
    hub = FeedHub(lg)  # event streams: one head watcher, capped (streams.py)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.to_thread(hub.close)  # every stream ends with the app

    app = FastAPI(
        lifespan=lifespan,
        title=TITLE,
        version=API_VERSION,
        description=DESCRIPTION,
        docs_url=None,  # FastAPI's Swagger UI loads its script from a CDN: ours is docs.py
        redoc_url=None,
    )
    app.state.ledger = lg
    app.state.gate = Gate(tokens=TokenFile(tokens_path), public_reads=public_reads)
    app.state.feed_hub = hub
    key = checkpoint_key or os.environ.get(CHECKPOINT_KEY_ENV) or None
    app.state.checkpoint_signer = None if key is None else Signer.parse(key)
    install_error_handlers(app)
    # token before body, per-route body limits, read deadlines (guard.py)
    app.state.read_deadline = ReadDeadline()
    app.add_middleware(RequestGuard, gate=app.state.gate, deadline=app.state.read_deadline)
    app.include_router(page.router)
    app.include_router(docs.router)
    app.include_router(reads.router)
    app.include_router(feed.router)
    app.include_router(proofs.router)
    app.include_router(commands.router)
    operator.install(app)  # GET /overview, GET /metrics and the request metrics
    app.mount("/static", page.static_files(), name="static")
    app.openapi = lambda: _openapi_schema(app)  # type: ignore[method-assign]
    return app


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the app serves at `/openapi.json` (no ledger or tokens needed)."""
    app = create_app(None, tokens_path=os.devnull)  # type: ignore[arg-type]
    return app.openapi()


def openapi_text() -> str:
    """The document as committed in `docs/openapi.json`."""
    import json

    return json.dumps(openapi_document(), indent=2, ensure_ascii=False) + "\n"
