"""PostgreSQL transactions: `PgTx`, the pipelined write transaction and the helpers that
send statements in pipeline mode (ledger/stores/postgres.py opens them)."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import orjson
import psycopg
from eventsourcing.persistence import StoredEvent
from psycopg import pq
from psycopg.generators import send
from psycopg.rows import dict_row, tuple_row

from ledger.stores import pg_positions
from ledger.stores.base import SCRATCH_MARK, StreamConflict, Tx, transition_columns
from ledger.stores.named import DIALECT_SLOTS
from ledger.stores.sql import STATEMENTS
from ledger.stores.statements import RowsSql

if TYPE_CHECKING:
    from ledger.stores.postgres import PostgresStore

_QMARK = re.compile(r"\?")


# An item command's run lock (ledger/reads/queries.py load_run): FOR SHARE, so item commands
# of one run run side by side while every run command (FOR UPDATE) waits for them and
# they for it; FOR UPDATE when the row, as the statement's snapshot saw it, is pausing or
# canceling (ending a lease may then end the run). A share lock granted after a run
# command committed such a state shows it in the row returned, with lock_mode 'share':
# the caller starts over (the next snapshot sees the state). The clock is read once the
# lock is held, as for FOR UPDATE below.
#
# Row locks alone would let a run command starve: share lockers that overlap one another
# keep the row share-locked, and a new FOR SHARE is granted beside them while a FOR
# UPDATE waits (a cancel or pause behind a stream of claims would wait until the run
# drained). So every run lock first takes a transaction-level advisory lock on the run
# (RUN_LOCK_CLASS, hashtext(run_id)): shared for item commands, exclusive for run
# commands. The lock manager queues those fairly: once a run command waits, later item
# commands wait behind it. Always in that order (advisory, then row): no new deadlock.
RUN_LOCK_CLASS = zlib.crc32(b"run-ledger run lock") & 0x7FFFFFFF
# (the statements, `run_lock_item` and `run_lock_update` in queries.sql, carry the class
# as a literal: `_run_lock` checks it is this one)


@cache
def _run_lock(name: str) -> str:
    sql = STATEMENTS.sql("postgres", name)
    if f"({RUN_LOCK_CLASS}, " not in sql:
        raise RuntimeError(f"the run lock statement {name!r} does not use RUN_LOCK_CLASS")
    return sql


def to_pg(sql: str) -> str:
    """qmark placeholders to psycopg's."""
    return _QMARK.sub("%s", sql)


