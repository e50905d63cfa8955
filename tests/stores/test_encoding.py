"""The ledger's events are written by orjson, byte for byte as eventsourcing's JSON
transcoder writes them, and read back to the objects the transcoder's mapper builds.

The stored bytes are what the hash chain and the Merkle leaves cover, so the two
encoders must agree on every event the ledger can store: the same bytes mean the same
hashes, so histories stored before keep verifying with the same heads, and an event's
bytes never depend on which path wrote them.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import Mapper, StoredEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import Ledger
from ledger.core.archived import Archived
from ledger.core.domain import Item, Run
from ledger.stores.base import make_generic_mapper, make_mapper
from ledger.stores.encoding import EventMapper
from tests.histories.load import from_json

HISTORIES = sorted((Path(__file__).parents[1] / "histories").glob("*.json"))

FAST = make_mapper()
GENERIC = make_generic_mapper()


def same_object(a: Any, b: Any) -> None:
    """Two decoded events are the same: class, attributes, their order and types."""
    assert type(a) is type(b)
    assert list(vars(a)) == list(vars(b))
    assert vars(a) == vars(b)
    assert repr(vars(a)) == repr(vars(b))  # 1 == 1.0 == True: the types too


def round_trip(event: DomainEvent) -> StoredEvent:
    """The event's stored form by both mappers, equal; each reads it back alike."""
    fast, generic = FAST.to_stored_event(event), GENERIC.to_stored_event(event)
    assert fast.state == generic.state
    assert fast == generic
    same_object(FAST.to_domain_event(fast), GENERIC.to_domain_event(fast))
    back = vars(FAST.to_domain_event(fast))
    assert repr(sorted(back.items())) == repr(sorted(vars(event).items()))
    return fast


# JSON as the input checks admit it: finite floats of every magnitude, any text
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=["Cs"]))
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(), json_values, max_size=5)
texts = st.text(st.characters(blacklist_categories=["Cs"]))
stamps = st.datetimes(
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), None])
).map(lambda d: d.replace(fold=0))  # isoformat does not keep the fold


def item_transition(evidence: dict[str, Any], reason: str | None, at: datetime) -> DomainEvent:
    return Item.Transitioned(
        originator_id=uuid4(),
        originator_version=3,
        timestamp=at,
        run_id=str(uuid4()),
        item_id="i-1",
        command="accept",
        from_state="in_progress",
        to_state="succeeded",
        actor_id="w1",
        role="worker",
        reason=reason,
        evidence=evidence,
    )


def test_the_store_mapper_is_the_orjson_one() -> None:
    assert isinstance(FAST, EventMapper)
    with Ledger.open("memory://") as lg:
        assert isinstance(lg.store.mapper, EventMapper)


@settings(max_examples=300, deadline=None)
@given(evidence=json_objects, reason=st.none() | texts, at=stamps)
def test_item_transitions_are_stored_as_the_transcoder_stores_them(
    evidence: dict[str, Any], reason: str | None, at: datetime
) -> None:
    round_trip(item_transition(evidence, reason, at))


@settings(max_examples=100, deadline=None)
@given(
    manifest=json_objects,
    policy=st.none() | json_objects,
    added=st.lists(json_objects, max_size=3),
    row=json_objects,
    text=texts,
)
def test_every_event_class_is_stored_as_the_transcoder_stores_it(
    manifest: dict[str, Any],
    policy: dict[str, Any] | None,
    added: list[dict[str, Any]],
    row: dict[str, Any],
    text: str,
) -> None:
    at, oid = datetime(2026, 12, 3, 9, 0, tzinfo=UTC), uuid4()
    common: dict[str, Any] = {"originator_id": oid, "originator_version": 1, "timestamp": at}
    events: list[DomainEvent] = [
        Run.Submitted(
            **common,
            originator_topic="ledger.domain:Run",
            run_id=str(oid),
            command="submit",
            manifest=manifest,
            input_version="sha256:" + text,
            actor_id="sam",
            role="submitter",
            reason=text,
            links=[{"run_id": str(oid), "kind": text}],
            root_run_id=str(oid),
        ),
        Run.Transitioned(
            **common,
            command="start",
            from_state="queued",
            to_state="running",
            actor_id="ctl",
            role="controller",
            reason=None,
            evidence=manifest,
        ),
        Run.Amended(
            **common,
            actor_id="sam",
            role="submitter",
            reason=text,
            added=added,
            replaced=[],
            withdraw=[text],
            policy=policy,
            input_version="v2",
            state="running",
        ),
        Item.Registered(
            **common, originator_topic="ledger.domain:Item", run_id=str(oid), item_id=text
        ),
        Item.LeaseExtended(
            **common,
            run_id=str(oid),
            item_id=text,
            token="t",  # noqa: S106 (a lease token, not a password)
            expires_at=text,
            actor_id="w",
        ),
        Archived(
            **common,
            run_id=str(oid),
            head_hash="ab" * 32,
            events=12,
            streams=3,
            streams_digest="cd" * 16,
            archive=text,
            archive_sha256="ef" * 32,
            archive_digest="01" * 16,
            row=row,
            actor_id="ops",
            role="operator",
            reason=None,
        ),
    ]
    for event in events:
        stored = round_trip(event)
        assert stored.topic == type(event).TOPIC  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "value",
    [1.5e-05, -2.5e-07, 1e-09, 9.99e-06, 1e-10, 1e-4, 1e16, 1.5e300, 5e-324, -0.0, 0.1, 2**64 - 1],
)
def test_numbers_orjson_writes_otherwise_are_stored_as_the_transcoder_writes_them(
    value: float,
) -> None:
    at = datetime(2026, 12, 3, tzinfo=UTC)
    stored = round_trip(item_transition({"x": value, "in": [value, {"y": value}]}, None, at))
    assert json.loads(stored.state)["evidence"]["x"] == value


