"""Case 2: append throughput on PostgreSQL, one process.

Ledger side: item transitions in batches: claim(limit=B) then record B accepts,
until the run is drained; events appended per second (counted in the store).
Baseline: raw psycopg executemany of as many rows (uuid, version, topic,
200-byte payload; primary key (stream, version)) in transactions of B rows.
"""

from __future__ import annotations

import uuid

from .common import (
    PAYLOAD_BYTES,
    Callback,
    Clock,
    PgTarget,
    Profiler,
    Row,
    Sizes,
    accept_all,
    event_count,
    ratio_row,
    running_run,
)

EVENTS_DDL = (
    "CREATE TABLE bench_events (stream UUID NOT NULL, version INTEGER NOT NULL, "
    "topic TEXT NOT NULL, state BYTEA NOT NULL, PRIMARY KEY (stream, version))"
)
INSERT_SQL = "INSERT INTO bench_events (stream, version, topic, state) VALUES (%s, %s, %s, %s)"
TOPIC = "ledger.domain:Item.Transitioned"


def raw_rows(n: int) -> list[tuple[uuid.UUID, int, str, bytes]]:
    """n event-like rows: streams of 3 versions each, 200-byte states."""
    rows = []
    stream = uuid.uuid4()
    for k in range(n):
        version = k % 3 + 1
        if version == 1:
            stream = uuid.uuid4()
        rows.append(
            (
                stream,
                version,
                TOPIC,
                (b'{"k":%12d,"pad":"' % k).ljust(PAYLOAD_BYTES - 2, b"x") + b'"}',
            )
        )
    return rows


def raw_append(dsn: str, n: int, batch: int) -> float:
    """Rows per second for n rows, `batch` per transaction (executemany)."""
    import psycopg

    rows = raw_rows(n)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EVENTS_DDL)
        with Clock() as clock:
            for k in range(0, n, batch):
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(INSERT_SQL, rows[k : k + batch])
        conn.execute("DROP TABLE bench_events")
    return n / clock.seconds


def run(pg: PgTarget, sizes: Sizes, say: Callback, profiler: Profiler | None = None) -> list[Row]:
    from ledger import Actor, Ledger

    profiler = profiler or Profiler(None)
    n, batch = sizes.append_items, sizes.append_batch
    say(f"case 2: append, {n} items in batches of {batch}")
    with pg.database("c2") as dsn:
        with Ledger.open(dsn) as lg:
            run_id = running_run(lg, n)
            before = event_count(lg)
            worker = Actor("bench-appender", "worker")
            with profiler.section("case2_append"), Clock() as clock:
                done = accept_all(lg, run_id, worker, batch)
            events = event_count(lg) - before
            with lg.store.read() as tx:
                size = tx.fetchone(
                    f"SELECT avg(octet_length(state)) AS b FROM {lg.store.events_table()}"  # noqa: S608 (our own table/column names; values are bound parameters)
                )
        if done != n:
            raise RuntimeError(f"append: {done} of {n} items accepted")
        rate = events / clock.seconds
        say(f"  ledger {rate:,.0f} events/s ({events} events in {clock.seconds:.1f}s)")
        base = raw_append(dsn, events, batch)
        say(f"  raw executemany {base:,.0f} rows/s")
    avg = float(size["b"]) if size and size["b"] is not None else 0.0
    return [
        ratio_row(
            "2",
            f"PG append events/s, batches of {batch}",
            rate,
            base,
            "events/s",
            0.5,
            note=f"{events} events, {clock.seconds:.1f}s; ledger event state avg "
            f"{avg:.0f} B vs {PAYLOAD_BYTES} B raw",
            events=events,
            avg_event_bytes=avg,
            items_per_s=n / clock.seconds,
        )
    ]
