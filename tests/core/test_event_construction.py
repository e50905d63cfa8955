"""Item transitions build their events without the dataclass's `__init__`
(`domain.next_event`): the events, their stored bytes and the item after them must be
those eventsourcing's `trigger_event` gives for the same transitions."""

from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.core import states as S
from ledger.core.domain import ITEM_FIELDS, Item
from ledger.stores.base import make_generic_mapper, make_mapper

# JSON as evidence may hold it, with the texts and numbers the encoder treats apart
# (an `e-` or `0.0000` in a text, small floats, nulls)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1.5e-05, 2.5e-07, 0.00001, 1e-9])
    | st.text(max_size=12)
    | st.sampled_from(["4f6e-b461", "x 0.00001 y", "null"])
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_extra = st.dictionaries(st.sampled_from(["note", "stage", "evidence", "x"]), _json, max_size=3)


@st.composite
def _walks(draw: Any) -> list[tuple[str, str, str, str, dict[str, Any]]]:
    """A walk of item transitions the rule book allows, from pending."""
    state, attempt, out = S.PENDING, 0, []
    for _ in range(draw(st.integers(1, 6))):
        if state in (S.PENDING, S.RETRYABLE):
            attempt += 1
            ev = {"lease_token": uuid.uuid4().hex, "attempt": attempt, "expires_at": "t"}
            out.append(("claim", S.IN_PROGRESS, "worker-1", S.WORKER, ev))
            state = S.IN_PROGRESS
        elif state == S.IN_PROGRESS:
            command, to = draw(
                st.sampled_from(
                    [
                        ("accept", S.ACCEPTED),
                        ("reject", S.REJECTED),
                        ("fail_attempt", S.RETRYABLE),
                        ("fail_attempt", S.QUARANTINED),
                    ]
                )
            )
            ev = {"lease_token": "t", "rule": "r", "error": draw(st.text(max_size=8))}
            if to == S.RETRYABLE:
                ev["eligible_at"] = "2026-01-01T00:00:00.000000+00:00"
            out.append((command, to, "worker-1", S.WORKER, ev))
            state = to
        else:
            break
    return [(c, to, a, r, {**ev, **draw(_extra)}) for c, to, a, r, ev in out]


def _by_library(item: Item, move: tuple[Any, ...], reason: Any, at: datetime) -> None:
    command, to_state, actor, role, evidence = move
    item.trigger_event(
        Item.Transitioned,
        run_id=item.run_id,
        item_id=item.item_id,
        command=command,
        from_state=item.state,
        to_state=to_state,
        actor_id=actor,
        role=role,
        reason=reason,
        evidence=evidence,
        timestamp=at,
    )


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_item_events_equal_the_librarys_in_attributes_bytes_and_effect(data: Any) -> None:
    run_id = str(uuid.uuid4())
    start = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    ours = Item.begin(run_id, data.draw(st.text(min_size=1, max_size=8)), start)
    theirs = copy.deepcopy(ours)
    for k, move in enumerate(data.draw(_walks())):
        at = start + timedelta(seconds=k)
        reason = data.draw(st.none() | st.text(max_size=10))
        command, to_state, actor, role, evidence = move
        ours.transition(
            command, to_state, actor, role, reason, copy.deepcopy(evidence), at, S.RUNNING
        )
        _by_library(theirs, move, reason, at)
    mine, reference = ours.collect_events(), theirs.collect_events()
    assert len(mine) == len(reference)
    for a, b in zip(mine, reference, strict=True):
        assert type(a) is type(b)
        assert list(vars(a).items()) == list(vars(b).items())
        assert [type(v) for v in vars(a).values()] == [type(v) for v in vars(b).values()]
        # the ledger's encoder and the library's transcoder store the very same bytes
        stored = make_mapper().to_stored_event(a)
        assert stored == make_generic_mapper().to_stored_event(b)
        assert stored == make_mapper().to_stored_event(b)
    assert (ours.version, ours.modified_on) == (theirs.version, theirs.modified_on)
    for name in (*ITEM_FIELDS, "lease_started_on", "ended_leases"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_the_encoders_item_transition_fields_are_the_events() -> None:
    """The encoder's shortcut for item transitions names the event's fields in order."""
    import dataclasses

    from ledger.stores import encoding

    assert getattr(Item.Transitioned, "TOPIC") == encoding._ITEM_MOVE_TOPIC  # noqa: B009
    fields = tuple(f.name for f in dataclasses.fields(Item.Transitioned))
    assert fields == encoding._ITEM_MOVE_FIELDS
    assert set(encoding._ITEM_MOVE_TEXT) < set(fields)
