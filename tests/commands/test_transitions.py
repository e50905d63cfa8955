"""Every row of the rule book's two transition tables, on every store.

The tables come from `ledger.core.states.RUN_TRANSITIONS` and `ITEM_TRANSITIONS` (the single
source): for each row, each listed (from-state, role) succeeds and lands in a listed
target; each role not listed gets NotAuthorized; each from-state not listed gets
IllegalTransition (AlreadyTerminal on a terminal run). Refusals write nothing: the
events table is counted before and after.
"""

# Lambdas in loops below are called at once (by `refused`), so late binding is harmless.
# ruff: noqa: B023

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from ledger import (
    Actor,
    AlreadyTerminal,
    CancelOutcome,
    IllegalTransition,
    LeaseLost,
    Ledger,
    LedgerError,
    NotAuthorized,
    NotComplete,
    RunStatus,
)
from ledger.core import states as S
from tests.support.clock import ManualClock
from tests.support.drive import (
    DECISION,
    Driven,
    actor,
    event_count,
    item_zoo,
    run_in,
    submit,
)
from tests.support.runs import CONTROLLER, OPERATOR, RECONCILER, SUBMITTER, WORKER, manifest

RUN_RULES = {r.command: r for r in S.RUN_TRANSITIONS}
ITEM_RULES = {r.command: r for r in S.ITEM_TRANSITIONS}


def refused(lg: Ledger, exc: type[LedgerError], fn: Callable[[], Any]) -> LedgerError:
    """`fn` raises `exc` (exactly that class or a subclass) and writes nothing."""
    before = event_count(lg)
    with pytest.raises(exc) as info:
        fn()
    assert event_count(lg) == before, f"{exc.__name__} refusal wrote events"
    return info.value


def last_run_transition(lg: Ledger, run_id: str) -> Any:
    return [t for t in lg.history(run_id) if t.item_id is None][-1]


def last_item_transition(lg: Ledger, run_id: str, item_id: str) -> Any:
    return [t for t in lg.history(run_id) if t.item_id == item_id][-1]


def state_of(result: RunStatus | CancelOutcome) -> str:
    return result.state


# ---------------------------------------------------------------------------
# the tables themselves
# ---------------------------------------------------------------------------
def test_tables_match_spec_shape() -> None:
    """The data the suite is driven from: every state named in a row exists."""
    for rule in S.RUN_TRANSITIONS:
        assert rule.sources <= set(S.RUN_STATES) | {S.NEW}, rule
        assert set(rule.targets) <= set(S.RUN_STATES), rule
        assert rule.roles <= set(S.ROLES), rule
    for rule in S.ITEM_TRANSITIONS:
        assert rule.sources <= set(S.ITEM_STATES) | {S.NEW}, rule
        assert set(rule.targets) <= set(S.ITEM_STATES), rule
        assert rule.roles <= set(S.ROLES), rule
    # terminal runs leave only through the special cases, never through a row
    for rule in S.RUN_TRANSITIONS:
        assert not (rule.sources & S.TERMINAL_RUN_STATES), rule
    for rule in S.ITEM_TRANSITIONS:
        assert not (rule.sources & S.FINAL_ITEM_STATES), rule


def test_every_row_has_a_test() -> None:
    """Adding a row to a table without a driver here fails this test."""
    assert set(RUN_RULES) == set(RUN_ALLOWED), set(RUN_RULES) ^ set(RUN_ALLOWED)
    assert set(ITEM_RULES) == set(ITEM_ALLOWED), set(ITEM_RULES) ^ set(ITEM_ALLOWED)
    assert set(RUN_ROWS_BY_RECONCILE) <= set(RUN_RULES)
    assert set(ITEM_ROWS_BY_RECONCILE) <= set(ITEM_RULES)


# ---------------------------------------------------------------------------
# run table: allowed (from-state, role) pairs
# ---------------------------------------------------------------------------
def _check_run_landing(
    lg: Ledger, rule: S.Rule, run_id: str, source: str, who: Actor, expected: str
) -> None:
    assert expected in rule.targets
    st = lg.status(run_id)
    assert st.state == expected, (rule.command, source, who.role, st.state)
    t = last_run_transition(lg, run_id)
    assert (t.command, t.to_state, t.actor_id, t.role) == (rule.command, expected, who.id, who.role)
    if source != S.NEW:
        assert t.from_state == source


