"""Payloads as of the event: `events(..., payloads=True)`, `Follower(..., payloads=True)`
and `GET /events?payloads=true` give each item transition its item's payload as it
stood at that transition (the manifest's, after the amendments before it, none after),
so a follower's read model rebuilt from position 0 equals the one built live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ledger import InvalidInput, Ledger, Transition
from ledger.feed.follower import Follower
from ledger.http import add_token, create_app
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest, running

Step = tuple[str, str, str, Any]  # (item_id, command, to_state, payload)


def _amended_twice(lg: Ledger, after_each: Any = None) -> str:
    """A run whose i0 is amended twice between its attempts (payload n=0, then 10, then
    20), whose i3 is added by the first amendment, and whose i1 is replaced while still
    pending; `after_each()` runs after every command."""
    step = after_each or (lambda: None)
    run_id = lg.submit(manifest(3), SUBMITTER).run_id
    step()
    lg.start(run_id, CONTROLLER)
    step()
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    assert lease.item_id == "i0"
    step()
    lg.fail_attempt(lease, "boom", retryable=True)
    step()
    lg.amend(
        run_id,
        SUBMITTER,
        "fix i0, i1, add i3",
        items=[
            {"item_id": "i0", "payload": {"n": 10}},
            {"item_id": "i1", "payload": {"n": 11}},
            {"item_id": "i3", "payload": {"n": 3}},
        ],
    )
    step()
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    assert lease.item_id == "i0"
    step()
    lg.fail_attempt(lease, "boom again", retryable=True)
    step()
    lg.amend(run_id, SUBMITTER, "fix i0 again", items=[{"item_id": "i0", "payload": {"n": 20}}])
    step()
    for lease in lg.claim(run_id, WORKER, limit=10):
        lg.accept(lease)
        step()
    lg.complete(run_id, CONTROLLER)
    step()
    return run_id


def _expected(lg: Ledger, run_id: str) -> list[Step]:
    """The item transitions with the payload each was made under, from the amendments'
    positions (i0: 0 before the first, 10 before the second, 20 after)."""
    first, second = (t.position for t in lg.events(run_id=run_id, kinds="amend"))
    out: list[Step] = []
    for t in lg.events(run_id=run_id):
        if t.item_id is None:
            continue
        if t.item_id == "i0":
            n = 0 if t.position < first else 10 if t.position < second else 20
        else:
            n = {"i1": 11, "i2": 2, "i3": 3}[t.item_id]
            if t.item_id == "i1" and t.position < first:
                n = 1
        out.append((t.item_id, t.command, t.to_state, {"n": n}))
    return out


def _steps(found: list[Transition]) -> list[Step]:
    return [(t.item_id, t.command, t.to_state, t.payload) for t in found if t.item_id is not None]


def test_each_item_transition_carries_its_payload_as_of_its_event(lg: Ledger) -> None:
    run_id = _amended_twice(lg)
    expected = _expected(lg, run_id)
    i0 = [p for item, _c, _s, p in expected if item == "i0"]
    assert {"n": 0} in i0 and {"n": 10} in i0 and {"n": 20} in i0  # the story happened
    every = lg.events(payloads=True)
    assert _steps(every) == expected
    assert all(t.payload is None for t in every if t.item_id is None)
    # one page at a time, filtered by run or kind: the same payloads
    paged: list[Transition] = []
    cursor = 0
    while page := lg.events(after=cursor, limit=2, payloads=True):
        paged += page
        cursor = page[-1].position
    assert _steps(paged) == expected
    assert _steps(lg.events(run_id=run_id, payloads=True)) == expected
    accepted = lg.events(kinds="accepted", payloads=True)
    assert _steps(accepted) == [s for s in expected if s[2] == "accepted"]
    # without payloads: as before, no payload and none in the JSON
    plain = lg.events()
    assert all(t.payload is None for t in plain)
    assert all("payload" not in t.to_dict() for t in plain)
    assert [t.position for t in plain] == [t.position for t in every]
    assert [t.to_dict() for t in plain] == [
        {k: v for k, v in t.to_dict().items() if k != "payload"} for t in every
    ]
    claim = next(t for t in every if t.command == "claim")
    assert claim.to_dict()["payload"] == {"n": 0}
    with pytest.raises(InvalidInput):
        lg.events(payloads="yes")  # type: ignore[arg-type]


def test_a_followers_rebuild_equals_the_model_built_live(lg: Ledger) -> None:
    live: list[Step] = []
    live_db: list[Step] = []
    external = Follower(
        lg, "live", lambda batch: live.extend(_steps(batch)), batch=2, payloads=True
    )
    in_db = Follower(
        lg, "live-db", lambda batch, tx: live_db.extend(_steps(batch)), batch=3, payloads=True
    )

    def catch_up() -> None:
        external.catch_up()
        in_db.catch_up()

    run_id = _amended_twice(lg, catch_up)
    expected = _expected(lg, run_id)
    assert live == expected
    assert live_db == expected
    rebuilt: list[Step] = []
    with Follower(lg, "rebuilt", lambda batch: rebuilt.extend(_steps(batch)), payloads=True) as f:
        f.catch_up()
    assert rebuilt == live
    live_db.clear()
    in_db.rebuild()
    assert live_db == expected
    external.close()
    in_db.close()
    # without payloads a follower is handed none
    plain: list[Transition] = []
    with Follower(lg, "plain", plain.extend) as f:
        f.catch_up()
    assert plain and all(t.payload is None for t in plain)
    with pytest.raises(InvalidInput):
        Follower(lg, "bad", plain.extend, payloads=1)  # type: ignore[arg-type]


def test_http_events_give_payloads_when_asked(dsn: str, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    token = add_token("olga", "operator", tokens)
    auth = {"Authorization": f"Bearer {token}"}
    with Ledger.open(dsn) as lg:
        run_id = _amended_twice(lg)
        expected = _expected(lg, run_id)
        client = TestClient(create_app(lg, tokens_path=tokens))
        r = client.get("/events", params={"payloads": "true", "limit": 1000}, headers=auth)
        assert r.status_code == 200
        got = [
            (t["item_id"], t["command"], t["to_state"], t["payload"])
            for t in r.json()["items"]
            if t["item_id"] is not None
        ]
        assert got == expected
        r = client.get("/events", params={"limit": 1000}, headers=auth)
        assert all("payload" not in t for t in r.json()["items"])
        r = client.get(
            "/events/stream", params={"after": 0, "limit": 3, "payloads": "true"}, headers=auth
        )
        assert r.status_code == 200
        frames = [line for line in r.text.splitlines() if line.startswith("data: ")]
        assert len(frames) == 3 and '"payload":{"n":0}' in frames[2]


def test_a_reader_keeping_histories_across_pages_gives_the_same_payloads(lg: Ledger) -> None:
    """A follower keeps the runs' payload histories between batches (then reads only the
    amendments since): amendments made after it read a run are still seen, and a reader
    that forgets every history but its page's gives the same payloads."""
    from ledger.reads import feed
    from ledger.reads.payloads import Payloads

    readers = {"keeping": Payloads(), "forgetting": Payloads(keep_items=1)}
    cursors = dict.fromkeys(readers, 0)
    seen: dict[str, list[Step]] = {name: [] for name in readers}

    def drain() -> None:  # what committed since, one transition a page
        for name, reader in readers.items():
            while True:
                with lg.store.read() as tx:
                    found, cursor = feed.page(tx, cursors[name], feed.FeedFilter(), 1)
                    reader.attach(tx, found)
                if not found:
                    break
                cursors[name] = cursor
                seen[name] += _steps(found)

    other = running(lg, 2)  # another run with item transitions, met first
    lg.claim(other, WORKER, limit=1)
    run_id = _amended_twice(lg, drain)
    expected = _steps(lg.events(payloads=True))
    assert expected[0] == ("i0", "claim", "in_progress", {"n": 0})  # the other run's
    assert expected[1:] == _expected(lg, run_id)
    assert seen["keeping"] == expected
    assert seen["forgetting"] == expected
