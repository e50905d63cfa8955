"""What needs attention first: one ordering of open runs, shared by `ledger top`, the
overview's lists and the operator page (`board(order="attention")`), and whether a run
can still succeed (the operator page and status show an ETA only for those).

The order, most urgent first:
0. stuck: a lease expired and nobody reconciled it, or stalled (waiting on workers with
   no activity for `policy.stall_seconds`);
1. waiting on a person's or a process's decision: reviewer, operator, controller;
2. waiting on workers that are working;
3. nobody (terminal runs).
Within a tier, the longest wait first (`waiting_since`, oldest first), then the oldest run.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ledger.core import states as S
from ledger.core.manifest import Policy

# The tier of each owner of a run's delay (see the module docstring); stuck runs are tier 0.
TIERS: dict[str, int] = {
    "reconciler": 0,
    S.REVIEWER: 1,
    S.OPERATOR: 1,
    S.CONTROLLER: 1,
    "workers": 2,
    "nobody": 3,
}
_LAST = datetime.max.replace(tzinfo=UTC)
# Item states that keep a required item from being accepted without someone's decision.
LOST_STATES: tuple[str, ...] = (S.REJECTED, S.SKIPPED, S.QUARANTINED)


def attention_key(
    waiting_on: str,
    stalled: bool,
    expired_leases: int,
    waiting_since: datetime | None,
    seq: int,
) -> tuple[int, datetime, int]:
    """The sort key of a run in the attention order (smaller: more urgent)."""
    tier = 0 if stalled or expired_leases else TIERS.get(waiting_on, 2)
    return (tier, waiting_since or _LAST, seq)


def by_attention(run: Any) -> tuple[int, datetime, int]:
    """`attention_key` of anything with the run signal fields and `seq` (a board row, a
    stuck run of the overview)."""
    return attention_key(
        run.waiting_on, run.stalled, run.expired_leases, run.waiting_since, int(run.seq)
    )


def can_succeed(
    state: str,
    cancel_requested: bool,
    policy: dict[str, Any],
    lost_required: int,
    required_total: Any,
) -> bool:
    """Whether the open run can still end succeeded or completed_with_errors without a
    repair: not canceling (nor asked to cancel), and its required items rejected, skipped or
    quarantined (`lost_required`) within what the policy tolerates (none without partial
    delivery). A quarantined item counts until a reviewer releases it. `required_total` is
    a callable giving the run's required item count, asked only when a percentage needs it."""
    if state in S.TERMINAL_RUN_STATES or state == S.CANCELING or cancel_requested:
        return False
    if lost_required <= 0:
        return True
    if not policy.get("partial_delivery"):
        return False
    tolerated = policy.get("tolerated_failures")
    if tolerated is None:
        return True
    if isinstance(tolerated, int):
        return lost_required <= tolerated
    return lost_required <= Policy(partial_delivery=True, tolerated_failures=tolerated).tolerated(
        int(required_total())
    )
