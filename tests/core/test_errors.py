"""Every error type of API.md raised at least once, and the rule book's order of checks.

A call that is wrong in several ways raises the earliest failing check: argument
validation, then existence, role, revision, state, and preconditions; nothing is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

import ledger
from ledger import (
    Actor,
    AlreadyTerminal,
    Conflict,
    IllegalTransition,
    InvalidInput,
    ItemNotFound,
    LeaseLost,
    Ledger,
    LedgerError,
    ManifestInvalid,
    NotAuthorized,
    NotComplete,
    RunNotFound,
    StaleReview,
)
from ledger.core import states as S
from tests.support.drive import DECISION, event_count, item_zoo, run_in, submit
from tests.support.runs import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER, manifest

BAD_ROLE = Actor("x", "janitor")
GHOST = str(uuid.uuid4())


def raises(lg: Ledger, exc: type[LedgerError], fn: Callable[[], Any]) -> LedgerError:
    """Exactly `exc` (not a subclass, not a superclass) and nothing written."""
    before = event_count(lg)
    with pytest.raises(LedgerError) as info:
        fn()
    assert type(info.value) is exc, (
        f"expected {exc.__name__}, got {type(info.value).__name__}: {info.value}"
    )
    assert event_count(lg) == before
    return info.value


# ---------------------------------------------------------------------------
# every error type, once, with its documented attributes
# ---------------------------------------------------------------------------
def test_every_error_type_is_raised(lg: Ledger, tmp_path: Any) -> None:
    seen: set[type[LedgerError]] = set()

    def check(exc: type[LedgerError], fn: Callable[[], Any]) -> LedgerError:
        e = raises(lg, exc, fn)
        seen.add(exc)
        assert e.message and str(e) == e.message
        d = e.to_dict()
        assert d["error"] == exc.__name__ and d["message"] == e.message
        return e

    check(InvalidInput, lambda: lg.claim(GHOST, WORKER, limit=-1))
    e = check(ManifestInvalid, lambda: lg.submit({"items": []}, SUBMITTER))
    assert isinstance(e, ManifestInvalid) and e.field
    e = check(RunNotFound, lambda: lg.status(GHOST))
    assert GHOST in e.message
    check(RunNotFound, lambda: lg.start("not-a-uuid", CONTROLLER))
    rid = submit(lg, 2, review={"decision": DECISION})
    e = check(ItemNotFound, lambda: lg.skip(rid, "nope", OPERATOR, "why"))
    assert "nope" in e.message and rid in e.message
    check(NotAuthorized, lambda: lg.start(rid, WORKER))
    e = check(Conflict, lambda: lg.start(rid, CONTROLLER, expected_revision=99))
    assert isinstance(e, Conflict) and e.current_state == S.QUEUED
    assert e.to_dict()["current_state"] == S.QUEUED
    e = check(IllegalTransition, lambda: lg.resume(rid, OPERATOR))
    assert isinstance(e, IllegalTransition) and e.state == S.QUEUED
    assert e.allowed == sorted(S.run_rule("resume").sources)
    assert e.to_dict()["allowed"] == e.allowed
    lg.start(rid, CONTROLLER)
    check(NotComplete, lambda: lg.complete(rid, CONTROLLER))
    (le,) = lg.claim(rid, WORKER, limit=1)
    check(LeaseLost, lambda: lg.accept(replace(le, token="0" * 32)))
    lg.request_review(rid, CONTROLLER, DECISION)
    e = check(StaleReview, lambda: lg.decide(rid, REVIEWER, "sha256:old", True, "ok"))
    assert isinstance(e, StaleReview)
    assert e.expected_version == lg.status(rid).input_version
    assert e.to_dict()["expected_version"] == e.expected_version
    lg.decide(rid, REVIEWER, lg.status(rid).input_version, False, "wrong totals")
    e = check(AlreadyTerminal, lambda: lg.start(rid, CONTROLLER))
    assert isinstance(e, AlreadyTerminal) and e.state == S.FAILED

    def forged_restart() -> None:
        """A command that forgot every check (see test_invariants): the commit refuses it."""
        from ledger.commands.uow import UnitOfWork

        uow = UnitOfWork(lg.store, lg._projector)
        with uow.write() as tx:
            run = uow.load_run(tx, rid)
            run.trigger_event(
                run.Transitioned,
                command="start",
                from_state=run.state,
                to_state=S.RUNNING,
                actor_id="careless",
                role=S.CONTROLLER,
                reason=None,
                evidence={},
                timestamp=tx.now(),
            )
            uow.commit(tx, {rid: run})

    e = check(ledger.InvariantViolated, forged_restart)
    assert e.to_dict()["kind"] == "terminal_changed"
    # the change feed's (ledger/feed/follower.py, ledger/feed/webhooks.py)
    from ledger.feed.follower import Follower, reset
    from ledger.feed.webhooks import remove_webhook

    check(ledger.FollowerNotFound, lambda: reset(lg, "nobody"))
    with Follower(lg, "busy", lambda ts: None) as running:
        running.run_once()
        check(ledger.FollowerBusy, lambda: Follower(lg, "busy", lambda ts: None).run_once())
    check(ledger.WebhookNotFound, lambda: remove_webhook(lg, OPERATOR, "wh_none", reason="gone"))
    # an archived run's items left with its events (ledger/transfer/archive.py)
    lg.archive(OPERATOR, tmp_path / "archive.jsonl", runs=[rid])
    e = check(ledger.RunArchived, lambda: lg.compensate(rid, OPERATOR, "undo", items=["i0"]))
    assert isinstance(e, ledger.RunArchived) and e.to_dict()["archive"].endswith("archive.jsonl")
    # LedgerError is the base of all of them, never raised bare here
    names = {
        n
        for n in ledger.__all__
        if isinstance(getattr(ledger, n), type)
        and issubclass(getattr(ledger, n), LedgerError)
        and n != "LedgerError"
    }
    assert {c.__name__ for c in seen} == names


# ---------------------------------------------------------------------------
# order of checks: the earliest failing check wins
# ---------------------------------------------------------------------------
def test_validation_before_existence(lg: Ledger) -> None:
    raises(lg, InvalidInput, lambda: lg.start(GHOST, BAD_ROLE))
    raises(lg, InvalidInput, lambda: lg.start(GHOST, CONTROLLER, expected_revision=-1))
    raises(lg, InvalidInput, lambda: lg.pause(GHOST, OPERATOR, "x" * 10_000))
    raises(lg, InvalidInput, lambda: lg.claim(GHOST, WORKER, limit=0))
    raises(lg, InvalidInput, lambda: lg.skip(GHOST, "", OPERATOR, "why"))
    raises(
        lg,
        InvalidInput,
        lambda: lg.fail(GHOST, CONTROLLER, "x", transient=True, failure_reason="bad"),
    )
    raises(lg, InvalidInput, lambda: lg.decide(GHOST, REVIEWER, "v", 1, "r"))  # type: ignore[arg-type]
    raises(lg, ManifestInvalid, lambda: lg.amend(GHOST, SUBMITTER, "r", items=[{"id": 1}]))
    raises(lg, ManifestInvalid, lambda: lg.submit({"items": []}, BAD_ROLE))


def test_existence_before_role(lg: Ledger) -> None:
    raises(lg, RunNotFound, lambda: lg.start(GHOST, WORKER))
    raises(lg, RunNotFound, lambda: lg.claim(GHOST, SUBMITTER))
    raises(lg, RunNotFound, lambda: lg.fail(GHOST, OPERATOR, "x", transient=False))
    raises(lg, RunNotFound, lambda: lg.retry(GHOST, WORKER))
    raises(lg, RunNotFound, lambda: lg.compensate(GHOST, WORKER, "undo"))
    rid = submit(lg, 2)
    lg.start(rid, CONTROLLER)
    raises(lg, ItemNotFound, lambda: lg.skip(rid, "ghost", WORKER, "why"))
    raises(lg, ItemNotFound, lambda: lg.release(rid, "ghost", SUBMITTER, "why"))
    raises(lg, ItemNotFound, lambda: lg.reject_item(rid, "ghost", WORKER, "bad-row"))


def test_item_existence_before_role_in_amend_and_repair(lg: Ledger) -> None:
    """Item ids named by amend(withdraw) and repair(items) are checked for existence before
    the role (the rule book: existence, then role)."""
    rid = submit(lg, 2)
    raises(lg, ItemNotFound, lambda: lg.amend(rid, WORKER, "drop", withdraw=["ghost"]))
    done = run_in(lg, S.COMPLETED_WITH_ERRORS).run_id
    raises(lg, ItemNotFound, lambda: lg.repair(done, WORKER, items=["ghost"]))


def test_role_before_revision(lg: Ledger) -> None:
    rid = submit(lg, 2)
    raises(lg, NotAuthorized, lambda: lg.start(rid, WORKER, expected_revision=99))
    raises(lg, NotAuthorized, lambda: lg.claim(rid, SUBMITTER, expected_revision=99))
    raises(
        lg,
        NotAuthorized,
        lambda: lg.amend(rid, WORKER, "r", items=[{"item_id": "n"}], expected_revision=99),
    )
    raises(lg, NotAuthorized, lambda: lg.cancel(rid, WORKER, "stop", expected_revision=99))
    raises(
        lg,
        NotAuthorized,
        lambda: lg.fail(rid, OPERATOR, "x", transient=False, expected_revision=99),
    )
    raises(lg, NotAuthorized, lambda: lg.skip(rid, "i0", WORKER, "why", expected_revision=99))


def test_revision_before_state(lg: Ledger) -> None:
    d = run_in(lg, S.RUNNING)
    rid = d.run_id
    stale = lg.status(rid).revision + 5
    raises(lg, Conflict, lambda: lg.start(rid, CONTROLLER, expected_revision=stale))
    raises(lg, Conflict, lambda: lg.resume(rid, OPERATOR, expected_revision=stale))
    raises(lg, Conflict, lambda: lg.decide(rid, REVIEWER, "v", True, "r", expected_revision=stale))
    raises(lg, Conflict, lambda: lg.complete(rid, CONTROLLER, expected_revision=stale))
    done = run_in(lg, S.SUCCEEDED).run_id
    stale_done = lg.status(done).revision - 1
    raises(lg, Conflict, lambda: lg.cancel(done, OPERATOR, "x", expected_revision=stale_done))
    raises(lg, Conflict, lambda: lg.pause(done, OPERATOR, "x", expected_revision=stale_done))
    zoo = item_zoo(lg)
    item = {i.item_id: i for i in lg.items(zoo.run_id)}[S.ACCEPTED]
    raises(
        lg,
        Conflict,
        lambda: lg.skip(
            zoo.run_id, S.ACCEPTED, OPERATOR, "why", expected_revision=item.revision + 1
        ),
    )


def test_state_before_preconditions(lg: Ledger) -> None:
    # decide on a run that is not awaiting review, naming a wrong version: the state wins
    rid = run_in(lg, S.RUNNING).run_id
    raises(lg, IllegalTransition, lambda: lg.decide(rid, REVIEWER, "sha256:wrong", True, "r"))
    done = run_in(lg, S.FAILED).run_id
    raises(lg, AlreadyTerminal, lambda: lg.decide(done, REVIEWER, "sha256:wrong", True, "r"))
    # complete on a run with open work is NotComplete (a state check), whatever else is wrong
    rid2 = submit(lg, 2, review={"decision": DECISION})
    lg.start(rid2, CONTROLLER)
    raises(lg, NotComplete, lambda: lg.complete(rid2, CONTROLLER))


def test_one_call_wrong_in_every_way(lg: Ledger) -> None:
    """Peel the errors off one at a time: each fix reveals the next check in the rule book's order."""
    rid = run_in(lg, S.RUNNING).run_id
    rev = lg.status(rid).revision
    wrong_version = "sha256:" + "0" * 32

    def decide(actor: Actor, run_id: str, revision: int, approve: Any = True) -> Any:
        return lg.decide(run_id, actor, wrong_version, approve, "r", expected_revision=revision)

    raises(lg, InvalidInput, lambda: decide(BAD_ROLE, GHOST, rev + 1, approve="yes"))
    raises(lg, InvalidInput, lambda: decide(BAD_ROLE, GHOST, rev + 1))
    raises(lg, RunNotFound, lambda: decide(WORKER, GHOST, rev + 1))
    raises(lg, NotAuthorized, lambda: decide(WORKER, rid, rev + 1))
    raises(lg, Conflict, lambda: decide(REVIEWER, rid, rev + 1))
    raises(lg, IllegalTransition, lambda: decide(REVIEWER, rid, rev))
    lg.request_review(rid, CONTROLLER, DECISION)
    rev = lg.status(rid).revision
    raises(lg, StaleReview, lambda: decide(REVIEWER, rid, rev))
    assert (
        lg.decide(
            rid, REVIEWER, lg.status(rid).input_version, True, "r", expected_revision=rev
        ).state
        == S.RUNNING
    )


