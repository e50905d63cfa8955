"""Case P (`bench.py --peers`): the queues a user would pick instead, in the same run on
the same server.

The ledger's claim(250)+record loop and each peer work N no-op items with P processes
(Sizes.throughput_items, throughput_procs), measured the same way as case 8: items/s,
WAL bytes per item, client and server CPU per item, top wait events. Peers come from
the optional extra (`pip install -e '.[bench]'`); a peer that is not installed gets a
row saying so, and the rest still run.

- pgqueuer (asyncpg driver; its psycopg driver stalled about 1 s per LISTEN wait):
  one QueueManager per process in drain mode, batch 250, a no-op entrypoint.
- procrastinate (psycopg connector): one worker per process, concurrency 8, `wait=False`
  (it returns once the queue is empty), a no-op task; jobs deferred in one batch.
- dbos (its system database on the same server): one launched DBOS per process, listening
  to one queue (worker_concurrency 250 like the others' batch, polling every 50 ms where
  DBOS's default is 1 s: at the default 8 workflows per poll it ran ~120 items/s here), a
  no-op workflow per item, enqueued beforehand with `DBOSClient.enqueue_in_transaction`.
  Each process launches when released (its launch, ~0.2 s, is inside the measured time)
  and stops when the queue has nothing enqueued or pending (polled every 50 ms).
"""

from __future__ import annotations

import importlib.util
import time
import traceback
from typing import Any

from .common import Callback, PgTarget, Row, Sizes, ratio_row, running_run
from .scaling import _measure, cpu_seconds

EXTRA = "pip install -e '.[bench]'"
PEERS = {
    "pgqueuer": ("pgqueuer", "asyncpg"),
    "procrastinate": ("procrastinate",),
    "dbos": ("dbos",),
}


def missing(peer: str) -> list[str]:
    """The modules of `peer` that are not installed."""
    return [m for m in PEERS[peer] if importlib.util.find_spec(m) is None]


def _pgqueuer_child(
    dsn: str, _entry: Any, index: int, batch: int, ready: Any, go: Any, release: Any, out: Any
) -> None:
    try:
        import asyncio

        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries, QueueManager
        from pgqueuer.types import QueueExecutionMode

        async def main() -> tuple[int, float, float]:
            conn = await asyncpg.connect(dsn)
            qm = QueueManager(Queries(AsyncpgDriver(conn)))
            done = 0

            @qm.entrypoint("noop")
            async def noop(job: Any) -> None:
                nonlocal done
                done += 1

            ready.put(("ready", index, ""))
            await asyncio.get_running_loop().run_in_executor(None, go.wait)
            start = cpu_seconds() or 0.0
            await qm.run(batch_size=batch, mode=QueueExecutionMode.drain)
            end = cpu_seconds() or 0.0
            out.put(("ok", index, done, time.monotonic(), end - start))
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 300)
            await conn.close()
            return done, start, end

        asyncio.run(main())
    except BaseException:
        try:
            ready.put(("error", index, traceback.format_exc()))
        finally:
            out.put(("error", index, 0, 0.0, traceback.format_exc()))


def _pgqueuer_fill(dsn: str, n: int) -> None:
    import asyncio

    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    async def main() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            for k in range(0, n, 5_000):
                m = min(5_000, n - k)
                await queries.enqueue(["noop"] * m, [None] * m, [0] * m)
        finally:
            await conn.close()

    asyncio.run(main())


def _procrastinate_app(dsn: str, sync: bool = False) -> Any:
    import procrastinate

    connector = (
        procrastinate.SyncPsycopgConnector(conninfo=dsn)
        if sync
        else procrastinate.PsycopgConnector(conninfo=dsn)
    )
    app = procrastinate.App(connector=connector)

    @app.task(name="noop")
    def noop() -> None:
        return None

    return app


def _procrastinate_child(
    dsn: str, _entry: Any, index: int, batch: int, ready: Any, go: Any, release: Any, out: Any
) -> None:
    try:
        import asyncio

        async def main() -> None:
            app = _procrastinate_app(dsn)
            async with app.open_async():
                ready.put(("ready", index, ""))
                await asyncio.get_running_loop().run_in_executor(None, go.wait)
                start = cpu_seconds() or 0.0
                await app.run_worker_async(
                    concurrency=8, wait=False, install_signal_handlers=False, name=f"w{index}"
                )
                end = cpu_seconds() or 0.0
                # it does not say how many jobs it ran: counted from the table afterwards
                out.put(("ok", index, -1, time.monotonic(), end - start))
                await asyncio.get_running_loop().run_in_executor(None, release.wait, 300)

        asyncio.run(main())
    except BaseException:
        try:
            ready.put(("error", index, traceback.format_exc()))
        finally:
            out.put(("error", index, 0, 0.0, traceback.format_exc()))


