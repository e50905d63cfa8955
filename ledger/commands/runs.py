"""Run commands that move one run: start, pause, resume, cancel, complete, fail; and the
drain that ends a pausing or canceling run with its last live lease."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ledger.commands.sql import SQL
from ledger.commands.uow import LEDGER, UnitOfWork, require_run_state, stamp
from ledger.core import args as A
from ledger.core import states as S
from ledger.core.domain import Run
from ledger.core.errors import AlreadyTerminal, Conflict, InvalidInput, NotAuthorized, NotComplete
from ledger.core.recorded import decode_recorded
from ledger.core.views import Actor, CancelOutcome, RunStatus
from ledger.reads import queries
from ledger.stores.base import Tx

CANCEL_RETRIES = 5

Decision = Callable[[Tx, Run, datetime], tuple[str, str | None, dict[str, Any]]]


def _policy(data: Any, change: Any = None) -> Any:
    """The run's policy as a model; with `change`, the policy after applying it.
    (pydantic loads on first use: read-only commands start faster without it.)"""
    from ledger.core.manifest import Policy, parse_policy

    base = Policy.model_validate(data)
    return base if change is None else parse_policy(change, base)


def run_transition(
    uow: UnitOfWork,
    run_id: Any,
    actor: Any,
    command: str,
    expected_revision: Any,
    decide: Decision,
    reason: str | None = None,
) -> RunStatus:
    """One run transition by the table's rule for `command`: `decide` names the target
    state, reason and evidence once the checks have passed."""
    run_id = A.run_id(run_id)
    actor = A.actor(actor)
    expected = A.revision(expected_revision)
    rule = S.run_rule(command)
    with uow.write() as tx:
        run = uow.guard(tx, run_id, actor, rule.roles, command, expected)
        require_run_state(run, rule)
        now = tx.now()
        to_state, why, evidence = decide(tx, run, now)
        run.transition(
            command,
            to_state,
            actor.id,
            actor.role,
            why if why is not None else reason,
            evidence,
            stamp(now, run),
        )
        uow.commit(tx, {run_id: run}, first="run")
        return queries.status_tx(tx, run_id)


def start(
    uow: UnitOfWork, run_id: str, actor: Actor, expected_revision: int | None = None
) -> RunStatus:
    """queued -> running."""
    return run_transition(
        uow,
        run_id,
        actor,
        "start",
        expected_revision,
        lambda tx, run, now: (S.RUNNING, S.stated_reason("start", role=S.CONTROLLER), {}),
    )


def pause(
    uow: UnitOfWork,
    run_id: str,
    actor: Actor,
    reason: str | None = None,
    expected_revision: int | None = None,
) -> RunStatus:
    """running -> pausing (live leases finish first) or paused; the reason is required."""
    reason = A.stated_reason(reason, "pause")
    return run_transition(
        uow,
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


def resume(
    uow: UnitOfWork,
    run_id: str,
    actor: Actor,
    expected_revision: int | None = None,
    reason: str | None = None,
) -> RunStatus:
    """pausing or paused -> running; the reason is required."""
    reason = A.stated_reason(reason, "resume")
    return run_transition(
        uow,
        run_id,
        actor,
        "resume",
        expected_revision,
        lambda tx, run, now: (S.RUNNING, reason, {}),
    )


def cancel(
    uow: UnitOfWork,
    run_id: str,
    actor: Actor,
    reason: str | None = None,
    expected_revision: int | None = None,
) -> CancelOutcome:
    """Record the durable intent to cancel; canceled at once when no lease is live. The
    reason is required (it stays the canceled run's stop reason)."""
    run_id = A.run_id(run_id)
    actor = A.actor(actor)
    reason = A.stated_reason(reason, "cancel")
    expected = A.revision(expected_revision)
    rule = S.run_rule("cancel")
    attempts = 1 if expected is not None else CANCEL_RETRIES
    for attempt in range(attempts):
        try:
            return cancel_once(uow, run_id, actor, reason, expected, rule)
        except Conflict:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def cancel_once(
    uow: UnitOfWork,
    run_id: str,
    actor: Actor,
    reason: str,
    expected: int | None,
    rule: S.Rule,
) -> CancelOutcome:
    """One try of `cancel` (it retries on Conflict when no revision was expected)."""
    with uow.write() as tx:
        run = uow.guard(tx, run_id, actor, rule.roles, "cancel", expected)
        if run.state in rule.done_in:
            return CancelOutcome(run_id, run.state, run.counts[S.IN_PROGRESS], already=True)
        if run.state in S.run_rule("complete").done_in:
            raise AlreadyTerminal(
                f"run {run_id} is {run.state}: completion won the race, nothing to cancel; "
                "to undo its effects start a compensation run",
                state=run.state,
                allowed=rule.sources,
            )
        require_run_state(run, rule)
        now = tx.now()
        in_flight = run.counts[S.IN_PROGRESS]
        to_state = S.CANCELING if in_flight else S.CANCELED
        # the items first: a run's items never change after it ended (rule 12 of the rule book)
        skip_remaining(uow, tx, run, now)
        run.transition(
            "cancel",
            to_state,
            actor.id,
            actor.role,
            reason,
            {"in_flight": in_flight},
            stamp(now, run),
        )
        uow.commit(tx, {run_id: run}, first="run")
        return CancelOutcome(run_id, run.state, in_flight, already=False)


def complete(
    uow: UnitOfWork, run_id: str, actor: Actor, expected_revision: int | None = None
) -> RunStatus:
    """running -> succeeded or completed_with_errors, else NotComplete naming what blocks it."""
    run_id = A.run_id(run_id)
    actor = A.actor(actor)
    expected = A.revision(expected_revision)
    rule = S.run_rule("complete")
    with uow.write() as tx:
        run = uow.guard(tx, run_id, actor, rule.roles, "complete", expected)
        if run.state in rule.done_in:
            return queries.status_tx(tx, run_id)
        require_run_state(run, rule)
        open_ = {s: run.counts[s] for s in (S.PENDING, S.IN_PROGRESS, S.RETRYABLE) if run.counts[s]}
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
            given = run.review or {}
            approved = given.get("approved_version")
            # whether the approval survives amendments is what the policy said when it was
            # given (approvals stored without it: the policy as it stands)
            survives = given.get("survives", review.get("survives_amendment"))
            ok = approved == run.input_version or (approved is not None and bool(survives))
            if not ok:
                raise NotComplete(
                    f"run {run_id} needs an approval of {review['decision']!r} for input version "
                    f"{run.input_version}" + (f" (approved: {approved})" if approved else ""),
                    state=run.state,
                    allowed=rule.sources,
                )
        rows = tx.fetchall(SQL.sql(tx, "manifest_items_not_accepted"), (run_id,))
        required_total = tx.fetchone(SQL.sql(tx, "required_items_counted"), (run_id,))
        assert required_total is not None
        missing = [r for r in rows if r["required"]]
        policy = _policy(run.policy)
        now = tx.now()
        total = int(required_total["n"])
        if not missing:
            to_state, why = S.SUCCEEDED, S.stated_reason("complete.succeeded")
        elif policy.partial_delivery and len(missing) <= policy.tolerated(total):
            to_state = S.COMPLETED_WITH_ERRORS
            why = S.stated_reason(
                "complete.completed_with_errors",
                missing=len(missing),
                total=total,
                tolerated=policy.tolerated(total),
            )
        else:
            tol = policy.tolerated(total) if policy.partial_delivery else 0
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
        run.transition("complete", to_state, actor.id, actor.role, why, evidence, stamp(now, run))
        uow.commit(tx, {run_id: run})
        return queries.status_tx(tx, run_id)


def fail(
    uow: UnitOfWork,
    run_id: str,
    actor: Actor,
    reason: str | None,
    transient: bool,
    failure_reason: str | None = None,
    expected_revision: int | None = None,
) -> RunStatus:
    """-> failed (transient or permanent); live leases are fenced (attempts end abandoned).
    The reason is required."""
    reason = A.stated_reason(reason, "fail")
    A.boolean(transient, "transient")
    if failure_reason is not None and failure_reason not in S.FAILURE_REASONS:
        raise InvalidInput(
            f"failure_reason {failure_reason!r} is not one of: {', '.join(S.FAILURE_REASONS)}"
        )
    checked = A.actor(actor)

    def decide(tx: Tx, run: Run, now: datetime) -> tuple[str, str | None, dict[str, Any]]:
        fence(uow, tx, run, now, S.stated_reason("abandon.fail"))
        kind = S.TRANSIENT if transient else S.PERMANENT
        # never null (rule 16 of the rule book): without one, the failing role's decision
        fr = failure_reason or S.DEFAULT_FAILURE_REASON[checked.role]
        return S.FAILED, reason, {"failure_kind": kind, "failure_reason": fr}

    if checked.role == S.OPERATOR and not transient:
        # checked in role order: only after existence
        with uow.read() as tx:
            uow.load_run(tx, A.run_id(run_id), lock=False)
        raise NotAuthorized(
            "role 'operator' may only record transient failures; "
            "permanent failures are the controller's decision"
        )
    return run_transition(uow, run_id, checked, "fail", expected_revision, decide)


def fence(uow: UnitOfWork, tx: Tx, run: Run, now: datetime, why: str) -> None:
    """End every live lease of the run: its attempts end abandoned, its items retryable."""
    rows = tx.fetchall(SQL.sql(tx, "leased_items"), (run.run_id,))
    items = []
    for row in rows:
        item = uow.materialize(row, now)
        item.transition(
            "abandon",
            S.RETRYABLE,
            LEDGER.id,
            LEDGER.role,
            why,
            {"lease_token": item.lease_token, "attempt": item.attempts, "outcome": "abandoned"},
            stamp(now, item),
            run.state,
        )
        items.append(item)
    if items:
        uow.commit(tx, {run.run_id: run}, items)


def finish_if_drained(uow: UnitOfWork, tx: Tx, run: Run, now: datetime) -> str | None:
    """A pausing or canceling run ends in the transaction that ends its last live lease.
    (Its counts are exact: an item command holds a draining run FOR UPDATE, see
    ledger/reads/queries.py `load_run`; on a running run, held FOR SHARE, they are not read.)"""
    if run.state not in (S.CANCELING, S.PAUSING) or run.counts[S.IN_PROGRESS] != 0:
        return None
    if run.state == S.CANCELING:
        skip_remaining(uow, tx, run, now)
        run.transition(
            "cancel_finished",
            S.CANCELED,
            LEDGER.id,
            LEDGER.role,
            cancel_reason(tx, run),  # the canceller's reason stays the stop reason (rule 16)
            {},
            stamp(now, run),
        )
        uow.commit(tx, {run.run_id: run})
        return "cancel"
    if run.state == S.PAUSING:
        run.transition(
            "pause_finished",
            S.PAUSED,
            LEDGER.id,
            LEDGER.role,
            S.stated_reason("pause_finished"),
            {},
            stamp(now, run),
        )
        uow.commit(tx, {run.run_id: run})
        return "pause"
    return None


def cancel_reason(tx: Tx, run: Run) -> str:
    """The reason of the run's cancel (the stop reason of a cancel that finishes later)."""
    row = tx.fetchone(SQL.sql(tx, "cancel_reason"), (run.run_id,))
    reason = decode_recorded((row["topic"], row["state"]))[0] if row else None
    return reason or S.stated_reason("cancel_finished")


def skip_remaining(uow: UnitOfWork, tx: Tx, run: Run, now: datetime) -> None:
    """Skip the canceled run's items that were never claimed or are waiting to retry."""
    rows = tx.fetchall(SQL.sql(tx, "waiting_items"), (run.run_id,))
    items = []
    for row in rows:
        item = uow.materialize(row, now)
        item.transition(
            "cancel_skip",
            S.SKIPPED,
            LEDGER.id,
            LEDGER.role,
            S.stated_reason("cancel_skip"),
            {},
            stamp(now, item),
            run.state,
        )
        items.append(item)
    uow.commit(tx, {run.run_id: run}, items)
