"""Event streams off the request pool: one watcher of the feed's head per app, streams
as async generators on the event loop, and caps on how many are open.

A stream (`GET /events/stream`, the operator page's live refresh) spends nearly all its
life waiting for the next transition. It waits on the event loop (`FeedHub.wait_past`),
never on a thread of the pool that serves commands and reads: one thread per app
(`FeedHub`) watches the head of the feed (on PostgreSQL with the LISTEN connection of
`reads.feed.Waiter`, one for the app, not one per stream) and wakes every stream when
it moves. Each page a stream sends is read on a small pool of its own
(`STREAM_READERS` threads), so streams cannot take the threads commands need.

Caps: at most `per_token` open streams for one token (the anonymous readers of
`--public-reads` count as one) and `total` for the app; past them the request gets 429
(per token) or 503 (all), with `Retry-After`. A stream ends cleanly (no traceback)
when its time is up, when the client goes away, at once when its token is revoked
(checked every `REVOKE_CHECK_S`), and when the server shuts down (`close`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ledger.reads import feed

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

STREAM_READERS = 4  # threads reading streams' pages, apart from the request pool
REVOKE_CHECK_S = 1.0  # a revoked token's stream ends within this
HEAD_RECHECK_S = 1.0  # the watcher looks at the head at least this often
RETRY_AFTER_S = 5


@dataclass
class StreamLimits:
    """How many event streams may be open: per token, and in all."""

    per_token: int = 4
    total: int = 64


class StreamRefused(Exception):
    """Too many open streams: 429 (this token's) or 503 (the server's)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Slots:
    limits: StreamLimits
    open: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def total(self) -> int:
        return sum(self.open.values())


class FeedHub:
    """The feed's head, watched by one thread for every stream of an app."""

    def __init__(self, lg: Ledger, limits: StreamLimits | None = None) -> None:
        self.lg = lg
        self.slots = _Slots(limits or StreamLimits())
        self.readers = anyio.CapacityLimiter(STREAM_READERS)
        self.closed = threading.Event()
        self._head = -1
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._thread: threading.Thread | None = None

    # -- slots -------------------------------------------------------------
    @contextlib.contextmanager
    def slot(self, key: str | None) -> Iterator[None]:
        """Hold one of the open streams for `key` (a token's digest; None: anonymous),
        or raise StreamRefused."""
        name = "anonymous" if key is None else hashlib.sha256(key.encode()).hexdigest()
        with self.slots.lock:
            limits = self.slots.limits
            if self.closed.is_set():
                raise StreamRefused(503, "the server is shutting down")
            if self.slots.open.get(name, 0) >= limits.per_token:
                raise StreamRefused(429, f"at most {limits.per_token} open event streams per token")
            if self.slots.total() >= limits.total:
                raise StreamRefused(503, f"at most {limits.total} open event streams")
            self.slots.open[name] = self.slots.open.get(name, 0) + 1
        try:
            yield
        finally:
            with self.slots.lock:
                left = self.slots.open[name] - 1
                if left:
                    self.slots.open[name] = left
                else:
                    del self.slots.open[name]

    def open_streams(self) -> int:
        with self.slots.lock:
            return self.slots.total()

    # -- the head ----------------------------------------------------------
    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self.closed.is_set():
                self._thread = threading.Thread(
                    target=self._watch, name="ledger-feed-hub", daemon=True
                )
                self._thread.start()

    def _watch(self) -> None:
        waiter = feed.Waiter(self.lg.store)
        try:
            while not self.closed.is_set():
                try:
                    with self.lg.store.read() as tx:
                        head = feed.head(tx)
                    if head != self._head:
                        self._head = head
                        self._wake()
                    waiter.wait(head, HEAD_RECHECK_S, self.closed)
                except Exception:
                    if self.lg.store.closed:
                        self.closed.set()  # the ledger was closed under the app: streams end
                        return
                    # the store is away for now: streams keep sending their keep-alives
                    self.closed.wait(HEAD_RECHECK_S)
        finally:
            waiter.close()
            self._wake()

    def _wake(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(event.set)

    async def wait_past(self, cursor: int, timeout: float) -> bool:
        """True once the head is past `cursor` (a transition may be there to read); False
        after `timeout` seconds, or at once when the hub closes."""
        if self._head > cursor:
            return True
        self._start()
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.add(entry)
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            while self._head <= cursor and not self.closed.is_set():
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return False
                event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
            return self._head > cursor
        finally:
            with self._lock:
                self._waiters.discard(entry)

    async def read(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` on the streams' own threads (a short read of one page)."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.readers)

    def close(self) -> None:
        """End every stream (they see `closed` at their next wake-up) and the watcher."""
        self.closed.set()
        self._wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(HEAD_RECHECK_S + 5)


__all__ = ["FeedHub", "StreamLimits", "StreamRefused"]
