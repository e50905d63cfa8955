"""Case 3: bulk submit of a big manifest until its first item is claimable.

Ledger side: submit(manifest of N items) + start + claim(limit=1), timed from the
submit call (the manifest dict is built beforehand) to the claim's return.
Baseline: raw executemany of N item rows (run_id, item_id, seq, required,
payload, state) in transactions of 1,000 rows. On PostgreSQL and on SQLite.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import uuid
from pathlib import Path
from typing import Any

from .common import Callback, Clock, PgTarget, Profiler, Row, Sizes, actors, manifest, ratio_row

ITEMS_DDL = (
    "CREATE TABLE bench_items (run_id TEXT NOT NULL, item_id TEXT NOT NULL, seq INTEGER NOT NULL, "
    "required INTEGER NOT NULL, payload TEXT NOT NULL, state TEXT NOT NULL, "
    "PRIMARY KEY (run_id, item_id))"
)


def item_rows(n: int) -> list[tuple[Any, ...]]:
    run_id = str(uuid.uuid4())
    return [(run_id, f"i{k}", k, 1, json.dumps({"n": k}), "pending") for k in range(n)]


def raw_pg(dsn: str, n: int, batch: int) -> float:
    import psycopg

    rows = item_rows(n)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ITEMS_DDL)
        with Clock() as clock:
            for k in range(0, n, batch):
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO bench_items VALUES (%s, %s, %s, %s, %s, %s)",
                        rows[k : k + batch],
                    )
        conn.execute("DROP TABLE bench_items")
    return n / clock.seconds


def sqlite_connect(path: str) -> sqlite3.Connection:
    """The ledger's SQLite settings: WAL, synchronous=FULL, explicit transactions."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def raw_sqlite(path: str, n: int, batch: int) -> float:
    rows = item_rows(n)
    conn = sqlite_connect(path)
    try:
        conn.execute(ITEMS_DDL)
        with Clock() as clock:
            for k in range(0, n, batch):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(
                    "INSERT INTO bench_items VALUES (?, ?, ?, ?, ?, ?)", rows[k : k + batch]
                )
                conn.execute("COMMIT")
    finally:
        conn.close()
    return n / clock.seconds


def ledger_submit(dsn: str, n: int, profiler: Profiler, name: str) -> float:
    """Seconds from submit to the first claim's return."""
    from ledger import Actor, Ledger

    m = manifest(n)
    submitter, controller = actors()
    worker = Actor("bench-w", "worker")
    with Ledger.open(dsn) as lg:
        with profiler.section(name), Clock() as clock:
            status = lg.submit(m, submitter)
            lg.start(status.run_id, controller)
            leases = lg.claim(status.run_id, worker, limit=1)
        if len(leases) != 1:
            raise RuntimeError(f"submit: the first claim returned {len(leases)} leases")
        counts = lg.status(status.run_id).counts
        if sum(counts.values()) != n:
            raise RuntimeError(f"submit: the run counts {counts}, expected {n} items")
    return clock.seconds


def run_pg(
    pg: PgTarget, sizes: Sizes, say: Callback, profiler: Profiler | None = None
) -> list[Row]:
    profiler = profiler or Profiler(None)
    n, batch = sizes.submit_items, sizes.submit_batch
    say(f"case 3: bulk submit on PostgreSQL, {n} items")
    with pg.database("c3") as dsn:
        seconds = ledger_submit(dsn, n, profiler, "case3_submit_pg")
        say(f"  ledger {n / seconds:,.0f} items/s ({seconds:.2f}s to claimable)")
        base = raw_pg(dsn, n, batch)
        say(f"  raw executemany {base:,.0f} rows/s")
    return [
        ratio_row(
            "3",
            f"PG submit {n} items to claimable",
            n / seconds,
            base,
            "items/s",
            0.3,
            note=f"{seconds:.2f}s; raw: {batch} rows/txn",
            seconds=seconds,
        )
    ]


def run_sqlite(
    sizes: Sizes, say: Callback, profiler: Profiler | None = None, tmp: Path | None = None
) -> list[Row]:
    profiler = profiler or Profiler(None)
    n, batch = sizes.submit_items, sizes.submit_batch
    say(f"case 3: bulk submit on SQLite, {n} items")
    with tempfile.TemporaryDirectory(dir=tmp, prefix="bench-c3-") as d:
        seconds = ledger_submit(f"sqlite:///{d}/ledger.db", n, profiler, "case3_submit_sqlite")
        say(f"  ledger {n / seconds:,.0f} items/s ({seconds:.2f}s to claimable)")
        base = raw_sqlite(f"{d}/raw.db", n, batch)
        say(f"  raw executemany {base:,.0f} rows/s")
    return [
        ratio_row(
            "3",
            f"SQLite submit {n} items to claimable",
            n / seconds,
            base,
            "items/s",
            0.3,
            note=f"{seconds:.2f}s; raw: {batch} rows/txn",
            seconds=seconds,
        )
    ]
