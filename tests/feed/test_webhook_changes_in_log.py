"""Registering, changing and removing a webhook is an operator command with a reason,
recorded in the history and audit like any other: each is an event of the webhook's own
stream in the event log, hash-chained, shown by `audit` by actor and time, checked by
`verify`, and every reader of the log (the change feed, followers, rebuild, export and
import, archive and restore, the Merkle tree, time travel) handles it."""

# ruff: noqa: F811  (the fixtures of tests/support/http_api.py are imported, then requested by name)
from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger, NotAuthorized
from ledger.commands.uow import commit_stream_events
from ledger.core.errors import InvariantViolated
from ledger.core.webhook_events import (
    EVENT_OF_COMMAND,
    WebhookChanged,
    WebhookEvent,
    WebhookRegistered,
    WebhookRemoved,
    webhook_stream_id,
)
from ledger.feed.follower import Follower
from ledger.feed.webhooks import (
    add_webhook,
    change_webhook,
    list_webhooks,
    rekey_webhooks,
    remove_webhook,
    webhook_changes,
)
from ledger.projections.rebuild import position_column
from ledger.projections.writer import Projector
from ledger.service.checkpoints import tree_head
from tests.support.cli import cli
from tests.support.clock import ManualClock
from tests.support.http_api import (  # noqa: F401  (fixtures)
    Api,
    api,
    ledger,
    make_api,
    tokens,
    tokens_file,
)
from tests.support.runs import OPERATOR, REVIEWER, SUBMITTER, WORKER, finished_run

pytestmark = pytest.mark.usefixtures("webhook_key")

LOCAL = {"allow_http": True, "allow_host": "127.0.0.1"}


def _history(lg: Ledger, clock: ManualClock) -> tuple[str, str, list[str | None]]:
    """A run finished by others, and an operator's add, rotate and remove of a webhook
    between its steps: (run id, webhook id, the secrets shown)."""
    clock.advance(10)
    hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/a", reason="billing wants runs", **LOCAL)
    clock.advance(10)
    run_id = finished_run(lg)
    clock.advance(10)
    rotated = change_webhook(lg, OPERATOR, hook.webhook_id, rotate_secret=True, reason="leaked")
    clock.advance(10)
    remove_webhook(lg, OPERATOR, hook.webhook_id, reason="billing retired it")
    return run_id, hook.webhook_id, [hook.secret, rotated.secret]


def _webhook_events(lg: Ledger) -> list[tuple[int, WebhookEvent]]:
    return [(p, e) for p, e in lg.store.read_events(0, 10_000) if isinstance(e, WebhookEvent)]


def test_webhook_changes_are_in_the_audit_by_their_actor_with_their_reasons(
    lg: Ledger, clock: ManualClock
) -> None:
    t0 = clock()
    run_id, webhook_id, _ = _history(lg, clock)
    mine = lg.audit(actor=OPERATOR.id)
    assert [(t.command, t.from_state, t.to_state, t.reason, t.role) for t in mine] == [
        ("webhook_add", "-", "registered", "billing wants runs", "operator"),
        ("webhook_rotate", "registered", "registered", "leaked", "operator"),
        ("webhook_remove", "registered", "removed", "billing retired it", "operator"),
    ]
    assert [t.at for t in mine] == [t0 + timedelta(seconds=s) for s in (10, 30, 40)]
    assert {t.evidence["webhook_id"] for t in mine} == {webhook_id}
    assert mine[0].evidence["url"] == "http://127.0.0.1:9/a"
    assert all(t.run_id == "" and t.item_id is None for t in mine)
    # in position order among the runs' transitions, in every direction and page size
    everything = lg.audit()
    positions = [t.position for t in everything]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert everything[0].command == "webhook_add"
    assert [t.command for t in everything][-2:] == ["webhook_rotate", "webhook_remove"]
    assert lg.audit(page_size=1) == everything
    assert lg.audit(newest_first=True, page_size=2) == everything[::-1]
    assert lg.audit(limit=3) == everything[:3]
    assert lg.audit(after=everything[2].position, limit=2) == everything[3:5]
    # filtered by time and role; a run or a target state holds no webhook change
    window = lg.audit(since=t0 + timedelta(seconds=25), until=t0 + timedelta(seconds=35))
    assert [t.command for t in window] == ["webhook_rotate"]
    assert [t.command for t in lg.audit(role="operator")] == [t.command for t in mine]
    assert not [t for t in lg.audit(run_id=run_id) if t.command.startswith("webhook_")]
    assert not [t for t in lg.audit(state="succeeded") if t.command.startswith("webhook_")]
    assert lg.audit(actor="nobody-else") == []


