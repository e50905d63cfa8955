"""Run and item states, roles, and the transition tables, defined once as data.

The aggregates, the service's checks, error messages, the docs and the tests all
read these tables; nothing else hard-codes a transition.
"""

from __future__ import annotations

from dataclasses import dataclass

# Roles ---------------------------------------------------------------------
SUBMITTER = "submitter"
CONTROLLER = "controller"
WORKER = "worker"
REVIEWER = "reviewer"
OPERATOR = "operator"
RECONCILER = "reconciler"
ROLES: tuple[str, ...] = (SUBMITTER, CONTROLLER, WORKER, REVIEWER, OPERATOR, RECONCILER)

# The actor the ledger uses for transitions it makes by itself.
LEDGER_ACTOR_ID = "ledger"

# Run states ----------------------------------------------------------------
QUEUED = "queued"
RUNNING = "running"
AWAITING_REVIEW = "awaiting_review"
PAUSING = "pausing"
PAUSED = "paused"
CANCELING = "canceling"
SUCCEEDED = "succeeded"
COMPLETED_WITH_ERRORS = "completed_with_errors"
FAILED = "failed"
CANCELED = "canceled"
RUN_STATES: tuple[str, ...] = (
    QUEUED,
    RUNNING,
    AWAITING_REVIEW,
    PAUSING,
    PAUSED,
    CANCELING,
    SUCCEEDED,
    COMPLETED_WITH_ERRORS,
    FAILED,
    CANCELED,
)
TERMINAL_RUN_STATES = frozenset({SUCCEEDED, COMPLETED_WITH_ERRORS, FAILED, CANCELED})

# Item states ---------------------------------------------------------------
PENDING = "pending"
IN_PROGRESS = "in_progress"
RETRYABLE = "retryable"
QUARANTINED = "quarantined"
ACCEPTED = "accepted"
REJECTED = "rejected"
SKIPPED = "skipped"
ITEM_STATES: tuple[str, ...] = (
    PENDING,
    IN_PROGRESS,
    RETRYABLE,
    QUARANTINED,
    ACCEPTED,
    REJECTED,
    SKIPPED,
)
FINAL_ITEM_STATES = frozenset({ACCEPTED, REJECTED, SKIPPED})
NOT_ACCEPTED_FINALS = frozenset({REJECTED, SKIPPED, QUARANTINED})

# Failure kinds and reasons -------------------------------------------------
TRANSIENT = "transient"
PERMANENT = "permanent"
FAILURE_REASONS: tuple[str, ...] = (
    "input_unavailable",
    "input_invalid",
    "record_corrupt",
    "invariant_violated",
    "deadline_exceeded",
    "review_rejected",
    "required_items_not_accepted",
    "operator_decision",
)

# Attempt outcomes ----------------------------------------------------------
ATTEMPT_OUTCOMES: tuple[str, ...] = ("accepted", "rejected", "failed", "lease_expired", "abandoned")

# The "from" of a creating transition.
NEW = "-"


@dataclass(frozen=True)
class Rule:
    """One row of a transition table: who may move a stream from where to where."""

    command: str
    sources: frozenset[str]
    targets: tuple[str, ...]
    roles: frozenset[str]
    evidence: tuple[str, ...] = ()
    note: str = ""


def _rule(
    command: str, sources: str, targets: str, roles: str, evidence: str = "", note: str = ""
) -> Rule:
    return Rule(
        command=command,
        sources=frozenset(sources.split()),
        targets=tuple(targets.split()),
        roles=frozenset(roles.split()),
        evidence=tuple(evidence.split()),
        note=note,
    )


