"""The rule-book audit's numbered findings, one or more tests each, on every store.

Written from the rule book (rules 3-9, 12-16) and the seeds, not from the code. A test
marked with `bug(n, ...)` failed on the code the audit found the bug in; it is a strict
xfail until the fix lands (see tests/support/findings.py). The unmarked tests next to them pin
the behaviour that is already right, so a fix cannot overshoot (e.g. refuse every
amendment of a reviewed run).
"""

# Lambdas in loops below are called at once, so late binding is harmless.
# ruff: noqa: B023

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ledger import (
    Actor,
    AlreadyTerminal,
    Conflict,
    IllegalTransition,
    InvalidInput,
    LeaseLost,
    Ledger,
    NotAuthorized,
    NotComplete,
)
from ledger.core import states as S
from tests.support.clock import ManualClock
from tests.support.drive import event_count, run_in
from tests.support.findings import refused, run_transitions, verify_clean
from tests.support.runs import (
    CONTROLLER,
    OPERATOR,
    RECONCILER,
    REVIEWER,
    SUBMITTER,
    WORKER,
    manifest,
    running,
)

QA = {"decision": "qa", "survives_amendment": False}
QA_SURVIVES = {"decision": "qa", "survives_amendment": True}


def approved(lg: Ledger, n: int = 2, **policy: Any) -> str:
    """A running run whose review (policy `review`) was requested and approved."""
    run_id = running(lg, n, **policy)
    st = lg.request_review(run_id, CONTROLLER, "qa")
    lg.decide(run_id, REVIEWER, st.input_version, True, "looks right")
    assert lg.status(run_id).state == S.RUNNING
    return run_id


def work_all(lg: Ledger, run_id: str) -> None:
    """Claim and accept every claimable item."""
    while leases := lg.claim(run_id, WORKER, limit=10):
        for le in leases:
            lg.accept(le, evidence={"stored_as": f"s3://out/{le.item_id}"})


def lease_writes(lg: Ledger) -> dict[str, Any]:
    """Every write a lease holder can make."""
    return {
        "heartbeat": lambda le: lg.heartbeat(le),
        "accept": lambda le: lg.accept(le, evidence={"stored_as": "s3://x"}),
        "reject": lambda le: lg.reject(le, "rule-1", detail="late"),
        "fail_attempt": lambda le: lg.fail_attempt(le, "boom"),
        "fail_attempt_final": lambda le: lg.fail_attempt(le, "boom", retryable=False),
    }


# ---------------------------------------------------------------------------
# bug 1: a review rejection fails the run but does not fence its live leases
# ---------------------------------------------------------------------------
def rejected_with_live_lease(lg: Ledger) -> tuple[str, Any]:
    d = run_in(lg, S.AWAITING_REVIEW, live_lease=True)
    st = lg.status(d.run_id)
    out = lg.decide(d.run_id, REVIEWER, st.input_version, False, "numbers do not add up")
    assert (out.state, out.failure_kind, out.failure_reason) == (
        S.FAILED,
        S.PERMANENT,
        "review_rejected",
    )
    return d.run_id, d.leases[0]


def test_bug1_review_rejection_fences_live_leases(lg: Ledger) -> None:
    run_id, lease = rejected_with_live_lease(lg)
    st = lg.status(run_id)
    assert st.counts[S.IN_PROGRESS] == 0, st.counts
    item = next(i for i in lg.items(run_id) if i.item_id == lease.item_id)
    assert item.lease is None and item.state != S.IN_PROGRESS
    attempt = lg.attempts(run_id, lease.item_id)[-1]
    assert (attempt.lease_token, attempt.outcome) == (lease.token, "abandoned")
    assert attempt.finished_at is not None
    verify_clean(lg)


@pytest.mark.parametrize("write", ["heartbeat", "accept", "reject", "fail_attempt_final"])
def test_bug1_worker_cannot_write_after_review_rejection(lg: Ledger, write: str) -> None:
    run_id, lease = rejected_with_live_lease(lg)
    items = lg.items(run_id)
    refused(lg, (LeaseLost, AlreadyTerminal), lambda: lease_writes(lg)[write](lease))
    assert lg.items(run_id) == items
    verify_clean(lg)


