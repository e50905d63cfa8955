"""Run and item states, roles, and the transition tables, defined once as data.

The aggregates, the service's checks, error messages, the docs and the tests all
read these tables; nothing else hard-codes a transition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
OPEN_RUN_STATES = frozenset(RUN_STATES) - TERMINAL_RUN_STATES

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
    "controller_decision",
)
# The failure_reason a fail without one records, by the failing actor's role (never null).
DEFAULT_FAILURE_REASON: dict[str, str] = {
    OPERATOR: "operator_decision",
    CONTROLLER: "controller_decision",
}

# Attempt outcomes ----------------------------------------------------------
ATTEMPT_OUTCOMES: tuple[str, ...] = ("accepted", "rejected", "failed", "lease_expired", "abandoned")

# The "from" of a creating transition.
NEW = "-"


@dataclass(frozen=True)
class Rule:
    """One row of a transition table: who may move a stream from where to where.

    `evidence`: the keys the transition's evidence must carry (never null).
    `run_states`: for item commands, the states the item's run must be in; for the
    commands that start a linked run, the states the original run must be in.
    `done_in`: states in which repeating the command answers "already there" (it
    writes nothing and is not refused)."""

    command: str
    sources: frozenset[str]
    targets: tuple[str, ...]
    roles: frozenset[str]
    evidence: tuple[str, ...] = ()
    note: str = ""
    run_states: frozenset[str] = frozenset()
    done_in: frozenset[str] = frozenset()

    def allowed(self) -> str:
        """The sources, for messages."""
        return ", ".join(sorted(self.sources))


_OPEN = " ".join(sorted(OPEN_RUN_STATES))
_TERMINAL = " ".join(sorted(TERMINAL_RUN_STATES))


def _rule(
    command: str,
    sources: str,
    targets: str,
    roles: str,
    evidence: str = "",
    note: str = "",
    run_states: str = "",
    done_in: str = "",
) -> Rule:
    return Rule(
        command=command,
        sources=frozenset(sources.split()),
        targets=tuple(targets.split()),
        roles=frozenset(roles.split()),
        evidence=tuple(evidence.split()),
        note=note,
        run_states=frozenset(run_states.split()),
        done_in=frozenset(done_in.split()),
    )


# The rule book's run transitions (docs/explanation/rule-book.md).
RUN_TRANSITIONS: tuple[Rule, ...] = (
    _rule("submit", NEW, QUEUED, SUBMITTER),
    _rule(
        "retry",
        NEW,
        QUEUED,
        f"{SUBMITTER} {OPERATOR}",
        "",
        "new linked run replaying a failed(transient) original's latest input",
        run_states=FAILED,
    ),
    _rule(
        "repair",
        NEW,
        QUEUED,
        f"{SUBMITTER} {OPERATOR}",
        "",
        "new linked run for the items not accepted, or corrections (correction_of)",
        run_states=_TERMINAL,
    ),
    _rule(
        "compensate",
        NEW,
        QUEUED,
        OPERATOR,
        "",
        "new linked run that undoes effects",
        run_states=_TERMINAL,
    ),
    _rule("start", QUEUED, RUNNING, CONTROLLER),
    _rule("request_review", RUNNING, AWAITING_REVIEW, CONTROLLER, "decision input_version"),
    _rule(
        "decide",
        AWAITING_REVIEW,
        f"{RUNNING} {FAILED}",
        REVIEWER,
        "input_version approve",
        "not by the run's submitter or an amender; a rejection fences live leases",
    ),
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
        done_in=f"{CANCELING} {CANCELED}",
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
        done_in=f"{SUCCEEDED} {COMPLETED_WITH_ERRORS}",
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
        "failure_kind failure_reason",
        "run deadline passed and no live lease",
    ),
)

# The rule book's item transitions (docs/explanation/rule-book.md).
ITEM_TRANSITIONS: tuple[Rule, ...] = (
    _rule("submit", NEW, PENDING, f"{SUBMITTER} {OPERATOR}"),
    _rule(
        "claim",
        f"{PENDING} {RETRYABLE}",
        IN_PROGRESS,
        WORKER,
        "lease_token attempt expires_at",
        "retryable items only past their backoff",
        run_states=RUNNING,
    ),
    _rule(
        "heartbeat",
        IN_PROGRESS,
        IN_PROGRESS,
        WORKER,
        "lease_token",
        "the lease holder",
        run_states=_OPEN,
    ),
    _rule(
        "accept", IN_PROGRESS, ACCEPTED, WORKER, "lease_token", "the lease holder", run_states=_OPEN
    ),
    _rule(
        "reject",
        IN_PROGRESS,
        REJECTED,
        WORKER,
        "lease_token rule",
        "the lease holder",
        run_states=_OPEN,
    ),
    _rule(
        "fail_attempt",
        IN_PROGRESS,
        f"{RETRYABLE} {QUARANTINED}",
        WORKER,
        "lease_token error",
        "quarantined when attempts are exhausted or retryable=False",
        run_states=_OPEN,
    ),
    _rule(
        "expire",
        IN_PROGRESS,
        f"{RETRYABLE} {QUARANTINED}",
        RECONCILER,
        "lease_token",
        "lease expired; quarantined when attempts are exhausted",
        run_states=_OPEN,
    ),
    _rule(
        "abandon",
        IN_PROGRESS,
        f"{RETRYABLE} {QUARANTINED}",
        f"{CONTROLLER} {OPERATOR}",
        "lease_token",
        "the run failed; its live leases are fenced",
        run_states=_OPEN,
    ),
    _rule(
        "deadline",
        RETRYABLE,
        QUARANTINED,
        RECONCILER,
        "",
        "the item deadline passed before it was claimed again",
        run_states=_OPEN,
    ),
    _rule("release", QUARANTINED, RETRYABLE, f"{REVIEWER} {OPERATOR}", run_states=_OPEN),
    _rule("reject_item", QUARANTINED, REJECTED, REVIEWER, "rule", run_states=_OPEN),
    _rule(
        "skip",
        f"{PENDING} {RETRYABLE} {QUARANTINED}",
        SKIPPED,
        f"{OPERATOR} {REVIEWER}",
        run_states=_OPEN,
    ),
    _rule(
        "withdraw",
        f"{PENDING} {RETRYABLE} {QUARANTINED}",
        SKIPPED,
        f"{SUBMITTER} {OPERATOR}",
        "",
        "amend(withdraw)",
        run_states=" ".join(sorted(OPEN_RUN_STATES - {CANCELING})),
    ),
    _rule(
        "cancel_skip",
        f"{PENDING} {RETRYABLE}",
        SKIPPED,
        CONTROLLER,
        "",
        "the run was canceled",
        run_states=_OPEN,
    ),
)

_RUN_BY_COMMAND = {r.command: r for r in RUN_TRANSITIONS}
_ITEM_BY_COMMAND = {r.command: r for r in ITEM_TRANSITIONS}

# Commands that move no state but are still ruled: who may make them, from where.
COMMAND_RULES: tuple[Rule, ...] = (
    _rule(
        "amend",
        " ".join(sorted(OPEN_RUN_STATES - {CANCELING})),
        "",
        f"{SUBMITTER} {OPERATOR}",
        "",
        "a new input version; the run stays in its state",
    ),
    _rule(
        "weaken_acceptance",
        " ".join(sorted(OPEN_RUN_STATES - {CANCELING})),
        "",
        OPERATOR,
        "weakened",
        "a change (amend, repair, compensate) that weakens acceptance: operators only, with a "
        "reason (rule 13 of the rule book)",
    ),
    _rule("reconcile", "", "", f"{RECONCILER} {OPERATOR}", "", "the reconciler pass"),
)
_COMMAND_BY_NAME = {r.command: r for r in COMMAND_RULES}

# Kept for callers of the first version: the roles of the commands above, and claim's.
RUN_COMMAND_ROLES: dict[str, frozenset[str]] = {
    "amend": _COMMAND_BY_NAME["amend"].roles,
    "claim": _ITEM_BY_COMMAND["claim"].roles,
    "reconcile": _COMMAND_BY_NAME["reconcile"].roles,
}

# Reasons (rule 1 of the rule book: every transition carries one) --------------
# Commands that change a run's course on a person's decision: the caller states why, and
# a missing or blank reason is refused (InvalidInput) before anything is read.
REASON_REQUIRED: frozenset[str] = frozenset(
    {"pause", "resume", "cancel", "fail", "weaken_acceptance", "compensate", "skip", "release"}
)

# The reason the ledger records for a transition whose caller gives none (or may not give
# one), by command, and by `command.case` where one command ends in different ways.
# `{name}` fields are filled in by the command (`stated_reason`). Amend, retry, repair and
# decide take the caller's reason when given; these are their texts otherwise.
STATED_REASONS: dict[str, str] = {
    "submit": "submitted",
    "retry": "retry of {original}",
    "repair": "{relation} {original}",
    "start": "started by {role}",
    "request_review": "awaiting review: {decision}",
    "decide.approve": "approved input version {input_version}",
    "decide.reject": "rejected input version {input_version}",
    "pause_finished": "pause finished: the last live lease ended",
    "cancel_finished": "canceled",  # the canceller's reason, when the cancel recorded one
    "complete.succeeded": "succeeded: every required item accepted",
    "complete.completed_with_errors": (
        "completed with errors: {missing} of {total} required items not accepted "
        "(tolerated {tolerated})"
    ),
    "reconcile_deadline": "run deadline of {seconds:g}s passed",
    "amend": "amended: input version {input_version}",
    "claim": "claimed under lease {lease}",
    "accept": "accepted",
    "reject": "{rule}",
    "fail_attempt.retryable": "attempt failed",
    "fail_attempt.not_retryable": "not retryable",
    "fail_attempt.exhausted": "attempts exhausted ({attempts} of {max_attempts})",
    "fail_attempt.deadline": "item deadline passed",
    "expire": "lease expired",
    "expire.exhausted": "lease expired (attempts exhausted)",
    "abandon.fail": "run failed: lease fenced",
    "abandon.review": "review rejected: lease fenced",
    "deadline": "item deadline passed",
    "reject_item": "{rule}",
    "withdraw": "withdrawn",
    "cancel_skip": "canceled",
}


def stated_reason(key: str, **fields: Any) -> str:
    """The rule book's reason for `key` (a command, or `command.case`), filled in."""
    return STATED_REASONS[key].format(**fields)


