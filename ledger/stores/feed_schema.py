"""Tables of the change feed (schema version 4): follower checkpoints and webhooks.

Ledger tables, not projections: a projection rebuild keeps them, and positions do
not change in a rebuild (they are the events' positions), so a checkpoint stays
valid across one.
"""

from __future__ import annotations

FOLLOWERS = "lg_followers"
WEBHOOKS = "lg_webhooks"
DELIVERIES = "lg_webhook_deliveries"


def ddl(dialect: str) -> list[str]:
    """CREATE statements for the feed's tables."""
    big = "BIGINT" if dialect == "postgres" else "INTEGER"
    return [
        # one row per follower name: the position it has handled up to (its checkpoint)
        f"""CREATE TABLE IF NOT EXISTS {FOLLOWERS} (
            name TEXT PRIMARY KEY,
            position {big} NOT NULL,
            run_id TEXT,
            kinds TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            owner TEXT
        )""",
        f"""CREATE TABLE IF NOT EXISTS {WEBHOOKS} (
            webhook_id TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            secret TEXT NOT NULL,
            run_id TEXT,
            kinds TEXT,
            created_at TEXT NOT NULL
        )""",
        # every delivery attempt, kept after its webhook is removed (what was sent where)
        f"""CREATE TABLE IF NOT EXISTS {DELIVERIES} (
            webhook_id TEXT NOT NULL,
            position {big} NOT NULL,
            attempt INTEGER NOT NULL,
            message_id TEXT NOT NULL,
            status INTEGER,
            ok INTEGER NOT NULL,
            error TEXT,
            at TEXT NOT NULL,
            duration_ms INTEGER NOT NULL,
            PRIMARY KEY (webhook_id, position, attempt)
        )""",
        f"CREATE INDEX IF NOT EXISTS {DELIVERIES}_at ON {DELIVERIES} (at)",
    ]
