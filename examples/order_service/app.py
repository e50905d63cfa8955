"""An order service embedding the run ledger: FastAPI, `AsyncLedger`, and nothing blocking.

- The ledger opens in the app's lifespan and closes with it.
- `POST /orders` saves the order in the service's own table and submits its run in the
  same transaction (`lg.using(conn)`): both commit, or neither.
- An `AsyncWorker` per order works its items (the "shipping" of each line).
- An in-database `AsyncFollower` keeps the read model `order_view` (one row per order),
  in the same database, exactly once: the row changes in the transaction that moves the
  follower's checkpoint. It completes the order's run when the last line is shipped, in
  that same transaction (`lg.using(tx)`).
- `GET /orders/{order_id}` answers from the read model.

    LEDGER_DSN=postgresql://... uvicorn examples.order_service.app:app
    LEDGER_DSN=sqlite:///orders.db uvicorn examples.order_service.app:app
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from ledger import (
    Accepted,
    Actor,
    AsyncFollower,
    AsyncLedger,
    AsyncWorker,
    Lease,
    RunStatus,
    Transition,
)
from ledger.feed.async_follower import AsyncTx

SERVICE = Actor("order-service", "submitter")
CONTROLLER = Actor("order-service", "controller")
OWN_TABLES = (
    "CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, customer TEXT NOT NULL, run_id TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS order_view (run_id TEXT PRIMARY KEY, state TEXT NOT NULL, shipped INTEGER NOT NULL)",
)


class OrderIn(BaseModel):
    order_id: str = Field(min_length=1, max_length=100)
    customer: str = Field(min_length=1, max_length=100)
    lines: list[str] = Field(min_length=1, max_length=100)


class OrderOut(BaseModel):
    order_id: str
    run_id: str
    state: str
    shipped: int


async def ship(lease: Lease) -> Accepted:
    """The work of one order line (here: nothing to wait for but the loop)."""
    await asyncio.sleep(0)
    return Accepted(evidence={"shipped": lease.item_id})


def read_model_handler(lg: AsyncLedger) -> Any:
    """The follower's handler: the read model, in the follower's transaction; the last
    line shipped completes the order's run in that same transaction."""

    async def project(transitions: list[Transition], tx: AsyncTx) -> None:
        for t in transitions:
            if t.item_id is None:
                await tx.execute(
                    "INSERT INTO order_view (run_id, state, shipped) VALUES (?, ?, 0) "
                    "ON CONFLICT (run_id) DO UPDATE SET state = excluded.state",
                    (t.run_id, t.to_state),
                )
            elif t.to_state == "accepted":
                await tx.execute(
                    "UPDATE order_view SET shipped = shipped + 1 WHERE run_id = ?", (t.run_id,)
                )
                joined = lg.using(tx)
                status = await joined.status(t.run_id)
                left = sum(n for state, n in status.counts.items() if state != "accepted")
                if status.state == "running" and left == 0:
                    await joined.complete(t.run_id, CONTROLLER)

    return project


class DuplicateOrder(Exception):
    """An order with this id was saved before (nothing of the new one is kept)."""


async def _own_tables(dsn: str) -> None:
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(dsn[len("sqlite:///") :], check_same_thread=False)
        try:
            for ddl in OWN_TABLES:
                await asyncio.to_thread(conn.execute, ddl)
            await asyncio.to_thread(conn.commit)
        finally:
            conn.close()
    else:
        import psycopg

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            for ddl in OWN_TABLES:
                await aconn.execute(ddl)


async def save_order(lg: AsyncLedger, dsn: str, order: OrderIn) -> RunStatus:
    """The order row and its run, in one transaction of the service's own connection."""
    manifest = {
        "source_version": f"order:{order.order_id}",
        "config_version": "order-service-1",
        "scope": order.customer,
        "items": [
            {"item_id": line, "payload": {"customer": order.customer}} for line in order.lines
        ],
    }
    if dsn.startswith("sqlite"):
        # the ledger makes its sqlite3 calls on its database thread: check_same_thread=False
        conn = sqlite3.connect(dsn[len("sqlite:///") :], check_same_thread=False)
        try:
            status = await lg.using(conn).submit(manifest, SERVICE)
            await asyncio.to_thread(
                conn.execute,
                "INSERT INTO orders (order_id, customer, run_id) VALUES (?, ?, ?)",
                (order.order_id, order.customer, status.run_id),
            )
            await asyncio.to_thread(conn.commit)
        except BaseException as e:
            await asyncio.to_thread(conn.rollback)
            if isinstance(e, sqlite3.IntegrityError):
                raise DuplicateOrder(order.order_id) from e
            raise
        finally:
            conn.close()
        return status
    import psycopg

    try:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn, aconn.transaction():
            status = await lg.using(aconn).submit(manifest, SERVICE)
            await aconn.execute(
                "INSERT INTO orders (order_id, customer, run_id) VALUES (%s, %s, %s)",
                (order.order_id, order.customer, status.run_id),
            )
    except psycopg.errors.UniqueViolation as e:
        raise DuplicateOrder(order.order_id) from e
    return status


def create_app(dsn: str) -> FastAPI:
    """The service over the ledger at `dsn` (its own tables in the same database)."""
    workers: set[asyncio.Task[Any]] = set()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lg = await AsyncLedger.open(dsn)
        await _own_tables(dsn)
        follower = AsyncFollower(lg, "order-view", read_model_handler(lg), wait=True)
        following = asyncio.create_task(follower.run())
        app.state.lg = lg
        try:
            yield
        finally:
            for task in (*workers, following):
                task.cancel()
            for task in (*workers, following):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await lg.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def submit(order: OrderIn) -> OrderOut:
        lg: AsyncLedger = app.state.lg
        try:
            status = await save_order(lg, dsn, order)
        except DuplicateOrder:
            raise HTTPException(409, f"order {order.order_id} exists") from None
        await lg.start(status.run_id, CONTROLLER)
        task = asyncio.create_task(AsyncWorker(lg, status.run_id, ship, max_idle=0).run())
        workers.add(task)
        task.add_done_callback(workers.discard)
        return OrderOut(order_id=order.order_id, run_id=status.run_id, state="running", shipped=0)

    @app.get("/orders/{order_id}")
    async def read(order_id: str) -> OrderOut:
        row = await read_order(dsn, order_id)
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        return OrderOut(**row)

    return app


READ_ORDER = (
    "SELECT o.order_id, o.run_id, COALESCE(v.state, 'queued') AS state, "
    "COALESCE(v.shipped, 0) AS shipped "
    "FROM orders o LEFT JOIN order_view v ON v.run_id = o.run_id WHERE o.order_id = {}"
)


async def read_order(dsn: str, order_id: str) -> dict[str, Any] | None:
    """The order and its read model row, from the service's own connection."""
    if dsn.startswith("sqlite"):

        def read() -> dict[str, Any] | None:
            conn = sqlite3.connect(dsn[len("sqlite:///") :])
            conn.row_factory = sqlite3.Row
            try:
                row = conn.execute(READ_ORDER.format("?"), (order_id,)).fetchone()
                return None if row is None else dict(row)
            finally:
                conn.close()

        return await asyncio.to_thread(read)
    import psycopg
    from psycopg.rows import dict_row

    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as aconn:
        cur = await aconn.execute(READ_ORDER.format("%s"), (order_id,))
        return await cur.fetchone()


app = create_app(os.environ.get("LEDGER_DSN", "sqlite:///orders.db"))
