"""What every store offers the service: transactions, a clock and an event log."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    StoredEvent,
    UUIDAsHex,
)

from ledger.core.recorded import TRANSITION_COLUMNS, TRANSITION_TOPICS, columns
from ledger.stores.encoding import EventMapper
from ledger.stores.hashchain import chain_hashes
from ledger.stores.sql import STATEMENTS

# 2: ledger_event_hashes (hash chain); 3: ledger_idempotency (keys); 4: lg_followers,
# lg_webhooks, lg_webhook_deliveries (the change feed); 5: positions without the events
# table lock (PostgreSQL functions, see pg_positions.py; SQLite: a meta row); 6: indexes
# of the paged reads; 7: lg_run_counts (an open run's item counts off its row, see
# ledger/projections/counts.py); 8: single positions drawn under the block mutex (PostgreSQL);
# 9: narrower transition and item indexes, fillfactor 50 on lg_items and lg_attempts
# (PostgreSQL; ledger/projections/schema.py); 10: lg_items_optional (the open items not required);
# 11: each event's hash on its row, ledger_event_hashes folded in and dropped (hashchain.py);
# 12: the Merkle tree's leaves and subtree hashes (ledger/stores/tree.py);
# 13: a webhook's URL policy, previous secret and the lg_webhook_changes record (ledger/feed/);
# 14: lg_runs_created and lg_runs_updated, the overview's longest waits (ledger/reads/overview.py);
# 15: lg_runs_own_stall, the runs whose policy sets its own stall threshold (the overview);
# 16: lg_webhook_changes.position, the webhook event each change row was written from
# (ledger/core/webhook_events.py); 17: each transition's columns on its event's row, lg_transitions a
# view of them (ledger/core/recorded.py);
# 18: an attempt's row written once, when it ends; the open attempt is the item row's lease,
# with lg_items.lease_started_at (ledger/projections/writer.py)
SCHEMA_VERSION = 18


def refuse_newer(current: int, known: int) -> None:
    """A database migrated by a newer run-ledger is not opened by this one."""
    if current > known:
        raise RuntimeError(
            f"the database's ledger schema is version {current}, newer than this run-ledger "
            f"knows ({known}): upgrade run-ledger before using this database"
        )


def apply_migrations(
    run: Callable[..., Any], steps: Sequence[Sequence[Any]], current: int, dialect: str
) -> None:
    """Apply the schema migrations after version `current` through `run(sql[, params])`
    (`params` given only with the `?` statement recording each version reached in
    ledger_meta)."""
    refuse_newer(current, len(steps))
    record = STATEMENTS.sql(dialect, "record_schema_version")
    for version, statements in enumerate(steps, start=1):
        if version <= current:
            continue
        for sql in statements:
            run(sql)
        run(record, (str(version),))


# The start of the suffix of verify's scratch tables (a new one on every verify): the
# PostgreSQL store does not prepare the statements that name them.
SCRATCH_MARK = "_verify_"


class StreamConflict(Exception):
    """Another writer appended to one of our streams first (unique violation)."""


def make_transcoder() -> JSONTranscoder:
    """The stored events' JSON: UUIDs, datetimes and decimals in `_type_`/`_data_` wrappers."""
    transcoder = JSONTranscoder()
    transcoder.register(UUIDAsHex())
    transcoder.register(DatetimeAsISO())
    transcoder.register(DecimalAsStr())
    return transcoder


def make_mapper() -> Mapper[Any]:
    """The event mapper: the transcoder's JSON, written and read for the ledger's own
    events by orjson (the same bytes: see encoding.py).

    Importing the event classes registers their stored topics (`ledger.domain:...`,
    `ledger.archived:Archived`, `ledger.webhooks:...`), so any event this mapper reads resolves."""
    import ledger.core.archived
    import ledger.core.domain
    import ledger.core.webhook_events  # noqa: F401

    return EventMapper(transcoder=make_transcoder())


