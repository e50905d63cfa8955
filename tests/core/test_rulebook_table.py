"""The rule book against the rule book, row by row (rule 12 of the rule book).

1. The ledger's transition tables (`ledger.core.states`) say what The rule book's tables say: for each
   command its from-states, to-states and roles (The rule book's run transitions (docs/explanation/rule-book.md) and "Item
   transitions", transcribed below by hand from the document, not from the code).
2. The column the contract adds for item commands, the run states they need, generated over
   every run state the ledger declares: claims need a running run (else
   `IllegalTransition` naming the run's state); heartbeats and outcomes need a
   non-terminal run; people's item commands and amendments need a non-terminal run.
   Every allowed cell is made and must succeed; every refused cell must write nothing.
"""

# Lambdas in loops below are called at once, so late binding is harmless.
# ruff: noqa: B023

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ledger import Actor, AlreadyTerminal, IllegalTransition, Lease, Ledger
from ledger.core import states as S
from tests.support.findings import refused, verify_clean
from tests.support.runs import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER

# ---------------------------------------------------------------------------
# 1. the rule book's tables, transcribed
# ---------------------------------------------------------------------------
NON_TERMINAL_FAILABLE = {S.QUEUED, S.RUNNING, S.AWAITING_REVIEW, S.PAUSING, S.PAUSED}
# command: (from, to, roles); "-" is a new stream
SPEC_RUN = {
    "submit": ({"-"}, {S.QUEUED}, {S.SUBMITTER}),
    "retry": ({"-"}, {S.QUEUED}, {S.SUBMITTER, S.OPERATOR}),
    "repair": ({"-"}, {S.QUEUED}, {S.SUBMITTER, S.OPERATOR}),
    "compensate": ({"-"}, {S.QUEUED}, {S.OPERATOR}),
    "start": ({S.QUEUED}, {S.RUNNING}, {S.CONTROLLER}),
    "request_review": ({S.RUNNING}, {S.AWAITING_REVIEW}, {S.CONTROLLER}),
    "decide": ({S.AWAITING_REVIEW}, {S.RUNNING, S.FAILED}, {S.REVIEWER}),
    "pause": ({S.RUNNING}, {S.PAUSING, S.PAUSED}, {S.OPERATOR}),
    "resume": ({S.PAUSING, S.PAUSED}, {S.RUNNING}, {S.OPERATOR}),
    "cancel": (
        {S.QUEUED, S.PAUSED, S.RUNNING, S.AWAITING_REVIEW, S.PAUSING},
        {S.CANCELING, S.CANCELED},
        {S.SUBMITTER, S.OPERATOR},
    ),
    "complete": ({S.RUNNING}, {S.SUCCEEDED, S.COMPLETED_WITH_ERRORS}, {S.CONTROLLER}),
    "fail": (NON_TERMINAL_FAILABLE, {S.FAILED}, {S.CONTROLLER, S.OPERATOR}),
}
EDITABLE = {S.PENDING, S.RETRYABLE, S.QUARANTINED}
SPEC_ITEM = {
    "claim": ({S.PENDING, S.RETRYABLE}, {S.IN_PROGRESS}, {S.WORKER}),
    "heartbeat": ({S.IN_PROGRESS}, {S.IN_PROGRESS}, {S.WORKER}),
    "accept": ({S.IN_PROGRESS}, {S.ACCEPTED}, {S.WORKER}),
    "reject": ({S.IN_PROGRESS}, {S.REJECTED}, {S.WORKER}),
    "fail_attempt": ({S.IN_PROGRESS}, {S.RETRYABLE, S.QUARANTINED}, {S.WORKER}),
    "release": ({S.QUARANTINED}, {S.RETRYABLE}, {S.REVIEWER, S.OPERATOR}),
    "reject_item": ({S.QUARANTINED}, {S.REJECTED}, {S.REVIEWER}),
    "skip": (EDITABLE, {S.SKIPPED}, {S.OPERATOR, S.REVIEWER}),
    "withdraw": (EDITABLE, {S.SKIPPED}, {S.SUBMITTER, S.OPERATOR}),
    "cancel_skip": ({S.PENDING, S.RETRYABLE}, {S.SKIPPED}, None),  # the ledger's own
}


