"""Item payloads as of an event, from the event log.

An item's payload is set by its run's creating event (the manifest) and changed by the
run's amendments (`added` and `replaced` items). The payload an item transition was made
under is therefore the manifest's, after every amendment of the run before that
transition's position and none after: `Payloads.attach` gives each item transition of
a feed page that payload, so a read model built by a follower never reads the ledger's
tables, and rebuilding it from position 0 gives what was built live.

Per page, at most two statements: the creating events and amendments of the page's
runs not seen before, and the amendments since of those seen (the run streams' other
events are not read). A run's payload history only grows (the event log is
append-only, and an entry at a later position does not change a lookup at an earlier
one), so a reader that pages on, a follower, keeps the histories it has read and does
not decode a large run's manifest again for each batch.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any
from uuid import UUID

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
KEEP_ITEMS = 200_000  # a reader keeps the histories of its latest runs up to this many items


class _History:
    """One run's payloads: the manifest's by item, and for the items amendments set, the
    positions they set them at and the payloads set then, in position order. Every item
    transition comes after its run's creating event, so the manifest's payload holds
    until the item's first amendment."""

    __slots__ = ("changes", "manifest", "seen")

    def __init__(self) -> None:
        self.manifest: dict[str, Any] = {}
        self.changes: dict[str, tuple[list[int], list[Any]]] = {}
        self.seen = 0  # the run's events before this position are in

    def submitted(self, items: Sequence[dict[str, Any]]) -> None:
        self.manifest = {it["item_id"]: it.get("payload") for it in items}

    def amended(self, position: int, items: Sequence[dict[str, Any]]) -> None:
        for it in items:
            positions, values = self.changes.setdefault(it["item_id"], ([], []))
            if positions and positions[-1] >= position:
                continue  # read already
            positions.append(position)
            values.append(it.get("payload"))

    def at(self, item_id: str, position: int) -> Any:
        """The payload the item had just before `position` (None when it had none)."""
        found = self.changes.get(item_id)
        if found is not None:
            positions, values = found
            i = bisect.bisect_left(positions, position)
            if i:
                return values[i - 1]
        return self.manifest.get(item_id)

    def size(self) -> int:
        return len(self.manifest) + len(self.changes)


class Payloads:
    """A reader's payload histories of the runs it has met, the latest kept (up to
    `KEEP_ITEMS` items in all). Not shared between threads."""

    def __init__(self, keep_items: int = KEEP_ITEMS) -> None:
        self.keep_items = keep_items
        self._runs: dict[str, _History] = {}  # least recently used first

    def attach(self, tx: Tx, found: Sequence[Transition]) -> None:
        """Give each item transition of `found` (a feed page, in position order) its
        item's payload as it stood at that transition; run transitions keep None."""
        runs = {t.run_id for t in found if t.item_id is not None}
        if not runs:
            return
        before = found[-1].position
        known = {r: self._runs.pop(r) for r in runs if r in self._runs}
        new = {r: _History() for r in runs if r not in known}
        if new:
            self._read(tx, new, 0, before, "payload_events")
        stale = {r: h for r, h in known.items() if h.seen < before}
        if stale:
            self._read(tx, stale, min(h.seen for h in stale.values()), before, "payload_amendments")
        for t in found:
            if t.item_id is not None:
                history = known.get(t.run_id) or new[t.run_id]
                t.__dict__["payload"] = history.at(t.item_id, t.position)
        self._runs.update(known)
        self._runs.update(new)
        self._trim(runs)

    def _read(self, tx: Tx, runs: dict[str, _History], since: int, before: int, sql: str) -> None:
        """The payload-setting events of `runs` from position `since` to before `before`."""
        store = tx.store
        by_stream: dict[UUID, _History] = {run_stream_id(r): h for r, h in runs.items()}
        events: list[tuple[int, Any]] = []
        decode = store.mapper.to_domain_event
        ids = sorted(by_stream)
        for i in range(0, len(ids), _CHUNK):
            chunk = tx_list(tx, [oid_param(store.dialect, s) for s in ids[i : i + _CHUNK]])
            for r in tx.fetchall(SQL.sql(tx, sql), (chunk, since, before, _AMENDED)):
                stored = StoredEvent(
                    originator_id=as_uuid(r["originator_id"]),
                    originator_version=r["originator_version"],
                    topic=r["topic"],
                    state=bytes(r["state"]),
                )
                events.append((int(r["position"]), decode(stored)))
        events.sort(key=lambda pe: pe[0])
        for position, e in events:
            history = by_stream.get(as_uuid(e.originator_id))
            if history is None:
                continue
            if isinstance(e, Run.Submitted):
                history.submitted(e.manifest["items"])
            elif isinstance(e, Run.Amended):
                history.amended(position, e.added)
                history.amended(position, e.replaced)
        for history in runs.values():
            history.seen = max(history.seen, before)

    def _trim(self, keep: set[str]) -> None:
        """Forget the least recently used histories past `keep_items` items (never the
        page's own)."""
        total = sum(h.size() for h in self._runs.values())
        for run_id in list(self._runs):
            if total <= self.keep_items:
                return
            if run_id not in keep:
                total -= self._runs.pop(run_id).size()


def attach(tx: Tx, found: Sequence[Transition]) -> None:
    """`Payloads.attach` by a reader that keeps nothing (one page)."""
    Payloads(keep_items=0).attach(tx, found)