def test_each_change_is_an_event_of_the_webhooks_stream_in_the_hash_chain(
    lg: Ledger, clock: ManualClock
) -> None:
    _run_id, webhook_id, secrets = _history(lg, clock)
    found = _webhook_events(lg)
    assert [type(e) for _p, e in found] == [WebhookRegistered, WebhookChanged, WebhookRemoved]
    assert {e.originator_id for _p, e in found} == {webhook_stream_id(webhook_id)}
    assert [e.originator_version for _p, e in found] == [1, 2, 3]
    assert [(e.actor_id, e.role) for _p, e in found] == [(OPERATOR.id, "operator")] * 3
    # the positions audit and the change record report are the events'
    assert [p for p, _e in found] == [t.position for t in lg.audit(actor=OPERATOR.id)]
    assert sorted(c.position for c in webhook_changes(lg, webhook_id)) == [p for p, _e in found]
    # never a secret in the log, only its fingerprint
    table, pos = lg.store.events_table(), position_column(lg.store)
    with lg.store.read() as tx:
        stored = [
            bytes(r["state"]).decode()
            for r in tx.fetchall(f"SELECT state FROM {table} ORDER BY {pos}")  # noqa: S608 (our own table/column names)
        ]
    assert all(s is not None and s not in "".join(stored) for s in secrets)
    assert found[1][1].secret_fingerprint is not None
    report = lg.verify()
    assert report.ok, report.problems
    assert report.events == len(stored)
    assert tree_head(lg).size == len(stored)  # leaves of the Merkle tree too

    # an edited event breaks its chain
    position = found[0][0]
    with lg.store.write() as tx:
        row = tx.fetchone(f"SELECT state FROM {table} WHERE {pos} = ?", (position,))  # noqa: S608 (our own table/column names; values are bound parameters)
        assert row is not None
        forged = bytes(row["state"]).replace(b"billing wants runs", b"approved by board")
        tx.execute(f"UPDATE {table} SET state = ? WHERE {pos} = ?", (forged, position))  # noqa: S608 (our own table/column names; values are bound parameters)
    problems = lg.verify().problems
    assert ("hash_chain", position) in {(p["kind"], p["position"]) for p in problems}


def test_verify_finds_a_webhook_change_row_edited_deleted_or_made_up(
    lg: Ledger, clock: ManualClock
) -> None:
    _run_id, webhook_id, _ = _history(lg, clock)
    [(added, _), (rotated, _), (removed, _)] = _webhook_events(lg)
    with lg.store.write() as tx:
        tx.execute(
            "UPDATE lg_webhook_changes SET actor_id = 'mallory' WHERE position = ?", (added,)
        )
        tx.execute("DELETE FROM lg_webhook_changes WHERE position = ?", (removed,))
        tx.execute(
            "INSERT INTO lg_webhook_changes (webhook_id, version, command, actor_id, role, "
            "reason, at, url, allow_http, position) VALUES (?, 9, 'change', 'mallory', "
            "'operator', 'trust me', '2026-01-01T00:00:00.000000+00:00', "
            "'https://example.org/', 0, ?)",
            (webhook_id, rotated + 1000),
        )
    report = lg.verify()
    assert not report.ok
    found = sorted(
        (p["position"], p["detail"]) for p in report.problems if p["kind"] == "webhook_change"
    )
    assert [p for p, _d in found] == [added, removed, rotated + 1000]
    assert "actor_id" in found[0][1]


