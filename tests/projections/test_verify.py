"""`Ledger.verify()`: tamper evidence (hash chains), the rule book's rules in the history, and
projections against a fresh rebuild. Each corruption is made behind the ledger's
back with plain SQL and must be reported with its run id and position."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from ledger import InvalidInput, Ledger
from ledger.core.domain import Item, Run
from ledger.core.rows import iso, item_from_row, run_from_row
from ledger.projections.rebuild import position_column
from ledger.stores.hashchain import HASH_COLUMN, event_hash, oid_param
from tests.histories.load import import_stored, stored_events
from tests.projections.test_rebuild import Program
from tests.support.clock import ManualClock
from tests.support.runs import (
    CONTROLLER,
    OPERATOR,
    RECONCILER,
    REVIEWER,
    SUBMITTER,
    WORKER,
    manifest,
)


def scenario(lg: Ledger, clock: ManualClock) -> dict[str, str]:
    """A few runs touching most commands: a success, a cancel, a review, a retry."""
    ok = lg.submit(manifest(3), SUBMITTER).run_id
    lg.start(ok, CONTROLLER)
    clock.advance(5)
    leases = lg.claim(ok, WORKER, limit=3)
    lg.heartbeat(leases[0])
    clock.advance(5)
    for le in leases:
        lg.accept(le, evidence={"rows": 10})
    lg.complete(ok, CONTROLLER)
    canceled = lg.submit(manifest(3), SUBMITTER).run_id
    lg.start(canceled, CONTROLLER)
    lease = lg.claim(canceled, WORKER)[0]
    lg.cancel(canceled, OPERATOR, "wrong input")
    lg.fail_attempt(lease, "interrupted")
    reviewed = lg.submit(manifest(2, review={"decision": "ok"}), SUBMITTER).run_id
    lg.start(reviewed, CONTROLLER)
    lg.request_review(reviewed, CONTROLLER, "ok")
    lg.amend(reviewed, SUBMITTER, "one more", items=[{"item_id": "x", "payload": {}}])
    lg.decide(reviewed, REVIEWER, lg.status(reviewed).input_version, False, "no")
    failed = lg.submit(manifest(1), SUBMITTER).run_id
    lg.fail(failed, OPERATOR, "source gone", transient=True)
    retried = lg.retry(failed, SUBMITTER).run_id
    clock.advance(120)
    lg.reconcile(actor=RECONCILER)
    return {
        "ok": ok,
        "canceled": canceled,
        "reviewed": reviewed,
        "failed": failed,
        "retried": retried,
    }


def kinds(report: Any) -> set[str]:
    return {p["kind"] for p in report.problems}


def find(report: Any, kind: str) -> list[dict[str, Any]]:
    return [p for p in report.problems if p["kind"] == kind]


def event_at(lg: Ledger, run_id: str, command: str, item_id: str | None = None) -> int:
    """The position of the run's first transition with this command."""
    return next(
        t.position
        for t in lg.history(run_id)
        if t.command == command and (item_id is None or t.item_id == item_id)
    )


def sql_events(lg: Ledger) -> tuple[str, str]:
    return lg.store.events_table(), position_column(lg.store)


def edit_event(lg: Ledger, position: int, edit: Callable[[bytes], bytes]) -> None:
    table, pos = sql_events(lg)
    with lg.store.write() as tx:
        row = tx.fetchone(f"SELECT state FROM {table} WHERE {pos} = ?", (position,))  # noqa: S608 (our own table/column names; values are bound parameters)
        assert row is not None
        tx.execute(
            f"UPDATE {table} SET state = ? WHERE {pos} = ?",  # noqa: S608 (our own table/column names; values are bound parameters)
            (edit(bytes(row["state"])), position),
        )


def test_a_clean_ledger_verifies_and_heads_track_the_history(
    lg: Ledger, clock: ManualClock
) -> None:
    scenario(lg, clock)
    report = lg.verify()
    assert report.ok and report.problems == []
    with lg.store.read() as tx:
        n = tx.fetchone(f"SELECT COUNT(*) AS n FROM {lg.store.events_table()}")  # noqa: S608 (our own table/column names; values are bound parameters)
    assert n is not None and report.events == n["n"]
    assert len(report.heads) == 32 and lg.verify().heads == report.heads
    lg.submit(manifest(1), SUBMITTER)
    assert lg.verify().heads != report.heads