@pytest.mark.parametrize("command", sorted(SPEC_RUN))
def test_run_table_row_says_what_spec_says(command: str) -> None:
    sources, targets, roles = SPEC_RUN[command]
    row = S.run_rule(command)
    assert set(row.sources) == sources, (command, sorted(row.sources))
    assert set(row.targets) == targets, (command, row.targets)
    assert set(row.roles) == roles, (command, sorted(row.roles))


@pytest.mark.parametrize("command", sorted(SPEC_ITEM))
def test_item_table_row_says_what_spec_says(command: str) -> None:
    sources, targets, roles = SPEC_ITEM[command]
    row = S.item_rule(command)
    assert set(row.sources) == sources, (command, sorted(row.sources))
    assert set(row.targets) == targets, (command, row.targets)
    if roles is not None:
        assert set(row.roles) == roles, (command, sorted(row.roles))


def test_the_ledger_declares_spec_states_and_terminals() -> None:
    assert set(S.RUN_STATES) == {
        S.QUEUED,
        S.RUNNING,
        S.AWAITING_REVIEW,
        S.PAUSING,
        S.PAUSED,
        S.CANCELING,
        S.SUCCEEDED,
        S.COMPLETED_WITH_ERRORS,
        S.FAILED,
        S.CANCELED,
    }
    assert set(S.TERMINAL_RUN_STATES) == {
        S.SUCCEEDED,
        S.COMPLETED_WITH_ERRORS,
        S.FAILED,
        S.CANCELED,
    }
    assert set(S.ITEM_STATES) == {
        S.PENDING,
        S.IN_PROGRESS,
        S.RETRYABLE,
        S.QUARANTINED,
        S.ACCEPTED,
        S.REJECTED,
        S.SKIPPED,
    }


# ---------------------------------------------------------------------------
# 2. item commands x run states
# ---------------------------------------------------------------------------
@dataclass
class Held:
    """A run in some state with a quarantined item `q`, a pending item `p` and, where the
    state can hold one, a live lease on item `live`."""

    run_id: str
    lease: Lease | None = None
    items: dict[str, str] = field(default_factory=dict)


def hold(lg: Ledger, state: str) -> Held:
    m = {
        "source_version": "s",
        "config_version": "c",
        "scope": "rule book",
        "items": [{"item_id": i, "payload": {"i": i}} for i in ("q", "live", "p")],
        "policy": {"backoff_seconds": 3600},
    }
    run_id = lg.submit(m, SUBMITTER).run_id
    if state == S.QUEUED:
        return Held(run_id, None, {"q": S.PENDING, "live": S.PENDING, "p": S.PENDING})
    lg.start(run_id, CONTROLLER)
    (q,) = lg.claim(run_id, WORKER, limit=1)
    assert q.item_id == "q"
    lg.fail_attempt(q, "corrupt row", retryable=False)
    lease: Lease | None = None
    if state in (S.RUNNING, S.AWAITING_REVIEW, S.PAUSING, S.CANCELING):
        (lease,) = lg.claim(run_id, WORKER, limit=1)
        assert lease.item_id == "live"
    if state == S.AWAITING_REVIEW:
        lg.request_review(run_id, CONTROLLER, "qa")
    elif state in (S.PAUSING, S.PAUSED):
        lg.pause(run_id, OPERATOR, "hold")
    elif state == S.CANCELING:
        lg.cancel(run_id, OPERATOR, "stop")
    assert lg.status(run_id).state == state
    return Held(run_id, lease, {i.item_id: i.state for i in lg.items(run_id)})


QUARANTINED_ONLY = {S.QUARANTINED}


