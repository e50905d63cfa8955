"""Drive runs and items into any state through the public commands, for table-driven tests.

Every helper only uses `Ledger`'s public commands, so a state reached here is a state
a real caller can reach. Used by tests/commands/test_transitions.py and test_rules.py and
tests/core/test_errors.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger import Actor, Lease, Ledger
from ledger.core import states as S
from tests.support.runs import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER, manifest

ALL_ACTORS: dict[str, Actor] = {
    S.SUBMITTER: SUBMITTER,
    S.CONTROLLER: CONTROLLER,
    S.WORKER: WORKER,
    S.REVIEWER: REVIEWER,
    S.OPERATOR: OPERATOR,
    S.RECONCILER: Actor("rec", S.RECONCILER),
}
DECISION = "sign-off"


def actor(role: str) -> Actor:
    """The test actor holding `role`."""
    return ALL_ACTORS[role]


def event_count(lg: Ledger) -> int:
    """Events in the store, counted in the events table itself (not a projection)."""
    with lg.store.read() as tx:
        row = tx.fetchone(f"SELECT COUNT(*) AS n FROM {lg.store.events_table()}")  # noqa: S608 (our own table/column names; values are bound parameters)
    assert row is not None
    return int(row["n"])


def transition_count(lg: Ledger) -> int:
    """Rows of the transition projection."""
    with lg.store.read() as tx:
        row = tx.fetchone("SELECT COUNT(*) AS n FROM lg_transitions")
    assert row is not None
    return int(row["n"])


@dataclass
class Driven:
    """A run driven into a state, with the leases still live in it."""

    run_id: str
    state: str
    leases: list[Lease] = field(default_factory=list)


def submit(lg: Ledger, n: int = 2, **policy: Any) -> str:
    return lg.submit(manifest(n, **policy), SUBMITTER).run_id


def run_in(
    lg: Ledger, state: str, n: int = 2, live_lease: bool | None = None, **policy: Any
) -> Driven:
    """A run in `state`. `live_lease=True` leaves one item leased where the state allows it
    (running, awaiting_review: on request; pausing and canceling always have one)."""
    if state == S.COMPLETED_WITH_ERRORS:
        policy.setdefault("partial_delivery", True)
    run_id = submit(lg, n, **policy)
    if state == S.QUEUED:
        return Driven(run_id, state)
    if state == S.CANCELED:
        assert lg.cancel(run_id, OPERATOR, "stop").state == S.CANCELED
        return Driven(run_id, state)
    lg.start(run_id, CONTROLLER)
    leases: list[Lease] = []
    if state in (S.PAUSING, S.CANCELING) or live_lease:
        leases = lg.claim(run_id, WORKER, limit=1)
        assert len(leases) == 1
    if state == S.RUNNING:
        pass
    elif state == S.AWAITING_REVIEW:
        lg.request_review(run_id, CONTROLLER, DECISION)
    elif state in (S.PAUSING, S.PAUSED):
        lg.pause(run_id, OPERATOR, "hold")
    elif state == S.CANCELING:
        lg.cancel(run_id, OPERATOR, "stop")
    elif state == S.FAILED:
        lg.fail(run_id, CONTROLLER, "broken", transient=True, failure_reason="input_unavailable")
    elif state in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
        got = lg.claim(run_id, WORKER, limit=n)
        for k, le in enumerate(sorted(got, key=lambda x: x.item_id)):
            if state == S.COMPLETED_WITH_ERRORS and k == 0:
                lg.reject(le, "bad-row", "first item rejected")
            else:
                lg.accept(le)
        lg.complete(run_id, CONTROLLER)
    else:  # pragma: no cover
        raise AssertionError(f"no driver for run state {state}")
    st = lg.status(run_id)
    assert st.state == state, (state, st.state, st.summary)
    return Driven(run_id, state, leases)


# Items named by the state they are driven into; `pending` last so claims in manifest
# order never pick it.
ITEM_ORDER = (
    S.SKIPPED,
    S.IN_PROGRESS,
    S.RETRYABLE,
    S.QUARANTINED,
    S.ACCEPTED,
    S.REJECTED,
    S.PENDING,
)


@dataclass
class ItemZoo:
    """A running run holding one item in every item state."""

    run_id: str
    leases: dict[str, Lease]  # the lease each claimed item got (only in_progress is live)


def item_zoo(lg: Ledger, **policy: Any) -> ItemZoo:
    """A running run with items `skipped`, `in_progress`, ..., `pending`, each in that state."""
    m = manifest(1, **policy)
    m["items"] = [{"item_id": s, "payload": {"s": s}} for s in ITEM_ORDER]
    run_id = lg.submit(m, SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    lg.skip(run_id, S.SKIPPED, OPERATOR, "not needed")
    got = {le.item_id: le for le in lg.claim(run_id, WORKER, limit=5)}
    assert sorted(got) == sorted(
        [S.IN_PROGRESS, S.RETRYABLE, S.QUARANTINED, S.ACCEPTED, S.REJECTED]
    )
    lg.fail_attempt(got[S.RETRYABLE], "timeout talking to upstream")
    lg.fail_attempt(got[S.QUARANTINED], "corrupt row", retryable=False)
    lg.accept(got[S.ACCEPTED])
    lg.reject(got[S.REJECTED], "bad-row")
    states = {it.item_id: it.state for it in lg.items(run_id)}
    assert states == {s: s for s in ITEM_ORDER}, states
    return ItemZoo(run_id, got)
