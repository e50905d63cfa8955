"""PostgreSQL's versioned schema: the migrations in order (version N is the Nth) and the
version a database records. `PostgresStore` applies them under an advisory lock.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ledger.stores.migrations import steps as schema_steps
from ledger.stores.sql import STATEMENTS

EVENTS_TABLE = "ledger_events"


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The ledger schema version recorded in the database; 0 when there is none."""
    row = conn.execute(STATEMENTS.sql("postgres", "meta_table_present")).fetchone()
    if not row or not row["present"]:
        return 0
    row = conn.execute(STATEMENTS.sql("postgres", "schema_version")).fetchone()
    return int(row["value"]) if row else 0


def migrations() -> list[list[str]]:
    """Versioned schema changes, in order; version N is the Nth entry."""
    return schema_steps("postgres")
