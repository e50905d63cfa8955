"""SQLite store: the embedded default (a file, WAL) and the in-memory store for tests.

Write transactions start with BEGIN IMMEDIATE and a busy timeout, so concurrent
writers (threads or processes) queue instead of failing.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor, SQLiteDatastore

from ledger.core.errors import InvalidInput, StoreUnavailable
from ledger.core.redact import redact
from ledger.stores.base import (
    Store,
    StreamConflict,
    Tx,
    apply_migrations,
    refuse_nested,
    transition_columns,
)
from ledger.stores.migrations import steps as schema_steps
from ledger.stores.sql import STATEMENTS

BUSY_TIMEOUT_S = 60.0
T = TypeVar("T")

# SQLite's primary result codes that mean the file cannot be used now, not that the
# statement is wrong: busy or locked past the busy timeout, out of memory, read-only,
# an I/O error, a corrupt or full file, a file that cannot be opened or is no database.
_UNAVAILABLE = {
    5: "the database file is locked by another writer (busy timeout passed)",
    6: "a table is locked",
    7: "SQLite is out of memory",
    8: "the database file is read-only",
    10: "a disk I/O error",
    11: "the database file is corrupt",
    13: "the disk is full",
    14: "the database file cannot be opened",
    15: "the database file's lock protocol failed",
    26: "the file is not a SQLite database",
}


def unavailable(error: sqlite3.Error) -> StoreUnavailable | None:
    """A SQLite fault as the ledger's typed error (the transaction was rolled back: nothing
    was written), or None for an error in the statement itself."""
    code = getattr(error, "sqlite_errorcode", None)
    what = _UNAVAILABLE.get(code & 0xFF) if isinstance(code, int) else None
    if what is None:
        return None
    return StoreUnavailable(f"{what} ({redact(str(error))}); nothing was written")


class LedgerSQLiteRecorder(SQLiteApplicationRecorder):
    """The stock eventsourcing SQLite recorder; the ledger calls its insert inside
    its own transactions, so events and projection rows commit together. Its insert
    names the columns (the stock one gives four values to all of them), since the
    ledger's events table has a fifth, each event's hash (schema version 11), which
    `insert_hashed` fills."""

    def __init__(self, datastore: SQLiteDatastore, events_table_name: str = "stored_events"):
        super().__init__(datastore, events_table_name)
        table = self.events_table_name
        self.insert_events_statement = STATEMENTS.sql("sqlite", "insert_event", table=table)
        self.insert_hashed_statement = STATEMENTS.sql("sqlite", "insert_event_hashed", table=table)

    def insert_hashed(
        self,
        c: SQLiteCursor,
        stored: Sequence[StoredEvent],
        hashes: Sequence[str | None],
        transitions: Sequence[Sequence[str | None]],
    ) -> list[int]:
        """Insert events with their hashes and transition columns (ledger/core/recorded.py);
        return their positions (rowids)."""
        ids = []
        statement = self.insert_hashed_statement
        for se, hx, columns in zip(stored, hashes, transitions, strict=True):
            oid = se.originator_id
            c.execute(
                statement,
                (
                    oid.hex if isinstance(oid, UUID) else oid,
                    se.originator_version,
                    se.topic,
                    se.state,
                    hx,
                    *columns,
                ),
            )
            ids.append(c.lastrowid)
        return ids


class SqliteTx(Tx):
    def __init__(self, store: SqliteStore, conn: sqlite3.Connection, write: bool) -> None:
        super().__init__(store, write)
        self.conn = conn
        self.store_io = store.io
        self.cur = store.io(conn.cursor)
        self.cur.row_factory = sqlite3.Row  # whatever rows the connection makes

    # Each call into sqlite3 goes through the store's `io` (a plain call, or in
    # AsyncLedger's store a hop to its database thread: ledger/stores/sqlite_green.py).
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.store_io(self.cur.execute, sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        return self.store_io(self.cur.executemany, sql, list(rows))

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.store_io(_fetch_dicts, self.cur, sql, params)
        return rows

    def fetch_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        # sqlite3.Row: indexable, no dict per row
        rows: list[Sequence[Any]] = self.store_io(_fetch_rows, self.cur, sql, params)
        return rows

    def insert_stored_events(
        self,
        stored: Sequence[StoredEvent],
        hashes: Sequence[str | None] | None = None,
        transitions: Sequence[Sequence[str | None] | None] | None = None,
    ) -> list[int]:
        assert isinstance(self.store, SqliteStore)
        columns = transition_columns(self.store, stored, transitions)
        try:
            ids = self.store_io(
                self.store.recorder.insert_hashed,
                SQLiteCursor(self.cur),
                stored,
                hashes or [None] * len(stored),
                columns,
            )
        except sqlite3.IntegrityError as e:
            raise StreamConflict(str(e)) from e
        assert ids is not None
        return list(ids)

    def db_now(self) -> datetime:
        return datetime.now(UTC)


def _fetch_dicts(cur: sqlite3.Cursor, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    cur.execute(sql, params)
    return [dict(r) for r in cur.fetchall()]


def _fetch_rows(cur: sqlite3.Cursor, sql: str, params: Sequence[Any]) -> list[Sequence[Any]]:
    cur.execute(sql, params)
    return list(cur.fetchall())


@contextmanager
def _typed_errors() -> Iterator[None]:
    """A fault of the file as `StoreUnavailable`; a statement's own error as it is."""
    try:
        yield
    except sqlite3.Error as e:
        typed = unavailable(e)
        if typed is None:
            raise
        raise typed from e


