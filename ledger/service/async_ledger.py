"""`AsyncLedger`: the ledger for asyncio services, over the same code as `Ledger`.

Every command and read is `Ledger`'s own, run through the greenlet bridge
(ledger/stores/green.py) over a store whose waits are the event loop's: psycopg's
`AsyncConnectionPool` on PostgreSQL (no thread per call), one database thread on SQLite
and memory. The coroutines with `Ledger`'s names are generated from its source
(ledger/service/async_api.py); what is not one call of the sync API is here: opening and
closing, keyed views, the caller's own transaction (`using`), waiting and following.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ledger.core.errors import InvalidInput
from ledger.core.extras import MissingExtra
from ledger.reads import feed
from ledger.service.async_api import AsyncLedgerAPI
from ledger.service.ledger import Ledger
from ledger.stores import open_store, resolve_dsn
from ledger.stores.green import bridged

if TYPE_CHECKING:
    from ledger.core.views import Transition
    from ledger.stores.base import Store

T = TypeVar("T")

FOLLOW_PAGE = 500


def _require_greenlet() -> None:
    try:
        import greenlet  # type: ignore[import-untyped]  # noqa: F401
    except ModuleNotFoundError:
        raise MissingExtra("async", "greenlet") from None


class AsyncLedger(AsyncLedgerAPI):
    """The run ledger for asyncio code: every public command and read of `Ledger` as a
    coroutine with the same name, arguments, result and typed errors.

    Open it in the application's lifespan (`await AsyncLedger.open(dsn)` or `async with`)
    and close it at the end. A cancelled call rolls its transaction back; the ledger stays
    usable. Concurrent calls run side by side on PostgreSQL (one pooled connection each)
    and one at a time on SQLite."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    @classmethod
    async def open(
        cls,
        dsn: str | None = None,
        clock: Callable[[], datetime] | None = None,
        *,
        create: bool = True,
    ) -> AsyncLedger:
        """Open a ledger (`sqlite:///path`, `postgresql://...`, `memory://`; else LEDGER_DSN,
        else `sqlite:///./ledger.db`), creating the schema if missing, as `Ledger.open`."""
        _require_greenlet()
        if clock is not None and not callable(clock):
            raise InvalidInput("clock must be a callable returning an aware datetime")
        # schema checks and migrations are once per process: off the loop, in a thread
        store = await asyncio.to_thread(
            open_store, resolve_dsn(dsn), clock, create=create, green=True
        )
        opening = getattr(store, "open_pool", None)
        if opening is not None:
            try:
                await opening()
            except BaseException:
                await bridged(store.close)
                raise
        return cls(Ledger(store))

    @property
    def store(self) -> Store:
        """The store (its transactions may only be used from code the bridge runs)."""
        return self._ledger.store

    async def close(self) -> None:
        """Release the store's connections (and its database thread)."""
        await bridged(self._ledger.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return await bridged(fn, *args, **kwargs)

    def keyed(self, key: str) -> AsyncLedger:
        """A view whose next command carries `key` as its `idempotency_key` (`Ledger.keyed`)."""
        return AsyncLedger(self._ledger.keyed(key))

    def using(self, conn: Any) -> AsyncLedger:
        """A view whose commands and reads run inside the caller's open transaction on
        `conn`: a psycopg `AsyncConnection` to the ledger's PostgreSQL database (in a
        transaction block), a `sqlite3.Connection` to its SQLite file, or the `tx` an
        in-database follower's handler gets. They commit and roll back with the caller's
        own writes (`Ledger.using`); nothing is retried on a database fault."""
        return AsyncLedger(self._ledger.using(conn))

    async def iter_audit(
        self,
        run_id: str | None = None,
        actor: str | None = None,
        role: str | None = None,
        state: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        newest_first: bool = False,
        after: int | None = None,
        limit: int | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[Transition]:
        """`audit` as an async iterator, `page_size` transitions per read transaction."""
        it = await self._call(
            self._ledger.iter_audit,
            run_id,
            actor,
            role,
            state,
            since,
            until,
            newest_first,
            after,
            limit,
            page_size,
        )
        done = object()
        while True:
            found = await self._call(next, it, done)
            if found is done:
                return
            yield found

    async def wait_for_events(self, after: int | None, timeout: float) -> bool:
        """Wait until a transition past `after` has committed (True) or `timeout` seconds
        pass (False), without blocking the loop: LISTEN on an asynchronous connection on
        PostgreSQL, short polling elsewhere."""
        position = feed.check_position(after)
        seconds = feed.check_timeout(timeout)
        waiter = _AsyncWaiter(self.store)
        try:
            return await waiter.wait(position, seconds)
        finally:
            await waiter.close()

    async def follow(
        self,
        after: int | None = None,
        run_id: str | None = None,
        kinds: Sequence[str] | str | None = None,
        *,
        payloads: bool = False,
        idle_wait: float = 30.0,
    ) -> AsyncIterator[Transition]:
        """The change feed as an endless async iterator: every transition after `after`
        (of one run or all, whose command or new state is one of `kinds`) in position
        order, each as soon as it has committed. Break out of the loop (or cancel the
        task) to stop; nothing is held between transitions. For a durable checkpoint,
        use `AsyncFollower`."""
        position = feed.check_position(after)
        flt = feed.FeedFilter.of(run_id, kinds)
        feed.check_flag(payloads, "payloads")
        if flt.run_id is not None:
            await self._call(self._check_run, flt.run_id)
        waiter = _AsyncWaiter(self.store)
        try:
            while True:
                found, cursor = await self._call(self._page, position, flt, FOLLOW_PAGE, payloads)
                for transition in found:
                    yield transition
                caught_up = len(found) < FOLLOW_PAGE
                position = cursor
                if caught_up:
                    await waiter.wait(position, idle_wait)
        finally:
            await waiter.close()

    def _check_run(self, run_id: str) -> None:
        with self.store.read() as tx:
            feed.check_run(tx, run_id)

    def _page(
        self, after: int, flt: feed.FeedFilter, limit: int, payloads: bool
    ) -> tuple[list[Transition], int]:
        from ledger.reads.payloads import attach as attach_payloads

        with self.store.read() as tx:
            found, cursor = feed.page(tx, after, flt, limit)
            if payloads and found:
                attach_payloads(tx, found)
            return found, cursor


class _AsyncWaiter:
    """`feed.Waiter` for the loop: LISTEN on an `AsyncConnection` of its own (PostgreSQL),
    polling elsewhere; the look at the store decides, a notification is only a hint."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._conn: Any = None

    async def _listen(self) -> Any:
        if self._conn is None and self.store.dialect == "postgres":
            import psycopg
            from psycopg import sql

            with contextlib.suppress(Exception):  # unreachable: poll until it is back
                conn = await psycopg.AsyncConnection.connect(
                    getattr(self.store, "dsn", ""), autocommit=True
                )
                channel = sql.Identifier(feed.notify_channel(self.store))
                await conn.execute(sql.SQL("LISTEN {}").format(channel))
                self._conn = conn
        return self._conn

    async def wait(self, after: int, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await self._listen()
        while True:
            if await bridged(feed.has_after, self.store, after):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if conn is not None:
                try:
                    async for _ in conn.notifies(
                        timeout=min(remaining, feed.PG_RECHECK_S), stop_after=1
                    ):
                        pass
                except Exception:  # the listening connection died: poll until it is back
                    await self.close()
                    conn = None
            else:
                await asyncio.sleep(min(remaining, feed.SQLITE_POLL_S))

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
