"""An import is a writer like any other: every incoming event passes the rule checker the
commands and `verify` use, before anything commits; an import adds only runs the target
does not hold; positions in a file stay within what every store holds and counts past.
On memory, SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from ledger import Ledger
from ledger.core import states as S
from ledger.core.domain import Item, Run
from ledger.core.rows import item_from_row, run_from_row
from ledger.service.copy import copy_ledger
from ledger.stores.raw import max_position
from ledger.transfer.history_file import (
    MAX_POSITION,
    Chains,
    ImportRefused,
    event_line,
    parse_event,
)
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest

Build = Callable[[Run, Item | None, datetime], list[Any]]


def _export(lg: Ledger) -> str:
    out = io.StringIO()
    lg.export(out)
    return out.getvalue()


def _forced(agg: Any, command: str, to_state: str, actor: str, role: str, **kw: Any) -> None:
    """A transition's event without the rule book's guards (what a forger writes)."""
    extra = {"run_id": agg.run_id, "item_id": agg.item_id} if isinstance(agg, Item) else {}
    agg.trigger_event(
        agg.Transitioned,
        command=command,
        from_state=kw.pop("from_state", agg.state),
        to_state=to_state,
        actor_id=actor,
        role=role,
        reason="forged",
        evidence=kw.pop("evidence", {}),
        timestamp=kw.pop("at"),
        **extra,
    )


def _append_behind_its_back(lg: Ledger, run_id: str, item_id: str | None, build: Build) -> None:
    """Events appended to the store without the commands (and their guard): the hash
    chains stay valid, as a forger who recomputes them would make them."""
    with lg.store.write() as tx:
        run = run_from_row(tx.fetchone("SELECT * FROM lg_runs WHERE run_id = ?", (run_id,)))  # type: ignore[arg-type]
        item = None
        if item_id is not None:
            row = tx.fetchone(
                "SELECT * FROM lg_items WHERE run_id = ? AND item_id = ?", (run_id, item_id)
            )
            assert row is not None
            item = item_from_row(row) or Item.begin(run_id, item_id, tx.now())
        tx.append(build(run, item, tx.now()))


def _succeeds_with_an_item_pending(lg: Ledger, clock: ManualClock) -> tuple[str, str]:
    run_id = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    lg.accept(lease)

    def build(run: Run, item: Any, now: datetime) -> list[Any]:
        ev = {"counts": dict(run.counts), "not_accepted": []}
        _forced(run, "complete", S.SUCCEEDED, CONTROLLER.id, CONTROLLER.role, evidence=ev, at=now)
        return list(run.collect_events())

    _append_behind_its_back(lg, run_id, None, build)
    return run_id, "success_unearned"


def _time_goes_backwards(lg: Ledger, clock: ManualClock) -> tuple[str, str]:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    clock.advance(60)

    def build(run: Run, item: Any, now: datetime) -> list[Any]:
        _forced(run, "pause", S.PAUSED, OPERATOR.id, OPERATOR.role, at=now - timedelta(hours=1))
        return list(run.collect_events())

    _append_behind_its_back(lg, run_id, None, build)
    return run_id, "time_backwards"


def _started_by_a_worker(lg: Ledger, clock: ManualClock) -> tuple[str, str]:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id

    def build(run: Run, item: Any, now: datetime) -> list[Any]:
        _forced(run, "start", S.RUNNING, WORKER.id, WORKER.role, at=now)
        return list(run.collect_events())

    _append_behind_its_back(lg, run_id, None, build)
    return run_id, "role_allowed"


def _accepted_without_a_claim(lg: Ledger, clock: ManualClock) -> tuple[str, str]:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)

    def build(run: Run, item: Any, now: datetime) -> list[Any]:
        ev = {"lease_token": "made-up", "attempt": 1, "outcome": "accepted"}
        _forced(item, "accept", S.ACCEPTED, WORKER.id, WORKER.role, evidence=ev, at=now)
        return list(item.collect_events())

    _append_behind_its_back(lg, run_id, "i0", build)
    return run_id, "transition_allowed"


def _accepted_under_a_made_up_lease(lg: Ledger, clock: ManualClock) -> tuple[str, str]:
    """The item's state is forged too (from in_progress): the lease is what gives it away."""
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    (lease,) = lg.claim(run_id, WORKER, limit=1)

    def build(run: Run, item: Any, now: datetime) -> list[Any]:
        ev = {"lease_token": "made-up", "attempt": 1, "outcome": "accepted"}
        _forced(item, "accept", S.ACCEPTED, WORKER.id, WORKER.role, evidence=ev, at=now)
        return list(item.collect_events())

    _append_behind_its_back(lg, run_id, lease.item_id, build)
    return run_id, "lease_holder"