def item_cells(lg: Ledger) -> dict[str, tuple[str | None, set[str], Callable[[Held], Any]]]:
    """Each item command: the item it acts on (None: the live lease), the item states it
    starts from (the contract's item table), and the call."""
    return {
        # refused by run state whatever its items are; in a running run `p` is claimable
        "claim": ("p", set(S.ITEM_STATES), lambda h: lg.claim(h.run_id, WORKER, limit=5)),
        "heartbeat": (None, set(), lambda h: lg.heartbeat(h.lease)),
        "accept": (None, set(), lambda h: lg.accept(h.lease, evidence={"stored_as": "s3://x"})),
        "reject": (None, set(), lambda h: lg.reject(h.lease, "rule-1")),
        "fail_attempt": (None, set(), lambda h: lg.fail_attempt(h.lease, "boom")),
        "release": (
            "q",
            QUARANTINED_ONLY,
            lambda h: lg.release(h.run_id, "q", REVIEWER, "try again"),
        ),
        "reject_item": (
            "q",
            QUARANTINED_ONLY,
            lambda h: lg.reject_item(h.run_id, "q", REVIEWER, "rule-2"),
        ),
        "skip": ("q", EDITABLE, lambda h: lg.skip(h.run_id, "q", OPERATOR, "not needed")),
        "skip_pending": ("p", EDITABLE, lambda h: lg.skip(h.run_id, "p", OPERATOR, "no")),
        "withdraw": (
            "q",
            EDITABLE,
            lambda h: lg.amend(h.run_id, SUBMITTER, "drop", withdraw=["q"]),
        ),
        "amend_add": (
            "p",
            set(S.ITEM_STATES),
            lambda h: lg.amend(h.run_id, SUBMITTER, "more", items=[{"item_id": "x"}]),
        ),
    }


NON_TERMINAL = [s for s in S.RUN_STATES if not S.is_terminal(s)]
TABLE_COMMAND = {"skip_pending": "skip", "amend_add": "amend"}


def run_states_for(cell: str) -> set[str] | None:
    """The run states the rule book lets an item command act in (its `run_states`
    column, or for amend the sources of its command row). Where the rule book does not
    say, the contract's: claims need running; the rest a non-terminal run, except that the contract
    leaves people's item commands and amendments of a canceling run open (None there)."""
    command = TABLE_COMMAND.get(cell, cell)
    if command == "amend":
        rules = {r.command: r for r in getattr(S, "COMMAND_RULES", ())}
        declared = set(rules["amend"].sources) if "amend" in rules else set()
    else:
        declared = set(getattr(S.item_rule(command), "run_states", ()) or ())
    if declared:
        return declared
    if command == "claim":
        return {S.RUNNING}
    if command in ("heartbeat", "accept", "reject", "fail_attempt"):
        return set(NON_TERMINAL)
    return None


@pytest.mark.parametrize("state", NON_TERMINAL)
def test_item_commands_in_every_live_run_state(lg: Ledger, state: str) -> None:
    """Generated from the rule book's run-state column: each item command is made in a run
    in `state`; allowed where the column lists the state, else IllegalTransition naming
    the run's state and nothing written."""
    made = []
    for name, (item, starts, call) in item_cells(lg).items():
        allowed = run_states_for(name)
        if allowed is None and state == S.CANCELING:
            continue  # the contract does not say, and the rule book does not either
        held = hold(lg, state)
        if item is None and held.lease is None:
            continue  # no lease can be live in this state
        if item is not None and held.items[item] not in starts and name != "claim":
            continue  # the item cannot be in a state the command starts from here
        made.append(name)
        if allowed is not None and state not in allowed:
            err = refused(lg, IllegalTransition, lambda: call(held))
            assert isinstance(err, IllegalTransition) and err.state == state, (name, err)
            assert not isinstance(err, AlreadyTerminal)
            continue
        assert call(held) is not None, name
    assert "claim" in made and len(made) >= 3, (state, made)
    verify_clean(lg)


def test_item_command_run_states_are_spec_s() -> None:
    """Where the rule book declares run states for item commands, they are the contract's: claims
    need running, outcomes and heartbeats any non-terminal state, nothing a terminal one."""
    for cell in item_cells(None):  # type: ignore[arg-type]
        states = run_states_for(cell)
        if states is None:
            continue
        assert not any(S.is_terminal(s) for s in states), (cell, states)
        if cell == "claim":
            assert states == {S.RUNNING}
        if cell in ("heartbeat", "accept", "reject", "fail_attempt"):
            assert states == set(NON_TERMINAL), (cell, states)


