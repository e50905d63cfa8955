"""Rebuild every projection from the first event, beside the live tables, then swap.

How it works:

1. Start (or resume): a tracking row `lg_tracking(name='rebuild')` and bare
   tables `lg_*_rebuild` (projection_ddl with a suffix, no secondary indexes)
   are created in one transaction. If the tracking row already exists, an
   earlier rebuild crashed: its tables and position are resumed.
2. Batches: each transaction replays the next `batch_size` events after the
   tracked position, in pages of `REPLAY_PAGE`: it loads from the new tables only
   the run and item rows a page touches that the page before did not leave in
   the replayer, replays the events (the item events folded from their stored JSON
   straight into rows with the fields the aggregates' own mutation sets, the others
   through the aggregates and the `Projector` the live commands use: `Replayer.
   apply_stored`) and writes the rows (each page read before
   the previous page's rows are sent, so on PostgreSQL the server writes one page
   while the client projects the next: `replay_batch`). A page is read with the
   transition columns its rows of the log hold, in one statement (`logged.
   LoggedPages`): they are compared with what the events say and only the rows that
   differ are written (usually none: the columns are written with each event), with
   no second read of the range, which on PostgreSQL would wait for the page's writes.
   Then the batch moves the tracking position and commits. A crash loses at most the
   uncommitted batch, which is replayed on resume: no event is applied twice or skipped.
3. Switch: once caught up, one transaction locks out writers (SQLite: BEGIN
   IMMEDIATE; PostgreSQL: ACCESS EXCLUSIVE on the live projection tables, with
   a short lock_timeout and retries so a writer is never chosen as a deadlock
   victim), applies the events that arrived meanwhile, drops the live tables,
   renames the new ones into place with the live tables' indexes, deletes the
   tracking row and commits. Readers see the old tables until that commit and
   the new ones after it, never a half-built table; a writer that was waiting
   continues on the new tables.

Memory is bounded by the page: aggregates are loaded per page from the new tables,
and only a bounded number of them (`CACHE_ITEMS`, `CACHE_RUNS`) is kept for the next.
"""

from __future__ import annotations

import gc
import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from eventsourcing.persistence import StoredEvent

from ledger.projections.logged import Columns, LoggedPages, rewrite
from ledger.projections.replay import CACHE_ITEMS as CACHE_ITEMS
from ledger.projections.replay import CACHE_RUNS as CACHE_RUNS
from ledger.projections.replay import Observer as Observer
from ledger.projections.replay import RecordingCursor as RecordingCursor
from ledger.projections.replay import Replayer as Replayer
from ledger.projections.row_writes import _pipelined
from ledger.projections.schema import PROJECTION_TABLES, table_ddl
from ledger.projections.sql import STATEMENTS
from ledger.stores.base import Store, Tx

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

# events a rebuild replays per transaction (a crash loses at most these), read and
# projected in pages of REPLAY_PAGE (`replay_batch`)
BATCH_SIZE = 10_000
REPLAY_PAGE = 2000
REBUILD_SUFFIX = "_rebuild"
TRACKING_NAME = "rebuild"
SWITCH_PATIENCE_S = 600.0  # how long the switch keeps giving way to lock holders
SWITCH_LAG = 2  # replay pages left behind the head when the switch takes over

Progress = Callable[[int, int], None]
Fault = Callable[[str, int], None]


class RebuildInterrupted(RuntimeError):
    """Another process finished (or restarted) the rebuild this one was working on."""


def position_column(store: Store) -> str:
    """The events table's position column."""
    return "notification_id" if store.dialect == "postgres" else "rowid"


def count_events(tx: Tx, upto: int | None = None) -> int:
    """Events stored (up to a position)."""
    if upto is None:
        row = tx.fetchone(STATEMENTS.sql(tx, "count_events"))
    else:
        row = tx.fetchone(STATEMENTS.sql(tx, "count_events_upto"), (upto,))
    return int(row["n"]) if row else 0


def last_position(tx: Tx) -> int:
    """The position of the newest event (0 when there is none)."""
    row = tx.fetchone(STATEMENTS.sql(tx, "last_position"))
    return int(row["p"]) if row and row["p"] is not None else 0


def tracked_position(tx: Tx, name: str, lock: bool = False) -> int | None:
    """The position a rebuild recorded, or None when none is in progress."""
    row = tx.fetchone(
        STATEMENTS.sql(tx, "tracked_position_locked" if lock else "tracked_position"), (name,)
    )
    return None if row is None else int(row["position"])


def create_tables(tx: Tx, suffix: str) -> None:
    """Fresh, empty projection tables with `suffix` (dropped first if left over)."""
    drop_tables(tx, suffix)
    for sql in table_ddl(tx.store.dialect, suffix):
        tx.execute(sql)
    settle_ddl(tx)


