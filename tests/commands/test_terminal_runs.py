"""rule 12 of the rule book: no item of a terminal run changes, whichever command is asked.

For every terminal run state, reached by every way a run can end there (complete,
partial completion, fail by the controller, review rejection, the run deadline, cancel
at once and cancel finished by the last lease or by the reconciler), the run holds an
item in every state an item command starts from (pending, retryable, quarantined, and
the leases its workers held when it ended). Then every item command is asked of it:
claim, heartbeat, accept, reject, fail_attempt, skip, release, reject_item, amend
(add, withdraw) and a reconcile long after. Each must be refused (nothing written) or,
for the reconcile, change nothing; `verify` stays clean.

Then the ways around each rule: a role that may never make the command is refused
before the state is looked at (the rule book's order of checks), and a time that lies
(reconcile with a `now` ahead of the clock, an injected clock that steps back) cannot
move the record ahead of reality or its times backwards.
"""

# Lambdas in loops below are called at once, so late binding is harmless.
# ruff: noqa: B023

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from ledger import (
    AlreadyTerminal,
    IllegalTransition,
    InvalidInput,
    Lease,
    LeaseLost,
    Ledger,
    NotAuthorized,
)
from ledger.core import states as S
from tests.support.clock import ManualClock
from tests.support.drive import actor
from tests.support.findings import refused, verify_clean
from tests.support.runs import CONTROLLER, OPERATOR, RECONCILER, REVIEWER, SUBMITTER, WORKER


@dataclass
class Ended:
    """A terminal run, its items by the state they were left in, and its workers' leases."""

    run_id: str
    state: str
    items: dict[str, str]  # item_id -> state it is in now
    leases: list[Lease] = field(default_factory=list)


