"""Followers: handlers fed the ledger's transitions in position order, with a durable
checkpoint (name -> position) in the ledger's own database.

Two delivery modes:

- *in-database, exactly once*: `handler(transitions, tx)` runs inside the write
  transaction that advances the checkpoint. `tx` is the ledger's transaction
  (`tx.execute(sql, params)`, `tx.executemany`, `tx.fetchall`, `tx.fetchone`, `?`
  placeholders on every store; `tx.conn` is the driver's connection): the user's own
  tables in the ledger's database change exactly when the checkpoint does. This is
  eventsourcing's tracking-recorder idea (a projection records its position with its
  rows), with the ledger's positions as notification ids. The COMMIT waits for the disk
  (the handler's rows are in it); on PostgreSQL a handler may choose otherwise for its
  batch with `SET LOCAL synchronous_commit = off` (README: a server crash then takes back
  rows and checkpoint together, delivered again).
- *external, at least once*: `handler(transitions)` makes its side effect and returns;
  the checkpoint advances afterwards. A crash in between delivers the batch again, so
  use `transition.position` as the idempotency key. (In `catch_up()` and `run()` a full
  batch's checkpoint is written with the next batch's read, and on PostgreSQL without
  waiting for the disk: a crash may deliver a batch, or a server crash the last fraction
  of a second's batches, again; never skip one.)

The mode follows the handler's arity (two required positional parameters: in-database)
unless `in_database=` says. One follower name runs in one process at a time
(`ledger/feed/locks.py`); a second one waits (`wait=True`) or gets `FollowerBusy`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from ledger.core.errors import (
    CommitUncertain,
    FollowerBusy,
    FollowerNotFound,
    InvalidInput,
    StoreUnavailable,
)
from ledger.core.rows import parse_dt
from ledger.core.validation import check_identifier
from ledger.core.views import Transition, _View
from ledger.feed import checkpoints as cp
from ledger.feed.locks import FollowerLock
from ledger.feed.sql import SQL
from ledger.reads import feed
from ledger.reads import payloads as payloads_of
from ledger.stores.base import handler_transaction

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger
    from ledger.stores.base import Tx

MAX_BATCH = 10_000
IDLE_WAIT_S = 5.0  # run(): the longest one wait for new transitions lasts before looking again
RETRY_FIRST_S = 0.2  # run(): the pause after a batch failed on an unreachable database,
RETRY_MAX_S = 10.0  # doubling up to this


def _in_database(handler: Callable[..., Any]) -> bool:
    """True when the handler takes (transitions, tx)."""
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(positional) >= 2


def check_name(name: Any) -> str:
    """A follower name is an identifier (1-200 characters, no control characters)."""
    return check_identifier(name, "follower name")


class Follower:
    """Feeds `handler` the transitions after its checkpoint, `batch` at a time, of one run
    or all (`run_id`) and of some commands or target states (`kinds`). With `payloads`,
    each item transition carries its item's payload as it stood at that transition
    (`Transition.payload`): a read model needs no table of the ledger's, and its rebuild
    from position 0 equals the model built live.

    `run_once()` handles one batch and returns how many transitions it handled; `run()`
    repeats until `stop()` (from another thread or a signal handler), waiting for new
    commits between batches; `catch_up()` runs batches until none is left; `rebuild(clear)`
    starts again from position 0 (in-database: `clear(tx)` in the same transaction). The
    lock on the name is taken by the first of these and kept until `close()` (or the end
    of `run()`, or of a `with` block)."""

    def __init__(
        self,
        lg: Ledger,
        name: str,
        handler: Callable[..., Any],
        run_id: str | None = None,
        kinds: Sequence[str] | str | None = None,
        batch: int = 500,
        *,
        in_database: bool | None = None,
        wait: bool = False,
        stop: threading.Event | None = None,
        payloads: bool = False,
    ) -> None:
        self.lg = lg
        self.name = check_name(name)
        if not callable(handler):
            raise InvalidInput("handler must be callable: handler(transitions[, tx])")
        self.handler = handler
        self.filter = feed.FeedFilter.of(run_id, kinds)
        self.batch = feed.check_limit(batch, MAX_BATCH, "batch")
        self.in_database = _in_database(handler) if in_database is None else bool(in_database)
        self.wait = wait
        self.payloads = feed.check_flag(payloads, "payloads")
        self._payloads = payloads_of.Payloads()  # the runs' payload histories read so far
        self._lock = FollowerLock(lg.store, self.name)
        self._stop = stop if stop is not None else threading.Event()
        self._ready = False
        self._cursor = 0
        # external mode: (before, after, read at) of a handled batch whose checkpoint is
        # written with the next batch's read (catch_up and run), or by _flush
        self._pending: tuple[int, int, datetime] | None = None
        self._known: int | None = None  # the checkpoint as this holder of the lock wrote it
        if self.filter.run_id is not None:
            with lg.store.read() as tx:
                feed.check_run(tx, self.filter.run_id)

    # -- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the name's lock (another process may then run this follower)."""
        self._lock.release()
        self._ready = False
        self._pending = None  # not written: delivered again (at least once)
        self._known = None

    def stop(self) -> None:
        """Make `run()` return after the batch in hand (safe from any thread); final."""
        self._stop.set()

    def start(self) -> None:
        """Take the name's lock and create its checkpoint row if missing (the first batch
        does this otherwise); FollowerBusy while another process holds the name."""
        if self._lock.held and self._ready:
            return
        self._lock.acquire(wait=self.wait, stop=self._stop)
        with self.lg.store.write() as tx:
            cp.ensure(tx, self.name, self.filter)
        self._ready = True

    # -- delivering -----------------------------------------------------------------
    @property
    def position(self) -> int:
        """The checkpoint: every transition up to it has been handled (0 before any)."""
        with self.lg.store.read() as tx:
            found = cp.checkpoint(tx, self.name)
        return 0 if found is None else found

    def run_once(self) -> int:
        """Handle the next batch (if any); returns how many transitions were handled."""
        return self._step(defer=False)[0]

    def catch_up(self) -> int:
        """Handle batches until none is left; returns how many transitions were handled."""
        total = 0
        while True:
            handled, more = self._step(defer=True)
            total += handled
            if not more:
                return total

    def run(self, *, retry: bool = True) -> None:
        """Handle batches as transitions commit, until `stop()`; releases the lock at the end.

        With `retry` (the default) an unreachable database does not end it: a batch that
        failed on `StoreUnavailable` or `CommitUncertain`, or on a lost lock (its
        connection died), gives the name's lock up and is tried again after a pause
        (0.2 s, doubling to 10 s), taking the lock again first. Nothing is skipped: the
        checkpoint only moves with a batch that was handled (in-database mode: in the
        same transaction; external mode: the batch may be delivered again, as after a
        crash). `FollowerBusy` (another process took the name meanwhile, without `wait`)
        and the handler's own exceptions end it."""
        waiter = feed.Waiter(self.lg.store)
        pause = RETRY_FIRST_S
        try:
            while not self._stop.is_set():
                try:
                    _, more = self._step(defer=True)
                    if not more:
                        waiter.wait(self._cursor, IDLE_WAIT_S, stop=self._stop)
                except (StoreUnavailable, CommitUncertain, FollowerBusy) as e:
                    busy = isinstance(e, FollowerBusy) and not self._lock.lost
                    if not retry or busy:
                        raise
                    self.close()  # take the lock again before the next batch
                    if self._stop.wait(pause):
                        return
                    pause = min(pause * 2, RETRY_MAX_S)
                    continue
                pause = RETRY_FIRST_S
        finally:
            waiter.close()
            with contextlib.suppress(StoreUnavailable, CommitUncertain, FollowerBusy):
                self._flush()  # not written: delivered again (at least once)
            self.close()

    def _step(self, defer: bool) -> tuple[int, bool]:
        """One batch: (transitions handled, whether more may be waiting right now).

        In-database mode reads the checkpoint (locked, with the clock and the readable
        bound) and the page after it in one round trip, runs the handler and writes the
        checkpoint in that transaction (`store.write()`). External mode commits its read
        first, nothing held while the handler runs (`_read_external`: one round trip on
        PostgreSQL), and with `defer` the checkpoint of a full batch is written by the
        transaction that reads the next one; a short batch's, and run_once()'s, at once
        (`_flush`, one round trip too)."""
        self.start()
        if self.in_database:
            with self.lg.store.write() as tx:
                before, found, cursor = self._read(tx)
                if cursor != before:
                    if found:
                        if self.payloads:
                            self._payloads.attach(tx, found)
                        with handler_transaction(self.lg.store):
                            self.handler(found, tx)
                    cp.set_position(tx, self.name, before, cursor, self.filter)
            self._known = cursor
        else:
            self._lock.check()
            before, found, cursor, read_at = self._read_external()
            self._pending = None  # committed with the read
            self._known = before
            if cursor != before:
                if found:
                    if self.payloads:
                        with self.lg.store.read() as tx:
                            self._payloads.attach(tx, found)
                    self.handler(found)
                self._pending = (before, cursor, read_at)
            if not defer or len(found) < self.batch:
                self._flush()
        self._cursor = cursor
        return len(found), len(found) == self.batch

    def _read_external(self) -> tuple[int, list[Transition], int, datetime]:
        """External mode: `_read` in a transaction of its own, committed (without waiting
        for the disk) before the handler runs, and the time it read at. Unfiltered, with
        the checkpoint known, the transaction is one round trip on PostgreSQL: the pending
        checkpoint's write, the checkpoint (with the readable bound) and the page are sent
        with the COMMIT, and their answers read after it."""
        pending = self._pending
        start = pending[1] if pending is not None else self._known
        store = self.lg.store
        quick = start is not None and not (self.filter.run_id or self.filter.kinds)
        with store.write() as tx:
            cp.relax_commit(tx)
            if not quick:
                before, found, cursor = self._read(tx)
                return before, found, cursor, tx.now()
            if pending is not None:  # matches nothing if the checkpoint moved: seen below
                cp.set_position(tx, self.name, pending[0], pending[1], self.filter, pending[2])
            answers = tx.send_both(
                cp.checkpoint_sql(tx, lock=False),
                (self.name,),
                feed.unfiltered_page_sql(tx),
                (start, self.batch),
            )
        first, rows = answers()
        position, bound = cp.checkpoint_row(tx, first, self.name)
        if position != start:  # someone else moved it: the page is not this follower's
            if pending is not None:
                raise FollowerBusy(cp.moved(self.name))
            self._known = None
            return self._read_external()
        found, cursor = feed.unfiltered_page(rows, start, bound)
        return start, found, cursor, tx.now()  # the clock read with the checkpoint

    def _read(self, tx: Tx) -> tuple[int, list[Transition], int]:
        """In a write transaction: the checkpoint, locked (external mode: moved on to the
        end of the handled batch not written yet, FollowerBusy if someone else moved it),
        and the page after it: (checkpoint, transitions, cursor). Unfiltered, and with the
        checkpoint known from this follower's last commit, both statements go at once
        (`Tx.fetch_both`: the page is a later statement than the readable bound's)."""
        pending = self._pending
        start = pending[1] if pending is not None else self._known
        rows: list[Any] | None = None
        if start is not None and not (self.filter.run_id or self.filter.kinds):
            first, rows = tx.fetch_both(
                cp.checkpoint_sql(tx),
                (self.name,),
                feed.unfiltered_page_sql(tx),
                (start, self.batch),
            )
            position, bound = cp.checkpoint_row(tx, first, self.name)
        else:
            position, bound = cp.locked_position(tx, self.name)
        if pending is not None:
            before, after, read_at = pending
            if position == before:
                cp.set_position(tx, self.name, before, after, self.filter, read_at)
            elif position != after:  # after: written already (a commit whose reply was lost)
                raise FollowerBusy(cp.moved(self.name))
            position = after
        if rows is None or position != start:  # not read yet, or after a stale checkpoint
            found, cursor = feed.page(tx, position, self.filter, self.batch, bound)
        else:
            found, cursor = feed.unfiltered_page(rows, position, bound)
        return position, found, cursor

    def _flush(self) -> None:
        """Write the checkpoint of the handled batch not written yet (external mode)."""
        if self._pending is None:
            return
        before, after, read_at = self._pending
        with self.lg.store.write() as tx:  # one round trip on PostgreSQL: nothing read in it
            cp.relax_commit(tx)
            cp.set_position(tx, self.name, before, after, self.filter, read_at)
            answer = tx.send(SQL.sql(tx, "checkpoint"), (self.name,))
        rows = answer()
        if not rows:
            raise FollowerNotFound(self.name)
        if int(rows[0]["position"]) != after:  # the write matched nothing: it had moved
            raise FollowerBusy(cp.moved(self.name))
        self._pending = None
        self._known = after

    def rebuild(self, clear: Callable[[Tx], Any] | None = None) -> int:
        """Start again from position 0 and catch up; returns the transitions handled.
        `clear(tx)` (e.g. `DELETE FROM my_table`) runs in the transaction that resets the
        checkpoint, so an in-database projection is never seen half cleared."""
        self.start()
        self._pending = self._known = None  # replayed from 0 anyway
        with self.lg.store.write() as tx:
            if clear is not None:
                clear(tx)
            before = cp.position(tx, self.name)
            cp.advance(tx, self.name, before, 0, self.filter)
        return self.catch_up()


