"""Archiving never pulls transitions from under the change feed's readers: while a
follower or a webhook has not passed a run's transitions, its archive is refused, naming
them; `force` with a reason archives anyway and records why in the run's Archived event."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import IllegalTransition, InvalidInput, Ledger
from ledger.feed.webhooks import add_webhook, remove_webhook
from tests.support.runs import OPERATOR, finished_run

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
