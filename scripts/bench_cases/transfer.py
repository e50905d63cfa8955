"""Case 9: export and import throughput vs raw reading and COPY of the same rows.

A SQLite ledger is filled to `transfer_events` events. Then, each measured in this run:

- export from SQLite (`lg.export` to a file) vs reading the same rows (events with
  their hashes, pages of 2,000) with sqlite3 and writing each as a JSON line;
- import into an empty PostgreSQL database (`lg.import_file(verify=False)`: checking the
  file, appending events with their hashes, projecting them) vs COPY of the same rows
  into a table of the same shape (the events table, hash column included) in another
  empty database;
- export from that PostgreSQL ledger vs reading the same rows with psycopg.

Goal: each ratio >= 0.3 (events/s).
"""

from __future__ import annotations

import base64
import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import PgTarget, Profiler, Row, Sizes, fill_events, ratio_row

GOAL = 0.3
_SQLITE_ROWS = (
    "SELECT rowid, originator_id, originator_version, topic, state, hash "
    "FROM stored_events WHERE rowid > ? ORDER BY rowid LIMIT 2000"
)
_PG_ROWS = (
    "SELECT notification_id, originator_id, originator_version, topic, state, hash "
    "FROM ledger_events WHERE notification_id > %s ORDER BY notification_id LIMIT 2000"
)


def _line(row: Any) -> str:
    state = bytes(row[4])
    try:
        text: dict[str, str] = {"state": state.decode("utf-8")}
    except UnicodeDecodeError:
        text = {"state_b64": base64.b64encode(state).decode()}
    return json.dumps(
        {
            "position": row[0],
            "stream": str(row[1]),
            "version": row[2],
            "topic": row[3],
            **text,
            "hash": row[5],
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )


def _raw_read_sqlite(path: Path, out: Path) -> tuple[float, int]:
    conn = sqlite3.connect(path)
    start = time.perf_counter()
    n = after = 0
    with open(out, "w", encoding="utf-8") as f:
        while True:
            rows = conn.execute(_SQLITE_ROWS, (after,)).fetchall()
            if not rows:
                break
            for row in rows:
                f.write(_line(row) + "\n")
            n += len(rows)
            after = rows[-1][0]
    seconds = time.perf_counter() - start
    conn.close()
    return seconds, n


def _raw_read_pg(dsn: str, out: Path) -> tuple[float, int]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        start = time.perf_counter()
        n = after = 0
        with open(out, "w", encoding="utf-8") as f:
            while True:
                rows = conn.execute(_PG_ROWS, (after,)).fetchall()
                if not rows:
                    break
                for row in rows:
                    f.write(_line(row) + "\n")
                n += len(rows)
                after = rows[-1][0]
        return time.perf_counter() - start, n


def _raw_copy(dsn: str, path: Path) -> tuple[float, int]:
    """COPY the file's rows (parsed from the same lines) into a table shaped as the events'."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        conn.execute(
            "CREATE TABLE raw_events (position bigint PRIMARY KEY, originator_id uuid, "
            "originator_version bigint, topic text, state bytea, hash text, "
            "UNIQUE (originator_id, originator_version))"
        )
        conn.commit()
        start = time.perf_counter()
        n = 0
        with conn.transaction(), conn.cursor() as cur, open(path, encoding="utf-8") as f:
            events: list[tuple[Any, ...]] = []
            for text in f:
                doc = json.loads(text)
                if "end" in doc:
                    break
                state = (
                    doc["state"].encode() if "state" in doc else base64.b64decode(doc["state_b64"])
                )
                events.append(
                    (
                        doc["position"],
                        doc["stream"],
                        doc["version"],
                        doc["topic"],
                        state,
                        doc["hash"],
                    )
                )
            with cur.copy(
                "COPY raw_events (position, originator_id, originator_version, topic, state, hash) "
                "FROM STDIN"
            ) as copy:
                for e in events:
                    copy.write_row(e)
            n = len(events)
        return time.perf_counter() - start, n


def run(
    pg: PgTarget | None,
    sizes: Sizes,
    say: Any,
    tmp: Path | None,
    profiler: Profiler | None = None,
) -> list[Row]:
    from ledger import Ledger

    profiler = profiler or Profiler(None)

    rows: list[Row] = []
    folder = Path(tempfile.mkdtemp(prefix="bench-transfer-", dir=tmp))
    db = folder / "source.db"
    with Ledger.open(f"sqlite:///{db}") as lg:
        say(f"case 9: filling a SQLite ledger to {sizes.transfer_events:,} events")
        events = fill_events(lg, sizes.transfer_events, sizes.fill_batch, prefix="transfer")
        say("case 9: export from SQLite")
        history = folder / "history.jsonl"
        start = time.perf_counter()
        with profiler.section("9-export-sqlite"), open(history, "w", encoding="utf-8") as out:
            lg.export(out)
        export_s = time.perf_counter() - start
    raw_s, raw_n = _raw_read_sqlite(db, folder / "raw.jsonl")
    rows.append(
        ratio_row(
            "9",
            "export, SQLite (events/s) vs reading the rows as JSON lines",
            events / export_s,
            raw_n / raw_s,
            "ev/s",
            GOAL,
            events=events,
        )
    )
    if pg is None:
        return rows
    with pg.database("transfer_import") as target, pg.database("transfer_copy") as raw:
        say("case 9: import into PostgreSQL")
        with Ledger.open(target) as lg:
            start = time.perf_counter()
            with profiler.section("9-import-pg"):
                summary = lg.import_file(history, verify=False)
            import_s = time.perf_counter() - start
            assert summary.events == events
            start = time.perf_counter()
            with (
                profiler.section("9-export-pg"),
                open(folder / "from_pg.jsonl", "w", encoding="utf-8") as out,
            ):
                lg.export(out)
            pg_export_s = time.perf_counter() - start
        copy_s, copy_n = _raw_copy(raw, history)
        rows.append(
            ratio_row(
                "9",
                "import into PostgreSQL, projected (events/s) vs COPY of the rows",
                events / import_s,
                copy_n / copy_s,
                "ev/s",
                GOAL,
            )
        )
        read_s, read_n = _raw_read_pg(target, folder / "raw_pg.jsonl")
        rows.append(
            ratio_row(
                "9",
                "export, PostgreSQL (events/s) vs reading the rows as JSON lines",
                events / pg_export_s,
                read_n / read_s,
                "ev/s",
                GOAL,
            )
        )
    return rows
