"""One page costs O(page), not O(run) (the page never fetches a whole large run),
measured structurally, never by time.

Two runs are built alike, one ten times the other (every item claimed, one claim of
CLAIM items per clock tick, so each start time is shared by one claim's attempts), and
the same page (PAGE values after a cursor in the middle of the run) is read from each:

- PostgreSQL: every statement the read sends is captured and run again under
  `EXPLAIN (ANALYZE, FORMAT JSON)`; its cost is the rows its scans read (returned plus
  removed by a filter, times loops), after an ANALYZE so plans are the planner's real ones.
- SQLite: the virtual machine instructions the read executes (a progress handler).

A read whose cost grows with the run (a count or a join over every item or attempt)
costs about ten times as much on the big run; a keyset page costs about the same. (A
run-wide attempts page also reads the attempts that share the cursor's start time: at
most one claim's, MAX_CLAIM = 1,000, under a clock that moves.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ledger import Ledger
from ledger.core.rows import iso
from ledger.reads import runpage
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest

SMALL, BIG = 600, 6000
CLAIM = 100  # attempts per claim, all started at the same time
PAGE = 50
GROWTH = 1.25  # the big run's page may cost at most this many times the small run's


def _reads(lg: Ledger, run: str, n: int) -> dict[str, Callable[[], Any]]:
    """Each paged read of one page after a cursor in the middle of the run (the cursors
    are found here, unmeasured)."""
    attempts = lg.attempts(run)
    mid = attempts[len(attempts) // 2]
    key = f"{mid.item_id}:{mid.attempt}"
    board_key = f"{iso(mid.started_at)}|{mid.item_id}|{mid.attempt}"
    position = lg.history(run, limit=n // 2)[-1].position
    item = f"i{n // 2}"
    return {
        "items": lambda: lg.items(run, limit=PAGE, after=item),
        "items in a state": lambda: lg.items(run, state="in_progress", limit=PAGE, after=item),
        "attempts": lambda: lg.attempts(run, limit=PAGE, after=key),
        "one item's attempts": lambda: lg.attempts(run, item_id=item, limit=PAGE),
        "history": lambda: lg.history(run, limit=PAGE, after=position),
        "audit of the run": lambda: list(lg.audit(run_id=run, after=position, limit=PAGE)),
        "audit of the run, newest first": lambda: list(
            lg.audit(run_id=run, newest_first=True, after=position, limit=PAGE)
        ),
        "operator page: items": lambda: runpage.item_page(lg.store, run, after=n // 2, limit=PAGE),
        "operator page: attempts": lambda: runpage.attempt_page(
            lg.store, run, after=board_key, limit=PAGE
        ),
    }


READS = [
    "items",
    "items in a state",
    "attempts",
    "one item's attempts",
    "history",
    "audit of the run",
    "audit of the run, newest first",
    "operator page: items",
    "operator page: attempts",
]


def _build(lg: Ledger, clock: ManualClock, n: int) -> str:
    run = lg.submit(manifest(n, lease_seconds=3600), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    for _ in range(n // CLAIM):
        clock.advance(0.001)
        assert len(lg.claim(run, WORKER, limit=CLAIM)) == CLAIM
    return run


def ledger_with_runs(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    build: Callable[[Ledger, ManualClock, int], str],
    sizes: tuple[int, ...],
) -> Iterator[tuple[str, Ledger, dict[int, str]]]:
    """A ledger on the store `request.param` names with one run per size (`build`), its
    statistics fresh on PostgreSQL; (store, ledger, run id by size)."""
    if request.param == "sqlite":
        dsn = f"sqlite:///{tmp_path_factory.mktemp('cost')}/ledger.db"
        dbs = None
    else:
        dbs = request.getfixturevalue("pg_databases")
        name, dsn = dbs.create()
    clock = ManualClock()
    lg = Ledger.open(dsn, clock=clock)
    try:
        runs = {n: build(lg, clock, n) for n in sizes}
        if request.param == "postgres":
            with lg.store.write() as tx:
                tx.execute("ANALYZE")
        yield request.param, lg, runs
    finally:
        lg.close()
        if dbs is not None:
            dbs.drop(name)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Ledger, dict[int, str]]]:
    yield from ledger_with_runs(request, tmp_path_factory, _build, (SMALL, BIG))


def _pg_rows(lg: Ledger, statements: list[tuple[str, Any]], seqscan: bool = True) -> int:
    from ledger.stores.postgres import to_pg

    total = 0
    with lg.store.read() as tx:
        if not seqscan:  # a session setting: a read may not be a transaction
            tx.cur.execute("SET enable_seqscan = off")
        try:
            for sql, params in statements:
                tx.cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + to_pg(sql), params)
                (plan,) = tx.cur.fetchone().values()
                stack = [plan[0]["Plan"]]
                while stack:
                    node = stack.pop()
                    if "Scan" in node["Node Type"]:
                        read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
                        total += read * node["Actual Loops"]
                    stack.extend(node.get("Plans", []))
        finally:
            if not seqscan:
                tx.cur.execute("RESET enable_seqscan")
    return total


def cost(
    kind: str,
    lg: Ledger,
    read: Callable[[], Any],
    monkeypatch: pytest.MonkeyPatch,
    seqscan: bool = True,
) -> int:
    """What one call of `read` costs the database (see the module's docstring); with
    `seqscan=False` PostgreSQL plans as for tables too large to read whole."""
    if kind == "sqlite":
        steps = [0]

        def tick() -> int:
            steps[0] += 1
            return 0

        conn = lg.store._conn()  # type: ignore[attr-defined]
        conn.set_progress_handler(tick, 10)
        try:
            read()
        finally:
            conn.set_progress_handler(None, 0)
        return steps[0]
    from ledger.stores.postgres import PgTx

    statements: list[tuple[str, Any]] = []
    original = PgTx.fetchall

    def capture(self: PgTx, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        statements.append((sql, tuple(params)))
        return original(self, sql, params)

    with monkeypatch.context() as m:
        m.setattr(PgTx, "fetchall", capture)
        read()
    return _pg_rows(lg, statements, seqscan)


@pytest.mark.parametrize("name", READS)
def test_a_page_costs_the_same_on_a_run_ten_times_larger(
    built: tuple[str, Ledger, dict[int, str]], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind, lg, runs = built
    # the run page counts attempts up to a cap (ledger/reads/runpage.py): below both runs' sizes
    # here, so what is compared is the count's cost, not the cap's (before the cap, the
    # count read every attempt of the run)
    monkeypatch.setattr(runpage, "ATTEMPT_COUNT_CAP", SMALL // 4, raising=False)
    costs = {}
    for n, run in runs.items():
        read = _reads(lg, run, n)[name]
        read()  # warm: caches, prepared statements
        costs[n] = cost(kind, lg, read, monkeypatch)
    assert costs[BIG] <= costs[SMALL] * GROWTH, (name, costs)
