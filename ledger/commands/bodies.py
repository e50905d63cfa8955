"""Request bodies of the command endpoints (pydantic; unknown keys are refused).

Types are strict where JSON has the type (no "5" for 5, no "yes" for true), and
numbers are bounded so that nothing out of range reaches a store. What a value
means (a known failure reason, a valid manifest item) is the service's to judge:
it raises the typed error the caller sees.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from ledger.core.validation import first_bad_string

# Revisions and positions fit in a JSON-safe integer (and a BIGINT column).
Revision = Annotated[StrictInt, Field(ge=0, le=2**53 - 1)]
Text = StrictStr


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if first_bad_string(data) is not None:
            raise ValueError(
                "strings must be valid Unicode (no lone surrogate escapes such as \\ud800)"
            )
        return data


class Expected(_Body):
    """Optional compare-and-set: the run revision the caller read."""

    expected_revision: Revision | None = Field(
        default=None, description="The revision the caller read; a stale one is a 409 Conflict."
    )


class AmendBody(Expected):
    """Add or replace items, withdraw item ids, change policy: a new input version."""

    reason: Text
    items: list[dict[str, Any]] | None = Field(
        default=None, description="Manifest items to add or replace."
    )
    withdraw: list[Text] | None = Field(
        default=None, description="Item ids to withdraw (they end skipped)."
    )
    policy: dict[str, Any] | None = Field(default=None, description="Policy fields to change.")


class ClaimBody(Expected):
    """Claim up to `limit` claimable items in one transaction (the caller is the worker)."""

    limit: Annotated[StrictInt, Field(ge=1, le=1000)] = 1


class LeaseBody(_Body):
    """The lease fields as `claim` returned them (`payload` may be echoed back; it is ignored)."""

    run_id: Text
    item_id: Text
    token: Text
    worker_id: Text
    attempt: Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]
    expires_at: datetime
    payload: Any = None


class AcceptBody(LeaseBody):
    """Accept the item, with the evidence of the work done."""

    evidence: dict[str, Any] | None = None
    stage: Text | None = None


class RejectBody(LeaseBody):
    """Reject the item under a business rule."""

    rule: Text
    detail: Text | None = None
    stage: Text | None = None


class FailAttemptBody(LeaseBody):
    """This attempt failed; the item becomes retryable, or quarantined when exhausted."""

    error: Text
    stage: Text | None = None
    retryable: StrictBool = True


class ReasonBody(Expected):
    """A command whose caller must say why (a missing or blank reason is refused)."""

    reason: Text = Field(description="Why: required, recorded with the transition.")


class RetryBody(_Body):
    """A new run replaying a failed(transient) run's latest input."""

    reason: Text | None = None


class RejectItemBody(Expected):
    """Reject a quarantined item under a rule."""

    rule: Text
    detail: Text | None = None


class RequestReviewBody(Expected):
    """Ask for a review decision bound to the current input version."""

    decision: Text
    reviewer: Text | None = None  # the actor id the review is routed to


class DecideBody(Expected):
    """Approve or reject the input version under review."""

    input_version: Text
    approve: StrictBool
    reason: Text


class FailBody(Expected):
    """Record that the run failed."""

    reason: Text
    transient: StrictBool = True
    failure_reason: Text | None = None


class RepairBody(_Body):
    """A new run for the items not accepted (default), chosen items, or corrections."""

    reason: Text | None = None
    items: list[Text] | None = Field(
        default=None, description="Item ids to repair (default: those not accepted)."
    )
    corrections: list[dict[str, Any]] | None = Field(
        default=None, description="Corrected manifest items; the new run is a correction_of."
    )
    config_version: Text | None = Field(
        default=None,
        description="A corrected configuration version for the new run (a correction_of).",
    )
    policy: dict[str, Any] | None = Field(
        default=None,
        description="Policy fields to correct for the new run (a correction_of), e.g. "
        '{"max_attempts": 5}.',
    )


class CompensateBody(_Body):
    """A new run that undoes effects of the original."""

    reason: Text
    items: list[Text | dict[str, Any]] | None = Field(
        default=None, description="Item ids, or item objects (default: the accepted items)."
    )


class TokenBody(_Body):
    """A bearer token to keep in a cookie for the operator page's reads."""

    token: Annotated[StrictStr, Field(min_length=1, max_length=512)]