def drop_tables(tx: Tx, suffix: str) -> None:
    """Drop the projection tables with `suffix`, if they exist."""
    for name in PROJECTION_TABLES:
        tx.execute(STATEMENTS.sql(tx, "drop_table", table=name + suffix))
    settle_ddl(tx)


def settle_ddl(tx: Tx) -> None:
    """After DROP/ALTER on a pipelined PostgreSQL connection: let psycopg process the
    results now. On a DROP or ALTER it forgets its prepared statements and sends
    DEALLOCATE ALL with the next statement; processed late (pipeline mode), that
    DEALLOCATE also removes statements prepared in between, which later fail with
    "prepared statement does not exist"."""
    cur = getattr(tx, "cur", None)
    if tx.store.dialect != "postgres" or cur is None or not _pipelined(cur):
        return
    with cur.connection.pipeline() as pipeline:
        pipeline.sync()  # the DDL results are processed: the cache is cleared
    cur.execute(
        STATEMENTS.sql(tx, "settle"), prepare=False
    )  # not prepared; DEALLOCATE ALL goes out with it
    cur.fetchall()


def replay_batch(tx: Tx, replayer: Replayer, after: int, batch_size: int) -> tuple[int, int]:
    """Apply the next `batch_size` events after `after`, in pages (`replay_pages`); returns
    (new position, events applied). The replayer keeps its aggregates from page to page
    (`committed`): a failure anywhere rolls the whole batch back and ends the rebuild,
    the replayer with it."""

    pages = LoggedPages()  # each page with its rows' transition columns

    def apply_page(rows: list[tuple[int, StoredEvent]], after: int, ahead: ReadAhead) -> None:
        logged: list[tuple[int, Columns]] = []
        replayer.apply_stored(tx, rows, after, before_write=ahead, logged=logged)
        # the log's transition columns as the events say, written where they differ
        rewrite(tx, logged, pages.take(rows))
        replayer.committed(rows[-1][0])

    return replay_pages(tx, after, batch_size, apply_page, pages)


# reads the stored rows of up to `limit` events after position `after`
# (`logged.LoggedPages`, which keeps their rows' transition columns too)
PageRead = Callable[[Tx, int, int], list[tuple[int, StoredEvent]]]


class ReadAhead:
    """The next page's stored rows (`replay_pages`), read on the first call: `limit` rows
    after position `after`, none when `more` is false (the page before was short)."""

    def __init__(self, tx: Tx, after: int, limit: int, more: bool, read: PageRead) -> None:
        self.tx, self.after, self.limit, self.more, self.read = tx, after, limit, more, read
        self.rows: list[tuple[int, StoredEvent]] = []
        self.done = False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            if self.more and self.limit > 0:
                self.rows = self.read(self.tx, self.after, self.limit)


PageApply = Callable[[list[tuple[int, StoredEvent]], int, ReadAhead], None]


def replay_pages(
    tx: Tx, after: int, batch_size: int, apply_page: PageApply, read: PageRead
) -> tuple[int, int]:
    """Hand `apply_page(rows, after, ahead)` the stored rows of the next `batch_size` events
    after `after`, a page of `REPLAY_PAGE` at a time, read by `read(tx, after, limit)`;
    returns (new position, rows handed).

    `ahead()` reads the next page. The page's apply calls it once its rows are made and
    before it sends them (`Replayer.apply`'s `before_write`); it is called after the apply
    otherwise. On PostgreSQL, whose write transactions are pipelined, that read waits only
    for the rows sent before it, and the server writes one page's rows while the client
    decodes and projects the next, instead of each waiting for the other."""
    page = max(1, min(REPLAY_PAGE, batch_size))
    rows = read(tx, after, page)
    handed = 0
    while rows:
        handed += len(rows)
        ahead = ReadAhead(tx, rows[-1][0], min(page, batch_size - handed), len(rows) == page, read)
        apply_page(rows, after, ahead)
        ahead()
        after = rows[-1][0]
        rows = ahead.rows
    return after, handed


