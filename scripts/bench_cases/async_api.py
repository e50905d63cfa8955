"""Case 14: AsyncLedger against the sync API on PostgreSQL, 50 concurrent submitters.

Ledger side: 50 asyncio tasks on one AsyncLedger, each submitting and starting
`async_runs_per_submitter` runs of 3 items (psycopg's AsyncConnectionPool, the code run
through the greenlet bridge). Baseline: the same work from 50 threads sharing one
`Ledger` (its ConnectionPool), the way a sync service serves 50 requests. Both have the
same pool bound (12 connections). Ratio: runs/s async / runs/s sync, measured in the
same run on the same server.

Beside it, the event loop's worst lag during the async run: a task that sleeps 5 ms
over and over and records how late it wakes (what every other request on that loop
would wait).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .common import Callback, Clock, PgTarget, Row, Sizes, actors, manifest, ratio_row

SUBMITTERS = 50


def _sync_rate(dsn: str, per: int) -> float:
    from ledger import Ledger

    submitter, controller = actors()
    m = manifest(3)
    with Ledger.open(dsn) as lg:
        lg.submit(m, submitter)  # warm the pool and the prepared statements

        def one(_: int) -> None:
            for _ in range(per):
                lg.start(lg.submit(m, submitter).run_id, controller)

        with ThreadPoolExecutor(SUBMITTERS) as pool, Clock() as clock:
            list(pool.map(one, range(SUBMITTERS)))
    return SUBMITTERS * per / clock.seconds


async def _async_rate(dsn: str, per: int) -> tuple[float, float]:
    from ledger import AsyncLedger

    submitter, controller = actors()
    m = manifest(3)
    worst = 0.0
    running = True

    async def lag() -> None:
        nonlocal worst
        while running:
            start = time.perf_counter()
            await asyncio.sleep(0.005)
            worst = max(worst, time.perf_counter() - start - 0.005)

    async with await AsyncLedger.open(dsn) as lg:
        await lg.submit(m, submitter)

        async def one() -> None:
            for _ in range(per):
                await lg.start((await lg.submit(m, submitter)).run_id, controller)

        watcher = asyncio.create_task(lag())
        with Clock() as clock:
            await asyncio.gather(*(one() for _ in range(SUBMITTERS)))
        running = False
        await watcher
    return SUBMITTERS * per / clock.seconds, worst * 1000.0


ROUND_TRIPS = 500


def _round_trips(dsn: str) -> dict[str, float]:
    """Round trips per second of `SELECT 1`: psycopg's sync connection, its
    AsyncConnection, and the bridge (a ledger read transaction of AsyncLedger's store)."""
    import psycopg

    from ledger import AsyncLedger
    from ledger.stores.green import bridged

    out: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn, Clock() as clock:
        for _ in range(ROUND_TRIPS):
            conn.execute("SELECT 1").fetchall()
    out["sync"] = ROUND_TRIPS / clock.seconds

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            with Clock() as clock:
                for _ in range(ROUND_TRIPS):
                    await (await aconn.execute("SELECT 1")).fetchall()
            out["async"] = ROUND_TRIPS / clock.seconds
        async with await AsyncLedger.open(dsn) as lg:

            def reads() -> None:
                with lg.store.read() as tx:
                    for _ in range(ROUND_TRIPS):
                        tx.fetchall("SELECT 1")

            with Clock() as clock:
                await bridged(reads)
            out["bridge"] = ROUND_TRIPS / clock.seconds

    asyncio.run(main())
    return out


def run(pg: PgTarget, sizes: Sizes, say: Callback) -> list[Row]:
    per = max(1, sizes.async_runs_per_submitter)
    rates: dict[str, list[float]] = {"sync": [], "async": []}
    lags: list[float] = []
    for rep in range(2):  # alternating, so neither side always runs on a warmer server
        with pg.database(f"async_sync_{rep}") as dsn:
            rates["sync"].append(_sync_rate(dsn, per))
        with pg.database(f"async_async_{rep}") as dsn:
            rate, worst = asyncio.run(_async_rate(dsn, per))
            rates["async"].append(rate)
            lags.append(worst)
        say(f"case 14 rep {rep}: sync {rates['sync'][-1]:.0f} runs/s, async {rate:.0f} runs/s")
    best: dict[str, Any] = {k: max(v) for k, v in rates.items()}
    with pg.database("async_rt") as dsn:
        trips = _round_trips(dsn)
    say(f"case 14 round trips/s: {trips}")
    return [
        ratio_row(
            "14",
            f"AsyncLedger vs sync API, {SUBMITTERS} concurrent submitters (runs/s)",
            best["async"],
            best["sync"],
            "runs/s",
            1.0,
            note=(
                f"submit+start of a 3-item run, {per} per submitter; the loop's worst lag "
                f"during the async run {max(lags):.1f} ms (a task sleeping 5 ms)"
            ),
            loop_lag_ms=round(max(lags), 2),
        ),
        ratio_row(
            "14",
            "the bridge: SELECT 1 through AsyncLedger's store vs a plain AsyncConnection (/s)",
            trips["bridge"],
            trips["async"],
            "round trips/s",
            0.9,
            note=(
                "what the greenlet bridge costs over psycopg's own async I/O; a sync "
                f"connection made {trips['sync']:.0f}/s in the same run (asyncio's own "
                f"cost: async/sync {trips['async'] / trips['sync']:.2f})"
            ),
            sync_round_trips=round(trips["sync"]),
        ),
    ]
