"""PostgreSQL's versioned schema: the migrations in order (version N is the Nth) and the
version a database records. `PostgresStore` applies them under an advisory lock.
"""

from __future__ import annotations

from typing import Any

import psycopg
from eventsourcing.postgres import PostgresDatastore

from projections import counts as run_counts
from projections.schema import (
    narrowed_index_migration,
    optional_index_migration,
    paging_index_ddl,
    projection_ddl,
)

from ..idempotency import ddl as idempotency_ddl
from . import feed_schema, hashchain, pg_positions
from .base import SCHEMA_VERSION
from .pg_recorder import LedgerPostgresRecorder

EVENTS_TABLE = "ledger_events"


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The ledger schema version recorded in the database; 0 when there is none."""
    row = conn.execute("SELECT to_regclass('ledger_meta') IS NOT NULL AS present").fetchone()
    if not row or not row["present"]:
        return 0
    row = conn.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
    return int(row["value"]) if row else 0


def migrations(datastore: PostgresDatastore) -> list[list[Any]]:
    """Versioned schema changes, in order; version N is the Nth entry."""
    rec = LedgerPostgresRecorder(datastore, events_table_name=EVENTS_TABLE)
    types = [s for s in rec.sql_create_statements if "CREATE TYPE" in s.as_string()]
    rest = [s for s in rec.sql_create_statements if "CREATE TYPE" not in s.as_string()]
    v1: list[Any] = (
        types
        + rest
        + projection_ddl("postgres")
        + [
            "CREATE TABLE IF NOT EXISTS lg_tracking (name TEXT PRIMARY KEY, position BIGINT NOT NULL)",
        ]
    )
    v2: list[Any] = [
        *hashchain.ddl("postgres"),
        # events written before the hash chain existed are not chained (see hashchain.py)
        (
            f"INSERT INTO ledger_meta (key, value) SELECT 'hash_chain_from', "  # noqa: S608 (our own table/column names; values are bound parameters)
            f"COALESCE(MAX(notification_id), 0)::text FROM {EVENTS_TABLE}"
        ),
    ]
    v3: list[Any] = idempotency_ddl(
        "postgres"
    )  # idempotency keys of commands (ledger/idempotency.py)
    v4: list[Any] = feed_schema.ddl("postgres")  # follower checkpoints, webhooks
    v5: list[Any] = [
        # positions without the table lock (pg_positions.py)
        *pg_positions.ddl(EVENTS_TABLE),
        "INSERT INTO ledger_meta (key, value) VALUES ('positions', 'announced') "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    ]
    v6: list[Any] = list(paging_index_ddl())  # indexes of the paged reads (ledger/paging.py)
    v7: list[Any] = run_counts.migration("postgres")  # counts off the run row (issue 15)
    # v8: ledger_reserve_positions draws single positions under the block mutex too
    v8: list[Any] = pg_positions.ddl(EVENTS_TABLE)[:1]
    # v9: partial role, state and lease indexes; fillfactor 50 on items and attempts (issue 15)
    v9: list[Any] = narrowed_index_migration("postgres")
    # v10: the index of optional open items (the status read's required count)
    v10: list[Any] = optional_index_migration()
    # v11: each event's hash on its row; the hash table folded in and dropped (issue 15)
    v11: list[Any] = hashchain.migration("postgres", EVENTS_TABLE)
    out = [v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11]
    assert len(out) == SCHEMA_VERSION
    return out