def make_generic_mapper() -> Mapper[Any]:
    """eventsourcing's own mapper over the same transcoder: every event through the
    standard library's JSON (what `make_mapper` must match byte for byte; the bench
    measures it beside the orjson one)."""
    import ledger.core.archived
    import ledger.core.domain  # noqa: F401

    return Mapper(transcoder=make_transcoder())


class Tx(ABC):
    """One database transaction. SQL uses qmark (`?`) placeholders for every store."""

    def __init__(self, store: Store, write: bool) -> None:
        self.store = store
        self.write = write
        self._now: datetime | None = None
        # stored hashes this transaction has read, by (stream, version) (GENESIS for an
        # event stored before the hash chain): the chain of an append starts from them
        # without reading them again (hashchain.py `chain_hashes`, `note_heads`)
        self.known_hashes: dict[tuple[UUID, int], str] = {}
        # item rows the commands of this transaction inserted: after a commit that
        # inserted many, PostgreSQL's planner statistics are refreshed (PostgresStore)
        self.items_inserted = 0

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    @abstractmethod
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any: ...

    @abstractmethod
    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]: ...

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        rows = self.fetchall(sql, params)
        return rows[0] if rows else None

    def fetch_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        """Like `fetchall`, but each row a sequence in the SELECT list's order: for reads of
        many rows (the change feed), where building a dict per row is the cost."""
        return [tuple(r.values()) for r in self.fetchall(sql, params)]

    def fetch_both(
        self, first: str, first_params: Sequence[Any], rows: str, rows_params: Sequence[Any]
    ) -> tuple[list[dict[str, Any]], list[Sequence[Any]]]:
        """`fetchall(first, ...)` and then `fetch_rows(rows, ...)`, the second a later
        statement (its own snapshot); in one round trip where the store pipelines."""
        return self.fetchall(first, first_params), self.fetch_rows(rows, rows_params)

    def send(self, sql: str, params: Sequence[Any] = ()) -> Callable[[], list[dict[str, Any]]]:
        """`fetchall`, whose answer is taken by calling the function returned, also after
        the transaction ended (see `send_both`)."""
        rows = self.fetchall(sql, params)
        return lambda: rows

    def send_both(
        self, first: str, first_params: Sequence[Any], rows: str, rows_params: Sequence[Any]
    ) -> Callable[[], tuple[list[dict[str, Any]], list[Sequence[Any]]]]:
        """`fetch_both`, whose answers are taken by calling the function returned, also
        after the transaction ended (PostgreSQL: they come with the COMMIT's, one round
        trip for the whole transaction; an error in either fails the transaction)."""
        answers = self.fetch_both(first, first_params, rows, rows_params)
        return lambda: answers

    @abstractmethod
    def insert_stored_events(
        self,
        stored: Sequence[StoredEvent],
        hashes: Sequence[str | None] | None = None,
        transitions: Sequence[Sequence[str | None] | None] | None = None,
    ) -> list[int]:
        """Append events, each with its chained hash (None, or no `hashes`: none recorded,
        as for an event from before the hash chain) and its transition columns
        (ledger/core/recorded.py; None for an event that is none, or no `transitions`:
        found by decoding each event); return their positions (notification ids).
        StreamConflict on a clash."""

    @abstractmethod
    def db_now(self) -> datetime: ...

    def readable_position(self) -> int | None:
        """The highest position a reader paging by position may pass now; None when any
        stored position may be read. On SQLite and memory one writer at a time commits
        in position order; on PostgreSQL a slower writer may still fill a lower position
        (pg_positions.py). Call it before the read, as a statement of its own."""
        return None

    def readable_column(self) -> str:
        """Extra select column `readable`: `readable_position()` computed by a statement
        sent anyway (PostgreSQL: saves its round trip; the read must still come in a
        later statement). Empty where every stored position may be read."""
        return ""

    def now(self) -> datetime:
        """The store's clock, read once per transaction (injected clock in tests)."""
        if self._now is None:
            clock = self.store.clock
            self._now = clock() if clock is not None else self.db_now()
            if self._now.tzinfo is None:
                raise ValueError("the clock must return an aware datetime")
        return self._now

    def append(self, events: Sequence[DomainEvent]) -> list[tuple[int, DomainEvent]]:
        """Store events; return them with their positions."""
        stored = [self.store.mapper.to_stored_event(e) for e in events]
        # tamper evidence on each event's row (see hashchain.py)
        positions = self.insert_stored_events(
            stored, chain_hashes(self, stored), [columns(e) for e in events]
        )
        return list(zip(positions, events, strict=True))

    def now_column(self) -> str:
        """Extra select column giving the database clock (saves a round trip on PostgreSQL)."""
        return ""

    def prime_now(self, db_now: datetime) -> None:
        """Use a clock reading taken by a query, unless a clock is injected or one was read."""
        if self._now is None and self.store.clock is None:
            self._now = db_now

    def lock_suffix(self) -> str:
        """Row-lock clause for rows the transaction will change (PostgreSQL only)."""
        return ""

    def claim_lock_suffix(self) -> str:
        """Row-lock clause for items a claim may lease: rows another claim holds are
        passed over (PostgreSQL only; other stores have one writer at a time)."""
        return ""

    def select_run_sql(self, lock: bool | str) -> str:
        """The query loading one lg_runs row by run_id (one `?`), with the database clock as
        `db_now` where it has one. `lock`: False (none), True or "update" (locked for the
        rest of the transaction), "item" (an item command's lock: see
        ledger/reads/queries.py `load_run`; the row then has a `lock_mode` column where the
        store takes row locks)."""
        return STATEMENTS.sql(self.store.dialect, "select_run_locked" if lock else "select_run")


