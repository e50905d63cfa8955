"""Verifiable archival: runs terminal since before a date leave the store for a verified
archive file, and come back from it.

`archive` (operator role):

1. picks the runs (terminal, stopped before DATE, not archived yet; or the runs named),
2. exports their events to `FILE.partial` (ledger/transfer.py), flushes it to disk, reads
   it back and checks every hash chain and its closing line, and only then renames it to
   FILE,
3. for each run, in one transaction: checks that the store still holds exactly the
   events the file holds (stream heads equal), appends one `Archived` event to the run's
   stream (ledger/archived.py: the file's SHA-256 and digest, the number of events, the
   run's head hash, the run's projection row) and projects it: the run's item, attempt
   and transition rows go, its run row stays,
4. deletes the run's other events and their hashes, a few thousand events per short
   transaction (no long lock on PostgreSQL).

A crash anywhere leaves either the old events (before 3), or a verified FILE plus the
`Archived` event (after 3; some old events may still be there, and verify accepts
both). Running the same command again resumes: an existing FILE is read back and checked,
and its runs are archived or their deletions finished; an existing FILE is never
overwritten.

`restore` checks a file the same way, then checks each run against its `Archived`
event (same file SHA-256, same number of events, the same head hash and digest of
stream heads) and, in one transaction, puts the events back at their positions with
their hashes, removes the `Archived` events and projects the restored runs: the ledger
is again what it was before the archive, heads included.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from . import states as S
from .archived import Archived, archived_record
from .commands import args as A
from .domain import bounded_summary, run_stream_id
from .errors import IllegalTransition, InvalidInput, NotAuthorized, RunNotFound
from .stores import hashchain as hc
from .stores.raw import (
    RawEvent,
    append_raw,
    delete_stream_events,
    occupied_positions,
    read_stream_events,
    stream_heads,
)
from .transfer import ImportRefused, _lines, check_file, export, parse_event
from .views import Actor

DELETE_BATCH = 5000  # events per deleting transaction
Checkpoint = Callable[[str], None]


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


def _quiet(_point: str) -> None:
    return None


# --------------------------------------------------------------------------
# archive
# --------------------------------------------------------------------------
def archive(
    lg: Any,
    actor: Actor,
    to: str | Path,
    terminal_before: datetime | None = None,
    runs: list[str] | None = None,
    reason: str | None = None,
    checkpoint: Checkpoint = _quiet,
    delete_batch: int = DELETE_BATCH,
) -> ArchiveSummary:
    """Move the events of runs terminal since before `terminal_before` (and/or the `runs`
    named) into the archive file `to`, leaving one `Archived` event per run. Resumes an
    interrupted archive when `to` exists (see the module's docstring)."""
    if not isinstance(actor, Actor):
        raise InvalidInput("actor must be an Actor")
    if actor.role != S.OPERATOR:
        raise NotAuthorized(f"role {actor.role!r} may not archive runs; allowed: operator")
    path = _file_arg(to, "to")
    if path.exists() and not path.is_file():
        raise InvalidInput(f"to {str(path)!r} exists and is not a file: name an archive file")
    runs = _run_ids_arg(runs)
    reason = A.reason(reason)
    if terminal_before is None and not runs:
        raise InvalidInput("name the runs to archive: terminal_before, or runs")
    if terminal_before is not None:
        if not isinstance(terminal_before, datetime) or terminal_before.tzinfo is None:
            raise InvalidInput("terminal_before must be an aware datetime")
        with lg.store.read() as tx:
            now = tx.now()
        if terminal_before > now:
            raise InvalidInput(
                f"terminal_before {terminal_before.isoformat()} is later than the store's clock "
                f"({now.isoformat()}): only runs terminal in the past can be archived"
            )
    resumed: list[str] = []
    if not path.exists():
        chosen = _choose(lg, terminal_before, runs)
        if not chosen:
            return ArchiveSummary(archive=str(path))
        _write_verified(lg, path, chosen, checkpoint)
    sha = file_sha256(path)
    with open(path, encoding="utf-8") as f:
        check = check_file(f)
    parts = runs_of_file(path)
    digest = check.chains.digest()
    archived_now: list[str] = []
    moved = 0
    for run_id in sorted(parts):
        part = parts[run_id]
        record = _archived(lg, part.stream)
        if record is None:
            _archive_run(lg, part, path, sha, digest, actor, reason)
            checkpoint("archived")
            archived_now.append(run_id)
        elif record.get("archive_sha256") != sha:
            raise InvalidInput(
                f"run {run_id} was archived to another file ({record.get('archive')!r}); "
                f"{str(path)!r} is not its archive"
            )
        gone = _delete_archived(lg, part, checkpoint, delete_batch)
        if record is not None and gone:
            resumed.append(run_id)  # an interrupted archive of this run, finished now
        moved += gone
    return ArchiveSummary(
        archive=str(path),
        runs=archived_now,
        events=moved,
        resumed=resumed,
        sha256=sha,
        digest=digest,
    )


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


def _run_ids_arg(value: Any) -> list[str] | None:
    """`runs`: None, or a list of run ids (UUID strings)."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise InvalidInput(f"runs must be a list of run ids, got {type(value).__name__}")
    out = []
    for run_id in value:
        if not isinstance(run_id, str):
            raise InvalidInput(f"runs must hold run ids (strings), got {type(run_id).__name__}")
        out.append(A.run_id(run_id))
    return out


def _choose(lg: Any, before: datetime | None, named: list[str] | None) -> list[str]:
    """The runs to archive now; typed errors for named runs that cannot be."""
    from projections.rows import iso

    terminal = sorted(S.TERMINAL_RUN_STATES)
    marks = ", ".join("?" for _ in terminal)
    chosen: list[str] = []
    with lg.store.read() as tx:
        if named:
            for run_id in named:
                try:
                    rid = str(UUID(run_id))
                except ValueError:
                    raise InvalidInput(f"run id {run_id!r} is not a run id (a UUID)") from None
                row = tx.fetchone("SELECT state, stopped_at FROM lg_runs WHERE run_id = ?", (rid,))
                if row is None:
                    raise RunNotFound(run_id)
                if row["state"] not in S.TERMINAL_RUN_STATES:
                    raise IllegalTransition(
                        f"run {rid} is {row['state']}: only terminal runs are archived",
                        row["state"],
                        terminal,
                    )
                if before is not None and (row["stopped_at"] or "") >= (iso(before) or ""):
                    raise InvalidInput(
                        f"run {rid} stopped at {row['stopped_at']}, not before {before.isoformat()}"
                    )
                if _archived_tx(tx, run_stream_id(rid)) is not None:
                    raise InvalidInput(f"run {rid} is archived already")
                chosen.append(rid)
            return chosen
        assert before is not None
        rows = tx.fetchall(
            f"SELECT run_id FROM lg_runs WHERE state IN ({marks}) AND stopped_at < ? ORDER BY seq",  # noqa: S608 (our own table/column names; values are bound parameters)
            [*terminal, iso(before)],
        )
        for r in rows:
            if _archived_tx(tx, run_stream_id(r["run_id"])) is None:
                chosen.append(r["run_id"])
    return chosen


def _write_verified(lg: Any, path: Path, runs: list[str], checkpoint: Checkpoint) -> None:
    """Export the runs to `path` through a `.partial` file that is on disk and checked
    before it takes the final name."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as out:
        export(lg, out, runs=runs, progress=lambda _done, _total: checkpoint("exporting"))
        out.flush()
        os.fsync(out.fileno())
    checkpoint("exported")
    with open(partial, encoding="utf-8") as f:
        check_file(f)  # the bytes on disk check out, or nothing goes further
    os.replace(partial, path)
    _fsync_dir(path.parent)
    checkpoint("renamed")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        for n, doc in _lines(f):
            if isinstance(doc, dict) and "end" in doc:
                break
            e = parse_event(doc, n)
            part = owner.get(e.stream)
            if part is None:
                run_id = _run_id_of(e)
                if run_id is None:
                    raise ImportRefused(
                        f"line {n}, position {e.position}: the first event of stream {e.stream} "
                        "does not name its run",
                        line=n,
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


def _archived_tx(tx: Any, stream: UUID) -> dict[str, Any] | None:
    heads = stream_heads(tx, [stream])
    if stream not in heads:
        return None
    version = heads[stream][0]
    for e in read_stream_events(tx, stream, since_version=version):
        return archived_record(e.topic, e.state)
    return None


def _archived(lg: Any, stream: UUID) -> dict[str, Any] | None:
    """The record of the run's `Archived` event, if its stream ends with one."""
    with lg.store.read() as tx:
        return _archived_tx(tx, stream)


def archived_run(lg: Any, run_id: str) -> dict[str, Any] | None:
    """The record of an archived run's `Archived` event; None when it is not archived."""
    try:
        stream = run_stream_id(run_id)
    except (ValueError, TypeError, AttributeError):
        raise InvalidInput(f"run id {run_id!r} is not a run id (a UUID)") from None
    return _archived(lg, stream)


def _archive_run(
    lg: Any,
    part: RunPart,
    path: Path,
    sha: str,
    digest: str,
    actor: Actor,
    reason: str | None,
) -> None:
    """Append and project the run's `Archived` event, in one transaction, once the store's
    heads of the run's streams are the file's."""
    from projections.rebuild import Replayer

    with lg.store.write() as tx:
        held = stream_heads(tx, list(part.streams))
        for oid, (version, hx) in part.streams.items():
            if held.get(oid) != (version, hx):
                raise ImportRefused(
                    f"run {part.run_id}: stream {oid} is at {held.get(oid)} in the store but "
                    f"{(version, hx)} in {str(path)!r}: the file is not this run's archive"
                )
        row = tx.fetchone("SELECT * FROM lg_runs WHERE run_id = ?", (part.run_id,))
        if row is None:
            raise RunNotFound(part.run_id)
        version, head_hash = part.streams[part.stream]
        note = (
            f"archived: {part.events} events in {path.name} (sha256 {sha[:12]}); {row['summary']}"
        )
        row = {**row, "revision": version + 1, "summary": bounded_summary(note)}
        row.pop("db_now", None)
        event = Archived(
            originator_id=part.stream,
            originator_version=version + 1,
            timestamp=tx.now(),
            run_id=part.run_id,
            head_hash=head_hash,
            events=part.events,
            streams=len(part.streams),
            streams_digest=part.digest(),
            archive=str(path),
            archive_sha256=sha,
            archive_digest=digest,
            row=dict(row),
            actor_id=actor.id,
            role=actor.role,
            reason=reason,
        )
        [(position, _e)] = tx.append([event])
        Replayer("").apply(tx, [(position, event)])


def _delete_archived(lg: Any, part: RunPart, checkpoint: Checkpoint, limit: int) -> int:
    """Delete the run's events that are in the archive, whole streams at a time, a few
    thousand events per transaction; returns how many went."""
    deleted = 0
    batch: list[tuple[UUID, int]] = []
    size = 0
    items = [(oid, v) for oid, (v, _h) in part.streams.items() if oid != part.stream]
    # the run's own stream last: until it goes, the run's chain is whole in the store
    for oid, version in [*sorted(items), (part.stream, part.streams[part.stream][0])]:
        batch.append((oid, version))
        size += version
        if size >= limit:
            deleted += _delete_batch(lg, batch)
            checkpoint("deleted")
            batch, size = [], 0
    if batch:
        deleted += _delete_batch(lg, batch)
        checkpoint("deleted")
    return deleted


def _delete_batch(lg: Any, batch: list[tuple[UUID, int]]) -> int:
    with lg.store.write() as tx:
        return delete_stream_events(tx, batch)


# --------------------------------------------------------------------------
# restore
# --------------------------------------------------------------------------
def restore(lg: Any, actor: Actor, source: str | Path) -> ArchiveSummary:
    """Bring the archived runs of a verified archive file back (see the module's docstring)."""
    from projections.rebuild import Replayer

    if not isinstance(actor, Actor):
        raise InvalidInput("actor must be an Actor")
    if actor.role != S.OPERATOR:
        raise NotAuthorized(f"role {actor.role!r} may not restore runs; allowed: operator")
    path = _file_arg(source, "source")
    if not path.is_file():
        raise InvalidInput(f"cannot read archive file {str(path)!r}")
    with open(path, encoding="utf-8") as f:
        check = check_file(f)
    sha = file_sha256(path)
    parts = runs_of_file(path)
    restoring: dict[str, dict[str, Any]] = {}
    with lg.store.read() as tx:
        for run_id, part in sorted(parts.items()):
            record = _archived_tx(tx, part.stream)
            if record is None:
                held = stream_heads(tx, list(part.streams))
                if all(held.get(o) == h for o, h in part.streams.items()):
                    continue  # restored already: the store holds exactly these events
                raise ImportRefused(
                    f"run {run_id} is not archived in this ledger, and holds other events"
                )
            _check_record(run_id, record, part, sha, path)
            restoring[run_id] = record
    if not restoring:
        return ArchiveSummary(archive=str(path), sha256=sha, digest=check.chains.digest())
    streams = {oid for r in restoring for oid in parts[r].streams}
    restored = 0
    with lg.store.write() as tx:
        links = _links_to_keep(tx, restoring)
        held = stream_heads(tx, list(streams))
        for run_id in restoring:
            stream = parts[run_id].stream
            version = held[stream][0]  # the Archived event
            delete_stream_events(tx, [(stream, version)], from_version=version)
            tx.execute("DELETE FROM lg_runs WHERE run_id = ?", (run_id,))
        # what is left of the runs' streams (a crash during the archive may have left some)
        held = stream_heads(tx, list(streams))
        replayer = Replayer("")
        page: list[RawEvent] = []

        def flush() -> None:
            nonlocal restored
            todo = [e for e in page if e.version > (held.get(e.stream) or (0, None))[0]]
            keep = not occupied_positions(tx, [e.position for e in todo])
            positions = append_raw(tx, todo, keep_positions=keep, reuse_free=keep)
            decode = lg.store.mapper.to_domain_event
            from eventsourcing.persistence import StoredEvent

            replayer.apply(
                tx,
                [
                    (p, decode(StoredEvent(e.stream, e.version, e.topic, e.state)))
                    for p, e in zip(positions, todo, strict=True)
                ],
            )
            restored += len(todo)
            page.clear()

        with open(path, encoding="utf-8") as f:
            for n, doc in _lines(f):
                if isinstance(doc, dict) and "end" in doc:
                    break
                e = parse_event(doc, n)
                if e.stream in streams:
                    page.append(e)
                if len(page) >= 2000:
                    flush()
        flush()
        for run_id, value in links.items():
            tx.execute("UPDATE lg_runs SET links = ? WHERE run_id = ?", (value, run_id))
    return ArchiveSummary(
        archive=str(path),
        runs=sorted(restoring),
        events=restored,
        sha256=sha,
        digest=check.chains.digest(),
    )


def _check_record(run_id: str, record: dict[str, Any], part: RunPart, sha: str, path: Path) -> None:
    """The file holds exactly the events that left with this `Archived` event."""
    if record.get("archive_sha256") != sha:
        raise ImportRefused(
            f"run {run_id} was archived to {record.get('archive')!r} (sha256 "
            f"{record.get('archive_sha256')}), not to {str(path)!r} (sha256 {sha})"
        )
    _version, hx = part.streams[part.stream]
    if (
        record.get("head_hash") != hx
        or record.get("events") != part.events
        or record.get("streams_digest") != part.digest()
    ):
        raise ImportRefused(
            f"run {run_id}: the events in {str(path)!r} are not the ones that left the store "
            "(head hash, event count or stream heads differ from its Archived event)"
        )


def _links_to_keep(tx: Any, restoring: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The links of the runs restored and of the runs they link to, as the store has them
    now: replaying a restored run's submit would add its reverse link to the linked run
    again, and the restored run's own row holds links added while it was archived."""
    out: dict[str, str] = {}
    for run_id in restoring:
        row = tx.fetchone("SELECT links FROM lg_runs WHERE run_id = ?", (run_id,))
        if row is None:
            continue
        out[run_id] = row["links"]
        for link in json.loads(row["links"]):
            other = tx.fetchone("SELECT links FROM lg_runs WHERE run_id = ?", (link["run_id"],))
            if other is not None and link["run_id"] not in restoring:
                out[link["run_id"]] = other["links"]
    return out