def test_verify_reports_its_progress_by_stage(lg: Ledger, clock: ManualClock) -> None:
    scenario(lg, clock)
    calls: list[tuple[str, int, int]] = []
    report = lg.verify(progress=lambda stage, done, total: calls.append((stage, done, total)))
    assert report.ok
    stages = [c[0] for c in calls]
    assert stages[0] == "replay" and stages[-2:] == ["compare", "chains"]
    replay = [c for c in calls if c[0] == "replay"]
    assert [d for _s, d, _t in replay] == sorted(d for _s, d, _t in replay)
    assert replay[-1][1:] == (report.events, report.events)
    with pytest.raises(InvalidInput, match="progress must be a callable"):
        lg.verify(progress="yes")  # type: ignore[arg-type]


def test_heads_depend_only_on_the_events(lg: Ledger, clock: ManualClock) -> None:
    """The same events on another store give the same digest (it can be recorded anywhere)."""
    scenario(lg, clock)
    with Ledger.open("memory://") as copy:
        import_stored(copy, [se for _p, se in stored_events(lg)])
        copy.rebuild_projections()
        assert copy.verify().heads == lg.verify().heads
        assert copy.verify().ok


def test_an_edited_event_payload_is_reported(lg: Ledger, clock: ManualClock) -> None:
    runs = scenario(lg, clock)
    position = event_at(lg, runs["ok"], "start")
    edit_event(lg, position, lambda b: b.replace(b'"actor_id":"ctl"', b'"actor_id":"eve"'))
    report = lg.verify()
    assert not report.ok
    [chain] = find(report, "hash_chain")
    assert (
        chain["run_id"] == runs["ok"]
        and chain["position"] == position
        and "edited" in chain["detail"]
    )
    # the transition columns on the event's row still say ctl; the edited event says eve
    [drift] = find(report, "transition_columns")
    assert drift["run_id"] == runs["ok"] and drift["position"] == position
    assert drift["columns"] == {"actor_id": ["ctl", "eve"]}


def test_a_deleted_event_is_reported(lg: Ledger, clock: ManualClock) -> None:
    runs = scenario(lg, clock)
    claim = event_at(lg, runs["ok"], "claim", "i1")
    accept = event_at(lg, runs["ok"], "accept", "i1")
    table, pos = sql_events(lg)
    with lg.store.write() as tx:
        tx.execute(f"DELETE FROM {table} WHERE {pos} = ?", (claim,))  # noqa: S608 (our own table/column names; values are bound parameters)
    report = lg.verify()
    assert not report.ok
    [gap] = find(report, "stream_gap")
    # the item's stream begins with its claim (v1): the accept (v2) is the first left
    assert gap["run_id"] == runs["ok"] and gap["position"] == accept and gap["version"] == 2
    assert any(p["run_id"] == runs["ok"] for p in find(report, "projection"))


def test_swapped_events_are_reported(lg: Ledger, clock: ManualClock) -> None:
    runs = scenario(lg, clock)
    claim = event_at(lg, runs["ok"], "claim", "i2")
    accept = event_at(lg, runs["ok"], "accept", "i2")
    table, pos = sql_events(lg)
    with lg.store.write() as tx:  # the accept now comes before the claim
        tx.execute(f"UPDATE {table} SET {pos} = ? WHERE {pos} = ?", (-1, claim))  # noqa: S608 (our own table/column names; values are bound parameters)
        tx.execute(f"UPDATE {table} SET {pos} = ? WHERE {pos} = ?", (claim, accept))  # noqa: S608 (our own table/column names; values are bound parameters)
        tx.execute(f"UPDATE {table} SET {pos} = ? WHERE {pos} = ?", (accept, -1))  # noqa: S608 (our own table/column names; values are bound parameters)
    report = lg.verify()
    assert not report.ok
    [order] = find(report, "stream_order")
    # the accept (v2 of the item's stream, which begins with its claim) now comes first
    assert order["run_id"] == runs["ok"] and order["position"] == claim and order["version"] == 2
    assert find(report, "hash_chain") == []  # each event is intact; only the order changed


