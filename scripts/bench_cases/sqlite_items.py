"""Case 6: SQLite, one process: N items claimed and accepted in batches of B.

Ledger side: claim(limit=B) + record(B accepts) until the run is drained.
Baseline: raw sqlite3 with the ledger's settings (WAL, synchronous=FULL) writing
the equivalent rows: per batch, one claim transaction (executemany of B state
updates and B event rows) and one accept transaction (the same again), i.e. the
item state change and an appended 200-byte event per transition.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from .common import (
    PAYLOAD_BYTES,
    Callback,
    Clock,
    Profiler,
    Row,
    Sizes,
    accept_all,
    ratio_row,
    running_run,
)
from .submit import sqlite_connect


def raw_items(path: str, n: int, batch: int) -> float:
    """Items per second through the raw equivalent."""
    conn = sqlite_connect(path)
    try:
        conn.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, state TEXT NOT NULL, worker TEXT)")
        conn.execute(
            "CREATE TABLE ev (stream TEXT NOT NULL, version INTEGER NOT NULL, "
            "topic TEXT NOT NULL, state BLOB NOT NULL, PRIMARY KEY (stream, version))"
        )
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO q (id, state) VALUES (?, 'pending')", [(k,) for k in range(n)]
        )
        conn.execute("COMMIT")
        streams = [uuid.uuid4().hex for _ in range(n)]
        pad = b"x" * PAYLOAD_BYTES
        with Clock() as clock:
            done = 0
            while True:
                conn.execute("BEGIN IMMEDIATE")
                ids = [
                    r[0]
                    for r in conn.execute(
                        "SELECT id FROM q WHERE state = 'pending' ORDER BY id LIMIT ?", (batch,)
                    )
                ]
                if not ids:
                    conn.execute("COMMIT")
                    break
                conn.executemany(
                    "UPDATE q SET state = 'in_progress', worker = 'w' WHERE id = ?",
                    [(i,) for i in ids],
                )
                conn.executemany(
                    "INSERT INTO ev VALUES (?, 1, 'claim', ?)", [(streams[i], pad) for i in ids]
                )
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(
                    "UPDATE q SET state = 'accepted' WHERE id = ?", [(i,) for i in ids]
                )
                conn.executemany(
                    "INSERT INTO ev VALUES (?, 2, 'accept', ?)", [(streams[i], pad) for i in ids]
                )
                conn.execute("COMMIT")
                done += len(ids)
        if done != n:
            raise RuntimeError(f"raw sqlite: {done} of {n} items")
    finally:
        conn.close()
    return n / clock.seconds


def run(
    sizes: Sizes, say: Callback, profiler: Profiler | None = None, tmp: Path | None = None
) -> list[Row]:
    from ledger import Actor, Ledger

    profiler = profiler or Profiler(None)
    n, batch = sizes.sqlite_items, sizes.sqlite_batch
    say(f"case 6: SQLite, {n} items in batches of {batch}")
    with tempfile.TemporaryDirectory(dir=tmp, prefix="bench-c6-") as d:
        with Ledger.open(f"sqlite:///{d}/ledger.db") as lg:
            run_id = running_run(lg, n)
            with profiler.section("case6_sqlite"), Clock() as clock:
                done = accept_all(lg, run_id, Actor("bench-w", "worker"), batch)
            if done != n or lg.status(run_id).counts.get("accepted") != n:
                raise RuntimeError(f"sqlite: {done} of {n} items accepted")
        rate = n / clock.seconds
        say(f"  ledger {rate:,.0f} items/s ({clock.seconds:.1f}s)")
        base = raw_items(f"{d}/raw.db", n, batch)
        say(f"  raw sqlite3 {base:,.0f} items/s")
    return [
        ratio_row(
            "6",
            f"SQLite items/s, claim({batch})+record",
            rate,
            base,
            "items/s",
            0.3,
            note=f"{n} items, {clock.seconds:.1f}s",
        )
    ]
