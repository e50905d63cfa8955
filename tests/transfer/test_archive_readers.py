"""Archiving never pulls transitions from under the change feed's readers: while a
follower or a webhook has not passed a run's transitions, its archive is refused, naming
them; `force` with a reason archives anyway and records why in the run's Archived event.
A restore never puts events back behind a reader that passed their positions without
seeing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger import IllegalTransition, InvalidInput, Ledger
from ledger.feed.follower import Follower, reset
from ledger.feed.webhooks import add_webhook, remove_webhook
from tests.support.clock import ManualClock
from tests.support.drive import event_count
from tests.support.runs import OPERATOR, SUBMITTER, finished_run, manifest

SECRET = "whsec_" + "A" * 43


LOCAL = {"allow_http": True, "allow_host": "127.0.0.1", "reason": "a receiver on this machine"}


@pytest.mark.usefixtures("webhook_key")
def test_an_archive_waits_for_a_webhook_that_has_not_delivered(lg: Ledger, tmp_path: Path) -> None:
    hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/hook", secret=SECRET, after=0, **LOCAL)
    run_id = finished_run(lg, 2)
    before = len(lg.history(run_id))
    with pytest.raises(IllegalTransition, match=hook.webhook_id):
        lg.archive(OPERATOR, tmp_path / "a.jsonl", runs=[run_id])
    assert not (tmp_path / "a.jsonl").exists()
    assert len(lg.history(run_id)) == before and lg.archived(run_id) is None
    with pytest.raises(InvalidInput, match="reason"):
        lg.archive(OPERATOR, tmp_path / "a.jsonl", runs=[run_id], force=True)
    lg.archive(OPERATOR, tmp_path / "a.jsonl", runs=[run_id], force=True, reason="receiver retired")
    record = lg.archived(run_id)
    assert record is not None


@pytest.mark.usefixtures("webhook_key")
def test_an_archive_goes_ahead_once_readers_have_passed(lg: Ledger, tmp_path: Path) -> None:
    hook = add_webhook(lg, OPERATOR, "http://127.0.0.1:9/hook", secret=SECRET, after=0, **LOCAL)
    run_id = finished_run(lg, 1)
    remove_webhook(lg, OPERATOR, hook.webhook_id, reason="retired")  # no reader left behind
    summary = lg.archive(OPERATOR, tmp_path / "a.jsonl", runs=[run_id])
    assert summary.runs == [run_id]


def _transitions_of(run_id: str, seen: list[Any]) -> int:
    return sum(1 for t in seen if t.run_id == run_id)


def test_a_restore_refuses_while_a_reader_passed_the_positions_without_seeing_them(
    lg: Ledger, clock: ManualClock, tmp_path: Path
) -> None:
    """A follower that existed when the run was archived had handled its transitions (an
    archive waits for it); one that started later and passed their positions never saw
    them, and restored behind its checkpoint it never would: the restore names it and
    writes nothing, and once it is moved back, it is handed them."""
    run_id = finished_run(lg, 2)
    early: list[Any] = []
    with Follower(lg, "early", early.extend) as f:
        f.catch_up()
    assert _transitions_of(run_id, early) > 0
    handled_early = len(early)
    clock.advance(60)
    lg.archive(OPERATOR, tmp_path / "a.jsonl", runs=[run_id])
    clock.advance(60)
    lg.submit(manifest(1), SUBMITTER)  # the feed goes on past the archived positions
    late: list[Any] = []
    with Follower(lg, "late", late.extend) as f:
        f.catch_up()
    assert _transitions_of(run_id, late) == 0
    events = event_count(lg)
    with pytest.raises(IllegalTransition, match="late") as info:
        lg.restore(OPERATOR, tmp_path / "a.jsonl")
    assert "early" not in str(info.value)
    assert lg.archived(run_id) is not None and event_count(lg) == events
    reset(lg, "late", 0)
    summary = lg.restore(OPERATOR, tmp_path / "a.jsonl")
    assert summary.runs == [run_id]
    with Follower(lg, "late", late.extend) as f:
        f.catch_up()
    assert _transitions_of(run_id, late) == len(lg.history(run_id))
    with Follower(lg, "early", early.extend) as f:
        f.catch_up()
    assert _transitions_of(run_id, early[handled_early:]) == 0  # nothing twice
    assert lg.verify().ok


def test_a_restore_refuses_while_a_reader_an_archive_left_behind_has_moved_on(
    lg: Ledger, clock: ManualClock, tmp_path: Path
) -> None:
    behind: list[Any] = []
    with Follower(lg, "behind", behind.extend) as f:
        f.catch_up()  # its checkpoint exists, before the run's transitions
    clock.advance(60)
    run_id = finished_run(lg, 1)
    lg.archive(OPERATOR, tmp_path / "a.jsonl", runs=[run_id], force=True, reason="retired")
    lg.submit(manifest(1), SUBMITTER)
    with Follower(lg, "behind", behind.extend) as f:
        f.catch_up()  # past the positions the archived events held
    assert _transitions_of(run_id, behind) == 0
    with pytest.raises(IllegalTransition, match="behind"):
        lg.restore(OPERATOR, tmp_path / "a.jsonl")
    assert lg.archived(run_id) is not None
