"""An item's stream begins with its first transition (fewer bytes per item).

The run's `Submitted` event declares every item of the manifest; the item's own stream
starts at version 1 with the first thing that happens to it (a claim, a skip, a
rejection), with no `Registered` event and no hash row for one. Histories written
before, whose item streams begin with `Item.Registered`, still replay, verify and take
new work in the same ledger.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import Ledger
from ledger.core.domain import item_stream_id
from tests.histories.load import from_json, import_stored, stored_events
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest

REGISTERED = "ledger.domain:Item.Registered"
HISTORY = Path(__file__).parents[1] / "histories" / "flaky_success.json"


def _streams(lg: Ledger) -> dict[object, list[tuple[int, str]]]:
    """Every stored stream: [(version, topic), ...] in position order."""
    out: dict[object, list[tuple[int, str]]] = {}
    for _pos, se in stored_events(lg):
        out.setdefault(se.originator_id, []).append((se.originator_version, se.topic))
    return out


def test_a_claimed_item_stream_starts_with_the_claim(lg: Ledger, clock: ManualClock) -> None:
    run = lg.submit(manifest(3), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    [lease] = lg.claim(run, WORKER, limit=1)
    clock.advance(1)
    lg.accept(lease)
    lg.skip(run, "i2", OPERATOR, "not needed")
    streams = _streams(lg)
    assert not [t for s in streams.values() for _v, t in s if t == REGISTERED]
    claimed = streams[item_stream_id(run, lease.item_id)]
    assert [v for v, _t in claimed] == [1, 2]
    assert all(t == "ledger.domain:Item.Transitioned" for _v, t in claimed)
    assert [v for v, _t in streams[item_stream_id(run, "i2")]] == [1]
    # an item nothing has happened to has no stream at all
    untouched = ({"i0", "i1"} - {lease.item_id}).pop()
    assert item_stream_id(run, untouched) not in streams
    # the item's revision is its stream's version; its history starts at revision 1
    assert lg.item(run, lease.item_id).revision == 2
    assert [t.revision for t in lg.history(run) if t.item_id == lease.item_id] == [1, 2]
    report = lg.verify()
    assert report.ok, report.problems
    before = {i.item_id: i.to_dict() for i in lg.items(run)}
    lg.rebuild_projections()
    assert {i.item_id: i.to_dict() for i in lg.items(run)} == before


def test_one_event_and_one_hash_row_per_transition(lg: Ledger, clock: ManualClock) -> None:
    run = lg.submit(manifest(4), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    for lease in lg.claim(run, WORKER, limit=4):
        lg.accept(lease)
    lg.complete(run, CONTROLLER)
    events = list(stored_events(lg))
    transitions = lg.history(run)
    item_moves = [t for t in transitions if t.item_id is not None]
    run_events = [se for _p, se in events if str(se.originator_id) == run]
    assert len(item_moves) == 8  # a claim and an accept per item
    # the run's own stream, plus exactly one event per item transition
    assert len(events) == len(run_events) + len(item_moves)
    with lg.store.read() as tx:
        [row] = tx.fetchall(
            f"SELECT count(*) AS n FROM {lg.store.events_table()} WHERE hash IS NOT NULL",  # noqa: S608 (our own table name)
            (),
        )
    assert int(row["n"]) == len(events)


def test_an_old_history_with_registered_events_takes_new_work(
    lg: Ledger, clock: ManualClock
) -> None:
    saved = json.loads(HISTORY.read_text())
    old = [from_json(e) for e in saved["events"]]
    assert any(se.topic == REGISTERED for se in old)  # the history predates the change
    import_stored(lg, old)
    lg.rebuild_projections()
    run = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    for lease in lg.claim(run, WORKER, limit=2):
        lg.accept(lease)
    lg.complete(run, CONTROLLER)
    streams = _streams(lg)
    # the old item streams still begin with Registered, the new ones with the claim
    assert sum(1 for s in streams.values() if s[0][1] == REGISTERED) == sum(
        1 for se in old if se.topic == REGISTERED
    )
    assert streams[item_stream_id(run, "i1")][0] == (1, "ledger.domain:Item.Transitioned")
    report = lg.verify()
    assert report.ok, report.problems
    statuses = {r.run_id: r.to_dict() for r in lg.runs(limit=100)}
    lg.rebuild_projections()
    assert {r.run_id: r.to_dict() for r in lg.runs(limit=100)} == statuses
    assert lg.status(run).state == "succeeded"


@settings(max_examples=300, deadline=None)
@given(st.uuids(), st.text())
def test_an_item_stream_id_is_uuid5_of_the_item_in_the_run_namespace(run: Any, item: str) -> None:
    """The stream id every process derives for an item (and saved histories carry) is
    exactly `uuid.uuid5(run id, item id)`, however it is computed."""
    import uuid

    try:
        expected = uuid.uuid5(run, item)
    except UnicodeEncodeError:  # a lone surrogate: neither can name such an item
        with pytest.raises(UnicodeEncodeError):
            item_stream_id(str(run), item)
        return
    assert item_stream_id(str(run), item) == expected
    assert item_stream_id(str(run), item).version == 5
