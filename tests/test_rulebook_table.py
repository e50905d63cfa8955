"""The rule book against SPEC.md, row by row (issue 13, SPEC rule 12).

1. The ledger's transition tables (`ledger.states`) say what SPEC's tables say: for each
   command its from-states, to-states and roles (SPEC.md "Run transitions" and "Item
   transitions", transcribed below by hand from the document, not from the code).
2. The column SPEC adds for item commands, the run states they need, generated over
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

from ledger import AlreadyTerminal, IllegalTransition, Lease, LeaseLost, Ledger
from ledger import states as S
from tests.conftest import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER
from tests.findings import refused, verify_clean

# ---------------------------------------------------------------------------
# 1. SPEC.md's tables, transcribed
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
    starts from (SPEC's item table), and the call."""
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


# SPEC leaves people's item commands and amendments of a canceling run open.
OPEN_IN_CANCELING = {"release", "reject_item", "skip", "skip_pending", "withdraw", "amend_add"}
NON_TERMINAL = [s for s in S.RUN_STATES if not S.is_terminal(s)]


@pytest.mark.parametrize("state", NON_TERMINAL)
def test_item_commands_in_every_live_run_state(lg: Ledger, state: str) -> None:
    """Claims need a running run; every other item command only a non-terminal one."""
    made = []
    for name, (item, starts, call) in item_cells(lg).items():
        if state == S.CANCELING and name in OPEN_IN_CANCELING:
            continue
        held = hold(lg, state)
        if item is None and held.lease is None:
            continue  # no lease can be live in this state
        if item is not None and held.items[item] not in starts:
            continue  # the item cannot be in a state the command starts from here
        made.append(name)
        if name == "claim" and state != S.RUNNING:
            err = refused(lg, IllegalTransition, lambda: call(held))
            assert isinstance(err, IllegalTransition) and err.state == state, (name, err)
            assert not isinstance(err, AlreadyTerminal)
            continue
        assert call(held) is not None, name
    assert "claim" in made and len(made) >= 3, (state, made)
    verify_clean(lg)


def test_lease_commands_refused_once_the_run_ended_every_way(lg: Ledger) -> None:
    """A lease live when its run ended (by fail; a review rejection is bug 1, see
    test_audit_findings) can write nothing afterwards."""
    for end in ("fail", "cancel_then_accept"):
        held = hold(lg, S.RUNNING)
        assert held.lease is not None
        if end == "fail":
            lg.fail(held.run_id, CONTROLLER, "stop", transient=True, failure_reason="input_invalid")
            lease = held.lease
        else:
            (other,) = lg.claim(held.run_id, WORKER, limit=1)
            lg.cancel(held.run_id, OPERATOR, "stop")
            lg.accept(other)
            lg.accept(held.lease)  # the last live lease: the cancel ends here
            assert lg.status(held.run_id).state == S.CANCELED
            lease = other
        for call in (
            lambda: lg.heartbeat(lease),
            lambda: lg.accept(lease),
            lambda: lg.reject(lease, "r"),
            lambda: lg.fail_attempt(lease, "e"),
        ):
            refused(lg, (LeaseLost, AlreadyTerminal), call)
    verify_clean(lg)
