"""`AsyncLedger`'s PostgreSQL store: the PostgreSQL store's own code over psycopg's
`AsyncConnectionPool`, with no thread per call.

psycopg's synchronous and asynchronous connections share everything but their waiting:
each operation is a generator that says which socket event it waits for, and
`Connection.wait` waits in the calling thread where `AsyncConnection.wait` waits on the
event loop. The store takes an `AsyncConnection` from the pool and hands the ledger's
code (`PgTx`, the pipelined transaction, the recorder) a synchronous `Connection` over
the same libpq connection whose `wait` is the asynchronous connection's, awaited through
the greenlet bridge (ledger/stores/green.py). So every statement the sync store sends is
the one this store sends, and the loop runs other tasks while the server answers; a
cancelled task cancels its query on the server (psycopg's own handling) and rolls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import eventsourcing.persistence as es
import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg.types.composite import register_composite

from ledger.stores.green import await_only
from ledger.stores.pg_recorder import WAKE_INTERVAL_S
from ledger.stores.pg_tx import PREPARED_MAX, PgTx
from ledger.stores.postgres import CONNECT_TIMEOUT_S, PostgresStore

# psycopg's error classes and eventsourcing's, most specific first: the sync store gets
# its errors typed by eventsourcing's datastore, and `_tx_body` types them from there.
_TRANSLATED: tuple[tuple[type[psycopg.Error], type[Exception]], ...] = (
    (psycopg.InterfaceError, es.InterfaceError),
    (psycopg.OperationalError, es.OperationalError),
    (psycopg.DataError, es.DataError),
    (psycopg.IntegrityError, es.IntegrityError),
    (psycopg.InternalError, es.InternalError),
    (psycopg.ProgrammingError, es.ProgrammingError),
    (psycopg.NotSupportedError, es.NotSupportedError),
    (psycopg.DatabaseError, es.DatabaseError),
    (psycopg.Error, es.PersistenceError),
)


class GreenConnection(psycopg.Connection[Any]):
    """A synchronous connection over an `AsyncConnection`'s libpq connection, waiting on
    the event loop (from code the greenlet bridge runs)."""

    def __init__(self, aconn: psycopg.AsyncConnection[Any], row_factory: Any = dict_row) -> None:
        pgconn = aconn.pgconn
        handlers = (pgconn.notice_handler, pgconn.notify_handler)
        super().__init__(pgconn, row_factory=row_factory)
        # the asynchronous connection keeps its notices and notifications...
        pgconn.notice_handler, pgconn.notify_handler = handlers
        self._aconn = aconn
        self._adapters = aconn.adapters  # ...its types (composites registered on it)...
        self._prepared = aconn._prepared  # ...and its prepared statements: one session

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        return await_only(self._aconn.wait(gen, interval=interval, timeout=timeout))


class _Wakeups:
    """NOTIFY after commits that appended events, at most one per interval, from a task on
    the loop (the sync store's `Waker` does the same from a thread)."""

    def __init__(self, store: GreenPostgresStore, interval: float) -> None:
        self._store = store
        self._interval = interval
        self._wanted = False
        self._task: asyncio.Task[None] | None = None
        self._statement = sql.SQL("NOTIFY {}").format(sql.Identifier(store.recorder.channel_name))

    def poke(self) -> None:
        self._wanted = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._wanted:
            self._wanted = False
            with contextlib.suppress(Exception):  # a hint only: followers also poll
                async with self._store.pool.connection(timeout=max(self._interval, 1.0)) as c:
                    await c.execute(self._statement)
            await asyncio.sleep(self._interval)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            # what was poked before the close is still sent (as the sync store's Waker)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, timeout=5)


class GreenPostgresStore(PostgresStore):
    """A PostgreSQL database for `AsyncLedger` (libpq URL)."""

    def __init__(
        self,
        dsn: str,
        clock: Callable[[], datetime] | None = None,
        pool_size: int = 2,
        max_overflow: int = 10,
    ) -> None:
        # The schema is created (or checked) as the sync store does it, once, at open; the
        # sync pool that eventsourcing's datastore opened for that is closed at once.
        super().__init__(dsn, clock, pool_size=1, max_overflow=0)
        self.datastore.pool.close()
        adapters = list(self.datastore.psycopg_type_adapters.values())
        idle = sql.SQL("SET idle_in_transaction_session_timeout = '{}ms'").format(
            int(self.datastore.idle_in_transaction_session_timeout * 1000)
        )

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            for info in adapters:
                register_composite(info, conn)
            await conn.execute(idle)

        self.pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
            dsn,
            kwargs={"autocommit": True, "row_factory": dict_row},
            min_size=pool_size,
            max_size=pool_size + max_overflow,
            open=False,
            configure=configure,
            timeout=CONNECT_TIMEOUT_S,
        )
        self._views: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], GreenConnection] = (
            weakref.WeakKeyDictionary()
        )
        self.wakeups = _Wakeups(self, WAKE_INTERVAL_S)

    async def open_pool(self) -> None:
        await self.pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            aconn = await_only(self.pool.getconn())
        except psycopg.Error as e:
            raise _translated(e) from e
        try:
            view = self._views.get(aconn)
            if view is None:
                view = self._views[aconn] = GreenConnection(aconn)
                view.prepared_max = PREPARED_MAX
            try:
                yield view
            except psycopg.Error as e:
                raise _translated(e) from e
        finally:
            await_only(self.pool.putconn(aconn))

    def session_connection(self) -> psycopg.Connection[Any]:
        aconn = await_only(psycopg.AsyncConnection.connect(self.dsn, autocommit=True))
        return GreenConnection(aconn, row_factory=tuple_row)

    def _wake(self) -> None:
        self.wakeups.poke()

    @contextmanager
    def joined_tx(self, conn: Any, write: bool) -> Iterator[PgTx]:
        """The caller's `AsyncConnection` (or a ledger transaction's connection), through a
        synchronous view that waits on the loop."""
        if isinstance(conn, psycopg.AsyncConnection):
            view = _caller_views.get(conn)
            if view is None:
                view = _caller_views[conn] = GreenConnection(conn)
            conn = view
        with super().joined_tx(conn, write) as tx:
            yield tx

    def close(self) -> None:
        """Close the pool (from code the bridge runs: `AsyncLedger.close`)."""
        self._closed = True
        await_only(self.wakeups.aclose())
        await_only(self.pool.close())
        with contextlib.suppress(Exception):
            self.datastore.close()


# the callers' own connections given to `AsyncLedger.using`, each with its one view
_caller_views: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], GreenConnection] = (
    weakref.WeakKeyDictionary()
)


def _translated(error: psycopg.Error) -> Exception:
    for theirs, ours in _TRANSLATED:
        if isinstance(error, theirs):
            return ours(str(error))
    return es.PersistenceError(str(error))