def needs_reason(command: str) -> bool:
    """Whether the caller of `command` must state a reason."""
    return command in REASON_REQUIRED


# Who owns a run's next step (rule 9 of the rule book), by state; None: it depends on the item counts
# (see waiting_on).
WAITING_ON: dict[str, str | None] = {
    QUEUED: CONTROLLER,
    RUNNING: None,
    AWAITING_REVIEW: REVIEWER,
    PAUSING: None,
    PAUSED: OPERATOR,
    CANCELING: None,
    SUCCEEDED: "nobody",
    COMPLETED_WITH_ERRORS: "nobody",
    FAILED: "nobody",
    CANCELED: "nobody",
}


# What the owner of a run's delay has to do next, by (run state, waiting_on), then by
# waiting_on alone: what the operator page and `ledger top` say beside each run. A
# running run waiting on its controller has every item final: the controller completes
# it, or (when too many required items were not accepted for it to succeed) fails it and
# submits a repair.
NEXT_STEP: dict[tuple[str, str], str] = {
    (QUEUED, CONTROLLER): "controller: start the run (or cancel it)",
    (RUNNING, "workers"): "workers: claim and finish the open items",
    (RUNNING, CONTROLLER): "controller: complete or repair the run",
    (RUNNING, REVIEWER): "reviewer: release, skip or reject the quarantined items",
    (AWAITING_REVIEW, REVIEWER): "reviewer: approve or reject",
    (PAUSED, OPERATOR): "operator: resume or cancel the run",
    (PAUSING, "workers"): "workers: finish the leased items; the run then pauses",
    (PAUSING, CONTROLLER): "ledger: the run pauses as its last lease ends",
    (CANCELING, "workers"): "workers: finish the leased items; the run then ends canceled",
    (CANCELING, CONTROLLER): "ledger: the run ends canceled as its last lease ends",
}
NEXT_STEP_BY_OWNER: dict[str, str] = {
    RECONCILER: "reconciler: expire the dead leases (ledger reconcile)",
    REVIEWER: "reviewer: approve or reject",
    OPERATOR: "operator: resume or cancel the run",
    CONTROLLER: "controller: complete or repair the run",
    "workers": "workers: claim and finish the open items",
    "nobody": "nobody: the run is finished",
}
# The same step when the run can no longer succeed without a repair (required items
# rejected, skipped or quarantined beyond what the policy tolerates).
NEXT_STEP_CANNOT_SUCCEED: dict[str, str] = {
    CONTROLLER: "controller: fail the run, then repair it",
    REVIEWER: "reviewer: release the quarantined items, or the controller fails and repairs the run",
    "workers": "workers: finish the open items; the run cannot succeed without a repair",
}