# SPEC.md "Run transitions".
RUN_TRANSITIONS: tuple[Rule, ...] = (
    _rule("submit", NEW, QUEUED, SUBMITTER, "manifest input_version"),
    _rule(
        "retry",
        NEW,
        QUEUED,
        f"{SUBMITTER} {OPERATOR}",
        "retry_of input_version",
        "new linked run replaying the original's latest input",
    ),
    _rule(
        "repair",
        NEW,
        QUEUED,
        f"{SUBMITTER} {OPERATOR}",
        "repair_of input_version",
        "new linked run for the items not accepted, or corrections",
    ),
    _rule(
        "compensate",
        NEW,
        QUEUED,
        OPERATOR,
        "compensates input_version",
        "new linked run that undoes effects",
    ),
    _rule("start", QUEUED, RUNNING, CONTROLLER),
    _rule("request_review", RUNNING, AWAITING_REVIEW, CONTROLLER, "decision input_version"),
    _rule("decide", AWAITING_REVIEW, f"{RUNNING} {FAILED}", REVIEWER, "input_version approve"),
    _rule(
        "pause", RUNNING, f"{PAUSING} {PAUSED}", OPERATOR, "", "paused at once if no lease is live"
    ),
    _rule(
        "pause_finished",
        PAUSING,
        PAUSED,
        f"{CONTROLLER} {RECONCILER}",
        "",
        "the last live lease ended",
    ),
    _rule("resume", f"{PAUSING} {PAUSED}", RUNNING, OPERATOR),
    _rule(
        "cancel",
        f"{QUEUED} {PAUSED} {RUNNING} {AWAITING_REVIEW} {PAUSING}",
        f"{CANCELING} {CANCELED}",
        f"{SUBMITTER} {OPERATOR}",
        "in_flight",
        "canceled at once if no lease is live",
    ),
    _rule(
        "cancel_finished",
        CANCELING,
        CANCELED,
        f"{CONTROLLER} {RECONCILER}",
        "",
        "the last live lease ended",
    ),
    _rule(
        "complete",
        RUNNING,
        f"{SUCCEEDED} {COMPLETED_WITH_ERRORS}",
        CONTROLLER,
        "counts not_accepted",
    ),
    _rule(
        "fail",
        f"{QUEUED} {RUNNING} {AWAITING_REVIEW} {PAUSING} {PAUSED}",
        FAILED,
        f"{CONTROLLER} {OPERATOR}",
        "failure_kind failure_reason",
        "operators may only record transient failures",
    ),
    _rule(
        "reconcile_deadline",
        f"{RUNNING} {AWAITING_REVIEW} {PAUSING} {PAUSED}",
        FAILED,
        RECONCILER,
        "deadline",
        "run deadline passed and no live lease",
    ),
)

# SPEC.md "Item transitions".
ITEM_TRANSITIONS: tuple[Rule, ...] = (
    _rule("submit", NEW, PENDING, f"{SUBMITTER} {OPERATOR}"),
    _rule(
        "claim",
        f"{PENDING} {RETRYABLE}",
        IN_PROGRESS,
        WORKER,
        "lease_token attempt expires_at",
        "retryable items only past their backoff",
    ),
    _rule("heartbeat", IN_PROGRESS, IN_PROGRESS, WORKER, "lease_token", "the lease holder"),
    _rule("accept", IN_PROGRESS, ACCEPTED, WORKER, "lease_token", "the lease holder"),
    _rule("reject", IN_PROGRESS, REJECTED, WORKER, "lease_token rule", "the lease holder"),
    _rule(
        "fail_attempt",
        IN_PROGRESS,
        f"{RETRYABLE} {QUARANTINED}",
        WORKER,
        "lease_token error",
        "quarantined when attempts are exhausted or retryable=False",
    ),
    _rule(
        "expire",
        IN_PROGRESS,
        f"{RETRYABLE} {QUARANTINED}",
        RECONCILER,
        "lease_token",
        "lease expired; quarantined when attempts are exhausted",
    ),
    _rule(
        "abandon",
        IN_PROGRESS,
        f"{RETRYABLE} {QUARANTINED}",
        f"{CONTROLLER} {OPERATOR}",
        "lease_token",
        "the run failed; its live leases are fenced",
    ),
    _rule(
        "deadline",
        RETRYABLE,
        QUARANTINED,
        RECONCILER,
        "",
        "the item deadline passed before it was claimed again",
    ),
    _rule("release", QUARANTINED, RETRYABLE, f"{REVIEWER} {OPERATOR}"),
    _rule("reject_item", QUARANTINED, REJECTED, REVIEWER, "rule"),
    _rule("skip", f"{PENDING} {RETRYABLE} {QUARANTINED}", SKIPPED, f"{OPERATOR} {REVIEWER}"),
    _rule(
        "withdraw",
        f"{PENDING} {RETRYABLE} {QUARANTINED}",
        SKIPPED,
        f"{SUBMITTER} {OPERATOR}",
        "",
        "amend(withdraw)",
    ),
    _rule("cancel_skip", f"{PENDING} {RETRYABLE}", SKIPPED, CONTROLLER, "", "the run was canceled"),
)

_RUN_BY_COMMAND = {r.command: r for r in RUN_TRANSITIONS}
_ITEM_BY_COMMAND = {r.command: r for r in ITEM_TRANSITIONS}

# Commands that are not transitions but still need a role check.
RUN_COMMAND_ROLES: dict[str, frozenset[str]] = {
    "amend": frozenset({SUBMITTER, OPERATOR}),
    "claim": frozenset({WORKER}),
    "reconcile": frozenset({RECONCILER, OPERATOR}),
}


def run_rule(command: str) -> Rule:
    """The run transition table row for a command."""
    return _RUN_BY_COMMAND[command]


def item_rule(command: str) -> Rule:
    """The item transition table row for a command."""
    return _ITEM_BY_COMMAND[command]


def is_terminal(state: str) -> bool:
    """True for run states that never change again."""
    return state in TERMINAL_RUN_STATES


def describe_roles(roles: frozenset[str]) -> str:
    """Human list of roles, for error messages."""
    return ", ".join(sorted(roles))
