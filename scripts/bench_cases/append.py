"""Case 2: append throughput on PostgreSQL, one process.

Ledger side: item transitions in batches: claim(limit=B) then record B accepts,
until the run is drained; events appended per second (counted in the store).
Baseline: raw psycopg executemany of as many rows (uuid, version, topic,
200-byte payload; primary key (stream, version)) in transactions of B rows.

The ledger side runs twice in turn on runs of its own, with the events encoded as the
ledger encodes them (orjson, ledger/stores/encoding.py) and by eventsourcing's
JSONTranscoder as they were before (the same bytes): two rows, each against the same
baseline, each the better of two passes.
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
        from ledger.stores.base import make_generic_mapper

        with Ledger.open(dsn) as lg:
            worker = Actor("bench-appender", "worker")
            encoders = {"orjson": lg.store.mapper, "transcoder": make_generic_mapper()}
            rates: dict[str, float] = {}
            seconds: dict[str, float] = {}
            events_of: dict[str, int] = {}
            for label in ("transcoder", "orjson") * 2:
                lg.store.mapper = encoders[label]
                run_id = running_run(lg, n)
                before = event_count(lg)
                section = "case2_append" if label == "orjson" else "case2_append_transcoder"
                with profiler.section(section), Clock() as clock:
                    done = accept_all(lg, run_id, worker, batch)
                if done != n:
                    raise RuntimeError(f"append: {done} of {n} items accepted")
                events = event_count(lg) - before
                rate = events / clock.seconds
                if rate > rates.get(label, 0.0):
                    rates[label], seconds[label], events_of[label] = rate, clock.seconds, events
                say(
                    f"  ledger ({label}) {rate:,.0f} events/s ({events} events in {clock.seconds:.1f}s)"
                )
            lg.store.mapper = encoders["orjson"]
            with lg.store.read() as tx:
                size = tx.fetchone(
                    f"SELECT avg(octet_length(state)) AS b FROM {lg.store.events_table()}"  # noqa: S608 (our own table/column names; values are bound parameters)
                )
        events = events_of["orjson"]
        base = raw_append(dsn, events, batch)
        say(f"  raw executemany {base:,.0f} rows/s")
    avg = float(size["b"]) if size and size["b"] is not None else 0.0
    note = f"ledger event state avg {avg:.0f} B vs {PAYLOAD_BYTES} B raw"
    return [
        ratio_row(
            "2",
            f"PG append events/s, batches of {batch}",
            rates["orjson"],
            base,
            "events/s",
            0.3,
            note=f"{events} events, {seconds['orjson']:.1f}s; {note}; encoded by orjson",
            events=events,
            avg_event_bytes=avg,
            items_per_s=n / seconds["orjson"],
        ),
        ratio_row(
            "2",
            f"PG append events/s, batches of {batch}, encoded by the transcoder",
            rates["transcoder"],
            base,
            "events/s",
            0.3,
            note=f"{events_of['transcoder']} events, {seconds['transcoder']:.1f}s; the same "
            "bytes by eventsourcing's JSONTranscoder (the encoder before orjson)",
            events=events_of["transcoder"],
            items_per_s=n / seconds["transcoder"],
        ),
    ]
