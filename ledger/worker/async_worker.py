"""`AsyncWorker`: the `Worker` for `AsyncLedger`, whose handler may be a coroutine.

It is the `Worker` itself (ledger/worker/worker.py: claiming, adaptive prefetch, outcomes
recorded in batches, lost leases, what is written when), run through the greenlet bridge
over the async ledger's store; what differs is only where the work runs: handlers are
tasks on the event loop (at most `concurrency` at once; a plain function handler runs in
a thread of its own, as `asyncio.to_thread` does), heartbeats are a task, and waits are
the loop's. Cancelling the task that awaits `run()` stops it: nothing more is claimed, the
handlers in flight are cancelled and recorded as failed attempts (retryable: another
worker takes the items), and the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ledger.stores.green import await_only, bridged
from ledger.worker.results import Outcome, WorkerSummary
from ledger.worker.worker import Worker

if TYPE_CHECKING:
    from ledger.core.views import Lease
    from ledger.service.async_ledger import AsyncLedger


class HandlerCancelled(Exception):
    """The handler's task was cancelled (the worker was): what its failed attempt records."""


class _LoopLock:
    """The in-flight entry's lock, taken by code the bridge runs without blocking the
    loop's thread (heartbeats and outcomes are greenlets on that one thread)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    def __enter__(self) -> None:
        await_only(self._lock.acquire())

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class AsyncWorker(Worker):
    """Work one run's items from asyncio code: `await AsyncWorker(lg, run_id, handle).run()`.

    `handle(lease)` returns (or, as a coroutine, resolves to) `Accepted`, `Rejected` or
    `Quarantine`; raising records a retryable failed attempt, as with `Worker`. The
    arguments are `Worker`'s."""

    _interruptions = (KeyboardInterrupt, asyncio.CancelledError)

    def __init__(
        self,
        lg: AsyncLedger,
        run_id: str,
        handle: Callable[[Lease], Any],
        worker_id: str | None = None,
        concurrency: int = 4,
        *,
        heartbeat_every: float | None = None,
        poll_interval: float = 0.5,
        max_idle: float = 30.0,
        prefetch: int | None = None,
    ) -> None:
        super().__init__(
            lg._ledger,
            run_id,
            handle,
            worker_id,
            concurrency,
            heartbeat_every=heartbeat_every,
            poll_interval=poll_interval,
            max_idle=max_idle,
            prefetch=prefetch,
        )
        self._slots: asyncio.Semaphore | None = None
        self._woken: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Outcome]] = set()
        self._event_loop: asyncio.AbstractEventLoop | None = None

    async def run(self) -> WorkerSummary:  # type: ignore[override]
        """Work the run until it stops running or nothing is left (see `Worker`)."""
        self._slots = asyncio.Semaphore(self.concurrency)
        self._woken = asyncio.Event()
        self._event_loop = asyncio.get_running_loop()
        return await bridged(Worker.run, self)

    def stop(self) -> None:
        """Ask `run()` to stop claiming; attempts in flight still finish and are recorded
        (safe from any thread)."""
        super().stop()
        loop, woken = self._event_loop, self._woken
        if loop is not None and woken is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended
                loop.call_soon_threadsafe(woken.set)

    # -- where the work runs -------------------------------------------------------
    def _handlers(self) -> Any:
        return None

    def _start_handler(self, pool: Any, lease: Lease) -> Any:
        task = asyncio.get_running_loop().create_task(self._handle(lease))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _handle(self, lease: Lease) -> Outcome:
        assert self._slots is not None
        try:
            async with self._slots:
                start = time.perf_counter()
                try:
                    if inspect.iscoroutinefunction(self.handle):
                        result = await self.handle(lease)
                    else:  # a plain function: in a thread, never on the loop
                        result = await asyncio.to_thread(self.handle, lease)
                    if inspect.isawaitable(result):
                        result = await result
                    return result  # type: ignore[no-any-return]
                finally:
                    with self._registry_lock:
                        self._handled += 1
                        self._handled_seconds += time.perf_counter() - start
        except asyncio.CancelledError:
            raise HandlerCancelled("the worker was cancelled while the handler ran") from None

    def _wait_any(self, futures: list[Any], timeout: float | None) -> set[Any]:
        done, _ = await_only(
            asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        )
        return done

    def _pause(self, seconds: float) -> None:
        assert self._woken is not None
        with contextlib.suppress(TimeoutError):
            await_only(asyncio.wait_for(self._woken.wait(), seconds))

    def _interrupt_handlers(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _finish_handlers(self, pool: Any) -> None:
        if self._tasks:
            await_only(asyncio.wait(list(self._tasks)))

    def _start_heartbeats(self, interval: float) -> Any:
        return asyncio.get_running_loop().create_task(self._heartbeats(interval))

    async def _heartbeats(self, interval: float) -> None:
        tick = max(0.005, min(interval / 4, 1.0))
        while not self._closing.is_set():
            await asyncio.sleep(tick)
            with self._registry_lock:
                entries = list(self._in_flight.values())
            now = time.monotonic()
            for entry in entries:
                if entry.next_beat <= now and not self._closing.is_set():
                    await bridged(self._beat, entry, interval)

    def _join_heartbeats(self, beats: Any) -> None:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await_only(beats)

    def _entry_lock(self) -> Any:
        return _LoopLock()
