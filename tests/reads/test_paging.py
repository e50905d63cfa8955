"""Paged reads: `items`, `attempts` and `history` take `limit` and a keyset
cursor `after`; without them they return everything, read page by page.

The expected lists are built from what the test did (manifest order, the attempts it
made, the commands it ran), not from the reads under test."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import InvalidInput, Ledger
from ledger.reads import paging
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest

N = 23  # items: several pages of 5, the last one short


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads that return everything page by 4 rows, so a small run spans many pages."""
    monkeypatch.setattr(paging, "PAGE", 4)


def busy_run(lg: Ledger, clock: ManualClock) -> tuple[str, list[tuple[str, int, Any]]]:
    """A running run of N items; three rounds of claims (several items per claim share
    a start time), some attempts failed and retried. Returns the run id and the attempts
    made as (item_id, attempt, started_at)."""
    run = lg.submit(manifest(N, max_attempts=5), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    made: list[tuple[str, int, Any]] = []
    for round_ in range(3):
        clock.advance(1)
        leases = lg.claim(run, WORKER, limit=7 + round_)
        for lease in leases:
            made.append((lease.item_id, lease.attempt, clock()))
        for k, lease in enumerate(leases):
            if k % 2:
                lg.fail_attempt(lease, "boom", retryable=True)
            else:
                lg.accept(lease)
        clock.advance(60)  # past any retry delay
    return run, made


def page_through(read: Any, key: Any, limit: int) -> list[Any]:
    """Every value, page by page, each page's cursor from its last value."""
    out: list[Any] = []
    after = None
    while True:
        page = read(limit=limit, after=after)
        assert len(page) <= limit
        out.extend(page)
        if len(page) < limit:
            return out
        after = key(page[-1])


def test_items_pages(lg: Ledger, small_pages: None) -> None:
    run = lg.submit(manifest(N), SUBMITTER).run_id
    expected = [f"i{k}" for k in range(N)]
    assert [i.item_id for i in lg.items(run)] == expected  # everything, over 6 pages
    for limit in (1, 5, N, N + 1):
        got = page_through(lambda **kw: lg.items(run, **kw), lambda i: i.item_id, limit)
        assert [i.item_id for i in got] == expected
    assert lg.items(run, limit=5, after="i21") == lg.items(run)[22:]
    assert lg.items(run, limit=5, after=f"i{N - 1}") == []  # past the end


def test_items_pages_by_state(lg: Ledger, clock: ManualClock, small_pages: None) -> None:
    run, _ = busy_run(lg, clock)
    everything = lg.items(run)
    for state in ("accepted", "retryable", "pending"):
        expected = [i.item_id for i in everything if i.state == state]
        assert expected, state
        assert [i.item_id for i in lg.items(run, state=state)] == expected
        got = page_through(
            lambda s=state, **kw: lg.items(run, state=s, **kw), lambda i: i.item_id, 3
        )
        assert [i.item_id for i in got] == expected
    # the cursor item need not be in the state asked for: paging continues after it
    pending = [i.item_id for i in everything if i.state == "pending"]
    assert [i.item_id for i in lg.items(run, state="pending", limit=100, after="i0")] == pending


def test_attempts_pages(lg: Ledger, clock: ManualClock, small_pages: None) -> None:
    run, made = busy_run(lg, clock)
    index = {f"i{k}": k for k in range(N)}
    # oldest first: start time, then manifest order, then attempt number
    expected = sorted(made, key=lambda m: (m[2], index[m[0]], m[1]))
    assert len(expected) > 3 * paging.PAGE
    want = [(m[0], m[1]) for m in expected]
    assert [(a.item_id, a.attempt) for a in lg.attempts(run)] == want
    for limit in (1, 4, 7, len(want)):
        got = page_through(
            lambda **kw: lg.attempts(run, **kw), lambda a: f"{a.item_id}:{a.attempt}", limit
        )
        assert [(a.item_id, a.attempt) for a in got] == want
    # the tuple form of the cursor
    first = lg.attempts(run, limit=3)
    assert (
        lg.attempts(run, limit=3, after=(first[-1].item_id, first[-1].attempt))
        == (lg.attempts(run)[3:6])
    )
    last = want[-1]
    assert lg.attempts(run, limit=10, after=f"{last[0]}:{last[1]}") == []


def test_attempts_of_one_item_pages(lg: Ledger, clock: ManualClock, small_pages: None) -> None:
    run = lg.submit(manifest(1, max_attempts=9), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    for _ in range(7):
        (lease,) = lg.claim(run, WORKER)
        lg.fail_attempt(lease, "again", retryable=True)
        clock.advance(3600)
    numbers = list(range(1, 8))
    assert [a.attempt for a in lg.attempts(run, item_id="i0")] == numbers
    got = page_through(
        lambda **kw: lg.attempts(run, item_id="i0", **kw), lambda a: f"{a.item_id}:{a.attempt}", 2
    )
    assert [a.attempt for a in got] == numbers
    assert lg.attempts(run, item_id="i0", limit=2, after="i0:7") == []


def test_history_pages(lg: Ledger, clock: ManualClock, small_pages: None) -> None:
    run, made = busy_run(lg, clock)
    everything = lg.history(run)
    # submit, start, then per attempt: the claim and its outcome
    assert len(everything) == 2 + 2 * len(made)
    positions = [t.position for t in everything]
    assert positions == sorted(set(positions))  # in order, no duplicates
    assert everything[0].command == "submit"
    assert everything == [t for t in lg.audit(run_id=run)]  # another read path agrees
    for limit in (1, 4, 9):
        got = page_through(lambda **kw: lg.history(run, **kw), lambda t: t.position, limit)
        assert got == everything
    assert lg.history(run, limit=5, after=positions[-1]) == []
    assert lg.history(run, limit=2, after=0) == everything[:2]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 0},
        {"limit": -1},
        {"limit": 10_001},
        {"limit": True},
        {"limit": 1.5},
        {"limit": "10"},
        {"after": 123},
        {"after": "no-such-item"},
        {"after": "bad\u200bid"},
        {"after": ["i0"]},
    ],
)
def test_items_bad_page(lg: Ledger, kwargs: dict[str, Any]) -> None:
    run = lg.submit(manifest(3), SUBMITTER).run_id
    with pytest.raises(InvalidInput):
        lg.items(run, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 0},
        {"limit": 10**30},
        {"after": "i0"},
        {"after": "i0:"},
        {"after": "i0:x"},
        {"after": "i0:-1"},
        {"after": "i0:0"},
        {"after": "i0:99"},
        {"after": "nope:1"},
        {"after": ("i0",)},
        {"after": ("i0", "1")},
        {"after": 5},
        {"item_id": "i1", "after": "i0:1"},
    ],
)
def test_attempts_bad_page(lg: Ledger, kwargs: dict[str, Any]) -> None:
    run = lg.submit(manifest(3), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    lg.claim(run, WORKER, limit=3)
    with pytest.raises(InvalidInput):
        lg.attempts(run, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 0},
        {"limit": 10_001},
        {"after": -1},
        {"after": 2**63},
        {"after": "3"},
        {"after": True},
    ],
)
def test_history_bad_page(lg: Ledger, kwargs: dict[str, Any]) -> None:
    run = lg.submit(manifest(3), SUBMITTER).run_id
    before = lg.history(run)
    with pytest.raises(InvalidInput):
        lg.history(run, **kwargs)
    assert lg.history(run) == before  # nothing written


def test_paged_reads_use_an_index(tmp_path: Any) -> None:
    """On SQLite the page queries search an index rather than scanning or sorting the
    whole run (EXPLAIN QUERY PLAN)."""
    lg = Ledger.open(f"sqlite:///{tmp_path}/l.db")
    try:
        lg.submit(manifest(3), SUBMITTER)
        with lg.store.read() as tx:

            def plan(sql: str, params: tuple[Any, ...]) -> str:
                rows = tx.fetchall("EXPLAIN QUERY PLAN " + sql, params)
                return " | ".join(str(r["detail"]) for r in rows)

            p = plan(
                "SELECT * FROM lg_items WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                ("r", 0, 5),
            )
            assert "lg_items_seq" in p and "TEMP B-TREE" not in p, p
            key = ("r", "a", "a", 1, 1, 1)
            p = plan(paging._RUN_ATTEMPTS, (*key, 5, *key, 5, 5))
            # the ended attempts by start time, the open ones (the leases) too
            assert "lg_attempts_started" in p and "lg_items_leased" in p, p
    finally:
        lg.close()
