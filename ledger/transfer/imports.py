"""Import: a history file of JSON lines into a ledger.

The file's format, its hash chains and the check of a whole file are in
`ledger/transfer/history_file.py` (the names are importable from here too). Exporting checks the
store's own chains as it writes (`ExportRefused`). Importing checks the file first, then
appends the events with their hashes in one transaction of the target and projects them
there with the rebuild's `Replayer`. An import is a writer like any other: each event
passes the rule checker (`ledger/core/rule_check.py`, the commands' and verify's) before
it is applied, and the first that breaks a rule refuses the whole file. It adds only
runs the target does not hold: events the target holds must be the same (compared by
hash), which makes importing a file twice a no-op, and no event may add to a stream or
a run the target holds.

Memory grows with the number of streams in the file (about 150 bytes each: the heads),
never with the number of events: events are read and written a page at a time
(`PAGE` for an export, `IMPORT_PAGE` for an import).
"""

from __future__ import annotations

import io
import json
import mmap
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from uuid import UUID

from ledger.core.archived import ARCHIVED_TOPIC
from ledger.core.errors import InvalidInput
from ledger.core.rule_check import Violation
from ledger.core.validation import stored_payload_problem
from ledger.core.webhook_events import TOPIC_MODULE as WEBHOOK_TOPIC_MODULE
from ledger.stores import hashchain as hc
from ledger.stores.raw import (
    RawEvent,
    append_raw,
    max_position,
    reserve_positions,
    stream_heads,
)
from ledger.transfer.exports import TransferSummary
from ledger.transfer.history_file import (
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
    refuse_event,
)

if TYPE_CHECKING:
    from ledger.projections.rebuild import Replayer
    from ledger.projections.replay_rules import RuleObserver
    from ledger.service.ledger import Ledger
    from ledger.stores.base import Tx

