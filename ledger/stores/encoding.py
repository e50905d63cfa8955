"""The ledger's own events to and from their stored bytes, with orjson.

The bytes are exactly the ones eventsourcing's `JSONTranscoder` (as `make_mapper` sets
it up: compact separators, UTF-8 unescaped, `{"_type_": ..., "_data_": ...}` wrappers
for datetimes, UUIDs and decimals) writes for the same event: the event's attributes
in their order, less its originator id and version, the timestamp wrapped as
`datetime_iso`. So the format is unchanged, the events stored before read and verify
as they did, and an event's hash is the same whichever of the two encoded it. What
changes is the cost: one `orjson.dumps` of the attributes instead of the standard
library's encoder calling back into Python for the timestamp (an item transition,
about 420 bytes: 2.5 us against 8 us on the bench machine; `scripts/bench_encoding.py`
measures orjson, msgspec and the transcoder on the ledger's own events).

Where orjson would write other bytes than the transcoder, the event goes through the
transcoder instead (`EventMapper.to_stored_event`), so the bytes never depend on
which path wrote them:
- a datetime, date, time, decimal, dataclass or subclass of a JSON type anywhere
  inside the state, a non-string key, an integer beyond 64 bits (orjson refuses
  these and the transcoder writes its own form, or raises as before);
- a float orjson formats otherwise: from 1e-5 to 1e-9 in magnitude it writes
  `0.000015` and `2.5e-7` where Python writes `1.5e-05` and `2.5e-07` (every other
  finite float is formatted alike; `tests/stores/test_encoding.py` checks this over
  the whole range). The output is searched for `e-` and `0.0000` first (a memory
  search), and only then, when the state holds a float, by a pattern, so a state
  holding neither costs nothing more;
- NaN or an infinity (the transcoder writes `NaN` and `Infinity`, orjson `null`), as
  events stored before the input checks refused them hold: looked for in the state
  only when the output holds a `null`.
One value neither path is meant to meet stays out: a UUID object below the top level
(the transcoder wraps it, orjson writes its text). The ledger's input checks admit
plain JSON only (`ledger/core/validation.py` `plain_json`), and the service puts
strings, integers and plain JSON into events.

Decoding reads any stored event: one of the ledger's event classes whose state holds
no wrapper but the timestamp's is parsed by `orjson.loads` and built as the mapper
builds it (the same attributes, the same types, the same order); anything else
(another topic, a nested wrapper, a class version, an integer beyond 64 bits, which
orjson reads as a float, JSON orjson refuses such as NaN or a lone surrogate escape)
goes through the mapper, as every event did before.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from datetime import datetime
from typing import Any, cast
from uuid import UUID

import orjson
from eventsourcing.domain import DomainEvent, DomainEventProtocol
from eventsourcing.persistence import Mapper, StoredEvent, find_id_convertor

from ledger.core.recorded import TRANSITION_COLUMNS

# orjson's forms of the floats it formats otherwise than Python (see the docstring)
_FLOAT_FORMS = re.compile(rb"[0-9]e-[0-9](?![0-9])|(?<![0-9.])0\.0000[0-9]")
_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
_TYPE_KEY = b'"_type_"'
# orjson reads an integer beyond 64 bits as a float (the transcoder as an int): a state
# holding a run of 19 digits (in a number or a string) is read by the transcoder
_DIGITS_AS_ZERO = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_RUN = b"0" * 19
DATETIME_ISO = "datetime_iso"


class _NotPlain(TypeError):
    """A value the transcoder writes in its own form (or refuses)."""


def _not_plain(value: Any) -> Any:
    raise _NotPlain(type(value).__name__)


def _floats(value: Any) -> tuple[bool, bool]:
    """Whether `value` holds a float anywhere, and whether one of them is a NaN or an
    infinity (orjson writes `null` for those, the transcoder `NaN` or `Infinity`). Walked
    only when the output holds `null`, `e-` or `0.0000`: a state without floats is written
    alike by both, whatever its text holds (a run id's `4f6e-b461`, a time's
    `:00.00001`), and the float pattern is searched only when a float is there (it
    cost 16 us on a 400-byte state, more than the rest of the encoding)."""
    stack = [value]
    found = False
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            stack.extend(v.values())
        elif t is list or t is tuple:
            stack.extend(v)
        elif t is float:
            if v - v != 0.0:  # inf - inf and nan - nan are nan
                return True, True
            found = True
    return found, False


def own_event_classes() -> dict[str, type[DomainEvent]]:
    """The ledger's own event classes by stored topic (importing them registers the
    topics the mapper resolves)."""
    from ledger.core.archived import ARCHIVED_TOPIC, Archived
    from ledger.core.domain import Item, Run

    out: dict[str, type[DomainEvent]] = {ARCHIVED_TOPIC: Archived}
    for aggregate in (Run, Item):
        for value in vars(aggregate).values():
            if isinstance(value, type) and issubclass(value, DomainEvent):
                out[cast(str, getattr(value, "TOPIC"))] = value  # noqa: B009 (set by _pin_topics)
    # a class with a class version > 1 has its version stored and upcasters to run: the mapper's
    return {t: c for t, c in out.items() if getattr(c, "class_version", 1) == 1}


def plain_state(data: Any) -> dict[str, Any] | None:
    """A stored state the way orjson reads it, when that is exactly what the mapper reads
    (see the module docstring): a JSON object whose only wrapper is its timestamp's
    (`{"_type_": "datetime_iso", "_data_": text}`, left as it is), without a class
    version or an integer beyond 64 bits. None for anything else, which goes through
    the mapper. The event's decoding here and a rebuild's fold of item events
    (ledger/projections/fold.py) both read states through this one test."""
    if (
        type(data) is not bytes
        or data.count(_TYPE_KEY) != 1
        or _LONG_RUN in data.translate(_DIGITS_AS_ZERO)
    ):
        return None
    try:
        state = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    stamp = state.get("timestamp") if type(state) is dict else None
    if (
        type(stamp) is not dict
        or len(stamp) != 2
        or stamp.get("_type_") != DATETIME_ISO
        or type(stamp.get("_data_")) is not str
        or "class_version" in state
    ):
        return None
    return cast(dict[str, Any], state)


# `Item.Transitioned` (ledger/core/domain.py): its topic, its fields in their order, and
# those that are text
_ITEM_MOVE_TOPIC = "ledger.domain:Item.Transitioned"
_ITEM_MOVE_FIELDS = (
    "originator_id",
    "originator_version",
    "timestamp",
    "run_id",
    "item_id",
    "command",
    "from_state",
    "to_state",
    "actor_id",
    "role",
    "reason",
    "evidence",
)
# the columns the log keeps of a transition, but its time (the timestamp)
_ITEM_MOVE_TEXT = tuple(c for c in TRANSITION_COLUMNS if c != "at")


def stored_event(originator_id: Any, version: Any, topic: str, state: bytes) -> StoredEvent:
    """A `StoredEvent` with these fields, set as one dict, as the mapper sets the events it
    reads (the frozen dataclass's `__init__` sets each field through `object.__setattr__`:
    3x the time, a microsecond of an item transition's encoding and a few percent of a
    rebuild's client time)."""
    stored = object.__new__(StoredEvent)
    object.__setattr__(
        stored,
        "__dict__",
        {
            "originator_id": originator_id,
            "originator_version": version,
            "topic": topic,
            "state": state,
        },
    )
    return stored


class EventMapper(Mapper[UUID]):
    """eventsourcing's `Mapper` for the ledger's events, encoding and decoding the ledger's
    own event classes with orjson to and from the transcoder's very bytes (see the module
    docstring); any other event, and any state orjson would write otherwise, goes through
    the transcoder."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._classes = own_event_classes()
        self._topics: dict[type[Any], str] = {c: t for t, c in self._classes.items()}
        # one transaction's events mostly share one timestamp object: its text once
        self._last_stamp: tuple[datetime, str] | None = None
        if self.compressor is not None or self.cipher is not None:
            self._classes, self._topics = {}, {}
        self._item_move = self._classes.get(_ITEM_MOVE_TOPIC)

    def reads_plain(self, topic: str) -> bool:
        """Whether events of `topic` are read here as plain JSON (`plain_state`): one of the
        ledger's own classes, without compression or a cipher."""
        return topic in self._classes

    def _iso(self, stamp: datetime) -> str:
        last = self._last_stamp
        if last is not None and last[0] is stamp:
            return last[1]
        text = stamp.isoformat()
        self._last_stamp = (stamp, text)
        return text

    def to_stored_event(self, domain_event: DomainEventProtocol[UUID]) -> StoredEvent:
        """The event as stored: its topic and its state's bytes (the transcoder's)."""
        cls = type(domain_event)
        topic = self._topics.get(cls)
        if topic is None:
            return super().to_stored_event(domain_event)
        if cls is self._item_move:
            stored = self._item_transition(topic, vars(domain_event))
            if stored is not None:
                return stored
        attrs = vars(domain_event)
        stored = self._dumped(topic, attrs)
        if stored is None:
            return super().to_stored_event(domain_event)
        data = stored.state
        if b"e-" in data or b"0.0000" in data or b"null" in data:
            floats, non_finite = _floats(attrs)
            if non_finite or (floats and _FLOAT_FORMS.search(data)):
                return super().to_stored_event(domain_event)
        return stored

    def _item_transition(self, topic: str, attrs: dict[str, Any]) -> StoredEvent | None:
        """An item transition as stored, the commands' most frequent event, when every
        attribute but its evidence is text (the reason may be None), in the fields' order,
        and its evidence holds no float: then orjson writes the transcoder's bytes (texts
        are written alike; only floats and what orjson refuses differ, and it raises on
        the latter) without the memory searches of the general path. None: the general
        path decides (a state read back from storage, whose ids come last, goes there)."""
        if tuple(attrs) != _ITEM_MOVE_FIELDS:
            return None
        reason, evidence = attrs["reason"], attrs["evidence"]
        if (reason is not None and type(reason) is not str) or type(evidence) is not dict:
            return None
        for key in _ITEM_MOVE_TEXT:
            if type(attrs[key]) is not str:
                return None
        if _floats(evidence)[0]:
            return None
        return self._dumped(topic, attrs)

    def _dumped(self, topic: str, attrs: dict[str, Any]) -> StoredEvent | None:
        """The event of `attrs` as orjson writes its state, its time in the transcoder's
        form for a datetime; None where its time is no datetime or orjson refuses the
        state (the transcoder decides). Its floats are the caller's to check."""
        stamp = attrs.get("timestamp")
        if type(stamp) is not datetime:
            return None
        state = dict(attrs)
        originator_id = state.pop("originator_id")
        originator_version = state.pop("originator_version")
        state["timestamp"] = {"_type_": DATETIME_ISO, "_data_": self._iso(stamp)}
        try:
            data = orjson.dumps(state, _not_plain, _OPTIONS)
        except TypeError:  # _NotPlain, a non-string key, a too big integer, too deep
            return None
        return stored_event(originator_id, originator_version, topic, data)

    def to_domain_event(self, stored_event: StoredEvent) -> DomainEventProtocol[UUID]:
        """The stored event as its event object, as the mapper builds it."""
        cls = self._classes.get(stored_event.topic)
        state = None if cls is None else plain_state(stored_event.state)
        if cls is None or state is None:
            return super().to_domain_event(stored_event)
        state["timestamp"] = datetime.fromisoformat(state["timestamp"]["_data_"])
        originator_id = stored_event.originator_id
        if type(originator_id) is not UUID:
            originator_id = find_id_convertor(cls, cast(Hashable, type(originator_id)))(
                originator_id
            )
        state["originator_id"] = originator_id
        state["originator_version"] = stored_event.originator_version
        event = object.__new__(cls)
        object.__setattr__(event, "__dict__", state)
        return cast(DomainEventProtocol[UUID], event)


__all__ = ["DATETIME_ISO", "EventMapper", "own_event_classes", "plain_state"]
