"""The application service: commands in SPEC.md's order of checks, and reads.

Each command runs in one store transaction: it reads the current rows (locked
on PostgreSQL), rebuilds the aggregates from them, checks, triggers events, and
appends the events and the projection rows together. A refusal raises before
anything is written.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, cast, overload
from uuid import UUID

from projections.rows import iso, item_from_row, parse_dt, run_from_row
from projections.writer import Projector

from . import states as S
from .domain import Item, Run, item_stream_id, run_stream_id
from .errors import (
    AlreadyTerminal,
    Conflict,
    IllegalTransition,
    InvalidInput,
    ItemNotFound,
    LeaseLost,
    LedgerError,
    ManifestInvalid,
    NotAuthorized,
    NotComplete,
    RunNotFound,
    StaleReview,
)
from .idempotency import command, read_command, retry_transient
from .validation import check_identifier, check_unicode, input_version_of, input_version_of_text

if TYPE_CHECKING:
    from eventsourcing.domain import DomainEvent

    from .board import BoardPage
    from .manifest import Manifest, ManifestItem
    from .overview import Overview

# pydantic (ledger.manifest) loads on first use: read-only commands start faster without it.


def parse_manifest(data: Any) -> Manifest:
    from .manifest import parse_manifest as parse

    return parse(data)


def parse_items(data: Any, field: str = "items") -> list[ManifestItem]:
    from .manifest import parse_items as parse

    return parse(data, field)


def _policy(data: Any, change: Any = None) -> Any:
    """The run's policy as a model; with `change`, the policy after applying it."""
    from .manifest import Policy, parse_policy

    base = Policy.model_validate(data)
    return base if change is None else parse_policy(change, base)


from .redact import MAX_REASON_BYTES, clean_error
from .stores import open_store, resolve_dsn
from .stores.base import Store, StreamConflict, Tx
from .views import (
    Actor,
    Attempt,
    CancelOutcome,
    ItemStatus,
    Lease,
    Link,
    NotAcceptedItem,
    ReconcileReport,
    RunStatus,
    Transition,
    VerifyReport,
)

LEDGER = Actor(S.LEDGER_ACTOR_ID, S.CONTROLLER)
MAX_CLAIM = 1000
CANCEL_RETRIES = 5
_REASON_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Outcome:
    """One outcome for `Ledger.record`: kind is accept, reject or fail."""

    lease: Lease
    kind: str
    evidence: dict[str, Any] | None = None
    stage: str | None = None
    rule: str | None = None
    detail: str | None = None
    error: str | None = None
    retryable: bool = True


# --------------------------------------------------------------------------
# argument validation (the first check; nothing is read yet)
# --------------------------------------------------------------------------
def _actor(actor: Any, what: str = "actor") -> Actor:
    if isinstance(actor, str):
        actor = Actor.parse(actor)
    if not isinstance(actor, Actor):
        raise InvalidInput(f"{what} must be an Actor(id, role), got {type(actor).__name__}")
    check_identifier(actor.id, f"{what}.id")
    if actor.role not in S.ROLES:
        raise InvalidInput(
            f"{what}.role {actor.role!r} is not a role; roles are: {', '.join(S.ROLES)}"
        )
    return actor


@overload
def _reason(reason: Any, what: str = ..., *, required: Literal[True]) -> str: ...
@overload
def _reason(reason: Any, what: str = ..., required: bool = ...) -> str | None: ...
def _reason(reason: Any, what: str = "reason", required: bool = False) -> str | None:
    if reason is None:
        if required:
            raise InvalidInput(f"{what} is required")
        return None
    if not isinstance(reason, str):
        raise InvalidInput(f"{what} must be a string, got {type(reason).__name__}")
    check_unicode(reason, what)
    if required and not reason.strip():
        raise InvalidInput(f"{what} must not be empty")
    if len(reason.encode()) > MAX_REASON_BYTES:
        raise InvalidInput(
            f"{what} is {len(reason.encode())} bytes; at most {MAX_REASON_BYTES} allowed"
        )
    if _REASON_CONTROL.search(reason):
        raise InvalidInput(
            f"{what} must not contain control characters (newline and tab are allowed)"
        )
    return reason


def _revision(expected: Any) -> int | None:
    if expected is None:
        return None
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
        raise InvalidInput(
            f"expected_revision must be a non-negative integer or None, got {expected!r}"
        )
    return expected


def _run_id(run_id: Any) -> str:
    check_identifier(run_id, "run_id")
    return str(run_id)


def _item_id(item_id: Any) -> str:
    return check_identifier(item_id, "item_id")