def _accepted_by_the_ledger(lg: Ledger, clock: ManualClock) -> tuple[str, str]:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    (lease,) = lg.claim(run_id, WORKER, limit=1)

    def build(run: Run, item: Any, now: datetime) -> list[Any]:
        ev = {"lease_token": lease.token, "attempt": 1, "outcome": "accepted"}
        _forced(item, "accept", S.ACCEPTED, S.LEDGER_ACTOR_ID, WORKER.role, evidence=ev, at=now)
        return list(item.collect_events())

    _append_behind_its_back(lg, run_id, lease.item_id, build)
    return run_id, "reserved_actor"


FORGERIES = {
    "succeeded with an item pending": _succeeds_with_an_item_pending,
    "time going backwards": _time_goes_backwards,
    "start by a worker": _started_by_a_worker,
    "accept without a claim": _accepted_without_a_claim,
    "accept under a made-up lease": _accepted_under_a_made_up_lease,
    "accept by the reserved actor": _accepted_by_the_ledger,
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_an_import_refuses_a_history_that_breaks_a_rule(lg: Ledger, forgery: str) -> None:
    """A file whose hashes check out but whose events break a rule: refused, naming the
    rule, the stream and the event; nothing written. `verify` of the forger's ledger
    names the same rule: verify, the commands and import share one rule checker."""
    clock = ManualClock()
    with Ledger.open("memory://", clock=clock) as forger:
        forged_run, rule = FORGERIES[forgery](forger, clock)
        assert rule in {p["kind"] for p in forger.verify().problems}
        text = _export(forger)
    with pytest.raises(ImportRefused) as info:
        lg.import_file(io.StringIO(text))
    err = info.value
    assert err.rule == rule, err
    assert err.stream is not None and err.stream in str(err)
    assert f"run {forged_run}" in str(err) and f"rule {rule}" in str(err)
    assert err.to_dict()["rule"] == rule
    with lg.store.read() as tx:
        assert max_position(tx) == 0
    assert lg.runs() == []


def test_an_import_adds_nothing_to_a_run_the_ledger_holds(lg: Ledger) -> None:
    """A file holding only one pending item's stream (its id is computable from the run
    id and the item id), claimed and accepted by a worker of the forger's choosing:
    refused, the item stays pending and nothing is written."""
    run_id = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    with lg.store.read() as tx:
        head, now = max_position(tx), tx.now()
    item = Item.begin(run_id, "i1", now)
    claim = {"lease_token": "t-mallory", "attempt": 1, "expires_at": now.isoformat()}
    item.transition("claim", S.IN_PROGRESS, "mallory", S.WORKER, None, claim, now, S.RUNNING)
    accept = {"lease_token": "t-mallory", "attempt": 1, "outcome": "accepted"}
    item.transition("accept", S.ACCEPTED, "mallory", S.WORKER, None, accept, now, S.RUNNING)
    stored = [lg.store.mapper.to_stored_event(e) for e in item.collect_events()]
    chains = Chains()
    lines = []
    for k, s in enumerate(stored, start=1):
        raw = parse_event(
            {
                "position": head + k,
                "stream": str(s.originator_id),
                "version": s.originator_version,
                "topic": s.topic,
                "state": bytes(s.state).decode(),
                "hash": None,
            },
            k,
        )
        assert chains.add(raw) is None
        lines.append(event_line(raw._replace(hash=chains.heads[raw.stream][1])))
    lines.append(json.dumps(chains.closing(True)))
    with pytest.raises(ImportRefused, match=f"run {run_id}, which this ledger holds"):
        lg.import_file(io.StringIO("\n".join(lines) + "\n"))
    assert {i.item_id: i.state for i in lg.items(run_id)} == {"i0": "pending", "i1": "pending"}
    with lg.store.read() as tx:
        assert max_position(tx) == head
    assert lg.verify().ok


def test_reimporting_the_same_file_stays_a_no_op(lg: Ledger) -> None:
    with Ledger.open("memory://") as source:
        run_id = source.submit(manifest(2), SUBMITTER).run_id
        source.start(run_id, CONTROLLER)
        text = _export(source)
    first = lg.import_file(io.StringIO(text))
    assert first.runs == [run_id] and first.events == 2
    again = lg.import_file(io.StringIO(text))
    assert again.events == 0 and again.skipped == 2 and again.runs == []


def _at(text: str, last: int) -> str:
    """The file with its positions moved so that its last event is at `last` (positions
    are not part of the hashes: the closing line is made again)."""
    lines = text.splitlines()
    events = [parse_event(json.loads(x), k) for k, x in enumerate(lines[:-1], start=1)]
    shift = last - events[-1].position
    chains = Chains()
    out = []
    for e in events:
        moved = e._replace(position=e.position + shift)
        assert chains.add(moved) is None
        out.append(event_line(moved))
    out.append(json.dumps(chains.closing(True)))
    return "\n".join(out) + "\n"


def _small_history() -> str:
    with Ledger.open("memory://") as source:
        run_id = source.submit(manifest(2), SUBMITTER).run_id
        source.start(run_id, CONTROLLER)
        return _export(source)


@pytest.mark.parametrize("last", [MAX_POSITION + 1, 2**63 - 1])
def test_a_position_beyond_what_every_store_holds_is_refused(lg: Ledger, last: int) -> None:
    """2^63-1 is SQLite's highest row id: past it, SQLite draws random lower ones."""
    text = _at(_small_history(), last)
    with pytest.raises(ImportRefused, match=f"at most {MAX_POSITION}") as info:
        lg.import_file(io.StringIO(text))
    assert info.value.position is not None and info.value.position > MAX_POSITION
    with lg.store.read() as tx:
        assert max_position(tx) == 0


@pytest.mark.parametrize("last", [2**31 + 5, MAX_POSITION])
def test_after_an_import_at_high_positions_new_events_land_above_the_head(
    lg: Ledger, last: int
) -> None:
    """No untyped error for positions past a 32-bit integer, and the store never hands
    out a position below its head afterwards (a follower would never see it)."""
    summary = lg.import_file(io.StringIO(_at(_small_history(), last)))
    assert summary.events == 2 and summary.verify_ok, summary.problems
    with lg.store.read() as tx:
        head = max_position(tx)
    for _ in range(3):
        run_id = lg.submit(manifest(1), SUBMITTER).run_id
        with lg.store.read() as tx:
            now = max_position(tx)
        assert now > head, (now, head)
        head = now
        assert lg.history(run_id)[-1].position == now
    assert lg.verify().ok


def test_a_copy_refuses_a_source_whose_history_breaks_a_rule(tmp_path: Any, dsn: str) -> None:
    """`copy` is an import like any other: a source written behind the commands' back
    (a start by a worker) is refused naming the rule, and the target stays empty."""
    source = f"sqlite:///{tmp_path}/forged.db"
    clock = ManualClock()
    with Ledger.open(source, clock=clock) as forger:
        _, rule = _started_by_a_worker(forger, clock)
    with pytest.raises(ImportRefused) as info:
        copy_ledger(source, dsn)
    assert info.value.rule == rule
    with Ledger.open(dsn) as target:
        assert target.runs() == []