def test_bug1_reconciler_leaves_rejected_run_alone(lg: Ledger, clock: ManualClock) -> None:
    run_id, _lease = rejected_with_live_lease(lg)
    items = lg.items(run_id)
    clock.advance(3600)
    lg.reconcile(actor=RECONCILER)
    assert lg.items(run_id) == items, "an item of a terminal run changed"
    verify_clean(lg)


def test_bug1_cli_review_reject_fences_live_leases(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ledger.cli.entry import app

    dsn = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.open(dsn) as lg:
        d = run_in(lg, S.AWAITING_REVIEW, live_lease=True)
        version = lg.status(d.run_id).input_version
    args = ["--dsn", dsn, "--as", "rita:reviewer", "review", d.run_id, "--reject"]
    result = CliRunner().invoke(app, [*args, "--input-version", version, "--reason", "no"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    with Ledger.open(dsn) as lg:
        assert lg.status(d.run_id).state == S.FAILED
        refused(lg, (LeaseLost, AlreadyTerminal), lambda: lg.accept(d.leases[0]))
        verify_clean(lg)


def test_bug1_fail_fences_live_leases(lg: Ledger) -> None:
    """The reference behaviour review rejection must match (the rule book: a fail fences)."""
    d = run_in(lg, S.AWAITING_REVIEW, live_lease=True)
    lg.fail(d.run_id, CONTROLLER, "upstream gone", transient=True)
    lease = d.leases[0]
    for write in lease_writes(lg).values():
        refused(lg, (LeaseLost, AlreadyTerminal), lambda: write(lease))
    verify_clean(lg)


# ---------------------------------------------------------------------------
# bug 2: the party under review can remove the gate; one actor both submits and reviews
# ---------------------------------------------------------------------------
# (name, policy at submit, whether items failed first, the weakening amendment)
WEAKENINGS: list[tuple[str, dict[str, Any], bool, dict[str, Any]]] = [
    ("remove review", {"review": QA}, False, {"review": None}),
    ("change review", {"review": QA}, False, {"review": {**QA, "decision": "rubber-stamp"}}),
    ("set survives_amendment", {"review": QA}, False, {"review": QA_SURVIVES}),
    ("enable partial_delivery", {}, True, {"partial_delivery": True}),
    (
        "raise tolerated_failures",
        {"partial_delivery": True, "tolerated_failures": 0},
        True,
        {"tolerated_failures": "100%"},
    ),
    ("raise max_attempts after failures", {"max_attempts": 1}, True, {"max_attempts": 50}),
]
WEAKENING_IDS = [w[0] for w in WEAKENINGS]


def with_failure(lg: Ledger, policy: dict[str, Any], failed: bool) -> str:
    run_id = running(lg, 3, **policy)
    if failed:
        (le,) = lg.claim(run_id, WORKER, limit=1)
        lg.fail_attempt(le, "upstream said no", retryable=False)
    return run_id


@pytest.mark.parametrize(("name", "policy", "failed", "change"), WEAKENINGS, ids=WEAKENING_IDS)
def test_bug2_submitter_cannot_weaken_acceptance(
    lg: Ledger, name: str, policy: dict[str, Any], failed: bool, change: dict[str, Any]
) -> None:
    run_id = with_failure(lg, policy, failed)
    before = lg.status(run_id)
    refused(lg, NotAuthorized, lambda: lg.amend(run_id, SUBMITTER, "simplify", policy=change))
    assert lg.status(run_id) == before


def test_bug2_submitter_cannot_drop_review_while_awaiting_it(lg: Ledger) -> None:
    run_id = running(lg, 1, review=QA)
    lg.request_review(run_id, CONTROLLER, "qa")
    refused(
        lg, NotAuthorized, lambda: lg.amend(run_id, SUBMITTER, "skip it", policy={"review": None})
    )
    assert lg.status(run_id).state == S.AWAITING_REVIEW


@pytest.mark.parametrize(("name", "policy", "failed", "change"), WEAKENINGS, ids=WEAKENING_IDS)
def test_bug2_operator_weakening_needs_a_reason(
    lg: Ledger, name: str, policy: dict[str, Any], failed: bool, change: dict[str, Any]
) -> None:
    run_id = with_failure(lg, policy, failed)
    for reason in (None, ""):
        refused(lg, InvalidInput, lambda: lg.amend(run_id, OPERATOR, reason, policy=change))


@pytest.mark.parametrize(("name", "policy", "failed", "change"), WEAKENINGS, ids=WEAKENING_IDS)
def test_operator_may_weaken_with_a_reason(
    lg: Ledger, name: str, policy: dict[str, Any], failed: bool, change: dict[str, Any]
) -> None:
    """Rule 13: an operator may weaken acceptance, with a reason, as a recorded transition."""
    run_id = with_failure(lg, policy, failed)
    st = lg.amend(run_id, OPERATOR, "customer accepted the risk", policy=change)
    for key, value in change.items():
        got = st.policy[key]
        if isinstance(value, dict) and isinstance(got, dict):
            got = {k: got[k] for k in value}
        assert got == value, (key, st.policy)
    last = run_transitions(lg, run_id)[-1]
    assert (last.actor_id, last.role, last.reason) == (
        OPERATOR.id,
        S.OPERATOR,
        "customer accepted the risk",
    )
    verify_clean(lg)


@pytest.mark.parametrize(
    ("policy", "change"),
    [
        ({"review": None}, {"review": QA}),  # adding a gate
        ({"max_attempts": 3}, {"max_attempts": 1}),  # fewer attempts
        ({"partial_delivery": True, "tolerated_failures": 2}, {"tolerated_failures": 1}),
        ({"partial_delivery": True}, {"partial_delivery": False}),
        ({"max_attempts": 1}, {"max_attempts": 5}),  # more attempts before any failure
    ],
    ids=["add review", "lower max_attempts", "lower tolerated", "disable partial", "raise early"],
)
def test_submitter_may_strengthen_acceptance(
    lg: Ledger, policy: dict[str, Any], change: dict[str, Any]
) -> None:
    """the rule book: the submitter may amend; only weakening (rule 13) is refused."""
    run_id = running(lg, 2, **policy)
    st = lg.amend(run_id, SUBMITTER, "tighten", policy=change)
    for key, value in change.items():
        got = st.policy[key]
        if isinstance(value, dict) and isinstance(got, dict):
            got = {k: got[k] for k in value}
        assert got == value


def test_bug2_replaced_payload_needs_a_new_approval(lg: Ledger) -> None:
    m = manifest(1, review=QA_SURVIVES)
    m["items"] = [{"item_id": "pay-1", "payload": {"amount": 10}}]
    run_id = lg.submit(m, SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    st = lg.request_review(run_id, CONTROLLER, "qa")
    lg.decide(run_id, REVIEWER, st.input_version, True, "10 is fine")
    lg.amend(run_id, SUBMITTER, "typo", items=[{"item_id": "pay-1", "payload": {"amount": 10**6}}])
    work_all(lg, run_id)
    refused(lg, NotComplete, lambda: lg.complete(run_id, CONTROLLER))
    assert lg.status(run_id).state == S.RUNNING


def test_bug2_added_payload_needs_a_new_approval(lg: Ledger) -> None:
    run_id = approved(lg, 1, review=QA_SURVIVES)
    lg.amend(run_id, SUBMITTER, "one more", items=[{"item_id": "extra", "payload": {"n": 99}}])
    work_all(lg, run_id)
    refused(lg, NotComplete, lambda: lg.complete(run_id, CONTROLLER))


def test_approval_with_survives_amendment_survives_a_withdrawal(lg: Ledger) -> None:
    """The other side of rule 13: no payload replaced or added, the approval still holds."""
    run_id = approved(lg, 2, review=QA_SURVIVES)
    lg.amend(run_id, SUBMITTER, "not needed", withdraw=["i1"])
    work_all(lg, run_id)
    assert lg.complete(run_id, CONTROLLER).state == S.SUCCEEDED
    verify_clean(lg)


def test_amendment_without_survives_needs_a_new_approval(lg: Ledger) -> None:
    run_id = approved(lg, 2, review=QA)
    lg.amend(run_id, SUBMITTER, "not needed", withdraw=["i1"])
    work_all(lg, run_id)
    refused(lg, NotComplete, lambda: lg.complete(run_id, CONTROLLER))


def test_bug2_survives_set_after_approval_does_not_save_it(lg: Ledger) -> None:
    run_id = approved(lg, 2, review=QA)
    lg.amend(run_id, OPERATOR, "the customer asked", policy={"review": QA_SURVIVES})
    work_all(lg, run_id)
    refused(lg, NotComplete, lambda: lg.complete(run_id, CONTROLLER))


def test_bug2_run_never_succeeds_without_the_decision_its_policy_required(lg: Ledger) -> None:
    run_id = running(lg, 2, review=QA)
    with contextlib.suppress(NotAuthorized):
        lg.amend(run_id, SUBMITTER, "simplify", policy={"review": None})
    work_all(lg, run_id)
    refused(lg, NotComplete, lambda: lg.complete(run_id, CONTROLLER))


def test_bug2_submitter_may_not_decide_its_own_review(lg: Ledger) -> None:
    run_id = running(lg, 1, review=QA)
    st = lg.request_review(run_id, CONTROLLER, "qa")
    same_person = Actor(SUBMITTER.id, S.REVIEWER)
    for approve in (True, False):
        refused(
            lg,
            NotAuthorized,
            lambda: lg.decide(run_id, same_person, st.input_version, approve, "ok"),
        )
    assert lg.status(run_id).state == S.AWAITING_REVIEW


def test_bug2_amender_may_not_decide_the_review(lg: Ledger) -> None:
    run_id = running(lg, 1, review=QA)
    lg.request_review(run_id, CONTROLLER, "qa")
    st = lg.amend(run_id, OPERATOR, "one more", items=[{"item_id": "x", "payload": {"n": 1}}])
    assert st.state == S.AWAITING_REVIEW
    same_person = Actor(OPERATOR.id, S.REVIEWER)
    refused(lg, NotAuthorized, lambda: lg.decide(run_id, same_person, st.input_version, True, "ok"))


def test_another_reviewer_may_decide(lg: Ledger) -> None:
    run_id = running(lg, 1, review=QA)
    lg.request_review(run_id, CONTROLLER, "qa")
    st = lg.amend(run_id, OPERATOR, "one more", items=[{"item_id": "x", "payload": {"n": 1}}])
    assert lg.decide(run_id, REVIEWER, st.input_version, True, "ok").state == S.RUNNING


# ---------------------------------------------------------------------------
# bug 3: reconcile(now=...) trusts any time
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("ahead", [timedelta(seconds=1), timedelta(days=1), timedelta(days=365)])
def test_bug3_reconcile_refuses_a_future_now(
    lg: Ledger, clock: ManualClock, ahead: timedelta
) -> None:
    run_id = running(lg, 2, lease_seconds=60, run_deadline_seconds=120)
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    items = lg.items(run_id)
    err = refused(lg, InvalidInput, lambda: lg.reconcile(now=clock() + ahead, actor=RECONCILER))
    assert "now" in err.message
    assert lg.items(run_id) == items and lg.status(run_id).state == S.RUNNING
    # the live worker was not fenced by a time that has not come
    assert lg.heartbeat(lease).token == lease.token
    assert lg.accept(lease).state == S.ACCEPTED
    verify_clean(lg)


def test_reconcile_at_the_clocks_now_or_before_is_allowed(lg: Ledger, clock: ManualClock) -> None:
    """The record may lag reality: a `now` at or before the store's clock is fine."""
    run_id = running(lg, 1, lease_seconds=60)
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    clock.advance(61)
    assert lg.reconcile(now=clock() - timedelta(seconds=30), actor=RECONCILER).expired_leases == 0
    assert lg.reconcile(now=clock(), actor=RECONCILER).expired_leases == 1
    refused(lg, LeaseLost, lambda: lg.accept(lease))
    verify_clean(lg)


# ---------------------------------------------------------------------------
# bug 4: a second retry / repair / compensate while the first is open
# ---------------------------------------------------------------------------
def failed_transient(lg: Ledger) -> str:
    run_id = running(lg, 2)
    (le,) = lg.claim(run_id, WORKER, limit=1)
    lg.accept(le, evidence={"stored_as": "s3://out/i0"})
    lg.fail(run_id, CONTROLLER, "upstream gone", transient=True, failure_reason="input_unavailable")
    return run_id


LINKED = {
    "retry": lambda lg, run_id: lg.retry(run_id, OPERATOR),
    "repair": lambda lg, run_id: lg.repair(run_id, OPERATOR),
    "compensate": lambda lg, run_id: lg.compensate(run_id, OPERATOR, "undo the accepted one"),
}


@pytest.mark.parametrize("command", sorted(LINKED))
def test_bug4_one_open_linked_run_per_relation(lg: Ledger, command: str) -> None:
    run_id = failed_transient(lg)
    first = LINKED[command](lg, run_id)
    err = refused(lg, Conflict, lambda: LINKED[command](lg, run_id))
    assert first.run_id in err.message, err.message
    # once the first has ended, another may be started; the lineage shows both
    lg.cancel(first.run_id, OPERATOR, "wrong settings")
    second = LINKED[command](lg, run_id)
    lineage = {st.run_id for st in lg.lineage(run_id)}
    assert {run_id, first.run_id, second.run_id} <= lineage
    verify_clean(lg)


def test_linked_runs_of_other_relations_may_be_open_together(lg: Ledger) -> None:
    """Rule 15 limits one open linked run per relation, not per run."""
    run_id = failed_transient(lg)
    opened = [LINKED[c](lg, run_id).run_id for c in ("retry", "repair", "compensate")]
    assert len(set(opened)) == 3
    assert all(lg.status(r).state == S.QUEUED for r in opened)


# ---------------------------------------------------------------------------
# bug 5: accept needs no evidence
# ---------------------------------------------------------------------------
def test_bug5_accept_without_required_evidence_is_refused(lg: Ledger) -> None:
    run_id = running(lg, 1, acceptance={"evidence": ["stored_as", "checksum"]})
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    for evidence in (None, {}, {"stored_as": "s3://out/i0"}, {"note": "trust me"}):
        err = refused(lg, InvalidInput, lambda: lg.accept(lease, evidence=evidence))
        assert "checksum" in err.message, err.message
        if not evidence or "stored_as" not in evidence:
            assert "stored_as" in err.message, err.message
    assert lg.items(run_id)[0].state == S.IN_PROGRESS
    done = lg.accept(lease, evidence={"stored_as": "s3://out/i0", "checksum": "sha256:ab"})
    assert done.state == S.ACCEPTED
    t = [t for t in lg.history(run_id) if t.item_id == "i0"][-1]
    assert t.evidence["evidence"].get("stored_as") == "s3://out/i0"  # the worker's, as given
    verify_clean(lg)


def test_bug5_evidence_rule_added_by_amendment_applies(lg: Ledger) -> None:
    run_id = running(lg, 1)
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    lg.amend(run_id, SUBMITTER, "receipts please", policy={"acceptance": {"evidence": ["receipt"]}})
    err = refused(lg, InvalidInput, lambda: lg.accept(lease))
    assert "receipt" in err.message
    assert lg.accept(lease, evidence={"receipt": "r-1"}).state == S.ACCEPTED


def test_accept_without_an_evidence_rule_needs_none(lg: Ledger) -> None:
    """Default `acceptance.evidence` is empty (rule 16)."""
    run_id = running(lg, 1)
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    assert lg.accept(lease).state == S.ACCEPTED


# ---------------------------------------------------------------------------
# bug 6: a cancel with no live lease writes `canceled` before its items' skips
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("state", [S.QUEUED, S.RUNNING, S.PAUSED, S.AWAITING_REVIEW])
def test_bug6_items_are_skipped_before_the_run_is_canceled(lg: Ledger, state: str) -> None:
    d = run_in(lg, state if state != S.QUEUED else S.QUEUED, n=3)
    out = lg.cancel(d.run_id, OPERATOR, "stop")
    assert out.state == S.CANCELED
    history = lg.history(d.run_id)
    canceled_at = next(
        t.position for t in history if t.item_id is None and t.to_state == S.CANCELED
    )
    skips = [t for t in history if t.item_id is not None and t.to_state == S.SKIPPED]
    assert len(skips) == 3
    assert all(t.position < canceled_at for t in skips), (
        [t.position for t in skips],
        canceled_at,
    )
    # no item transition of the run comes after it ended
    assert max(t.position for t in history) == canceled_at
    verify_clean(lg)


# ---------------------------------------------------------------------------
# bug 7: repair cannot correct configuration; the cancel reason is lost; fail has no reason
# ---------------------------------------------------------------------------
def test_bug7_repair_with_corrected_configuration(lg: Ledger) -> None:
    run_id = failed_transient(lg)
    st = lg.repair(run_id, OPERATOR, config_version="cfg-2", policy={"max_attempts": 5})
    assert st.config_version == "cfg-2"
    assert st.policy["max_attempts"] == 5
    assert (st.links[0].relation, st.links[0].run_id) == ("correction_of", run_id)
    original = lg.status(run_id)
    assert (original.config_version, original.policy["max_attempts"]) == ("cfg-1", 3)
    verify_clean(lg)


def test_repair_without_corrections_is_repair_of(lg: Ledger) -> None:
    run_id = failed_transient(lg)
    st = lg.repair(run_id, OPERATOR)
    assert (st.links[0].relation, st.links[0].run_id) == ("repair_of", run_id)
    assert st.config_version == "cfg-1"


@pytest.mark.parametrize("ending", ["accept", "expiry"])
def test_bug7_cancel_reason_stays_the_stop_reason(
    lg: Ledger, clock: ManualClock, ending: str
) -> None:
    run_id = running(lg, 2, lease_seconds=30)
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    assert lg.cancel(run_id, OPERATOR, "operator stopped the run").state == S.CANCELING
    if ending == "accept":
        lg.accept(lease)
    else:
        clock.advance(31)
        assert lg.reconcile(actor=RECONCILER).finished_cancels == 1
    st = lg.status(run_id)
    assert st.state == S.CANCELED
    assert st.stop_reason == "operator stopped the run"


def test_cancel_reason_is_the_stop_reason_when_canceled_at_once(lg: Ledger) -> None:
    run_id = running(lg, 2)
    lg.cancel(run_id, SUBMITTER, "wrong month")
    assert lg.status(run_id).stop_reason == "wrong month"


def test_bug7_controller_fail_records_controller_decision(lg: Ledger) -> None:
    for transient in (True, False):
        run_id = running(lg, 1)
        st = lg.fail(run_id, CONTROLLER, "giving up", transient=transient)
        assert st.failure_reason == "controller_decision"
        assert lg.status(run_id).failure_reason == "controller_decision"


def test_operator_fail_records_operator_decision(lg: Ledger) -> None:
    run_id = running(lg, 1)
    assert lg.fail(run_id, OPERATOR, "hold it", transient=True).failure_reason == (
        "operator_decision"
    )


def test_failed_always_has_a_failure_reason(lg: Ledger, clock: ManualClock) -> None:
    """Rule 16 over the ways a run can fail that already record one."""
    a = running(lg, 1, run_deadline_seconds=10)
    clock.advance(11)
    lg.reconcile(actor=RECONCILER)
    b = running(lg, 1, review=QA)
    st = lg.request_review(b, CONTROLLER, "qa")
    lg.decide(b, REVIEWER, st.input_version, False, "no")
    c = running(lg, 1)
    lg.fail(c, OPERATOR, "hold", transient=True)
    for run_id, reason in (
        (a, "deadline_exceeded"),
        (b, "review_rejected"),
        (c, "operator_decision"),
    ):
        st = lg.status(run_id)
        assert (st.state, st.failure_reason) == (S.FAILED, reason)
    assert event_count(lg) > 0
    verify_clean(lg)


def test_claim_on_a_run_that_is_not_running_names_its_state(lg: Ledger) -> None:
    d = run_in(lg, S.PAUSED)
    err = refused(lg, IllegalTransition, lambda: lg.claim(d.run_id, WORKER, limit=1))
    assert isinstance(err, IllegalTransition) and err.state == S.PAUSED
