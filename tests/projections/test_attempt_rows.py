"""An attempt is one row, written once, when the attempt ends; while it is open it is read
from its item's lease. Either way every read of attempts gives the attempt's worker, lease
token, start, expiry and, once it ended, its end, stage, outcome and cleaned error: the
same live and after a rebuild, on every store, through heartbeats, expiry, retries,
cancel and fail, archive and restore, export and import."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path
from typing import Any

from ledger import Ledger
from ledger.core.rows import iso
from ledger.core.views import Attempt, Lease
from ledger.projections.checksums import checksums
from ledger.reads import runpage
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, RECONCILER, SUBMITTER, WORKER, manifest


def attempt_rows(lg: Ledger, run_id: str) -> list[tuple[Any, ...]]:
    """The run's rows of lg_attempts as stored (the attempts that ended)."""
    with lg.store.read() as tx:
        rows = tx.fetchall(
            "SELECT item_id, attempt, finished_at FROM lg_attempts WHERE run_id = ? "
            "ORDER BY item_id, attempt",
            (run_id,),
        )
    return [(r["item_id"], r["attempt"], r["finished_at"]) for r in rows]


def every_read(lg: Ledger, run_id: str) -> list[Attempt]:
    """The run's attempts read whole, and read again one page of one at a time and item by
    item: the three must agree (returned: the whole read)."""
    whole = lg.attempts(run_id)
    paged: list[Attempt] = []
    after = None
    while page := lg.attempts(run_id, limit=1, after=after):
        paged.extend(page)
        after = f"{page[-1].item_id}:{page[-1].attempt}"
    assert paged == whole
    by_item = [a for i in sorted({a.item_id for a in whole}) for a in lg.attempts(run_id, i)]
    assert sorted(by_item, key=lambda a: (a.item_id, a.attempt)) == sorted(
        whole, key=lambda a: (a.item_id, a.attempt)
    )
    board = runpage.attempt_page(lg.store, run_id, limit=500)
    assert board.total == len(whole)
    assert [(a.item_id, a.attempt, a.finished_at) for a in board.attempts] == [
        (a.item_id, a.attempt, a.finished_at) for a in reversed(whole)
    ]
    return whole


def started(lease: Lease, clock: ManualClock) -> dict[str, Any]:
    return {
        "item_id": lease.item_id,
        "attempt": lease.attempt,
        "worker_id": WORKER.id,
        "lease_token": lease.token,
        "started_at": clock(),
        "expires_at": lease.expires_at,
        "finished_at": None,
        "stage": None,
        "outcome": None,
        "error": None,
    }


def fields(a: Attempt) -> dict[str, Any]:
    return {
        "item_id": a.item_id,
        "attempt": a.attempt,
        "worker_id": a.worker_id,
        "lease_token": a.lease_token,
        "started_at": a.started_at,
        "expires_at": a.expires_at,
        "finished_at": a.finished_at,
        "stage": a.stage,
        "outcome": a.outcome,
        "error": a.error,
    }