def test_lease_call_wrong_in_every_way(lg: Ledger) -> None:
    rid = submit(lg, 1)
    lg.start(rid, CONTROLLER)
    (le,) = lg.claim(rid, WORKER)
    forged = replace(le, token="0" * 32)
    raises(lg, InvalidInput, lambda: lg.accept(replace(forged, run_id=""), evidence={"a": 1}))
    raises(lg, InvalidInput, lambda: lg.accept(forged, evidence="not json"))  # type: ignore[arg-type]
    raises(lg, RunNotFound, lambda: lg.accept(replace(forged, run_id=GHOST)))
    raises(lg, ItemNotFound, lambda: lg.accept(replace(forged, item_id="ghost")))
    raises(lg, LeaseLost, lambda: lg.accept(forged))
    assert lg.accept(le).state == S.ACCEPTED


def test_refusals_leave_the_run_unchanged(lg: Ledger) -> None:
    """After a burst of refused calls the run's status, items and history are as before."""
    zoo = item_zoo(lg)
    before = (
        lg.status(zoo.run_id),
        lg.items(zoo.run_id),
        lg.history(zoo.run_id),
        lg.attempts(zoo.run_id),
    )
    calls: list[Callable[[], Any]] = [
        lambda: lg.start(zoo.run_id, CONTROLLER),
        lambda: lg.complete(zoo.run_id, CONTROLLER),
        lambda: lg.skip(zoo.run_id, S.ACCEPTED, OPERATOR, "x"),
        lambda: lg.release(zoo.run_id, S.PENDING, OPERATOR, "x"),
        lambda: lg.reject_item(zoo.run_id, S.RETRYABLE, REVIEWER, "bad-row"),
        lambda: lg.amend(zoo.run_id, SUBMITTER, "x", withdraw=[S.IN_PROGRESS]),
        lambda: lg.amend(zoo.run_id, SUBMITTER, "x", items=[{"item_id": S.ACCEPTED}]),
        lambda: lg.accept(zoo.leases[S.ACCEPTED]),
        lambda: lg.heartbeat(zoo.leases[S.REJECTED]),
        lambda: lg.decide(zoo.run_id, REVIEWER, "v", True, "r"),
        lambda: lg.fail(zoo.run_id, OPERATOR, "x", transient=False),
        lambda: lg.submit(manifest(0), SUBMITTER),
    ]
    for fn in calls:
        with pytest.raises(LedgerError):
            fn()
    after = (
        lg.status(zoo.run_id),
        lg.items(zoo.run_id),
        lg.history(zoo.run_id),
        lg.attempts(zoo.run_id),
    )
    assert after == before


def test_item_existence_before_role_in_compensate(lg: Ledger) -> None:
    done = run_in(lg, S.SUCCEEDED).run_id
    raises(lg, ItemNotFound, lambda: lg.compensate(done, WORKER, "undo", items=["ghost"]))
    raises(lg, NotAuthorized, lambda: lg.compensate(done, WORKER, "undo", items=["i0"]))
