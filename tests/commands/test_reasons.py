"""Every transition has a reason (rule 1 of the rule book; seed 000: each transition
identifies "the run, previous state, new state, responsible actor or service, reason, and
time"). The ledger records the rule book's own reason where the caller gives none, and
the operator commands that change a run's course take theirs from the caller: without
one they are refused and write nothing. Histories written before, whose reasons are
null, still read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger import InvalidInput, Ledger, NotAuthorized
from ledger.core import states as S
from ledger.core.visibility import fingerprint
from tests.histories.load import from_json, import_stored
from tests.support.clock import ManualClock
from tests.support.drive import event_count
from tests.support.runs import (
    CONTROLLER,
    OPERATOR,
    RECONCILER,
    REVIEWER,
    SUBMITTER,
    WORKER,
    manifest,
)

HISTORIES = Path(__file__).parents[1] / "histories"
QA = {"decision": "qa"}


def _every_command(lg: Ledger, clock: ManualClock) -> dict[str, str]:
    """Runs that between them make every transition of the rule book's tables, each
    command called without a reason wherever the caller may leave it out; returns the
    lease tokens handed out (token -> item) so that no reason can be shown to carry one."""
    tokens: dict[str, str] = {}

    def claim(run_id: str, limit: int = 1) -> list[Any]:
        leases = lg.claim(run_id, WORKER, limit=limit)
        tokens.update({le.token: le.item_id for le in leases})
        return leases

    # a: amendments (one weakening), every outcome, release, skip, reject_item, expiry,
    # review approved, completed with errors; then its compensation (which drops the review)
    a = lg.submit(manifest(4, max_attempts=2, lease_seconds=10, review=QA), SUBMITTER).run_id
    lg.amend(a, SUBMITTER, None, items=[{"item_id": "n1", "payload": {}}])
    lg.amend(a, SUBMITTER, None, withdraw=["i3"])
    lg.amend(
        a,
        OPERATOR,
        "the customer takes what is ready",
        policy={"partial_delivery": True, "tolerated_failures": "100%"},
    )
    lg.start(a, CONTROLLER)
    i0, i1, i2, n1 = claim(a, 4)
    lg.heartbeat(i0)
    lg.accept(i0)
    lg.reject(i1, "negative-amount")
    lg.fail_attempt(i2, "timeout")
    lg.fail_attempt(n1, "bad file", retryable=False)
    lg.release(a, "n1", REVIEWER, "the file was replaced")
    claim(a, 2)
    clock.advance(11)
    lg.reconcile(actor=RECONCILER)  # both leases expire, their attempts are exhausted
    lg.skip(a, "n1", OPERATOR, "not needed this month")
    lg.reject_item(a, "i2", REVIEWER, "no-source")
    lg.request_review(a, CONTROLLER, "qa")
    lg.decide(a, REVIEWER, lg.status(a).input_version, True, None)
    assert lg.complete(a, CONTROLLER).state == S.COMPLETED_WITH_ERRORS
    lg.compensate(a, OPERATOR, "refund the accepted invoice")

    # b: a pause that drains, a resume, a cancel that drains
    b = lg.submit(manifest(3), SUBMITTER).run_id
    lg.start(b, CONTROLLER)
    (b0,) = claim(b)
    assert lg.pause(b, OPERATOR, "maintenance window").state == S.PAUSING
    lg.accept(b0)
    assert lg.status(b).state == S.PAUSED
    lg.resume(b, OPERATOR, reason="maintenance over")
    (b1,) = claim(b)
    assert lg.cancel(b, SUBMITTER, "export withdrawn").state == S.CANCELING
    lg.fail_attempt(b1, "interrupted")
    assert lg.status(b).state == S.CANCELED

    # c: an operator's fail that fences a live lease; its retry and repair
    c = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(c, CONTROLLER)
    claim(c)
    lg.fail(c, OPERATOR, "the source export vanished", transient=True)
    lg.retry(c, SUBMITTER)
    lg.repair(c, SUBMITTER)

    # d: an item deadline and a run deadline the reconciler enforces
    d = lg.submit(manifest(2, item_deadline_seconds=5, run_deadline_seconds=30), SUBMITTER)
    lg.start(d.run_id, CONTROLLER)
    (d0,) = claim(d.run_id)
    lg.fail_attempt(d0, "timeout")
    clock.advance(6)
    lg.reconcile(actor=RECONCILER)
    clock.advance(30)
    lg.reconcile(actor=RECONCILER)
    assert lg.status(d.run_id).failure_reason == "deadline_exceeded"

    # e: a review rejection that fences a live lease
    e = lg.submit(manifest(1, review=QA), SUBMITTER).run_id
    lg.start(e, CONTROLLER)
    claim(e)
    lg.request_review(e, CONTROLLER, "qa")
    lg.decide(e, REVIEWER, lg.status(e).input_version, False, None)
    return tokens


def test_every_transition_of_every_command_has_a_reason(lg: Ledger, clock: ManualClock) -> None:
    tokens = _every_command(lg, clock)
    history = [t for r in lg.runs(limit=100) for t in lg.history(r.run_id)]
    # every row of the tables that moves something was made (heartbeat is no transition,
    # reconcile a pass that makes others)
    rows = {r.command for r in (*S.RUN_TRANSITIONS, *S.ITEM_TRANSITIONS, *S.COMMAND_RULES)}
    made = {t.command for t in history}
    assert rows - made == {"heartbeat", "reconcile"}, rows - made
    for t in history:
        assert isinstance(t.reason, str) and t.reason.strip(), (t.command, t.item_id, t.reason)
        assert not any(token in t.reason for token in tokens), t.reason  # never a lease token
    audit = lg.audit(limit=10_000)
    assert len(audit) == len(history)
    assert all(t.reason and t.reason.strip() for t in audit)


def test_the_ledgers_own_reasons_are_the_rule_books(lg: Ledger) -> None:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    (lease,) = lg.claim(run_id, WORKER)
    submit, start, claim = lg.history(run_id)
    assert (submit.reason, start.reason) == ("submitted", "started by controller")
    assert claim.reason == f"claimed under lease {fingerprint(lease.token)}"
    assert lg.status(run_id).summary == "started by controller"


# ---------------------------------------------------------------------------
# the operator commands that change a run's course take the caller's reason
# ---------------------------------------------------------------------------
def _paused(lg: Ledger) -> str:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    lg.pause(run_id, OPERATOR, "maintenance window")
    return run_id


def _running(lg: Ledger) -> str:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    return run_id


COURSE: dict[str, tuple[Callable[[Ledger], str], Callable[[Ledger, str, Any], Any]]] = {
    "pause": (_running, lambda lg, r, why: lg.pause(r, OPERATOR, why)),
    "resume": (_paused, lambda lg, r, why: lg.resume(r, OPERATOR, reason=why)),
    "cancel": (_running, lambda lg, r, why: lg.cancel(r, OPERATOR, why)),
    "cancel-by-submitter": (_running, lambda lg, r, why: lg.cancel(r, SUBMITTER, why)),
    "fail": (_running, lambda lg, r, why: lg.fail(r, OPERATOR, why, transient=True)),
    "fail-by-controller": (
        _running,
        lambda lg, r, why: lg.fail(r, CONTROLLER, why, transient=False),
    ),
}
LEFT_OUT: dict[str, Callable[[Ledger, str], Any]] = {
    "pause": lambda lg, r: lg.pause(r, OPERATOR),
    "resume": lambda lg, r: lg.resume(r, OPERATOR),
    "cancel": lambda lg, r: lg.cancel(r, OPERATOR),
}


@pytest.mark.parametrize("reason", [None, "", "  \n\t"], ids=["none", "empty", "blank"])
@pytest.mark.parametrize("command", list(COURSE))
def test_a_change_of_course_without_a_reason_is_refused_and_writes_nothing(
    lg: Ledger, command: str, reason: str | None
) -> None:
    make, call = COURSE[command]
    run_id = make(lg)
    before, state = event_count(lg), lg.status(run_id).state
    with pytest.raises(InvalidInput, match="reason is required"):
        call(lg, run_id, reason)
    assert event_count(lg) == before and lg.status(run_id).state == state
    call(lg, run_id, "an operator's decision")
    assert lg.history(run_id)[-1].reason == "an operator's decision"


@pytest.mark.parametrize("command", list(LEFT_OUT))
def test_a_reason_left_out_is_refused_too(lg: Ledger, command: str) -> None:
    run_id = _paused(lg) if command == "resume" else _running(lg)
    before = event_count(lg)
    with pytest.raises(InvalidInput, match=f"reason is required.*{command}"):
        LEFT_OUT[command](lg, run_id)
    assert event_count(lg) == before


def test_the_reason_is_checked_before_the_run_is_looked_up(lg: Ledger) -> None:
    # argument validation comes first in the rule book's order of checks
    with pytest.raises(InvalidInput, match="reason is required"):
        lg.pause("00000000-0000-4000-8000-000000000000", OPERATOR, " ")


@pytest.mark.parametrize("reason", [None, " "], ids=["none", "blank"])
def test_a_weakening_without_a_reason_is_refused_and_writes_nothing(
    lg: Ledger, reason: str | None
) -> None:
    run_id = lg.submit(manifest(2, review=QA), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    before = event_count(lg)
    with pytest.raises(InvalidInput, match="reason"):
        lg.amend(run_id, OPERATOR, reason, policy={"review": None})
    assert event_count(lg) == before
    lg.fail(run_id, CONTROLLER, "upstream down", transient=True)
    before = event_count(lg)
    with pytest.raises(InvalidInput, match="reason"):
        lg.repair(run_id, OPERATOR, policy={"review": None}, reason=reason)
    assert event_count(lg) == before


# ---------------------------------------------------------------------------
# retry and compensate judge weakening as amend and repair do
# ---------------------------------------------------------------------------
def _weakenings(lg: Ledger, run_id: str) -> list[Any]:
    return [t for t in lg.history(run_id) if t.command == "weaken_acceptance"]


def test_a_retry_replays_the_same_acceptance_and_weakens_nothing(lg: Ledger) -> None:
    run_id = lg.submit(manifest(2, review=QA), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    lg.fail(run_id, CONTROLLER, "upstream down", transient=True)
    retry = lg.retry(run_id, SUBMITTER)  # the party under review may retry: nothing is shed
    assert retry.policy["review"]["decision"] == "qa"
    assert _weakenings(lg, retry.run_id) == []
    assert lg.history(retry.run_id)[0].reason == f"retry of {run_id}"


def test_a_compensation_that_drops_the_review_is_a_recorded_weakening(lg: Ledger) -> None:
    run_id = lg.submit(manifest(2, review=QA), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    for lease in lg.claim(run_id, WORKER, limit=2):
        lg.accept(lease)
    lg.request_review(run_id, CONTROLLER, "qa")
    lg.decide(run_id, REVIEWER, lg.status(run_id).input_version, True, "fine")
    lg.complete(run_id, CONTROLLER)
    before = event_count(lg)
    with pytest.raises(NotAuthorized):
        lg.compensate(run_id, SUBMITTER, "undo my own run")
    with pytest.raises(InvalidInput, match="reason is required"):
        lg.compensate(run_id, OPERATOR, " ")
    assert event_count(lg) == before
    new = lg.compensate(run_id, OPERATOR, "refund both invoices")
    [weakening] = _weakenings(lg, new.run_id)
    assert (weakening.actor_id, weakening.reason) == (OPERATOR.id, "refund both invoices")
    assert weakening.evidence["relative_to"] == run_id
    assert any("review" in w for w in weakening.evidence["weakened"])
    audit = lg.audit(run_id=new.run_id, role=S.OPERATOR)
    assert [t.command for t in audit] == ["compensate", "weaken_acceptance"]


def test_a_compensation_that_makes_a_required_item_optional_is_a_weakening(lg: Ledger) -> None:
    run_id = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    for lease in lg.claim(run_id, WORKER, limit=2):
        lg.accept(lease)
    lg.complete(run_id, CONTROLLER)
    undo = [{"item_id": "i0", "payload": {"undo": True}, "required": False}]
    new = lg.compensate(run_id, OPERATOR, "reverse i0 if possible", items=undo)
    [weakening] = _weakenings(lg, new.run_id)
    assert any("i0" in w and "optional" in w for w in weakening.evidence["weakened"])


def test_a_compensation_under_the_same_acceptance_weakens_nothing(lg: Ledger) -> None:
    run_id = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    for lease in lg.claim(run_id, WORKER, limit=2):
        lg.accept(lease)
    lg.complete(run_id, CONTROLLER)
    new = lg.compensate(run_id, OPERATOR, "refund")
    assert _weakenings(lg, new.run_id) == []
    assert lg.status(new.run_id).revision == 1


# ---------------------------------------------------------------------------
# histories written before: null reasons still replay and read
# ---------------------------------------------------------------------------
def test_a_saved_history_with_null_reasons_still_reads(lg: Ledger) -> None:
    saved = json.loads((HISTORIES / "flaky_success.json").read_text())
    events = [from_json(e) for e in saved["events"]]
    import_stored(lg, events)
    lg.rebuild_projections()
    history = [t for r in lg.runs() for t in lg.history(r.run_id)]
    nulls = [t for t in history if t.reason is None]
    assert nulls and {t.command for t in nulls} >= {"submit", "start", "claim"}
    for run in lg.runs():
        status = lg.status(run.run_id)
        last = [t for t in lg.history(run.run_id) if t.item_id is None][-1]
        # the summary of a run whose latest transition has no reason names its state
        assert status.summary == (last.reason or f"run {status.state}")
    assert lg.verify().ok
