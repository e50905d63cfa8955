"""Review: request_review binds a review to the current input version; decide (and its
shorthand approve) records the reviewer's decision on a named version."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .. import states as S
from ..domain import Run
from ..errors import InvalidInput, StaleReview
from ..stores.base import Tx
from ..validation import check_identifier
from ..views import Actor, RunStatus
from . import args as A
from .runs import run_transition
from .uow import UnitOfWork


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
        return (S.AWAITING_REVIEW, f"awaiting review: {decision}", evidence)

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

    return run_transition(uow, run_id, actor, "decide", expected_revision, decision)


def approve(
    uow: UnitOfWork, run_id: str, actor: Actor, input_version: str, reason: str = "approved"
) -> RunStatus:
    """Shorthand for decide(approve=True)."""
    return decide(uow, run_id, actor, input_version, True, reason)