def _lease(lease: Any) -> Lease:
    if isinstance(lease, dict):
        try:
            exp = lease["expires_at"]
            lease = Lease(
                run_id=lease["run_id"],
                item_id=lease["item_id"],
                token=lease["token"],
                worker_id=lease["worker_id"],
                attempt=lease["attempt"],
                expires_at=exp if isinstance(exp, datetime) else datetime.fromisoformat(exp),
                payload=lease.get("payload"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInput(
                f"lease must have run_id, item_id, token, worker_id, attempt, expires_at: {e}"
            ) from None
    if not isinstance(lease, Lease):
        raise InvalidInput(f"lease must be a Lease returned by claim, got {type(lease).__name__}")
    _run_id(lease.run_id)
    _item_id(lease.item_id)
    check_identifier(lease.token, "lease.token")
    check_identifier(lease.worker_id, "lease.worker_id")
    return lease


def _stage(stage: Any) -> str | None:
    if stage is None:
        return None
    return check_identifier(stage, "stage")


def _evidence(evidence: Any) -> dict[str, Any]:
    if evidence is None:
        return {}
    if not isinstance(evidence, dict):
        raise InvalidInput(f"evidence must be a JSON object, got {type(evidence).__name__}")
    try:
        text = json.dumps(evidence)
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"evidence must be JSON-serialisable: {e}") from None
    if len(text.encode()) > 64 * 1024:
        raise InvalidInput("evidence is larger than 64 KiB")
    return evidence


def _require_role(actor: Actor, roles: frozenset[str], command: str) -> None:
    if actor.role not in roles:
        raise NotAuthorized(
            f"role {actor.role!r} may not {command}; allowed roles: {S.describe_roles(roles)}"
        )


def _check_revision(expected: int | None, current: int, state: str, what: str) -> None:
    if expected is not None and expected != current:
        raise Conflict(
            f"{what} is at revision {current} (state {state}), not {expected}; re-read and retry",
            current_revision=current,
            current_state=state,
        )


def _require_run_state(run: Run, rule: S.Rule, command: str | None = None) -> None:
    if run.state in rule.sources:
        return
    name = command or rule.command
    allowed = ", ".join(sorted(rule.sources))
    if S.is_terminal(run.state):
        raise AlreadyTerminal(
            f"run {run.run_id} is {run.state}, which is terminal; {name} is allowed from: {allowed}. "
            "Corrections start a new linked run (retry, repair, compensate)",
            state=run.state,
            allowed=rule.sources,
        )
    raise IllegalTransition(
        f"run {run.run_id} is {run.state}; {name} is allowed from: {allowed}",
        state=run.state,
        allowed=rule.sources,
    )


def _require_item_state(
    run_id: str, item: Item | None, state: str, item_id: str, rule: S.Rule
) -> None:
    if state in rule.sources:
        return
    allowed = ", ".join(sorted(rule.sources))
    raise IllegalTransition(
        f"item {item_id!r} of run {run_id} is {state}; {rule.command} is allowed from: {allowed}",
        state=state,
        allowed=rule.sources,
    )


def _stamp(now: datetime, agg: Any) -> datetime:
    """Event times never move backwards within a stream."""
    if agg is not None and agg.modified_on is not None and agg.modified_on > now:
        return agg.modified_on  # type: ignore[no-any-return]
    return now


class Ledger:
    """The run ledger: commands and reads over one store. Safe to share between threads."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._projector = Projector()

    @classmethod
    def open(cls, dsn: str | None = None, clock: Callable[[], datetime] | None = None) -> Ledger:
        """Open a ledger: `sqlite:///path`, `postgresql://...`, `memory://`; else LEDGER_DSN,
        else `sqlite:///./ledger.db`. Creates the schema if missing."""
        if clock is not None and not callable(clock):
            raise InvalidInput("clock must be a callable returning an aware datetime")
        return cls(open_store(resolve_dsn(dsn), clock=clock))

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

    # ------------------------------------------------------------------
    # loading and saving
    # ------------------------------------------------------------------
    def _load_run(self, tx: Tx, run_id: str, lock: bool = True) -> Run:
        try:
            UUID(run_id)
        except ValueError:
            raise RunNotFound(run_id) from None
        row = tx.fetchone(tx.select_run_sql(lock), (run_id,))
        if row is None:
            raise RunNotFound(run_id)
        if "db_now" in row:
            tx.prime_now(row.pop("db_now"))
        return run_from_row(row)

    def _item_row(self, tx: Tx, run_id: str, item_id: str) -> dict[str, Any]:
        row = tx.fetchone(
            "SELECT * FROM lg_items WHERE run_id = ? AND item_id = ?", (run_id, item_id)
        )
        if row is None:
            raise ItemNotFound(run_id, item_id)
        return row

    def _item_rows(self, tx: Tx, run_id: str, item_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        ids = list(dict.fromkeys(item_ids))
        for k in range(0, len(ids), 500):
            chunk = ids[k : k + 500]
            marks = ", ".join("?" for _ in chunk)
            for row in tx.fetchall(
                f"SELECT * FROM lg_items WHERE run_id = ? AND item_id IN ({marks})",
                (run_id, *chunk),
            ):
                out[row["item_id"]] = row
        return out

    def _materialize(self, row: dict[str, Any], now: datetime) -> Item:
        """The item's aggregate; its stream begins now if it has none yet."""
        item = item_from_row(row)
        if item is None:
            item = Item._create(
                Item.Registered,
                id=item_stream_id(row["run_id"], row["item_id"]),
                run_id=row["run_id"],
                item_id=row["item_id"],
                timestamp=now,
            )
        return item

    def _commit(
        self, tx: Tx, runs: dict[str, Run], items: Sequence[Item] = (), first: str = "items"
    ) -> None:
        item_events = [e for it in items for e in it.collect_events()]
        run_events = [e for r in runs.values() for e in r.collect_events()]
        events = item_events + run_events if first == "items" else run_events + item_events
        if not events:
            return
        try:
            positioned = tx.append(cast("list[DomainEvent]", events))
        except StreamConflict as e:
            run = next(iter(runs.values()))
            raise Conflict(
                f"another writer changed run {run.run_id} first; re-read and retry ({e})",
                current_revision=run.version,
                current_state=run.state,
            ) from None
        item_map = {(it.run_id, it.item_id): it for it in items}
        self._projector.project(tx, positioned, runs, item_map)

    def _finish_if_drained(self, tx: Tx, run: Run, now: datetime) -> str | None:
        """A pausing or canceling run ends in the transaction that ends its last live lease."""
        if run.counts[S.IN_PROGRESS] != 0:
            return None
        if run.state == S.CANCELING:
            self._skip_remaining(tx, run, now)
            run.transition(
                "cancel_finished",
                S.CANCELED,
                LEDGER.id,
                LEDGER.role,
                "cancel finished: the last live lease ended",
                {},
                _stamp(now, run),
            )
            self._commit(tx, {run.run_id: run})
            return "cancel"
        if run.state == S.PAUSING:
            run.transition(
                "pause_finished",
                S.PAUSED,
                LEDGER.id,
                LEDGER.role,
                "pause finished: the last live lease ended",
                {},
                _stamp(now, run),
            )
            self._commit(tx, {run.run_id: run})
            return "pause"
        return None

    def _skip_remaining(self, tx: Tx, run: Run, now: datetime) -> None:
        rows = tx.fetchall(
            "SELECT * FROM lg_items WHERE run_id = ? AND state IN ('pending', 'retryable') "
            "ORDER BY seq",
            (run.run_id,),
        )
        items = []
        for row in rows:
            item = self._materialize(row, now)
            item.transition(
                "cancel_skip", S.SKIPPED, LEDGER.id, LEDGER.role, "canceled", {}, _stamp(now, item)
            )
            items.append(item)
        self._commit(tx, {run.run_id: run}, items)

    # ------------------------------------------------------------------
    # run commands
    # ------------------------------------------------------------------
    @command("submit")
    def submit(self, manifest: Manifest | dict[str, Any] | str | bytes, actor: Actor) -> RunStatus:
        """Record a new run, `queued`."""
        from .manifest import parse_manifest_json

        _m, plain, text = parse_manifest_json(manifest)
        actor = _actor(actor)
        _require_role(actor, S.run_rule("submit").roles, "submit")
        return self._create_run(
            plain, actor, "submit", None, [], None, input_version=input_version_of_text(text)
        )

    def _create_run(
        self,
        manifest: dict[str, Any],
        actor: Actor,
        command: str,
        reason: str | None,
        links: list[dict[str, str]],
        original: Run | None,
        tx: Tx | None = None,
        input_version: str | None = None,
    ) -> RunStatus:
        run_id = str(uuid.uuid4())
        if tx is None:
            with self.store.write() as tx2:
                return self._create_run(
                    manifest, actor, command, reason, links, original, tx2, input_version
                )
        now = tx.now()
        run = Run._create(
            Run.Submitted,
            id=run_stream_id(run_id),
            run_id=run_id,
            command=command,
            manifest=manifest,
            input_version=input_version or input_version_of(manifest),
            actor_id=actor.id,
            role=actor.role,
            reason=reason,
            links=links,
            root_run_id=original.root_run_id if original else run_id,
            timestamp=now,
        )
        runs = {run_id: run}
        if original is not None:
            runs[original.run_id] = original
        self._commit(tx, runs)
        return self._status_tx(tx, run_id)

    def _run_transition(
        self,
        run_id: Any,
        actor: Any,
        command: str,
        expected_revision: Any,
        decide: Callable[[Tx, Run, datetime], tuple[str, str | None, dict[str, Any]]],
        reason: str | None = None,
        validate: Callable[[Actor], None] | None = None,
    ) -> RunStatus:
        run_id = _run_id(run_id)
        actor = _actor(actor)
        expected = _revision(expected_revision)
        if validate:
            validate(actor)
        rule = S.run_rule(command)
        with self.store.write() as tx:
            run = self._load_run(tx, run_id)
            _require_role(actor, rule.roles, command)
            _check_revision(expected, run.version, run.state, f"run {run_id}")
            _require_run_state(run, rule)
            now = tx.now()
            to_state, why, evidence = decide(tx, run, now)
            run.transition(
                command,
                to_state,
                actor.id,
                actor.role,
                why if why is not None else reason,
                evidence,
                _stamp(now, run),
            )
            self._commit(tx, {run_id: run}, first="run")
            return self._status_tx(tx, run_id)

    @command("start")
    def start(self, run_id: str, actor: Actor, expected_revision: int | None = None) -> RunStatus:
        """queued -> running."""
        return self._run_transition(
            run_id, actor, "start", expected_revision, lambda tx, run, now: (S.RUNNING, None, {})
        )

    @command("request_review")
    def request_review(
        self, run_id: str, actor: Actor, decision: str, expected_revision: int | None = None
    ) -> RunStatus:
        """running -> awaiting_review, bound to the current input version."""
        check_identifier(decision, "decision")

        def decide(tx: Tx, run: Run, now: datetime) -> tuple[str, str | None, dict[str, Any]]:
            review = run.policy.get("review")
            if review and review["decision"] != decision:
                raise InvalidInput(
                    f"decision {decision!r} is not the policy's review decision "
                    f"{review['decision']!r}"
                )
            return (
                S.AWAITING_REVIEW,
                f"awaiting review: {decision}",
                {"decision": decision, "input_version": run.input_version},
            )

        return self._run_transition(run_id, actor, "request_review", expected_revision, decide)

    @command("decide")
    def decide(
        self,
        run_id: str,
        actor: Actor,
        input_version: str,
        approve: bool,
        reason: str | None,
        expected_revision: int | None = None,
    ) -> RunStatus:
        """A review decision for a named input version: approve -> running, reject -> failed."""
        if not isinstance(input_version, str) or not input_version:
            raise InvalidInput("input_version must be the input version under review (a string)")
        if not isinstance(approve, bool):
            raise InvalidInput(f"approve must be true or false, got {approve!r}")
        reason = _reason(reason)

        def decide(tx: Tx, run: Run, now: datetime) -> tuple[str, str | None, dict[str, Any]]:
            bound = (run.review or {}).get("input_version", run.input_version)
            if input_version != bound:
                raise StaleReview(
                    f"run {run.run_id} awaits review of input version {bound}, not {input_version}; "
                    "the input changed since: review the current version",
                    expected_version=bound,
                )
            ev = {
                "input_version": input_version,
                "approve": approve,
                "decision": (run.review or {}).get("decision"),
            }
            if approve:
                return S.RUNNING, reason, ev
            ev.update(failure_kind=S.PERMANENT, failure_reason="review_rejected")
            return S.FAILED, reason, ev

        return self._run_transition(run_id, actor, "decide", expected_revision, decide)

    @command("approve")
    def approve(
        self, run_id: str, actor: Actor, input_version: str, reason: str = "approved"
    ) -> RunStatus:
        """Shorthand for decide(approve=True)."""
        return self.decide(run_id, actor, input_version, True, reason)

    @command("pause")
    def pause(
        self,
        run_id: str,
        actor: Actor,
        reason: str | None = None,
        expected_revision: int | None = None,
    ) -> RunStatus:
        """running -> pausing (live leases finish first) or paused."""
        reason = _reason(reason)
        return self._run_transition(
            run_id,
            actor,
            "pause",
            expected_revision,
            lambda tx, run, now: (
                (S.PAUSING if run.counts[S.IN_PROGRESS] else S.PAUSED),
                reason,
                {"in_flight": run.counts[S.IN_PROGRESS]},
            ),
        )

    @command("resume")
    def resume(
        self,
        run_id: str,
        actor: Actor,
        expected_revision: int | None = None,
        reason: str | None = None,
    ) -> RunStatus:
        """pausing or paused -> running."""
        reason = _reason(reason)
        return self._run_transition(
            run_id, actor, "resume", expected_revision, lambda tx, run, now: (S.RUNNING, reason, {})
        )

    @command("cancel")
    def cancel(
        self,
        run_id: str,
        actor: Actor,
        reason: str | None = None,
        expected_revision: int | None = None,
    ) -> CancelOutcome:
        """Record the durable intent to cancel; canceled at once when no lease is live."""
        run_id = _run_id(run_id)
        actor = _actor(actor)
        reason = _reason(reason)
        expected = _revision(expected_revision)
        rule = S.run_rule("cancel")
        attempts = 1 if expected is not None else CANCEL_RETRIES
        for attempt in range(attempts):
            try:
                return self._cancel_once(run_id, actor, reason, expected, rule)
            except Conflict:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _cancel_once(
        self, run_id: str, actor: Actor, reason: str | None, expected: int | None, rule: S.Rule
    ) -> CancelOutcome:
        with self.store.write() as tx:
            run = self._load_run(tx, run_id)
            _require_role(actor, rule.roles, "cancel")
            _check_revision(expected, run.version, run.state, f"run {run_id}")
            if run.state in (S.CANCELING, S.CANCELED):
                return CancelOutcome(run_id, run.state, run.counts[S.IN_PROGRESS], already=True)
            if run.state in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
                raise AlreadyTerminal(
                    f"run {run_id} is {run.state}: completion won the race, nothing to cancel; "
                    "to undo its effects start a compensation run",
                    state=run.state,
                    allowed=rule.sources,
                )
            _require_run_state(run, rule)
            now = tx.now()
            in_flight = run.counts[S.IN_PROGRESS]
            to_state = S.CANCELING if in_flight else S.CANCELED
            run.transition(
                "cancel",
                to_state,
                actor.id,
                actor.role,
                reason or "canceled",
                {"in_flight": in_flight},
                _stamp(now, run),
            )
            self._commit(tx, {run_id: run}, first="run")
            self._skip_remaining(tx, run, now)
            return CancelOutcome(run_id, run.state, in_flight, already=False)

    @command("complete")
    def complete(
        self, run_id: str, actor: Actor, expected_revision: int | None = None
    ) -> RunStatus:
        """running -> succeeded or completed_with_errors, else NotComplete naming what blocks it."""
        run_id = _run_id(run_id)
        actor = _actor(actor)
        expected = _revision(expected_revision)
        rule = S.run_rule("complete")
        with self.store.write() as tx:
            run = self._load_run(tx, run_id)
            _require_role(actor, rule.roles, "complete")
            _check_revision(expected, run.version, run.state, f"run {run_id}")
            if run.state in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
                return self._status_tx(tx, run_id)
            _require_run_state(run, rule)
            open_ = {
                s: run.counts[s] for s in (S.PENDING, S.IN_PROGRESS, S.RETRYABLE) if run.counts[s]
            }
            if open_:
                desc = ", ".join(f"{n} {s}" for s, n in open_.items())
                raise NotComplete(
                    f"run {run_id} still has work: {desc}; complete needs every item "
                    "accepted, rejected, skipped or quarantined",
                    state=run.state,
                    allowed=rule.sources,
                )
            review = run.policy.get("review")
            if review:
                approved = (run.review or {}).get("approved_version")
                ok = approved == run.input_version or (
                    approved is not None and review.get("survives_amendment")
                )
                if not ok:
                    raise NotComplete(
                        f"run {run_id} needs an approval of {review['decision']!r} for input version "
                        f"{run.input_version}" + (f" (approved: {approved})" if approved else ""),
                        state=run.state,
                        allowed=rule.sources,
                    )
            rows = tx.fetchall(
                "SELECT item_id, state, required, reason FROM lg_items WHERE run_id = ? "
                "AND in_manifest = 1 AND state <> 'accepted' ORDER BY seq",
                (run_id,),
            )
            required_total = tx.fetchone(
                "SELECT COUNT(*) AS n FROM lg_items WHERE run_id = ? AND "
                "in_manifest = 1 AND required = 1",
                (run_id,),
            )
            assert required_total is not None
            missing = [r for r in rows if r["required"]]
            policy = _policy(run.policy)
            now = tx.now()
            if not missing:
                to_state, why = S.SUCCEEDED, "succeeded: every required item accepted"
            elif policy.partial_delivery and len(missing) <= policy.tolerated(
                int(required_total["n"])
            ):
                to_state = S.COMPLETED_WITH_ERRORS
                why = (
                    f"completed with errors: {len(missing)} of {required_total['n']} required items "
                    f"not accepted (tolerated {policy.tolerated(int(required_total['n']))})"
                )
            else:
                tol = policy.tolerated(int(required_total["n"])) if policy.partial_delivery else 0
                ids = ", ".join(f"{r['item_id']} ({r['state']})" for r in missing[:10])
                raise NotComplete(
                    f"run {run_id}: {len(missing)} required items not accepted, {tol} tolerated "
                    f"(partial_delivery={policy.partial_delivery}): {ids}",
                    state=run.state,
                    allowed=rule.sources,
                )
            evidence = {
                "counts": dict(run.counts),
                "not_accepted": [
                    {
                        "item_id": r["item_id"],
                        "state": r["state"],
                        "required": bool(r["required"]),
                        "reason": r["reason"],
                    }
                    for r in rows[:100]
                ],
            }
            run.transition(
                "complete", to_state, actor.id, actor.role, why, evidence, _stamp(now, run)
            )
            self._commit(tx, {run_id: run})
            return self._status_tx(tx, run_id)

    @command("fail")
    def fail(
        self,
        run_id: str,
        actor: Actor,
        reason: str,
        transient: bool,
        failure_reason: str | None = None,
        expected_revision: int | None = None,
    ) -> RunStatus:
        """-> failed (transient or permanent); live leases are fenced (attempts end abandoned)."""
        reason = _reason(reason, required=True)
        if not isinstance(transient, bool):
            raise InvalidInput(f"transient must be true or false, got {transient!r}")
        if failure_reason is not None and failure_reason not in S.FAILURE_REASONS:
            raise InvalidInput(
                f"failure_reason {failure_reason!r} is not one of: {', '.join(S.FAILURE_REASONS)}"
            )

        def validate(actor: Actor) -> None:
            pass

        def decide(tx: Tx, run: Run, now: datetime) -> tuple[str, str | None, dict[str, Any]]:
            self._fence(tx, run, now)
            kind = S.TRANSIENT if transient else S.PERMANENT
            fr = failure_reason or ("operator_decision" if actor_.role == S.OPERATOR else None)
            return S.FAILED, reason, {"failure_kind": kind, "failure_reason": fr}

        actor_ = _actor(actor)
        if actor_.role == S.OPERATOR and not transient:
            # checked in role order: only after existence
            with self.store.read() as tx:
                self._load_run(tx, _run_id(run_id), lock=False)
            raise NotAuthorized(
                "role 'operator' may only record transient failures; "
                "permanent failures are the controller's decision"
            )
        return self._run_transition(
            run_id, actor_, "fail", expected_revision, decide, validate=validate
        )

    def _fence(self, tx: Tx, run: Run, now: datetime) -> None:
        rows = tx.fetchall(
            "SELECT * FROM lg_items WHERE run_id = ? AND state = 'in_progress' ORDER BY seq",
            (run.run_id,),
        )
        items = []
        for row in rows:
            item = self._materialize(row, now)
            item.transition(
                "abandon",
                S.RETRYABLE,
                LEDGER.id,
                LEDGER.role,
                "run failed: lease fenced",
                {"lease_token": item.lease_token, "attempt": item.attempts, "outcome": "abandoned"},
                _stamp(now, item),
            )
            items.append(item)
        if items:
            self._commit(tx, {run.run_id: run}, items)

    @command("amend")
    def amend(
        self,
        run_id: str,
        actor: Actor,
        reason: str | None,
        items: list[Any] | None = None,
        withdraw: list[str] | None = None,
        policy: dict[str, Any] | None = None,
        expected_revision: int | None = None,
    ) -> RunStatus:
        """Add or replace items, withdraw item ids, or change policy: a new input version."""
        run_id = _run_id(run_id)
        actor = _actor(actor)
        reason = _reason(reason)
        expected = _revision(expected_revision)
        new_items = parse_items(items) if items is not None else []
        if withdraw is not None and (
            not isinstance(withdraw, list) or not all(isinstance(w, str) for w in withdraw)
        ):
            raise InvalidInput("withdraw must be a list of item ids")
        withdraw = list(dict.fromkeys(withdraw or []))
        for w in withdraw:
            _item_id(w)
        if policy is not None and not isinstance(policy, dict):
            raise ManifestInvalid("policy must be an object", field="policy")
        if not new_items and not withdraw and policy is None:
            raise InvalidInput("amend needs items, withdraw or policy")
        overlap = {i.item_id for i in new_items} & set(withdraw)
        if overlap:
            raise InvalidInput(f"items {sorted(overlap)} are both replaced and withdrawn")
        roles = S.RUN_COMMAND_ROLES["amend"]
        with self.store.write() as tx:
            run = self._load_run(tx, run_id)
            for w in withdraw:  # existence before role (SPEC order of checks)
                self._item_row(tx, run_id, w)
            _require_role(actor, roles, "amend")
            _check_revision(expected, run.version, run.state, f"run {run_id}")
            if S.is_terminal(run.state):
                raise AlreadyTerminal(
                    f"run {run_id} is {run.state}, which is terminal; amend is allowed "
                    "while it is not terminal (a repair starts a new linked run)",
                    state=run.state,
                    allowed=set(S.RUN_STATES) - S.TERMINAL_RUN_STATES,
                )
            if run.state == S.CANCELING:
                raise IllegalTransition(
                    f"run {run_id} is canceling; amend is not allowed",
                    state=run.state,
                    allowed=set(S.RUN_STATES) - S.TERMINAL_RUN_STATES - {S.CANCELING},
                )
            new_policy = (
                _policy(run.policy, policy).model_dump(mode="json") if policy is not None else None
            )
            rows = {
                r["item_id"]: r
                for r in tx.fetchall(
                    "SELECT item_id, required, payload, state, in_manifest, revision, attempts, lease_token, "
                    "lease_worker, lease_expires_at, eligible_at, last_error, reason, updated_at, run_id "
                    "FROM lg_items WHERE run_id = ? ORDER BY seq",
                    (run_id,),
                )
            }
            added, replaced = [], []
            editable = {S.PENDING, S.RETRYABLE, S.QUARANTINED}
            for it in new_items:
                d = it.model_dump(mode="json")
                row = rows.get(it.item_id)
                if row is None:
                    added.append(d)
                elif row["state"] in editable and row["in_manifest"]:
                    replaced.append(d)
                else:
                    raise IllegalTransition(
                        f"item {it.item_id!r} is {row['state']}"
                        f"{'' if row['in_manifest'] else ' (withdrawn)'}; only pending, "
                        "retryable or quarantined items may be replaced",
                        state=row["state"],
                        allowed=editable,
                    )
            wd_rule = S.item_rule("withdraw")
            for w in withdraw:
                row = rows.get(w)
                if row is None:
                    raise ItemNotFound(run_id, w)
                if row["state"] not in wd_rule.sources or not row["in_manifest"]:
                    raise IllegalTransition(
                        f"item {w!r} is {row['state']}; withdraw is allowed from: "
                        f"{', '.join(sorted(wd_rule.sources))}",
                        state=row["state"],
                        allowed=wd_rule.sources,
                    )
            # the new input version: digest of the manifest as it now stands
            manifest_items = []
            repl = {d["item_id"]: d for d in replaced}
            for item_id, row in rows.items():
                if not row["in_manifest"] or item_id in withdraw:
                    continue
                manifest_items.append(
                    repl.get(item_id)
                    or {
                        "item_id": item_id,
                        "required": bool(row["required"]),
                        "payload": json.loads(row["payload"]),
                    }
                )
            manifest_items.extend(added)
            manifest = self._manifest_of(run, manifest_items, new_policy or run.policy)
            now = tx.now()
            at = _stamp(now, run)
            withdrawn_items = []
            for w in withdraw:
                item = self._materialize(rows[w], now)
                item.transition(
                    "withdraw",
                    S.SKIPPED,
                    actor.id,
                    actor.role,
                    reason or "withdrawn",
                    {"withdrawn": True},
                    _stamp(now, item),
                )
                withdrawn_items.append(item)
            run.amend(
                actor.id,
                actor.role,
                reason,
                added,
                replaced,
                withdraw,
                new_policy,
                input_version_of(manifest),
                at,
            )
            self._commit(tx, {run_id: run}, withdrawn_items, first="run")
            return self._status_tx(tx, run_id)

    @staticmethod
    def _manifest_of(
        run: Run, items: list[dict[str, Any]], policy: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "source_version": run.source_version,
            "config_version": run.config_version,
            "scope": run.scope,
            "items": items,
            "policy": policy,
        }

    def _current_manifest(
        self, tx: Tx, run: Run, where: str = "", params: Sequence[Any] = ()
    ) -> dict[str, Any]:
        rows = tx.fetchall(
            "SELECT item_id, required, payload FROM lg_items WHERE run_id = ? AND in_manifest = 1"
            + where
            + " ORDER BY seq",
            (run.run_id, *params),
        )
        items = [
            {
                "item_id": r["item_id"],
                "required": bool(r["required"]),
                "payload": json.loads(r["payload"]),
            }
            for r in rows
        ]
        return self._manifest_of(run, items, run.policy)

    @command("retry")
    def retry(self, run_id: str, actor: Actor, reason: str | None = None) -> RunStatus:
        """A new run replaying a failed(transient) run's latest input exactly."""
        run_id = _run_id(run_id)
        actor = _actor(actor)
        reason = _reason(reason)
        rule = S.run_rule("retry")
        with self.store.write() as tx:
            original = self._load_run(tx, run_id)
            _require_role(actor, rule.roles, "retry")
            if original.state != S.FAILED or original.failure_kind != S.TRANSIENT:
                raise IllegalTransition(
                    f"run {run_id} is {original.state}"
                    + (f" ({original.failure_kind})" if original.failure_kind else "")
                    + "; retry needs a failed(transient) run (use repair for other cases)",
                    state=original.state,
                    allowed={S.FAILED},
                )
            manifest = self._current_manifest(tx, original)
            return self._create_run(
                manifest,
                actor,
                "retry",
                reason or f"retry of {run_id}",
                [{"relation": "retry_of", "run_id": run_id}],
                original,
                tx,
            )

    @command("repair")
    def repair(
        self,
        run_id: str,
        actor: Actor,
        items: list[str] | None = None,
        corrections: list[Any] | None = None,
        reason: str | None = None,
    ) -> RunStatus:
        """A new linked run for the items not accepted (or given ids), or for corrected items."""
        run_id = _run_id(run_id)
        actor = _actor(actor)
        reason = _reason(reason)
        if items is not None and (
            not isinstance(items, list) or not all(isinstance(i, str) for i in items)
        ):
            raise InvalidInput("items must be a list of item ids")
        fixed = parse_items(corrections, "corrections") if corrections is not None else None
        rule = S.run_rule("repair")
        with self.store.write() as tx:
            original = self._load_run(tx, run_id)
            for named in [*(items or []), *(f.item_id for f in fixed or [])]:
                self._item_row(tx, run_id, named)  # existence before role (SPEC order of checks)
            _require_role(actor, rule.roles, "repair")
            if not S.is_terminal(original.state):
                raise IllegalTransition(
                    f"run {run_id} is {original.state}; repair needs a terminal run "
                    "(amend a run that is still open)",
                    state=original.state,
                    allowed=S.TERMINAL_RUN_STATES,
                )
            if fixed:
                known = {
                    r["item_id"]
                    for r in tx.fetchall("SELECT item_id FROM lg_items WHERE run_id = ?", (run_id,))
                }
                manifest = self._manifest_of(
                    original, [f.model_dump(mode="json") for f in fixed], original.policy
                )
                relation = "correction_of"
                unknown = [f.item_id for f in fixed if f.item_id not in known]
                if unknown:
                    raise ItemNotFound(run_id, unknown[0])
            elif items:
                manifest = self._current_manifest(tx, original)
                by_id = {i["item_id"]: i for i in manifest["items"]}
                missing = [i for i in items if i not in by_id]
                if missing:
                    raise ItemNotFound(run_id, missing[0])
                manifest["items"] = [by_id[i] for i in dict.fromkeys(items)]
                relation = "repair_of"
            else:
                manifest = self._current_manifest(tx, original, " AND state <> 'accepted'")
                relation = "repair_of"
            if not manifest["items"]:
                raise InvalidInput(f"run {run_id} has no items to repair: every item was accepted")
            return self._create_run(
                manifest,
                actor,
                "repair",
                reason or f"{relation.replace('_', ' ')} {run_id}",
                [{"relation": relation, "run_id": run_id}],
                original,
                tx,
            )

    @command("compensate")
    def compensate(
        self, run_id: str, actor: Actor, reason: str, items: list[Any] | None = None
    ) -> RunStatus:
        """A separately authorized new run that undoes effects of a run (default: its accepted items)."""
        run_id = _run_id(run_id)
        actor = _actor(actor)
        reason = _reason(reason, required=True)
        rule = S.run_rule("compensate")
        ids: list[str] | None = None
        given: list[ManifestItem] | None = None
        if items is not None:
            if not isinstance(items, list):
                raise InvalidInput("items must be a list of item ids or item objects")
            if all(isinstance(i, str) for i in items):
                ids = items
            else:
                given = parse_items(items)
        with self.store.write() as tx:
            original = self._load_run(tx, run_id)
            for named in ids or []:
                self._item_row(tx, run_id, named)  # existence before role (SPEC order of checks)
            _require_role(actor, rule.roles, "compensate")
            if original.state not in S.TERMINAL_RUN_STATES:
                raise IllegalTransition(
                    f"run {run_id} is {original.state}; compensate needs a terminal run "
                    "(cancel it first)",
                    state=original.state,
                    allowed=S.TERMINAL_RUN_STATES,
                )
            if given is not None:
                manifest = self._manifest_of(
                    original, [g.model_dump(mode="json") for g in given], original.policy
                )
            else:
                manifest = self._current_manifest(tx, original, " AND state = 'accepted'")
                if ids is not None:
                    by_id = {i["item_id"]: i for i in self._current_manifest(tx, original)["items"]}
                    missing = [i for i in ids if i not in by_id]
                    if missing:
                        raise ItemNotFound(run_id, missing[0])
                    manifest["items"] = [by_id[i] for i in dict.fromkeys(ids)]
            if not manifest["items"]:
                raise InvalidInput(
                    f"run {run_id} has no accepted items to compensate; name items explicitly"
                )
            policy = dict(original.policy)
            policy["review"] = None
            policy["partial_delivery"] = False
            policy["tolerated_failures"] = None
            manifest["policy"] = policy
            return self._create_run(
                manifest,
                actor,
                "compensate",
                reason,
                [{"relation": "compensates", "run_id": run_id}],
                original,
                tx,
            )

    # ------------------------------------------------------------------
    # item commands
    # ------------------------------------------------------------------
    @command("claim")
    def claim(
        self, run_id: str, worker: Actor, limit: int = 1, expected_revision: int | None = None
    ) -> list[Lease]:
        """Lease up to `limit` claimable items in one transaction; [] when none is claimable."""
        run_id = _run_id(run_id)
        worker = _actor(worker, "worker")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CLAIM:
            raise InvalidInput(f"limit must be an integer from 1 to {MAX_CLAIM}, got {limit!r}")
        expected = _revision(expected_revision)
        rule = S.item_rule("claim")
        with self.store.write() as tx:
            run = self._load_run(tx, run_id)
            _require_role(worker, rule.roles, "claim")
            _check_revision(expected, run.version, run.state, f"run {run_id}")
            if run.state != S.RUNNING:
                cls = AlreadyTerminal if S.is_terminal(run.state) else IllegalTransition
                raise cls(
                    f"run {run_id} is {run.state}; items are claimed only while it is running",
                    state=run.state,
                    allowed={S.RUNNING},
                )
            now = tx.now()
            policy = run.policy
            deadline_passed = (
                policy.get("item_deadline_seconds") is not None
                and run.started_at is not None
                and now > run.started_at + timedelta(seconds=policy["item_deadline_seconds"])
            )
            if deadline_passed:
                rows = tx.fetchall(
                    "SELECT * FROM lg_items WHERE run_id = ? AND state = 'pending' "
                    "ORDER BY seq LIMIT ?",
                    (run_id, limit),
                )
            else:
                # two index range scans (run_id, state, seq) instead of one scan over every
                # item of the run: an OR across states defeats the index on both stores
                rows = tx.fetchall(
                    "SELECT * FROM (SELECT * FROM (SELECT * FROM lg_items WHERE run_id = ? AND state = 'pending' "
                    "ORDER BY seq LIMIT ?) AS p UNION ALL SELECT * FROM (SELECT * FROM lg_items WHERE run_id = ? "
                    "AND state = 'retryable' AND (eligible_at IS NULL OR eligible_at <= ?) ORDER BY seq LIMIT ?) "
                    "AS r) AS c ORDER BY seq LIMIT ?",
                    (run_id, limit, run_id, iso(now), limit, limit),
                )
            leases, items = [], []
            for row in rows:
                item = self._materialize(row, now)
                at = _stamp(now, item)
                token = uuid.uuid4().hex
                expires = at + timedelta(seconds=policy["lease_seconds"])
                attempt = item.attempts + 1
                item.transition(
                    "claim",
                    S.IN_PROGRESS,
                    worker.id,
                    worker.role,
                    None,
                    {"lease_token": token, "attempt": attempt, "expires_at": iso(expires)},
                    at,
                )
                items.append(item)
                leases.append(
                    Lease(
                        run_id,
                        item.item_id,
                        token,
                        worker.id,
                        attempt,
                        expires,
                        json.loads(row["payload"]),
                    )
                )
            self._commit(tx, {run_id: run}, items)
            return leases

    def _check_lease(
        self, tx: Tx, run: Run, lease: Lease, now: datetime, row: dict[str, Any] | None = None
    ) -> tuple[Item, dict[str, Any]]:
        if row is None:
            row = self._item_row(tx, lease.run_id, lease.item_id)
        item = item_from_row(row)
        if (
            item is None
            or item.state != S.IN_PROGRESS
            or item.lease_token != lease.token
            or item.lease_worker != lease.worker_id
        ):
            state = row["state"]
            raise LeaseLost(
                f"lease {lease.token[:8]} on item {lease.item_id!r} of run {lease.run_id} is not "
                f"live: the item is {state}"
                + (" under another lease" if state == S.IN_PROGRESS else "")
                + "; stop working on it"
            )
        assert item.lease_expires_at is not None
        if item.lease_expires_at < iso(now):  # type: ignore[operator]
            raise LeaseLost(
                f"lease {lease.token[:8]} on item {lease.item_id!r} of run {lease.run_id} expired "
                f"at {item.lease_expires_at}; stop working on it"
            )
        return item, row

    @command("heartbeat")
    def heartbeat(self, lease: Lease) -> Lease:
        """Extend a live lease by the run's lease_seconds; LeaseLost if it is not live."""
        lease = _lease(lease)
        with self.store.write() as tx:
            run = self._load_run(tx, lease.run_id)
            now = tx.now()
            item, row = self._check_lease(tx, run, lease, now)
            at = _stamp(now, item)
            expires = at + timedelta(seconds=run.policy["lease_seconds"])
            item.extend_lease(iso(expires) or "", lease.worker_id, at)
            self._commit(tx, {run.run_id: run}, [item])
            return Lease(
                lease.run_id,
                lease.item_id,
                lease.token,
                lease.worker_id,
                item.attempts,
                expires,
                json.loads(row["payload"]),
            )

    def _apply_outcome(
        self, tx: Tx, run: Run, o: Outcome, now: datetime, row: dict[str, Any] | None = None
    ) -> Item:
        item, _row = self._check_lease(tx, run, o.lease, now, row)
        at = _stamp(now, item)
        base = {"lease_token": o.lease.token, "attempt": item.attempts, "stage": o.stage}
        if o.kind == "accept":
            item.transition(
                "accept",
                S.ACCEPTED,
                o.lease.worker_id,
                S.WORKER,
                "accepted",
                {**base, "outcome": "accepted", "evidence": o.evidence or {}},
                at,
            )
        elif o.kind == "reject":
            item.transition(
                "reject",
                S.REJECTED,
                o.lease.worker_id,
                S.WORKER,
                o.rule,
                {**base, "outcome": "rejected", "rule": o.rule, "detail": o.detail},
                at,
            )
        else:
            policy = run.policy
            deadline = policy.get("item_deadline_seconds")
            past = (
                deadline is not None
                and run.started_at is not None
                and at > run.started_at + timedelta(seconds=deadline)
            )
            exhausted = item.attempts >= policy["max_attempts"]
            error = clean_error(o.error or "")
            if not o.retryable or exhausted or past:
                why = (
                    "not retryable"
                    if not o.retryable
                    else f"attempts exhausted ({item.attempts} of {policy['max_attempts']})"
                    if exhausted
                    else "item deadline passed"
                )
                item.transition(
                    "fail_attempt",
                    S.QUARANTINED,
                    o.lease.worker_id,
                    S.WORKER,
                    why,
                    {**base, "outcome": "failed", "error": error},
                    at,
                )
            else:
                eligible = at + timedelta(seconds=policy["backoff_seconds"])
                item.transition(
                    "fail_attempt",
                    S.RETRYABLE,
                    o.lease.worker_id,
                    S.WORKER,
                    "attempt failed",
                    {**base, "outcome": "failed", "error": error, "eligible_at": iso(eligible)},
                    at,
                )
        return item

    def _outcome(self, o: Outcome) -> ItemStatus:
        with self.store.write() as tx:
            run = self._load_run(tx, o.lease.run_id)
            now = tx.now()
            item = self._apply_outcome(tx, run, o, now)
            self._commit(tx, {run.run_id: run}, [item])
            self._finish_if_drained(tx, run, now)
            return self._item_status_tx(tx, run.run_id, item.item_id)

    @command("accept")
    def accept(
        self, lease: Lease, evidence: dict[str, Any] | None = None, stage: str | None = None
    ) -> ItemStatus:
        """in_progress -> accepted, with the live lease's token."""
        return self._outcome(
            Outcome(_lease(lease), "accept", evidence=_evidence(evidence), stage=_stage(stage))
        )

    @command("reject")
    def reject(
        self, lease: Lease, rule: str, detail: str | None = None, stage: str | None = None
    ) -> ItemStatus:
        """in_progress -> rejected (the item breaks a rule; final)."""
        check_identifier(rule, "rule")
        return self._outcome(
            Outcome(
                _lease(lease),
                "reject",
                rule=rule,
                detail=_reason(detail, "detail"),
                stage=_stage(stage),
            )
        )

    @command("fail_attempt")
    def fail_attempt(
        self, lease: Lease, error: str, stage: str | None = None, retryable: bool = True
    ) -> ItemStatus:
        """in_progress -> retryable, or quarantined when attempts are exhausted or not retryable."""
        if not isinstance(error, str):
            raise InvalidInput(f"error must be a string, got {type(error).__name__}")
        if not isinstance(retryable, bool):
            raise InvalidInput(f"retryable must be true or false, got {retryable!r}")
        return self._outcome(
            Outcome(_lease(lease), "fail", error=error, stage=_stage(stage), retryable=retryable)
        )

    @command("record")
    def record(self, outcomes: Sequence[Outcome]) -> list[ItemStatus | LedgerError]:
        """Record many outcomes, one transaction per run. A lost lease is returned, not raised."""
        checked: list[Outcome] = []
        for o in outcomes:
            if not isinstance(o, Outcome) or o.kind not in ("accept", "reject", "fail"):
                raise InvalidInput(
                    "record takes Outcome(lease, kind='accept'|'reject'|'fail', ...) values"
                )
            checked.append(
                Outcome(
                    _lease(o.lease),
                    o.kind,
                    _evidence(o.evidence),
                    _stage(o.stage),
                    o.rule,
                    _reason(o.detail, "detail"),
                    o.error,
                    o.retryable,
                )
            )
        results: dict[int, ItemStatus | LedgerError] = {}
        by_run: dict[str, list[int]] = {}
        for i, o in enumerate(checked):
            by_run.setdefault(o.lease.run_id, []).append(i)
        for run_id, idxs in by_run.items():
            with self.store.write() as tx:
                try:
                    run = self._load_run(tx, run_id)
                except RunNotFound as e:
                    for i in idxs:
                        results[i] = e
                    continue
                now = tx.now()
                rows = self._item_rows(tx, run_id, [checked[i].lease.item_id for i in idxs])
                items: list[Item] = []
                done: dict[str, Item] = {}
                for i in idxs:
                    o = checked[i]
                    if o.lease.item_id in done:
                        results[i] = InvalidInput(
                            f"item {o.lease.item_id!r} appears twice in one record call"
                        )
                        continue
                    row = rows.get(o.lease.item_id)
                    if row is None:
                        results[i] = ItemNotFound(run_id, o.lease.item_id)
                        continue
                    try:
                        item = self._apply_outcome(tx, run, o, now, row)
                    except LeaseLost as e:
                        results[i] = e
                        continue
                    items.append(item)
                    done[o.lease.item_id] = item
                self._commit(tx, {run_id: run}, items)
                self._finish_if_drained(tx, run, now)
                for i in idxs:
                    if i not in results:
                        item_id = checked[i].lease.item_id
                        results[i] = _item_status(_merged_row(rows[item_id], done[item_id]))
        return [results[i] for i in range(len(checked))]

    def _item_command(
        self,
        run_id: Any,
        item_id: Any,
        actor: Any,
        command: str,
        to_state: str,
        reason: str | None,
        evidence: dict[str, Any],
        expected_revision: Any,
    ) -> ItemStatus:
        run_id = _run_id(run_id)
        item_id = _item_id(item_id)
        actor = _actor(actor)
        expected = _revision(expected_revision)
        rule = S.item_rule(command)
        with self.store.write() as tx:
            run = self._load_run(tx, run_id)
            row = self._item_row(tx, run_id, item_id)
            _require_role(actor, rule.roles, command.replace("_", " "))
            _check_revision(expected, row["revision"], row["state"], f"item {item_id!r}")
            if S.is_terminal(run.state):
                raise AlreadyTerminal(
                    f"run {run_id} is {run.state}, which is terminal; its items never change",
                    state=run.state,
                    allowed=set(S.RUN_STATES) - S.TERMINAL_RUN_STATES,
                )
            now = tx.now()
            item = self._materialize(row, now)
            _require_item_state(run_id, item, row["state"], item_id, rule)
            extra = {"eligible_at": iso(now)} if to_state == S.RETRYABLE else {}
            item.transition(
                command,
                to_state,
                actor.id,
                actor.role,
                reason,
                {**evidence, **extra},
                _stamp(now, item),
            )
            self._commit(tx, {run_id: run}, [item])
            return self._item_status_tx(tx, run_id, item_id)

    @command("skip")
    def skip(
        self,
        run_id: str,
        item_id: str,
        actor: Actor,
        reason: str,
        expected_revision: int | None = None,
    ) -> ItemStatus:
        """pending, retryable or quarantined -> skipped."""
        return self._item_command(
            run_id,
            item_id,
            actor,
            "skip",
            S.SKIPPED,
            _reason(reason, required=True),
            {},
            expected_revision,
        )

    @command("release")
    def release(
        self,
        run_id: str,
        item_id: str,
        actor: Actor,
        reason: str,
        expected_revision: int | None = None,
    ) -> ItemStatus:
        """quarantined -> retryable."""
        return self._item_command(
            run_id,
            item_id,
            actor,
            "release",
            S.RETRYABLE,
            _reason(reason, required=True),
            {},
            expected_revision,
        )

    @command("reject_item")
    def reject_item(
        self,
        run_id: str,
        item_id: str,
        actor: Actor,
        rule: str,
        detail: str | None = None,
        expected_revision: int | None = None,
    ) -> ItemStatus:
        """quarantined -> rejected, by a reviewer."""
        check_identifier(rule, "rule")
        return self._item_command(
            run_id,
            item_id,
            actor,
            "reject_item",
            S.REJECTED,
            rule,
            {"rule": rule, "detail": _reason(detail, "detail")},
            expected_revision,
        )

    # ------------------------------------------------------------------
    # reconciler
    # ------------------------------------------------------------------
    @command("reconcile")
    def reconcile(self, now: datetime | None = None, actor: Actor | None = None) -> ReconcileReport:
        """Expire stale leases, finish cancels and pauses, quarantine retryable items past their
        deadline, and fail runs past their deadline once none of their leases is live."""
        if now is not None and (not isinstance(now, datetime) or now.tzinfo is None):
            raise InvalidInput("now must be an aware datetime")
        actor = _actor(actor or Actor("reconciler", S.RECONCILER))
        _require_role(actor, S.RUN_COMMAND_ROLES["reconcile"], "reconcile")
        expired = cancels = pauses = failed = 0
        with self.store.read() as tx:
            t = now or tx.now()
            stale = tx.fetchall(
                "SELECT DISTINCT run_id FROM lg_items WHERE state = 'in_progress' AND "
                "lease_expires_at < ?",
                (iso(t),),
            )
            open_runs = tx.fetchall(
                "SELECT run_id FROM lg_runs WHERE state IN "
                "('running', 'awaiting_review', 'pausing', 'paused', 'canceling')"
            )
        run_ids = list(
            dict.fromkeys([r["run_id"] for r in stale] + [r["run_id"] for r in open_runs])
        )
        for run_id in run_ids:
            # each run's pass retried on its own: a fault on one run neither repeats nor
            # drops the counts of the runs already reconciled (reconciling is idempotent)
            e, c, p, f = retry_transient(self._reconcile_run, run_id, now, actor)
            expired += e
            cancels += c
            pauses += p
            failed += f
        return ReconcileReport(expired, cancels, pauses, failed)

    def _reconcile_run(
        self, run_id: str, now_arg: datetime | None, actor: Actor
    ) -> tuple[int, int, int, int]:
        with self.store.write() as tx:
            run = self._load_run(tx, run_id)
            now = now_arg or tx.now()
            policy = run.policy
            rows = tx.fetchall(
                "SELECT * FROM lg_items WHERE run_id = ? AND state = 'in_progress' AND "
                "lease_expires_at < ? ORDER BY seq",
                (run_id, iso(now)),
            )
            deadline = policy.get("item_deadline_seconds")
            past_item_deadline = (
                deadline is not None
                and run.started_at is not None
                and now > run.started_at + timedelta(seconds=deadline)
            )
            items = []
            for row in rows:
                item = self._materialize(row, now)
                exhausted = item.attempts >= policy["max_attempts"]
                to = S.QUARANTINED if exhausted or past_item_deadline else S.RETRYABLE
                ev: dict[str, Any] = {
                    "lease_token": item.lease_token,
                    "attempt": item.attempts,
                    "outcome": "lease_expired",
                    "expired_at": item.lease_expires_at,
                }
                if to == S.RETRYABLE:
                    ev["eligible_at"] = iso(now + timedelta(seconds=policy["backoff_seconds"]))
                item.transition(
                    "expire",
                    to,
                    actor.id,
                    actor.role,
                    "lease expired" + (" (attempts exhausted)" if exhausted else ""),
                    ev,
                    _stamp(now, item),
                )
                items.append(item)
            if past_item_deadline and not S.is_terminal(run.state):
                for row in tx.fetchall(
                    "SELECT * FROM lg_items WHERE run_id = ? AND state = 'retryable' ORDER BY seq",
                    (run_id,),
                ):
                    item = self._materialize(row, now)
                    item.transition(
                        "deadline",
                        S.QUARANTINED,
                        actor.id,
                        actor.role,
                        "item deadline passed",
                        {},
                        _stamp(now, item),
                    )
                    items.append(item)
            self._commit(tx, {run_id: run}, items)
            cancels = pauses = failed = 0
            finished = self._finish_if_drained(tx, run, now)
            cancels += finished == "cancel"
            pauses += finished == "pause"
            rd = policy.get("run_deadline_seconds")
            if (
                rd is not None
                and run.started_at is not None
                and run.counts[S.IN_PROGRESS] == 0
                and run.state in S.run_rule("reconcile_deadline").sources
                and now > run.started_at + timedelta(seconds=rd)
            ):
                run.transition(
                    "reconcile_deadline",
                    S.FAILED,
                    actor.id,
                    actor.role,
                    f"run deadline of {rd:g}s passed",
                    {"failure_kind": S.TRANSIENT, "failure_reason": "deadline_exceeded"},
                    _stamp(now, run),
                )
                self._commit(tx, {run_id: run})
                failed = 1
            return len(rows), cancels, pauses, failed

    # ------------------------------------------------------------------
    # reads
    # ------------------------------------------------------------------
    def _status_tx(self, tx: Tx, run_id: str) -> RunStatus:
        row = tx.fetchone("SELECT * FROM lg_runs WHERE run_id = ?", (run_id,))
        if row is None:
            raise RunNotFound(run_id)
        return self._status_of_row(tx, row)

    def _status_of_row(self, tx: Tx, row: dict[str, Any]) -> RunStatus:
        """A run row as RunStatus, with its first 20 items not accepted."""
        na = tx.fetchall(
            "SELECT item_id, state, required, reason FROM lg_items WHERE run_id = ? AND "
            "state IN ('rejected', 'skipped', 'quarantined') ORDER BY seq LIMIT 20",
            (row["run_id"],),
        )
        return self._status_from_row(row, na)

    @staticmethod
    def _status_from_row(row: dict[str, Any], na: list[dict[str, Any]]) -> RunStatus:
        counts = json.loads(row["counts"])
        state = row["state"]
        return RunStatus(
            run_id=row["run_id"],
            state=state,
            revision=row["revision"],
            failure_kind=row["failure_kind"],
            failure_reason=row["failure_reason"],
            input_version=row["input_version"],
            counts=counts,
            summary=row["summary"] or f"run {state}",
            not_accepted=[
                NotAcceptedItem(r["item_id"], r["state"], bool(r["required"]), r["reason"])
                for r in na
            ],
            waiting_on=waiting_on(state, counts),
            links=[Link(link["relation"], link["run_id"]) for link in json.loads(row["links"])],
            cancel_requested=bool(row["cancel_requested"]),
            created_at=_dt(row["created_at"]),
            updated_at=_dt(row["updated_at"]),
            source_version=row["source_version"],
            config_version=row["config_version"],
            scope=row["scope"],
            created_by=row["created_by"],
            started_at=parse_dt(row["started_at"]),
            stopped_at=parse_dt(row["stopped_at"]),
            stop_reason=row["stop_reason"],
            review=None if row["review"] is None else json.loads(row["review"]),
            policy=json.loads(row["policy"]),
            root_run_id=row["root_run_id"],
        )

    @read_command
    def status(self, run_id: str) -> RunStatus:
        """The run as accepted by the store."""
        run_id = _run_id(run_id)
        with self.store.read() as tx:
            try:
                UUID(run_id)
            except ValueError:
                raise RunNotFound(run_id) from None
            return self._status_tx(tx, run_id)

    @read_command
    def runs(self, state: str | None = None, limit: int = 100) -> list[RunStatus]:
        """Runs, newest first."""
        if state is not None and state not in S.RUN_STATES:
            raise InvalidInput(
                f"state {state!r} is not a run state; states: {', '.join(S.RUN_STATES)}"
            )
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidInput(f"limit must be an integer from 1 to 10000, got {limit!r}")
        with self.store.read() as tx:
            if state is None:
                rows = tx.fetchall("SELECT * FROM lg_runs ORDER BY seq DESC LIMIT ?", (limit,))
            else:
                rows = tx.fetchall(
                    "SELECT * FROM lg_runs WHERE state = ? ORDER BY seq DESC LIMIT ?",
                    (state, limit),
                )
            return [self._status_of_row(tx, row) for row in rows]

    def _item_status_tx(self, tx: Tx, run_id: str, item_id: str) -> ItemStatus:
        return _item_status(self._item_row(tx, run_id, item_id))

    @read_command
    def items(self, run_id: str, state: str | None = None) -> list[ItemStatus]:
        """The run's items in manifest order."""
        run_id = _run_id(run_id)
        if state is not None and state not in S.ITEM_STATES:
            raise InvalidInput(
                f"state {state!r} is not an item state; states: {', '.join(S.ITEM_STATES)}"
            )
        with self.store.read() as tx:
            self._load_run(tx, run_id, lock=False)
            if state is None:
                rows = tx.fetchall(
                    "SELECT * FROM lg_items WHERE run_id = ? ORDER BY seq", (run_id,)
                )
            else:
                rows = tx.fetchall(
                    "SELECT * FROM lg_items WHERE run_id = ? AND state = ? ORDER BY seq",
                    (run_id, state),
                )
            return [_item_status(r) for r in rows]

    @read_command
    def item(self, run_id: str, item_id: str) -> ItemStatus:
        """One item."""
        run_id = _run_id(run_id)
        item_id = _item_id(item_id)
        with self.store.read() as tx:
            self._load_run(tx, run_id, lock=False)
            return self._item_status_tx(tx, run_id, item_id)

    @read_command
    def attempts(self, run_id: str, item_id: str | None = None) -> list[Attempt]:
        """Every attempt of the run (or of one item), oldest first."""
        run_id = _run_id(run_id)
        with self.store.read() as tx:
            self._load_run(tx, run_id, lock=False)
            if item_id is None:
                rows = tx.fetchall(
                    "SELECT a.* FROM lg_attempts a JOIN lg_items i ON a.run_id = i.run_id AND "
                    "a.item_id = i.item_id WHERE a.run_id = ? ORDER BY a.started_at, i.seq, a.attempt",
                    (run_id,),
                )
            else:
                self._item_row(tx, run_id, _item_id(item_id))
                rows = tx.fetchall(
                    "SELECT * FROM lg_attempts WHERE run_id = ? AND item_id = ? ORDER BY attempt",
                    (run_id, item_id),
                )
            return [
                Attempt(
                    r["run_id"],
                    r["item_id"],
                    r["attempt"],
                    r["worker_id"],
                    r["lease_token"],
                    _dt(r["started_at"]),
                    _dt(r["expires_at"]),
                    parse_dt(r["finished_at"]),
                    r["stage"],
                    r["outcome"],
                    r["error"],
                )
                for r in rows
            ]

    @read_command
    def history(self, run_id: str) -> list[Transition]:
        """Every run and item transition of the run, in position order, starting with its submit."""
        run_id = _run_id(run_id)
        with self.store.read() as tx:
            self._load_run(tx, run_id, lock=False)
            rows = tx.fetchall(
                "SELECT * FROM lg_transitions WHERE run_id = ? ORDER BY position, ord", (run_id,)
            )
            return [_transition(r) for r in rows]

    @read_command
    def lineage(self, run_id: str) -> list[RunStatus]:
        """The runs linked to this one (same root), root first."""
        run_id = _run_id(run_id)
        with self.store.read() as tx:
            run = self._load_run(tx, run_id, lock=False)
            rows = tx.fetchall(
                "SELECT * FROM lg_runs WHERE root_run_id = ? ORDER BY seq", (run.root_run_id,)
            )
            return [self._status_of_row(tx, row) for row in rows]

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
        if run_id is not None:
            _run_id(run_id)
        if actor is not None:
            check_identifier(actor, "actor")
        if role is not None and role not in S.ROLES:
            raise InvalidInput(f"role {role!r} is not a role; roles: {', '.join(S.ROLES)}")
        if state is not None and state not in S.RUN_STATES and state not in S.ITEM_STATES:
            raise InvalidInput(f"state {state!r} is neither a run nor an item state")
        for name, value in (("since", since), ("until", until)):
            if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
                raise InvalidInput(f"{name} must be an aware datetime")
        if after is not None and (
            isinstance(after, bool) or not isinstance(after, int) or after < 0
        ):
            raise InvalidInput("after must be a non-negative position")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise InvalidInput("limit must be a positive integer")
        where: list[str] = []
        params: list[Any] = []
        for col, val in (
            ("run_id", run_id),
            ("actor_id", actor),
            ("role", role),
            ("to_state", state),
        ):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        if since is not None:
            where.append("at >= ?")
            params.append(iso(since))
        if until is not None:
            where.append("at <= ?")
            params.append(iso(until))
        return self._audit_pages(where, params, newest_first, after, limit, page_size)

    def _audit_pages(
        self,
        where: list[str],
        params: list[Any],
        newest_first: bool,
        after: int | None,
        limit: int | None,
        page_size: int,
    ) -> Iterator[Transition]:
        order = "DESC" if newest_first else "ASC"
        cmp = "<" if newest_first else ">"
        cursor = after
        remaining = limit
        while True:
            w = list(where)
            p = list(params)
            if cursor is not None:
                w.append(f"position {cmp} ?")
                p.append(cursor)
            n = page_size if remaining is None else min(page_size, remaining)
            # SQLite keeps no statistics on `at`: ordered by the plain column it scans every
            # row in position order; `+position` makes it search lg_transitions_at and sort
            by = (
                "+position"
                if self.store.dialect == "sqlite"
                and where
                and all(c.startswith("at ") for c in where)
                else "position"
            )
            sql = (
                "SELECT * FROM lg_transitions"
                + (" WHERE " + " AND ".join(w) if w else "")
                + f" ORDER BY {by} {order}, ord {order} LIMIT ?"
            )
            with self.store.read() as tx:
                rows = tx.fetchall(sql, (*p, n))
            for r in rows:
                yield _transition(r)
            if remaining is not None:
                remaining -= len(rows)
                if remaining <= 0:
                    return
            if len(rows) < n:
                return
            cursor = rows[-1]["position"]

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

    def wait_for_events(self, after: int | None, timeout: float) -> bool:
        """Block until a transition past `after` has committed (True) or `timeout` seconds
        pass (False). LISTEN/NOTIFY on PostgreSQL, short polling elsewhere (ledger/feed.py)."""
        from .feed import wait_for_events

        return wait_for_events(self.store, after, timeout)

    @read_command
    def status_at(self, run_id: str, at: datetime) -> RunStatus:
        """The run's status as the store had accepted it at time `at`, replayed from its events."""
        from projections.timetravel import status_at

        run_id = _run_id(run_id)
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise InvalidInput("at must be an aware datetime")
        return status_at(self, run_id, at)

    def verify(self, progress: Callable[[str, int, int], None] | None = None) -> VerifyReport:
        """Replay every event and report broken rules and projection drift. `progress(stage,
        done, total)` follows it: "replay" after each batch (events done, events stored), then
        "compare" and "chains" as they start."""
        from projections.verify import verify

        if progress is not None and not callable(progress):
            raise InvalidInput("progress must be a callable (stage, done, total)")
        return verify(self, progress)

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
        from .transfer import export

        return export(self, file, runs=runs, since=since, progress=progress)

    def import_file(
        self, source: Any, progress: Callable[[int, int], None] | None = None, verify: bool = True
    ) -> Any:
        """Check a history file (a path or text file object) and append its events with their
        hashes, projected, in one transaction; then verify (ledger/transfer.py)."""
        from .transfer import import_file

        return import_file(self, source, progress=progress, verify=verify)

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

        return archive(self, actor, to, terminal_before=terminal_before, runs=runs, reason=reason)

    def archived(self, run_id: str) -> dict[str, Any] | None:
        """Where an archived run's events went (file, sha256, digest, events, when, by whom);
        None when the run is not archived. Its history and attempts are in that file."""
        from .archive import archived_run

        return archived_run(self, run_id)

    def restore(self, actor: Actor, source: Any) -> Any:
        """Bring archived runs back from their archive file, once it is proven to hold the
        events that left (operator role; ledger/archive.py)."""
        from .archive import restore

        return restore(self, actor, source)

    def rebuild_projections(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Drop and rebuild every projection from the first event; returns the events replayed."""
        from projections.rebuild import rebuild

        return rebuild(self, progress=progress)


def waiting_on(state: str, counts: dict[str, int]) -> str:
    """Who owns the next step (SPEC rule 9)."""
    if state in S.TERMINAL_RUN_STATES:
        return "nobody"
    if state == S.QUEUED:
        return "controller"
    if state == S.AWAITING_REVIEW:
        return "reviewer"
    if state == S.PAUSED:
        return "operator"
    if state in (S.CANCELING, S.PAUSING):
        return "workers" if counts.get(S.IN_PROGRESS, 0) else "controller"
    # running
    if counts.get(S.PENDING, 0) or counts.get(S.RETRYABLE, 0) or counts.get(S.IN_PROGRESS, 0):
        return "workers"
    if counts.get(S.QUARANTINED, 0):
        return "reviewer"
    return "controller"


def _dt(text: str) -> datetime:
    dt = parse_dt(text)
    assert dt is not None
    return dt


def _item_status(r: dict[str, Any]) -> ItemStatus:
    lease = None
    if r["state"] == S.IN_PROGRESS and r["lease_token"]:
        lease = Lease(
            r["run_id"],
            r["item_id"],
            r["lease_token"],
            r["lease_worker"],
            r["attempts"],
            _dt(r["lease_expires_at"]),
            None,
        )
    return ItemStatus(
        run_id=r["run_id"],
        item_id=r["item_id"],
        state=r["state"],
        required=bool(r["required"]),
        attempts=r["attempts"],
        lease=lease,
        last_error=r["last_error"],
        revision=r["revision"],
        reason=r["reason"],
        payload=json.loads(r["payload"]),
        updated_at=parse_dt(r["updated_at"]),
    )


def _merged_row(row: dict[str, Any], item: Item) -> dict[str, Any]:
    """An item row updated with its aggregate's current stream state (no re-read)."""
    return {
        **row,
        "state": item.state,
        "revision": item.version,
        "attempts": item.attempts,
        "lease_token": item.lease_token,
        "lease_worker": item.lease_worker,
        "lease_expires_at": item.lease_expires_at,
        "eligible_at": item.eligible_at,
        "last_error": item.last_error,
        "reason": item.reason,
        "updated_at": iso(item.modified_on),
    }


def _transition(r: dict[str, Any]) -> Transition:
    return Transition(
        run_id=r["run_id"],
        item_id=r["item_id"],
        from_state=r["from_state"],
        to_state=r["to_state"],
        actor_id=r["actor_id"],
        role=r["role"],
        reason=r["reason"],
        evidence=json.loads(r["evidence"]),
        at=_dt(r["at"]),
        revision=r["revision"],
        position=r["position"],
        command=r["command"],
    )


UTC  # noqa: B018
