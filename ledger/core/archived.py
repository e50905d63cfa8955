"""The `Archived` event: what stays in a run's stream when its events leave the store for
a verified archive (ledger/transfer/archive.py).

It is the next version of the run's stream, so the run's hash chain continues through it:
its hash chains to `head_hash`, the recorded hash of the run's last event before the
archive, and `verify` starts the stream's chain there (a stream whose first stored event
is an `Archived` one lost its earlier versions on purpose). It records where the events
went (the file, its SHA-256 and its heads digest), how many there were, and the digest of
the heads of every stream of the run, so a restore can prove that the events it brings
back are the ones that left. It carries the run's projection row as it was (final state,
counts, links), so the run's status survives a rebuild without its events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.domain import CanInitAggregate, DomainEvent
from eventsourcing.utils import register_topic

ARCHIVED_TOPIC = "ledger.archived:Archived"


@dataclass(frozen=True)
class Archived(DomainEvent, CanInitAggregate[UUID]):
    """A run's events were moved to a verified archive; this event stands in for them."""

    run_id: str
    head_hash: str  # recorded hash of the run stream's last event before this one
    events: int  # events of the run (all its streams) in the archive
    streams: int
    streams_digest: str  # HeadsDigest of the run's streams as archived
    archive: str  # the archive file as named when it was written
    archive_sha256: str
    archive_digest: str  # the archive's closing-line digest
    row: dict[str, Any]  # the run's lg_runs row, revision = this event's version
    actor_id: str
    role: str
    reason: str | None

    @property
    def links(self) -> list[dict[str, str]]:
        """The run's links as its row kept them (a replay loads the linked runs)."""
        value = json.loads(self.row["links"])
        return value if isinstance(value, list) else []

    def mutate(self, aggregate: Any) -> Any:
        """The run as its row kept it (replaces any state built from earlier events)."""
        from ledger.core.rows import run_from_row

        return run_from_row(dict(self.row))

    def record(self) -> dict[str, Any]:
        """What reads and verify report about the archived run."""
        return {
            "run_id": self.run_id,
            "archive": self.archive,
            "archive_sha256": self.archive_sha256,
            "archive_digest": self.archive_digest,
            "events": self.events,
            "archived_at": self.timestamp.isoformat(),
            "archived_by": self.actor_id,
        }


# The topic stored events have always had (see `domain.STORED_MODULE`).
setattr(Archived, "TOPIC", ARCHIVED_TOPIC)  # noqa: B010 (eventsourcing's construct_topic reads it)
register_topic(ARCHIVED_TOPIC, Archived)


def archived_record(topic: str, state: bytes) -> dict[str, Any] | None:
    """The record of a stored `Archived` event (None for any other event)."""
    if topic != ARCHIVED_TOPIC:
        return None
    try:
        doc = json.loads(state)
    except ValueError:
        return None
    keys = ("run_id", "archive", "archive_sha256", "archive_digest", "events", "head_hash")
    out = {k: doc.get(k) for k in keys}
    stamp = doc.get("timestamp")
    out["archived_at"] = stamp.get("_data_") if isinstance(stamp, dict) else None
    out["archived_by"] = doc.get("actor_id")
    out["streams_digest"] = doc.get("streams_digest")
    return out


__all__ = ["ARCHIVED_TOPIC", "Archived", "archived_record"]
