"""What each event records as a transition: the typed columns on its row of the event log
and the reason and evidence an audit shows, defined once for the writers and the reads.

A transition is an event of a run or an item that moves it (or amends a run in place):
`Run.Submitted`, `Run.Transitioned`, `Run.Amended`, `Item.Transitioned`. Its row of the
event log carries `TRANSITION_COLUMNS`, written in the same INSERT as the event
(ledger/stores/), which `audit`, `history`, the change feed and the signals filter and
order on (the view `lg_transitions` shows them with the position and revision). Every
other event (`Item.Registered`, `Item.LeaseExtended`, webhook events, `Archived`) leaves
them NULL. The reason and evidence are not repeated there: they are read from the
event's own state when a reader asks (`reason_and_evidence`, lazily for the feed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson
from eventsourcing.domain import DomainEvent

from ledger.core.domain import Item, Run
from ledger.core.rows import iso
from ledger.core.states import NEW, QUEUED

# in the order of the events table's columns and of `columns`' tuples
TRANSITION_COLUMNS = (
    "run_id",
    "item_id",
    "command",
    "from_state",
    "to_state",
    "actor_id",
    "role",
    "at",
)

_SUBMITTED: str = getattr(Run.Submitted, "TOPIC")  # noqa: B009 (set by domain._pin_topics)
_AMENDED: str = getattr(Run.Amended, "TOPIC")  # noqa: B009
# the topics of the events that are transitions (the others' columns stay NULL)
TRANSITION_TOPICS = frozenset(
    (
        _SUBMITTED,
        _AMENDED,
        getattr(Run.Transitioned, "TOPIC"),  # noqa: B009
        getattr(Item.Transitioned, "TOPIC"),  # noqa: B009
    )
)
# an amendment keeps the run's state: it is recorded as this command, from and to that state
AMEND = "amend"


def columns(e: DomainEvent) -> tuple[str | None, ...] | None:
    """The event's transition columns (`TRANSITION_COLUMNS`' order); None for an event
    that is no transition."""
    if isinstance(e, Item.Transitioned):
        return item_columns(vars(e), iso(e.timestamp))
    if isinstance(e, Run.Transitioned):
        run_id = str(e.originator_id)
        return (
            run_id,
            None,
            e.command,
            e.from_state,
            e.to_state,
            e.actor_id,
            e.role,
            iso(e.timestamp),
        )
    if isinstance(e, Run.Submitted):
        return (e.run_id, None, e.command, NEW, QUEUED, e.actor_id, e.role, iso(e.timestamp))
    if isinstance(e, Run.Amended):
        run_id = str(e.originator_id)
        return (run_id, None, AMEND, e.state, e.state, e.actor_id, e.role, iso(e.timestamp))
    return None


def item_columns(attrs: Mapping[str, Any], at: str | None) -> tuple[str | None, ...]:
    """An item transition's columns from its attributes (the event's, or its stored state
    decoded: a rebuild's fold, ledger/projections/fold.py) and its time as row text."""
    return (
        attrs["run_id"],
        attrs["item_id"],
        attrs["command"],
        attrs["from_state"],
        attrs["to_state"],
        attrs["actor_id"],
        attrs["role"],
        at,
    )


def reason_and_evidence(topic: str, attrs: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A transition's reason and evidence from its event's attributes (the stored state,
    decoded): a move's own evidence; for a submit, the input version, the links and the
    number of items; for an amendment, the input version, the ids added, replaced and
    withdrawn, and the policy (each the keys in sorted order, as audits always showed them)."""
    if topic == _SUBMITTED:
        return attrs.get("reason"), {
            "input_version": attrs["input_version"],
            "items": len(attrs["manifest"]["items"]),
            "links": attrs["links"],
        }
    if topic == _AMENDED:
        return attrs.get("reason"), {
            "added": [it["item_id"] for it in attrs["added"]],
            "input_version": attrs["input_version"],
            "policy": attrs["policy"],
            "replaced": [it["item_id"] for it in attrs["replaced"]],
            "withdraw": attrs["withdraw"],
        }
    return attrs.get("reason"), attrs["evidence"]


def decode_recorded(raw: tuple[str, bytes | str]) -> tuple[Any, dict[str, Any]]:
    """`reason_and_evidence` of a stored event given as (topic, state): its bytes, or
    their text (`lg_transitions` on PostgreSQL reads the state as text)."""
    topic, state = raw
    try:
        attrs = orjson.loads(state)
    except orjson.JSONDecodeError:  # NaN or Infinity in an event stored before the checks
        attrs = json.loads(state)
    return reason_and_evidence(topic, attrs)