def _submit(
    lg: Ledger, ids: list[str], required: dict[str, bool] | None = None, **policy: Any
) -> str:
    m = {
        "source_version": "exports/2026-11-28",
        "config_version": "cfg-1",
        "scope": "terminal runs",
        "items": [
            {"item_id": i, "required": (required or {}).get(i, True), "payload": {"id": i}}
            for i in ids
        ],
        "policy": policy,
    }
    run_id = lg.submit(m, SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    return run_id


def _claim(lg: Ledger, run_id: str, item_id: str) -> Lease:
    """Claim items in manifest order until `item_id` is leased; returns its lease."""
    (le,) = lg.claim(run_id, WORKER, limit=1)
    assert le.item_id == item_id, (le.item_id, item_id)
    return le


def _open_items(lg: Ledger, run_id: str, kinds: tuple[str, ...]) -> list[Lease]:
    """Leave items named `quarantined`, `retryable`, `live` (leased) in those states; items
    named `pending` are listed last in the manifest so they stay unclaimed."""
    leases = [_claim(lg, run_id, kind) for kind in kinds]  # all claimed before any fails
    for kind, le in zip(kinds, leases, strict=True):
        if kind == S.QUARANTINED:
            lg.fail_attempt(le, "corrupt row", retryable=False)
        elif kind == S.RETRYABLE:
            lg.fail_attempt(le, "timeout talking to upstream")
    return leases


def end_by(lg: Ledger, clock: ManualClock, how: str) -> Ended:
    """A run that ended `how`."""
    if how == "succeeded":
        run_id = _submit(lg, ["acc", S.QUARANTINED], required={S.QUARANTINED: False})
        done = _claim(lg, run_id, "acc")
        lg.accept(done)
        leases = _open_items(lg, run_id, (S.QUARANTINED,))
        assert lg.complete(run_id, CONTROLLER).state == S.SUCCEEDED
        return Ended(
            run_id, S.SUCCEEDED, {"acc": S.ACCEPTED, S.QUARANTINED: S.QUARANTINED}, [done, *leases]
        )
    if how == "completed_with_errors":
        run_id = _submit(lg, ["acc", S.QUARANTINED], partial_delivery=True, tolerated_failures=1)
        done = _claim(lg, run_id, "acc")
        lg.accept(done)
        leases = _open_items(lg, run_id, (S.QUARANTINED,))
        assert lg.complete(run_id, CONTROLLER).state == S.COMPLETED_WITH_ERRORS
        items = {"acc": S.ACCEPTED, S.QUARANTINED: S.QUARANTINED}
        return Ended(run_id, S.COMPLETED_WITH_ERRORS, items, [done, *leases])
    ids = [S.QUARANTINED, S.RETRYABLE, "live", S.PENDING]
    if how == "failed_by_fail":
        run_id = _submit(lg, ids)
        leases = _open_items(lg, run_id, (S.QUARANTINED, S.RETRYABLE, "live"))
        lg.fail(
            run_id, CONTROLLER, "upstream gone", transient=True, failure_reason="input_unavailable"
        )
    elif how == "failed_by_review_rejection":
        run_id = _submit(lg, ids, review={"decision": "qa", "survives_amendment": False})
        leases = _open_items(lg, run_id, (S.QUARANTINED, S.RETRYABLE, "live"))
        st = lg.request_review(run_id, CONTROLLER, "qa")
        lg.decide(run_id, REVIEWER, st.input_version, False, "numbers do not add up")
    elif how == "failed_by_deadline":
        run_id = _submit(lg, ids, run_deadline_seconds=100, lease_seconds=30, max_attempts=5)
        leases = _open_items(lg, run_id, (S.QUARANTINED, S.RETRYABLE, "live"))
        clock.advance(101)
        assert lg.reconcile(actor=RECONCILER).failed_runs == 1
    elif how == "canceled_at_once":
        run_id = _submit(lg, ids)
        leases = _open_items(lg, run_id, (S.QUARANTINED, S.RETRYABLE, "live"))
        lg.accept(leases[-1])
        assert lg.cancel(run_id, OPERATOR, "stop").state == S.CANCELED
    elif how == "canceled_by_last_lease":
        run_id = _submit(lg, ids)
        leases = _open_items(lg, run_id, (S.QUARANTINED, S.RETRYABLE, "live"))
        assert lg.cancel(run_id, OPERATOR, "stop").state == S.CANCELING
        lg.accept(leases[-1])
    elif how == "canceled_by_reconciler":
        run_id = _submit(lg, ids, lease_seconds=30)
        leases = _open_items(lg, run_id, (S.QUARANTINED, S.RETRYABLE, "live"))
        assert lg.cancel(run_id, OPERATOR, "stop").state == S.CANCELING
        clock.advance(31)
        assert lg.reconcile(actor=RECONCILER).finished_cancels == 1
    else:  # pragma: no cover
        raise AssertionError(how)
    st = lg.status(run_id)
    assert S.is_terminal(st.state), (how, st.state)
    items = {i.item_id: i.state for i in lg.items(run_id)}
    return Ended(run_id, st.state, items, leases)


HOWS = [
    "succeeded",
    "completed_with_errors",
    "failed_by_fail",
    "failed_by_review_rejection",
    "failed_by_deadline",
    "canceled_at_once",
    "canceled_by_last_lease",
    "canceled_by_reconciler",
]
# the ways that reach every terminal state
assert {h.split("_by_")[0].split("_at_")[0] for h in HOWS} == {
    S.SUCCEEDED,
    S.COMPLETED_WITH_ERRORS,
    S.FAILED,
    S.CANCELED,
}


def lease_writes(lg: Ledger) -> dict[str, Callable[[Lease], Any]]:
    return {
        "heartbeat": lambda le: lg.heartbeat(le),
        "accept": lambda le: lg.accept(le, evidence={"stored_as": "s3://late"}),
        "reject": lambda le: lg.reject(le, "rule-1", detail="late"),
        "fail_attempt": lambda le: lg.fail_attempt(le, "late failure"),
        "fail_attempt_final": lambda le: lg.fail_attempt(le, "late", retryable=False),
    }


def item_commands(
    lg: Ledger, run_id: str
) -> dict[str, tuple[frozenset[str], Callable[[str], Any]]]:
    """the rule book's item commands that name an item, with the item states they start from."""
    editable = frozenset({S.PENDING, S.RETRYABLE, S.QUARANTINED})
    return {
        "skip": (editable, lambda i: lg.skip(run_id, i, OPERATOR, "not needed")),
        "skip_by_reviewer": (editable, lambda i: lg.skip(run_id, i, REVIEWER, "not needed")),
        "release": (
            frozenset({S.QUARANTINED}),
            lambda i: lg.release(run_id, i, REVIEWER, "try again"),
        ),
        "release_by_operator": (
            frozenset({S.QUARANTINED}),
            lambda i: lg.release(run_id, i, OPERATOR, "try again"),
        ),
        "reject_item": (
            frozenset({S.QUARANTINED}),
            lambda i: lg.reject_item(run_id, i, REVIEWER, "rule-2"),
        ),
        "withdraw": (editable, lambda i: lg.amend(run_id, SUBMITTER, "drop", withdraw=[i])),
        "withdraw_by_operator": (
            editable,
            lambda i: lg.amend(run_id, OPERATOR, "drop", withdraw=[i]),
        ),
    }


# Groups of asks; the lease writes and the late reconcile are apart from the rest so that
# a review rejection's fencing (bug 1) shows in the second group.
GROUPS = {
    "commands": ("claim", "item_commands", "amend_add"),
    "leases_then_time": ("lease_writes", "reconcile"),
}


CASES = [pytest.param(how, groups, id=f"{how}-{groups}") for how in HOWS for groups in GROUPS]


def ask(lg: Ledger, clock: ManualClock, ended: Ended, group: str) -> int:
    """Ask the terminal run every command of `group`; each must be refused. Returns how many."""
    asked = 0
    if group == "claim":
        clock.advance(3600)  # every backoff is over
        err = refused(lg, IllegalTransition, lambda: lg.claim(ended.run_id, WORKER, limit=10))
        assert isinstance(err, IllegalTransition) and err.state == ended.state, err
        asked += 1
    elif group == "lease_writes":
        for le in ended.leases:
            for write in lease_writes(lg).values():
                refused(lg, (LeaseLost, AlreadyTerminal), lambda: write(le))
                asked += 1
    elif group == "item_commands":
        for name, (sources, command) in item_commands(lg, ended.run_id).items():
            for item_id, state in ended.items.items():
                if state not in sources:
                    continue
                err = refused(lg, AlreadyTerminal, lambda: command(item_id))
                assert isinstance(err, AlreadyTerminal) and err.state == ended.state, (name, err)
                asked += 1
    elif group == "amend_add":
        for who in (SUBMITTER, OPERATOR):
            refused(
                lg,
                AlreadyTerminal,
                lambda: lg.amend(ended.run_id, who, "more", items=[{"item_id": "late"}]),
            )
            refused(
                lg,
                AlreadyTerminal,
                lambda: lg.amend(ended.run_id, who, "looser", policy={"max_attempts": 9}),
            )
            asked += 2
    else:
        clock.advance(7 * 24 * 3600)  # every lease, backoff and deadline is long over
        lg.reconcile(actor=RECONCILER)
        asked += 1
    return asked


@pytest.mark.parametrize(("how", "groups"), CASES)
def test_no_item_of_a_terminal_run_changes(
    lg: Ledger, clock: ManualClock, how: str, groups: str
) -> None:
    ended = end_by(lg, clock, how)
    before = lg.items(ended.run_id)
    status = lg.status(ended.run_id)
    for group in GROUPS[groups]:
        assert ask(lg, clock, ended, group), f"{group} asked nothing"
        assert lg.items(ended.run_id) == before, f"{group}: an item of a terminal run changed"
    after = lg.status(ended.run_id)
    assert (after.state, after.revision) == (status.state, status.revision)
    verify_clean(lg)


@pytest.mark.parametrize("how", HOWS)
def test_terminal_run_refuses_run_commands(lg: Ledger, clock: ManualClock, how: str) -> None:
    """Every run command on a terminal run is AlreadyTerminal naming the state, except the
    idempotent answers the rule book lists (complete of a completed run, cancel of a canceled one)."""
    ended = end_by(lg, clock, how)
    rid, state = ended.run_id, ended.state
    commands: dict[str, Callable[[], Any]] = {
        "start": lambda: lg.start(rid, CONTROLLER),
        "request_review": lambda: lg.request_review(rid, CONTROLLER, "qa"),
        "decide": lambda: lg.decide(rid, REVIEWER, lg.status(rid).input_version, True, "ok"),
        "pause": lambda: lg.pause(rid, OPERATOR, "hold"),
        "resume": lambda: lg.resume(rid, OPERATOR, reason="back to work"),
        "fail": lambda: lg.fail(rid, CONTROLLER, "again", transient=True),
    }
    if state not in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
        commands["complete"] = lambda: lg.complete(rid, CONTROLLER)
    if state != S.CANCELED:
        commands["cancel"] = lambda: lg.cancel(rid, OPERATOR, "too late")
    for name, command in commands.items():
        err = refused(lg, AlreadyTerminal, command)
        assert isinstance(err, AlreadyTerminal) and err.state == state, (name, err)
        assert state in err.message, (name, err.message)
    if state in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
        n = lg.status(rid).revision
        assert lg.complete(rid, CONTROLLER).state == state
        assert lg.status(rid).revision == n
    if state == S.CANCELED:
        n = lg.status(rid).revision
        out = lg.cancel(rid, SUBMITTER, "again")
        assert (out.state, out.already) == (S.CANCELED, True)
        assert lg.status(rid).revision == n
    verify_clean(lg)


# ---------------------------------------------------------------------------
# the role that should not get through
# ---------------------------------------------------------------------------
ROLE_CASES: dict[str, tuple[frozenset[str], Callable[[Ledger, str, Any], Any]]] = {
    "claim": (frozenset({S.WORKER}), lambda lg, r, who: lg.claim(r, who, limit=5)),
    "skip": (
        frozenset({S.OPERATOR, S.REVIEWER}),
        lambda lg, r, who: lg.skip(r, S.QUARANTINED, who, "x"),
    ),
    "release": (
        frozenset({S.OPERATOR, S.REVIEWER}),
        lambda lg, r, who: lg.release(r, S.QUARANTINED, who, "x"),
    ),
    "reject_item": (
        frozenset({S.REVIEWER}),
        lambda lg, r, who: lg.reject_item(r, S.QUARANTINED, who, "rule"),
    ),
    "amend": (
        frozenset({S.SUBMITTER, S.OPERATOR}),
        lambda lg, r, who: lg.amend(r, who, "x", withdraw=[S.PENDING]),
    ),
    "cancel": (
        frozenset({S.SUBMITTER, S.OPERATOR}),
        lambda lg, r, who: lg.cancel(r, who, "x"),
    ),
    "decide": (
        frozenset({S.REVIEWER}),
        lambda lg, r, who: lg.decide(r, who, lg.status(r).input_version, False, "x"),
    ),
    "fail": (
        frozenset({S.CONTROLLER, S.OPERATOR}),
        lambda lg, r, who: lg.fail(r, who, "x", transient=True),
    ),
    "complete": (frozenset({S.CONTROLLER}), lambda lg, r, who: lg.complete(r, who)),
    "pause": (frozenset({S.OPERATOR}), lambda lg, r, who: lg.pause(r, who, "x")),
    "request_review": (
        frozenset({S.CONTROLLER}),
        lambda lg, r, who: lg.request_review(r, who, "qa"),
    ),
}


@pytest.mark.parametrize("run_state", ["live", "terminal"])
def test_a_role_that_may_never_make_the_command_is_refused_first(
    lg: Ledger, clock: ManualClock, run_state: str
) -> None:
    """Role comes before state in the rule book's order of checks: NotAuthorized, nothing written,
    whether or not the run is terminal."""
    ids = [S.QUARANTINED, S.PENDING]
    run_id = _submit(lg, ids, review={"decision": "qa", "survives_amendment": False})
    _open_items(lg, run_id, (S.QUARANTINED,))
    lg.request_review(run_id, CONTROLLER, "qa")
    if run_state == "terminal":
        lg.fail(run_id, CONTROLLER, "stop", transient=True, failure_reason="input_unavailable")
    before = lg.items(run_id)
    for name, (roles, command) in ROLE_CASES.items():
        for role in sorted(set(S.ROLES) - roles):
            err = refused(lg, NotAuthorized, lambda: command(lg, run_id, actor(role)))
            assert role in err.message, (name, role, err.message)
    assert lg.items(run_id) == before


def test_reconciler_and_controller_cannot_make_worker_outcomes(lg: Ledger) -> None:
    """Truthfulness (rule 4): success needs evidence from the party that did the work; a
    lease copied by anyone else is still the lease holder's, and is refused once fenced."""
    run_id = _submit(lg, ["a", "b"])
    (le,) = lg.claim(run_id, WORKER, limit=1)
    # a claim by a role that is not a worker is refused, so no other role ever holds a lease
    for role in sorted(set(S.ROLES) - {S.WORKER}):
        refused(lg, NotAuthorized, lambda: lg.claim(run_id, actor(role), limit=1))
    lg.fail(run_id, OPERATOR, "stop", transient=True)
    refused(lg, (LeaseLost, AlreadyTerminal), lambda: lg.accept(le))
    assert not any(t.to_state == S.ACCEPTED for t in lg.history(run_id))
    verify_clean(lg)


# ---------------------------------------------------------------------------
# the time that is a lie
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["deadline", "lease"])
def test_a_future_now_cannot_end_a_healthy_run(lg: Ledger, clock: ManualClock, how: str) -> None:
    policy = {"run_deadline_seconds": 3600} if how == "deadline" else {"lease_seconds": 60}
    run_id = _submit(lg, ["a", "b"], **policy)
    leases = lg.claim(run_id, WORKER, limit=1) if how == "lease" else []
    state = lg.status(run_id)
    refused(
        lg, InvalidInput, lambda: lg.reconcile(now=clock() + timedelta(days=365), actor=RECONCILER)
    )
    assert lg.status(run_id) == state
    for le in leases:
        assert lg.heartbeat(le).expires_at > clock()
    newest = max(t.at for t in lg.audit())
    assert newest <= clock(), "an event is stamped after the store's clock"