def _rows_json(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> str | None:
    """Rows as the JSON parameter of a bulk form; None when a value has no exact JSON form.

    Encoded by orjson (a sixth of the standard library's time for a claim's rows). What
    it would write in its own way is refused as the standard library's encoder refused
    it: datetimes and dataclasses go to `_json_scalar` (UUIDs are written as their text,
    as before); a NaN or an infinity, which orjson writes as null, is looked for first."""
    for row in rows:
        for value in row:
            if type(value) is float and not math.isfinite(value):
                return None
    try:
        return orjson.dumps(
            [dict(zip(names, row, strict=True)) for row in rows],
            default=_json_scalar,
            option=_PASSTHROUGH,
        ).decode()
    except (TypeError, ValueError):
        return None


_PASSTHROUGH = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _json_scalar(value: Any) -> str:
    raise TypeError(type(value).__name__)


def _drain(conn: psycopg.Connection[Any]) -> None:
    """In pipeline mode, finish sending what libpq still holds in its output buffer.

    psycopg's pipeline loop stops writing once its command queue is empty even when
    libpq could not yet flush everything (psycopg/psycopg#685): a large statement (a
    100,000-item manifest) was left half sent while the client waited for its result and
    the server for its remaining bytes, forever. Called after every statement we send in
    a pipeline; a no-op (one non-blocking flush) when the buffer is already empty."""
    if conn._pipeline is not None and conn.pgconn.flush() != 0:
        conn.wait(send(conn.pgconn))


def _take_results(conn: psycopg.Connection[Any]) -> None:
    """In pipeline mode, process every pending result now, in order, before reading one.
    psycopg gives a result to its cursor when it arrives: the result of an earlier
    statement on the same cursor that arrives while a query is being sent would be read
    as the query's ("the last operation didn't produce records"). The read waits for
    the results anyway, so this costs no extra round trip."""
    pipeline = conn._pipeline
    if pipeline is not None:
        pipeline.sync()


@contextmanager
def _statement_error_first() -> Iterator[None]:
    """The error of the statement that failed, not "pipeline aborted" for the COMMIT
    the server skipped after it.

    psycopg's pipeline exit syncs in a `try` and fetches the remaining results in its
    `finally`: when the failed statement's answer arrives with the sync and the skipped
    COMMIT's in the fetch after it, the COMMIT's PipelineAborted replaces the statement's
    error (a unique violation read as a connection failure while committing, which it is
    not: the server never committed). The replaced error is the PipelineAborted's context."""
    try:
        yield
    except psycopg.errors.PipelineAborted as e:
        cause: BaseException | None = e.__context__
        while isinstance(cause, psycopg.errors.PipelineAborted):
            cause = cause.__context__
        if isinstance(cause, psycopg.Error):
            raise cause from None
        raise


@contextmanager
def _pipelined_transaction(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A transaction in pipeline mode that waits only for the answers its body reads:
    BEGIN is queued (its answer comes with the body's first read, or with the COMMIT's)
    and COMMIT is sent with the body's last statements, one sync for both.

    psycopg's `conn.transaction()` inside a pipeline syncs after its BEGIN and twice at
    its end (the pipeline blocks it nests): three round trips more per write. Its
    Transaction object is still the one used, so psycopg's bookkeeping holds: a nested
    `tx.conn.transaction()` is a savepoint, `tx.conn.commit()` inside is refused.

    The connection is in autocommit mode, as the pool makes them (eventsourcing's
    `after_connect`): out of it, psycopg would start a transaction of its own before the
    first statement (one more BEGIN, and a sync)."""
    if not conn.autocommit:
        conn.autocommit = True
    try:
        with _statement_error_first(), conn.pipeline() as pipeline:
            block = psycopg.Transaction(conn)
            block.__enter__()  # in a pipeline: BEGIN queued, not waited for
            try:
                yield
            except BaseException as e:
                # a failed statement makes the server skip what follows it up to the next
                # sync, a ROLLBACK too: take the answers first
                if pipeline.command_queue or pipeline.result_queue:
                    with suppress(psycopg.Error):
                        pipeline.sync()
                block.__exit__(type(e), e, e.__traceback__)  # ROLLBACK queued
                raise
            block.__exit__(None, None, None)  # COMMIT queued: the pipeline's end sends it
    finally:
        # a statement queued after the body's last read failed: the COMMIT was skipped
        # and the server holds the failed transaction open
        if conn.pgconn.transaction_status in (
            pq.TransactionStatus.INTRANS,
            pq.TransactionStatus.INERROR,
        ):
            with suppress(psycopg.Error):
                conn.rollback()


# psycopg forgets every prepared statement after a prepared statement answers ROLLBACK
# (or DROP, ALTER) and sends DEALLOCATE ALL with the next statement. In a pipeline that
# answer is processed late, so the DEALLOCATE ALL also removes statements prepared in
# between, which then fail with "prepared statement _pg3_N does not exist" (verify's
# ROLLBACK TO SAVEPOINT before its tolerant replay; test_verify's small-pages case on
# PostgreSQL). Shown on 2026-12-02 by switching the defences off one at a time: that case
# fails only when both are off. The defences: verify settles the pipeline right after the
# ROLLBACK (ledger/projections/rebuild.py `settle_ddl`), and the statements on verify's scratch
# tables, whose names are new on every verify, are never prepared (nothing of theirs to
# remove, and a long-lived process does not keep them; tests/stores/test_pg_prepared.py).
# The cache size plays no part in it (the case passes at psycopg's 100): it is 2,000 so
# the ledger's own statements, a few hundred texts, stay prepared rather than evicted.
PREPARED_MAX = 2_000


# an IN list of `?`s: a new text per length, and a generic plan (see PgTx.fetchall)
_IN_LIST = re.compile(r"\sIN \(")


def _prepare(sql: str) -> bool:
    return SCRATCH_MARK not in sql


class PgTx(Tx):
    def __init__(self, store: PostgresStore, conn: psycopg.Connection[Any], write: bool) -> None:
        super().__init__(store, write)
        self.conn = conn
        self.cur = conn.cursor(row_factory=dict_row)  # whatever rows the connection makes
        self.appended = False  # events inserted: a wake-up follows the commit

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = self.cur.execute(to_pg(sql), params, prepare=_prepare(sql))
        _drain(self.conn)
        return cur

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        rows = list(rows)
        if len(rows) > 1 and isinstance(sql, RowsSql):
            param = _rows_json(sql.names, rows)
            if param is not None:
                # one statement for every row: round trips and client CPU, not rows, cost here
                self.cur.execute(sql.pg_bulk, (param,), prepare=_prepare(sql.pg_bulk))
                _drain(self.conn)
                return None
        if not _prepare(sql):  # psycopg's executemany prepares its statement
            for row in rows:
                self.cur.execute(to_pg(sql), row, prepare=False)
        else:
            self.cur.executemany(to_pg(sql), rows)
        _drain(self.conn)
        return None

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        # A prepared statement switches to a generic plan after a few runs; for lookups by
        # a list of keys that plan ignores the values and was measured 5-10x slower.
        self.cur.execute(to_pg(sql), params, prepare=_prepare(sql) and not _IN_LIST.search(sql))
        _drain(self.conn)
        _take_results(self.conn)
        return list(self.cur.fetchall())

    def fetch_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        cur = self.conn.cursor(row_factory=tuple_row)
        try:
            cur.execute(to_pg(sql), params, prepare=_prepare(sql))
            _drain(self.conn)
            _take_results(self.conn)
            return list(cur.fetchall())
        finally:
            cur.close()

    def fetch_both(
        self, first: str, first_params: Sequence[Any], rows: str, rows_params: Sequence[Any]
    ) -> tuple[list[dict[str, Any]], list[Sequence[Any]]]:
        if self.conn._pipeline is None:
            return super().fetch_both(first, first_params, rows, rows_params)
        second = self.conn.cursor(row_factory=tuple_row)
        try:
            self.cur.execute(to_pg(first), first_params, prepare=_prepare(first))
            _drain(self.conn)
            second.execute(to_pg(rows), rows_params, prepare=_prepare(rows))
            _drain(self.conn)
            _take_results(self.conn)  # both answers, one round trip
            return list(self.cur.fetchall()), list(second.fetchall())
        finally:
            second.close()

    def send(self, sql: str, params: Sequence[Any] = ()) -> Callable[[], list[dict[str, Any]]]:
        if self.conn._pipeline is None:
            return super().send(sql, params)
        cur = self.conn.cursor(row_factory=dict_row)
        cur.execute(to_pg(sql), params, prepare=_prepare(sql))
        _drain(self.conn)

        def answer() -> list[dict[str, Any]]:
            try:
                return list(cur.fetchall())
            finally:
                cur.close()

        return answer

    def send_both(
        self, first: str, first_params: Sequence[Any], rows: str, rows_params: Sequence[Any]
    ) -> Callable[[], tuple[list[dict[str, Any]], list[Sequence[Any]]]]:
        if self.conn._pipeline is None:
            return super().send_both(first, first_params, rows, rows_params)
        one, two = self.conn.cursor(row_factory=dict_row), self.conn.cursor(row_factory=tuple_row)
        one.execute(to_pg(first), first_params, prepare=_prepare(first))
        _drain(self.conn)
        two.execute(to_pg(rows), rows_params, prepare=_prepare(rows))
        _drain(self.conn)

        def answers() -> tuple[list[dict[str, Any]], list[Sequence[Any]]]:
            # the pipeline's sync (a later read, or the COMMIT) gave each cursor its result
            try:
                return list(one.fetchall()), list(two.fetchall())
            finally:
                one.close()
                two.close()

        return answers

    def insert_stored_events(
        self,
        stored: Sequence[StoredEvent],
        hashes: Sequence[str | None] | None = None,
        transitions: Sequence[Sequence[str | None] | None] | None = None,
    ) -> list[int]:
        rec = cast("PostgresStore", self.store).recorder
        columns = transition_columns(self.store, stored, transitions)
        try:
            # a clash aborts the whole transaction: the command is refused with Conflict
            rec._insert_stored_events(self.cur, stored, hashes or [None] * len(stored), columns)
            self.appended = True
            _drain(self.conn)
            _take_results(self.conn)
            # positions are drawn in the order the rows are inserted, which is the events' order
            ids = sorted(
                row["notification_id"] for row in self.cur.fetchall()
            )  # waits for the insert
        except psycopg.errors.UniqueViolation as e:
            raise StreamConflict(str(e)) from e
        assert ids is not None
        return list(ids)

    def readable_position(self) -> int | None:
        # its own statement, so the read that follows takes a newer snapshot (pg_positions.py)
        self.cur.execute(pg_positions.READABLE_QUERY, prepare=True)
        _drain(self.conn)
        _take_results(self.conn)
        row = self.cur.fetchone()
        return None if row is None else row["p"]

    def readable_column(self) -> str:
        return DIALECT_SLOTS["postgres"]["readable_column"]

    def db_now(self) -> datetime:
        self.cur.execute(STATEMENTS.sql("postgres", "db_now"))
        _take_results(self.conn)
        row = self.cur.fetchone()
        assert row is not None
        now: datetime = row["now"]
        return now

    def lock_suffix(self) -> str:
        return " " + DIALECT_SLOTS["postgres"]["lock"]

    def now_column(self) -> str:
        return DIALECT_SLOTS["postgres"]["now_column"]

    def claim_lock_suffix(self) -> str:
        return " " + DIALECT_SLOTS["postgres"]["claim_lock"]

    def select_run_sql(self, lock: bool | str) -> str:
        if not lock:
            return super().select_run_sql(lock)
        if lock == "item":
            return _run_lock("run_lock_item")
        # In a plain SELECT ... FOR UPDATE, clock_timestamp() is computed before the row
        # lock is waited for (and not again unless the holder changed the row), so a
        # command that queued behind another would judge leases by the time it started
        # waiting. Read through a materialised locking CTE, it is taken once the lock is
        # granted: the time the command really acts. Still one round trip.
        return _run_lock("run_lock_update")
