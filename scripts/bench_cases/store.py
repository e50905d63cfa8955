"""Cases 4 and 5, which share one big store per database.

Case 5 (status read): a run whose processing leaves about `small_events` events
in a fresh store; median `status(run_id)` latency is measured, then the store is
filled with other runs to `store_events` events and the same run's status is
measured again. Goal: large/small <= 1.5 and median under 2 ms (PostgreSQL) or
1 ms (SQLite).

Case 4 (rebuild): `rebuild_projections()` over the big store, in a subprocess
(peak RSS: VmHWM), after one with the events decoded by eventsourcing's JSONTranscoder
(the decoder before orjson: a row of its own). Baseline: another subprocess reading the same events
in position order, pages of 1,000, and decoding each event's JSON. Goal: events/s
ratio >= 0.35 and peak RSS under 300 MB. "n/a" while rebuild is not implemented.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from .common import (
    Callback,
    Clock,
    PgTarget,
    Row,
    Sizes,
    accept_all,
    event_count,
    fill_events,
    median_ms,
    ratio_row,
    run_json_child,
    running_run,
)

RSS_LIMIT_MB = 300.0

PEAK_RSS = r"""
import resource

def _peak_rss_mb():
    # VmHWM: this process's peak RSS since exec (ru_maxrss would carry over the
    # parent's peak across fork+exec on Linux)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

REBUILD_CHILD = (
    PEAK_RSS
    + r"""
import importlib.util, json, sys, time
from ledger import Ledger
lg = Ledger.open(sys.argv[1])
if sys.argv[2] == "transcoder":  # the events decoded by eventsourcing's JSONTranscoder
    from ledger.stores.base import make_generic_mapper
    lg.store.mapper = make_generic_mapper()
if not hasattr(lg, "rebuild_projections") or importlib.util.find_spec("ledger.projections.rebuild") is None:
    print(json.dumps({"na": "rebuild_projections not implemented yet (no projections.rebuild)"}))
    raise SystemExit(0)
start = time.perf_counter()
try:
    if len(sys.argv) > 4:  # bench.py --profile: cProfile and SQL time per statement
        from pathlib import Path
        from bench_cases.common import Profiler
        with Profiler(Path(sys.argv[3])).section(sys.argv[4]):
            n = lg.rebuild_projections()
    else:
        n = lg.rebuild_projections()
except NotImplementedError as e:
    print(json.dumps({"na": f"rebuild_projections: NotImplementedError {e}"}))
    raise SystemExit(0)
seconds = time.perf_counter() - start
lg.close()
print(json.dumps({"seconds": seconds, "events": n,
                  "maxrss_mb": _peak_rss_mb()}))
"""
)

READ_CHILD_PG = (
    PEAK_RSS  # noqa: S608 (child script text; the table name is our own, checked by the child)
    + r"""
import json, sys, time
import psycopg
from psycopg import sql
dsn, table = sys.argv[1], sys.argv[2]
query = sql.SQL("SELECT notification_id, originator_id, originator_version, topic, state FROM {} "
                "WHERE notification_id > %s ORDER BY notification_id LIMIT 1000").format(
                    sql.Identifier(table))
with psycopg.connect(dsn) as conn:
    start = time.perf_counter()
    after, n = 0, 0
    while True:
        rows = conn.execute(query, (after,)).fetchall()
        if not rows:
            break
        for row in rows:
            json.loads(row[4])
        n += len(rows)
        after = rows[-1][0]
    seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "events": n,
                  "maxrss_mb": _peak_rss_mb()}))
"""
)

READ_CHILD_SQLITE = (
    PEAK_RSS  # noqa: S608 (child script text; the table name is our own, checked by the child)
    + r"""
import json, sqlite3, sys, time
path, table = sys.argv[1], sys.argv[2]
assert table.isidentifier()
conn = sqlite3.connect(path)
start = time.perf_counter()
after, n = 0, 0
while True:
    rows = conn.execute(f"SELECT rowid, originator_id, originator_version, topic, state FROM {table} "
                        "WHERE rowid > ? ORDER BY rowid LIMIT 1000", (after,)).fetchall()
    if not rows:
        break
    for row in rows:
        json.loads(row[4])
    n += len(rows)
    after = rows[-1][0]
seconds = time.perf_counter() - start
conn.close()
print(json.dumps({"seconds": seconds, "events": n,
                  "maxrss_mb": _peak_rss_mb()}))
"""
)


def status_latency(lg: Any, run_id: str, samples: int, rounds: int = 3) -> float:
    """Milliseconds of `status(run_id)`: the lowest of `rounds` medians of `samples` calls
    each, after a short warm-up (the lowest median resists other load on the machine)."""
    for _ in range(min(20, samples)):
        lg.status(run_id)
    medians = []
    for _ in range(rounds):
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            lg.status(run_id)
            times.append(time.perf_counter() - start)
        medians.append(median_ms(times))
    return min(medians)


