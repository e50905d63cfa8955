"""`serve(dsn, host, port, tokens_path, public_reads)`: run the HTTP API with uvicorn."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn

    from ledger.service.ledger import Ledger

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
KEEP_ALIVE_SECONDS = 5
# (the same values as protocol.HEADER_TIMEOUT_SECONDS and guard.READ_*_SECONDS; kept
# here so that importing this module does not import uvicorn)
HEADER_TIMEOUT_SECONDS = 10.0
READ_IDLE_SECONDS = 10.0
READ_TOTAL_SECONDS = 60.0


def make_server(
    lg: Ledger,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    tokens_path: str | os.PathLike[str] | None = None,
    public_reads: bool = False,
    log_level: str = "info",
    *,
    checkpoint_key: str | None = None,
    header_timeout: float = HEADER_TIMEOUT_SECONDS,
    read_idle_seconds: float = READ_IDLE_SECONDS,
    read_total_seconds: float = READ_TOTAL_SECONDS,
    keep_alive_seconds: int = KEEP_ALIVE_SECONDS,
) -> uvicorn.Server:
    """A uvicorn server for `create_app(lg, ...)`, not yet started (tests run it in a thread).

    Uvicorn's access log shows method, path and status only: tokens travel in the
    Authorization header or the session cookie, never in a URL, so none is logged.

    Slow clients are cut off: request headers must arrive within `header_timeout`
    seconds (protocol.py), each part of a body within `read_idle_seconds` and all of it
    within `read_total_seconds` (guard.py, 408), and an idle keep-alive connection is
    closed after `keep_alive_seconds`.
    """
    import uvicorn

    from ledger.http.app import create_app
    from ledger.http.protocol import protocol_with

    app = create_app(
        lg, tokens_path=tokens_path, public_reads=public_reads, checkpoint_key=checkpoint_key
    )
    app.state.read_deadline.idle_seconds = read_idle_seconds
    app.state.read_deadline.total_seconds = read_total_seconds
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        proxy_headers=False,
        server_header=False,
        lifespan="off",
        # event streams (GET /events/stream) never finish by themselves: cut them at shutdown
        timeout_graceful_shutdown=3,
        http=protocol_with(header_timeout),
        timeout_keep_alive=keep_alive_seconds,
    )
    return _server(config, app.state.feed_hub)


def _server(config: uvicorn.Config, hub: Any) -> uvicorn.Server:
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        """Ends the event streams first when it stops: they end cleanly at once, and the
        connections they held close with them."""

        async def shutdown(self, sockets: Any = None) -> None:
            await asyncio.to_thread(hub.close)
            await super().shutdown(sockets)

    return Server(config)


def serve(
    dsn: str | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    tokens_path: str | os.PathLike[str] | None = None,
    public_reads: bool = False,
    *,
    create: bool = True,
    announce: Callable[[str], None] | None = None,
    checkpoint_key: str | None = None,
) -> None:
    """Open the ledger at `dsn` (None: `LEDGER_DSN`, else `sqlite:///./ledger.db`), serve it
    on `host:port` until interrupted (Ctrl-C / SIGTERM), then close it. `create=False`:
    a missing SQLite file is refused (`StoreUnavailable`), not created empty.
    `announce(line)` is told what is served, where, and whether anyone can sign in.
    `checkpoint_key`: a checkpoint signing key's text for `GET /checkpoint` (else
    `$LEDGER_CHECKPOINT_KEY`; ledger/http/proofs.py)."""
    from ledger.core.redact import redact
    from ledger.feed.webhooks import Dispatcher
    from ledger.http.tokens import list_tokens
    from ledger.http.tokens import tokens_path as resolve_tokens
    from ledger.service.ledger import Ledger
    from ledger.stores import resolve_dsn

    lg = Ledger.open(dsn, create=create) if dsn else Ledger.open(create=create)
    webhooks = Dispatcher(lg)  # delivers to the ledger's webhooks while the API serves
    try:
        # built before anything is announced: a missing extra is the only thing said
        server = make_server(
            lg,
            host=host,
            port=port,
            tokens_path=tokens_path,
            public_reads=public_reads,
            checkpoint_key=checkpoint_key,
        )
        if announce is not None:
            where = resolve_tokens(tokens_path)
            known = len(list_tokens(tokens_path))
            announce(f"serving the ledger {redact(resolve_dsn(dsn))} on http://{host}:{port}/")
            if known:
                announce(f"{known} token(s) in {where}")
            else:
                announce(
                    f"no token in {where} yet: nobody can sign in or send a command; "
                    "make one with `ledger token add ACTOR_ID ROLE`"
                )
            if public_reads:
                announce("reads are public (--public-reads): anyone who can reach the port reads")
        webhooks.start()
        server.run()
    finally:
        webhooks.stop()
        lg.close()