NO_TRANSITION: tuple[None, ...] = (None,) * len(TRANSITION_COLUMNS)


def transition_columns(
    store: Store,
    stored: Sequence[StoredEvent],
    transitions: Sequence[Sequence[str | None] | None] | None,
) -> list[Sequence[str | None]]:
    """Each event's transition columns (NULLs for an event that is none); decoded from the
    stored event when not given (an event appended as stored bytes: import, restore)."""
    if transitions is None:
        transitions = [_stored_columns(store, se) for se in stored]
    return [NO_TRANSITION if t is None else t for t in transitions]


def _stored_columns(store: Store, stored: StoredEvent) -> Sequence[str | None] | None:
    """The transition columns of a stored event: only a transition's topic is decoded; an
    event that does not decode is none (verify reports it as `undecodable`)."""
    if stored.topic not in TRANSITION_TOPICS:
        return None
    try:
        event = store.decode(stored)
    except Exception:
        return None
    return decoded_columns(event)


def decoded_columns(event: DomainEvent) -> Sequence[str | None] | None:
    """A decoded event's transition columns; none for one that is no transition or lacks
    a field (its replay refuses it, and verify reports it)."""
    try:
        return columns(event)
    except Exception:
        return None


# The store whose in-database follower's handler is running in this context (and its
# transaction): a transaction of its own opened there would not commit with the batch.
_HANDLER_TX: ContextVar[Store | None] = ContextVar("ledger_handler_tx", default=None)


@contextmanager
def handler_transaction(store: Store) -> Iterator[None]:
    """Marks the running of an in-database follower's handler on `store` (see `refuse_nested`)."""
    token = _HANDLER_TX.set(store)
    try:
        yield
    finally:
        _HANDLER_TX.reset(token)


def refuse_nested(store: Store) -> None:
    """InvalidInput for a transaction of the store's own opened inside an in-database
    follower's handler: on SQLite it cannot start (the batch's is open on the connection),
    on PostgreSQL it would commit apart from the batch and its checkpoint. The same code
    is refused the same way on every store; the handler goes through `lg.using(tx)`."""
    if _HANDLER_TX.get() is store:
        from ledger.core.errors import InvalidInput

        raise InvalidInput(
            "an in-database follower's handler commands and reads through lg.using(tx), "
            "so what it does commits with the batch and its checkpoint"
        )


