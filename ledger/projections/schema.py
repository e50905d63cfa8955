"""Projection tables. `suffix` lets a rebuild build a fresh set beside the live one.

A new projection table goes into PROJECTION_TABLES and TABLE_KEYS (its primary
key): rebuilds, verify and checksums walk those; its indexes follow the live
table's through a rebuild.
"""

from __future__ import annotations

PROJECTION_TABLES = ("lg_runs", "lg_items", "lg_attempts", "lg_run_counts")
# The transitions are no projection: their columns are on the event log's rows, written
# with the events, and `lg_transitions` is a view of them (schema v17, ledger/core/recorded.py).

# Primary key of each projection table: the order checksums and diffs walk rows in.
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "lg_runs": ("run_id",),
    "lg_items": ("run_id", "item_id"),
    "lg_attempts": ("run_id", "item_id", "attempt"),
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


# Schema v9 (fewer bytes per item), PostgreSQL only: lg_items_lease holds only the leased
# items (the one state its queries ask for), and lg_items leaves room on each page
# (fillfactor 50), so the claim and the outcome rewrite an item on the row's own page,
# logged as the bytes that changed, not the whole row. An item's update cannot be HOT: its
# state is indexed (lg_items_state), and the claim, the status and the paged reads find
# items by state. (v9 narrowed the transitions' role and target-state indexes the same
# way; since v17 those are on the event log: its migration file.) An attempt's row is
# written once, when the attempt ends (schema v18), and never updated: lg_attempts keeps
# the default fillfactor (v9 gave it 40, for the outcome's HOT update of its row).
PG_FILLFACTOR = {"lg_items": 50}


def optional_index_migration(suffix: str = "") -> list[str]:
    """Schema v10: `lg_items_optional`, the open items that are not required (both stores).
    A status read counts the required items still open as the run's open counts less
    these (ledger/reads/signals.py), where it counted every open item of the run; a required
    item never has an entry, so the index costs nothing to the items most runs hold."""
    return [s for s in index_ddl("sqlite", suffix) if s.split()[5] == f"lg_items{suffix}_optional"]


def projection_ddl(dialect: str, suffix: str = "") -> list[str]:
    """CREATE statements for every projection table and index."""
    pg = dialect == "postgres"
    big = "BIGINT" if pg else "INTEGER"
    t = {name: name + suffix for name in PROJECTION_TABLES}
    ff = {
        name: f" WITH (fillfactor = {PG_FILLFACTOR[name]})" if pg and name in PG_FILLFACTOR else ""
        for name in PROJECTION_TABLES
    }
    lease = "(lease_expires_at) WHERE state = 'in_progress'" if pg else "(state, lease_expires_at)"
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
        # the longest waits of the overview, 20 index entries each: queued runs by creation,
        # running ones by their last change (schema v12)
        f"CREATE INDEX IF NOT EXISTS {t['lg_runs']}_created ON {t['lg_runs']} (state, created_at, seq)",
        f"CREATE INDEX IF NOT EXISTS {t['lg_runs']}_updated ON {t['lg_runs']} (state, updated_at, seq)",
        # the runs whose policy sets its own stall threshold, for the overview (schema v15);
        # the test is written without LIKE's percent signs, which psycopg would read
        f"CREATE INDEX IF NOT EXISTS {t['lg_runs']}_own_stall ON {t['lg_runs']} (state, seq) "
        "WHERE length(replace(policy, '\"stall_seconds\"', '')) < length(policy)",
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
            lease_started_at TEXT,
            PRIMARY KEY (run_id, item_id)
        )"""
        + ff["lg_items"],
        f"CREATE INDEX IF NOT EXISTS {t['lg_items']}_state ON {t['lg_items']} (run_id, state, seq)",
        f"CREATE INDEX IF NOT EXISTS {t['lg_items']}_lease ON {t['lg_items']} {lease}",
        # keyset pages of a run's items in manifest order (ledger/reads/paging.py; schema v6)
        f"CREATE INDEX IF NOT EXISTS {t['lg_items']}_seq ON {t['lg_items']} (run_id, seq)",
        # the optional items still open, for the required ones' count (schema v10)
        f"CREATE INDEX IF NOT EXISTS {t['lg_items']}_optional ON {t['lg_items']} (run_id, state) "
        "WHERE required = 0",
        # the open attempts (the leases of the items in progress) by start, for the paged
        # reads of a run's attempts (ledger/reads/queries.sql; schema v18)
        f"CREATE INDEX IF NOT EXISTS {t['lg_items']}_leased ON {t['lg_items']} "
        "(run_id, lease_started_at) WHERE state = 'in_progress'",
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
        )"""
        + ff["lg_attempts"],
        # keyset pages of a run's attempts, oldest first (ledger/reads/paging.py; schema v6)
        f"CREATE INDEX IF NOT EXISTS {t['lg_attempts']}_started ON {t['lg_attempts']} (run_id, started_at)",
        # per-state item counts of open runs, in slots (ledger/projections/counts.py; schema v7)
        run_counts_table_ddl(dialect, t["lg_run_counts"]),
    ]


def run_counts_table_ddl(dialect: str, table: str = "lg_run_counts") -> str:
    """The slotted item counts of the runs not yet terminal (ledger/projections/counts.py)."""
    big = "BIGINT" if dialect == "postgres" else "INTEGER"
    return f"""CREATE TABLE IF NOT EXISTS {table} (
            run_id TEXT NOT NULL,
            slot INTEGER NOT NULL,
            state TEXT NOT NULL,
            n {big} NOT NULL,
            PRIMARY KEY (run_id, slot, state)
        )"""
