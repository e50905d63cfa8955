"""The application service: `Ledger`, the public facade over the command handlers
(`ledger/commands/*.py`) and the reads (`ledger/queries.py`).

Each command method checks nothing itself: it hands its arguments to the pipeline
(`ledger/commands/pipeline.py`: transient-fault retry, then the optional
`idempotency_key`, then the handler with its unit of work). Each command runs in one
store transaction: it reads the current rows (locked on PostgreSQL), rebuilds the
aggregates from them, checks, triggers events, and appends the events and the
projection rows together. A refusal raises before anything is written.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from projections.writer import Projector

from . import queries
from .commands import amend as _amend
from .commands import items as _items
from .commands import leases as _leases
from .commands import lineage as _lineage
from .commands import reconcile as _reconcile
from .commands import review as _review
from .commands import runs as _runs
from .commands.args import Outcome
from .commands.leases import MAX_CLAIM
from .commands.pipeline import execute
from .commands.registry import COMMANDS
from .commands.runs import CANCEL_RETRIES
from .commands.uow import LEDGER
from .domain import Run
from .errors import InvalidInput, LedgerError
from .idempotency import check_key, read_command, typed_refusals
from .queries import waiting_on
from .stores import open_store, resolve_dsn
from .stores.base import Store, Tx
from .validation import check_unicode, utc_time
from .views import (
    Actor,
    Attempt,
    CancelOutcome,
    ItemStatus,
    Lease,
    ReconcileReport,
    RunStatus,
    Transition,
    VerifyReport,
)

if TYPE_CHECKING:
    from .board import BoardPage
    from .manifest import Manifest
    from .overview import Overview

T = TypeVar("T")

__all__ = ["CANCEL_RETRIES", "LEDGER", "MAX_CLAIM", "Ledger", "Outcome", "waiting_on"]


class Ledger:
    """The run ledger: commands and reads over one store. Safe to share between threads.

    Every command takes an optional keyword `idempotency_key`: a repeat with the same key
    returns the first result without writing; the same key with another command or other
    arguments is refused (`InvalidInput`). See `ledger.idempotency`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._projector = Projector()
        self._next_key: str | None = None  # set on a view made by keyed()
        self._key_used_by: str | None = None

    @classmethod
    def open(
        cls,
        dsn: str | None = None,
        clock: Callable[[], datetime] | None = None,
        *,
        create: bool = True,
    ) -> Ledger:
        """Open a ledger: `sqlite:///path`, `postgresql://...`, `memory://`; else LEDGER_DSN,
        else `sqlite:///./ledger.db`. Creates the schema if missing; with `create=False` a
        SQLite file that does not exist is refused (`StoreUnavailable`), not created."""
        if clock is not None and not callable(clock):
            raise InvalidInput("clock must be a callable returning an aware datetime")
        return cls(open_store(resolve_dsn(dsn), clock=clock, create=create))

    def close(self) -> None:
        """Release the store's connections."""
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def keyed(self, key: str) -> Ledger:
        """A view of this ledger (same store) whose next command carries `key` as its
        `idempotency_key`: how the HTTP `Idempotency-Key` header and the CLI's
        `--idempotency-key` reach the one command a request makes. Reads pass through; a
        second command through the same view is refused (a key names one command)."""
        view = copy.copy(self)
        view._next_key = check_key(key)
        view._key_used_by = None
        return view

    # -- the pipeline ------------------------------------------------------
    def _execute(self, handler: Callable[..., T], arguments: dict[str, Any]) -> T:
        """Run the command `handler` names with the calling method's `locals()`: its
        parameters by name, which are the command's arguments (and make the key's
        fingerprint), plus `self` and `idempotency_key`, taken out here."""
        arguments = dict(arguments)
        del arguments["self"]
        key: str | None = arguments.pop("idempotency_key")
        spec = COMMANDS[handler.__name__]  # every command is declared once, in the registry
        assert spec.handler is handler, spec
        name = spec.name
        if self._next_key is not None:
            if key is not None:
                raise InvalidInput("idempotency_key is given twice")
            if self._key_used_by is not None:
                raise InvalidInput(
                    f"an idempotency key names one command; this one already went to "
                    f"{self._key_used_by}, not also to {name}"
                )
            self._key_used_by = name
            key = self._next_key
        return execute(self, name, handler, key, arguments)

    def _load_run(self, tx: Tx, run_id: str, lock: bool = True) -> Run:
        """Where every command loads (and locks) its run: one place to observe it."""
        return queries.load_run(tx, run_id, lock)

    # -- run commands ------------------------------------------------------
    def submit(
        self,
        manifest: Manifest | dict[str, Any] | str | bytes,
        actor: Actor,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """Record a new run, `queued`."""
        return self._execute(_lineage.submit, locals())

    def start(
        self,
        run_id: str,
        actor: Actor,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """queued -> running."""
        return self._execute(_runs.start, locals())

    def request_review(
        self,
        run_id: str,
        actor: Actor,
        decision: str,
        expected_revision: int | None = None,
        reviewer: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """running -> awaiting_review, bound to the current input version; `reviewer` routes
        the review to a person (the status then names them as the one it waits on)."""
        return self._execute(_review.request_review, locals())

    def decide(
        self,
        run_id: str,
        actor: Actor,
        input_version: str,
        approve: bool,
        reason: str | None,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """A review decision for a named input version: approve -> running, reject -> failed."""
        return self._execute(_review.decide, locals())

    def approve(
        self,
        run_id: str,
        actor: Actor,
        input_version: str,
        reason: str = "approved",
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """Shorthand for decide(approve=True)."""
        return self._execute(_review.approve, locals())

    def pause(
        self,
        run_id: str,
        actor: Actor,
        reason: str | None = None,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """running -> pausing (live leases finish first) or paused."""
        return self._execute(_runs.pause, locals())

    def resume(
        self,
        run_id: str,
        actor: Actor,
        expected_revision: int | None = None,
        reason: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """pausing or paused -> running."""
        return self._execute(_runs.resume, locals())

    def cancel(
        self,
        run_id: str,
        actor: Actor,
        reason: str | None = None,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> CancelOutcome:
        """Record the durable intent to cancel; canceled at once when no lease is live."""
        return self._execute(_runs.cancel, locals())

    def complete(
        self,
        run_id: str,
        actor: Actor,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """running -> succeeded or completed_with_errors, else NotComplete naming what blocks it."""
        return self._execute(_runs.complete, locals())

    def fail(
        self,
        run_id: str,
        actor: Actor,
        reason: str,
        transient: bool,
        failure_reason: str | None = None,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """-> failed (transient or permanent); live leases are fenced (attempts end abandoned)."""
        return self._execute(_runs.fail, locals())

    def amend(
        self,
        run_id: str,
        actor: Actor,
        reason: str | None,
        items: list[Any] | None = None,
        withdraw: list[str] | None = None,
        policy: dict[str, Any] | None = None,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """Add or replace items, withdraw item ids, or change policy: a new input version."""
        return self._execute(_amend.amend, locals())

    # -- new linked runs ---------------------------------------------------
    def retry(
        self,
        run_id: str,
        actor: Actor,
        reason: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """A new run replaying a failed(transient) run's latest input exactly."""
        return self._execute(_lineage.retry, locals())

    def repair(
        self,
        run_id: str,
        actor: Actor,
        items: list[str] | None = None,
        corrections: list[Any] | None = None,
        reason: str | None = None,
        config_version: str | None = None,
        policy: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """A new linked run for the items not accepted (or given ids), or for corrected items;
        with `config_version` or `policy`, under a corrected configuration (correction_of)."""
        return self._execute(_lineage.repair, locals())

    def compensate(
        self,
        run_id: str,
        actor: Actor,
        reason: str,
        items: list[Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        """A separately authorized new run that undoes effects of a run (default: its accepted items)."""
        return self._execute(_lineage.compensate, locals())

    # -- item commands -----------------------------------------------------
    def claim(
        self,
        run_id: str,
        worker: Actor,
        limit: int = 1,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> list[Lease]:
        """Lease up to `limit` claimable items in one transaction; [] when none is claimable."""
        return self._execute(_leases.claim, locals())

    def heartbeat(self, lease: Lease, *, idempotency_key: str | None = None) -> Lease:
        """Extend a live lease by the run's lease_seconds; LeaseLost if it is not live."""
        return self._execute(_leases.heartbeat, locals())

    def accept(
        self,
        lease: Lease,
        evidence: dict[str, Any] | None = None,
        stage: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> ItemStatus:
        """in_progress -> accepted, with the live lease's token."""
        return self._execute(_leases.accept, locals())

    def reject(
        self,
        lease: Lease,
        rule: str,
        detail: str | None = None,
        stage: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> ItemStatus:
        """in_progress -> rejected (the item breaks a rule; final)."""
        return self._execute(_leases.reject, locals())

    def fail_attempt(
        self,
        lease: Lease,
        error: str,
        stage: str | None = None,
        retryable: bool = True,
        *,
        idempotency_key: str | None = None,
    ) -> ItemStatus:
        """in_progress -> retryable, or quarantined when attempts are exhausted or not retryable."""
        return self._execute(_leases.fail_attempt, locals())

    def record(
        self, outcomes: Sequence[Outcome], *, idempotency_key: str | None = None
    ) -> list[ItemStatus | LedgerError]:
        """Record many outcomes, one transaction per run. A lost lease is returned, not raised."""
        return self._execute(_leases.record, locals())

    def skip(
        self,
        run_id: str,
        item_id: str,
        actor: Actor,
        reason: str,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> ItemStatus:
        """pending, retryable or quarantined -> skipped."""
        return self._execute(_items.skip, locals())

    def release(
        self,
        run_id: str,
        item_id: str,
        actor: Actor,
        reason: str,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> ItemStatus:
        """quarantined -> retryable."""
        return self._execute(_items.release, locals())

    def reject_item(
        self,
        run_id: str,
        item_id: str,
        actor: Actor,
        rule: str,
        detail: str | None = None,
        expected_revision: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> ItemStatus:
        """quarantined -> rejected, by a reviewer."""
        return self._execute(_items.reject_item, locals())

    def reconcile(
        self,
        now: datetime | None = None,
        actor: Actor | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> ReconcileReport:
        """Expire stale leases, finish cancels and pauses, quarantine retryable items past their
        deadline, and fail runs past their deadline once none of their leases is live."""
        return self._execute(_reconcile.reconcile, locals())

    # -- reads -------------------------------------------------------------
    def _status_tx(self, tx: Tx, run_id: str) -> RunStatus:
        return queries.status_tx(tx, run_id)

    @read_command
    def status(self, run_id: str) -> RunStatus:
        """The run as accepted by the store."""
        return queries.status(self.store, run_id)

    @read_command
    def runs(self, state: str | None = None, limit: int = 100) -> list[RunStatus]:
        """Runs, newest first."""
        return queries.runs(self.store, state, limit)

    @read_command
    def items(
        self,
        run_id: str,
        state: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[ItemStatus]:
        """The run's items in manifest order. With `limit` (1 to 10,000): one keyset page
        after the item id `after`; without it every item (read page by page)."""
        return queries.items(self.store, run_id, state, limit, after)

    @read_command
    def item(self, run_id: str, item_id: str) -> ItemStatus:
        """One item."""
        return queries.item(self.store, run_id, item_id)

    @read_command
    def attempts(
        self,
        run_id: str,
        item_id: str | None = None,
        limit: int | None = None,
        after: str | tuple[str, int] | None = None,
    ) -> list[Attempt]:
        """Every attempt of the run (or of one item), oldest first. With `limit`: one
        keyset page after the attempt key `after` (`"<item_id>:<attempt>"`)."""
        return queries.attempts(self.store, run_id, item_id, limit, after)

    @read_command
    def history(
        self, run_id: str, limit: int | None = None, after: int | None = None
    ) -> list[Transition]:
        """Every run and item transition of the run, in position order, starting with its
        submit. With `limit`: one keyset page after the position `after`."""
        return queries.history(self.store, run_id, limit, after)

    @read_command
    def lineage(self, run_id: str) -> list[RunStatus]:
        """The runs linked to this one (same root), root first."""
        return queries.lineage(self.store, run_id)

    @read_command
    def audit(
        self,
        run_id: str | None = None,
        actor: str | None = None,
        role: str | None = None,
        state: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        newest_first: bool = False,
        after: int | None = None,
        limit: int | None = None,
        page_size: int = 1000,
    ) -> Iterator[Transition]:
        """Transitions filtered by run, actor id, role, target state and time; keyset-paged by position."""
        return queries.audit(
            self.store,
            run_id,
            actor,
            role,
            state,
            since,
            until,
            newest_first,
            after,
            limit,
            page_size,
        )

    @read_command
    def board(
        self,
        state: str | None = None,
        waiting_on: str | None = None,
        stalled: bool = False,
        terminal: bool = False,
        after: int | None = None,
        limit: int = 50,
    ) -> BoardPage:
        """A keyset page of runs with who they wait on since when, newest first: open runs,
        or terminal ones with `terminal` (ledger/board.py)."""
        from .board import board

        return board(self.store, state, waiting_on, stalled, terminal, after, limit)

    @read_command
    def overview(self) -> Overview:
        """Open runs by state and waiting_on, the oldest wait per owner, stalled runs and
        expired leases, across every run (ledger/overview.py)."""
        from .overview import overview

        return overview(self.store)

    @read_command
    def events(
        self,
        after: int | None = None,
        run_id: str | None = None,
        kinds: Sequence[str] | str | None = None,
        limit: int = 1000,
    ) -> list[Transition]:
        """The change feed: transitions after position `after` in position order (one page of
        at most `limit`), of one run or all, whose command or new state is one of `kinds`."""
        from .feed import events

        return events(self.store, after, run_id, kinds, limit)

    @typed_refusals
    def wait_for_events(self, after: int | None, timeout: float) -> bool:
        """Block until a transition past `after` has committed (True) or `timeout` seconds
        pass (False). LISTEN/NOTIFY on PostgreSQL, short polling elsewhere (ledger/feed.py)."""
        from .feed import wait_for_events

        return wait_for_events(self.store, after, timeout)

    @read_command
    def status_at(self, run_id: str, at: datetime) -> RunStatus:
        """The run's status as the store had accepted it at time `at`, replayed from its events."""
        from projections.timetravel import status_at

        from .commands import args as A

        run_id = A.run_id(run_id)
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise InvalidInput("at must be an aware datetime")
        return status_at(self, run_id, utc_time(at, "at"))

    @typed_refusals
    def verify(self, progress: Callable[[str, int, int], None] | None = None) -> VerifyReport:
        """Replay every event and report broken rules and projection drift. `progress(stage,
        done, total)` follows it: "replay" after each batch (events done, events stored), then
        "compare" and "chains" as they start."""
        from projections.verify import verify

        if progress is not None and not callable(progress):
            raise InvalidInput("progress must be a callable (stage, done, total)")
        return verify(self, progress)

    @typed_refusals
    def prune_idempotency_keys(self, older_than: timedelta) -> int:
        """Forget idempotency keys recorded more than `older_than` ago (by the store's clock);
        returns how many. A repeat with a forgotten key is a new command."""
        from .idempotency import prune

        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise InvalidInput("older_than must be a non-negative timedelta")
        with self.store.read() as tx:
            now = tx.now()
        try:
            before = now - older_than
        except OverflowError:
            return 0  # longer ago than the calendar goes: no key is that old
        return prune(self.store, before)

    @typed_refusals
    def export(
        self,
        file: Any,
        runs: Any = None,
        since: datetime | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Any:
        """Write the events (of `runs`, recorded since `since`) to the text file object `file`
        as history lines with their hashes and a closing line of stream heads
        (ledger/transfer.py); returns a TransferSummary."""
        from .commands import args as A
        from .transfer import export

        if not callable(getattr(file, "write", None)):
            raise InvalidInput(f"file must be a text file object, got {type(file).__name__}")
        if runs is not None:
            if isinstance(runs, (str, bytes)) or not isinstance(
                runs, (list, tuple, set, frozenset)
            ):
                raise InvalidInput("runs must be a list of run ids")
            runs = [A.run_id(r) for r in runs]
        if since is not None:
            since = utc_time(since, "since")
        _progress(progress)
        return export(self, file, runs=runs, since=since, progress=progress)

    @typed_refusals
    def import_file(
        self, source: Any, progress: Callable[[int, int], None] | None = None, verify: bool = True
    ) -> Any:
        """Check a history file (a path or text file object) and append its events with their
        hashes, projected, in one transaction; then verify (ledger/transfer.py)."""
        from .transfer import import_file

        _source(source)
        if not isinstance(verify, bool):
            raise InvalidInput(f"verify must be true or false, got {type(verify).__name__}")
        _progress(progress)
        return import_file(self, source, progress=progress, verify=verify)

    @typed_refusals
    def archive(
        self,
        actor: Actor,
        to: Any,
        terminal_before: datetime | None = None,
        runs: list[str] | None = None,
        reason: str | None = None,
    ) -> Any:
        """Move the events of runs terminal since before `terminal_before` (or of `runs`)
        into the verified archive file `to`, leaving one Archived event per run in its
        chain (operator role; ledger/archive.py). Resumes an interrupted archive."""
        from .archive import archive

        _path(to, "to")
        return archive(self, actor, to, terminal_before=terminal_before, runs=runs, reason=reason)

    @typed_refusals
    def archived(self, run_id: str) -> dict[str, Any] | None:
        """Where an archived run's events went (file, sha256, digest, events, when, by whom);
        None when the run is not archived. Its history and attempts are in that file."""
        from .archive import archived_run

        return archived_run(self, run_id)

    @typed_refusals
    def restore(self, actor: Actor, source: Any) -> Any:
        """Bring archived runs back from their archive file, once it is proven to hold the
        events that left (operator role; ledger/archive.py)."""
        from .archive import restore

        _path(source, "source")
        return restore(self, actor, source)

    @typed_refusals
    def rebuild_projections(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Drop and rebuild every projection from the first event; returns the events replayed."""
        from projections.rebuild import rebuild

        _progress(progress)
        return rebuild(self, progress=progress)


def _progress(progress: Any) -> None:
    if progress is not None and not callable(progress):
        raise InvalidInput("progress must be None or a callable")


def _path(value: Any, what: str) -> None:
    """A file path: text (or os.PathLike) without NUL or lone surrogates."""
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidInput(f"{what} must be a file path, got {type(value).__name__}")
    path = os.fspath(value)
    if not isinstance(path, str) or "\x00" in path:
        raise InvalidInput(f"{what} must be a file path without NUL characters")
    check_unicode(path, what)
    # longer names than any file system takes are bad input, not an OSError later
    if len(path.encode()) > 4096 or any(len(part.encode()) > 255 for part in path.split(os.sep)):
        raise InvalidInput(f"{what} is not a usable file path (a name over 255 bytes)")


def _source(source: Any) -> None:
    """A file to read: a path (text without NUL or lone surrogates) or a text file object."""
    if isinstance(source, (str, os.PathLike)):
        _path(source, "source")
    elif not callable(getattr(source, "read", None)):
        raise InvalidInput(
            f"source must be a path or a text file object, got {type(source).__name__}"
        )