class Store(ABC):
    """A database holding the event log and the projections."""

    dialect: str

    def __init__(self, clock: Callable[[], datetime] | None) -> None:
        self.clock = clock
        self.mapper = make_mapper()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once `close()` was called: every transaction is then refused with
        `RuntimeError("ledger is closed")`, on every store (as a closed file refuses I/O)."""
        return self._closed

    @abstractmethod
    def write(self) -> AbstractContextManager[Tx]:
        """A write transaction (serialised per run): committed when the block ends, rolled
        back when it raises."""

    @abstractmethod
    def read(self) -> AbstractContextManager[Tx]:
        """A consistent read transaction."""

    @abstractmethod
    def close(self) -> None: ...

    # a store of the ledger's own transactions (JoinedStore: the caller's)
    joined = False

    def joined_tx(self, conn: Any, write: bool) -> AbstractContextManager[Tx]:
        """A transaction of the ledger's inside the caller's open transaction on `conn`
        (a savepoint of it). See `JoinedStore`."""
        raise NotImplementedError(f"the {self.dialect} store cannot join a caller's transaction")

    @abstractmethod
    def events_table(self) -> str: ...

    def items_loaded(self, inserted: int | None) -> None:
        """After a commit that inserted `inserted` item rows (None: the whole items table
        is new, as after a rebuild): a store whose planner keeps statistics refreshes them
        when the rows are many (PostgresStore). Best effort."""
        return None  # SQLite plans these statements as searches of the key without them

    def decode(self, stored: StoredEvent) -> DomainEvent:
        """One stored event as its event object (every topic we store names a DomainEvent)."""
        return cast(DomainEvent, self.mapper.to_domain_event(stored))

    def read_events(
        self, after: int, limit: int, upto: int | None = None
    ) -> list[tuple[int, DomainEvent]]:
        """Events in position order after `after` (decoded)."""
        with self.read() as tx:
            return self.read_events_tx(tx, after, limit, upto)

    def read_events_tx(
        self, tx: Tx, after: int, limit: int, upto: int | None = None
    ) -> list[tuple[int, DomainEvent]]:
        rows = self.read_stored_rows(tx, after, limit, upto)
        decode = self.mapper.to_domain_event
        return [(pos, cast(DomainEvent, decode(se))) for pos, se in rows]

    @abstractmethod
    def read_stored_rows(
        self, tx: Tx, after: int, limit: int, upto: int | None = None
    ) -> list[tuple[int, StoredEvent]]: ...


class JoinedStore(Store):
    """A store whose transactions are the caller's: every `write()`/`read()` runs in the
    caller's open transaction on `conn` (a psycopg connection, a sqlite3 connection to
    the ledger's file, or a ledger `Tx`, as an in-database follower's handler gets),
    inside a savepoint, so a refused command writes nothing and the caller's transaction
    goes on. Nothing is committed here: the caller's COMMIT commits the ledger's events,
    hashes and rows with its own writes, and its ROLLBACK takes them back
    (`Ledger.using`)."""

    joined = True

    def __init__(self, base: Store, conn: Any) -> None:
        self.base = base
        conn = getattr(conn, "ledger_tx", conn)  # AsyncFollower's AsyncTx: its transaction
        self.conn = getattr(conn, "conn", conn) if isinstance(conn, Tx) else conn
        self.dialect = base.dialect
        self.clock = base.clock
        self.mapper = base.mapper
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # what a dialect's code reads off its store (the recorder, the DSN...): the base's
        return getattr(self.base, name)

    def write(self) -> AbstractContextManager[Tx]:
        return self.base.joined_tx(self.conn, write=True)

    def read(self) -> AbstractContextManager[Tx]:
        return self.base.joined_tx(self.conn, write=False)

    def close(self) -> None:
        """Nothing to release: the connection is the caller's."""

    def events_table(self) -> str:
        return self.base.events_table()

    def read_stored_rows(
        self, tx: Tx, after: int, limit: int, upto: int | None = None
    ) -> list[tuple[int, StoredEvent]]:
        return self.base.read_stored_rows(tx, after, limit, upto)


@contextmanager
def nothing() -> Iterator[None]:
    yield None


def utcnow() -> datetime:
    return datetime.now(UTC)


def plus(dt: datetime, seconds: float) -> datetime:
    return dt + timedelta(seconds=seconds)
