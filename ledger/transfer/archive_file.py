"""Archive files and the record of what left: what an archive or a restore did
(`ArchiveSummary`), each run's share of a checked archive file (`RunPart`,
`runs_of_file`), the file's SHA-256, and the `Archived` event a run's stream ends with
(`archived_run`). Used by `archive` (ledger/transfer/archive.py) and `restore` (ledger/transfer/restore.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from ledger.core.archived import archived_record
from ledger.core.domain import run_stream_id
from ledger.core.errors import InvalidInput
from ledger.stores import hashchain as hc
from ledger.stores.raw import RawEvent, read_stream_events, stream_heads
from ledger.transfer.history_file import EventReader, ImportRefused

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger
    from ledger.stores.base import Tx


@dataclass(frozen=True)
class ArchiveSummary:
    """What an archive or a restore did."""

    archive: str
    runs: list[str] = field(default_factory=list)  # runs archived (or restored) now
    events: int = 0  # events that left the store (or came back)
    resumed: list[str] = field(default_factory=list)  # runs whose archiving was finished now
    sha256: str = ""
    digest: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "archive": self.archive,
            "runs": self.runs,
            "events": self.events,
            "resumed": self.resumed,
            "sha256": self.sha256,
            "digest": self.digest,
        }


@dataclass
class RunPart:
    """One run's share of an archive file."""

    run_id: str
    streams: dict[UUID, tuple[int, str]] = field(default_factory=dict)  # stream -> version, hash
    events: int = 0

    @property
    def stream(self) -> UUID:
        return run_stream_id(self.run_id)

    def digest(self) -> str:
        d = hc.HeadsDigest()
        for oid in sorted(self.streams):
            d.add(oid, *self.streams[oid])
        return d.hexdigest()


def _file_arg(value: Any, what: str) -> Path:
    """A file name given as a string or a path (InvalidInput otherwise)."""
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be a file name (a non-empty string or path)")
    if "\x00" in value:
        raise InvalidInput(f"{what} must not contain NUL characters")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} must be valid Unicode (no lone surrogates)") from None
    return Path(value)


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def runs_of_file(path: Path) -> dict[str, RunPart]:
    """Each run's streams (heads) and event count in a checked history file. A stream
    belongs to the run its first event names (Run.Submitted and Item.Registered carry it)."""
    parts: dict[str, RunPart] = {}
    owner: dict[UUID, RunPart] = {}
    with open(path, encoding="utf-8") as f:
        reader = EventReader(f)
        for e in reader:
            part = owner.get(e.stream)
            if part is None:
                run_id = _run_id_of(e)
                if run_id is None:
                    raise ImportRefused(
                        f"line {reader.line}, position {e.position}: the first event of stream {e.stream} "
                        "does not name its run",
                        line=reader.line,
                        position=e.position,
                    )
                part = parts.setdefault(run_id, RunPart(run_id))
                owner[e.stream] = part
            part.streams[e.stream] = (e.version, e.hash or "")
            part.events += 1
    return parts


def _run_id_of(e: RawEvent) -> str | None:
    try:
        doc = json.loads(e.state)
    except ValueError:
        return None
    run_id = doc.get("run_id") if isinstance(doc, dict) else None
    return str(run_id) if isinstance(run_id, str) else None


def _archived_tx(tx: Tx, stream: UUID) -> dict[str, Any] | None:
    heads = stream_heads(tx, [stream])
    if stream not in heads:
        return None
    version = heads[stream][0]
    for e in read_stream_events(tx, stream, since_version=version):
        return archived_record(e.topic, e.state)
    return None


def _archived(lg: Ledger, stream: UUID) -> dict[str, Any] | None:
    """The record of the run's `Archived` event, if its stream ends with one."""
    with lg.store.read() as tx:
        return _archived_tx(tx, stream)


def archived_run(lg: Ledger, run_id: str) -> dict[str, Any] | None:
    """The record of an archived run's `Archived` event; None when it is not archived."""
    try:
        stream = run_stream_id(run_id)
    except (ValueError, TypeError, AttributeError):
        raise InvalidInput(f"run id {run_id!r} is not a run id (a UUID)") from None
    return _archived(lg, stream)
