"""Export: a ledger's history (or some runs' of it) as a file of JSON lines.

The file's format, its hash chains and the check of a whole file are in
`ledger/transfer/history_file.py`. Exporting checks the store's own chains as it writes
(`ExportRefused`). Events are read a page (`PAGE`) at a time: memory grows with the
number of streams (their heads), never with the number of events.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any
from uuid import UUID

from ledger.core.domain import item_stream_id, run_stream_id
from ledger.core.errors import InvalidInput, LedgerError, RunNotFound
from ledger.stores.raw import (
    RawEvent,
    max_position,
    next_position,
    read_raw,
)
from ledger.transfer.history_file import (
    PAGE,
    Chains,
    Progress,
    event_line,
    event_time,
)
from ledger.transfer.sql import SQL

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger
    from ledger.stores.base import Tx


class ExportRefused(LedgerError):
    """The store's own events do not check out (an edited or missing event): an export
    would carry a broken record, so none is written. `ledger verify` says more."""


@dataclass(frozen=True)
class TransferSummary:
    """What an export or an import did."""

    events: int  # events written (export) or appended (import)
    streams: int
    digest: str  # heads digest of the streams in the file
    skipped: int = 0  # import: events the target already held (identical)
    runs: list[str] = field(default_factory=list)  # import: runs whose events were appended
    verify_ok: bool | None = None  # import: the target's verify afterwards (None: not run)
    problems: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "streams": self.streams,
            "digest": self.digest,
            "skipped": self.skipped,
            "runs": self.runs,
            "verify_ok": self.verify_ok,
            "problems": self.problems,
        }


def streams_of_runs(lg: Ledger, run_ids: Iterable[str]) -> set[UUID]:
    """The stream ids holding the given runs' events (the run's and each item's)."""
    out: set[UUID] = set()
    with lg.store.read() as tx:
        for run_id in run_ids:
            try:
                stream = run_stream_id(run_id)
            except ValueError:
                raise InvalidInput(f"run id {run_id!r} is not a run id (a UUID)") from None
            if not tx.fetchone(SQL.sql(tx, "run_exists"), (str(stream),)):
                raise RunNotFound(run_id)
            out.add(stream)
            for r in tx.fetchall(SQL.sql(tx, "item_ids"), (str(stream),)):
                out.add(item_stream_id(str(stream), r["item_id"]))
    return out


def iter_events(
    lg: Ledger, streams: set[UUID] | None = None, upto: int | None = None, after: int = 0
) -> Iterator[tuple[RawEvent, int]]:
    """Stored events in position order (of `streams` only, when given), a page per read
    transaction, up to the highest position when it starts; with the total to expect."""
    with lg.store.read() as tx:
        bound = tx.readable_position()  # PostgreSQL: never past what a writer may fill in
        top = max_position(tx) if upto is None else upto
        if bound is not None:
            top = min(top, bound)
        total = _count(tx, after, top)
    while after < top:
        # a page is a range of positions, not "the next PAGE after": a range the planner
        # sees as small is read by index whatever its statistics say (see read_raw)
        last = min(top, after + PAGE)
        with lg.store.read() as tx:
            page = read_raw(tx, after, PAGE, last)
            if not page:  # a gap in the positions (rolled-back or reserved ones)
                found = next_position(tx, last, top)
                if found is None:
                    return
                after = found - 1
                continue
        for e in page:
            if streams is None or e.stream in streams:
                yield e, total
        after = last


def _count(tx: Tx, after: int, upto: int) -> int:
    row = tx.fetchone(SQL.sql(tx, "events_between"), (after, upto))
    return int(row["n"]) if row else 0


def export(
    lg: Ledger,
    out: IO[str],
    runs: Iterable[str] | None = None,
    since: datetime | None = None,
    progress: Progress | None = None,
) -> TransferSummary:
    """Write the ledger's events (of `runs` only, recorded at or after `since` only, when
    given) to `out` as history lines plus the closing line. Each event's hash is checked
    as it goes: a broken chain raises ExportRefused, and what was written is not a valid
    file (it has no closing line)."""
    run_list = list(runs) if runs is not None else None
    if since is not None and (not isinstance(since, datetime) or since.tzinfo is None):
        raise InvalidInput("since must be an aware datetime")
    streams = streams_of_runs(lg, run_list) if run_list else None
    chains = Chains()
    done = 0
    for e, total in iter_events(lg, streams):
        done += 1
        if progress is not None and done % PAGE == 0:
            progress(done, total)
        if since is not None:
            at = event_time(e)
            if at is not None and at < since:
                continue
        problem = chains.add(e)
        if problem is not None:
            raise ExportRefused(f"the store's event at position {e.position}: {problem}")
        out.write(event_line(e) + "\n")
    if progress is not None:
        progress(done, done)
    complete = run_list is None and since is None
    out.write(json.dumps(chains.closing(complete), separators=(",", ":")) + "\n")
    out.flush()
    return TransferSummary(events=chains.events, streams=len(chains.heads), digest=chains.digest())


__all__ = ["ExportRefused", "TransferSummary", "export", "iter_events", "streams_of_runs"]