def test_a_projection_row_changed_by_hand_is_reported(lg: Ledger, clock: ManualClock) -> None:
    runs = scenario(lg, clock)
    with lg.store.write() as tx:
        tx.execute(
            "UPDATE lg_items SET state = 'accepted' WHERE run_id = ? AND item_id = 'i1'",
            (runs["canceled"],),
        )
    report = lg.verify()
    assert not report.ok
    [drift] = report.problems
    assert drift["kind"] == "projection" and drift["table"] == "lg_items"
    assert drift["run_id"] == runs["canceled"] and drift["key"] == {
        "run_id": runs["canceled"],
        "item_id": "i1",
    }
    assert "state" in drift["detail"]
    assert kinds(lg.verify()) == {"projection"}  # verify changed nothing
    lg.rebuild_projections()
    assert lg.verify().ok


def test_rule_violations_in_the_history_are_reported(lg: Ledger, clock: ManualClock) -> None:
    """Events that break the rule book's rules, appended behind the service's back (the hash chain
    stays valid: the store wrote them), are reported with their run and position."""
    runs = scenario(lg, clock)
    busy = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(busy, CONTROLLER)
    lease, other_lease = lg.claim(busy, WORKER, limit=2)

    def append(
        run_id: str, build: Callable[[Any, Any, Any], list[Any]], item_id: str = "i0"
    ) -> int:
        with lg.store.write() as tx:
            run = run_from_row(tx.fetchone("SELECT * FROM lg_runs WHERE run_id = ?", (run_id,)))  # type: ignore[arg-type]
            row = tx.fetchone(
                "SELECT * FROM lg_items WHERE run_id = ? AND item_id = ?", (run_id, item_id)
            )
            item = item_from_row(row) if row else None
            positioned = tx.append(build(run, item, tx.now()))
        return positioned[0][0]

    def forced(agg: Any, command: str, to_state: str, *args: Any) -> None:
        """The transition's event without the rule book's guards (written behind its back)."""
        actor_id, role, reason, evidence, at = args
        extra = {"run_id": agg.run_id, "item_id": agg.item_id} if isinstance(agg, Item) else {}
        agg.trigger_event(
            agg.Transitioned,
            command=command,
            from_state=agg.state,
            to_state=to_state,
            actor_id=actor_id,
            role=role,
            reason=reason,
            evidence=evidence,
            timestamp=at,
            **extra,
        )

    def terminal_changed(run: Run, item: Any, now: Any) -> list[Any]:
        forced(run, "resume", "running", OPERATOR.id, OPERATOR.role, "sneaky", {}, now)
        return list(run.collect_events())

    def second_lease(run: Run, item: Any, now: Any) -> list[Any]:
        forced(
            item,
            "claim",
            "in_progress",
            "w2",
            "worker",
            None,
            {"lease_token": "t2", "attempt": 2, "expires_at": iso(now)},
            now,
        )
        return list(item.collect_events())

    def reconciler_accepts(run: Run, item: Any, now: Any) -> list[Any]:
        forced(
            item,
            "accept",
            "accepted",
            RECONCILER.id,
            RECONCILER.role,
            "looks done",
            {"lease_token": other_lease.token, "attempt": 1, "outcome": "accepted"},
            now,
        )
        return list(item.collect_events())

    def unearned_success(run: Run, item: Any, now: Any) -> list[Any]:
        forced(run, "complete", "succeeded", CONTROLLER.id, CONTROLLER.role, "done", {}, now)
        return list(run.collect_events())

    def backwards(run: Run, item: Any, now: Any) -> list[Any]:
        forced(
            run, "pause", "paused", OPERATOR.id, OPERATOR.role, "hold", {}, now - timedelta(hours=1)
        )
        return list(run.collect_events())

    expected = {
        "terminal_changed": (runs["ok"], append(runs["ok"], terminal_changed)),
        "two_leases": (busy, append(busy, second_lease, lease.item_id)),
        "reconciler_success": (busy, append(busy, reconciler_accepts, other_lease.item_id)),
    }
    fresh = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(fresh, CONTROLLER)
    clock.advance(60)
    expected["time_backwards"] = (fresh, append(fresh, backwards))
    other = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(other, CONTROLLER)
    expected["success_unearned"] = (other, append(other, unearned_success))
    report = lg.verify()
    for kind, (run_id, position) in expected.items():
        assert any(
            p["run_id"] == run_id and p["position"] == position for p in find(report, kind)
        ), (kind, report.problems)
    assert not find(report, "hash_chain") and not find(report, "stream_gap")
    assert all(p["run_id"] in (busy, fresh, other, runs["ok"]) for p in report.problems)