# events an import appends and projects at a time. PostgreSQL writes a page while the
# client reads, checks and projects the next (the transaction is pipelined), so the last
# page's server work is the only part not overlapped: measured on 50,000 events
# (2026-12-02, schema v11), pages of 2,000 took 1.63-1.74 s against 1.86-1.99 s for
# 10,000 (and 1.58 s for 1,000, 2.0 s for 500), with the same server CPU (1.36-1.44 s):
# folding an item's claim and accept into one row update, which larger pages do more
# often, saves less than the longer tail costs. Memory stays bounded by the page.
IMPORT_PAGE = 2_000


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
    lg: Ledger,
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
    not check out, an event that breaks a rule of the rule checker (`rule` names it), a
    stream the target holds with other events, an event that would add to a stream or a
    run the target holds. Events the target already holds (same stream, version and hash)
    are skipped, so a second import of the same file changes nothing."""
    from ledger.projections.rebuild import fewer_collections

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
    """The target's side of an import: which events of the file it holds already, and
    which runs. An import adds runs the target does not hold, whole: an event the target
    holds must be the same (same hash), and no event may add to a stream or a run the
    target held before the import (a forged item stream of a live run, the rest of a
    stream taken up in the middle)."""

    def __init__(self, tx: Tx, chains: Chains) -> None:
        self.tx = tx
        self.chains = chains
        self.held: dict[UUID, tuple[int, str | None]] = {}
        self.known: set[UUID] = set()
        self.empty = False  # the target held no event when the import began
        self.runs: dict[str, bool] = {}  # run id -> the target held it before the import

    def new_events(self, batch: list[RawEvent]) -> list[RawEvent]:
        """The batch's events the target lacks (see the class's docstring)."""
        if self.empty and not self.chains.open:
            return batch  # nothing held, and every stream starts in the file
        fresh = list(dict.fromkeys(e.stream for e in batch if e.stream not in self.known))
        if not self.empty:
            self.held.update(stream_heads(self.tx, fresh))
        self.known.update(fresh)
        for e in batch:
            if self.chains.open.get(e.stream) is e:
                self._check_starts(e)
        events = _new_events(self.tx, batch, self.held)
        if not self.empty:
            self._check_runs(events)
        return events

    def _check_starts(self, e: RawEvent) -> None:
        have = self.held.get(e.stream)
        if have is None or have[0] < e.version - 1:
            raise ImportRefused(
                f"position {e.position}: stream {e.stream} starts at version {e.version} in the "
                f"file, but this ledger holds {have[0] if have else 'none'} of its earlier "
                "versions",
                position=e.position,
            )

    def _check_runs(self, events: list[RawEvent]) -> None:
        runs = list(dict.fromkeys(run_of_raw(e) for e in events))
        unknown = [r for r in runs if r not in self.runs]
        if unknown:
            held = stream_heads(self.tx, [UUID(r) for r in unknown])
            for r in unknown:
                self.runs[r] = UUID(r) in held
        for e in events:
            have = self.held.get(e.stream)
            if have is not None:
                raise ImportRefused(
                    f"position {e.position}: version {e.version} of stream {e.stream} would "
                    f"continue a stream this ledger holds (up to version {have[0]}): an import "
                    "adds only streams the ledger does not hold; nothing imported",
                    position=e.position,
                )
            run = run_of_raw(e)
            if self.runs.get(run):
                raise ImportRefused(
                    f"position {e.position}: version {e.version} of stream {e.stream} belongs "
                    f"to run {run}, which this ledger holds: an import adds only runs the "
                    "ledger does not hold, never events to one of its runs; nothing imported",
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
    lg: Ledger,
    f: IO[str],
    progress: Progress | None,
    total: int = 0,
    last_position: int | None = None,
) -> TransferSummary:

    from ledger.projections.rebuild import Replayer

    store = lg.store
    decode = store.mapper.to_domain_event
    chains = Chains()
    appended = skipped = 0
    touched: dict[str, None] = {}
    with store.write() as tx:
        target = _Target(tx, chains)
        keep: bool | None = None
        replayer = Replayer("", observer=rule_guard())
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
            decoded = _decoded(decode, events)
            positions = append_raw(
                tx, events, keep_positions=bool(keep), reuse_free=bool(keep), decoded=decoded
            )
            if events:
                # every page is projected in this one transaction, right after the last:
                # the replayer keeps the aggregates it wrote (its cache) from page to page
                # instead of reading their rows back; a rollback drops the replayer too
                _project(tx, replayer, positions, decoded, events, projected)
                projected = positions[-1]
                replayer.committed(projected)
            for e in events:
                if not e.topic.startswith(WEBHOOK_TOPICS):  # a webhook's stream is no run
                    touched[run_of_raw(e)] = None
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


def rule_guard(what: str = "nothing imported") -> RuleObserver:
    """The replay's observer for a writer of history files (import, restore, copy): each
    incoming event through the rule checker before it is applied; the first that breaks
    a rule refuses the file (ImportRefused naming the rule, the stream and the event)."""
    from ledger.projections.replay_rules import RuleObserver

    def refuse(position: int, v: Violation) -> None:
        raise refuse_event(position, v, what)

    return RuleObserver("lg_items", refuse=refuse)


def _decoded(decode: Callable[[Any], Any], events: list[RawEvent]) -> list[Any]:
    """A page's events decoded (once: their transition columns and their replay both use
    them). ImportRefused, and the whole import rolls back, for events whose hashes check
    out but whose bytes the ledger cannot take: a state that is not strict JSON
    (`stored_payload_problem`, what `verify` reports), or one that does not decode as its
    topic's event."""
    from eventsourcing.persistence import StoredEvent

    page = []
    for e in events:
        problem = stored_payload_problem(e.state)
        if problem is None:
            try:
                page.append(decode(StoredEvent(e.stream, e.version, e.topic, e.state)))
                continue
            except Exception as exc:  # a pure decode: whatever it raises is the bytes' fault
                problem = f"does not decode as {e.topic}: {type(exc).__name__}: {exc}"
        raise ImportRefused(
            f"position {e.position}: version {e.version} of stream {e.stream} {problem}: "
            "nothing imported",
            position=e.position,
        )
    return page


def _project(
    tx: Tx,
    replayer: Replayer,
    positions: list[int],
    decoded: list[Any],
    events: list[RawEvent],
    after: int,
) -> None:
    """Project a page of appended events (the replayer's `apply`). ImportRefused, and the
    whole import rolls back, for events that do not replay through the aggregates (a field
    missing, a transition out of order)."""
    from eventsourcing.domain import EventSourcingError
    from eventsourcing.persistence import PersistenceError

    page = list(zip(positions, decoded, strict=True))
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
    tx: Tx, batch: list[RawEvent], held: dict[UUID, tuple[int, str | None]]
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


_RUN_ID = re.compile(rb'"run_id":"([0-9a-fA-F-]{36})"')


def run_of_raw(e: RawEvent) -> str:
    """The run a stored event belongs to: a run stream's own id, else the `run_id` its
    state names (an item's events), else its stream (an event of no run)."""
    if e.topic.startswith(_RUN_TOPICS):
        return str(e.stream)
    m = _RUN_ID.search(e.state)
    if m is not None:
        try:
            return str(UUID(m.group(1).decode()))
        except ValueError:
            pass
    return str(e.stream)


_RUN_TOPICS = ("ledger.domain:Run.", ARCHIVED_TOPIC)
WEBHOOK_TOPICS = WEBHOOK_TOPIC_MODULE + ":"


__all__ = [
    "FORMAT",
    "PAGE",
    "Chains",
    "FileCheck",
    "ImportRefused",
    "Progress",
    "archived_seed",
    "check_file",
    "event_line",
    "event_time",
    "import_file",
    "parse_event",
]
