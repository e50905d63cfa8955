"""`restore`: archived runs come back from their verified archive file.

It checks the file as an import does (every hash chain and the closing line,
ledger/transfer/history_file.py), then checks each run against its `Archived` event (same file
SHA-256, same number of events, the same head hash and digest of stream heads) and, in
one transaction, puts the events back at their positions with their hashes, removes the
`Archived` events and projects the restored runs: the ledger is again what it was before
the archive, heads included. A run restored already is left as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledger.core import states as S
from ledger.core.domain import run_stream_id
from ledger.core.errors import IllegalTransition, InvalidInput, NotAuthorized
from ledger.core.rows import parse_dt
from ledger.core.views import Actor
from ledger.stores.raw import (
    RawEvent,
    append_raw,
    delete_stream_events,
    last_event,
    occupied_positions,
    stream_heads,
)
from ledger.stores.tree import restored as restored_leaves
from ledger.transfer.archive_file import (
    ArchiveSummary,
    RunPart,
    _archived_tx,
    _file_arg,
    file_sha256,
    runs_of_file,
)
from ledger.transfer.history_file import EventReader, ImportRefused, check_file
from ledger.transfer.imports import rule_guard
from ledger.transfer.sql import SQL

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger
    from ledger.stores.base import Tx


def restore(lg: Ledger, actor: Actor, source: str | Path) -> ArchiveSummary:
    """Bring the archived runs of a verified archive file back (see the module's docstring)."""
    from ledger.projections.rebuild import Replayer

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
    with open(path, encoding="utf-8") as f:
        lowest = min((e.position for e in EventReader(f) if e.stream in streams), default=0)
    restored = 0
    with lg.store.write() as tx:
        _refuse_if_readers_missed(tx, restoring, lowest)
        links = _links_to_keep(tx, restoring)
        held = stream_heads(tx, list(streams))
        for run_id in restoring:
            stream = parts[run_id].stream
            version = held[stream][0]  # the Archived event
            delete_stream_events(tx, [(stream, version)], from_version=version)
            tx.execute(SQL.sql(tx, "forget_run"), (run_id,))
        # what is left of the runs' streams (a crash during the archive may have left some)
        held = stream_heads(tx, list(streams))
        # restored events pass the rule checker as imported ones do (the file was checked
        # against its Archived events; this checks what the events say)
        replayer = Replayer("", observer=rule_guard("nothing restored"))
        page: list[RawEvent] = []

        def flush() -> None:
            nonlocal restored
            todo = [e for e in page if e.version > (held.get(e.stream) or (0, None))[0]]
            keep = not occupied_positions(tx, [e.position for e in todo])
            wrong = restored_leaves(
                tx,
                [(e.position, e.stream, e.version, e.topic, e.state, e.hash) for e in todo],
                keep,
            )
            if wrong:
                raise ImportRefused(wrong)
            decode = lg.store.decode
            from eventsourcing.persistence import StoredEvent

            decoded = [decode(StoredEvent(e.stream, e.version, e.topic, e.state)) for e in todo]
            positions = append_raw(tx, todo, keep_positions=keep, reuse_free=keep, decoded=decoded)
            replayer.apply(tx, list(zip(positions, decoded, strict=True)))
            restored += len(todo)
            page.clear()

        with open(path, encoding="utf-8") as f:
            # read as check_file read it: a file changed since is refused, nothing written
            for e in EventReader(f):
                if e.stream in streams:
                    page.append(e)
                if len(page) >= 2000:
                    flush()
        flush()
        for run_id, value in links.items():
            tx.execute(SQL.sql(tx, "set_run_links"), (value, run_id))
    return ArchiveSummary(
        archive=str(path),
        runs=sorted(restoring),
        events=restored,
        sha256=sha,
        digest=check.chains.digest(),
    )


def _refuse_if_readers_missed(tx: Tx, restoring: dict[str, dict[str, Any]], lowest: int) -> None:
    """The restored events go back at their positions, behind every reader already past
    them (rule 18 of the rule book: a reader never sees a position appear behind one it
    read). A reader that handled them before they left (it existed when they were
    archived, and the archive did not leave it behind) misses nothing; any other reader
    past `lowest` would never see them: IllegalTransition naming those readers."""
    missed: list[str] = []
    for row in tx.fetchall(SQL.sql(tx, "followers_at_or_past"), (lowest,)):
        name, only = row["name"], row["run_id"]
        created = parse_dt(row["created_at"])
        for run_id, record in restoring.items():
            if only and only != run_id:
                continue  # it reads another run's transitions only
            archived_at = parse_dt(record.get("archived_at"))
            reason = _archive_reason(tx, run_id)
            left_behind = f"followers: {name} (at " in reason or f", {name} (at " in reason
            if created is None or archived_at is None or created >= archived_at or left_behind:
                missed.append(f"{name} (at {row['position']})")
                break
    if missed:
        raise IllegalTransition(
            f"readers of the change feed passed position {lowest} without seeing the events "
            f"to restore: {', '.join(missed)}; restored behind them, they would never see "
            "them. Move their checkpoints back before position "
            f"{lowest} (`ledger followers reset`), or remove them, then restore",
            "restorable",
            ["no reader past the restored positions missed them"],
        )


def _archive_reason(tx: Tx, run_id: str) -> str:
    """The reason recorded with the run's `Archived` event ("" when none)."""
    stream = run_stream_id(run_id)
    last = last_event(tx, stream)
    if last is None:
        return ""
    try:
        reason = json.loads(last.state).get("reason")
    except (ValueError, AttributeError):
        return ""
    return reason if isinstance(reason, str) else ""


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


def _links_to_keep(tx: Tx, restoring: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The links of the runs restored and of the runs they link to, as the store has them
    now: replaying a restored run's submit would add its reverse link to the linked run
    again, and the restored run's own row holds links added while it was archived."""
    out: dict[str, str] = {}
    for run_id in restoring:
        row = tx.fetchone(SQL.sql(tx, "run_links"), (run_id,))
        if row is None:
            continue
        out[run_id] = row["links"]
        for link in json.loads(row["links"]):
            other = tx.fetchone(SQL.sql(tx, "run_links"), (link["run_id"],))
            if other is not None and link["run_id"] not in restoring:
                out[link["run_id"]] = other["links"]
    return out


__all__ = ["restore"]
