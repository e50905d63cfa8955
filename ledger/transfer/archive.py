"""Verifiable archival: runs terminal since before a date leave the store for a verified
archive file, and come back from it.

`archive` (operator role):

1. picks the runs (terminal, stopped before DATE, not archived yet; or the runs named),
2. exports their events to `FILE.partial` (ledger/transfer/imports.py), flushes it to disk, reads
   it back and checks every hash chain and its closing line, and only then renames it to
   FILE,
3. for each run, in one transaction: checks that the store still holds exactly the
   events the file holds (stream heads equal), appends one `Archived` event to the run's
   stream (ledger/core/archived.py: the file's SHA-256 and digest, the number of events, the
   run's head hash, the run's projection row) and projects it: the run's item, attempt
   and transition rows go, its run row stays,
4. deletes the run's other events and their hashes, a few thousand events per short
   transaction (no long lock on PostgreSQL).

A crash anywhere leaves either the old events (before 3), or a verified FILE plus the
`Archived` event (after 3; some old events may still be there, and verify accepts
both). Running the same command again resumes: an existing FILE is read back and checked,
and its runs are archived or their deletions finished; an existing FILE is never
overwritten.

`restore` (ledger/transfer/restore.py, importable from here) checks a file the same way, then
checks each run against its `Archived` event (same file SHA-256, same number of events,
the same head hash and digest of stream heads) and, in one transaction, puts the events
back at their positions with their hashes, removes the `Archived` events and projects
the restored runs: the ledger is again what it was before the archive, heads included.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from ledger.core import args as A
from ledger.core import states as S
from ledger.core.archived import Archived
from ledger.core.domain import bounded_summary, run_stream_id
from ledger.core.errors import IllegalTransition, InvalidInput, NotAuthorized, RunNotFound
from ledger.core.views import Actor
from ledger.stores.raw import delete_stream_events, stream_heads
from ledger.transfer.archive_file import (
    ArchiveSummary,
    RunPart,
    _archived,
    _archived_tx,
    _file_arg,
    archived_run,
    file_sha256,
    runs_of_file,
)
from ledger.transfer.exports import export
from ledger.transfer.history_file import ImportRefused, check_file
from ledger.transfer.restore import restore
from ledger.transfer.sql import SQL

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

DELETE_BATCH = 5000  # events per deleting transaction
Checkpoint = Callable[[str], None]


def _quiet(_point: str) -> None:
    return None


# --------------------------------------------------------------------------
# archive
# --------------------------------------------------------------------------
def archive(
    lg: Ledger,
    actor: Actor,
    to: str | Path,
    terminal_before: datetime | None = None,
    runs: list[str] | None = None,
    reason: str | None = None,
    checkpoint: Checkpoint = _quiet,
    delete_batch: int = DELETE_BATCH,
    force: bool = False,
) -> ArchiveSummary:
    """Move the events of runs terminal since before `terminal_before` (and/or the `runs`
    named) into the archive file `to`, leaving one `Archived` event per run. Resumes an
    interrupted archive when `to` exists (see the module's docstring).

    Refused (`IllegalTransition`, naming them) while a follower or webhook has not passed
    the runs' last transitions: it would never see them. `force` with a `reason` archives
    anyway, and the reason, with the followers left behind, is recorded in each run's
    `Archived` event."""
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
        behind = readers_behind(lg, chosen)
        if behind:
            names = ", ".join(f"{name} (at {pos})" for name, pos in behind)
            if not force:
                raise IllegalTransition(
                    f"followers have not passed the transitions of the runs to archive: "
                    f"{names}; archiving now would take events from under them (let them "
                    "catch up, or archive with force and a reason)",
                    "archivable",
                    ["followers caught up"],
                )
            if reason is None:
                raise InvalidInput(f"an archive past followers ({names}) needs a reason")
            reason = f"{reason} (archived past followers: {names})"
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


def readers_behind(lg: Ledger, run_ids: list[str]) -> list[tuple[str, int]]:
    """The followers (webhooks included) whose checkpoint is below the last transition of
    any of `run_ids`, with their positions."""
    with lg.store.read() as tx:
        last = 0
        for run_id in run_ids:
            row = tx.fetchone(SQL.sql(tx, "last_transition_of_run"), (run_id,))
            if row is not None and row["p"] is not None:
                last = max(last, int(row["p"]))
        if not last:
            return []
        rows = tx.fetchall(SQL.sql(tx, "followers_behind"), (last,))
    return [(r["name"], int(r["position"])) for r in rows]


def _choose(lg: Ledger, before: datetime | None, named: list[str] | None) -> list[str]:
    """The runs to archive now; typed errors for named runs that cannot be."""
    from ledger.core.rows import iso

    terminal = sorted(S.TERMINAL_RUN_STATES)
    chosen: list[str] = []
    with lg.store.read() as tx:
        if named:
            for run_id in named:
                try:
                    rid = str(UUID(run_id))
                except ValueError:
                    raise InvalidInput(f"run id {run_id!r} is not a run id (a UUID)") from None
                row = tx.fetchone(SQL.sql(tx, "run_state"), (rid,))
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
        rows = tx.fetchall(SQL.sql(tx, "terminal_runs_stopped_before"), (iso(before),))
        for r in rows:
            if _archived_tx(tx, run_stream_id(r["run_id"])) is None:
                chosen.append(r["run_id"])
    return chosen


def _write_verified(lg: Ledger, path: Path, runs: list[str], checkpoint: Checkpoint) -> None:
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


def _archive_run(
    lg: Ledger,
    part: RunPart,
    path: Path,
    sha: str,
    digest: str,
    actor: Actor,
    reason: str | None,
) -> None:
    """Append and project the run's `Archived` event, in one transaction, once the store's
    heads of the run's streams are the file's."""
    from ledger.projections.rebuild import Replayer

    with lg.store.write() as tx:
        held = stream_heads(tx, list(part.streams))
        for oid, (version, hx) in part.streams.items():
            if held.get(oid) != (version, hx):
                raise ImportRefused(
                    f"run {part.run_id}: stream {oid} is at {held.get(oid)} in the store but "
                    f"{(version, hx)} in {str(path)!r}: the file is not this run's archive"
                )
        row = tx.fetchone(SQL.sql(tx, "run"), (part.run_id,))
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


def _delete_archived(lg: Ledger, part: RunPart, checkpoint: Checkpoint, limit: int) -> int:
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


def _delete_batch(lg: Ledger, batch: list[tuple[UUID, int]]) -> int:
    with lg.store.write() as tx:
        return delete_stream_events(tx, batch)


__all__ = [
    "DELETE_BATCH",
    "ArchiveSummary",
    "Checkpoint",
    "RunPart",
    "archive",
    "archived_run",
    "file_sha256",
    "restore",
    "runs_of_file",
]
