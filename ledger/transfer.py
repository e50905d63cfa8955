"""Export, import and copy: a ledger's history as a file of JSON lines, and back.

The file's format, its hash chains and the check of a whole file are in
`ledger/history_file.py` (the names are importable from here too). Exporting checks the
store's own chains as it writes (`ExportRefused`). Importing checks the file first, then
appends the events with their hashes in one transaction of the target and projects them
there with the rebuild's `Replayer`; streams the target already holds must be the same
events (compared by hash), which makes importing a file twice a no-op.

Memory grows with the number of streams in the file (about 150 bytes each: the heads),
never with the number of events: events are read and written a page at a time
(`PAGE` for an export, `IMPORT_PAGE` for an import).
"""

from __future__ import annotations

import io
import json
import mmap
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, cast
from uuid import UUID

from .domain import item_stream_id, run_stream_id
from .errors import InvalidInput, LedgerError, RunNotFound
from .history_file import (
    FORMAT,
    PAGE,
    Chains,
    EventReader,
    FileCheck,
    ImportRefused,
    Progress,
    archived_seed,
    check_file,
    event_line,
    event_time,
    parse_event,
)
from .stores import hashchain as hc
from .stores.raw import (
    RawEvent,
    append_raw,
    max_position,
    next_position,
    read_raw,
    reserve_positions,
    stream_heads,
)
from .validation import stored_payload_problem

# events an import appends and projects at a time. PostgreSQL writes a page while the
# client reads, checks and projects the next (the transaction is pipelined), so the last
# page's server work is the only part not overlapped: measured on 50,000 events
# (2026-12-02, schema v11), pages of 2,000 took 1.63-1.74 s against 1.86-1.99 s for
# 10,000 (and 1.58 s for 1,000, 2.0 s for 500), with the same server CPU (1.36-1.44 s):
# folding an item's claim and accept into one row update, which larger pages do more
# often, saves less than the longer tail costs. Memory stays bounded by the page.
IMPORT_PAGE = 2_000


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


# --------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------
def streams_of_runs(lg: Any, run_ids: Iterable[str]) -> set[UUID]:
    """The stream ids holding the given runs' events (the run's and each item's)."""
    out: set[UUID] = set()
    with lg.store.read() as tx:
        for run_id in run_ids:
            try:
                stream = run_stream_id(run_id)
            except ValueError:
                raise InvalidInput(f"run id {run_id!r} is not a run id (a UUID)") from None
            if not tx.fetchone("SELECT 1 AS x FROM lg_runs WHERE run_id = ?", (str(stream),)):
                raise RunNotFound(run_id)
            out.add(stream)
            for r in tx.fetchall("SELECT item_id FROM lg_items WHERE run_id = ?", (str(stream),)):
                out.add(item_stream_id(str(stream), r["item_id"]))
    return out