def _procrastinate_fill(dsn: str, n: int) -> None:
    app = _procrastinate_app(dsn, sync=True)
    with app.open():
        app.schema_manager.apply_schema()
        task = app.tasks["noop"]
        for k in range(0, n, 5_000):
            task.batch_defer(*[{} for _ in range(min(5_000, n - k))])


def _procrastinate_done(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()
        return int(row[0]) if row else 0


DBOS_QUEUE = "noop"
DBOS_POLL_S = 0.05


def _dbos_app(dsn: str) -> Any:
    from dbos import DBOS

    # a pool of 4 per process (DBOS's default of 20 x 8 processes passed the server's
    # max_connections of 100 and the processes waited for connections)
    DBOS(
        config={
            "name": "bench",
            "system_database_url": dsn,
            "sys_db_pool_size": 4,
            "log_level": "WARNING",
        }
    )

    @DBOS.workflow(name="noop")
    def noop() -> None:
        return None

    return DBOS


def _dbos_fill(dsn: str, n: int, batch: int) -> None:
    """The system database made by one launch, the queue registered, n workflows enqueued
    (run in a process of its own: DBOS is one instance per process)."""
    import sqlalchemy as sa
    from dbos import DBOSClient

    dbos = _dbos_app(dsn)
    dbos.listen_queues([])
    dbos.launch()
    try:
        dbos.register_queue(DBOS_QUEUE, worker_concurrency=batch, polling_interval_sec=DBOS_POLL_S)
        client = DBOSClient(system_database_url=dsn)
        engine = sa.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            for k in range(0, n, 1_000):
                with engine.begin() as conn:
                    for _ in range(min(1_000, n - k)):
                        client.enqueue_in_transaction(
                            conn, {"queue_name": DBOS_QUEUE, "workflow_name": "noop"}
                        )
        finally:
            engine.dispose()
            client.destroy()
    finally:
        dbos.destroy()


def _dbos_left(conn: Any) -> int:
    row = conn.execute(
        "SELECT count(*) FROM dbos.workflow_status WHERE queue_name = %s "
        "AND status IN ('ENQUEUED', 'PENDING')",
        (DBOS_QUEUE,),
    ).fetchone()
    return int(row[0]) if row else 0


def _dbos_child(
    dsn: str, _entry: Any, index: int, batch: int, ready: Any, go: Any, release: Any, out: Any
) -> None:
    try:
        import psycopg

        dbos = _dbos_app(dsn)
        dbos.listen_queues([DBOS_QUEUE])
        with psycopg.connect(dsn, autocommit=True) as conn:
            ready.put(("ready", index, ""))
            go.wait()
            start = cpu_seconds() or 0.0
            dbos.launch()
            while _dbos_left(conn):
                time.sleep(DBOS_POLL_S)
            end = cpu_seconds() or 0.0
        # which process ran which workflow is not told apart: counted from the table
        out.put(("ok", index, -1, time.monotonic(), end - start))
        release.wait(300)
        dbos.destroy()
    except BaseException:
        try:
            ready.put(("error", index, traceback.format_exc()))
        finally:
            out.put(("error", index, 0, 0.0, traceback.format_exc()))


def _dbos_done(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dbos.workflow_status WHERE queue_name = %s "
            "AND status = 'SUCCESS'",
            (DBOS_QUEUE,),
        ).fetchone()
        return int(row[0]) if row else 0


def _note(g: dict[str, Any]) -> str:
    server = "n/a" if g["server_ms"] is None else f"{g['server_ms']:.3f}"
    return (
        f"{g['items']} items {g['seconds']:.1f}s; WAL {g['wal_per_item']:,.0f} B/item; CPU "
        f"ms/item client {g['client_ms']:.3f} + server {server}; waits: {g['waits']}"
    )


def _per_item(got: dict[str, Any], n: int) -> dict[str, Any]:
    """Figures per item for a peer whose processes do not count their jobs (-1 each)."""
    scale = got["items"] / n  # negative: the processes' -1s
    out = dict(got, items=n, rate=n / got["seconds"])
    out["wal_per_item"] = got["wal_per_item"] * scale
    out["client_ms"] = got["client_ms"] * scale
    if got["server_ms"] is not None:
        out["server_ms"] = got["server_ms"] * scale
    return out


def run(pg: PgTarget, sizes: Sizes, say: Callback, start_method: str | None = None) -> list[Row]:
    from ledger import Ledger

    n, procs, batch = sizes.throughput_items, sizes.throughput_procs, 250
    rows: list[Row] = []
    say(f"case P: ledger claim({batch})+record, {procs} procs, {n} items")
    with pg.database("cP_ledger") as dsn:
        with Ledger.open(dsn) as lg:
            run_id = running_run(lg, n)
        ledger = _measure(dsn, [run_id], procs, batch, start_method)
    say(f"  {ledger['rate']:,.0f} items/s; {_note(ledger)}")
    rows.append(
        Row("P", f"PG items/s, ledger {procs} procs", ledger["rate"], "items/s", note=_note(ledger))
    )
    for peer in PEERS:
        gone = missing(peer)
        if gone:
            say(f"case P: {peer} skipped: {', '.join(gone)} not installed ({EXTRA})")
            rows.append(
                Row(
                    "P",
                    f"peer {peer}",
                    None,
                    "items/s",
                    note=f"skipped: {', '.join(gone)} not installed ({EXTRA})",
                )
            )
            continue
        if peer in ("procrastinate", "dbos"):
            rows.append(_queue_peer(pg, peer, n, procs, batch, start_method, ledger, say))
            continue
        say(f"case P: pgqueuer, batch {batch}, {procs} procs, {n} items")
        with pg.database("cP_pgqueuer") as dsn:
            _pgqueuer_fill(dsn, n)
            got = _measure(dsn, [""], procs, batch, start_method, child=_pgqueuer_child)
        if got["items"] != n:
            raise RuntimeError(f"pgqueuer processed {got['items']} of {n} jobs")
        say(f"  {got['rate']:,.0f} items/s; {_note(got)}")
        rows.append(
            ratio_row(
                "P",
                f"PG items/s, ledger {procs} procs vs pgqueuer {procs} procs",
                ledger["rate"],
                got["rate"],
                "items/s",
                0.6,
                note=_note(got),
            )
        )
        rows.append(
            Row(
                "P",
                "WAL bytes/item, ledger vs pgqueuer",
                ledger["wal_per_item"],
                "B",
                got["wal_per_item"],
                "B",
                ledger["wal_per_item"] / got["wal_per_item"],
                "ledger <= 3000",
                ledger["wal_per_item"] <= 3000,
            )
        )
        rows.append(_cpu_row(ledger, got))
    return rows


def _cpu_row(ledger: dict[str, Any], peer: dict[str, Any]) -> Row:
    """Client + server CPU per item, the ledger's against pgqueuer's (goal: <= 1.5x)."""
    mine, theirs = _cpu_ms(ledger), _cpu_ms(peer)
    ratio = mine / theirs if mine is not None and theirs else None
    return Row(
        "P",
        "CPU ms/item (client+server), ledger vs pgqueuer",
        mine,
        "ms",
        theirs,
        "ms",
        ratio,
        "ratio <= 1.5",
        None if ratio is None else ratio <= 1.5,
        note="" if ratio is not None else "server CPU n/a (the server is on another machine)",
    )


def _cpu_ms(got: dict[str, Any]) -> float | None:
    server = got.get("server_ms")
    return None if server is None else float(got["client_ms"]) + float(server)


def _queue_peer(
    pg: PgTarget,
    peer: str,
    n: int,
    procs: int,
    batch: int,
    start_method: str | None,
    ledger: dict[str, Any],
    say: Callback,
) -> Row:
    """procrastinate or dbos: filled, worked by `procs` processes that do not count their
    jobs, the jobs counted from the peer's table afterwards."""
    import multiprocessing as mp

    with pg.database(f"cP_{peer}") as dsn:
        if peer == "procrastinate":
            say(f"case P: procrastinate, concurrency 8, {procs} procs, {n} items")
            _procrastinate_fill(dsn, n)
            child, done_in = _procrastinate_child, _procrastinate_done
        else:
            say(f"case P: dbos, worker_concurrency {batch}, {procs} procs, {n} items")
            filler = mp.get_context("spawn").Process(target=_dbos_fill, args=(dsn, n, batch))
            filler.start()
            filler.join()
            if filler.exitcode != 0:
                raise RuntimeError(f"dbos fill failed (exit code {filler.exitcode})")
            child, done_in = _dbos_child, _dbos_done
        got = _measure(dsn, [""], procs, batch, start_method, child=child)
        done = done_in(dsn)
    if done != n:
        raise RuntimeError(f"{peer} ran {done} of {n} jobs")
    got = _per_item(got, n)
    say(f"  {got['rate']:,.0f} items/s; {_note(got)}")
    return ratio_row(
        "P",
        f"PG items/s, ledger {procs} procs vs {peer} {procs} procs",
        ledger["rate"],
        got["rate"],
        "items/s",
        0.0,
        note=_note(got),
    )
