"""Replaying events into a set of projection tables: the `Replayer` the rebuild, verify,
time travel, import and restore share (ledger/projections/rebuild.py runs it batch by batch).

Each event is applied to its aggregate and projected by the same `Projector` the live
commands use, so a replay yields the rows the commands wrote; the statements of a batch
are written together. A rebuild's pages of stored events (`apply_stored`) fold their
item events straight into item rows instead (ledger/projections/fold.py), with the
fields the aggregate's own mutation sets; the other events take the aggregates' path.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, cast
from uuid import UUID

from eventsourcing.domain import CanInitAggregate, DomainEvent
from eventsourcing.persistence import StoredEvent

from ledger.core.domain import Item, Run
from ledger.core.recorded import columns
from ledger.core.rows import item_from_row, run_from_row
from ledger.core.webhook_events import WebhookEvent
from ledger.projections.counts import attach as attach_counts
from ledger.projections.fold import (
    REGISTERED,
    Folded,
    ItemFold,
    ItemRow,
    StampText,
    folds,
    read_item_event,
)
from ledger.projections.logged import of_events
from ledger.projections.row_writes import _write_in_order, _write_rows
from ledger.projections.sql import STATEMENTS
from ledger.projections.writer import Projector
from ledger.stores.base import NO_TRANSITION, Tx
from ledger.stores.named import tx_list
from ledger.stores.pg_rows import ArrayRows

CACHE_ITEMS = 20_000  # item aggregates a Replayer keeps between batches (bounds its memory)
CACHE_RUNS = 2_000
_CHUNK = 400


class Observer(Protocol):
    """Called before each event is applied (verify checks the rule book's rules here)."""

    def __call__(self, tx: Tx, position: int, event: DomainEvent, replayer: Replayer) -> None: ...


# --------------------------------------------------------------------------
# replaying events into a set of projection tables
# --------------------------------------------------------------------------
# Events the projector handles from the event and cumulative state only, so several
# can be projected together; those in _STATE_READING also read state (the run's
# item_count) that a later event of their stream changes. An attempt's end reads its
# lease from the item's `ended_leases`, kept by attempt number until projected.
_GROUPABLE = (
    Run.Submitted,
    Run.Transitioned,
    Run.Amended,
    Item.Registered,
    Item.Transitioned,
    Item.LeaseExtended,
)
_STATE_READING = (Run.Amended,)
_ITEM_EVENTS = (Item.Registered, Item.Transitioned, Item.LeaseExtended)

# a page's event: decoded (the aggregates' path) or read for a fold (ledger/projections/fold.py)
Entry = tuple[int, DomainEvent | None, Folded | None]


class RecordingCursor:
    """Collects the projector's statements so a batch can write them together:
    `calls` holds (sql, rows) groups in the order the projector issued them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[Any, ...]]]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.calls.append((sql, [tuple(params)]))

    def executemany(self, sql: str, rows: Any) -> None:
        self.calls.append((sql, [r if type(r) is tuple else tuple(r) for r in rows]))


class Replayer:
    """Applies events, in position order, to the projection tables with `suffix`.

    Each event is applied to its aggregate and projected on its own (so the
    projector sees exactly the state it saw live); the resulting statements are
    written per batch: inserts in order, then the last run and item row per key.

    Aggregates come from the tables' rows, or from a bounded cache of the ones
    whose rows the previous batch wrote: after a caller commits a batch it calls
    `committed(position)`, and the next batch (which must start right there, else
    the cache is dropped) takes its aggregates out of the cache instead of reading
    and decoding their rows again. A batch whose transaction rolls back never
    returns what it took, so the cache only ever holds committed rows' state.
    """

    def __init__(
        self,
        suffix: str,
        observer: Observer | None = None,
        tolerant: bool = False,
        cache_items: int = CACHE_ITEMS,
        cache_runs: int = CACHE_RUNS,
    ) -> None:
        self.suffix = suffix
        self.projector = Projector(suffix)
        self.observer = observer
        self.tolerant = tolerant
        self.problems: list[dict[str, Any]] = []
        self.runs: dict[str, Run] = {}
        # an item's Item aggregate, or its row (`ItemRow`) while a rebuild folds its events
        self.items: dict[tuple[str, str], Any] = {}
        self.streams: dict[UUID, Any] = {}
        self._rec = RecordingCursor()
        self._fold = ItemFold(self.projector)
        self._stamp = StampText()
        self.array_rows = ArrayRows()  # PostgreSQL: rows as arrays (ledger/stores/pg_rows.py)
        self._pending: list[tuple[int, DomainEvent]] = []
        self._hazards: set[UUID] = set()
        p = self.projector
        # statement order within a flush; the row upserts go last, deduplicated
        self._rank = {
            p.insert_item: 0,
            p.replace_item: 1,
            p.withdraw_item: 1,
            p.insert_attempt: 2,
            p.add_counts: 5,  # deltas add up: merged per key (_merge_counts)
            p.drop_counts: 6,  # after the deltas: a run that ended keeps none
        }
        # the cache: aggregates equal to their rows as of position `_cache_at`
        self.cache_items, self.cache_runs = cache_items, cache_runs
        self._cached_runs: OrderedDict[str, Run] = OrderedDict()
        self._cached_items: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cache_at: int | None = None
        self._written_items: set[tuple[str, str]] = set()
        self._cacheable = False

    def prepare(self, tx: Tx) -> None:
        """Read what writing rows needs before the first batch (PostgreSQL: the projection
        tables' column types), so that no batch waits for it behind its own writes."""
        if tx.store.dialect == "postgres":
            p = self.projector
            self.array_rows.load_types(
                tx,
                [
                    p.runs_table,
                    p.items_table,
                    p.attempts_table,
                    p.counts_table,
                ],
            )

    # the cache ------------------------------------------------------------
    def committed(self, position: int) -> None:
        """The caller committed the batch that ended at `position`: keep the aggregates
        whose rows it wrote for the next batch (the oldest beyond the bounds are dropped).

        Every run of the batch is kept, written or not: a run event writes its row, and
        an item event changes only the run's item counts, which it writes as count rows
        (lg_run_counts), so the aggregate is what its row and count rows give (loading it
        again read them back at every batch: a round trip the batch waited for).
        Called again for the same position (a replay that keeps its cache from page to
        page in one transaction, then its caller after the commit), it changes nothing."""
        if position == self._cache_at and not self._cacheable:
            return  # this batch's aggregates are the cache already
        if not self._cacheable or self.cache_items <= 0:
            self.forget()
            return
        for run_id, run in self.runs.items():
            self._cached_runs[run_id] = run
            self._cached_runs.move_to_end(run_id)
        for key in self._written_items:
            item = self.items.get(key)
            if item is not None:
                self._cached_items[key] = item
                self._cached_items.move_to_end(key)
        while len(self._cached_runs) > self.cache_runs:
            self._cached_runs.popitem(last=False)
        while len(self._cached_items) > self.cache_items:
            self._cached_items.popitem(last=False)
        self._cache_at = position
        self._cacheable = False
        self.runs, self.items, self.streams = {}, {}, {}

    def forget(self) -> None:
        """Drop the cache (the next batch reads every aggregate from the tables)."""
        self._cached_runs.clear()
        self._cached_items.clear()
        self._cache_at = None
        self._cacheable = False

    def cached(self) -> int:
        """Aggregates held in the cache."""
        return len(self._cached_runs) + len(self._cached_items)

    # loading ------------------------------------------------------------
    def _load(self, tx: Tx, entries: Sequence[Entry], item_rows: bool = False) -> None:
        """Take into `runs` and `items` the aggregates the entries' events need (from the
        cache, else from the tables). With `item_rows`, items come as `ItemRow`s (a fold)."""
        run_ids: dict[str, None] = {}
        item_keys: dict[tuple[str, str], None] = {}
        created: set[Any] = set()  # streams whose first event is in the batch: nothing to load
        for _pos, e, f in entries:
            if f is not None:
                kind, state, version = f[0], f[1], f[2]
                run_id, item_id = state.get("run_id"), state.get("item_id")
                if type(run_id) is not str or type(item_id) is not str:
                    continue  # not folded: the aggregates will say why
                key = (run_id, item_id)
                if key not in item_keys and (version == 1 or kind == REGISTERED):
                    created.add(key)
                item_keys[key] = None
                run_ids[key[0]] = None
                continue
            assert e is not None
            if isinstance(e, WebhookEvent):
                continue  # a webhook's stream: no aggregate to load
            run_id = getattr(e, "run_id", None)
            item_id = getattr(e, "item_id", None)
            if run_id is not None and item_id is not None:
                key = (run_id, item_id)
                if key not in item_keys and (
                    e.originator_version == 1 or isinstance(e, CanInitAggregate)
                ):
                    created.add(key)  # a declared item's stream begins with a transition
                item_keys[key] = None
                run_ids[run_id] = None
            else:
                rid = str(e.originator_id)
                if rid not in run_ids and isinstance(e, CanInitAggregate):
                    created.add(rid)
                run_ids[rid] = None
            for link in getattr(e, "links", None) or ():
                run_ids[link["run_id"]] = None
        self.runs, self.items, self.streams = {}, {}, {}
        missing_runs = self._reuse(self._cached_runs, run_ids, self.runs, created)
        missing_items: dict[str, list[str]] = {}
        for run_id, item_id in self._reuse(self._cached_items, item_keys, self.items, created):
            missing_items.setdefault(run_id, []).append(item_id)
        if not item_rows:  # a fold's rows, cached: the aggregates' path needs their Items
            for key, found in self.items.items():
                if type(found) is ItemRow:
                    self._take_item(key)
        p = self.projector
        load_runs = STATEMENTS.sql(tx, "load_runs", runs=p.runs_table)
        load_items = STATEMENTS.sql(tx, "load_items", items=p.items_table)
        for i in range(0, len(missing_runs), _CHUNK):
            chunk = missing_runs[i : i + _CHUNK]
            rows = tx.fetchall(load_runs, (tx_list(tx, chunk),))
            attach_counts(tx, rows, self.suffix)
            for row in rows:
                run = run_from_row(row)
                self.runs[run.run_id] = run
                self.streams[run.id] = run
        # by run, then item ids: a search of the primary key on both stores (a row-value
        # IN list is planned as a scan of the whole table on SQLite)
        for run_id, item_ids in missing_items.items():
            for i in range(0, len(item_ids), _CHUNK):
                id_chunk = item_ids[i : i + _CHUNK]
                for row in tx.fetchall(load_items, (run_id, tx_list(tx, id_chunk))):
                    if item_rows:
                        folded = ItemRow.from_row(row)
                        if folded is not None:
                            self.items[(folded.run_id, folded.item_id)] = folded
                        continue
                    item = item_from_row(row)
                    if item is not None:
                        self.items[(item.run_id, item.item_id)] = item
                        self.streams[item.id] = item

    def _reuse(
        self, cache: dict[Any, Any], keys: Iterable[Any], into: dict[Any, Any], created: set[Any]
    ) -> list[Any]:
        """Take the cached aggregates of `keys` into `into`; return the keys still to load
        (neither cached nor created in the batch)."""
        missing = []
        for key in keys:
            agg = cache.pop(key, None)
            if agg is not None:
                into[key] = agg
                if type(agg) is not ItemRow:
                    self.streams[agg.id] = agg
            elif key not in created:
                missing.append(key)
        return missing

    # applying -----------------------------------------------------------
    def _mutate(self, e: DomainEvent) -> None:
        if isinstance(e, CanInitAggregate):
            agg = e.mutate(None)
        else:
            agg = self.streams.get(e.originator_id)
            if agg is None and e.originator_version == 1 and isinstance(e, Item.Transitioned):
                # a declared item's stream begins with its first transition (no Registered)
                agg = Item.begin(e.run_id, e.item_id, e.timestamp)
            if agg is None:
                raise LookupError(
                    f"no aggregate for stream {e.originator_id} (its first event is missing)"
                )
            e.mutate(agg)  # type: ignore[attr-defined]
        self.streams[e.originator_id] = agg
        if isinstance(agg, Run):
            self.runs[agg.run_id] = agg
        elif isinstance(agg, Item):
            self.items[(agg.run_id, agg.item_id)] = agg

    def force(self, e: DomainEvent) -> None:
        """Apply an event whose version does not follow its aggregate's (verify, after reporting)."""
        agg = self.streams.get(e.originator_id)
        if agg is None and isinstance(e, Item.Transitioned):  # its first events are missing
            agg = self.streams[e.originator_id] = Item.begin(e.run_id, e.item_id, e.timestamp)
            self.items[(e.run_id, e.item_id)] = agg
        if agg is not None:
            agg.version = e.originator_version - 1
        self._mutate(e)

    def apply(
        self,
        tx: Tx,
        events: Sequence[tuple[int, DomainEvent]],
        after: int | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        """Apply and write one batch of events, the ones after position `after` (the caller
        commits, then calls `committed`; without `after` the cache is not used).
        `before_write`, if given, is called once the batch's rows are made and before any
        is sent (a replay reads its next page there: on PostgreSQL the read then waits
        only for the rows sent before, and the server writes this batch's rows while the
        client decodes and projects the next)."""
        self._begin(after)
        problems_before = len(self.problems)
        self._load(tx, [(pos, e, None) for pos, e in events])
        for pos, e in events:
            self._apply_one(tx, pos, e)
        self.flush(tx, before_write)
        if len(self.problems) != problems_before:
            self._cacheable = (
                False  # an event that did not apply may have left an aggregate half-changed
            )

    def apply_stored(
        self,
        tx: Tx,
        rows: Sequence[tuple[int, StoredEvent]],
        after: int | None = None,
        before_write: Callable[[], None] | None = None,
        logged: list[tuple[int, tuple[str | None, ...]]] | None = None,
    ) -> None:
        """`apply` for stored events (a rebuild's pages): the item events are folded from
        their stored JSON straight into their rows (ledger/projections/fold.py), every
        other event is decoded and applied as `apply` applies it. Without a fold (an
        observer needs every event, a tolerant replay, a mapper that does not read the
        item events as plain JSON), every event is decoded and applied. `logged`, when
        given, receives (position, transition columns) of every event, in position
        order: what its row of the log should hold (ledger/core/recorded.py)."""
        decode = tx.store.mapper.to_domain_event
        if self.tolerant or self.observer is not None or not folds(tx.store.mapper):
            events = [(pos, cast(DomainEvent, decode(se))) for pos, se in rows]
            if logged is not None:
                logged.extend(of_events(events))
            self.apply(tx, events, after, before_write)
            return
        entries: list[Entry] = []
        stamp = self._stamp
        for pos, se in rows:
            f = read_item_event(se, stamp)
            entries.append((pos, None, f) if f is not None else (pos, decode(se), None))  # type: ignore[arg-type]
        self._begin(after)
        self._load(tx, entries, item_rows=True)
        fold = self._fold
        fold.logged = logged
        try:
            for pos, e, f in entries:
                if f is not None:
                    if self._pending:
                        self._project_pending()  # rows in event order
                    if fold.fold(pos, f, self.items, self.runs):
                        continue
                    e = cast(DomainEvent, decode(f[4]))  # one for the aggregates after all
                if fold.pending:
                    fold.emit(self._rec)
                assert e is not None
                if logged is not None:
                    logged.append((pos, columns(e) or NO_TRANSITION))
                if isinstance(e, _ITEM_EVENTS):
                    self._take_item((e.run_id, e.item_id))
                self._apply_one(tx, pos, e)
        finally:
            fold.logged = None
        if fold.pending:
            fold.emit(self._rec)
        self.flush(tx, before_write)

    def _begin(self, after: int | None) -> None:
        if after is None or after != self._cache_at:
            self.forget()  # the tables may have moved since the cached batch (or never had it)
        self._cache_at = None  # until this batch is committed
        self._written_items = set()
        self._cacheable = after is not None
        self._rec = RecordingCursor()
        self._pending = []
        self._hazards = set()

    def _take_item(self, key: tuple[str, str]) -> None:
        """The item's Item aggregate in place of a fold's row (for the aggregates' path)."""
        found = self.items.get(key)
        if type(found) is ItemRow:
            item = found.to_item()
            self.items[key] = item
            self.streams[item.id] = item

    def _apply_one(self, tx: Tx, pos: int, e: DomainEvent) -> None:
        if self.tolerant:
            self._apply_one_tolerant(tx, pos, e)
            return
        if self.observer is not None:
            self.observer(tx, pos, e, self)
        if isinstance(e, WebhookEvent):
            # no run's or item's: no aggregate, only its row (writer.py), alone
            self._project_pending()
            self.projector.project(self._rec, [(pos, e)], self.runs, self.items)
            return
        if e.originator_id in self._hazards or not isinstance(e, _GROUPABLE):
            # an event type not grouped (an Archived one replaces its run's aggregate)
            # is projected alone: what came before it is projected first
            self._project_pending()
        self._mutate(e)
        self._pending.append((pos, e))
        if isinstance(e, _STATE_READING):
            # the projector reads state the stream's next event may change
            self._hazards.add(e.originator_id)
        elif not isinstance(e, _GROUPABLE):
            self._project_pending()  # an event type this module does not know: alone

    def _project_pending(self) -> None:
        """Project the events applied since the last call, all at once: the projector
        writes each touched row from the aggregate's final state, which is what
        projecting them one by one would leave."""
        if self._pending:
            self.projector.project(self._rec, self._pending, self.runs, self.items)
        self._pending = []
        self._hazards = set()

    def _apply_one_tolerant(self, tx: Tx, pos: int, e: DomainEvent) -> None:
        try:
            if self.observer is not None:
                self.observer(tx, pos, e, self)
            if isinstance(e, WebhookEvent):
                self.projector.project(self._rec, [(pos, e)], self.runs, self.items)
                return
            try:
                self._mutate(e)
            except Exception as exc:
                if not (_is_version_error(exc) or isinstance(exc, LookupError)):
                    raise
                self.force(e)
            self.projector.project(self._rec, [(pos, e)], self.runs, self.items)
        except Exception as exc:
            self.problems.append(
                {
                    "kind": "replay",
                    "run_id": _run_of(e),
                    "position": pos,
                    "detail": f"{type(e).__qualname__} v{e.originator_version} could not "
                    f"be applied: {type(exc).__name__}: {exc}",
                }
            )

    def flush(self, tx: Tx, before_write: Callable[[], None] | None = None) -> None:
        """Write the statements recorded so far (calling `before_write` first)."""
        self._project_pending()
        calls, self._rec = self._rec.calls, RecordingCursor()
        if before_write is not None:
            before_write()
        p = self.projector
        rank = self._rank
        if any(sql not in rank and sql not in (p.upsert_run, p.update_item) for sql, _ in calls):
            # a statement this module does not know: keep the projector's exact order
            self._cacheable = False
            _write_in_order(tx, calls, self.array_rows, p.add_counts)
            return
        last_run: dict[Any, tuple[Any, ...]] = {}
        last_item: dict[Any, tuple[Any, ...]] = {}
        # by rank, in the projector's order within a rank: inserts before the updates of
        # the rows they insert, each row's updates in the order they were made
        ranked: list[list[tuple[str, list[tuple[Any, ...]]]]] = [
            [] for _ in range(1 + max(rank.values()))
        ]
        for sql, rows in calls:
            if sql == p.upsert_run:
                for r in rows:
                    last_run[r[0]] = r
            elif sql == p.update_item:
                for r in rows:
                    last_item[(r[-2], r[-1])] = r
            else:
                ranked[rank[sql]].append((sql, rows))
        _write_in_order(
            tx, [group for groups in ranked for group in groups], self.array_rows, p.add_counts
        )
        if last_run:
            _write_rows(tx, p.upsert_run, list(last_run.values()), self.array_rows)
        if last_item:
            _write_rows(tx, p.update_item, list(last_item.values()), self.array_rows)
            self._written_items.update(last_item)


def _is_version_error(exc: Exception) -> bool:
    return type(exc).__name__ == "OriginatorVersionError"


def _run_of(e: DomainEvent) -> str:
    return str(getattr(e, "run_id", None) or e.originator_id)
