"""The unit of work: one command's transactions, the rule book's order of checks, and its commit.

A handler gets a `UnitOfWork` and opens its transactions through it (`uow.write()`,
`uow.read()`). When the command carries an idempotency key, the pipeline has already
opened the one transaction that also records the key: the unit of work then hands
that transaction to every `write()`/`read()`, so the command and its key record
commit together. The transaction is passed explicitly, not kept in a thread-local.

`guard` does the checks that come after argument validation, in the rule book's order:
existence (the run, loaded and locked), role, revision; the state check follows
from the transition table (`require_run_state`, `require_item_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast
from uuid import UUID

from ledger.commands.idempotency import retry_transient
from ledger.commands.sql import SQL
from ledger.core import states as S
from ledger.core.domain import (
    Item,
    Run,
    check_item_run_state,
    check_item_state,
    item_stream_id,
    refuse_run_state,
)
from ledger.core.errors import Conflict, ItemNotFound, NotAuthorized
from ledger.core.rows import item_from_row
from ledger.core.rule_check import ItemFacts, Overlay, check_batch
from ledger.core.views import Actor
from ledger.projections.counts import required_not_accepted
from ledger.projections.sql import STATEMENTS as PROJECTION_SQL
from ledger.reads import queries
from ledger.stores.base import Store, StreamConflict, Tx
from ledger.stores.hashchain import heads_statement, note_heads
from ledger.stores.named import tx_list

if TYPE_CHECKING:
    from eventsourcing.domain import DomainEvent

    from ledger.projections.writer import Projector

T = TypeVar("T")
A = TypeVar("A", bound=Run | Item | None)

LEDGER = Actor(S.LEDGER_ACTOR_ID, S.CONTROLLER)


def require_role(actor: Actor, roles: frozenset[str], command: str) -> None:
    """NotAuthorized unless the actor's role is one of `roles`."""
    if actor.role not in roles:
        raise NotAuthorized(
            f"role {actor.role!r} may not {command}; allowed roles: {S.describe_roles(roles)}"
        )


def check_revision(expected: int | None, current: int, state: str, what: str) -> None:
    """Conflict when the caller expected another revision."""
    if expected is not None and expected != current:
        raise Conflict(
            f"{what} is at revision {current} (state {state}), not {expected}; re-read and retry",
            current_revision=current,
            current_state=state,
        )


def require_run_state(run: Run, rule: S.Rule, command: str | None = None) -> None:
    """AlreadyTerminal/IllegalTransition unless the run is in one of the rule's sources."""
    if run.state not in rule.sources:
        refuse_run_state(run.run_id, run.state, rule, command)


def require_item_state(run_id: str, state: str, item_id: str, rule: S.Rule) -> None:
    """IllegalTransition unless the item is in one of the rule's sources."""
    check_item_state(run_id, item_id, state, rule)


def require_item_run_state(run: Run, rule: S.Rule) -> None:
    """AlreadyTerminal/IllegalTransition unless the run is in a state the item command needs."""
    check_item_run_state(run.run_id, run.state, rule)


def stamp(now: datetime, agg: Any) -> datetime:
    """Event times never move backwards within a stream."""
    if agg is not None and agg.modified_on is not None and agg.modified_on > now:
        return agg.modified_on  # type: ignore[no-any-return]
    return now


class _ItemBefore:
    """An item's state and lease as the transaction loaded it."""

    __slots__ = ("lease_expires_at", "lease_token", "lease_worker", "state")

    def __init__(
        self,
        state: str,
        lease_token: str | None,
        lease_worker: str | None,
        lease_expires_at: str | None,
    ) -> None:
        self.state = state
        self.lease_token = lease_token
        self.lease_worker = lease_worker
        self.lease_expires_at = lease_expires_at


def _required(tx: Tx) -> Callable[[str], list[tuple[str, str]]]:
    def required(run_id: str) -> list[tuple[str, str]]:
        return [(r["item_id"], r["state"]) for r in required_not_accepted(tx, run_id, 50)]

    return required


