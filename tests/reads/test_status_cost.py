"""A status read costs O(leases held), not O(run) (the page never fetches a
whole large run; the operator page reads `/runs/{id}` on every refresh), measured
structurally as tests/reads/test_paging_cost.py measures pages: the rows the statements' scans
read on PostgreSQL, the virtual machine instructions on SQLite.

On PostgreSQL the plans are taken with sequential scans off: both runs share one small
table, which the planner reads whole for either run, where a ledger large enough to
matter reads its indexes.

Two runs are built alike, one ten times the other, each with the same few items claimed,
one optional item and the rest pending. Before the required items still open were
counted from the counts (ledger/reads/signals.py), the status read walked every open item of
the run to count them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger import Ledger
from ledger.reads import runpage
from tests.reads.test_paging_cost import GROWTH, cost, ledger_with_runs
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest

SMALL, BIG = 600, 6000
CLAIMED = 20


def _build(lg: Ledger, clock: ManualClock, n: int) -> str:
    m = manifest(n, lease_seconds=3600)
    m["items"][n // 2]["required"] = False
    run = lg.submit(m, SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    clock.advance(1)
    assert len(lg.claim(run, WORKER, limit=CLAIMED)) == CLAIMED
    clock.advance(1)
    return run


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Ledger, dict[int, str]]]:
    yield from ledger_with_runs(request, tmp_path_factory, _build, (SMALL, BIG))


@pytest.mark.parametrize("name", ["status", "board row"])
def test_a_status_read_costs_the_same_on_a_run_ten_times_larger(
    built: tuple[str, Ledger, dict[int, str]], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind, lg, runs = built
    costs = {}
    for n, run in runs.items():
        status = lg.status(run)
        # what is read is right: every required item not finished remains (the optional
        # one does not hold the run up), and the claims' worker holds the leases
        assert status.counts["pending"] == n - CLAIMED
        assert status.waiting_on_actors == [WORKER.id]
        assert runpage.board_row(lg.store, run).remaining_required == n - 1
        reads = {
            "status": lambda r=run: lg.status(r),
            "board row": lambda r=run: runpage.board_row(lg.store, r),
        }
        read = reads[name]
        read()  # warm: caches, prepared statements
        costs[n] = cost(kind, lg, read, monkeypatch, seqscan=False)
    assert costs[BIG] <= costs[SMALL] * GROWTH, (name, costs)
    if kind == "postgres":
        # and not O(ledger): both runs share the tables, so a read that walks every open
        # item of the ledger (the lease index on state alone did) costs alike for both
        assert costs[BIG] < SMALL // 2, (name, costs)