def test_a_clock_that_steps_back_never_moves_a_streams_time_backwards(
    lg: Ledger, clock: ManualClock
) -> None:
    """the rule book: event times never move backwards within a stream, whatever the clock does."""
    run_id = _submit(lg, ["a", "b"], lease_seconds=60)
    (le,) = lg.claim(run_id, WORKER, limit=1)
    clock.advance(30)
    lg.heartbeat(le)
    clock.advance(-3600)  # an NTP step back
    # refusing is truthful too; writing a time before the last one is not
    with contextlib.suppress(LeaseLost):
        lg.accept(le)
    lg.pause(run_id, OPERATOR, "hold")
    streams: dict[str | None, list[Any]] = {}
    for t in lg.history(run_id):
        streams.setdefault(t.item_id, []).append(t.at)
    for key, times in streams.items():
        assert times == sorted(times), (key, times)
    verify_clean(lg)


# ---------------------------------------------------------------------------
# the command that forgot the check: the Worker helper's batched outcomes
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "end",
    [
        "fail",
        "review_rejection",
    ],
)
def test_worker_outcomes_after_its_run_ended_are_not_recorded(lg: Ledger, end: str) -> None:
    """The run ends while the Worker helper holds leases (its handler ends it, standing in
    for a controller and a reviewer elsewhere); the outcomes it then records in a batch
    must all be refused: no item of the ended run is accepted after its end."""
    from ledger import Accepted, Worker

    run_id = _submit(lg, ["a", "b", "c"], review={"decision": "qa", "survives_amendment": False})
    first = threading.Lock()
    ended = threading.Event()

    def handle(lease: Lease) -> Any:
        if first.acquire(blocking=False):  # the first handler ends the run
            if end == "fail":
                lg.fail(run_id, CONTROLLER, "stop", transient=True, failure_reason="input_invalid")
            else:
                st = lg.request_review(run_id, CONTROLLER, "qa")
                lg.decide(run_id, REVIEWER, st.input_version, False, "no")
            ended.set()
        assert ended.wait(30), "the run was not ended"  # every outcome comes after the end
        return Accepted(evidence={"stored_as": f"s3://{lease.item_id}"})

    Worker(lg, run_id, handle, worker_id="w1", concurrency=3, max_idle=2.0).run()
    assert lg.status(run_id).state == S.FAILED
    assert all(i.state != S.ACCEPTED for i in lg.items(run_id)), lg.items(run_id)
    verify_clean(lg)
