"""A reference model of the run ledger written from the rule book (tables, rules 3-9, 12-16)
and the seeds, for tests/commands/test_stateful_spec.py. It knows nothing of the code.

Where the rule book leaves a detail open the model either allows each reading (`alts`: the
states an item may be in; `eligible` as an interval) or the machine does not make the
move while it is open (a lease expired but not reconciled makes "is a lease live?"
ambiguous for pause, cancel and fail). Everything else it predicts exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ledger.core import states as S

EDITABLE = frozenset({S.PENDING, S.RETRYABLE, S.QUARANTINED})
OPEN_ITEM = frozenset({S.PENDING, S.IN_PROGRESS, S.RETRYABLE})
LIVE_RUN = (S.QUEUED, S.RUNNING, S.AWAITING_REVIEW, S.PAUSING, S.PAUSED)


@dataclass
class MItem:
    """One item as the rule book says it must be."""

    item_id: str
    required: bool
    state: str = S.PENDING
    attempts: int = 0
    token: str | None = None
    expires: datetime | None = None
    # a retryable item is claimable from some time in [lo, hi] (the rule book fixes it exactly
    # only for a failed attempt: its time plus backoff_seconds)
    eligible: tuple[datetime, datetime] | None = None
    withdrawn: bool = False
    alts: frozenset[str] = frozenset()  # other states the rule book allows it to be in now

    def may_be(self, state: str) -> bool:
        return state == self.state or state in self.alts


@dataclass
class MRun:
    """One run as the rule book says it must be."""

    run_id: str
    policy: dict[str, Any]
    items: dict[str, MItem]
    input_version: str
    submitter_id: str
    state: str = S.QUEUED
    started_at: datetime | None = None
    failure_kind: str | None = None
    failure_reason: str | None = None
    stop_reason: str | None = None  # expected, when the rule book fixes it
    cancel_reason: str | None = None
    bound: str | None = None  # the input version under review
    approved: bool = False  # an approval that still applies (rule 7, 13)
    survives_at_approval: bool = False
    versions: list[str] = field(default_factory=list)  # every input version it had
    amenders: set[str] = field(default_factory=set)
    failures: int = 0  # attempts that ended failed, expired or abandoned
    abandoned: int = 0  # of those, the attempts a fail or a review rejection fenced
    children: dict[str, list[str]] = field(default_factory=dict)  # relation -> run ids

    @property
    def terminal(self) -> bool:
        return S.is_terminal(self.state)

    def in_progress(self) -> list[MItem]:
        return [it for it in self.items.values() if it.state == S.IN_PROGRESS]

    def expired(self, now: datetime) -> list[MItem]:
        """Leases past their expiry that nobody has reconciled yet."""
        return [it for it in self.in_progress() if it.expires is not None and it.expires < now]

    def murky(self, now: datetime) -> bool:
        """A lease expired unreconciled: the rule book does not say whether it still counts as live."""
        return bool(self.expired(now))

    def go(self, state: str) -> None:
        self.state = state

    def skip_open(self) -> None:
        """Cancellation: pending and retryable items end skipped (reason canceled)."""
        for it in self.items.values():
            if it.state in (S.PENDING, S.RETRYABLE) or (it.state == S.SKIPPED and it.alts):
                it.state, it.alts = S.SKIPPED, frozenset()  # in-flight attempts may finish

    def fence(self) -> None:
        """A fail (or a review rejection) ends every live lease: the attempt is abandoned.
        The table allows retryable or quarantined; the rule book does not say which."""
        for it in self.in_progress():
            it.token = it.expires = None
            it.state = S.RETRYABLE
            it.alts = frozenset({S.QUARANTINED})
            self.failures += 1
            self.abandoned += 1

    def finish_if_drained(self) -> str | None:
        """The last live lease of a canceling or pausing run ended: it ends in the same
        transaction (rule 6)."""
        if self.in_progress():
            return None
        if self.state == S.CANCELING:
            self.skip_open()
            self.go(S.CANCELED)
            self.stop_reason = self.cancel_reason
            return "cancel"
        if self.state == S.PAUSING:
            self.go(S.PAUSED)
            return "pause"
        return None

    def tolerated(self) -> int:
        required = sum(1 for it in self.items.values() if it.required and not it.withdrawn)
        tol = self.policy.get("tolerated_failures")
        if tol is None:
            return required
        if isinstance(tol, int):
            return tol
        return required * int(str(tol).rstrip("%")) // 100

    def review_policy(self) -> dict[str, Any] | None:
        review = self.policy.get("review")
        return review if isinstance(review, dict) else None

    def waiting_on(self, now: datetime) -> str | None:
        """Rule 9's owner of the delay; None where the rule book leaves it open."""
        if self.terminal:
            return "nobody"
        if self.murky(now) and self.state in (S.RUNNING, S.CANCELING, S.PAUSING):
            return "reconciler"  # rule 19: an expired lease nobody has reconciled
        if self.murky(now) or self.state == S.PAUSING:
            return None
        if self.state == S.QUEUED:
            return "controller"
        if self.state == S.PAUSED:
            return "operator"
        if self.state == S.AWAITING_REVIEW:
            return "reviewer"
        if self.state == S.CANCELING:
            return "workers"
        states = [it.state for it in self.items.values()]
        if S.PENDING in states or S.IN_PROGRESS in states:
            return "workers"
        retryable = [it for it in self.items.values() if it.state == S.RETRYABLE]
        if retryable:
            if any(it.alts for it in retryable):
                return None
            if any(it.eligible is None or it.eligible[1] <= now for it in retryable):
                return "workers"
            return None  # only items in backoff: the rule book does not say
        if any(it.alts for it in self.items.values()):
            return None
        return "reviewer" if S.QUARANTINED in states else "controller"


def weakens(run: MRun, change: dict[str, Any]) -> bool:
    """Rule 13: does this policy change weaken acceptance?"""
    old = run.policy
    if "review" in change and change["review"] != old.get("review") and old.get("review"):
        return True
    if (
        "partial_delivery" in change
        and change["partial_delivery"]
        and not old.get("partial_delivery")
    ):
        return True
    if "tolerated_failures" in change:
        new, was = change["tolerated_failures"], old.get("tolerated_failures")
        if isinstance(new, int) and isinstance(was, int) and new > was:
            return True
    return bool(
        "max_attempts" in change
        and change["max_attempts"] > old.get("max_attempts", 3)
        and run.failures
    )


def claimable(run: MRun, now: datetime) -> tuple[list[MItem], bool]:
    """Items a claim may take now, and whether the rule book leaves any item's turn open."""
    out, unsure = [], False
    for it in run.items.values():
        if it.alts:
            unsure = True
        if it.state == S.PENDING:
            out.append(it)
        elif it.state == S.RETRYABLE:
            lo, hi = it.eligible or (now, now)
            if hi <= now:
                out.append(it)
            elif lo <= now:
                unsure = True
    return out, unsure


def after(now: datetime, seconds: float) -> datetime:
    return now + timedelta(seconds=seconds)
