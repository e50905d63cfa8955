"""rule 12 of the rule book: the ledger cannot commit what `verify` would reject.

Every commit's events pass the rules `verify` applies to the history before they are
appended (the rule checker, ledger/core/rule_check.py, called by the unit of work).
These tests take away a command's own checks (the
handler's and the aggregate's guard, patched to do nothing) or write the events a
careless handler would, and see the commit refused with `InvariantViolated`, nothing
written, and `verify` clean: on memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from ledger import InvariantViolated, Ledger, LedgerError
from ledger.commands import leases
from ledger.commands.uow import UnitOfWork
from ledger.core import domain
from ledger.core import states as S
from ledger.core.domain import Item, Run
from tests.support.clock import ManualClock
from tests.support.drive import event_count
from tests.support.findings import verify_clean
from tests.support.runs import CONTROLLER, OPERATOR, WORKER, running


def refused(lg: Ledger, kind: str, fn: Callable[[], Any]) -> InvariantViolated:
    before = event_count(lg)
    with pytest.raises(InvariantViolated) as info:
        fn()
    assert event_count(lg) == before, "a refused commit wrote events"
    assert info.value.kind == kind, info.value
    assert isinstance(info.value, LedgerError)
    verify_clean(lg)
    return info.value


def _no_check(*args: Any, **kwargs: Any) -> None:
    return None


def test_a_claim_that_skipped_its_run_state_check_is_refused_at_commit(
    lg: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler's check and the aggregate's guard both patched away: claims on a
    failed run still never reach the store."""
    run_id = running(lg, 2)
    lg.fail(run_id, CONTROLLER, "upstream gone", transient=True)
    monkeypatch.setattr(leases, "require_item_run_state", _no_check)
    monkeypatch.setattr(domain, "check_item_run_state", _no_check)
    err = refused(lg, "item_after_end", lambda: lg.claim(run_id, WORKER, limit=2))
    assert run_id in err.message and "failed" in err.message
    assert lg.items(run_id)[0].state == S.PENDING