@dataclass(frozen=True)
class FollowerStatus(_View):
    """A follower's checkpoint and how far behind the feed it is."""

    name: str
    position: int
    lag: int  # transitions after the checkpoint that it will be handed
    lag_seconds: float  # age of the oldest of them (0 when caught up)
    run_id: str | None
    kinds: list[str]
    updated_at: datetime | None
    owner: str | None


def followers(lg: Ledger) -> list[FollowerStatus]:
    """Every follower: name, position, lag in transitions and seconds."""
    out: list[FollowerStatus] = []
    with lg.store.read() as tx:
        now = tx.now()
        for row in tx.fetchall(SQL.sql(tx, "followers")):
            kinds = json.loads(row["kinds"]) if row["kinds"] else []
            flt = feed.FeedFilter(row["run_id"], tuple(kinds))
            suffix, params = flt.variant(tx)
            lag = tx.fetchone(SQL.sql(tx, "lag" + suffix), (row["position"], *params))
            assert lag is not None
            oldest = parse_dt(lag["oldest"])
            out.append(
                FollowerStatus(
                    name=row["name"],
                    position=int(row["position"]),
                    lag=int(lag["n"]),
                    lag_seconds=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
                    run_id=row["run_id"],
                    kinds=kinds,
                    updated_at=parse_dt(row["updated_at"]),
                    owner=row["owner"],
                )
            )
    return out