def iter_events(
    lg: Any, streams: set[UUID] | None = None, upto: int | None = None, after: int = 0
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


def _count(tx: Any, after: int, upto: int) -> int:
    from .stores.raw import position_sql

    pos = position_sql(tx)
    row = tx.fetchone(
        f"SELECT COUNT(*) AS n FROM {tx.store.events_table()} WHERE {pos} > ? AND {pos} <= ?",  # noqa: S608 (our own table/column names; values are bound parameters)
        (after, upto),
    )
    return int(row["n"]) if row else 0


def export(
    lg: Any,
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


# --------------------------------------------------------------------------
# import
# --------------------------------------------------------------------------
@contextmanager
def _opened(source: str | Path | IO[str]) -> Iterator[IO[str]]:
    if isinstance(source, (str, Path)):
        try:
            with open(source, encoding="utf-8") as f:
                yield f
        except OSError as e:
            raise InvalidInput(f"cannot read history file {str(source)!r}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ImportRefused(f"history file {str(source)!r} is not UTF-8") from None
        return
    yield source


def import_file(
    lg: Any,
    source: str | Path | IO[str],
    progress: Progress | None = None,
    verify: bool = True,
    total: int | None = None,
) -> TransferSummary:
    """Import a history file into `lg`: check it, append its events with their hashes and
    project them, in one transaction; then `verify` the ledger (unless verify=False).

    The file is read once: each event is checked (its chain, then against the target)
    before it is appended, the closing line at the end, and anything wrong rolls the
    whole transaction back. Refused with ImportRefused, nothing written: a file that does
    not check out, a stream the target holds with other events, a stream that continues
    one the target does not hold. Events the target already holds (same stream, version
    and hash) are skipped, so a second import of the same file changes nothing."""
    from projections.rebuild import fewer_collections

    with _opened(source) as f:
        if total is None and progress is not None and isinstance(source, (str, Path)):
            total = _count_lines(Path(source)) - 1  # for the progress bar: less the closing line
        # many long-lived objects (the heads, the replayer's cache) and a churn of short
        # ones: the default thresholds ran a full collection over them every few thousand
        # events (measured: a sixth of the client's time, nothing collected)
        with fewer_collections():
            summary = _append_file(lg, f, progress, max(total or 0, 0), _last_position(f))
    if verify:
        report = lg.verify()
        summary = TransferSummary(
            events=summary.events,
            streams=summary.streams,
            digest=summary.digest,
            skipped=summary.skipped,
            runs=summary.runs,
            verify_ok=report.ok,
            problems=report.problems,
        )
    return summary


class _Target:
    """The target's side of an import: which events of the file it holds already."""

    def __init__(self, tx: Any, chains: Chains) -> None:
        self.tx = tx
        self.chains = chains
        self.held: dict[UUID, tuple[int, str | None]] = {}
        self.known: set[UUID] = set()
        self.empty = False  # the target held no event when the import began

    def new_events(self, batch: list[RawEvent]) -> list[RawEvent]:
        """The batch's events the target lacks. The ones it holds must have the same hash,
        and a stream the file takes up in the middle must continue the target's chain."""
        if self.empty and not self.chains.open:
            return batch  # nothing held, and every stream starts in the file
        fresh = list(dict.fromkeys(e.stream for e in batch if e.stream not in self.known))
        if not self.empty:
            self.held.update(stream_heads(self.tx, fresh))
        self.known.update(fresh)
        for e in batch:
            if self.chains.open.get(e.stream) is e:
                self._check_continues(e)
        return _new_events(self.tx, batch, self.held)

    def _check_continues(self, e: RawEvent) -> None:
        have = self.held.get(e.stream)
        if have is None or have[0] < e.version - 1:
            raise ImportRefused(
                f"position {e.position}: stream {e.stream} starts at version {e.version} in the "
                f"file, but this ledger holds {have[0] if have else 'none'} of its earlier "
                "versions",
                position=e.position,
            )
        if (
            have[0] == e.version - 1
            and have[1] is not None
            and hc.event_hash(have[1], e.stream, e.version, e.topic, e.state) != e.hash
        ):
            raise ImportRefused(
                f"position {e.position}: version {e.version} of stream {e.stream} does not "
                "continue the chain this ledger holds for it",
                position=e.position,
            )


def _last_position(f: IO[str]) -> int | None:
    """The position of a history file's last event (the line before the closing line),
    read from the end of the file without reading the rest; None when the file cannot be
    mapped (a pipe) or does not end that way. Only a hint for claiming positions: the
    file is checked line by line all the same."""
    try:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            end = len(m)
            while end > 0 and m[end - 1 : end] in (b"\n", b"\r", b" ", b"\t"):
                end -= 1
            closing = m.rfind(b"\n", 0, end)  # the closing line starts after it
            if closing <= 0:
                return None
            start = m.rfind(b"\n", 0, closing) + 1
            doc = json.loads(m[start:closing])
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    position = doc.get("position") if isinstance(doc, dict) else None
    return position if type(position) is int and position > 0 else None


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def _append_file(
    lg: Any,
    f: IO[str],
    progress: Progress | None,
    total: int = 0,
    last_position: int | None = None,
) -> TransferSummary:

    from projections.rebuild import Replayer

    store = lg.store
    decode = store.mapper.to_domain_event
    chains = Chains()
    appended = skipped = 0
    touched: dict[str, None] = {}
    with store.write() as tx:
        target = _Target(tx, chains)
        keep: bool | None = None
        replayer = Replayer("")
        replayer.prepare(tx)
        batch: list[RawEvent] = []

        projected = 0  # the last position projected (0: none yet, the replayer's cache empty)
        reserved = 0  # positions claimed up to here (keeping the file's positions)

        def flush() -> None:
            nonlocal appended, skipped, keep, projected, reserved
            if not batch:
                return
            if keep is None:  # the file's positions are free here: keep them
                top = max_position(tx)
                keep, target.empty = top < batch[0].position, top == 0
            events = target.new_events(batch)
            skipped += len(batch) - len(events)
            if events and keep and reserved < events[-1].position:
                # claim the file's positions at once, up to its last event when that is
                # known: later pages then append without waiting for an answer, and the
                # server writes one page while the next is read and checked
                upto = max(events[-1].position, last_position or 0)
                if reserve_positions(tx, events[0].position, upto):
                    reserved = upto
                else:
                    keep = False  # another writer drew them first: the rest is numbered too
            positions = append_raw(tx, events, keep_positions=bool(keep), reuse_free=bool(keep))
            if events:
                # every page is projected in this one transaction, right after the last:
                # the replayer keeps the aggregates it wrote (its cache) from page to page
                # instead of reading their rows back; a rollback drops the replayer too
                _project(tx, replayer, decode, positions, events, projected)
                projected = positions[-1]
                replayer.committed(projected)
            for e in events:
                run = _run_of_event(e)
                if run is not None:
                    touched[run] = None
            appended += len(events)
            batch.clear()
            if progress is not None:
                progress(chains.events, max(total, chains.events))

        # the closing line is checked when the reader reaches the end, before the last
        # page is appended; anything refused rolls the transaction back
        reader = EventReader(f, chains)
        for e in reader:
            batch.append(e)
            if len(batch) >= IMPORT_PAGE:
                flush()
        flush()
        if progress is not None:
            progress(chains.events, chains.events)
    return TransferSummary(
        events=appended,
        streams=len(chains.heads),
        digest=chains.digest(),
        skipped=skipped,
        runs=list(touched),
    )


def _project(
    tx: Any,
    replayer: Any,
    decode: Callable[[Any], Any],
    positions: list[int],
    events: list[RawEvent],
    after: int,
) -> None:
    """Project a page of appended events (the replayer's `apply`). ImportRefused, and the
    whole import rolls back, for events whose hashes check out but whose bytes the ledger
    cannot take: a state that is not strict JSON (`stored_payload_problem`, what `verify`
    reports), one that does not decode as its topic's event, or events that do not replay
    through the aggregates (a field missing, a transition out of order)."""
    from eventsourcing.domain import EventSourcingError
    from eventsourcing.persistence import PersistenceError, StoredEvent

    page = []
    for pos, e in zip(positions, events, strict=True):
        problem = stored_payload_problem(e.state)
        if problem is None:
            try:
                page.append((pos, decode(StoredEvent(e.stream, e.version, e.topic, e.state))))
                continue
            except Exception as exc:  # a pure decode: whatever it raises is the bytes' fault
                problem = f"does not decode as {e.topic}: {type(exc).__name__}: {exc}"
        raise ImportRefused(
            f"position {e.position}: version {e.version} of stream {e.stream} {problem}: "
            "nothing imported",
            position=e.position,
        )
    try:
        replayer.apply(tx, page, after)
    except PersistenceError:
        raise  # the store's, not the file's
    except (
        AttributeError,
        KeyError,
        TypeError,
        ValueError,
        LookupError,
        EventSourcingError,
    ) as exc:
        raise ImportRefused(
            f"positions {events[0].position}-{events[-1].position}: the events do not replay "
            f"({type(exc).__name__}: {exc}): nothing imported",
        ) from None


def _new_events(
    tx: Any, batch: list[RawEvent], held: dict[UUID, tuple[int, str | None]]
) -> list[RawEvent]:
    """The batch's events the target does not hold yet; the ones it holds must have the
    same hash (ImportRefused otherwise: the target has other events under that id)."""
    present = [e for e in batch if e.version <= held.get(e.stream, (0, None))[0]]
    if present:
        stored = hc.fetch_hashes(tx, [(e.stream, e.version) for e in present])
        for e in present:
            mine = stored.get((e.stream, e.version))
            theirs = e.hash or mine
            if mine != theirs:
                raise ImportRefused(
                    f"position {e.position}: version {e.version} of stream {e.stream} exists in this "
                    "ledger with other content (another run under the same id?): nothing imported",
                    position=e.position,
                )
    # an event written before the hash chain existed (hash null) is appended without one,
    # as it was stored
    return [e for e in batch if e.version > held.get(e.stream, (0, None))[0]]


def _run_of_event(e: RawEvent) -> str | None:
    if e.topic.startswith("ledger.domain:Run."):
        return str(e.stream)
    return None


# --------------------------------------------------------------------------
# copy
# --------------------------------------------------------------------------
def copy_ledger(
    source_dsn: str,
    target_dsn: str,
    progress: Callable[[str, int, int], None] | None = None,
    verify: bool = True,
) -> TransferSummary:
    """Copy every event of one ledger into another (export into a temporary file, then
    import it), with `progress(stage, done, total)`: "export", then "import"."""
    from .service import Ledger

    if source_dsn == target_dsn:
        raise InvalidInput("--from and --to name the same ledger")
    src = Ledger.open(source_dsn)
    try:
        with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
            exported = export(src, cast(IO[str], spool), progress=_staged(progress, "export"))
            spool.seek(0)
            dst = Ledger.open(target_dsn)
            try:
                return import_file(
                    dst,
                    spool,
                    progress=_staged(progress, "import"),
                    verify=verify,
                    total=exported.events,
                )
            finally:
                dst.close()
    finally:
        src.close()


def _staged(progress: Callable[[str, int, int], None] | None, stage: str) -> Progress | None:
    if progress is None:
        return None
    report = progress
    return lambda done, total: report(stage, done, total)


__all__ = [
    "FORMAT",
    "PAGE",
    "Chains",
    "ExportRefused",
    "FileCheck",
    "ImportRefused",
    "Progress",
    "TransferSummary",
    "archived_seed",
    "check_file",
    "copy_ledger",
    "event_line",
    "event_time",
    "export",
    "import_file",
    "parse_event",
]