# --------------------------------------------------------------------------
# the rebuild
# --------------------------------------------------------------------------
@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run a block with the cyclic garbage collector's thresholds raised (restored after).

    A replay allocates millions of short-lived objects (decoded events, aggregates,
    row tuples), freed by reference counting; with the default thresholds that
    churn set off a full collection every few thousand events, each walking every
    live object (measured: a fifth of a rebuild's time, and nothing collected).
    The thresholds are process-wide: other threads meanwhile get fewer collections
    too, nothing else.
    """
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], 50_000), max(old[1], 50), max(old[2], 100))
    try:
        yield
    finally:
        gc.set_threshold(*old)


def rebuild(
    lg: Ledger,
    progress: Progress | None = None,
    batch_size: int = BATCH_SIZE,
    fault: Fault | None = None,
) -> int:
    """Rebuild every projection (resuming a crashed rebuild); returns the events replayed.

    `progress(done, total)` is called after each committed batch. `fault(stage, n)`
    is a test hook called inside each transaction just before it commits
    (stage "batch" with the batch number, or "switch").
    """
    with fewer_collections():
        return _rebuild(lg, progress, batch_size, fault)


def _rebuild(lg: Ledger, progress: Progress | None, batch_size: int, fault: Fault | None) -> int:
    store: Store = lg.store
    suffix, name = REBUILD_SUFFIX, TRACKING_NAME
    replayer = Replayer(suffix)
    with store.write() as tx:
        # RETURNING, not rowcount: it is read back even when statements are pipelined
        created = tx.fetchall(STATEMENTS.sql(tx, "start_tracking"), (name,))
        if created:
            create_tables(tx, suffix)
        replayer.prepare(tx)  # PostgreSQL: the column types, read now, not behind a write
        position = tracked_position(tx, name, lock=True)
        assert position is not None
        done = count_events(tx, position)
        total = count_events(tx)
    if progress is not None:
        progress(done, total)
    batch_no = 0
    while True:
        batch_no += 1
        with store.write() as tx:
            position = _position_or_raise(tx, name)
            position, n = replay_batch(tx, replayer, position, batch_size)
            if n:
                tx.execute(STATEMENTS.sql(tx, "move_tracking"), (position, name))
            head = last_position(tx)
            if fault is not None:
                fault("batch", batch_no)
        replayer.committed(position)
        done += n
        total = max(total, done + (head - position))
        if progress is not None and n:
            progress(done, total)
        if n < batch_size or head - position <= SWITCH_LAG * min(REPLAY_PAGE, batch_size):
            break  # close enough: the switch applies the rest with writers locked out
    done += _switch(store, replayer, suffix, name, batch_size, fault)
    store.items_loaded(None)  # the items table is new: its statistics are the table's own
    if progress is not None:
        progress(done, done)
    return done


def _position_or_raise(tx: Tx, name: str) -> int:
    position = tracked_position(tx, name, lock=True)
    if position is None:
        raise RebuildInterrupted("the rebuild's tracking row is gone: another process finished it")
    return position


def _catch_up(tx: Tx, replayer: Replayer, name: str, batch_size: int) -> int:
    position = _position_or_raise(tx, name)
    applied = 0
    while True:
        position, n = replay_batch(tx, replayer, position, batch_size)
        applied += n
        if n < batch_size:
            break
    if applied:
        tx.execute(STATEMENTS.sql(tx, "move_tracking"), (position, name))
    return applied


def _switch(
    store: Store, replayer: Replayer, suffix: str, name: str, batch_size: int, fault: Fault | None
) -> int:
    if store.dialect == "postgres":
        return _switch_postgres(store, replayer, suffix, name, batch_size, fault)
    with store.write() as tx:  # BEGIN IMMEDIATE: writers wait until the commit
        applied = _catch_up(tx, replayer, name, batch_size)
        indexes = [
            r["sql"]
            for name_ in PROJECTION_TABLES
            for r in tx.fetchall(STATEMENTS.sql(tx, "sqlite_indexes"), (name_,))
        ]
        for table in PROJECTION_TABLES:
            tx.execute(STATEMENTS.sql(tx, "drop_table", table=table))
            tx.execute(STATEMENTS.sql(tx, "rename_table", table=table + suffix, new=table))
        for sql in indexes:
            tx.execute(sql)  # the live table's own index definitions, as SQLite keeps them
        settle_ddl(tx)
        tx.execute(STATEMENTS.sql(tx, "end_tracking"), (name,))
        if fault is not None:
            fault("switch", 0)
    return applied


# PostgreSQL --------------------------------------------------------------
_INDEX_DEF = re.compile(r"^CREATE (UNIQUE )?INDEX (\S+) ON (?:ONLY )?(\S+) (USING .*)$")


def _live_indexes(tx: Tx, table: str) -> list[tuple[str, str]]:
    """(name, definition) of the indexes on a live table that no constraint owns."""
    return [
        (r["indexname"], r["indexdef"])
        for r in tx.fetchall(STATEMENTS.sql(tx, "pg_live_indexes"), (table,))
    ]


def _identifiers(names: tuple[str, ...]) -> Any:
    """PostgreSQL: `a, b, ...`, each name quoted as an identifier (psycopg.sql)."""
    from psycopg import sql

    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _scratch_index_name(name: str) -> str:
    return ("rb_" + name)[:63]


def _index_scratch(store: Store, suffix: str) -> None:
    """Give the new tables the live tables' indexes, under temporary names (outside any lock)."""
    from psycopg import sql

    with store.write() as tx:
        for table in PROJECTION_TABLES:
            for index, definition in _live_indexes(tx, table):
                m = _INDEX_DEF.match(definition)
                if m is None:
                    continue
                # the live index's own definition (its method and columns) on the new table
                create = sql.SQL("CREATE {unique}INDEX IF NOT EXISTS {name} ON {table} {using}")
                tx.execute(
                    create.format(
                        unique=sql.SQL("UNIQUE " if m.group(1) else ""),
                        name=sql.Identifier(_scratch_index_name(index)),
                        table=sql.Identifier(table + suffix),
                        using=sql.SQL(m.group(4)),
                    ).as_string(None)
                )


def _switch_postgres(
    store: Store, replayer: Replayer, suffix: str, name: str, batch_size: int, fault: Fault | None
) -> int:
    import psycopg
    from psycopg import sql

    _index_scratch(store, suffix)
    applied = 0
    deadline = time.monotonic() + SWITCH_PATIENCE_S
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        try:
            with store.write() as tx:
                timeout_ms = _lock_timeout_ms(tx)
                tx.execute(STATEMENTS.sql(tx, "pg_set_lock_timeout"), (f"{timeout_ms}ms",))
                # Writers lock projection rows before the events table; we take every
                # projection table in ACCESS EXCLUSIVE mode (waits for running writers,
                # queues new ones and readers). If a writer holding a projection lock is
                # queued behind something we hold, our short timeout gives way first.
                tx.execute(
                    sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE")
                    .format(_identifiers(PROJECTION_TABLES))
                    .as_string(None)
                )
                tx.execute(STATEMENTS.sql(tx, "pg_set_lock_timeout"), ("0",))
                n = _catch_up(tx, replayer, name, batch_size)
                renames = []
                for table in PROJECTION_TABLES:
                    live = [i for i, _d in _live_indexes(tx, table)]
                    owned = [
                        r["indexname"]
                        for r in tx.fetchall(
                            STATEMENTS.sql(tx, "pg_table_indexes"), (table + suffix,)
                        )
                    ]
                    for index in owned:
                        if index.startswith(table + suffix):
                            renames.append((index, table + index[len(table + suffix) :]))
                    renames += [
                        (_scratch_index_name(i), i) for i in live if _scratch_index_name(i) in owned
                    ]
                tx.execute(
                    sql.SQL("DROP TABLE {}").format(_identifiers(PROJECTION_TABLES)).as_string(None)
                )
                for table in PROJECTION_TABLES:
                    tx.execute(STATEMENTS.sql(tx, "rename_table", table=table + suffix, new=table))
                for old, new in renames:
                    tx.execute(STATEMENTS.sql(tx, "rename_index", index=old, new=new))
                settle_ddl(tx)
                _rename_not_null_constraints(tx, suffix)
                settle_ddl(tx)
                tx.execute(STATEMENTS.sql(tx, "end_tracking"), (name,))
                if fault is not None:
                    fault("switch", 0)
            return applied + n
        except Exception as exc:
            if not _caused_by(exc, psycopg.errors.LockNotAvailable):
                raise
            # gave way to a writer; catch up outside the lock so the next try is short
            with store.write() as tx:
                applied += _catch_up(tx, replayer, name, batch_size)
            time.sleep(min(0.5, 0.02 * (attempt + 1)) * random.random())  # noqa: S311 (jitter, not a secret)
    raise RuntimeError(
        f"could not lock the projection tables to switch within {SWITCH_PATIENCE_S:.0f}s "
        f"({attempt} tries); the rebuild can be resumed"
    )


def _rename_not_null_constraints(tx: Tx, suffix: str) -> None:
    """PostgreSQL 18 names NOT NULL constraints after their table (`lg_items_rebuild_run_id_not_null`)
    and keeps the name when the table is renamed: give them the live table's names, as a
    fresh schema has them. Nothing to do before PostgreSQL 18 (no such constraints)."""
    for table in PROJECTION_TABLES:
        old_prefix = table + suffix + "_"
        for r in tx.fetchall(STATEMENTS.sql(tx, "pg_not_null_constraints"), (table, old_prefix)):
            name = r["conname"]
            new = table + "_" + name[len(old_prefix) :]
            tx.execute(
                STATEMENTS.sql(tx, "rename_constraint", table=table, constraint=name, new=new)
            )


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """True if `exc` is, or was raised from, a `kind` (stores wrap driver errors)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _lock_timeout_ms(tx: Tx) -> int:
    """Well under deadlock_timeout, so PostgreSQL never picks a writer as the victim."""
    row = tx.fetchone(STATEMENTS.sql(tx, "pg_deadlock_timeout"))
    deadlock_ms = int(row["ms"]) if row else 1000
    return max(10, min(200, deadlock_ms // (2 * len(PROJECTION_TABLES))))