def test_a_refused_webhook_command_writes_no_event_and_no_row(lg: Ledger) -> None:
    for actor in (SUBMITTER, WORKER, REVIEWER):
        with pytest.raises(NotAuthorized):
            add_webhook(lg, actor, "http://127.0.0.1:9/", reason="mine", **LOCAL)
    assert lg.store.read_events(0, 100) == [] and webhook_changes(lg) == []
    hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/", reason="ops feed", **LOCAL)
    before = lg.store.read_events(0, 100)
    assert [type(e) for _p, e in before] == [WebhookRegistered]
    for actor in (SUBMITTER, WORKER, REVIEWER):
        with pytest.raises(NotAuthorized):
            change_webhook(lg, actor, hook.webhook_id, reason="x", url="http://127.0.0.1:9/b")
        with pytest.raises(NotAuthorized):
            remove_webhook(lg, actor, hook.webhook_id, reason="x")
        with pytest.raises(NotAuthorized):
            rekey_webhooks(lg, actor, reason="x")
    assert lg.store.read_events(0, 100) == before
    assert len(webhook_changes(lg)) == 1
    assert [t.command for t in lg.audit()] == ["webhook_add"]


def test_the_feed_followers_and_rebuild_go_on_with_webhook_events_in_the_log(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id, _webhook_id, _ = _history(lg, clock)
    transitions = [t for t in lg.audit() if not t.command.startswith("webhook_")]
    # the change feed is the transitions of runs and items: webhook changes are not in it
    assert lg.events(limit=1000) == lg.events(run_id=run_id, limit=1000) == transitions
    seen: list[Any] = []
    with Follower(lg, "reader", seen.extend, in_database=False) as follower:
        follower.run_once()
    assert seen == transitions
    status, changes, audit = lg.status(run_id), webhook_changes(lg), lg.audit()
    assert lg.rebuild_projections() == len(lg.store.read_events(0, 10_000))
    assert (lg.status(run_id), webhook_changes(lg), lg.audit()) == (status, changes, audit)
    assert lg.verify().ok
    assert lg.status_at(run_id, clock()).state == status.state  # time travel


def test_export_and_import_carry_the_webhook_changes(
    lg: Ledger, clock: ManualClock, tmp_path: Path
) -> None:
    _run_id, _webhook_id, _ = _history(lg, clock)
    out = io.StringIO()
    summary = lg.export(out)
    source = lg.verify()
    with Ledger.open(f"sqlite:///{tmp_path / 'copy.db'}") as target:
        imported = target.import_file(io.StringIO(out.getvalue()))
        assert imported.verify_ok, imported.problems
        assert imported.events == summary.events
        assert imported.runs == [_run_id]  # a webhook's stream is no run
        report = target.verify()
        assert report.ok and report.heads == source.heads
        assert target.audit() == lg.audit()
        assert [c.to_dict() for c in webhook_changes(target)] == [
            c.to_dict() for c in webhook_changes(lg)
        ]
        assert list_webhooks(target) == []  # a registration (and its secret) never moves


def test_archive_and_restore_with_webhook_events_in_the_log(
    lg: Ledger, clock: ManualClock, tmp_path: Path
) -> None:
    run_id, _webhook_id, _ = _history(lg, clock)
    mine = lg.audit(actor=OPERATOR.id)
    lg.archive(OPERATOR, tmp_path / "old.jsonl", runs=[run_id])
    report = lg.verify()
    assert report.ok, report.problems
    assert lg.audit(actor=OPERATOR.id)[: len(mine)] == mine
    lg.restore(OPERATOR, tmp_path / "old.jsonl")
    report = lg.verify()
    assert report.ok, report.problems
    assert [t for t in lg.audit() if t.command.startswith("webhook_")] == mine


def test_the_http_audit_and_the_command_line_show_webhook_changes(
    api: Api, ledger: Ledger, dsn: str
) -> None:
    add_webhook(ledger, OPERATOR, "http://127.0.0.1:9/a", reason="billing wants runs", **LOCAL)
    r = api.get("/audit", params={"actor": OPERATOR.id})
    assert r.status_code == 200, r.text
    [entry] = r.json()["items"]
    assert (entry["command"], entry["reason"], entry["role"]) == (
        "webhook_add",
        "billing wants runs",
        "operator",
    )
    assert entry["evidence"]["url"] == "http://127.0.0.1:9/a"
    shown = cli(dsn, "audit", "--actor", OPERATOR.id, "--json")
    assert shown.exit_code == 0, shown.output
    assert [t["reason"] for t in json.loads(shown.output)] == ["billing wants runs"]


def _forged(
    lg: Ledger, role: str, command: str = "add", version: int = 1, reason: str = "trust me"
) -> WebhookEvent:
    with lg.store.read() as tx:
        now = tx.now()
    return EVENT_OF_COMMAND[command](
        originator_id=webhook_stream_id("wh_forged"),
        originator_version=version,
        timestamp=now,
        webhook_id="wh_forged",
        command=command,
        actor_id="mallory",
        role=role,
        reason=reason,
        url="https://example.org/",
        run_filter=None,
        kinds=[],
        allow_http=False,
        allow_host=None,
        secret_fingerprint=None,
    )


def test_the_rule_checker_refuses_a_webhook_change_no_operator_made(lg: Ledger) -> None:
    by_submitter, no_reason = _forged(lg, "submitter"), _forged(lg, "operator", reason=" ")
    for forged in (by_submitter, no_reason):
        with lg.store.write() as tx, pytest.raises(InvariantViolated, match="webhook_owner"):
            commit_stream_events(tx, Projector(), [forged])
    assert lg.store.read_events(0, 10) == [] and webhook_changes(lg) == []
    # written behind the checker's back (hash and row included), verify names the rule
    by_worker = _forged(lg, "worker")
    with lg.store.write() as tx:
        Projector().project(tx, tx.append([by_worker]), {}, {})
    report = lg.verify()
    assert [p["kind"] for p in report.problems] == ["webhook_owner"]


def test_a_webhooks_events_never_go_back_in_time(lg: Ledger, clock: ManualClock) -> None:
    hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/a", reason="feed", **LOCAL)
    added = clock()
    clock.advance(-3600)  # the store's clock steps back
    change_webhook(lg, OPERATOR, hook.webhook_id, url="http://127.0.0.1:9/b", reason="moved")
    times = [e.timestamp for _p, e in _webhook_events(lg)]
    assert times == [added, added]
    assert lg.verify().ok


def test_a_webhook_registered_before_the_log_held_its_changes_goes_on(
    lg: Ledger, clock: ManualClock
) -> None:
    hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/a", reason="feed", **LOCAL)
    # as a database upgraded from a schema that kept webhook changes out of the log
    table = lg.store.events_table()
    with lg.store.write() as tx:
        tx.execute(f"DELETE FROM {table}")  # noqa: S608 (our own table name)
        tx.execute("UPDATE lg_webhook_changes SET position = NULL")
    clock.advance(10)
    change_webhook(lg, OPERATOR, hook.webhook_id, url="http://127.0.0.1:9/b", reason="moved")
    remove_webhook(lg, OPERATOR, hook.webhook_id, reason="done")
    assert [(type(e), e.originator_version) for _p, e in _webhook_events(lg)] == [
        (WebhookChanged, 1),
        (WebhookRemoved, 2),
    ]
    assert [c.command for c in webhook_changes(lg)] == ["remove", "change", "add"]
    assert [t.command for t in lg.audit()] == ["webhook_change", "webhook_remove"]
    report = lg.verify()
    assert report.ok, report.problems