def settle(dsn: str) -> None:
    """PostgreSQL: VACUUM ANALYZE, as autovacuum would have done in a store that has
    been up a while, so neither measurement runs beside a fresh autovacuum."""
    if not dsn.startswith(("postgresql:", "postgres:")):
        return
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def _one_store(
    label: str,
    dsn: str,
    sizes: Sizes,
    say: Callback,
    store: str,
    sqlite_path: str | None,
    timeout: float,
    profile_dir: Path | None = None,
) -> list[Row]:
    from ledger import Actor, Ledger

    limit_ms = 2.0 if store == "PG" else 1.0
    rows: list[Row] = []
    with Ledger.open(dsn) as lg:
        n_items = max(1, (sizes.small_events - 2) // 3)
        run_id = running_run(lg, n_items, prefix="s")
        accept_all(lg, run_id, Actor("bench-status", "worker"), 50)
        small_events = event_count(lg)
        settle(dsn)
        small = status_latency(lg, run_id, sizes.status_samples)
        say(
            f"  {store} status: {small:.3f} ms median with {small_events} events; filling to "
            f"{sizes.store_events}"
        )
        with Clock() as fill:
            big_events = fill_events(lg, sizes.store_events, sizes.fill_batch)
        say(
            f"  filled to {big_events} events in {fill.seconds:.1f}s "
            f"({(big_events - small_events) / fill.seconds:,.0f} events/s through the ledger)"
        )
        settle(dsn)
        large = status_latency(lg, run_id, sizes.status_samples)
        say(f"  {store} status: {large:.3f} ms median with {big_events} events")
        table = lg.store.events_table()
    ratio = large / small if small else None
    met = ratio is not None and ratio <= 1.5 and large < limit_ms and small < limit_ms
    rows.append(
        Row(
            "5",
            f"{store} status() median, {small_events} vs {big_events} events",
            large,
            "ms",
            small,
            "ms",
            ratio,
            f"ratio <= 1.5, < {limit_ms:g} ms",
            met,
            note=f"lowest of 3 medians of {sizes.status_samples} calls each"
            + ("; VACUUM ANALYZE before each" if store == "PG" else ""),
            extra={
                "small_events": small_events,
                "large_events": big_events,
                "fill_seconds": fill.seconds,
            },
        )
    )

    say(f"case 4: rebuild on {store}, {big_events} events")
    reader = READ_CHILD_PG if store == "PG" else READ_CHILD_SQLITE
    base = run_json_child(reader, [dsn if sqlite_path is None else sqlite_path, table], timeout)
    base_rate = base["events"] / base["seconds"]
    say(f"  baseline read+decode {base_rate:,.0f} events/s, peak RSS {base['maxrss_mb']:.0f} MB")
    profile = [str(profile_dir), f"case4_rebuild_{store.lower()}"] if profile_dir else []
    # the events decoded as the ledger decodes them (orjson) and, before that, by the
    # transcoder (eventsourcing's JSONTranscoder, as before): the same rows
    before = run_json_child(REBUILD_CHILD, [dsn, "transcoder"], timeout)
    got = run_json_child(REBUILD_CHILD, [dsn, "orjson", *profile], timeout)
    if "na" in got:
        say(f"  ledger: n/a ({got['na']})")
        rows.append(
            Row(
                "4",
                f"{store} rebuild {big_events} events",
                None,
                "events/s",
                base_rate,
                "events/s",
                None,
                "ratio >= 0.35",
                None,
                note=f"n/a: {got['na']}",
            )
        )
        rows.append(
            Row(
                "4",
                f"{store} rebuild peak RSS",
                None,
                "MB",
                base["maxrss_mb"],
                "MB",
                None,
                f"< {RSS_LIMIT_MB:g} MB",
                None,
                note="n/a; baseline = reader's peak RSS",
            )
        )
        return rows
    rate = got["events"] / got["seconds"] if got["seconds"] else None
    say(
        f"  ledger rebuild {rate or 0:,.0f} events/s in {got['seconds']:.1f}s, "
        f"peak RSS {got['maxrss_mb']:.0f} MB"
    )
    rows.append(
        ratio_row(
            "4",
            f"{store} rebuild {big_events} events",
            rate,
            base_rate,
            "events/s",
            0.35,
            note=f"{got['seconds']:.1f}s; {got['events']} replayed",
        )
    )
    if "na" not in before and before["seconds"]:
        before_rate = before["events"] / before["seconds"]
        say(f"  ledger rebuild, decoded by the transcoder: {before_rate:,.0f} events/s")
        rows.append(
            ratio_row(
                "4",
                f"{store} rebuild {big_events} events, decoded by the transcoder",
                before_rate,
                base_rate,
                "events/s",
                0.35,
                note=f"{before['seconds']:.1f}s; eventsourcing's JSONTranscoder (the decoder "
                "before orjson)",
            )
        )
    rss = float(got["maxrss_mb"])
    rows.append(
        Row(
            "4",
            f"{store} rebuild peak RSS",
            rss,
            "MB",
            base["maxrss_mb"],
            "MB",
            rss / base["maxrss_mb"] if base["maxrss_mb"] else None,
            f"< {RSS_LIMIT_MB:g} MB",
            rss < RSS_LIMIT_MB,
            note="baseline = reader's peak RSS",
        )
    )
    return rows


def run_pg(
    pg: PgTarget,
    sizes: Sizes,
    say: Callback,
    timeout: float = 1800.0,
    profile_dir: Path | None = None,
) -> list[Row]:
    say(f"cases 5 and 4 on PostgreSQL ({sizes.small_events} -> {sizes.store_events} events)")
    with pg.database("c45") as dsn:
        return _one_store("PG", dsn, sizes, say, "PG", None, timeout, profile_dir)


def run_sqlite(
    sizes: Sizes,
    say: Callback,
    tmp: Path | None = None,
    timeout: float = 1800.0,
    profile_dir: Path | None = None,
) -> list[Row]:
    say(f"cases 5 and 4 on SQLite ({sizes.small_events} -> {sizes.store_events} events)")
    with tempfile.TemporaryDirectory(dir=tmp, prefix="bench-c45-") as d:
        path = f"{d}/ledger.db"
        return _one_store(
            "SQLite", f"sqlite:///{path}", sizes, say, "SQLite", path, timeout, profile_dir
        )
