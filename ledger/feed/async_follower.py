"""`AsyncFollower`: a `Follower` for `AsyncLedger`, whose handler may be a coroutine.

It is the `Follower` itself (ledger/feed/follower.py: the checkpoint, the name's lock,
in-database and external delivery), run through the greenlet bridge over the async
ledger's store; only waiting between batches is written for the loop here. An in-database
handler `async def handler(transitions, tx)` runs inside the batch's transaction and may
command the ledger through `lg.using(tx)`: what it does commits with the batch and its
checkpoint, or rolls back with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ledger.core.errors import CommitUncertain, FollowerBusy, StoreUnavailable
from ledger.feed.follower import IDLE_WAIT_S, RETRY_FIRST_S, RETRY_MAX_S, Follower, _in_database
from ledger.stores.base import handler_transaction
from ledger.stores.green import await_only, bridged

if TYPE_CHECKING:
    from ledger.service.async_ledger import AsyncLedger
    from ledger.stores.base import Store, Tx

T = TypeVar("T")


class AsyncFollower:
    """Deliver the ledger's transitions to `handler` in position order with a durable
    checkpoint, as `Follower` does, from asyncio code. `handler(transitions)` (external,
    at least once) or `handler(transitions, tx)` (in-database, exactly once) may be a
    plain function or a coroutine function. Use `async with` (or `await close()`)."""

    def __init__(
        self,
        lg: AsyncLedger,
        name: str,
        handler: Callable[..., Any],
        run_id: str | None = None,
        kinds: Sequence[str] | str | None = None,
        batch: int = 500,
        *,
        in_database: bool | None = None,
        wait: bool = False,
        payloads: bool = False,
    ) -> None:
        self.lg = lg
        self.handler = handler
        self._mode = _in_database(handler) if in_database is None else bool(in_database)
        self._args = (name, run_id, kinds, batch, wait, payloads)
        self._stop = threading.Event()
        self._follower: Follower | None = None

    async def _sync(self) -> Follower:
        if self._follower is None:
            name, run_id, kinds, batch, wait, payloads = self._args
            self._follower = await bridged(
                Follower,
                self.lg._ledger,
                name,
                _awaiting(self.handler, self.lg.store, self._mode),
                run_id,
                kinds,
                batch,
                in_database=self._mode,
                wait=wait,
                stop=self._stop,
                payloads=payloads,
            )
        return self._follower

    @property
    def in_database(self) -> bool:
        return self._mode

    async def position(self) -> int:
        """The checkpoint: every transition up to it has been handled (0 before any)."""
        follower = await self._sync()
        return await bridged(lambda: follower.position)

    async def start(self) -> None:
        """Take the name's lock and create its checkpoint (FollowerBusy: held elsewhere)."""
        follower = await self._sync()
        await bridged(follower.start)

    async def run_once(self) -> int:
        """Handle the next batch (if any); returns how many transitions were handled."""
        follower = await self._sync()
        return await bridged(follower.run_once)

    async def catch_up(self) -> int:
        """Handle batches until none is left; returns how many transitions were handled."""
        follower = await self._sync()
        return await bridged(follower.catch_up)

    def stop(self) -> None:
        """Make `run()` return after the batch in hand."""
        self._stop.set()

    async def run(self, *, retry: bool = True) -> None:
        """Handle batches as transitions commit, until `stop()` or the task is cancelled;
        releases the lock at the end. Faults of the database are waited out as
        `Follower.run` does (with `retry`); the handler's own exceptions end it."""
        from ledger.service.async_ledger import _AsyncWaiter

        follower = await self._sync()
        waiter = _AsyncWaiter(self.lg.store)
        pause = RETRY_FIRST_S
        try:
            while not self._stop.is_set():
                try:
                    _, more = await bridged(follower._step, True)
                    if not more:
                        await waiter.wait(follower._cursor, IDLE_WAIT_S)
                except (StoreUnavailable, CommitUncertain, FollowerBusy) as e:
                    busy = isinstance(e, FollowerBusy) and not follower._lock.lost
                    if not retry or busy:
                        raise
                    await bridged(follower.close)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_MAX_S)
                    continue
                pause = RETRY_FIRST_S
        finally:
            await waiter.close()
            with contextlib.suppress(StoreUnavailable, CommitUncertain, FollowerBusy):
                await asyncio.shield(bridged(follower._flush))
            await asyncio.shield(bridged(follower.close))

    async def close(self) -> None:
        """Release the name's lock (another process may then run this follower)."""
        if self._follower is not None:
            await bridged(self._follower.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncTx:
    """The batch's transaction as a coroutine handler uses it: `await tx.execute(sql,
    params)`, `executemany`, `fetchall`, `fetchone` (`?` placeholders on every store), and
    `lg.using(tx)` for the ledger's commands and reads in it."""

    def __init__(self, tx: Tx) -> None:
        self.ledger_tx = tx

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await bridged(self.ledger_tx.execute, sql, params)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await bridged(self.ledger_tx.executemany, sql, list(rows))

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return await bridged(self.ledger_tx.fetchall, sql, params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        return await bridged(self.ledger_tx.fetchone, sql, params)


def _awaiting(handler: Callable[..., Any], store: Store, in_database: bool) -> Callable[..., Any]:
    """The handler as `Follower` calls it: a coroutine it returns is awaited on the loop,
    in-database ones marked as running in the batch's transaction (a command of the
    ledger's own transactions there is refused, as in a plain handler) and given the
    transaction as an `AsyncTx`."""
    coroutine = inspect.iscoroutinefunction(handler)

    def call(*args: Any) -> Any:
        if coroutine and len(args) == 2:
            args = (args[0], AsyncTx(args[1]))
        result = handler(*args)
        if inspect.isawaitable(result):
            result = await_only(_marked(result, store) if in_database else result)
        return result

    return call


async def _marked(awaitable: Awaitable[T], store: Store) -> T:
    with handler_transaction(store):
        return await awaitable
