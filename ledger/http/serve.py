"""`serve(dsn, host, port, tokens_path, public_reads)`: run the HTTP API with uvicorn."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uvicorn

    from ..service import Ledger

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def make_server(
    lg: Ledger,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    tokens_path: str | os.PathLike[str] | None = None,
    public_reads: bool = False,
    log_level: str = "info",
) -> uvicorn.Server:
    """A uvicorn server for `create_app(lg, ...)`, not yet started (tests run it in a thread).

    Uvicorn's access log shows method, path and status only: tokens travel in the
    Authorization header or the session cookie, never in a URL, so none is logged.
    """
    import uvicorn

    from .app import create_app

    app = create_app(lg, tokens_path=tokens_path, public_reads=public_reads)
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
    )
    return uvicorn.Server(config)


def serve(
    dsn: str | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    tokens_path: str | os.PathLike[str] | None = None,
    public_reads: bool = False,
) -> None:
    """Open the ledger at `dsn` (None: `LEDGER_DSN`, else `sqlite:///./ledger.db`), serve it
    on `host:port` until interrupted (Ctrl-C / SIGTERM), then close it."""
    from ..service import Ledger
    from ..webhooks import Dispatcher

    lg = Ledger.open(dsn) if dsn else Ledger.open()
    webhooks = Dispatcher(lg)  # delivers to the ledger's webhooks while the API serves
    try:
        webhooks.start()
        make_server(
            lg, host=host, port=port, tokens_path=tokens_path, public_reads=public_reads
        ).run()
    finally:
        webhooks.stop()
        lg.close()