def allowed_submit(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    st = lg.submit(manifest(2), who)
    assert st.state == S.QUEUED and st.counts[S.PENDING] == 2
    _check_run_landing(lg, rule, st.run_id, source, who, S.QUEUED)


def _linked(
    lg: Ledger, rule: S.Rule, original: str, new: RunStatus, who: Actor, relation: str
) -> None:
    _check_run_landing(lg, rule, new.run_id, S.NEW, who, S.QUEUED)
    assert [(ln.relation, ln.run_id) for ln in new.links] == [(relation, original)]


def allowed_retry(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    d = run_in(lg, S.FAILED)  # failed(transient)
    _linked(lg, rule, d.run_id, lg.retry(d.run_id, who), who, "retry_of")


def allowed_repair(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    d = run_in(lg, S.COMPLETED_WITH_ERRORS)
    new = lg.repair(d.run_id, who)
    _linked(lg, rule, d.run_id, new, who, "repair_of")
    assert [i.item_id for i in lg.items(new.run_id)] == ["i0"]  # the item not accepted


def allowed_compensate(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    d = run_in(lg, S.SUCCEEDED)
    _linked(lg, rule, d.run_id, lg.compensate(d.run_id, who, "undo the export"), who, "compensates")


def _simple(
    command: str, act: Callable[[Ledger, str, Actor], Any], live_lease: bool | None = None
) -> Callable[[Ledger, S.Rule, str, Actor], None]:
    def run(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
        d = run_in(lg, source, live_lease=live_lease)
        result = act(lg, d.run_id, who)
        expected = rule.targets[0]
        assert state_of(result) == expected
        _check_run_landing(lg, rule, d.run_id, source, who, expected)

    return run


def allowed_decide(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    for approve, expected in ((True, S.RUNNING), (False, S.FAILED)):
        d = run_in(lg, source)
        version = lg.status(d.run_id).input_version
        st = lg.decide(d.run_id, who, version, approve, "checked the totals")
        assert st.state == expected
        _check_run_landing(lg, rule, d.run_id, source, who, expected)
        if not approve:
            assert (st.failure_kind, st.failure_reason) == (S.PERMANENT, "review_rejected")


def allowed_pause(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    # with a live lease: pausing; without: paused at once
    for live, expected in ((True, S.PAUSING), (False, S.PAUSED)):
        d = run_in(lg, source, live_lease=live)
        assert lg.pause(d.run_id, who, "maintenance").state == expected
        _check_run_landing(lg, rule, d.run_id, source, who, expected)


def _drain(lg: Ledger, clock: ManualClock, d: Driven, how: str) -> None:
    """End the run's last live lease: by its holder, or by the reconciler after expiry."""
    if how == "holder":
        lg.accept(d.leases[0])
    else:
        clock.advance(61)
        report = lg.reconcile()
        assert report.expired_leases == 1


def _finished(
    command: str, from_state: str, to_state: str, clock_of: Callable[[Ledger], ManualClock]
) -> Callable[[Ledger, S.Rule, str, Actor], None]:
    def run(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
        for how in ("holder", "reconciler"):
            d = run_in(lg, from_state)
            _drain(lg, clock_of(lg), d, how)
            st = lg.status(d.run_id)
            assert st.state == to_state, (how, st.state)
            t = last_run_transition(lg, d.run_id)
            assert (t.command, t.from_state, t.to_state) == (command, from_state, to_state)
            assert t.actor_id == S.LEDGER_ACTOR_ID and t.role in rule.roles

    return run


def _clock(lg: Ledger) -> ManualClock:
    clock = lg.store.clock
    assert isinstance(clock, ManualClock)
    return clock


def allowed_cancel(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    # a live lease makes it canceling; none (queued and paused never have one) canceled
    variants = [False] if source in (S.QUEUED, S.PAUSED, S.PAUSING) else [True, False]
    for live in variants:
        d = run_in(lg, source, live_lease=live)
        has_lease = live or source == S.PAUSING
        out = lg.cancel(d.run_id, who, "customer withdrew the order")
        expected = S.CANCELING if has_lease else S.CANCELED
        assert (out.state, out.already, out.in_flight) == (expected, False, int(has_lease))
        _check_run_landing(lg, rule, d.run_id, source, who, expected)


def allowed_complete(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    # every required item accepted -> succeeded
    rid = submit(lg, 2)
    lg.start(rid, CONTROLLER)
    for le in lg.claim(rid, WORKER, limit=2):
        lg.accept(le)
    assert lg.complete(rid, who).state == S.SUCCEEDED
    _check_run_landing(lg, rule, rid, source, who, S.SUCCEEDED)
    # partial delivery with a tolerated failure -> completed_with_errors
    rid = submit(lg, 2, partial_delivery=True, tolerated_failures=1)
    lg.start(rid, CONTROLLER)
    a, b = sorted(lg.claim(rid, WORKER, limit=2), key=lambda le: le.item_id)
    lg.accept(a)
    lg.reject(b, "bad-row")
    st = lg.complete(rid, who)
    assert st.state == S.COMPLETED_WITH_ERRORS
    assert [(n.item_id, n.state) for n in st.not_accepted] == [("i1", S.REJECTED)]
    _check_run_landing(lg, rule, rid, source, who, S.COMPLETED_WITH_ERRORS)


def allowed_fail(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    kinds = [True] if who.role == S.OPERATOR else [True, False]
    for transient in kinds:
        d = run_in(lg, source)
        st = lg.fail(
            d.run_id,
            who,
            "the export is unreadable",
            transient=transient,
            failure_reason="input_unavailable",
        )
        assert st.state == S.FAILED
        assert st.failure_kind == (S.TRANSIENT if transient else S.PERMANENT)
        assert st.failure_reason == "input_unavailable"
        _check_run_landing(lg, rule, d.run_id, source, who, S.FAILED)


def allowed_reconcile_deadline(lg: Ledger, rule: S.Rule, source: str, who: Actor) -> None:
    clock = _clock(lg)
    d = run_in(lg, source, run_deadline_seconds=30, lease_seconds=600)
    if d.leases:  # pausing: a live lease holds the run until it is gone
        clock.advance(31)
        lg.reconcile()
        assert lg.status(d.run_id).state == source
        lg.accept(d.leases[0])
        assert lg.status(d.run_id).state == S.PAUSED
    else:
        clock.advance(31)
    report = lg.reconcile(actor=who)
    assert report.failed_runs == 1
    st = lg.status(d.run_id)
    assert (st.state, st.failure_kind, st.failure_reason) == (
        S.FAILED,
        S.TRANSIENT,
        "deadline_exceeded",
    )
    t = last_run_transition(lg, d.run_id)
    assert (t.command, t.to_state, t.role) == ("reconcile_deadline", S.FAILED, who.role)
    assert t.from_state == (S.PAUSED if source == S.PAUSING else source)


RUN_ALLOWED: dict[str, Callable[[Ledger, S.Rule, str, Actor], None]] = {
    "submit": allowed_submit,
    "retry": allowed_retry,
    "repair": allowed_repair,
    "compensate": allowed_compensate,
    "start": _simple("start", lambda lg, rid, who: lg.start(rid, who)),
    "request_review": _simple(
        "request_review", lambda lg, rid, who: lg.request_review(rid, who, DECISION)
    ),
    "decide": allowed_decide,
    "pause": allowed_pause,
    "pause_finished": _finished("pause_finished", S.PAUSING, S.PAUSED, _clock),
    "resume": _simple("resume", lambda lg, rid, who: lg.resume(rid, who, reason="back to work")),
    "cancel": allowed_cancel,
    "cancel_finished": _finished("cancel_finished", S.CANCELING, S.CANCELED, _clock),
    "complete": allowed_complete,
    "fail": allowed_fail,
    "reconcile_deadline": allowed_reconcile_deadline,
}
# rows the ledger makes by itself are entered once (their `roles` name who may trigger them)
SELF_MADE = {"pause_finished", "cancel_finished"}


# Rows whose check runs the reconciler get a ledger of their own (reconcile is global, and
# its report counts are asserted); the others share one ledger, to keep database set-up cheap.
RUN_ROWS_BY_RECONCILE = ("pause_finished", "cancel_finished", "reconcile_deadline")
ITEM_ROWS_BY_RECONCILE = ("expire", "deadline")


def each_row(commands: list[str], check: Callable[[str], None]) -> None:
    """Run `check` for every row and report every row that failed, not just the first."""
    failures = []
    for command in commands:
        try:
            check(command)
        except Exception as e:
            failures.append(f"row {command!r}: {type(e).__name__}: {e}")
    assert not failures, "\n".join(failures)


def _run_row_allowed(lg: Ledger, command: str) -> None:
    rule = RUN_RULES[command]
    allowed = RUN_ALLOWED[command]
    if command in SELF_MADE:
        allowed(lg, rule, next(iter(rule.sources)), actor(S.CONTROLLER))
        return
    for source in sorted(rule.sources):
        for role in sorted(rule.roles):
            allowed(lg, rule, source, actor(role))


def test_run_rows_allowed(lg: Ledger) -> None:
    rows = [c for c in RUN_RULES if c not in RUN_ROWS_BY_RECONCILE]
    each_row(rows, lambda command: _run_row_allowed(lg, command))


@pytest.mark.parametrize("command", RUN_ROWS_BY_RECONCILE)
def test_run_row_allowed_via_reconcile_or_last_lease(lg: Ledger, command: str) -> None:
    _run_row_allowed(lg, command)


# ---------------------------------------------------------------------------
# run table: roles not listed
# ---------------------------------------------------------------------------
def _run_act(command: str) -> Callable[[Ledger, str, Actor], Any]:
    acts: dict[str, Callable[[Ledger, str, Actor], Any]] = {
        "start": lambda lg, rid, who: lg.start(rid, who),
        "request_review": lambda lg, rid, who: lg.request_review(rid, who, DECISION),
        "decide": lambda lg, rid, who: lg.decide(
            rid, who, lg.status(rid).input_version, True, "fine"
        ),
        "pause": lambda lg, rid, who: lg.pause(rid, who, "hold"),
        "resume": lambda lg, rid, who: lg.resume(rid, who, reason="back to work"),
        "cancel": lambda lg, rid, who: lg.cancel(rid, who, "stop"),
        "complete": lambda lg, rid, who: lg.complete(rid, who),
        "fail": lambda lg, rid, who: lg.fail(rid, who, "broken", transient=True),
        "retry": lambda lg, rid, who: lg.retry(rid, who),
        "repair": lambda lg, rid, who: lg.repair(rid, who),
        "compensate": lambda lg, rid, who: lg.compensate(rid, who, "undo"),
    }
    return acts[command]


# a from-state in which the command would succeed for a listed role
RUN_VALID_SOURCE = {
    "start": S.QUEUED,
    "request_review": S.RUNNING,
    "decide": S.AWAITING_REVIEW,
    "pause": S.RUNNING,
    "resume": S.PAUSED,
    "cancel": S.RUNNING,
    "complete": S.RUNNING,
    "fail": S.RUNNING,
    "retry": S.FAILED,
    "repair": S.COMPLETED_WITH_ERRORS,
    "compensate": S.SUCCEEDED,
}


def test_run_row_roles_not_listed(lg: Ledger) -> None:
    roles = S.run_rule("submit").roles
    for role in sorted(set(S.ROLES) - roles):
        e = refused(lg, NotAuthorized, lambda: lg.submit(manifest(1), actor(role)))
        assert role in e.message and "submit" in e.message
    assert lg.runs() == []
    for command in sorted(RUN_VALID_SOURCE):
        rule = RUN_RULES[command]
        d = run_in(lg, RUN_VALID_SOURCE[command])
        if command == "complete":  # make it completable, so only the role is wrong
            for le in lg.claim(d.run_id, WORKER, limit=10):
                lg.accept(le)
        before = lg.status(d.run_id)
        for role in sorted(set(S.ROLES) - rule.roles):
            e = refused(lg, NotAuthorized, lambda: _run_act(command)(lg, d.run_id, actor(role)))
            assert repr(role) in e.message, (command, e.message)
            for allowed in rule.roles:  # the message says who may
                assert allowed in e.message, (command, e.message)
        after = lg.status(d.run_id)
        assert (after.state, after.revision) == (before.state, before.revision), command
    # the reconciler's rows: reconcile by a role that may not reconcile
    run_in(lg, S.RUNNING, live_lease=True)
    _clock(lg).advance(3600)
    for role in sorted(set(S.ROLES) - S.RUN_COMMAND_ROLES["reconcile"]):
        refused(lg, NotAuthorized, lambda: lg.reconcile(actor=actor(role)))


def test_operator_may_only_fail_transient(lg: Ledger) -> None:
    d = run_in(lg, S.RUNNING)
    e = refused(lg, NotAuthorized, lambda: lg.fail(d.run_id, OPERATOR, "give up", transient=False))
    assert "transient" in e.message
    assert lg.status(d.run_id).state == S.RUNNING
    st = lg.fail(d.run_id, OPERATOR, "give up for now", transient=True)
    assert (st.state, st.failure_kind, st.failure_reason) == (
        S.FAILED,
        S.TRANSIENT,
        "operator_decision",
    )


# ---------------------------------------------------------------------------
# run table: from-states not listed
# ---------------------------------------------------------------------------
def zoo(lg: Ledger, states: tuple[str, ...] = S.RUN_STATES) -> dict[str, Driven]:
    """One run in each of `states` (refusals write nothing, so one zoo serves many checks)."""
    return {state: run_in(lg, state) for state in states}


SPECIAL_STATES = {
    # complete of a completed run returns its status
    "complete": {S.SUCCEEDED, S.COMPLETED_WITH_ERRORS},
    # cancel of a canceling or canceled run returns its outcome without writing
    "cancel": {S.CANCELING, S.CANCELED},
}


def test_run_row_states_not_listed(lg: Ledger) -> None:
    runs = zoo(lg)
    before = {state: lg.status(d.run_id) for state, d in runs.items()}
    for command in (
        "start",
        "request_review",
        "decide",
        "pause",
        "resume",
        "cancel",
        "complete",
        "fail",
    ):
        rule = RUN_RULES[command]
        who = actor(min(rule.roles))
        act = _run_act(command)
        unlisted = set(S.RUN_STATES) - rule.sources - SPECIAL_STATES.get(command, set())
        assert unlisted
        for state in sorted(unlisted):
            d = runs[state]
            exc = AlreadyTerminal if S.is_terminal(state) else IllegalTransition
            e = refused(lg, exc, lambda: act(lg, d.run_id, who))
            assert isinstance(e, IllegalTransition)
            if not S.is_terminal(state):
                assert type(e) is IllegalTransition, (command, state, type(e))
            assert e.state == state and set(e.allowed) == set(rule.sources), (command, state)
            assert state in e.message, (command, state, e.message)
    # claims: only while running; [] is for a running run with nothing claimable
    for state in S.RUN_STATES:
        if state == S.RUNNING:
            continue
        exc = AlreadyTerminal if S.is_terminal(state) else IllegalTransition
        e = refused(lg, exc, lambda: lg.claim(runs[state].run_id, WORKER, limit=5))
        assert e.state == state and state in e.message
    # linked runs: retry needs failed(transient); repair and compensate a terminal run
    ok = {"retry": {S.FAILED}, "repair": S.TERMINAL_RUN_STATES, "compensate": S.TERMINAL_RUN_STATES}
    for command, allowed in ok.items():
        for state in sorted(set(S.RUN_STATES) - allowed):
            e = refused(
                lg, IllegalTransition, lambda: _run_act(command)(lg, runs[state].run_id, OPERATOR)
            )
            assert state in e.message, (command, state, e.message)
    # a running run with open work is NotComplete (a state check, rule 5 of the rule book)
    e = refused(lg, NotComplete, lambda: lg.complete(runs[S.RUNNING].run_id, CONTROLLER))
    assert e.state == S.RUNNING
    after = {state: lg.status(d.run_id) for state, d in runs.items()}
    assert after == before


def test_retry_of_a_permanent_failure_is_refused(lg: Ledger) -> None:
    d = run_in(lg, S.RUNNING)
    lg.fail(d.run_id, CONTROLLER, "bad input", transient=False, failure_reason="input_invalid")
    e = refused(lg, IllegalTransition, lambda: lg.retry(d.run_id, SUBMITTER))
    assert "transient" in e.message


def test_complete_is_idempotent_on_completed_runs(lg: Ledger) -> None:
    for state, d in zoo(lg, (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS)).items():
        before = lg.status(d.run_id)
        n = event_count(lg)
        again = lg.complete(d.run_id, CONTROLLER)
        assert event_count(lg) == n
        assert (again.state, again.revision) == (state, before.revision)
        assert again == before


def test_cancel_of_canceling_or_canceled_returns_outcome_without_writing(lg: Ledger) -> None:
    runs = zoo(lg, (S.CANCELING, S.CANCELED))
    for state, in_flight in ((S.CANCELING, 1), (S.CANCELED, 0)):
        rid = runs[state].run_id
        rev = lg.status(rid).revision
        n = event_count(lg)
        for who in (SUBMITTER, OPERATOR):
            out = lg.cancel(rid, who, "again")
            assert (out.run_id, out.state, out.already, out.in_flight) == (
                rid,
                state,
                True,
                in_flight,
            )
        assert event_count(lg) == n
        assert lg.status(rid).revision == rev


def test_cancel_of_completed_run_says_completion_won(lg: Ledger) -> None:
    runs = zoo(lg, (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS, S.FAILED))
    for state in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
        rid = runs[state].run_id
        e = refused(lg, AlreadyTerminal, lambda: lg.cancel(rid, OPERATOR, "too late"))
        assert e.state == state
        assert "completion won" in e.message
    # a failed run is terminal too, but nothing "won": the plain terminal refusal
    e = refused(lg, AlreadyTerminal, lambda: lg.cancel(runs[S.FAILED].run_id, OPERATOR, "too late"))
    assert "completion won" not in e.message and S.FAILED in e.message


# ---------------------------------------------------------------------------
# special cases: fail fences leases
# ---------------------------------------------------------------------------
def test_fail_fences_live_leases(lg: Ledger) -> None:
    for source in (S.RUNNING, S.AWAITING_REVIEW, S.PAUSING):
        _fail_fences(lg, source)


def _fail_fences(lg: Ledger, source: str) -> None:
    d = run_in(lg, source, live_lease=True)
    lease = d.leases[0]
    st = lg.fail(d.run_id, CONTROLLER, "upstream is gone", transient=True)
    assert st.state == S.FAILED and st.counts[S.IN_PROGRESS] == 0
    attempt = lg.attempts(d.run_id, lease.item_id)[-1]
    assert (attempt.lease_token, attempt.outcome) == (lease.token, "abandoned")
    assert attempt.finished_at is not None
    item = lg.items(d.run_id)[0]
    assert item.item_id == lease.item_id and item.lease is None
    assert item.state in ITEM_RULES["abandon"].targets
    t = last_item_transition(lg, d.run_id, lease.item_id)
    assert (t.command, t.from_state) == ("abandon", S.IN_PROGRESS)
    # the fenced worker can no longer write
    refused(lg, LeaseLost, lambda: lg.accept(lease))
    refused(lg, LeaseLost, lambda: lg.heartbeat(lease))


# ---------------------------------------------------------------------------
# item table
# ---------------------------------------------------------------------------
def _item_landing(
    lg: Ledger,
    rule: S.Rule,
    run_id: str,
    item_id: str,
    source: str,
    expected: str,
    actor_id: str | None,
    role: str | None,
) -> None:
    assert expected in rule.targets, (rule.command, expected)
    got = {i.item_id: i for i in lg.items(run_id)}[item_id]
    assert got.state == expected, (rule.command, item_id, got.state)
    t = last_item_transition(lg, run_id, item_id)
    assert (t.from_state, t.to_state) == (source, expected), (rule.command, t)
    if actor_id is not None:
        assert (t.actor_id, t.role) == (actor_id, role)
    if role is not None:
        assert t.role in rule.roles, (rule.command, t.role)


def item_allowed_submit(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
    st = lg.submit(manifest(2), SUBMITTER)
    assert [(i.item_id, i.state) for i in lg.items(st.run_id)] == [
        ("i0", S.PENDING),
        ("i1", S.PENDING),
    ]
    for who in (SUBMITTER, OPERATOR):
        assert who.role in rule.roles
        lg.amend(st.run_id, who, "one more", items=[{"item_id": f"new-{who.id}"}])
        assert {i.item_id: i.state for i in lg.items(st.run_id)}[f"new-{who.id}"] == S.PENDING
    assert lg.status(st.run_id).counts[S.PENDING] == 4


def item_allowed_claim(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
    rid = submit(lg, 2, backoff_seconds=10)
    lg.start(rid, CONTROLLER)
    first = lg.claim(rid, WORKER, limit=1)[0]  # pending -> in_progress
    _item_landing(lg, rule, rid, first.item_id, S.PENDING, S.IN_PROGRESS, WORKER.id, S.WORKER)
    assert first.attempt == 1 and first.worker_id == WORKER.id
    assert first.expires_at == clock() + timedelta(seconds=60)
    lg.fail_attempt(first, "flaky")
    second = lg.claim(rid, WORKER, limit=5)  # the retryable one is still backing off
    assert [le.item_id for le in second] == ["i1"]
    assert lg.claim(rid, WORKER, limit=5) == []
    clock.advance(10)  # past its backoff: retryable -> in_progress
    again = lg.claim(rid, WORKER, limit=5)
    assert [(le.item_id, le.attempt) for le in again] == [(first.item_id, 2)]
    _item_landing(lg, rule, rid, first.item_id, S.RETRYABLE, S.IN_PROGRESS, WORKER.id, S.WORKER)


def item_allowed_heartbeat(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
    d = run_in(lg, S.RUNNING, live_lease=True)
    lease = d.leases[0]
    clock.advance(50)
    extended = lg.heartbeat(lease)
    assert extended.token == lease.token and extended.expires_at > lease.expires_at
    assert lg.items(d.run_id, state=S.IN_PROGRESS)[0].lease.expires_at == extended.expires_at  # type: ignore[union-attr]
    clock.advance(50)  # past the original expiry, within the extended one
    assert lg.accept(lease).state == S.ACCEPTED


def _lease_outcome(
    fn: Callable[[Ledger, Any], Any], expected: str, **policy: Any
) -> Callable[[Ledger, ManualClock, S.Rule], None]:
    def run(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
        d = run_in(lg, S.RUNNING, live_lease=True, **policy)
        lease = d.leases[0]
        assert fn(lg, lease).state == expected
        _item_landing(
            lg, rule, d.run_id, lease.item_id, S.IN_PROGRESS, expected, lease.worker_id, S.WORKER
        )

    return run


def item_allowed_fail_attempt(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
    _lease_outcome(lambda lg, le: lg.fail_attempt(le, "timeout"), S.RETRYABLE)(lg, clock, rule)
    _lease_outcome(lambda lg, le: lg.fail_attempt(le, "corrupt", retryable=False), S.QUARANTINED)(
        lg, clock, rule
    )
    _lease_outcome(lambda lg, le: lg.fail_attempt(le, "timeout"), S.QUARANTINED, max_attempts=1)(
        lg, clock, rule
    )


def item_allowed_expire(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
    for policy, expected in (({}, S.RETRYABLE), ({"max_attempts": 1}, S.QUARANTINED)):
        d = run_in(lg, S.RUNNING, live_lease=True, lease_seconds=30, **policy)
        clock.advance(31)
        lg.reconcile(actor=RECONCILER)
        lease = d.leases[0]
        _item_landing(
            lg, rule, d.run_id, lease.item_id, S.IN_PROGRESS, expected, RECONCILER.id, S.RECONCILER
        )
        assert lg.attempts(d.run_id, lease.item_id)[-1].outcome == "lease_expired"


def item_allowed_abandon(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
    for who in (CONTROLLER, OPERATOR):
        assert who.role in rule.roles
        d = run_in(lg, S.RUNNING, live_lease=True)
        lg.fail(d.run_id, who, "stop everything", transient=True)
        lease = d.leases[0]
        got = {i.item_id: i.state for i in lg.items(d.run_id)}[lease.item_id]
        _item_landing(lg, rule, d.run_id, lease.item_id, S.IN_PROGRESS, got, None, None)
        assert lg.attempts(d.run_id, lease.item_id)[-1].outcome == "abandoned"


def item_allowed_deadline(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
    d = run_in(lg, S.RUNNING, live_lease=True, item_deadline_seconds=100, backoff_seconds=1000)
    lease = d.leases[0]
    lg.fail_attempt(lease, "timeout")
    clock.advance(101)
    lg.reconcile(actor=RECONCILER)
    _item_landing(
        lg, rule, d.run_id, lease.item_id, S.RETRYABLE, S.QUARANTINED, RECONCILER.id, S.RECONCILER
    )


def _item_command(
    name: str, sources_role: Callable[[Ledger, str, str, Actor], Any], expected: str
) -> Callable[[Ledger, ManualClock, S.Rule], None]:
    def run(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
        for source in sorted(rule.sources):
            for role in sorted(rule.roles):
                zoo = item_zoo(lg)
                who = actor(role)
                sources_role(lg, zoo.run_id, source, who)
                _item_landing(lg, rule, zoo.run_id, source, source, expected, who.id, role)

    return run


def item_allowed_cancel_skip(lg: Ledger, clock: ManualClock, rule: S.Rule) -> None:
    zoo = item_zoo(lg)
    out = lg.cancel(zoo.run_id, OPERATOR, "stop")
    assert out.state == S.CANCELING  # the in_progress item still holds its lease
    for source in sorted(rule.sources):
        _item_landing(
            lg, rule, zoo.run_id, source, source, S.SKIPPED, S.LEDGER_ACTOR_ID, S.CONTROLLER
        )
        assert last_item_transition(lg, zoo.run_id, source).reason == "canceled"
    states = {i.item_id: i.state for i in lg.items(zoo.run_id)}
    assert states[S.QUARANTINED] == S.QUARANTINED  # not in the row's sources: untouched
    assert states[S.IN_PROGRESS] == S.IN_PROGRESS  # in flight: may finish


ITEM_ALLOWED: dict[str, Callable[[Ledger, ManualClock, S.Rule], None]] = {
    "submit": item_allowed_submit,
    "claim": item_allowed_claim,
    "heartbeat": item_allowed_heartbeat,
    "accept": _lease_outcome(lambda lg, le: lg.accept(le, evidence={"rows": 3}), S.ACCEPTED),
    "reject": _lease_outcome(lambda lg, le: lg.reject(le, "negative-amount", "row 7"), S.REJECTED),
    "fail_attempt": item_allowed_fail_attempt,
    "expire": item_allowed_expire,
    "abandon": item_allowed_abandon,
    "deadline": item_allowed_deadline,
    "release": _item_command(
        "release", lambda lg, rid, i, who: lg.release(rid, i, who, "fixed"), S.RETRYABLE
    ),
    "reject_item": _item_command(
        "reject_item", lambda lg, rid, i, who: lg.reject_item(rid, i, who, "bad-row"), S.REJECTED
    ),
    "skip": _item_command(
        "skip", lambda lg, rid, i, who: lg.skip(rid, i, who, "not needed"), S.SKIPPED
    ),
    "withdraw": _item_command(
        "withdraw", lambda lg, rid, i, who: lg.amend(rid, who, "withdrawn", withdraw=[i]), S.SKIPPED
    ),
    "cancel_skip": item_allowed_cancel_skip,
}


def test_item_rows_allowed(lg: Ledger, clock: ManualClock) -> None:
    rows = [c for c in ITEM_RULES if c not in ITEM_ROWS_BY_RECONCILE]
    each_row(rows, lambda command: ITEM_ALLOWED[command](lg, clock, ITEM_RULES[command]))


@pytest.mark.parametrize("command", ITEM_ROWS_BY_RECONCILE)
def test_item_row_allowed_via_reconcile(lg: Ledger, clock: ManualClock, command: str) -> None:
    ITEM_ALLOWED[command](lg, clock, ITEM_RULES[command])


ITEM_ACTS: dict[str, Callable[[Ledger, str, str, Actor], Any]] = {
    "release": lambda lg, rid, i, who: lg.release(rid, i, who, "fixed"),
    "reject_item": lambda lg, rid, i, who: lg.reject_item(rid, i, who, "bad-row"),
    "skip": lambda lg, rid, i, who: lg.skip(rid, i, who, "not needed"),
    "withdraw": lambda lg, rid, i, who: lg.amend(rid, who, "withdrawn", withdraw=[i]),
}


LEASE_ACTS: dict[str, Callable[[Ledger, Any], Any]] = {
    "heartbeat": lambda lg, le: lg.heartbeat(le),
    "accept": lambda lg, le: lg.accept(le),
    "reject": lambda lg, le: lg.reject(le, "bad-row"),
    "fail_attempt": lambda lg, le: lg.fail_attempt(le, "boom"),
}


def test_item_rows_refused(lg: Ledger) -> None:
    """One run holding an item in every state serves every refusal (they write nothing)."""
    from dataclasses import replace

    z = item_zoo(lg)
    before = lg.items(z.run_id)
    # roles not listed
    for command in [*sorted(ITEM_ACTS), "claim", "submit"]:
        rule = ITEM_RULES[command]
        for role in sorted(set(S.ROLES) - rule.roles):
            who = actor(role)
            if command == "claim":

                def fn() -> Any:
                    return lg.claim(z.run_id, who, limit=10)
            elif command == "submit":  # items enter by amend(add) after the submit

                def fn():
                    return lg.amend(z.run_id, who, "more", items=[{"item_id": "x"}])
            else:
                source = min(rule.sources)

                def fn():
                    return ITEM_ACTS[command](lg, z.run_id, source, who)

            e = refused(lg, NotAuthorized, fn)
            assert repr(role) in e.message, (command, role, e.message)
    # from-states not listed
    for command in sorted(ITEM_ACTS):
        rule = ITEM_RULES[command]
        who = actor(min(rule.roles))
        for state in sorted(set(S.ITEM_STATES) - rule.sources):
            e = refused(lg, IllegalTransition, lambda: ITEM_ACTS[command](lg, z.run_id, state, who))
            assert type(e) is IllegalTransition, (command, state)
            assert e.state == state and state in e.message, (command, state, e.message)
    # 'the lease holder' is the only role of the lease rows: a lease whose attempt already
    # ended (items no longer in_progress) or a token that is not the live one is LeaseLost
    live = z.leases[S.IN_PROGRESS]
    forged = replace(live, token="f" * 32, worker_id="w2")
    for command, act in LEASE_ACTS.items():
        for state in (S.RETRYABLE, S.QUARANTINED, S.ACCEPTED, S.REJECTED):
            e = refused(lg, LeaseLost, lambda: act(lg, z.leases[state]))
            assert state in e.message, (command, state, e.message)
        refused(lg, LeaseLost, lambda: act(lg, forged))
    assert lg.items(z.run_id) == before
    # the real holder still can
    assert lg.heartbeat(live).token == live.token
    assert lg.accept(live).state == S.ACCEPTED


def test_claim_only_takes_pending_and_retryable(lg: Ledger, clock: ManualClock) -> None:
    zoo = item_zoo(lg)
    got = lg.claim(zoo.run_id, WORKER, limit=100)
    assert sorted(le.item_id for le in got) == sorted(ITEM_RULES["claim"].sources)
    assert lg.claim(zoo.run_id, WORKER, limit=100) == []


def test_items_of_terminal_runs_never_change(lg: Ledger) -> None:
    for state in (S.CANCELED, S.FAILED, S.SUCCEEDED):
        d = run_in(lg, state)
        before = lg.items(d.run_id)
        for command in ("skip", "release", "reject_item"):
            who = actor(min(ITEM_RULES[command].roles))
            refused(lg, AlreadyTerminal, lambda: ITEM_ACTS[command](lg, d.run_id, "i0", who))
        refused(lg, AlreadyTerminal, lambda: lg.amend(d.run_id, SUBMITTER, "late", withdraw=["i0"]))
        assert lg.items(d.run_id) == before