def test_verify_after_random_commands_finds_nothing(lg: Ledger, clock: ManualClock) -> None:
    ops = [
        ("submit", 3, 0),
        ("submit", 2, 3),
        ("start", 0),
        ("start", 1),
        ("claim", 0),
        ("claim", 1),
        ("accept", 0),
        ("fail", 1),
        ("advance", 120),
        ("reconcile", 0),
        ("claim", 0),
        ("heartbeat", 2),
        ("request_review", 1),
        ("approve", 1),
        ("cancel", 0),
        ("accept", 3),
        ("complete", 1),
        ("retry", 0),
        ("repair", 1),
        ("compensate", 1),
        ("amend_add", 2),
        ("withdraw", 2, 1),
    ]
    Program(lg, clock).run(ops)  # type: ignore[arg-type]
    report = lg.verify()
    assert report.ok, report.problems
    with lg.store.read() as tx:
        hashes = tx.fetchone(
            f"SELECT COUNT(*) AS n FROM {lg.store.events_table()} WHERE {HASH_COLUMN} IS NOT NULL"  # noqa: S608 (our own table/column names)
        )
    assert hashes is not None and hashes["n"] == report.events


def test_the_recorded_hash_chains_each_event_to_the_previous(
    lg: Ledger, clock: ManualClock
) -> None:
    """The stored hash of version v is sha256 over (hash of v-1, id, version, topic, stored bytes)."""
    runs = scenario(lg, clock)
    table, _pos = sql_events(lg)
    from uuid import UUID

    with lg.store.read() as tx:
        rows = tx.fetchall(
            f"SELECT e.originator_version AS v, e.topic, e.state, e.{HASH_COLUMN} AS hash "  # noqa: S608 (our own table/column names; values are bound parameters)
            f"FROM {table} e WHERE e.originator_id = ? ORDER BY e.originator_version",
            (oid_param(lg.store.dialect, UUID(runs["ok"])),),
        )
    prev = ""
    assert [r["v"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 3
    for r in rows:
        assert r["hash"] == event_hash(
            prev, UUID(runs["ok"]), r["v"], r["topic"], bytes(r["state"])
        )
        prev = r["hash"]


def test_small_pages_and_batches_give_the_same_report(
    lg: Ledger, clock: ManualClock, monkeypatch: Any
) -> None:
    """Verify pages through the hash chains and replays in batches (with the aggregates of
    one batch kept for the next, and a damaged batch replayed event by event): the sizes
    must not change what it finds."""
    import ledger.projections.rebuild as rebuild_module
    import ledger.projections.verify as v

    runs = scenario(lg, clock)
    claim = event_at(lg, runs["ok"], "claim", "i1")
    start = event_at(lg, runs["ok"], "start")
    table, pos = sql_events(lg)
    clean = lg.verify()
    assert clean.ok
    with lg.store.write() as tx:
        tx.execute(f"DELETE FROM {table} WHERE {pos} = ?", (claim,))  # noqa: S608 (our own table/column names; values are bound parameters)
    edit_event(lg, start, lambda b: b.replace(b'"actor_id":"ctl"', b'"actor_id":"eve"'))
    damaged = lg.verify()
    assert {"stream_gap", "hash_chain", "projection"} <= kinds(damaged)
    # page: the hash chains' page; batch: events per transaction; replay: events per
    # replayed page within a transaction (each read while the page before is written)
    for page, batch, replay in [(1, 1, 1), (2, 3, 1), (5, 7, 7), (5, 7, 2), (3, 10, 3)]:
        monkeypatch.setattr(v, "PAGE", page)
        monkeypatch.setattr(v, "BATCH_SIZE", batch)
        monkeypatch.setattr(rebuild_module, "REPLAY_PAGE", replay)
        again = lg.verify()
        assert (again.problems, again.heads, again.events) == (
            damaged.problems,
            damaged.heads,
            damaged.events,
        )