# ---------------------------------------------------------------------------
# 3. the evidence column: every recorded transition carries its row's evidence
# ---------------------------------------------------------------------------
def every_row(lg: Ledger, clock: Any) -> None:
    """Make every row of both tables happen at least once (good arguments throughout)."""

    def running(n: int = 3, **policy: Any) -> str:
        m = {
            "source_version": "s",
            "config_version": "c",
            "scope": "every row",
            "items": [{"item_id": f"i{k}", "payload": {"k": k}} for k in range(n)],
            "policy": {"partial_delivery": True, "tolerated_failures": 10, **policy},
        }
        run_id = lg.submit(m, SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        return run_id

    a = running(6, lease_seconds=30)
    le = lg.claim(a, WORKER, limit=4)
    lg.heartbeat(le[0])
    lg.accept(le[0], evidence={"stored_as": "s3://a/0"})
    lg.reject(le[1], "rule-1", detail="bad row")
    lg.fail_attempt(le[2], "flaky", retryable=False)
    lg.release(a, le[2].item_id, REVIEWER, "try again")
    lg.fail_attempt(le[3], "corrupt", retryable=False)
    lg.reject_item(a, le[3].item_id, REVIEWER, "rule-2")
    lg.skip(a, "i4", OPERATOR, "not needed")
    lg.amend(a, SUBMITTER, "drop", withdraw=["i5"])
    lg.amend(a, SUBMITTER, "more", items=[{"item_id": "x", "payload": {}}])
    st = lg.request_review(a, CONTROLLER, "qa")
    lg.decide(a, REVIEWER, st.input_version, True, "fine")
    rest = lg.claim(a, WORKER, limit=5)
    lg.pause(a, OPERATOR, "hold")  # pausing: leases are live
    for x in rest:
        lg.accept(x, evidence={"stored_as": "s3://a"})  # the last one: pause_finished
    lg.resume(a, OPERATOR, reason="back to work")
    lg.complete(a, CONTROLLER)

    b = running(2, lease_seconds=30)
    lg.claim(b, WORKER, limit=1)
    lg.cancel(b, OPERATOR, "stop")  # canceling, i1 cancel_skip
    clock.advance(31)
    lg.reconcile(actor=Actor("rec", S.RECONCILER))  # expire, cancel_finished

    c = running(2)
    (ok,) = lg.claim(c, WORKER, limit=1)
    lg.accept(ok, evidence={"stored_as": "s3://c"})
    lg.claim(c, WORKER, limit=1)
    lg.fail(c, CONTROLLER, "upstream gone", transient=True, failure_reason="input_unavailable")
    lg.retry(c, OPERATOR)
    lg.repair(c, OPERATOR)
    lg.compensate(c, OPERATOR, "undo")

    d = running(2, run_deadline_seconds=100, item_deadline_seconds=50, backoff_seconds=0)
    (first,) = lg.claim(d, WORKER, limit=1)
    lg.fail_attempt(first, "flaky")  # retryable, then past the item deadline
    clock.advance(101)
    lg.reconcile(actor=Actor("rec", S.RECONCILER))  # deadline (item), reconcile_deadline


def test_every_transition_carries_its_rows_evidence(lg: Ledger, clock: Any) -> None:
    """Generated from the tables: each row's `evidence` keys are on every transition
    recorded for it (none null), and every row of both tables was made."""
    every_row(lg, clock)
    # rows of commands that move no state (amend), where the rule book has them
    run_rows = {r.command: r for r in (*S.RUN_TRANSITIONS, *getattr(S, "COMMAND_RULES", ()))}
    item_rows = {r.command: r for r in S.ITEM_TRANSITIONS}
    seen: set[tuple[str, str]] = set()
    lacking: dict[tuple[str, str], list[str]] = {}
    for t in lg.audit():
        kind = "item" if t.item_id is not None else "run"
        rows = item_rows if kind == "item" else run_rows
        if t.command not in rows:
            lacking[(kind, t.command)] = ["<no row in the rule book>"]
            continue
        seen.add((kind, t.command))
        missing = [k for k in rows[t.command].evidence if t.evidence.get(k) is None]
        if missing:
            lacking[(kind, t.command)] = missing
    # a heartbeat extends a lease and items enter pending with their run's submit or
    # amend: those rows record no transition of their own in the history
    silent = {("item", "heartbeat"), ("item", "submit")}
    expected = {("run", r.command) for r in S.RUN_TRANSITIONS} | {("item", c) for c in item_rows}
    expected -= silent
    assert expected - seen == set(), sorted(expected - seen)
    assert not lacking, lacking
    verify_clean(lg)