def _amended(tx: Tx) -> Callable[[str, str], bool]:
    def amended_by(run_id: str, actor_id: str) -> bool:
        return tx.fetchone(SQL.sql(tx, "run_amended_by"), (run_id, actor_id)) is not None

    return amended_by


class UnitOfWork:
    """One command invocation over the ledger's store."""

    def __init__(self, store: Store, projector: Projector, tx: Tx | None = None) -> None:
        self.store = store
        self._projector = projector
        self._joined = tx  # the keyed command's transaction, shared by every step
        # the time of the last committed event of every stream loaded, and the state and
        # lease of every item loaded: where the pre-commit rule check
        # (ledger/core/rule_check.py) starts from
        self._stamps: dict[UUID, datetime] = {}
        self._items: dict[UUID, ItemFacts] = {}
        self._exclusive = False  # item commands lock their run FOR UPDATE (item_write)

    # -- transactions ----------------------------------------------------
    @contextmanager
    def write(self) -> Iterator[Tx]:
        """A write transaction (the keyed command's own, when it has a key)."""
        if self._joined is not None:
            yield self._joined
            return
        with self.store.write() as tx:
            yield tx

    @contextmanager
    def read(self) -> Iterator[Tx]:
        """A read transaction (the keyed command's own, when it has a key)."""
        if self._joined is not None:
            yield self._joined
            return
        with self.store.read() as tx:
            yield tx

    def retry_step(self, step: Callable[..., T], *args: Any) -> T:
        """One idempotent step in its own transaction, retried on transient faults; inside a
        keyed command it is part of that command's transaction, which the pipeline retries."""
        if self._joined is not None:
            return step(*args)
        return retry_transient(step, *args)

    # -- loading ---------------------------------------------------------
    def load_run(self, tx: Tx, run_id: str, lock: bool | str = True) -> Run:
        """The run's aggregate from its snapshot row (locked on PostgreSQL); RunNotFound.
        `lock="item"`: an item command's lock (ledger/reads/queries.py `load_run`), FOR UPDATE
        instead while `item_write` repeats a transaction that found the run draining."""
        if lock == "item" and self._exclusive:
            lock = "update"
        return self.track(queries.load_run(tx, run_id, lock))

    def item_write(self, body: Callable[[Tx], T]) -> T:
        """An item command's write transaction: `body(tx)`, which loads its run with
        `lock="item"`. When the share lock it got turns out to be on a run a run command
        has just made draining (RunLockUpgrade: nothing was written), the transaction is
        repeated once holding the run FOR UPDATE. In a keyed command's transaction the
        error goes to the pipeline, which repeats that whole transaction."""
        try:
            with self.write() as tx:
                return body(tx)
        except queries.RunLockUpgrade:
            if self._joined is not None:
                raise
        self._exclusive = True
        try:
            with self.write() as tx:
                return body(tx)
        finally:
            self._exclusive = False

    def track(self, agg: A) -> A:
        """Note the time of the aggregate's last committed event (None passes through)."""
        if agg is not None and agg.modified_on is not None:
            self._stamps[agg.id] = agg.modified_on
            if isinstance(agg, Item):
                self._items[agg.id] = _ItemBefore(
                    agg.state, agg.lease_token, agg.lease_worker, agg.lease_expires_at
                )
        return agg

    def guard(
        self,
        tx: Tx,
        run_id: str,
        actor: Actor,
        roles: frozenset[str],
        command: str,
        expected: int | None,
        lock: bool | str = True,
    ) -> Run:
        """the rule book's order after the arguments: existence, role, revision. Returns the run."""
        run = self.load_run(tx, run_id, lock)
        require_role(actor, roles, command)
        check_revision(expected, run.version, run.state, f"run {run_id}")
        return run

    item_row = staticmethod(queries.item_row)

    def locked_item_row(self, tx: Tx, run_id: str, item_id: str) -> dict[str, Any]:
        """One item's row locked for the transaction, with its stream's head read in the
        same round trip (`item_rows`); ItemNotFound."""
        row = self.item_rows(tx, run_id, [item_id], lock=True).get(item_id)
        if row is None:
            raise ItemNotFound(run_id, item_id)
        return row

    @staticmethod
    def item_rows(
        tx: Tx, run_id: str, item_ids: Sequence[str], lock: bool = False
    ) -> dict[str, dict[str, Any]]:
        """The rows of the named items that exist, by item id (locked for the transaction
        when `lock`, on PostgreSQL, in item id order: two such transactions never deadlock).
        Locked, the last event of each item's stream is read in the same round trip, after
        the lock (`hashchain.note_heads`): the events the command appends chain to them."""
        out: dict[str, dict[str, Any]] = {}
        ids = list(dict.fromkeys(item_ids))
        if lock:
            ids.sort()
        for k in range(0, len(ids), 500):
            chunk = ids[k : k + 500]
            if lock:
                sql = SQL.sql(tx, "items_by_id_locked")
                heads_sql, heads_params = heads_statement(
                    tx, [item_stream_id(run_id, item_id) for item_id in chunk]
                )
                rows, heads = tx.fetch_both(
                    sql, (run_id, tx_list(tx, chunk)), heads_sql, heads_params
                )
                note_heads(tx, heads)
            else:
                sql = PROJECTION_SQL.sql(tx, "load_items", items="lg_items")
                rows = tx.fetchall(sql, (run_id, tx_list(tx, chunk)))
            for row in rows:
                out[row["item_id"]] = row
        return out

    def materialize(self, row: dict[str, Any], now: datetime) -> Item:
        """The item's aggregate; its stream begins now if it has none yet."""
        item = self.track(item_from_row(row))
        if item is None:  # no Registered event: the run's Submitted declares the item
            item = Item.begin(row["run_id"], row["item_id"], now)
        return item

    # -- saving ----------------------------------------------------------
    def commit(
        self, tx: Tx, runs: dict[str, Run], items: Sequence[Item] = (), first: str = "items"
    ) -> None:
        """Append the aggregates' new events and project them, in the same transaction."""
        item_events = [e for it in items for e in it.collect_events()]
        run_events = [e for r in runs.values() for e in r.collect_events()]
        events = item_events + run_events if first == "items" else run_events + item_events
        if not events:
            return
        # the rule checker verify and import apply to history, on these events, before
        # anything is written
        facts = Overlay(runs, self._items, self._stamps, _required(tx), events, _amended(tx))
        check_batch(events, facts)
        try:
            positioned = tx.append(cast("list[DomainEvent]", events))
        except StreamConflict as e:
            run = next(iter(runs.values()))
            raise Conflict(
                f"another writer changed run {run.run_id} first; re-read and retry ({e})",
                current_revision=run.version,
                current_state=run.state,
            ) from None
        item_map = {(it.run_id, it.item_id): it for it in items}
        tx.items_inserted += self._projector.project(tx, positioned, runs, item_map)


def commit_stream_events(tx: Tx, projector: Projector, events: Sequence[DomainEvent]) -> int:
    """Append events of no run or item (a webhook's changes: ledger/core/webhook_events.py)
    the way `UnitOfWork.commit` appends a run's: checked by the rule checker first, stored
    with their chained hashes, projected in the same transaction. Returns the position of
    the last. Conflict when another writer appended to one of their streams first."""
    facts = Overlay({}, {}, {}, _required(tx), events, _amended(tx))
    check_batch(events, facts)
    try:
        positioned = tx.append(events)
    except StreamConflict as e:
        first = events[0]
        raise Conflict(
            f"another writer appended to stream {first.originator_id} first; re-read and "
            f"retry ({e})",
            current_revision=int(first.originator_version) - 1,
            current_state=str(getattr(first, "from_state", "")),
        ) from None
    projector.project(tx, positioned, {}, {})
    return positioned[-1][0]
