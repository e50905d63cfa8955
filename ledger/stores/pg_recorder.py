"""The ledger's eventsourcing PostgreSQL recorder: no table lock, no NOTIFY per insert.

The stock `PostgresApplicationRecorder` locks the events table in EXCLUSIVE mode on
every insert until commit (so that position order is commit order) and sends NOTIFY in
the same transaction (which takes a cluster-wide lock at commit). Here an insert
announces and reserves its positions (pg_positions.py) and readers stop below
`ledger_readable_position()`; wake-ups for `subscribe()` are sent after commit, at most
one per `WAKE_INTERVAL_S` per process (`Waker`). The library's own recorder test cases
run against this class (tests/stores/test_recorders.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg
import psycopg_pool
from eventsourcing.persistence import Notification, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import sql

from ledger.stores import pg_positions

WAKE_INTERVAL_S = 0.05


class LedgerPostgresRecorder(PostgresApplicationRecorder):
    """The eventsourcing PostgreSQL recorder with a lock-free insert and bounded reads.

    The stock insert sends the events as an array of a composite type, which psycopg
    encodes field by field in Python (with a regular expression per field): measured at
    half of the client time of an append. Here, when every state is UTF-8 text (the
    ledger's JSON events always are) and the database encoding is UTF8, the events go
    as one JSON array, the states as strings turned back into the very same bytes by
    `convert_to`; anything else goes as four arrays."""

    def __init__(
        self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"
    ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        table: sql.Composable = (
            sql.Identifier(datastore.schema, events_table_name)
            if datastore.schema
            else sql.Identifier(events_table_name)
        )
        self.events_table_sql = table
        id_type = datastore.originator_id_type
        if id_type not in ("uuid", "text"):
            raise ValueError(f"originator id type {id_type!r} is neither uuid nor text")
        # by whether the events' hashes go on their rows (the ledger's events table has the
        # column from schema version 11; the library's test tables do not)
        self.insert_events_json_statements = {
            h: pg_positions.insert_json_statement(table, hashed=h) for h in (False, True)
        }
        self.insert_events_arrays_statements = {
            h: pg_positions.insert_arrays_statement(table, id_type, hashed=h) for h in (False, True)
        }

    def _insert_stored_events(
        self,
        curs: Any,
        stored_events: Sequence[StoredEvent],
        hashes: Sequence[str | None] | None = None,
        transitions: Sequence[Sequence[str | None]] | None = None,
        **kwargs: Any,
    ) -> None:
        # no LOCK TABLE and no NOTIFY: see the module docstring. `hashes` and `transitions`
        # (the ledger's own appends, ledger/stores/base.py, given together): each event's
        # chained hash and its transition columns, stored on its row
        n = len(stored_events)
        hashed = hashes is not None
        assert hashed == (transitions is not None)
        param = _events_json(curs.connection, stored_events, hashes, transitions)
        if param is not None:
            curs.execute(self.insert_events_json_statements[hashed], (n, param), prepare=True)
            return
        arrays: list[Any] = [
            [se.originator_id for se in stored_events],
            [se.originator_version for se in stored_events],
            [se.topic for se in stored_events],
            [bytes(se.state) for se in stored_events],
        ]
        if hashes is not None and transitions is not None:
            arrays.append(list(hashes))
            arrays += [list(column) for column in zip(*transitions, strict=True)]
        curs.execute(self.insert_events_arrays_statements[hashed], (n, *arrays), prepare=True)

    def readable_position(self) -> int | None:
        """The highest position a reader may pass now (None: nothing stored yet)."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(pg_positions.READABLE_QUERY, prepare=True)
            row = curs.fetchone()
            return None if row is None else row["p"]

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """As the stock method, but never past what a slower writer may still fill in."""
        bound = self.readable_position()  # before the read's snapshot is taken
        if bound is not None:
            stop = bound if stop is None else min(stop, bound)
        notifications: Sequence[Notification] = super().select_notifications(
            start, limit, stop, topics, inclusive_of_start=inclusive_of_start
        )
        return notifications

    def max_notification_id(self) -> int | None:
        """The highest position a reader may read now (None when there is none)."""
        bound = self.readable_position()
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(
                sql.SQL(
                    "SELECT MAX(notification_id) AS m FROM {} WHERE notification_id <= %s"
                ).format(self.events_table_sql),
                (bound if bound is not None else 2**63 - 1,),
            )
            row = curs.fetchone()
            return None if row is None else row["m"]


def _events_json(
    conn: psycopg.Connection[Any],
    stored: Sequence[StoredEvent],
    hashes: Sequence[str | None] | None = None,
    transitions: Sequence[Sequence[str | None]] | None = None,
) -> str | None:
    """The events as one JSON array of [id, version, topic, state text] (and each one's
    hash and transition columns, when given); None when a state is not NUL-free UTF-8 or
    the database does not keep text as UTF-8."""
    if conn.info.parameter_status("server_encoding") != "UTF8":
        return None
    rows: list[tuple[Any, ...]] = []
    for i, se in enumerate(stored):
        state = se.state
        if b"\x00" in state:
            return None
        try:
            text = state.decode("utf-8")
        except UnicodeDecodeError:
            return None
        row: tuple[Any, ...] = (str(se.originator_id), se.originator_version, se.topic, text)
        if hashes is not None and transitions is not None:
            row = (*row, hashes[i], *transitions[i])
        rows.append(row)
    # text, integers and nulls only: orjson writes the JSON the standard library did
    # (UTF-8 unescaped), in a sixth of its time; an integer beyond 64 bits, which it
    # refuses, leaves the events to the arrays form
    try:
        return orjson.dumps(rows).decode()
    except TypeError:
        return None


class Waker:
    """NOTIFY on the recorder's channel after commits, coalesced: at most one per
    `interval` seconds, and a commit is always followed by one (the last is never
    dropped). A wake-up is a hint for listeners (`subscribe()`, the change feed), never
    needed for correctness, so a failure to send one is ignored. The thread starts on
    first use; it borrows an idle connection of the commands' pool for each NOTIFY (when
    none is idle it waits for the next interval rather than queue behind commands), so
    the pool's bound is every connection the ledger holds."""

    def __init__(
        self, pool: psycopg_pool.ConnectionPool[Any], channel: str, interval: float
    ) -> None:
        self._pool = pool
        self._statement = sql.SQL("NOTIFY {}").format(sql.Identifier(channel))
        self._interval = interval
        self._pending = threading.Event()
        self._wanted = False  # a commit since the last NOTIFY sent
        self._closed = threading.Event()
        self._start = threading.Lock()
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """Ask for a wake-up (after a commit that appended events)."""
        self._wanted = True  # before the event: the thread clears the event, then reads this
        self._pending.set()
        if self._thread is None:
            with self._start:
                if self._thread is None and not self._closed.is_set():
                    self._thread = threading.Thread(
                        target=self._run, name="ledger-wakeup", daemon=True
                    )
                    self._thread.start()

    def _send(self) -> bool:
        """One NOTIFY; False when every connection of the pool is busy (it never queues
        behind the commands: the wake-up is sent after the next interval instead)."""
        stats = self._pool.get_stats()
        if stats.get("pool_available", 0) == 0 and stats.get("pool_size", 0) >= self._pool.max_size:
            return False
        # a transaction of its own (the pool commits it on return), off every write path;
        # a failure is ignored: a hint only (see the class docstring)
        with (
            contextlib.suppress(Exception),
            self._pool.connection(timeout=max(self._interval, 1.0)) as conn,
        ):
            conn.execute(self._statement)
        return True

    def _run(self) -> None:
        while True:
            self._pending.wait()
            self._pending.clear()
            self._send_wanted()
            # the interval between two wake-ups; a close ends it, but what was poked
            # before the close is still sent: the listeners are other processes, and a
            # process that commits and then closes its ledger at once would otherwise
            # leave them to find its last commits only at their next look (1 s)
            if self._closed.is_set() or self._closed.wait(self._interval):
                self._send_wanted()
                return

    def _send_wanted(self) -> None:
        if self._wanted:
            self._wanted = False
            if not self._send():
                self._wanted = True
                self._pending.set()  # not sent: try again after the interval

    def close(self) -> None:
        """Stop the thread, after sending the wake-up still due for commits before it."""
        self._closed.set()
        self._pending.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
