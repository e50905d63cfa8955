"""A rebuild's item events folded from their stored JSON straight into rows.

Item events (`Item.Transitioned`, `Item.LeaseExtended` and the older `Item.Registered`)
are nearly all of a ledger's events. A rebuild reads each one's state once with orjson
(`plain_state`: the test the event decoder itself applies, so a state is folded exactly
when the decoder would have read the same values) and folds it into the item's row
(`ItemRow`, keyed like `lg_items`) and the run's count deltas, with no event object and
no aggregate. What an item event does to the item's fields is written once, in
ledger/core/domain.py (`apply_item_transition`, `apply_lease_extension`,
`begin_item_fields`): the Item aggregate applies those functions to itself, so the rows
the commands write (from their aggregates) and the rows folded here cannot drift. The
attempt and count rows an item event writes are made as the `Projector` makes them (ledger/projections/writer.py, its item branches), in the same statements and
the same order; the tests fold the saved histories, random command sequences and a large
generated ledger both ways and compare the tables' checksums.

Anything else goes through the decoder and the aggregates as before (`Replayer.apply`):
run and webhook events (a few per run), another topic, a class version, a wrapper
inside the state, an event whose version does not follow its row's (the aggregate path
raises the error it always raised), a missing attribute.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from datetime import datetime
from typing import Any, cast

from eventsourcing.persistence import Mapper, StoredEvent

from ledger.core.domain import (
    ITEM_FIELDS,
    Item,
    Run,
    apply_item_transition,
    apply_lease_extension,
    begin_item_fields,
)
from ledger.core.recorded import item_columns
from ledger.core.rows import iso, item_from_row
from ledger.core.states import IN_PROGRESS
from ledger.projections.counts import slot_of
from ledger.projections.writer import Cursor, Projector
from ledger.stores.base import NO_TRANSITION
from ledger.stores.encoding import EventMapper, plain_state

REGISTERED, TRANSITIONED, LEASE_EXTENDED = 1, 2, 3
ITEM_TOPICS: dict[str, int] = {
    cast(str, getattr(Item.Registered, "TOPIC")): REGISTERED,  # noqa: B009 (set by _pin_topics)
    cast(str, getattr(Item.Transitioned, "TOPIC")): TRANSITIONED,  # noqa: B009
    cast(str, getattr(Item.LeaseExtended, "TOPIC")): LEASE_EXTENDED,  # noqa: B009
}

# a stored item event read for folding: (kind, state, version, time as row text, the
# stored event itself, for the aggregate path when the fold declines it)
Folded = tuple[int, dict[str, Any], int, str, StoredEvent]


class ItemRow:
    """An item's row in a replay: its fields (the Item aggregate's, `ItemFields`), its
    revision (the stream's version) and its `updated_at` text."""

    __slots__ = (
        "attempts",
        "eligible_at",
        "item_id",
        "last_error",
        "lease_expires_at",
        "lease_started_on",
        "lease_token",
        "lease_worker",
        "reason",
        "revision",
        "run_id",
        "state",
        "updated_at",
    )

    def __init__(self, run_id: str, item_id: str, revision: int, updated_at: str | None) -> None:
        self.run_id = run_id
        self.item_id = item_id
        self.revision = revision
        self.updated_at = updated_at
        self.state: str
        self.attempts: int
        self.lease_token: str | None
        self.lease_worker: str | None
        self.lease_expires_at: str | None
        self.lease_started_on: str | None  # the row's text (lease_started_at)
        self.eligible_at: str | None
        self.last_error: str | None
        self.reason: str | None
        begin_item_fields(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ItemRow | None:
        """The row as read from the items table, or None while its stream has not begun
        (as `item_from_row`)."""
        if row["revision"] == 0:
            return None
        out = cls(row["run_id"], row["item_id"], row["revision"], row["updated_at"])
        for name in ITEM_FIELDS:
            setattr(out, name, row[name])
        out.lease_started_on = row["lease_started_at"]
        return out

    @classmethod
    def from_item(cls, item: Item) -> ItemRow:
        """The row of an Item aggregate (what `item_stream_values` writes of it)."""
        out = cls(item.run_id, item.item_id, item.version, iso(item.modified_on))
        for name in ITEM_FIELDS:
            setattr(out, name, getattr(item, name))
        out.lease_started_on = iso(item.lease_started_on)
        return out

    def as_row(self) -> dict[str, Any]:
        """The row as the items table holds it (its item-stream columns and key)."""
        row = {name: getattr(self, name) for name in ITEM_FIELDS}
        row.update(
            run_id=self.run_id,
            item_id=self.item_id,
            revision=self.revision,
            lease_started_at=self.lease_started_on,
            updated_at=self.updated_at,
        )
        return row

    def to_item(self) -> Item:
        """The Item aggregate of this row (for an event the fold leaves to the aggregates)."""
        item = item_from_row(self.as_row())
        assert item is not None  # a folded row has begun (revision >= 1)
        return item

    def stream_values(self) -> tuple[Any, ...]:
        """The item-stream part of the row, in ITEM_STREAM_COLUMNS order (as
        `item_stream_values` of the aggregate), then its key."""
        return (
            self.state,
            self.revision,
            self.attempts,
            self.lease_token,
            self.lease_worker,
            self.lease_expires_at,
            self.eligible_at,
            self.last_error,
            self.reason,
            self.updated_at,
            self.lease_started_on,
            self.run_id,
            self.item_id,
        )


def folds(mapper: Mapper[Any]) -> bool:
    """Whether item events read through `mapper` may be folded from their stored JSON:
    the ledger's own mapper, reading the item topics as plain JSON (no compression, no
    cipher, no class version)."""
    return isinstance(mapper, EventMapper) and all(mapper.reads_plain(t) for t in ITEM_TOPICS)


class StampText:
    """A stored timestamp's text as the rows write it (`iso` of the parsed time); one
    command's events share their stamp, so the last one is kept."""

    def __init__(self) -> None:
        self._text = ""
        self._at = ""

    def __call__(self, text: str) -> str:
        if text != self._text:
            self._at = iso(datetime.fromisoformat(text)) or ""
            self._text = text
        return self._at


def read_item_event(se: StoredEvent, stamp: StampText) -> Folded | None:
    """A stored item event ready to fold, or None (not an item event, or a state the
    decoder would not read as plain JSON)."""
    kind = ITEM_TOPICS.get(se.topic)
    if kind is None:
        return None
    state = plain_state(se.state)
    if state is None:
        return None
    return (kind, state, se.originator_version, stamp(state["timestamp"]["_data_"]), se)


class ItemFold:
    """Folds item events into `ItemRow`s and collects the rows they write, until `emit`
    records them (in the projector's statements and order) on a cursor."""

    def __init__(self, projector: Projector) -> None:
        self.p = projector
        self._attempt_inserts: list[tuple[Any, ...]] = []
        # (position, transition columns) of each event folded, when a caller asks
        self.logged: list[tuple[int, tuple[str | None, ...]]] | None = None
        self._counts: dict[tuple[str, int, str], int] = {}
        self._touched: dict[tuple[str, str], ItemRow] = {}
        self._slot_at, self._slot = "", 0

    @property
    def pending(self) -> bool:
        """Rows folded and not yet emitted."""
        return bool(self._touched)

    def fold(
        self,
        position: int,
        event: Folded,
        items: MutableMapping[tuple[str, str], Any],
        runs: dict[str, Run],
    ) -> bool:
        """Fold one item event into its row in `items` (an `ItemRow`; an Item aggregate
        found there is taken over as its row); False, with nothing changed, when the
        event is one for the aggregates."""
        kind, state, version, at, _se = event
        try:
            run_id: str = state["run_id"]
            item_id: str = state["item_id"]
            if kind == TRANSITIONED:
                command: str = state["command"]
                from_state: str = state["from_state"]
                to_state: str = state["to_state"]
                actor_id: str = state["actor_id"]
                _role: str = state["role"]  # the log's columns name it
                reason: str | None = state["reason"]
                ev: dict[str, Any] = state["evidence"]
            elif kind == LEASE_EXTENDED:
                expires_at: str = state["expires_at"]
        except (KeyError, TypeError):
            return False
        key = (run_id, item_id)
        if kind == REGISTERED:
            row = ItemRow(run_id, item_id, version, at)
            items[key] = self._touched[key] = row
            if self.logged is not None:
                self.logged.append((position, NO_TRANSITION))
            return True
        found = items.get(key)
        if found is None:
            if kind != TRANSITIONED or version != 1:
                return False  # its first events are missing: the aggregates say so
            row = ItemRow(run_id, item_id, 0, None)  # a declared item's stream begins
        elif type(found) is ItemRow:
            row = found
        else:
            row = ItemRow.from_item(found)
        if version != row.revision + 1:
            return False
        if kind == LEASE_EXTENDED:
            apply_lease_extension(row, expires_at)
            if self.logged is not None:
                self.logged.append((position, NO_TRANSITION))
        else:
            run = runs.get(run_id)
            if type(ev) is not dict or run is None:
                return False
            counts = run.counts
            if from_state not in counts or to_state not in counts:
                return False
            ends = from_state == IN_PROGRESS and command != "claim"
            try:
                number = ev["attempt"] if ends else None
            except KeyError:
                return False
            ended = apply_item_transition(
                row, command, from_state, to_state, actor_id, reason, ev, at
            )
            # the run's own row is not written: its counts move in lg_run_counts
            counts[from_state] -= 1
            counts[to_state] += 1
            if at is not self._slot_at:  # one command's events share their time
                self._slot_at, self._slot = at, slot_of(at)
            slot = self._slot
            deltas = self._counts
            k = (run_id, slot, from_state)
            deltas[k] = deltas.get(k, 0) - 1
            k = (run_id, slot, to_state)
            deltas[k] = deltas.get(k, 0) + 1
            if ends and ended is not None and row.attempts == number:
                # the attempt ended: its one row, from the lease it ends (as the projector
                # writes it from the aggregate's ended lease of that number)
                self._attempt_inserts.append(
                    (
                        run_id,
                        item_id,
                        number,
                        ended.worker_id,
                        ended.lease_token,
                        ended.started_on,
                        ended.expires_at,
                        at,
                        ev.get("stage"),
                        ev.get("outcome"),
                        ev.get("error"),
                    )
                )
            if self.logged is not None:
                self.logged.append((position, item_columns(state, at)))
        row.revision = version
        row.updated_at = at
        items[key] = self._touched[key] = row
        return True

    def emit(self, cur: Cursor) -> None:
        """Record the rows folded since the last call, as `Projector.project` writes an
        item event's rows: attempts, count deltas (in key order), items."""
        p = self.p
        if self._attempt_inserts:
            cur.executemany(p.insert_attempt, self._attempt_inserts)
        if self._counts:
            cur.executemany(p.add_counts, [(*k, n) for k, n in sorted(self._counts.items())])
        if self._touched:
            cur.executemany(p.update_item, [r.stream_values() for r in self._touched.values()])
        self._attempt_inserts = []
        self._counts, self._touched = {}, {}
