"""Projection tables. `suffix` lets a rebuild build a fresh set beside the live one.

A new projection table goes into PROJECTION_TABLES and TABLE_KEYS (its primary
key): rebuilds, verify and checksums walk those; its indexes follow the live
table's through a rebuild.
"""

from __future__ import annotations

PROJECTION_TABLES = ("lg_runs", "lg_items", "lg_attempts", "lg_transitions", "lg_run_counts")

# Primary key of each projection table: the order checksums and diffs walk rows in.
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "lg_runs": ("run_id",),
    "lg_items": ("run_id", "item_id"),
    "lg_attempts": ("run_id", "item_id", "attempt"),
    "lg_transitions": ("position", "ord"),
    "lg_run_counts": ("run_id", "slot", "state"),
}


def table_ddl(dialect: str, suffix: str = "") -> list[str]:
    """CREATE TABLE statements only (a rebuild fills bare tables, then indexes them)."""
    return [s for s in projection_ddl(dialect, suffix) if not s.startswith("CREATE INDEX")]


def index_ddl(dialect: str, suffix: str = "") -> list[str]:
    """CREATE INDEX statements only (names are the table's name plus a fixed tail)."""
    return [s for s in projection_ddl(dialect, suffix) if s.startswith("CREATE INDEX")]


def paging_index_ddl(suffix: str = "") -> list[str]:
    """The indexes schema v6 added for paged reads (also part of projection_ddl)."""
    return [
        s
        for s in index_ddl("sqlite", suffix)
        if s.split()[5] in (f"lg_items{suffix}_seq", f"lg_attempts{suffix}_started")
    ]


def projection_ddl(dialect: str, suffix: str = "") -> list[str]:
    """CREATE statements for every projection table and index."""
    big = "BIGINT" if dialect == "postgres" else "INTEGER"
    t = {name: name + suffix for name in PROJECTION_TABLES}
    return [
        f"""CREATE TABLE IF NOT EXISTS {t["lg_runs"]} (
            run_id TEXT PRIMARY KEY,
            seq {big} NOT NULL,
            state TEXT NOT NULL,
            revision INTEGER NOT NULL,
            source_version TEXT NOT NULL,
            config_version TEXT NOT NULL,
            scope TEXT NOT NULL,
            created_by TEXT NOT NULL,
            created_at TEXT NOT NULL,
            started_at TEXT,
            stopped_at TEXT,
            updated_at TEXT NOT NULL,
            failure_kind TEXT,
            failure_reason TEXT,
            stop_reason TEXT,
            summary TEXT NOT NULL,
            input_version TEXT NOT NULL,
            policy TEXT NOT NULL,
            review TEXT,
            cancel_requested INTEGER NOT NULL,
            links TEXT NOT NULL,
            root_run_id TEXT NOT NULL,
            counts TEXT NOT NULL,
            item_count INTEGER NOT NULL
        )""",
        f"CREATE INDEX IF NOT EXISTS {t['lg_runs']}_state ON {t['lg_runs']} (state, seq)",
        f"CREATE INDEX IF NOT EXISTS {t['lg_runs']}_seq ON {t['lg_runs']} (seq)",
        f"CREATE INDEX IF NOT EXISTS {t['lg_runs']}_root ON {t['lg_runs']} (root_run_id, seq)",
        f"""CREATE TABLE IF NOT EXISTS {t["lg_items"]} (
            run_id TEXT NOT NULL,
            item_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            required INTEGER NOT NULL,
            payload TEXT NOT NULL,
            in_manifest INTEGER NOT NULL,
            state TEXT NOT NULL,
            revision INTEGER NOT NULL,
            attempts INTEGER NOT NULL,
            lease_token TEXT,
            lease_worker TEXT,
            lease_expires_at TEXT,
            eligible_at TEXT,
            last_error TEXT,
            reason TEXT,
            updated_at TEXT,
            PRIMARY KEY (run_id, item_id)
        )""",
        f"CREATE INDEX IF NOT EXISTS {t['lg_items']}_state ON {t['lg_items']} (run_id, state, seq)",
        f"CREATE INDEX IF NOT EXISTS {t['lg_items']}_lease ON {t['lg_items']} (state, lease_expires_at)",
        # keyset pages of a run's items in manifest order (ledger/paging.py; schema v6)
        f"CREATE INDEX IF NOT EXISTS {t['lg_items']}_seq ON {t['lg_items']} (run_id, seq)",
        f"""CREATE TABLE IF NOT EXISTS {t["lg_attempts"]} (
            run_id TEXT NOT NULL,
            item_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            worker_id TEXT NOT NULL,
            lease_token TEXT NOT NULL,
            started_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            finished_at TEXT,
            stage TEXT,
            outcome TEXT,
            error TEXT,
            PRIMARY KEY (run_id, item_id, attempt)
        )""",
        # keyset pages of a run's attempts, oldest first (ledger/paging.py; schema v6)
        f"CREATE INDEX IF NOT EXISTS {t['lg_attempts']}_started ON {t['lg_attempts']} (run_id, started_at)",
        f"""CREATE TABLE IF NOT EXISTS {t["lg_transitions"]} (
            position {big} NOT NULL,
            ord INTEGER NOT NULL,
            run_id TEXT NOT NULL,
            item_id TEXT,
            command TEXT NOT NULL,
            from_state TEXT NOT NULL,
            to_state TEXT NOT NULL,
            actor_id TEXT NOT NULL,
            role TEXT NOT NULL,
            reason TEXT,
            evidence TEXT NOT NULL,
            at TEXT NOT NULL,
            revision INTEGER NOT NULL,
            PRIMARY KEY (position, ord)
        )""",
        f"CREATE INDEX IF NOT EXISTS {t['lg_transitions']}_run ON {t['lg_transitions']} (run_id, position, ord)",
        f"CREATE INDEX IF NOT EXISTS {t['lg_transitions']}_actor ON {t['lg_transitions']} (actor_id, position, ord)",
        f"CREATE INDEX IF NOT EXISTS {t['lg_transitions']}_role ON {t['lg_transitions']} (role, position, ord)",
        f"CREATE INDEX IF NOT EXISTS {t['lg_transitions']}_state ON {t['lg_transitions']} (to_state, position, ord)",
        f"CREATE INDEX IF NOT EXISTS {t['lg_transitions']}_at ON {t['lg_transitions']} (at, position, ord)",
        # per-state item counts of open runs, in slots (projections/counts.py; schema v7)
        run_counts_table_ddl(dialect, t["lg_run_counts"]),
    ]


def run_counts_table_ddl(dialect: str, table: str = "lg_run_counts") -> str:
    """The slotted item counts of the runs not yet terminal (projections/counts.py)."""
    big = "BIGINT" if dialect == "postgres" else "INTEGER"
    return f"""CREATE TABLE IF NOT EXISTS {table} (
            run_id TEXT NOT NULL,
            slot INTEGER NOT NULL,
            state TEXT NOT NULL,
            n {big} NOT NULL,
            PRIMARY KEY (run_id, slot, state)
        )"""
