"""`ledger top --once` on a seeded ledger: the tallies, and the stuck runs listed first."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.cli.entry import main
from tests.support.operator_seed import seed


def test_top_lists_the_stuck_runs_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dsn = f"sqlite:///{tmp_path}/ledger.db"
    runs = seed(dsn, finished=3)
    capsys.readouterr()
    assert main(["--dsn", dsn, "top", "--once"]) == 0
    out = capsys.readouterr().out
    assert "5 open runs" in out
    assert "stalled 1" in out and "expired leases 3 in 1 runs" in out
    assert "reviewer 1 (oldest 2h 00m)" in out
    # the table's rows, those naming a run (plain in a pipe, boxed on a terminal)
    lines = [line for line in out.splitlines() if any(r in line for r in runs.values())]
    order = [name for line in lines for name, run_id in runs.items() if run_id in line]
    # stuck first (the dead worker's run, the idle one), then the longest waits
    assert order[:2] == ["dead", "idle"]
    assert order[2] == "review"
    assert "3 EXPIRED" in lines[0] and "reconciler" in lines[0]
    assert "STALLED" in lines[1]


def test_a_frame_from_a_snapshot_says_how_old_it_is(tmp_path: Path) -> None:
    from dataclasses import replace

    from rich.console import Console

    from ledger import Ledger
    from ledger.cli.top import render_overview

    dsn = f"sqlite:///{tmp_path}/ledger.db"
    seed(dsn, finished=1)
    with Ledger.open(dsn) as lg:
        ov = lg.overview()
    console = Console(width=200, record=True)
    console.print(render_overview(ov, table=False))
    assert " old)" not in console.export_text()
    console.print(render_overview(replace(ov, age_seconds=3.2), table=False))
    assert "(3s old)" in console.export_text()
