"""One follower name delivers at a time: a lock per name that dies with its holder.

PostgreSQL: a session advisory lock on a connection of the lock's own (the server
drops it when the process dies, even by SIGKILL). SQLite file: `flock` on a file
beside the database (the kernel drops it with the process). Memory store: a
process-local registry (a memory ledger is private to its process anyway).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import threading
from typing import TYPE_CHECKING, Any

from ledger.core.errors import FollowerBusy, StoreUnavailable
from ledger.feed.sql import SQL
from ledger.stores import green

if TYPE_CHECKING:
    from ledger.stores.base import Store

RETRY_S = 0.2  # a waiting acquire looks again this often
_LOCAL: dict[tuple[int, str], threading.Lock] = {}
_LOCAL_GUARD = threading.Lock()


def _pg(name: str) -> str:
    """Statement `name` of feed.sql for the lock's own psycopg connection (`%s` marks)."""
    from ledger.stores.postgres import to_pg

    return to_pg(SQL.sql("postgres", name))


def _key(name: str) -> int:
    """A signed 64-bit advisory lock key for the name (sha256: collisions are not a worry)."""
    digest = hashlib.sha256(b"run-ledger follower\x00" + name.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class FollowerLock:
    """The lock of one follower name on one store."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name
        self.held = False
        self.lost = False  # the lock was held and its connection failed (check())
        self._conn: Any = None
        self._fd: int | None = None
        self._local: threading.Lock | None = None

    def acquire(self, wait: bool = False, stop: threading.Event | None = None) -> None:
        """Take the lock; FollowerBusy when another holder has it and `wait` is false
        (with `wait`, look again every RETRY_S until it is free or `stop` is set)."""
        if self.held:
            return
        self.lost = False
        while not self._try():
            if not wait or (stop is not None and stop.is_set()):
                raise FollowerBusy(
                    f"follower {self.name!r} is running in another process (or thread); "
                    "one follower name delivers at a time"
                )
            green.sleep(RETRY_S)
        self.held = True

    def _try(self) -> bool:
        dialect = self.store.dialect
        if dialect == "postgres":
            return self._try_pg()
        path = getattr(self.store, "path", None)
        if path:
            return self._try_file(str(path))
        return self._try_local()

    def _try_pg(self) -> bool:
        import psycopg

        if self._conn is None:
            try:
                self._conn = self.store.session_connection()  # type: ignore[attr-defined]
            except psycopg.OperationalError as e:
                raise StoreUnavailable(f"the database is unavailable ({e})") from e
        try:
            row = self._conn.execute(_pg("try_session_lock"), (_key(self.name),)).fetchone()
        except psycopg.OperationalError as e:  # its connection died (a server restart)
            with contextlib.suppress(psycopg.Error, OSError):
                self._conn.close()
            self._conn = None
            raise StoreUnavailable(f"the database is unavailable ({e})") from e
        return bool(row and row[0])

    def _try_file(self, db_path: str) -> bool:
        import fcntl

        if self._fd is None:
            digest = hashlib.sha256(self.name.encode()).hexdigest()[:16]
            self._fd = os.open(f"{db_path}.follower-{digest}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _try_local(self) -> bool:
        with _LOCAL_GUARD:
            lock = _LOCAL.setdefault((id(self.store), self.name), threading.Lock())
        if lock.acquire(blocking=False):
            self._local = lock
            return True
        return False

    def check(self) -> None:
        """FollowerBusy if the lock may have been lost (its PostgreSQL connection died).

        A session the server ended (terminated, restarted, crashed) sends an error or
        closes its socket, so the connection is only asked (`SELECT 1`, a round trip)
        when its socket has something to read: an idle one that says nothing still
        holds the lock."""
        if self._conn is not None and self.held:
            import psycopg

            try:
                if not _readable(self._conn):
                    return
                self._conn.execute(_pg("session_alive"))
            except psycopg.Error as e:
                self.held, self.lost = False, True
                raise FollowerBusy(
                    f"follower {self.name!r} lost its lock (the connection holding it "
                    f"failed: {type(e).__name__}); start it again"
                ) from e

    def release(self) -> None:
        """Give the lock up (closing its connection or file)."""
        self.held = False
        if self._conn is not None:
            import psycopg

            # Unlock before closing: a closed session's locks are dropped only once
            # its backend has exited, after close() returns, so a next holder asking
            # at once could still find the name taken.
            with contextlib.suppress(psycopg.Error):
                self._conn.execute(_pg("session_unlock"), (_key(self.name),))
            with contextlib.suppress(OSError, psycopg.Error):
                self._conn.close()  # ends the session (and so any lock it still held)
            self._conn = None
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None
        if self._local is not None:
            self._local.release()
            self._local = None


def _readable(conn: Any) -> bool:
    """Whether the connection's socket has data (or an end of file) waiting, at once."""
    poller = select.poll()  # not select(): any descriptor number
    poller.register(conn.pgconn.socket, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))
