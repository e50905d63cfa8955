"""scripts/make_ledger.py (the 1M-event ledger of the README's "Audit and rebuild") at a tiny size."""

from __future__ import annotations

import sys
from pathlib import Path

from ledger import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import make_ledger


def test_make_ledger_fills_to_the_target_with_a_history_that_verifies(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/small.db"
    n = make_ledger.fill(dsn, 700, items_per_run=40, batch=7, seed=1, quiet=True)
    assert 700 <= n < 800
    with Ledger.open(dsn) as lg:
        assert make_ledger.event_count(lg) == n
        runs = lg.runs()
        states = {r.state for r in runs}
        assert len(runs) >= 5  # the fifth run is the canceled one
        assert "canceled" in states
        assert states <= {"succeeded", "completed_with_errors", "canceled"}
        kinds = {(t.command, t.to_state) for r in runs for t in lg.history(r.run_id)}
        assert {
            ("claim", "in_progress"),
            ("accept", "accepted"),
            ("fail_attempt", "retryable"),
            ("reject", "rejected"),
        } <= kinds
        report = lg.verify()
        assert report.ok, report.problems
        assert report.events == n
    # topping up adds runs with new scopes and keeps the history clean
    m = make_ledger.fill(dsn, n + 100, items_per_run=40, batch=7, seed=2, quiet=True)
    assert m >= n + 100