def next_step(state: str, owner: str, can_succeed: bool = True) -> str:
    """What the owner of the run's delay (`waiting_on`) has to do next (NEXT_STEP)."""
    if not can_succeed and state not in TERMINAL_RUN_STATES and owner in NEXT_STEP_CANNOT_SUCCEED:
        return NEXT_STEP_CANNOT_SUCCEED[owner]
    if owner == RECONCILER or state in TERMINAL_RUN_STATES:
        return NEXT_STEP_BY_OWNER["nobody" if state in TERMINAL_RUN_STATES else owner]
    return NEXT_STEP.get((state, owner)) or NEXT_STEP_BY_OWNER[owner]


def waiting_on(state: str, counts: dict[str, int]) -> str:
    """Who owns the run's next step: the WAITING_ON row, or by its item counts."""
    owner = WAITING_ON[state]
    if owner is not None:
        return owner
    if state in (CANCELING, PAUSING):  # draining: the workers finish, then the ledger
        return "workers" if counts.get(IN_PROGRESS, 0) else CONTROLLER
    if counts.get(PENDING, 0) or counts.get(RETRYABLE, 0) or counts.get(IN_PROGRESS, 0):
        return "workers"
    if counts.get(QUARANTINED, 0):
        return REVIEWER
    return CONTROLLER


def command_rule(command: str) -> Rule:
    """The row of COMMAND_RULES for a command that moves no state (amend, reconcile)."""
    return _COMMAND_BY_NAME[command]


def any_run_rule(command: str) -> Rule:
    """The run's rule for `command`: a transition row, else a COMMAND_RULES row."""
    rule = _RUN_BY_COMMAND.get(command)
    return rule if rule is not None else _COMMAND_BY_NAME[command]


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
