"""The rules `verify` checks over the history, checked on each commit's events before they
are written (rule 12 of the rule book): the ledger cannot commit what `verify` would reject.

`check(tx, events, runs, stamps)` walks the events in the order they are about to be
appended, starting from the state the transaction has already committed (the runs'
states before these events, the last time of every stream it loaded), and raises
`InvariantViolated` at the first event that breaks a rule:

- `terminal_changed`: a terminal run records another run event;
- `item_after_end`: an item of a terminal run changes;
- `two_leases`: an item is claimed while it holds a live lease;
- `reconciler_success`: the reconciler records an acceptance or a success;
- `success_unearned`: a run succeeds with work still open or a required item not accepted;
- `time_backwards`: an event is stamped before the previous event of its stream.

The command's own checks come first and name the problem better; this is the backstop
that holds when one of them is missing or wrong. Nothing is appended when it raises.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import CanInitAggregate

from ledger.core import states as S
from ledger.core.domain import Item, Run
from ledger.core.errors import InvariantViolated
from ledger.projections.counts import required_not_accepted
from ledger.stores.base import Tx

SUCCESS_STATES = frozenset({S.ACCEPTED, S.SUCCEEDED, S.COMPLETED_WITH_ERRORS})
OPEN_ITEM_STATES = (S.PENDING, S.IN_PROGRESS, S.RETRYABLE)


def _describe(e: Any) -> str:
    command = getattr(e, "command", None) or type(e).__name__
    to = getattr(e, "to_state", None)
    return f"{command}" + (f" -> {to}" if to else "")


def _refuse(kind: str, run_id: str, detail: str) -> InvariantViolated:
    return InvariantViolated(
        f"refused before commit ({kind}): {detail}; nothing was written", kind=kind, run_id=run_id
    )


def _states_before(events: Sequence[Any], runs: dict[str, Run]) -> dict[str, str]:
    """Each run's state before these events: its first event's from-state, else its state."""
    before: dict[str, str] = {}
    for e in events:
        if isinstance(e, Run.Transitioned):
            before.setdefault(str(e.originator_id), e.from_state)
        elif isinstance(e, Run.Amended):
            before.setdefault(str(e.originator_id), e.state)
    for run_id, run in runs.items():
        before.setdefault(run_id, run.state)
    return before


def check(
    tx: Tx, events: Sequence[Any], runs: dict[str, Run], stamps: dict[UUID, datetime]
) -> None:
    """Raise InvariantViolated if appending `events` would break a rule `verify` checks.
    `stamps` (stream id -> time of its last committed event) is updated as events pass."""
    state = _states_before(events, runs)
    moved: dict[str, Counter[str]] = {}  # item counts moved by this commit's item events
    final: dict[tuple[str, str], str] = {}  # items' states after this commit's events
    terminal = S.TERMINAL_RUN_STATES
    for e in events:
        kind = _KINDS.get(type(e)) or _kind(type(e))
        created = kind is _CREATED or kind is _SUBMITTED
        run_id = getattr(e, "run_id", None) or str(e.originator_id)
        oid = e.originator_id
        stamp = e.timestamp
        if not created:
            last = stamps.get(oid)
            if last is not None and stamp < last:
                raise _refuse(
                    "time_backwards",
                    run_id,
                    f"{_describe(e)} is stamped {stamp.isoformat()}, before the previous "
                    f"event of its stream ({last.isoformat()})",
                )
        stamps[oid] = stamp
        if kind is _SUBMITTED:
            state[run_id] = S.QUEUED
            continue
        run_state = state.get(run_id)
        if run_state is not None and run_state in terminal and not created:
            _refuse_after_end(e, run_id, run_state)
        if kind is _ITEM_MOVE:
            to_state = e.to_state
            if e.command == "claim" and e.from_state == S.IN_PROGRESS:
                raise _refuse(
                    "two_leases",
                    run_id,
                    f"item {e.item_id!r} would be claimed by {e.actor_id} while its lease is live",
                )
            counts = moved.get(run_id)
            if counts is None:
                counts = moved[run_id] = Counter()
            counts[e.from_state] -= 1
            counts[to_state] += 1
            final[(run_id, e.item_id)] = to_state
            if to_state in SUCCESS_STATES and e.role == S.RECONCILER:
                raise _reconciler_success(e, run_id)
            continue
        if getattr(e, "role", None) == S.RECONCILER and getattr(e, "to_state", None) in (
            SUCCESS_STATES
        ):
            raise _reconciler_success(e, run_id)
        if kind is _RUN_MOVE:
            if e.to_state in (S.SUCCEEDED, S.COMPLETED_WITH_ERRORS):
                _check_success(tx, e, runs.get(run_id), moved.get(run_id), final)
            state[run_id] = e.to_state


# What check needs to know of an event's class, found once per class (isinstance on the
# eventsourcing ABCs and the str of a UUID were most of the check's time per event).
_CREATED, _SUBMITTED, _MOVES, _ITEM_MOVE, _RUN_MOVE = (
    "created",
    "submitted",
    "moves",
    "item move",
    "run move",
)
_KINDS: dict[type, str] = {}


def _kind(cls: type) -> str:
    if issubclass(cls, Run.Submitted):
        kind = _SUBMITTED
    elif issubclass(cls, CanInitAggregate):
        kind = _CREATED
    elif issubclass(cls, Item.Transitioned):
        kind = _ITEM_MOVE
    elif issubclass(cls, Run.Transitioned):
        kind = _RUN_MOVE
    else:
        kind = _MOVES
    _KINDS[cls] = kind
    return kind


def _refuse_after_end(e: Any, run_id: str, run_state: str) -> None:
    item_id = getattr(e, "item_id", None)
    if item_id is None:
        raise _refuse(
            "terminal_changed",
            run_id,
            f"run {run_id} is {run_state} (terminal) and would record {_describe(e)}",
        )
    raise _refuse(
        "item_after_end",
        run_id,
        f"item {item_id!r} would change ({_describe(e)}) after run {run_id} ended {run_state}",
    )


def _reconciler_success(e: Any, run_id: str) -> InvariantViolated:
    return _refuse(
        "reconciler_success",
        run_id,
        f"the reconciler {getattr(e, 'actor_id', '?')} would record {_describe(e)}; only "
        "the party that did the work records success",
    )


def _check_success(
    tx: Tx,
    e: Run.Transitioned,
    run: Run | None,
    moved: Counter[str] | None,
    final: dict[tuple[str, str], str],
) -> None:
    run_id = str(e.originator_id)
    if run is not None:
        counts = Counter(run.counts)
        counts.update(moved or {})
        open_ = {s: counts[s] for s in OPEN_ITEM_STATES if counts[s] > 0}
        if open_:
            raise _refuse(
                "success_unearned",
                run_id,
                f"run {run_id} would record {e.to_state} with work still open: "
                + ", ".join(f"{n} {s}" for s, n in open_.items()),
            )
    if e.to_state != S.SUCCEEDED:
        return
    rows = required_not_accepted(tx, run_id, 50)
    missing = [r for r in rows if final.get((run_id, r["item_id"]), r["state"]) != S.ACCEPTED]
    if missing:
        raise _refuse(
            "success_unearned",
            run_id,
            f"run {run_id} would record succeeded with required items not accepted: "
            + ", ".join(f"{r['item_id']} ({r['state']})" for r in missing[:5]),
        )
