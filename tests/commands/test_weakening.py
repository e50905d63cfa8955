"""Weakening acceptance is one notion, whichever command does it (rule 13 of the rule
book): a repair may not shed what an amendment may not, a required item does not become
optional, and a deadline that has passed is not removed or extended, unless an operator
does it with a reason, recorded as its own `weaken_acceptance` transition."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import InvalidInput, Ledger, NotAuthorized
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest

GATE = {"review": {"decision": "finance-signoff"}}


def _failed_gated_run(lg: Ledger, **policy: Any) -> str:
    run_id = lg.submit(manifest(2, **{**GATE, **policy}), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    lg.fail(run_id, CONTROLLER, "upstream down", transient=True)
    return run_id


def _weakenings(lg: Ledger, run_id: str) -> list[Any]:
    return [t for t in lg.history(run_id) if t.command == "weaken_acceptance"]


@pytest.mark.parametrize(
    "policy",
    [
        {"review": None},
        {"review": {"decision": "finance-signoff", "survives_amendment": True}},
        {"partial_delivery": True, "tolerated_failures": "100%"},
        {"review": {"decision": "rubber-stamp"}},
    ],
    ids=["drops-review", "survives-amendment", "partial-delivery", "other-decision"],
)
def test_the_submitter_cannot_repair_away_what_it_cannot_amend_away(
    lg: Ledger, policy: dict[str, Any]
) -> None:
    run_id = _failed_gated_run(lg)
    runs_before = len(lg.runs())
    with pytest.raises(NotAuthorized, match="weaken"):
        lg.repair(run_id, SUBMITTER, policy=policy)
    assert len(lg.runs()) == runs_before  # nothing written


def test_an_operators_weakening_repair_needs_a_reason_and_is_recorded(lg: Ledger) -> None:
    run_id = _failed_gated_run(lg)
    with pytest.raises(InvalidInput, match="reason"):
        lg.repair(run_id, OPERATOR, policy={"review": None})
    new = lg.repair(run_id, OPERATOR, policy={"review": None}, reason="gate retired by CFO")
    [weakening] = _weakenings(lg, new.run_id)
    assert weakening.actor_id == OPERATOR.id and weakening.reason == "gate retired by CFO"
    assert weakening.evidence["relative_to"] == run_id
    assert any("review" in w for w in weakening.evidence["weakened"])
    audit = lg.audit(run_id=new.run_id, role="operator")
    assert any(t.command == "weaken_acceptance" for t in audit)


def test_a_repair_under_the_same_policy_weakens_nothing(lg: Ledger) -> None:
    run_id = _failed_gated_run(lg)
    new = lg.repair(run_id, SUBMITTER)
    assert _weakenings(lg, new.run_id) == []
    assert lg.status(new.run_id).state == "queued"


def test_a_required_item_does_not_become_optional_by_amendment(lg: Ledger) -> None:
    run_id = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    optional = [{"item_id": "i0", "payload": {"n": 0}, "required": False}]
    with pytest.raises(NotAuthorized, match="optional"):
        lg.amend(run_id, SUBMITTER, "late change", items=optional)
    assert lg.item(run_id, "i0").required
    lg.amend(run_id, OPERATOR, "i0 is informational", items=optional)
    assert not lg.item(run_id, "i0").required
    [weakening] = _weakenings(lg, run_id)
    assert any("i0" in w for w in weakening.evidence["weakened"])


def test_a_passed_run_deadline_is_not_amended_away(store_dsn: str, clock: ManualClock) -> None:
    with Ledger.open(store_dsn, clock=clock) as lg:
        run_id = lg.submit(manifest(1, run_deadline_seconds=30), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        lg.amend(run_id, SUBMITTER, "more time", policy={"run_deadline_seconds": 60})  # before
        clock.advance(90)
        for policy in ({"run_deadline_seconds": None}, {"run_deadline_seconds": 600}):
            with pytest.raises(NotAuthorized, match="run deadline, which passed"):
                lg.amend(run_id, SUBMITTER, "more time", policy=policy)
        lg.reconcile()
        assert lg.status(run_id).state == "failed"


def test_a_passed_item_deadline_is_not_raised_to_make_items_claimable(
    store_dsn: str, clock: ManualClock
) -> None:
    with Ledger.open(store_dsn, clock=clock) as lg:
        run_id = lg.submit(manifest(2, item_deadline_seconds=30), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        clock.advance(45)
        with pytest.raises(NotAuthorized, match="item deadline, which passed"):
            lg.amend(run_id, SUBMITTER, "more", policy={"item_deadline_seconds": 3600})
        lg.amend(
            run_id, OPERATOR, "agreed with the customer", policy={"item_deadline_seconds": 3600}
        )
        assert len(lg.claim(run_id, WORKER, limit=2)) == 2
