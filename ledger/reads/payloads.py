"""Item payloads as of an event, from the event log.

An item's payload is set by its run's creating event (the manifest) and changed by the
run's amendments (`added` and `replaced` items). The payload an item transition was made
under is therefore the manifest's, after every amendment of the run before that
transition's position and none after: `attach` gives each item transition of a feed
page that payload, so a read model built by a follower never reads the ledger's tables,
and rebuilding it from position 0 gives what was built live.

One statement per page: the creating events and amendments of the page's runs before
its last position (the run streams' other events are not read), decoded once each.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, cast

from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic

from ledger.core.domain import Run, run_stream_id
from ledger.core.views import Transition
from ledger.reads.sql import SQL
from ledger.stores.base import Tx
from ledger.stores.hashchain import as_uuid, oid_param
from ledger.stores.named import tx_list

_CHUNK = 400  # run streams per statement
_AMENDED = get_topic(Run.Amended)  # the pinned topic the amendments are stored under


class _History:
    """One run's payload-setting events: for each item, the positions at which its
    payload was set and the payloads set then, in position order."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: dict[str, tuple[list[int], list[Any]]] = {}

    def set(self, position: int, items: Sequence[dict[str, Any]]) -> None:
        for it in items:
            positions, values = self.items.setdefault(it["item_id"], ([], []))
            positions.append(position)
            values.append(it.get("payload"))

    def at(self, item_id: str, position: int) -> Any:
        """The payload set last before `position` (None when none was)."""
        found = self.items.get(item_id)
        if found is None:
            return None
        positions, values = found
        i = bisect.bisect_left(positions, position)
        return values[i - 1] if i else None


def histories(tx: Tx, run_ids: Sequence[str], before: int) -> dict[str, _History]:
    """The payload histories of `run_ids` from their events before position `before`
    (a run whose events are not in the store, archived, has an empty one)."""
    store = tx.store
    out: dict[str, _History] = {r: _History() for r in run_ids}
    by_stream = {run_stream_id(r): out[r] for r in out}
    events: list[tuple[int, DomainEvent]] = []
    ids = sorted(out)
    decode = store.mapper.to_domain_event
    for i in range(0, len(ids), _CHUNK):
        chunk = [oid_param(store.dialect, run_stream_id(r)) for r in ids[i : i + _CHUNK]]
        rows = tx.fetchall(SQL.sql(tx, "payload_events"), (tx_list(tx, chunk), before, _AMENDED))
        for r in rows:
            stored = StoredEvent(
                originator_id=as_uuid(r["originator_id"]),
                originator_version=r["originator_version"],
                topic=r["topic"],
                state=bytes(r["state"]),
            )
            events.append((int(r["position"]), cast(DomainEvent, decode(stored))))
    events.sort(key=lambda pe: pe[0])
    for position, e in events:
        history = by_stream.get(as_uuid(e.originator_id))
        if history is None:
            continue
        if isinstance(e, Run.Submitted):
            history.set(position, e.manifest["items"])
        elif isinstance(e, Run.Amended):
            history.set(position, e.added)
            history.set(position, e.replaced)
    return out


def attach(tx: Tx, found: Sequence[Transition]) -> None:
    """Give each item transition of `found` (a feed page, in position order) its item's
    payload as it stood at that transition; run transitions keep None."""
    runs = {t.run_id for t in found if t.item_id is not None}
    if not runs:
        return
    known = histories(tx, sorted(runs), found[-1].position)
    for t in found:
        if t.item_id is not None:
            t.__dict__["payload"] = known[t.run_id].at(t.item_id, t.position)