def test_a_run_transition_out_of_a_terminal_state_is_refused(
    lg: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = running(lg, 1)
    lg.fail(run_id, OPERATOR, "hold", transient=True)
    monkeypatch.setattr(domain, "check_run_state", _no_check)
    monkeypatch.setattr("ledger.commands.runs.require_run_state", _no_check)
    refused(lg, "terminal_changed", lambda: lg.start(run_id, CONTROLLER))
    assert lg.status(run_id).state == S.FAILED


def forged(lg: Ledger, run_id: str, build: Callable[[UnitOfWork, Any, Run], list[Item]]) -> None:
    """A handler that forgot every check: `build` triggers events on the loaded run (and
    returns the items it changed), which the unit of work then commits."""
    uow = UnitOfWork(lg.store, lg._projector)
    with uow.write() as tx:
        run = uow.load_run(tx, run_id)
        items = build(uow, tx, run)
        uow.commit(tx, {run_id: run}, items)


def _move(
    agg: Any, command: str, to_state: str, role: str, evidence: dict[str, Any], at: Any
) -> None:
    extra = {"run_id": agg.run_id, "item_id": agg.item_id} if isinstance(agg, Item) else {}
    agg.trigger_event(
        agg.Transitioned,
        command=command,
        from_state=agg.state,
        to_state=to_state,
        actor_id="careless",
        role=role,
        reason="forged",
        evidence=evidence,
        timestamp=at,
        **extra,
    )


def _item(uow: UnitOfWork, tx: Any, run: Run, state: str) -> Item:
    row = tx.fetchone(
        "SELECT * FROM lg_items WHERE run_id = ? AND state = ? ORDER BY seq", (run.run_id, state)
    )
    assert row is not None
    return uow.materialize(row, tx.now())


def test_two_live_leases_are_refused(lg: Ledger) -> None:
    run_id = running(lg, 1)
    lg.claim(run_id, WORKER, limit=1)

    def second_claim(uow: UnitOfWork, tx: Any, run: Run) -> list[Item]:
        item = _item(uow, tx, run, S.IN_PROGRESS)
        ev = {"lease_token": "t2", "attempt": 2, "expires_at": tx.now().isoformat()}
        _move(item, "claim", S.IN_PROGRESS, S.WORKER, ev, tx.now())
        return [item]

    refused(lg, "two_leases", lambda: forged(lg, run_id, second_claim))


def test_a_reconciler_success_is_refused(lg: Ledger) -> None:
    run_id = running(lg, 1)
    (lease,) = lg.claim(run_id, WORKER, limit=1)

    def reconciler_accepts(uow: UnitOfWork, tx: Any, run: Run) -> list[Item]:
        item = _item(uow, tx, run, S.IN_PROGRESS)
        ev = {"lease_token": lease.token, "attempt": 1, "outcome": "accepted"}
        _move(item, "accept", S.ACCEPTED, S.RECONCILER, ev, tx.now())
        return [item]

    refused(lg, "reconciler_success", lambda: forged(lg, run_id, reconciler_accepts))


@pytest.mark.parametrize("work", ["open", "skipped"])
def test_an_unearned_success_is_refused(lg: Ledger, work: str) -> None:
    """Work still open, or a required item not accepted (skipped): no success."""
    run_id = running(lg, 2)
    if work == "skipped":
        for item in lg.items(run_id):
            lg.skip(run_id, item.item_id, OPERATOR, "not needed")

    def succeed(uow: UnitOfWork, tx: Any, run: Run) -> list[Item]:
        ev = {"counts": dict(run.counts), "not_accepted": []}
        _move(run, "complete", S.SUCCEEDED, S.CONTROLLER, ev, tx.now())
        return []

    refused(lg, "success_unearned", lambda: forged(lg, run_id, succeed))
    assert lg.status(run_id).state == S.RUNNING


def test_time_going_backwards_is_refused(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 1)
    clock.advance(60)
    lg.pause(run_id, OPERATOR, "hold")

    def backdated(uow: UnitOfWork, tx: Any, run: Run) -> list[Item]:
        _move(run, "resume", S.RUNNING, S.OPERATOR, {}, tx.now() - timedelta(hours=1))
        return []

    refused(lg, "time_backwards", lambda: forged(lg, run_id, backdated))


def test_the_commands_themselves_pass_the_check(lg: Ledger, clock: ManualClock) -> None:
    """The check refuses nothing the commands write: a run through every ending."""
    run_id = running(lg, 3, lease_seconds=30)
    a, b = lg.claim(run_id, WORKER, limit=2)
    lg.accept(a, evidence={"stored_as": "s3://a"})
    lg.fail_attempt(b, "flaky")
    clock.advance(31)
    lg.reconcile()
    while leases_ := lg.claim(run_id, WORKER, limit=5):
        for le in leases_:
            lg.accept(le)
    assert lg.complete(run_id, CONTROLLER).state == S.SUCCEEDED
    other = running(lg, 2)
    lg.claim(other, WORKER, limit=1)
    lg.cancel(other, OPERATOR, "stop")
    verify_clean(lg)


def test_every_command_is_in_the_registry_once() -> None:
    """The registry and the facade agree: each public command of Ledger has one entry whose
    arguments are the method's, and whose rule's roles are the ones the command checks."""
    import inspect

    from ledger.commands.registry import COMMANDS

    for name, spec in COMMANDS.items():
        method = getattr(Ledger, name)
        params = [p for p in inspect.signature(method).parameters if p != "self"]
        assert params[:-1] == list(spec.arguments), name
        assert params[-1] == "idempotency_key", name
        assert spec.summary.startswith(f"{name}: ") and spec.roles, name
    assert COMMANDS["decide"].roles == S.run_rule("decide").roles
    assert {n for n, s in COMMANDS.items() if s.creates_run} == {
        "submit",
        "retry",
        "repair",
        "compensate",
    }