def reset(lg: Ledger, name: Any, to: Any = 0) -> int:
    """Set follower `name`'s checkpoint to position `to` (0: replay everything), while it
    is not running (FollowerBusy otherwise). Its handler is given everything after `to`
    again: an in-database projection should clear its rows with `Follower.rebuild`."""
    name = check_name(name)
    to = feed.check_position(to, "to")
    lock = FollowerLock(lg.store, name)
    lock.acquire()
    try:
        with lg.store.write() as tx:
            before = cp.position(tx, name)
            top = feed.head(tx)
            if to > top:
                raise InvalidInput(f"to must be at most the feed's head, position {top}; got {to}")
            row = tx.fetchone(SQL.sql(tx, "follower_filter"), (name,))
            assert row is not None
            kinds = tuple(json.loads(row["kinds"])) if row["kinds"] else ()
            cp.advance(tx, name, before, to, feed.FeedFilter(row["run_id"], kinds))
    finally:
        lock.release()
    return int(to)


TRACKING_NAME = "run-ledger"  # the application_name of the ledger's positions in a Tracking


def projection_handler(projection: Any) -> Callable[[list[Any]], None]:
    """An external-mode handler that runs an `eventsourcing.projection.Projection` over the
    ledger's transitions, eventsourcing's way: each transition goes to
    `projection.process_event(transition, Tracking("run-ledger", transition.position))`,
    whose tracking recorder (`projection.view`) records the position with the view's rows,
    and a transition its view has tracked already is skipped, so a redelivered batch
    changes nothing (exactly once in the view). Start the follower after
    `projection.view.max_tracking_id("run-ledger")` with `ledger followers reset`, or let
    the skip do it."""
    from eventsourcing.persistence import Tracking

    view = projection.view

    def handle(batch: list[Any]) -> None:
        for t in batch:
            if view.has_tracking_id(TRACKING_NAME, t.position):
                continue
            projection.process_event(t, Tracking(TRACKING_NAME, t.position))

    return handle
