"""Case 8: does the PostgreSQL write path scale out?

The ledger's claim(L)+record loop over N no-op items with 1, 2 and 8 processes on one
run, and 4 runs x 2 processes (each pair on its own run), in the same run of the bench.
Per row: items/s, WAL bytes per item (`pg_current_wal_insert_lsn()` before and after),
client CPU per item (the worker processes' own /proc/self/stat) and server CPU per
item (/proc/<pid>/stat of the database's backends, read while the workers are still
connected; n/a when the server is on another machine), and the top wait events of
the active backends sampled from `pg_stat_activity` every 100 ms.

Goals: 8 processes on one run >= 1.5x the 1-process figure; 4 runs x 2
processes >= 1.5x the 8 processes on one run; WAL <= 3,000 bytes per item with 8
processes. The CPU per item is shown here; its goal is relative to pgqueuer's in the
same run (case P: <= 1.5x).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import Callback, PgTarget, Row, Sizes, accept_all, ratio_row, running_run

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int | str = "self") -> float | None:
    """utime + stime of a process from /proc (None where /proc cannot tell)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def _child(
    dsn: str, run_id: str, index: int, batch: int, ready: Any, go: Any, release: Any, out: Any
) -> None:
    try:
        from ledger import Actor, Ledger

        lg = Ledger.open(dsn)
        lg.status(run_id)  # warm the pool and the imports
        ready.put(("ready", index, ""))
        go.wait()
        start = cpu_seconds()
        done = accept_all(lg, run_id, Actor(f"bench-s{index}", "worker"), batch)
        end = cpu_seconds()
        out.put(("ok", index, done, time.monotonic(), (end or 0) - (start or 0)))
        release.wait(300)  # stay connected until the parent has read the server's CPU
        lg.close()
    except BaseException:
        try:
            ready.put(("error", index, traceback.format_exc()))
        finally:
            out.put(("error", index, 0, 0.0, traceback.format_exc()))


def _server_cpu(conn: Any) -> float | None:
    """CPU seconds of every backend of this database (this bench's only)."""
    pids = [
        r[0]
        for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
    ]
    total = 0.0
    for pid in pids:
        cpu = cpu_seconds(pid)
        if cpu is None:
            return None
        total += cpu
    return total


def _wal(conn: Any) -> int:
    return int(conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])


# WAL records between two positions, by the relation of their first block (pg_walinspect,
# PostgreSQL 15+): tables and indexes by name, records without a block (commits, ...) by
# their resource manager. record_length includes the full-page images (fpi_length).
_WAL_BY_RELATION = (
    "WITH r AS (SELECT record_length, fpi_length, resource_manager, "
    "substring(block_ref from 'rel [0-9]+/[0-9]+/([0-9]+)')::oid AS node "
    "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)) "
    "SELECT coalesce(c.relname, CASE WHEN r.node IS NULL THEN '(' || r.resource_manager || ')' "
    "ELSE '(other relations)' END) AS name, sum(r.record_length)::bigint, "
    "sum(r.fpi_length)::bigint, count(*) "
    "FROM r LEFT JOIN pg_class c ON c.relfilenode = r.node AND r.node <> 0 "
    "GROUP BY 1 ORDER BY 2 DESC"
)
# updates and HOT updates of the tables the item path writes (pg_stat_user_tables)
_UPDATES = (
    "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
    "WHERE relname LIKE 'lg%%' OR relname LIKE 'ledger%%'"
)


# server time and WAL of the statements run in this database (pg_stat_statements, where
# the server loads it: bench.py's own server does), the costliest first
_STATEMENTS = (
    "SELECT calls, total_exec_time, wal_bytes, "
    "left(regexp_replace(query, '\\s+', ' ', 'g'), 90) FROM pg_stat_statements "
    "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND query NOT ILIKE '%%pg_stat%%' AND query NOT ILIKE '%%pg_get_wal%%' "
    "ORDER BY total_exec_time DESC LIMIT 8"
)


def _statements_reset(conn: Any) -> bool:
    """Start counting statements; False where pg_stat_statements is not loaded."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    except Exception:  # a measurement we do without, said so in the output
        return False
    return True


def statements(conn: Any, items: int) -> list[tuple[str, float, float, float]] | None:
    """(statement, its calls, server ms and WAL bytes per item) since the reset, the
    costliest first; None where pg_stat_statements is not loaded."""
    try:
        rows = conn.execute(_STATEMENTS).fetchall()
    except Exception:
        return None
    return [
        (str(q), int(calls), float(ms) / items, float(wal or 0) / items)
        for calls, ms, wal, q in rows
    ]


def _lsn(conn: Any) -> str:
    return str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])


def _updates(conn: Any) -> dict[str, tuple[int, int, int]]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return {r[0]: (int(r[1]), int(r[2]), int(r[3])) for r in conn.execute(_UPDATES).fetchall()}


def wal_by_relation(conn: Any, start: str, items: int) -> list[tuple[str, float, float]] | None:
    """(relation, WAL bytes per item, of which full-page images) since `start`, largest
    first; None where pg_walinspect cannot be installed (not a superuser, before PG 15)."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        end = str(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        rows = conn.execute(_WAL_BY_RELATION, (start, end)).fetchall()
    except Exception:  # a measurement we do without, said so in the output
        return None
    return [(str(r[0]), int(r[1]) / items, int(r[2]) / items) for r in rows]


