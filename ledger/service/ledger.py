"""The application service: `Ledger`, the public facade over the command handlers
(`ledger/commands/*.py`) and the reads (`ledger/reads/queries.py`). The commands are here;
the reads and the record-keeping operations (verify, export, archive...) are methods it
inherits from `LedgerReads` (ledger/service/reads.py) and `LedgerMaintenance`
(ledger/service/maintenance.py).

Each command method checks nothing itself: it hands its arguments to the pipeline
(`ledger/commands/pipeline.py`: transient-fault retry, then the optional
`idempotency_key`, then the handler with its unit of work), inside the command's span
when OpenTelemetry is installed (`ledger/service/traces.py`). Each command runs in one
store transaction: it reads the current rows (locked on PostgreSQL), rebuilds the
aggregates from them, checks, triggers events, and appends the events and the
projection rows together. A refusal raises before anything is written.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ledger.commands import amend as _amend
from ledger.commands import items as _items
from ledger.commands import leases as _leases
from ledger.commands import lineage as _lineage
from ledger.commands import reconcile as _reconcile
from ledger.commands import review as _review
from ledger.commands import runs as _runs
from ledger.commands.idempotency import check_key
from ledger.commands.leases import MAX_CLAIM
from ledger.commands.pipeline import execute
from ledger.commands.registry import COMMANDS
from ledger.commands.runs import CANCEL_RETRIES
from ledger.commands.uow import LEDGER
from ledger.core.args import Outcome
from ledger.core.errors import InvalidInput, LedgerError
from ledger.core.views import (
    Actor,
    CancelOutcome,
    ItemStatus,
    Lease,
    ReconcileReport,
    RunStatus,
)
from ledger.projections.writer import Projector
from ledger.reads.queries import waiting_on
from ledger.service.maintenance import LedgerMaintenance
from ledger.service.reads import LedgerReads
from ledger.service.traces import traced
from ledger.stores import open_store, resolve_dsn
from ledger.stores.base import Store

if TYPE_CHECKING:
    from ledger.core.manifest import Manifest

T = TypeVar("T")

__all__ = ["CANCEL_RETRIES", "LEDGER", "MAX_CLAIM", "Ledger", "Outcome", "waiting_on"]


class Ledger(LedgerReads, LedgerMaintenance):
    """The run ledger: commands and reads over one store. Safe to share between threads.

    Every command takes an optional keyword `idempotency_key`: a repeat with the same key
    returns the first result without writing; the same key with another command or other
    arguments is refused (`InvalidInput`). See `ledger.commands.idempotency`."""

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

    def using(self, conn: Any) -> Ledger:
        """A view of this ledger whose commands and reads run inside the caller's open
        transaction on `conn`: a psycopg `Connection` to the ledger's PostgreSQL
        database, a `sqlite3.Connection` to its SQLite file, or the `tx` an in-database
        follower's handler gets. The events, their hashes, the projection rows and the
        idempotency record commit when the caller commits, and roll back with the
        caller's own writes. Each command runs in a savepoint: a refused command writes
        nothing and the caller's transaction goes on. Nothing is retried on a database
        fault (the caller's transaction is the one to repeat)."""
        from ledger.stores.base import JoinedStore

        base = self.store.base if isinstance(self.store, JoinedStore) else self.store
        view = copy.copy(self)
        view.store = JoinedStore(base, conn)
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
        return traced(
            self.store,
            name,
            arguments,
            lambda: execute(self.store, self._projector, name, handler, key, arguments),
        )

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
        reason: str | None,
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
        reason: str | None,
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
        reason: str | None,
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
        reason: str | None,
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