def test_floats_are_formatted_as_python_formats_them_across_the_whole_range() -> None:
    """Every binary exponent, a few mantissas each: the bytes stored are the transcoder's."""
    at = datetime(2026, 12, 3, tzinfo=UTC)
    values = [
        math.ldexp(m, e) for e in range(-1074, 1024) for m in (0.5, 0.6180339887, 0.75, 0.999)
    ]
    for chunk in range(0, len(values), 64):
        round_trip(item_transition({"v": values[chunk : chunk + 64]}, None, at))


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        Decimal("1.10"),
        {"when": datetime(2026, 1, 2, tzinfo=UTC)},
        {1: "an integer key"},
        2**64,
        -(2**63) - 1,
        [10**30, -(10**19)],
        "a string holding 1e-7 and 0.00001",
        float("nan"),
        [None, {"x": float("inf")}],
        (1.0, float("-inf")),
        "_type_",
    ],
)
def test_values_beyond_plain_json_go_through_the_transcoder(value: Any) -> None:
    """What orjson refuses or writes otherwise (nested datetimes and decimals, integer
    keys, integers beyond 64 bits, NaN and infinities, as events stored before the input
    checks held them) is stored in the transcoder's own form."""
    event = item_transition({"v": value}, None, datetime(2026, 12, 3, tzinfo=UTC))
    fast, generic = FAST.to_stored_event(event), GENERIC.to_stored_event(event)
    assert fast == generic
    same_object(FAST.to_domain_event(fast), GENERIC.to_domain_event(fast))


def test_other_events_and_versions_go_through_the_transcoder() -> None:
    """A class not the ledger's, and stored states the fast reader does not take (a
    nested wrapper, NaN, a class version, a lone surrogate escape), read as before."""
    at = datetime(2026, 12, 3, tzinfo=UTC)
    oid = uuid4()
    event = Run.Transitioned(
        originator_id=oid,
        originator_version=2,
        timestamp=at,
        command="start",
        from_state="queued",
        to_state="running",
        actor_id="ctl",
        role="controller",
        reason=None,
        evidence={},
    )
    base = json.loads(GENERIC.to_stored_event(event).state)
    states = [
        {**base, "evidence": {"at": {"_type_": "datetime_iso", "_data_": at.isoformat()}}},
        {**base, "evidence": {"id": {"_type_": "uuid_hex", "_data_": oid.hex}}},
        {**base, "evidence": {"n": float("nan")}},
        {**base, "reason": "\ud800"},
    ]
    for state in states:
        data = json.dumps(state, separators=(",", ":")).encode()  # ASCII: \ud800 escaped
        stored = StoredEvent(oid, 2, "ledger.domain:Run.Transitioned", data)
        fast, generic = FAST.to_domain_event(stored), GENERIC.to_domain_event(stored)
        assert vars(fast).keys() == vars(generic).keys()
        assert repr(vars(fast)) == repr(vars(generic))
    other = StoredEvent(oid, 1, "tests.stores.test_encoding:Nothing", b"{}")
    with pytest.raises(Exception, match="Nothing"):
        FAST.to_domain_event(other)


def test_an_originator_id_stored_as_text_reads_as_a_uuid() -> None:
    event = item_transition({}, None, datetime(2026, 12, 3, tzinfo=UTC))
    stored = FAST.to_stored_event(event)
    as_text = StoredEvent(
        str(stored.originator_id), stored.originator_version, stored.topic, stored.state
    )
    same_object(FAST.to_domain_event(as_text), GENERIC.to_domain_event(as_text))
    assert isinstance(FAST.to_domain_event(as_text).originator_id, UUID)


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
def test_saved_histories_read_alike_and_encode_to_their_stored_bytes(path: Path) -> None:
    """Every saved event reads back to the transcoder's object, and writing that object
    again gives the very bytes stored (so the same hashes and heads)."""
    saved = json.loads(path.read_text())
    for doc in saved["events"]:
        stored = from_json(doc)
        fast, generic = FAST.to_domain_event(stored), GENERIC.to_domain_event(stored)
        same_object(fast, generic)
        assert FAST.to_stored_event(fast).state == stored.state


def test_a_mapper_with_a_cipher_or_compressor_leaves_the_events_to_the_transcoder() -> None:
    import zlib

    class Zlib:
        def compress(self, data: bytes) -> bytes:
            return zlib.compress(data)

        def decompress(self, data: bytes) -> bytes:
            return zlib.decompress(data)

    fast = EventMapper(transcoder=GENERIC.transcoder, compressor=Zlib())
    generic = Mapper(transcoder=GENERIC.transcoder, compressor=Zlib())
    event = item_transition({"a": 1}, None, datetime(2026, 12, 3, tzinfo=UTC))
    assert fast.to_stored_event(event) == generic.to_stored_event(event)


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
def test_a_saved_history_written_again_by_the_ledger_has_the_same_heads(
    lg: Ledger, path: Path
) -> None:
    """The saved events, read back and appended again through the store (the orjson
    encoder, the hash chain), give the heads digest of the history imported as stored."""
    from tests.histories.load import import_stored

    stored = [from_json(doc) for doc in json.loads(path.read_text())["events"]]
    with Ledger.open("memory://") as imported:
        import_stored(imported, stored)
        imported.rebuild_projections()
        expected = imported.verify()
    assert expected.ok, expected.problems
    for se in stored:
        with lg.store.write() as tx:
            tx.append([GENERIC.to_domain_event(se)])
    lg.rebuild_projections()
    report = lg.verify()
    assert report.ok, report.problems
    assert report.heads == expected.heads
