"""Case 1: item throughput on PostgreSQL with several worker processes.

Ledger side: P processes work one running run of N no-op items, either through
`ledger.Worker(prefetch=L)` or through a direct loop `claim(limit=L)` +
`record([accepts])` (L = Sizes.throughput_ledger_batch, 250 by default: batching
is how the ledger amortises each transaction's run lock, event-table lock and
commit). Baseline A: P processes over a raw SKIP LOCKED queue of N rows, one
claim and one completion per item, one transaction each. Baseline B: the same
queue claiming and completing B rows per transaction (B = Sizes.throughput_batch,
the brief's 50).

Processes are forked (spawned where fork is missing) with no connection open in
the parent, and open their own connections first; the clock starts when all of
them are ready and stops when the last one finishes.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
import traceback
from pathlib import Path
from typing import Any

from .common import PAYLOAD_BYTES, Callback, PgTarget, Row, Sizes, ratio_row, running_run

QUEUE_DDL = (
    "CREATE TABLE bench_queue (id BIGSERIAL PRIMARY KEY, state TEXT NOT NULL, "
    "worker TEXT, claims INTEGER NOT NULL DEFAULT 0, payload TEXT NOT NULL, "
    "claimed_at TIMESTAMPTZ, done_at TIMESTAMPTZ)"
)
QUEUE_INDEX = "CREATE INDEX bench_queue_pending ON bench_queue (id) WHERE state = 'pending'"
CLAIM_SQL = (
    "UPDATE bench_queue SET state = 'claimed', worker = %s, claims = claims + 1, "
    "claimed_at = now() WHERE id IN (SELECT id FROM bench_queue WHERE state = 'pending' "
    "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id"
)
DONE_SQL = "UPDATE bench_queue SET state = 'done', done_at = now() WHERE id = ANY(%s)"


# --------------------------------------------------------------------------
# Child processes (everything they get must pickle, for spawn)
# --------------------------------------------------------------------------


def _child(
    kind: str,
    dsn: str,
    target: str,
    index: int,
    batch: int,
    concurrency: int,
    ready: Any,
    go: Any,
    results: Any,
    profile_dir: str | None,
) -> None:
    try:
        work = _prepare(kind, dsn, target, index, batch, concurrency)
    except BaseException:
        ready.put(("error", index, traceback.format_exc()))
        return
    ready.put(("ready", index, ""))
    go.wait()
    if profile_dir is not None and index == 0:
        from .common import Profiler

        section = Profiler(Path(profile_dir)).section(f"case1_{kind}_proc0")
    else:
        section = contextlib.nullcontext()
    try:
        with section:
            done = work()
        end = time.monotonic()
        results.put(("ok", index, done, end, ""))
    except BaseException:
        results.put(("error", index, 0, time.monotonic(), traceback.format_exc()))


def _prepare(kind: str, dsn: str, target: str, index: int, batch: int, concurrency: int) -> Any:
    if kind in ("ledger_loop", "ledger_worker"):
        from ledger import Accepted, Actor, Ledger

        from .common import accept_all

        lg = Ledger.open(dsn)
        lg.status(target)  # warm the pool and the imports
        worker = Actor(f"bench-w{index}", "worker")

        if kind == "ledger_loop":

            def work() -> int:
                try:
                    return accept_all(lg, target, worker, batch)
                finally:
                    lg.close()
        else:
            from ledger import Worker

            def work() -> int:
                try:
                    summary = Worker(
                        lg,
                        target,
                        lambda lease: Accepted(),
                        worker_id=worker.id,
                        concurrency=concurrency,
                        prefetch=max(concurrency, batch),
                        poll_interval=0.05,
                        max_idle=5.0,
                    ).run()
                    if summary.errors:
                        raise RuntimeError(f"worker errors: {summary.errors[:3]}")
                    return int(summary.accepted)
                finally:
                    lg.close()

        return work

    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)  # conn.transaction(): one transaction each
    conn.execute("SELECT 1").fetchall()
    name = f"bench-w{index}"

    def queue_work() -> int:
        done = 0
        try:
            while True:
                with conn.transaction():
                    ids = [r[0] for r in conn.execute(CLAIM_SQL, (name, batch)).fetchall()]
                if not ids:
                    return done
                if batch == 1:
                    for i in ids:
                        with conn.transaction():
                            conn.execute(DONE_SQL, ([i],))
                else:
                    with conn.transaction():
                        conn.execute(DONE_SQL, (ids,))
                done += len(ids)
        finally:
            conn.close()

    return queue_work


def run_processes(
    kind: str,
    dsn: str,
    target: str,
    procs: int,
    batch: int,
    concurrency: int,
    profile_dir: Path | None = None,
    timeout: float = 900.0,
    start_method: str | None = None,
) -> tuple[float, int]:
    """Start `procs` children, release them together; (seconds, items done)."""
    # fork by default: children start in milliseconds with the modules already
    # imported, and the parent holds no connection or pool at this point (every
    # Ledger is closed). The tests use spawn: a pytest process has other threads.
    if start_method is None:
        start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(start_method)
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    children = [
        ctx.Process(
            target=_child,
            args=(
                kind,
                dsn,
                target,
                i,
                batch,
                concurrency,
                ready,
                go,
                results,
                None if profile_dir is None else str(profile_dir),
            ),
            daemon=True,
        )
        for i in range(procs)
    ]
    for child in children:
        child.start()
    try:
        for _ in children:
            status, index, text = ready.get(timeout=120)
            if status != "ready":
                raise RuntimeError(f"{kind} process {index} failed to start:\n{text}")
        start = time.monotonic()
        go.set()
        ends, done = [], 0
        for _ in children:
            status, index, n, end, text = results.get(timeout=timeout)
            if status != "ok":
                raise RuntimeError(f"{kind} process {index} failed:\n{text}")
            ends.append(end)
            done += n
        for child in children:
            child.join(timeout=60)
        return max(ends) - start, done
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join(timeout=10)


# --------------------------------------------------------------------------
# The case
# --------------------------------------------------------------------------


def _ledger_side(
    pg: PgTarget, kind: str, sizes: Sizes, profile_dir: Path | None, start_method: str | None
) -> tuple[float, str]:
    from ledger import Ledger

    n = sizes.throughput_items
    with pg.database(f"c1_{kind}") as dsn:
        with Ledger.open(dsn) as lg:
            run_id = running_run(lg, n)
        seconds, done = run_processes(
            kind,
            dsn,
            run_id,
            sizes.throughput_procs,
            sizes.throughput_ledger_batch,
            sizes.worker_concurrency,
            profile_dir,
            start_method=start_method,
        )
        with Ledger.open(dsn) as lg:
            accepted = lg.status(run_id).counts.get("accepted", 0)
        if accepted != n or done != n:
            raise RuntimeError(f"{kind}: {accepted} of {n} items accepted ({done} reported)")
    return n / seconds, f"{n} items, {sizes.throughput_procs} procs, {seconds:.1f}s"


def _queue_side(pg: PgTarget, batch: int, sizes: Sizes, start_method: str | None) -> float:
    import psycopg

    n = sizes.throughput_items
    with pg.database(f"c1_queue{batch}") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(QUEUE_DDL)
            conn.execute(QUEUE_INDEX)
            with conn.cursor() as cur:
                pad = "x" * (PAYLOAD_BYTES - 20)
                cur.executemany(
                    "INSERT INTO bench_queue (state, payload) VALUES ('pending', %s)",
                    [(f"{k:020d}{pad}",) for k in range(n)],
                )
            conn.execute("VACUUM ANALYZE bench_queue")
        seconds, done = run_processes(
            "queue", dsn, "bench_queue", sizes.throughput_procs, batch, 1, start_method=start_method
        )
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE state = 'done'), max(claims) FROM bench_queue"
            ).fetchone()
        if row is None or row[0] != n or done != n or row[1] != 1:
            raise RuntimeError(f"queue baseline: {row} (done {done} of {n}; claims must be 1)")
    return n / seconds


def run(
    pg: PgTarget,
    sizes: Sizes,
    say: Callback,
    profile_dir: Path | None = None,
    start_method: str | None = None,
) -> list[Row]:
    say(
        f"case 1: raw queue baselines ({sizes.throughput_items} rows, {sizes.throughput_procs} procs)"
    )
    base_a = _queue_side(pg, 1, sizes, start_method)
    base_b = _queue_side(pg, sizes.throughput_batch, sizes, start_method)
    say(f"  baseline A {base_a:,.0f} items/s, B {base_b:,.0f} items/s")
    rows = []
    b, lb = sizes.throughput_batch, sizes.throughput_ledger_batch
    for kind, label in (
        ("ledger_loop", f"claim({lb})+record"),
        (
            "ledger_worker",
            f"Worker(concurrency={sizes.worker_concurrency}, prefetch={max(sizes.worker_concurrency, lb)})",
        ),
    ):
        say(f"case 1: ledger {label}")
        try:
            rate, note = _ledger_side(pg, kind, sizes, profile_dir, start_method)
        except ImportError as e:  # ledger.Worker not there yet
            rows.append(
                ratio_row(
                    "1",
                    f"PG items/s, {label} vs queue 1/txn",
                    None,
                    base_a,
                    "items/s",
                    1.0,
                    note=f"n/a: {e}",
                )
            )
            continue
        say(f"  {rate:,.0f} items/s ({note})")
        rows.append(
            ratio_row(
                "1",
                f"PG items/s, {label} vs queue 1/txn (A)",
                rate,
                base_a,
                "items/s",
                1.0,
                note=note,
            )
        )
        rows.append(
            ratio_row(
                "1",
                f"PG items/s, {label} vs queue {b}/txn (B)",
                rate,
                base_b,
                "items/s",
                0.3,
                note=note,
            )
        )
    return rows