def test_an_attempt_is_read_from_its_lease_while_open_and_from_its_row_once_ended(
    lg: Ledger, clock: ManualClock
) -> None:
    run = lg.submit(manifest(3, max_attempts=3, lease_seconds=60), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    first = lg.claim(run, WORKER, limit=1)[0]
    want = started(first, clock)
    assert [fields(a) for a in every_read(lg, run)] == [want]
    assert attempt_rows(lg, run) == []  # open: no row yet

    clock.advance(30)
    moved = lg.heartbeat(first)
    assert moved.expires_at > first.expires_at
    want["expires_at"] = moved.expires_at  # the start stays; the expiry follows the lease
    assert [fields(a) for a in every_read(lg, run)] == [want]
    assert attempt_rows(lg, run) == []  # a heartbeat writes the item row only

    clock.advance(5)
    lg.fail_attempt(first, "upstream 503 at https://user:secret@example.test/x", stage="fetch")
    [ended] = every_read(lg, run)
    assert fields(ended) | {"error": None} == want | {
        "finished_at": clock(),
        "stage": "fetch",
        "outcome": "failed",
    }
    assert ended.error is not None and "secret" not in ended.error  # cleaned, as recorded
    assert attempt_rows(lg, run) == [(first.item_id, 1, iso(ended.finished_at))]

    # the retry is attempt 2 of the same item, after attempt 1 in start order
    clock.advance(1)
    second = lg.claim(run, WORKER, limit=3)
    retried = next(le for le in second if le.item_id == first.item_id)
    assert retried.attempt == 2
    attempts = every_read(lg, run)
    assert (attempts[0].item_id, attempts[0].attempt, attempts[0].outcome) == (
        first.item_id,
        1,
        "failed",
    )
    assert fields(next(a for a in attempts if a.attempt == 2)) == started(retried, clock)
    assert len(attempts) == 4 and len(attempt_rows(lg, run)) == 1

    for le in second:
        lg.accept(le, stage="done")
    attempts = every_read(lg, run)
    assert [a.outcome for a in attempts] == ["failed", "accepted", "accepted", "accepted"]
    assert all(a.finished_at == clock() and a.stage == "done" for a in attempts[1:])
    assert len(attempt_rows(lg, run)) == 4


def test_expiry_and_fencing_end_the_open_attempt_with_its_last_lease(
    lg: Ledger, clock: ManualClock
) -> None:
    run = lg.submit(manifest(2, max_attempts=2, lease_seconds=60), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    lost, fenced = lg.claim(run, WORKER, limit=2)
    clock.advance(50)
    fenced = lg.heartbeat(fenced)
    clock.advance(20)  # `lost` expired, unreconciled: still open, shown as expired
    board = {a.item_id: a for a in runpage.attempt_page(lg.store, run).attempts}
    assert board[lost.item_id].lease_expired and board[lost.item_id].finished_at is None
    assert not board[fenced.item_id].lease_expired
    lg.reconcile(actor=RECONCILER)
    ended = {a.item_id: a for a in every_read(lg, run)}
    assert ended[lost.item_id].outcome == "lease_expired"
    assert ended[lost.item_id].expires_at == lost.expires_at
    assert ended[lost.item_id].finished_at == clock()
    assert ended[fenced.item_id].finished_at is None

    # a run failed with a lease live: the attempt ends abandoned, with its moved expiry
    lg.fail(run, OPERATOR, "stop", transient=True)
    ended = {a.item_id: a for a in every_read(lg, run)}
    assert ended[fenced.item_id].outcome == "abandoned"
    assert ended[fenced.item_id].expires_at == fenced.expires_at
    assert ended[fenced.item_id].lease_token == fenced.token
    assert len(attempt_rows(lg, run)) == 2


def test_cancel_keeps_the_open_attempt_until_its_outcome(lg: Ledger, clock: ManualClock) -> None:
    run = lg.submit(manifest(2), SUBMITTER).run_id
    lg.start(run, CONTROLLER)
    [live] = lg.claim(run, WORKER, limit=1)
    assert lg.cancel(run, SUBMITTER, reason="stop").state == "canceling"
    assert [fields(a) for a in every_read(lg, run)] == [started(live, clock)]
    clock.advance(1)
    lg.accept(live)
    [a] = every_read(lg, run)
    assert (a.outcome, a.finished_at) == ("accepted", clock())


def some_attempts(lg: Ledger, clock: ManualClock) -> list[str]:
    """A finished run (retries, heartbeats, expiry) and a running one with open attempts."""
    done = lg.submit(manifest(4, max_attempts=3, lease_seconds=60), SUBMITTER).run_id
    lg.start(done, CONTROLLER)
    a, b, _c = lg.claim(done, WORKER, limit=3)
    clock.advance(10)
    lg.heartbeat(a)
    lg.fail_attempt(b, "flaky")
    clock.advance(100)
    lg.reconcile(actor=RECONCILER)  # a and c expire
    while leases := lg.claim(done, WORKER, limit=5):
        clock.advance(1)
        for le in leases:
            lg.accept(le)
    lg.complete(done, CONTROLLER)

    live = lg.submit(manifest(3, lease_seconds=600), SUBMITTER).run_id
    lg.start(live, CONTROLLER)
    x, _y = lg.claim(live, WORKER, limit=2)
    clock.advance(5)
    lg.heartbeat(x)
    clock.advance(1)
    lg.accept(x)
    lg.claim(live, WORKER, limit=1)
    return [done, live]


def test_a_rebuild_writes_the_rows_the_commands_wrote(lg: Ledger, clock: ManualClock) -> None:
    runs = some_attempts(lg, clock)
    before = {r: every_read(lg, r) for r in runs}
    assert any(a.finished_at is None for a in before[runs[1]])
    with lg.store.read() as tx:
        live = checksums(tx)
    lg.rebuild_projections()
    with lg.store.read() as tx:
        assert checksums(tx) == live  # item rows (leases) and attempt rows alike
    assert {r: every_read(lg, r) for r in runs} == before
    assert lg.verify().ok


def test_export_import_and_archive_restore_keep_every_attempt(
    lg: Ledger, clock: ManualClock, tmp_path: Path
) -> None:
    runs = some_attempts(lg, clock)
    before = {r: every_read(lg, r) for r in runs}
    out = io.StringIO()
    lg.export(out)
    with Ledger.open("memory://") as copy:
        copy.import_file(io.StringIO(out.getvalue()))
        assert {r: every_read(copy, r) for r in runs} == before
        with lg.store.read() as tx, copy.store.read() as ctx:
            mine, theirs = checksums(tx), checksums(ctx)
        for table in ("lg_items", "lg_attempts"):
            assert mine[table] == theirs[table], table

    clock.advance(3600)
    path = tmp_path / "archive.jsonl"
    lg.archive(OPERATOR, path, terminal_before=clock() - timedelta(minutes=30))
    assert attempt_rows(lg, runs[0]) == []  # its rows left with its events
    assert lg.restore(OPERATOR, path).runs == [runs[0]]
    assert every_read(lg, runs[0]) == before[runs[0]]
    assert every_read(lg, runs[1]) == before[runs[1]]
