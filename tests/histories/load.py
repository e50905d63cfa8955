"""Export a ledger's stored events, and import stored events into a fresh ledger.

Importing writes the events (and their chained hashes) exactly as stored, then
`rebuild_projections()` builds every read model from them: the path a saved
history takes in the replay tests, and a fast way to give a test a big history.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from ledger import Ledger
from ledger.stores.hashchain import chain_hashes

CHUNK = 2000


def stored_events(lg: Ledger, page: int = CHUNK) -> Iterator[tuple[int, StoredEvent]]:
    """Every stored event in position order."""
    after = 0
    while True:
        with lg.store.read() as tx:
            rows = lg.store.read_stored_rows(tx, after, page)
        yield from rows
        if len(rows) < page:
            return
        after = rows[-1][0]


def import_stored(lg: Ledger, events: Iterable[StoredEvent], chunk: int = CHUNK) -> int:
    """Append stored events as they are (with hashes), in chunks; returns how many."""
    batch: list[StoredEvent] = []
    n = 0
    for se in events:
        batch.append(se)
        if len(batch) >= chunk:
            n += _write(lg, batch)
            batch = []
    if batch:
        n += _write(lg, batch)
    return n


def _write(lg: Ledger, batch: list[StoredEvent]) -> int:
    with lg.store.write() as tx:
        tx.insert_stored_events(batch, chain_hashes(tx, batch))
    return len(batch)


def to_json(se: StoredEvent) -> dict[str, Any]:
    """A stored event as a JSON object (its state parsed, so the file is readable)."""
    return {
        "topic": se.topic,
        "originator_id": str(se.originator_id),
        "originator_version": se.originator_version,
        "state": json.loads(bytes(se.state)),
    }


def from_json(d: dict[str, Any]) -> StoredEvent:
    """Inverse of `to_json` (the state re-encoded as compact JSON)."""
    state = json.dumps(d["state"], separators=(",", ":"), ensure_ascii=False).encode()
    return StoredEvent(
        originator_id=UUID(d["originator_id"]),
        originator_version=int(d["originator_version"]),
        topic=d["topic"],
        state=state,
    )