def _end_open(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.rollback()


def _call(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


class SqliteStore(Store):
    """A SQLite file (path) or a private in-memory database (path None)."""

    dialect = "sqlite"

    def __init__(self, path: str | None, clock: Callable[[], datetime] | None = None) -> None:
        super().__init__(clock)
        self.path = path
        self.memory = path is None
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._mem_lock = threading.RLock()
        if self.memory:
            self._db_name = f"file:ledger-{uuid.uuid4().hex}?mode=memory&cache=shared"
        else:
            self._db_name = path or ""
        self.recorder = LedgerSQLiteRecorder(SQLiteDatastore(":memory:"))
        self._mem_conn = self._connect() if self.memory else None
        self._closed = False
        try:
            self._create_schema()
        except BaseException:
            self.close()  # a file that cannot be used keeps no connection open
            raise

    # connections -----------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._db_name,
            uri=self.memory,
            check_same_thread=False,
            isolation_level=None,
            timeout=BUSY_TIMEOUT_S,
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        if not self.memory:
            _use_wal(conn)
            conn.execute("PRAGMA synchronous=FULL")
        with self._lock:
            self._all.append(conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._mem_conn is not None:
            return self._mem_conn
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    # Where every call into sqlite3 is made (see SqliteTx): here, in the calling thread.
    io: Callable[..., Any] = staticmethod(_call)

    def _begin(self, conn: sqlite3.Connection, begin: str) -> None:
        """Start a transaction (a write one waits for the file's lock: the busy timeout)."""
        self.io(conn.execute, begin)

    def _hold(self) -> AbstractContextManager[Any]:
        """Held for a whole transaction: the in-memory store's one connection."""
        return self._mem_lock if self.memory else _null()

    @contextmanager
    def _tx(self, write: bool) -> Iterator[SqliteTx]:
        if self._closed:
            raise RuntimeError("ledger is closed")
        refuse_nested(self)
        io = self.io
        with _typed_errors(), self._hold():
            conn = io(self._conn)
            begin = STATEMENTS.sql("sqlite", "begin_write" if write else "begin_read")
            try:
                self._begin(conn, begin)
            except BaseException:
                # AsyncLedger: a task cancelled while its BEGIN waited for the lock
                # leaves the BEGIN to finish on the database thread; end it there
                io(_end_open, conn)
                raise
            tx = SqliteTx(self, conn, write)
            try:
                yield tx
            except BaseException:
                io(conn.rollback)
                raise
            else:
                io(conn.commit)
            finally:
                io(tx.cur.close)

    @contextmanager
    def joined_tx(self, conn: Any, write: bool) -> Iterator[SqliteTx]:
        """A savepoint in the caller's transaction on a `sqlite3` connection to the
        ledger's own file (see `JoinedStore`). A connection in autocommit mode
        (`isolation_level=None`) outside a transaction is refused; in Python's default
        mode, where a transaction opens with the first write, the ledger opens it first
        (BEGIN IMMEDIATE: its reads and writes are one transaction)."""
        if not isinstance(conn, sqlite3.Connection):
            raise InvalidInput(
                f"using() takes the sqlite3 connection whose transaction the ledger joins, not {type(conn).__name__}"
            )
        io = self.io
        try:
            same = conn is self._mem_conn or self._same_file(conn)
        except sqlite3.ProgrammingError as e:  # made in another thread (AsyncLedger's: its own)
            raise InvalidInput(
                "the ledger cannot use this sqlite3 connection from its database thread "
                f"({e}): open it with check_same_thread=False"
            ) from None
        if not same:
            raise InvalidInput("the sqlite3 connection is not to this ledger's database file")
        if not io(lambda: conn.in_transaction):
            if conn.isolation_level is None:
                raise InvalidInput(
                    "the connection is in autocommit mode outside a transaction: BEGIN one "
                    "so the ledger's writes commit with yours"
                )
            self._begin(conn, "BEGIN IMMEDIATE")
        with _typed_errors(), self._hold_joined(conn):
            io(conn.execute, "SAVEPOINT ledger_using")
            tx = SqliteTx(self, conn, write)
            try:
                yield tx
            except BaseException:
                io(conn.execute, "ROLLBACK TO ledger_using")
                raise
            finally:
                io(conn.execute, "RELEASE ledger_using")
                io(tx.cur.close)

    def _hold_joined(self, conn: sqlite3.Connection) -> AbstractContextManager[Any]:
        """The in-memory store's lock, for a caller's transaction on its own connection
        (an in-database follower's handler: already held by this thread)."""
        return self._mem_lock if conn is self._mem_conn else _null()

    def _same_file(self, conn: sqlite3.Connection) -> bool:
        if self.path is None:
            return False
        rows = self.io(lambda: conn.execute("PRAGMA database_list").fetchall())
        main = next((r[2] for r in rows if r[1] == "main"), "")
        return bool(main) and os.path.realpath(main) == os.path.realpath(self.path)

    def write(self) -> AbstractContextManager[SqliteTx]:
        return self._tx(True)

    def read(self) -> AbstractContextManager[SqliteTx]:
        return self._tx(False)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            for conn in self._all:
                with suppress(sqlite3.Error):
                    conn.close()
            self._all.clear()
        self.recorder.datastore.close()

    def events_table(self) -> str:
        return "stored_events"

    # schema ----------------------------------------------------------------
    def _create_schema(self) -> None:
        with self.write() as tx:
            tx.execute(STATEMENTS.sql(tx, "create_meta"))
            row = tx.fetchone(STATEMENTS.sql(tx, "schema_version"))
            current = int(row["value"]) if row else 0
            apply_migrations(tx.execute, migrations(), current, self.dialect)

    def read_stored_rows(
        self, tx: Tx, after: int, limit: int, upto: int | None = None
    ) -> list[tuple[int, StoredEvent]]:
        if upto is None:
            sql, params = STATEMENTS.sql(tx, "read_stored"), [after, limit]
        else:
            sql, params = STATEMENTS.sql(tx, "read_stored_upto"), [after, upto, limit]
        return [
            (
                r["position"],
                StoredEvent(
                    originator_id=UUID(r["originator_id"]),
                    originator_version=r["originator_version"],
                    topic=r["topic"],
                    state=r["state"],
                ),
            )
            for r in tx.fetchall(sql, params)
        ]


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch a new file to WAL. Several processes opening a new file at once can find it
    locked while one of them converts it (the busy handler does not cover this): wait and
    look again; once it is WAL, nothing needs the lock."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def migrations() -> list[list[str]]:
    """Versioned schema changes, in order; version N is the Nth entry."""
    return schema_steps("sqlite")


@contextmanager
def _null() -> Iterator[None]:
    yield None
