"""PostgreSQL store: the production store shared by many worker processes.

Events are inserted by the ledger's recorder (an eventsourcing PostgreSQL recorder whose
insert announces and reserves its positions instead of locking the table: see
pg_positions.py), inside the ledger's own transaction together with the projection rows.
Readers that page by position read only below `ledger_readable_position()`. PostgreSQL's
clock judges leases and stamps events, so workers on machines with skewed clocks agree.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

import psycopg
import psycopg_pool
from eventsourcing.persistence import InterfaceError as ESInterfaceError
from eventsourcing.persistence import OperationalError as ESOperationalError
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresDatastore
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from ledger.core.errors import InvalidInput
from ledger.stores.base import Store, Tx, apply_migrations, refuse_nested, refuse_newer
from ledger.stores.pg_faults import fault as _fault
from ledger.stores.pg_migrations import EVENTS_TABLE, migrations, schema_version
from ledger.stores.pg_recorder import WAKE_INTERVAL_S, LedgerPostgresRecorder, Waker, _events_json
from ledger.stores.pg_tx import PREPARED_MAX, RUN_LOCK_CLASS, PgTx, _pipelined_transaction, to_pg
from ledger.stores.sql import STATEMENTS

_log = logging.getLogger(__name__)

BULK_ITEMS = 1000
"""A commit that inserts this many item rows or more may refresh the items table's
planner statistics (`PostgresStore.items_loaded`)."""

__all__ = [
    "EVENTS_TABLE",
    "RUN_LOCK_CLASS",
    "LedgerPostgresRecorder",
    "PgTx",
    "PostgresStore",
    "_events_json",
    "to_pg",
]

_SCHEMA_LOCK = zlib.crc32(b"run-ledger schema") & 0x7FFFFFFF
CONNECT_TIMEOUT_S = 10


class PostgresStore(Store):
    """A PostgreSQL database (libpq URL)."""

    dialect = "postgres"

    def __init__(
        self,
        dsn: str,
        clock: Callable[[], datetime] | None = None,
        pool_size: int = 2,
        max_overflow: int = 10,
    ) -> None:
        super().__init__(clock)
        info = conninfo_to_dict(dsn)
        self.dsn = dsn
        self.datastore = PostgresDatastore(
            dbname=str(info.get("dbname") or info.get("user") or "postgres"),
            host=str(info.get("host") or "127.0.0.1"),
            port=str(info.get("port") or 5432),
            user=str(info.get("user") or "postgres"),
            password=str(info.get("password") or ""),
            pool_size=pool_size,
            max_overflow=max_overflow,
            connect_timeout=CONNECT_TIMEOUT_S,
            # no pre-ping round trip per transaction: a dead connection fails the command
            # before COMMIT (StoreUnavailable, nothing written) and the pool replaces it
            pre_ping=False,
        )
        # The datastore hands libpq only host, port, user, password and dbname. Connect with
        # the DSN as given instead, so its other parameters (sslmode, application_name,
        # options, ...) and libpq's defaults and PG* environment variables apply, as in psql.
        self.datastore.pool.conninfo = dsn
        self.datastore.pool.kwargs = {"row_factory": dict_row}
        try:
            self._create_schema()
            self.recorder = LedgerPostgresRecorder(self.datastore, events_table_name=EVENTS_TABLE)
            self.waker = Waker(self.datastore.pool, self.recorder.channel_name, WAKE_INTERVAL_S)
        except BaseException:
            self.datastore.close()  # no pool threads left behind retrying a database we cannot use
            raise

    @contextmanager
    def _tx(self, write: bool) -> Iterator[PgTx]:
        if self._closed:
            raise RuntimeError("ledger is closed")
        refuse_nested(self)
        tx: PgTx | None = None
        try:
            with self._tx_body(write) as tx:
                yield tx
        finally:
            # committed or not, readers held below its positions may now go on
            if tx is not None and tx.appended:
                self._wake()
        assert tx is not None  # committed
        if tx.items_inserted >= BULK_ITEMS:
            self.items_loaded(tx.items_inserted)

    @contextmanager
    def _tx_body(self, write: bool) -> Iterator[PgTx]:
        committing = False
        try:
            with self._connection() as conn:
                if write:
                    with _pipelined_transaction(conn):
                        # Pipeline mode: statements whose results the command does not
                        # read (the event table's lock and NOTIFY, projection writes)
                        # share round trips; every fetch still waits for its answer.
                        tx = PgTx(self, conn, write)
                        try:
                            yield tx
                        finally:
                            tx.cur.close()
                        committing = True  # the body is done: leaving the block sends COMMIT
                else:
                    with conn.transaction():
                        tx = PgTx(self, conn, write)
                        try:
                            yield tx
                        finally:
                            tx.cur.close()
        except (ESOperationalError, ESInterfaceError) as e:
            if isinstance(e.__cause__, psycopg_pool.PoolClosed):
                raise RuntimeError("ledger is closed") from e  # closed meanwhile: not transient
            raise _fault(e, uncertain=committing and write) from e

    def items_loaded(self, inserted: int | None) -> None:
        """ANALYZE the items table after a commit that inserted `inserted` rows into it,
        when they are a tenth or more of the rows its statistics know (always, for None:
        a rebuilt table). PostgreSQL's own advice after a bulk load: until autovacuum
        gets to the table (a minute or more later), the planner believes it holds the
        rows it held before, and plans the item rows' updates as a scan of the whole
        table. Best effort: the command has committed, so a failure here is logged, not
        raised; a table another ANALYZE holds is passed over (decision 0023)."""
        try:
            with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
                known = -1.0
                if inserted is not None:
                    row = cur.execute(STATEMENTS.sql(self.dialect, "items_statistics")).fetchone()
                    known = float(row["reltuples"]) if row is not None else -1.0
                if inserted is None or known < 0 or inserted * 10 >= known:
                    cur.execute(STATEMENTS.sql(self.dialect, "analyze_items"))
        except psycopg.Error as e:
            _log.warning("statistics of lg_items not refreshed after a bulk insert: %s", e)

    def session_connection(self) -> psycopg.Connection[Any]:
        """A connection of its own, outside the pool, in autocommit mode (a follower's
        session lock lives as long as it)."""
        return psycopg.connect(self.dsn, autocommit=True)

    def _wake(self) -> None:
        self.waker.poke()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool for one transaction (psycopg errors come out as
        eventsourcing's: `_tx_body` types them)."""
        with self.datastore.get_connection() as conn:
            conn.prepared_max = PREPARED_MAX
            yield conn

    @contextmanager
    def joined_tx(self, conn: Any, write: bool) -> Iterator[PgTx]:
        """A savepoint in the caller's open transaction on a psycopg `Connection` (see
        `JoinedStore`): a connection in autocommit mode outside a transaction block, or
        one whose transaction already failed, is refused (nothing would hold the
        ledger's writes together, or nothing can be written)."""
        if not isinstance(conn, psycopg.Connection):
            raise InvalidInput(
                "using() takes the psycopg Connection whose transaction the ledger joins "
                f"(an AsyncConnection goes to AsyncLedger.using), not {type(conn).__name__}"
            )
        status = conn.info.transaction_status
        if status == pq.TransactionStatus.INERROR:
            raise InvalidInput("the connection's transaction has already failed: roll it back")
        if status == pq.TransactionStatus.IDLE:
            if conn.autocommit:
                raise InvalidInput(
                    "the connection is in autocommit mode outside a transaction: open one "
                    "(with conn.transaction(): ...) so the ledger's writes commit with yours"
                )
            conn.execute("SELECT 1")  # psycopg opens the caller's transaction; ours nests
        tx: PgTx | None = None
        try:
            with conn.transaction():  # a savepoint: a refusal leaves the caller's going on
                tx = PgTx(self, conn, write)
                try:
                    yield tx
                finally:
                    tx.cur.close()
        except psycopg.OperationalError as e:
            wrapped = ESOperationalError(str(e))
            wrapped.__cause__ = e
            raise _fault(wrapped, uncertain=False) from e
        finally:
            if tx is not None and tx.appended:
                self._wake()  # a hint: listeners that wake before the caller commits poll again

    def write(self) -> AbstractContextManager[PgTx]:
        return self._tx(True)

    def read(self) -> AbstractContextManager[PgTx]:
        return self._tx(False)

    def close(self) -> None:
        self._closed = True
        self.waker.close()
        self.datastore.close()

    def events_table(self) -> str:
        return EVENTS_TABLE

    def _create_schema(self) -> None:
        # Several processes may open an empty database at once: one creates the
        # schema under an advisory lock, the others wait and then see it. A schema already
        # at this version is only read, so a role without CREATE on the schema (SELECT,
        # INSERT, UPDATE, DELETE on the tables) can open the ledger. A connection of its
        # own, not the pool's: a wrong DSN or an unreachable server fails here at once
        # with libpq's reason rather than as a pool timeout.
        timeout = conninfo_to_dict(self.dsn).get("connect_timeout", CONNECT_TIMEOUT_S)
        with psycopg.connect(
            self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=timeout
        ) as conn:
            steps = migrations()
            current = schema_version(conn)
            refuse_newer(current, len(steps))
            if current < len(steps):
                with conn.transaction(), conn.cursor() as cur:

                    def run(sql: str, params: Any = None) -> None:
                        # the migrations' own text as it is (no placeholders to convert)
                        cur.execute(sql if params is None else to_pg(sql), params)

                    run(STATEMENTS.sql(self.dialect, "schema_lock"), (_SCHEMA_LOCK,))
                    run(STATEMENTS.sql(self.dialect, "create_meta"))
                    current = schema_version(conn)  # another process may have migrated meanwhile
                    apply_migrations(run, steps, current, self.dialect)
        self.datastore.register_type_adapters()

    def read_stored_rows(
        self, tx: Tx, after: int, limit: int, upto: int | None = None
    ) -> list[tuple[int, StoredEvent]]:
        bound = tx.readable_position()  # never past what a slower writer may fill in
        if bound is not None:
            upto = bound if upto is None else min(upto, bound)
        if upto is None:
            sql, params = STATEMENTS.sql(tx, "read_stored"), [after, limit]
        else:
            sql, params = STATEMENTS.sql(tx, "read_stored_upto"), [after, upto, limit]
        return [
            (
                r["position"],
                StoredEvent(
                    originator_id=r["originator_id"],
                    originator_version=r["originator_version"],
                    topic=r["topic"],
                    state=bytes(r["state"]),
                ),
            )
            for r in tx.fetchall(sql, params)
        ]
