"""Stores: adapters that hold the events and the projections in one database."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime

from ledger.core.errors import InvalidInput, StoreUnavailable
from ledger.core.extras import missing_extra
from ledger.core.redact import redact
from ledger.stores.base import Store

DEFAULT_DSN = "sqlite:///./ledger.db"


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to use: the argument, else LEDGER_DSN, else the SQLite default."""
    return dsn or os.environ.get("LEDGER_DSN") or DEFAULT_DSN


def open_store(
    dsn: str,
    clock: Callable[[], datetime] | None = None,
    *,
    create: bool = True,
    green: bool = False,
) -> Store:
    """Open the store a DSN names; a missing SQLite file is created only with `create`.
    `green`: the store `AsyncLedger` runs over (ledger/stores/green.py).

    A `postgresql://` DSN needs the `postgres` extra: without psycopg this raises
    `MissingExtra` naming the pip command."""
    if dsn.startswith(("memory://", "sqlite://")):
        from ledger.stores.sqlite import SqliteStore
        from ledger.stores.sqlite_green import GreenSqliteStore

        sqlite_store = GreenSqliteStore if green else SqliteStore
    if dsn.startswith("memory://"):
        return sqlite_store(None, clock=clock)
    if dsn.startswith("sqlite://"):
        path = dsn[len("sqlite://") :]
        path = path.removeprefix("/")  # sqlite:///rel.db -> rel.db ; sqlite:////abs.db -> /abs.db
        if not path:
            raise InvalidInput(
                "sqlite DSN needs a path: sqlite:///relative.db or sqlite:////abs.db"
            )
        if not create and not os.path.exists(path):
            raise StoreUnavailable(
                f"the SQLite file {path!r} does not exist (only submit, import "
                "and demo create a ledger; check --dsn or $LEDGER_DSN)"
            )
        return sqlite_store(path, clock=clock)
    if dsn.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg
            from eventsourcing.persistence import InterfaceError as ESInterfaceError
            from eventsourcing.persistence import OperationalError as ESOperationalError

            from ledger.stores.pg_green import GreenPostgresStore
            from ledger.stores.postgres import PostgresStore
        except ModuleNotFoundError as e:
            raise missing_extra(e) or e from None

        try:
            return (GreenPostgresStore if green else PostgresStore)(dsn, clock=clock)
        except (psycopg.OperationalError, ESOperationalError, ESInterfaceError) as e:
            # unreachable, refused, bad password, no such database: typed like a missing
            # SQLite file, with libpq's reason (secrets redacted). The pool's first queries
            # (type adapters, the recorder) fail as eventsourcing's errors: a statement
            # timeout or a terminated backend there is the same fault, typed the same.
            raise StoreUnavailable(
                f"cannot open the PostgreSQL ledger: {redact(str(e).strip())}"
            ) from e
    raise InvalidInput(
        f"unsupported DSN {dsn.split(':', 1)[0]!r}; use sqlite:///PATH, postgresql://... or memory://"
    )
