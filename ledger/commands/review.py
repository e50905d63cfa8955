"""Review: request_review binds a review to the current input version; decide (and its
shorthand approve) records the reviewer's decision on a named version."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ledger.commands.runs import fence, run_transition
from ledger.commands.sql import SQL
from ledger.commands.uow import UnitOfWork
from ledger.core import args as A
from ledger.core import states as S
from ledger.core.domain import Run
from ledger.core.errors import InvalidInput, NotAuthorized, StaleReview
from ledger.core.validation import check_identifier
from ledger.core.views import Actor, RunStatus
from ledger.stores.base import Tx


def request_review(
    uow: UnitOfWork,
    run_id: str,
    actor: Actor,
    decision: str,
    expected_revision: int | None = None,
    reviewer: str | None = None,
) -> RunStatus:
    """running -> awaiting_review, bound to the current input version (and routed to
    `reviewer`, an actor id, when given)."""
    decision = check_identifier(decision, "decision")
    if reviewer is not None:
        reviewer = check_identifier(reviewer, "reviewer")

    def decide(tx: Tx, run: Run, now: datetime) -> tuple[str, str | None, dict[str, Any]]:
        review = run.policy.get("review")
        if review and review["decision"] != decision:
            raise InvalidInput(
                f"decision {decision!r} is not the policy's review decision {review['decision']!r}"
            )
        evidence: dict[str, Any] = {"decision": decision, "input_version": run.input_version}
        if reviewer is not None:
            evidence["reviewer"] = reviewer
        return (S.AWAITING_REVIEW, S.stated_reason("request_review", decision=decision), evidence)

    return run_transition(uow, run_id, actor, "request_review", expected_revision, decide)


def decide(
    uow: UnitOfWork,
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
    A.boolean(approve, "approve")
    reason = A.reason(reason)

    def decision(tx: Tx, run: Run, now: datetime) -> tuple[str, str | None, dict[str, Any]]:
        four_eyes(tx, run, checked)
        bound = (run.review or {}).get("input_version", run.input_version)
        if input_version != bound:
            raise StaleReview(
                f"run {run.run_id} awaits review of input version {bound}, not {input_version}; "
                "the input changed since: review the current version",
                expected_version=bound,
            )
        review = run.policy.get("review") or {}
        ev = {
            "input_version": input_version,
            "approve": approve,
            "decision": (run.review or {}).get("decision"),
        }
        why = reason or S.stated_reason(
            "decide.approve" if approve else "decide.reject", input_version=input_version
        )
        if approve:
            ev["survives_amendment"] = bool(review.get("survives_amendment"))
            return S.RUNNING, why, ev
        # a rejection fails the run: its live leases are fenced, as fail's are (rule 13)
        fence(uow, tx, run, now, S.stated_reason("abandon.review"))
        ev.update(failure_kind=S.PERMANENT, failure_reason="review_rejected")
        return S.FAILED, why, ev

    checked = A.actor(actor)
    return run_transition(uow, run_id, checked, "decide", expected_revision, decision)


def four_eyes(tx: Tx, run: Run, reviewer: Actor) -> None:
    """rule 13 of the rule book: the actor who submitted or amended a run may not decide its review."""
    if reviewer.id == run.created_by:
        raise NotAuthorized(
            f"{reviewer.id!r} submitted run {run.run_id} and may not decide its review "
            "(four eyes: another reviewer decides)"
        )
    amended = tx.fetchone(SQL.sql(tx, "run_amended_by"), (run.run_id, reviewer.id))
    if amended is not None:
        raise NotAuthorized(
            f"{reviewer.id!r} amended run {run.run_id} and may not decide its review "
            "(four eyes: another reviewer decides)"
        )


def approve(
    uow: UnitOfWork, run_id: str, actor: Actor, input_version: str, reason: str = "approved"
) -> RunStatus:
    """Shorthand for decide(approve=True)."""
    return decide(uow, run_id, actor, input_version, True, reason)
