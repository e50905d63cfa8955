"""`AsyncLedger`'s SQLite store: the SQLite store's own code, its calls into sqlite3 made
on one database thread of its own (as aiosqlite does), never on the event loop's.

The ledger's code runs in a greenlet on the loop (ledger/stores/green.py); each sqlite3
call (`SqliteStore.io`) is handed to the database thread and awaited. One transaction at a
time holds the store (an asyncio lock, taken without blocking the loop): SQLite has one
writer anyway, and the store's one connection serves one transaction at a time.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, TypeVar

from ledger.stores import green
from ledger.stores.green import await_only, in_bridge
from ledger.stores.sqlite import BUSY_TIMEOUT_S, SqliteStore

T = TypeVar("T")
_SQLITE_BUSY = 5


def _busy_timeout(conn: sqlite3.Connection, ms: int) -> int:
    """Set the connection's busy timeout; return the one it had."""
    previous = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
    conn.execute(f"PRAGMA busy_timeout={int(ms)}")
    return previous


class GreenSqliteStore(SqliteStore):
    """A SQLite file or in-memory database for `AsyncLedger`."""

    def __init__(self, path: str | None, clock: Callable[[], datetime] | None = None) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-sqlite")
        self._thread_ident: int | None = None
        self._held = asyncio.Lock()
        self._held_by: object | None = None
        super().__init__(path, clock)

    def io(self, fn: Callable[..., T], /, *args: Any) -> T:
        """`fn(*args)` on the database thread; awaited on the loop when bridged."""
        if threading.get_ident() == self._thread_ident:
            return fn(*args)
        future = self._thread.submit(self._on_thread, fn, *args)
        if in_bridge():
            return await_only(asyncio.wrap_future(future))
        return future.result()  # opening and closing the store, outside the loop

    def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        self._thread_ident = threading.get_ident()
        return fn(*args)

    def _begin(self, conn: sqlite3.Connection, begin: str) -> None:
        """Wait for the file's write lock on the loop, not on the database thread: SQLite's
        own busy wait would hold the thread, and with it every other transaction of this
        store, the one holding the lock included (a caller's, through `using`)."""
        if not in_bridge():
            super()._begin(conn, begin)
            return
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        pause = 0.001
        previous = self.io(_busy_timeout, conn, 0)
        try:
            while True:
                try:
                    self.io(conn.execute, begin)
                    return
                except sqlite3.OperationalError as e:
                    busy = (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_BUSY
                    if not busy or time.monotonic() > deadline:
                        raise
                green.sleep(pause)
                pause = min(pause * 2, 0.05)
        finally:
            self.io(_busy_timeout, conn, previous)

    def _hold(self) -> AbstractContextManager[Any]:
        return self._held_by_one() if in_bridge() else super()._hold()

    @contextmanager
    def _held_by_one(self) -> Iterator[None]:
        await_only(self._held.acquire())
        try:
            yield None
        finally:
            self._held.release()

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.io(super().close)
        finally:
            self._thread.shutdown(wait=True)
