"""Replay saved histories: events stored by earlier code must still load and project
to what the ledger showed when they were written.

tests/histories/*.json were written by scripts/make_histories.py: the stored events
(topic, state as JSON, originator id and version) and, for every run, the status,
items, attempts and history the ledger showed. Each file is loaded into a fresh
store of every kind (insert the stored events, then rebuild the projections) and
must show the same again.

How to evolve an event without breaking stored histories
--------------------------------------------------------
Stored events are never rewritten. When an event class must change (a field
added, renamed or given a new meaning):

1. Give the class ``class_version = 2`` (the next number) and change its fields.
   New events are stored with ``"class_version": 2`` in their state.
2. Add ``@staticmethod def upcast_v1_v2(state: dict) -> None`` to the class,
   editing the stored state of a version-1 event in place into a valid version-2
   state (e.g. ``state["severity"] = "info"`` for a new field). eventsourcing's
   mapper calls ``upcast_v1_v2``, ``upcast_v2_v3``... on every older event as it
   is read, before the event object is built, so aggregates, projections,
   rebuilds, ``status_at`` and ``verify`` only ever see the newest shape.
3. Keep the old files in tests/histories/ unchanged: this test proves the
   upcaster works on real old events. Add a new history for the new shape
   (``python scripts/make_histories.py NAME``).
4. Never rename or move an event class without keeping its old topic importable
   (stored events name it): register the old topic with
   ``eventsourcing.utils.register_topic`` instead.

The hash chain is over the stored bytes, so upcasting (done on read) never
breaks it. ``test_an_upcaster_loads_an_old_version_event`` shows the pattern with
a test-only event class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic

from ledger import Ledger
from tests.histories.load import from_json, import_stored

HISTORIES = sorted((Path(__file__).parents[1] / "histories").glob("*.json"))


def test_there_are_saved_histories() -> None:
    assert len(HISTORIES) >= 5
    names = {p.stem for p in HISTORIES}
    assert {
        "flaky_success",
        "cancel_in_flight",
        "review_and_amend",
        "partial_delivery_and_repairs",
        "reconciler",
    } <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
def test_saved_history_projects_as_it_did(lg: Ledger, path: Path) -> None:
    saved = json.loads(path.read_text())
    events = [from_json(e) for e in saved["events"]]
    assert import_stored(lg, events) == len(events)
    assert lg.rebuild_projections() == len(events)
    assert {r.run_id for r in lg.runs(limit=10_000)} == set(saved["runs"])
    for run_id, shown in saved["runs"].items():
        status = lg.status(run_id).to_dict()
        # every field the history saved, as saved (fields added since, such as the delay
        # signals of rule 19 of the rule book, depend on the clock and are tested on their own)
        assert {key: status[key] for key in shown["status"]} == shown["status"], run_id
        assert [i.to_dict() for i in lg.items(run_id)] == shown["items"], run_id
        assert [a.to_dict() for a in lg.attempts(run_id)] == shown["attempts"], run_id
        assert [t.to_dict() for t in lg.history(run_id)] == shown["history"], run_id
    report = lg.verify()
    assert report.ok, report.problems


# --------------------------------------------------------------------------
# upcasting an old event version
# --------------------------------------------------------------------------
class Note(Aggregate):
    """A test-only aggregate whose event gained a field in version 2."""

    class Written(Aggregate.Created):
        text: str

    class Flagged(Aggregate.Event):
        # v1 had only `text`; v2 adds `severity` (old events were all informational)
        class_version = 2
        text: str
        severity: str

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["severity"] = "info"

        def apply(self, note: Any) -> None:
            note.flags.append((self.text, self.severity))

    def __init__(self, text: str) -> None:
        self.text = text
        self.flags: list[tuple[str, str]] = []

    def flag(self, text: str, severity: str) -> None:
        self.trigger_event(self.Flagged, text=text, severity=severity)


def test_an_upcaster_loads_an_old_version_event(lg: Ledger) -> None:
    note = Note(text="hello")
    note.flag("new style", "warning")
    created, flagged_v2 = note.collect_events()
    with lg.store.write() as tx:
        tx.append([created])
        # a version-1 Flagged event as older code stored it: no severity, no class_version
        v1_state = json.dumps(
            {
                "timestamp": {"_type_": "datetime_iso", "_data_": created.timestamp.isoformat()},
                "text": "old style",
            },
            separators=(",", ":"),
        ).encode()
        tx.insert_stored_events(
            [
                StoredEvent(
                    originator_id=note.id,
                    originator_version=2,
                    topic=get_topic(Note.Flagged),
                    state=v1_state,
                )
            ]
        )
    with lg.store.write() as tx:
        stored_v2 = lg.store.mapper.to_stored_event(
            Note.Flagged(
                originator_id=note.id,
                originator_version=3,
                timestamp=flagged_v2.timestamp,
                text="new style",
                severity="warning",
            )
        )
        tx.insert_stored_events([stored_v2])
    assert json.loads(stored_v2.state)["class_version"] == 2
    events = [e for _p, e in lg.store.read_events(0, 100) if e.originator_id == note.id]
    old, new = events[1], events[2]
    assert isinstance(old, Note.Flagged) and old.severity == "info" and old.text == "old style"
    assert isinstance(new, Note.Flagged) and new.severity == "warning"
    rebuilt: Note | None = None
    for e in events:
        rebuilt = e.mutate(rebuilt)  # type: ignore[attr-defined]
    assert rebuilt is not None and rebuilt.flags == [
        ("old style", "info"),
        ("new style", "warning"),
    ]
    assert rebuilt.version == 3 and rebuilt.text == "hello"