def _settle(conn: Any, keep: Sequence[int] = ()) -> None:
    """Wait (up to 10 s) until this database's other backends have exited: a backend
    reports its table statistics when it exits. `keep`: backends of ours that stay."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        n = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND NOT (pid = ANY(%s))",
            (list(keep),),
        ).fetchone()[0]
        if not n:
            return
        time.sleep(0.05)


def _measure(
    dsn: str,
    runs: list[str],
    per_run: int,
    batch: int,
    start_method: str | None,
    child: Any = _child,
    breakdown: bool = False,
) -> dict[str, Any]:
    """Start `per_run` processes per entry of `runs` (`child(dsn, entry, index, batch,
    ready, go, release, out)`), release them together, and measure (see the module).
    With `breakdown`, also the WAL per item by relation and the tables' (HOT) updates,
    read once the workers have gone (not part of the timed figures)."""
    import psycopg

    if start_method is None:
        start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(start_method)
    ready, out, go, release = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    kids = [
        ctx.Process(target=child, args=(dsn, r, i, batch, ready, go, release, out), daemon=True)
        for i, r in enumerate(r for r in runs for _ in range(per_run))
    ]
    for k in kids:
        k.start()
    waits: Counter[str] = Counter()
    samples = 0
    stop = threading.Event()
    try:
        for _ in kids:
            status, index, text = ready.get(timeout=120)
            if status != "ready":
                raise RuntimeError(f"scaling process {index} failed to start:\n{text}")
        with (
            psycopg.connect(dsn, autocommit=True) as conn,
            psycopg.connect(dsn, autocommit=True) as sampler,
        ):

            def sample() -> None:
                nonlocal samples
                while not stop.wait(0.1):
                    rows = sampler.execute(
                        "SELECT coalesce(wait_event_type || '/' || wait_event, 'CPU') "
                        "FROM pg_stat_activity WHERE datname = current_database() "
                        "AND state = 'active' AND pid <> pg_backend_pid()"
                    ).fetchall()
                    samples += 1
                    waits.update(r[0] for r in rows)

            stats0 = _updates(conn) if breakdown else {}
            counting = breakdown and _statements_reset(conn)
            lsn0 = _lsn(conn)
            wal0, server0 = _wal(conn), _server_cpu(conn)
            thread = threading.Thread(target=sample, daemon=True)
            start = time.monotonic()
            go.set()
            thread.start()
            ends, done, client = [], 0, 0.0
            for _ in kids:
                status, index, n, end, cpu = out.get(timeout=900)
                if status != "ok":
                    raise RuntimeError(f"scaling process {index} failed:\n{cpu}")
                ends.append(end)
                done += n
                client += cpu
            stop.set()
            thread.join()
            # the sampler's own backend is excluded from the waits but not from the CPU:
            # it is a few ms over the whole case
            server1, wal1 = _server_cpu(conn), _wal(conn)
            release.set()
            for k in kids:
                k.join(timeout=60)
            by_relation, updates, by_statement = None, {}, None
            if breakdown:
                _settle(conn, keep=[sampler.info.backend_pid])
                by_relation = wal_by_relation(conn, lsn0, done)
                by_statement = statements(conn, done) if counting else None
                stats1 = _updates(conn)
                updates = {
                    name: tuple(a - b for a, b in zip(v, stats0.get(name, (0, 0, 0)), strict=True))
                    for name, v in stats1.items()
                }
    finally:
        stop.set()
        release.set()
        for k in kids:
            if k.is_alive():
                k.terminate()
                k.join(timeout=10)
    seconds = max(ends) - start
    server = None if server0 is None or server1 is None else server1 - server0
    active = sum(waits.values())
    top = (
        ", ".join(f"{name} {100 * n / active:.0f}%" for name, n in waits.most_common(3))
        if active
        else "none"
    )
    return {
        "items": done,
        "seconds": seconds,
        "rate": done / seconds,
        "wal_per_item": (wal1 - wal0) / done,
        "client_ms": 1000 * client / done,
        "server_ms": None if server is None else 1000 * server / done,
        "waits": top,
        "active_per_sample": active / samples if samples else 0.0,
        "wal_by_relation": by_relation,
        "updates": updates,
        "statements": by_statement,
    }


def run(pg: PgTarget, sizes: Sizes, say: Callback, start_method: str | None = None) -> list[Row]:
    from ledger import Ledger

    n, batch = sizes.throughput_items, sizes.throughput_ledger_batch
    procs = max(sizes.throughput_procs, 2)
    results: dict[str, dict[str, Any]] = {}
    layouts = [("1 proc", 1, 1), ("2 procs", 1, 2)]
    if procs > 2:
        layouts.append((f"{procs} procs", 1, procs))
    layouts.append((f"4 runs x {procs // 4 or 1} procs", 4, procs // 4 or 1))
    many = layouts[-2][0]
    for label, nruns, per_run in layouts:
        say(f"case 8: {label}, claim({batch})+record, {n} items")
        with pg.database("c8") as dsn:
            with Ledger.open(dsn) as lg:
                runs = [running_run(lg, n // nruns, prefix=f"r{k}-") for k in range(nruns)]
            got = _measure(dsn, runs, per_run, batch, start_method, breakdown=label == many)
        results[label] = got
        server = "n/a" if got["server_ms"] is None else f"{got['server_ms']:.3f}"
        say(
            f"  {got['rate']:,.0f} items/s, WAL {got['wal_per_item']:,.0f} B/item, CPU ms/item "
            f"client {got['client_ms']:.3f} server {server}; waits: {got['waits']}"
        )
        for line in breakdown_lines(got):
            say("  " + line)

    def note(label: str) -> str:
        g = results[label]
        server = "n/a" if g["server_ms"] is None else f"{g['server_ms']:.3f}"
        return (
            f"{g['items']} items {g['seconds']:.1f}s; WAL {g['wal_per_item']:,.0f} B/item; "
            f"CPU ms/item client {g['client_ms']:.3f} + server {server}; "
            f"active backends {g['active_per_sample']:.1f}: {g['waits']}"
        )

    one, four = layouts[0][0], layouts[-1][0]
    rows = [
        ratio_row(
            "8",
            f"PG items/s, {label} vs 1 proc",
            results[label]["rate"],
            results[one]["rate"],
            "items/s",
            {many: 1.5, four: 1.5}.get(label, 0.0),
            note=note(label),
        )
        for label, _r, _p in layouts
    ]
    rows.append(
        ratio_row(
            "8",
            f"PG items/s, {four} vs {many} on one run",
            results[four]["rate"],
            results[many]["rate"],
            "items/s",
            1.5,
        )
    )
    g = results[many]
    cpu = None if g["server_ms"] is None else g["client_ms"] + g["server_ms"]
    rows.append(
        Row(
            "8",
            f"PG CPU ms/item (client+server), {many}",
            cpu,
            "ms",
            note=note(many) if cpu is None else "",
        )
    )
    rows.append(
        Row(
            "8",
            f"PG WAL bytes/item, {many}",
            g["wal_per_item"],
            "B",
            goal="<= 3000",
            met=g["wal_per_item"] <= 3000,
            note="; ".join(breakdown_lines(g)),
            extra={
                "wal_by_relation": g["wal_by_relation"],
                "updates": g["updates"],
                "statements": g["statements"],
            },
        )
    )
    return rows


def breakdown_lines(got: dict[str, Any]) -> list[str]:
    """The WAL by relation and the HOT updates of a measurement made with `breakdown`."""
    lines = []
    rels = got.get("wal_by_relation")
    if rels is not None:
        shown = [r for r in rels if r[1] >= 10] or rels[:1]
        lines.append(
            "WAL B/item by relation (full-page images): "
            + ", ".join(f"{name} {b:,.0f} ({fpi:,.0f})" for name, b, fpi in shown)
        )
    elif "wal_by_relation" in got and got.get("updates"):
        lines.append("WAL by relation: n/a (pg_walinspect not available)")
    stmts = got.get("statements")
    if stmts:
        lines.append(
            "server time and WAL per item by statement (pg_stat_statements): "
            + "; ".join(
                f"{1000 * ms:.0f} us, {wal:,.0f} B ({calls:,} calls): {text}"
                for text, calls, ms, wal in stmts
                if ms * 1000 >= 1
            )
        )
    upd = {k: v for k, v in (got.get("updates") or {}).items() if v[1]}
    if upd:
        lines.append(
            "updates (HOT): "
            + ", ".join(f"{name} {n:,} ({hot:,})" for name, (_i, n, hot) in sorted(upd.items()))
        )
    return lines
