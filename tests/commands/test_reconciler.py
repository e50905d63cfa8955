"""The reconciler: expires stale leases (outcome `lease_expired`), finishes cancels and
pauses whose owner died, fails runs past their deadline only once no lease is live,
and never marks anything accepted or succeeded.

The first part runs on every store with the injected clock. The second part runs
several reconciler processes (and racing worker processes) against one PostgreSQL
database: leases are never expired twice, a worker's racing outcome and an expiry
never both land, and each run-level finish happens exactly once. Those processes
pass an explicit `now=` to `reconcile`, so no test depends on wall-clock timing;
one test runs `ledger reconcile --watch` processes on the server's own clock and
only waits (bounded) for them to act.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from ledger import Actor, Lease, LeaseLost, Ledger, NotAuthorized
from tests.support.clock import ManualClock
from tests.support.drive import event_count
from tests.support.runs import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER, manifest, running

WAIT = 60.0  # seconds: a bound on waiting for other processes, never a timing assertion
NEVER_BY_RECONCILER = {"accepted", "succeeded", "completed_with_errors"}


def reconciler_targets(lg: Ledger) -> set[str]:
    """Every state a reconciler-role transition ever moved something to."""
    return {t.to_state for t in lg.audit(role="reconciler")}


# --------------------------------------------------------------------------
# every store, injected clock
# --------------------------------------------------------------------------
def test_expired_leases_are_recorded_as_lease_expired_and_count_as_attempts(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 2, lease_seconds=10, max_attempts=2, backoff_seconds=5)
    lg.claim(run_id, WORKER, limit=2)
    clock.advance(11)
    report = lg.reconcile()
    assert (report.expired_leases, report.failed_runs) == (2, 0)
    assert {i.item_id: (i.state, i.attempts, i.lease) for i in lg.items(run_id)} == {
        "i0": ("retryable", 1, None),
        "i1": ("retryable", 1, None),
    }
    assert [a.outcome for a in lg.attempts(run_id)] == ["lease_expired", "lease_expired"]
    assert all(a.finished_at is not None for a in lg.attempts(run_id))

    # the backoff applies to expired attempts too, and the second expiry exhausts them
    assert lg.claim(run_id, WORKER, limit=2) == []
    clock.advance(5)
    assert len(lg.claim(run_id, WORKER, limit=2)) == 2
    clock.advance(11)
    assert lg.reconcile().expired_leases == 2
    assert {i.state for i in lg.items(run_id)} == {"quarantined"}
    assert [a.outcome for a in lg.attempts(run_id, "i0")] == ["lease_expired", "lease_expired"]
    assert lg.status(run_id).waiting_on == "reviewer"

    # the expiry transitions carry the reconciler as actor and the lease as evidence
    expiries = [t for t in lg.history(run_id) if t.command == "expire"]
    assert len(expiries) == 4
    assert all(t.role == "reconciler" and t.from_state == "in_progress" for t in expiries)
    assert all(
        t.evidence["outcome"] == "lease_expired" and t.evidence["lease_token"] for t in expiries
    )


def test_reconcile_twice_writes_nothing_the_second_time(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 3, lease_seconds=10)
    lg.claim(run_id, WORKER, limit=3)
    clock.advance(60)
    assert lg.reconcile().expired_leases == 3
    before = event_count(lg)
    report = lg.reconcile()
    assert (
        report.expired_leases,
        report.finished_cancels,
        report.finished_pauses,
        report.failed_runs,
    ) == (0, 0, 0, 0)
    assert event_count(lg) == before


def test_live_leases_are_left_alone(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 2, lease_seconds=30)
    (lease,) = lg.claim(run_id, WORKER)
    clock.advance(29)
    before = event_count(lg)
    assert lg.reconcile().expired_leases == 0
    assert event_count(lg) == before
    assert lg.accept(lease).state == "accepted"


def test_run_deadline_fails_only_once_no_lease_is_live(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 2, lease_seconds=600, run_deadline_seconds=60)
    first, second = lg.claim(run_id, WORKER, limit=2)
    clock.advance(120)  # past the run deadline, leases still live
    before = event_count(lg)
    assert lg.reconcile().failed_runs == 0
    assert event_count(lg) == before and lg.status(run_id).state == "running"
    lg.accept(first)
    assert lg.reconcile().failed_runs == 0  # one lease still live
    lg.fail_attempt(second, "slow upstream")
    report = lg.reconcile()
    assert report.failed_runs == 1
    st = lg.status(run_id)
    assert (st.state, st.failure_kind, st.failure_reason) == (
        "failed",
        "transient",
        "deadline_exceeded",
    )
    # the outcomes the workers reported before are kept
    assert {i.item_id: i.state for i in lg.items(run_id)} == {"i0": "accepted", "i1": "retryable"}
    assert lg.reconcile().failed_runs == 0
    assert [t.command for t in lg.history(run_id)].count("reconcile_deadline") == 1


def test_run_deadline_with_an_abandoned_lease_fails_after_expiry(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 1, lease_seconds=600, run_deadline_seconds=60)
    lg.claim(run_id, WORKER)
    clock.advance(300)
    assert lg.reconcile().failed_runs == 0
    clock.advance(301)  # the dead worker's lease has now expired: one pass expires it, then fails
    report = lg.reconcile()
    assert (report.expired_leases, report.failed_runs) == (1, 1)
    hist = lg.history(run_id)
    expire = next(t for t in hist if t.command == "expire")
    fail = next(t for t in hist if t.command == "reconcile_deadline")
    assert expire.position < fail.position


@pytest.mark.parametrize("where", ["awaiting_review", "paused", "queued"])
def test_run_deadline_in_other_states(lg: Ledger, clock: ManualClock, where: str) -> None:
    run_id = lg.submit(manifest(1, run_deadline_seconds=60), SUBMITTER).run_id
    if where != "queued":
        lg.start(run_id, CONTROLLER)
    if where == "awaiting_review":
        lg.request_review(run_id, CONTROLLER, "ok-to-ship")
    elif where == "paused":
        lg.pause(run_id, OPERATOR, "maintenance")
    clock.advance(61)
    report = lg.reconcile()
    st = lg.status(run_id)
    if where == "queued":  # the deadline counts from the start: a queued run never started
        assert report.failed_runs == 0 and st.state == "queued"
    else:
        assert report.failed_runs == 1 and (st.state, st.failure_reason) == (
            "failed",
            "deadline_exceeded",
        )


def test_cancel_whose_owner_died_is_finished_by_the_reconciler(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 4, lease_seconds=30)
    lg.claim(run_id, WORKER, limit=2)  # the worker then dies
    out = lg.cancel(run_id, SUBMITTER, "wrong input")
    assert (out.state, out.in_flight) == ("canceling", 2)
    assert lg.status(run_id).waiting_on == "workers"
    assert lg.reconcile().finished_cancels == 0  # leases still live: wait for them
    clock.advance(31)
    report = lg.reconcile()
    assert (report.expired_leases, report.finished_cancels) == (2, 1)
    st = lg.status(run_id)
    assert st.state == "canceled" and st.waiting_on == "nobody"
    assert {i.state for i in lg.items(run_id)} == {"skipped"}
    assert [a.outcome for a in lg.attempts(run_id)] == ["lease_expired", "lease_expired"]
    assert lg.reconcile().finished_cancels == 0
    assert [t.command for t in lg.history(run_id)].count("cancel_finished") == 1


def test_pause_whose_owner_died_is_finished_by_the_reconciler(
    lg: Ledger, clock: ManualClock
) -> None:
    run_id = running(lg, 3, lease_seconds=30)
    lg.claim(run_id, WORKER)
    assert lg.pause(run_id, OPERATOR, "db maintenance").state == "pausing"
    clock.advance(31)
    report = lg.reconcile()
    assert (report.expired_leases, report.finished_pauses) == (1, 1)
    assert lg.status(run_id).state == "paused"
    assert lg.resume(run_id, OPERATOR, reason="back to work").state == "running"
    assert len(lg.claim(run_id, WORKER, limit=3)) == 3


def test_item_deadline_quarantines_retryable_items(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 2, lease_seconds=10, item_deadline_seconds=100, max_attempts=5)
    a, _ = lg.claim(run_id, WORKER, limit=2)
    lg.fail_attempt(a, "flaky")  # retryable; the other lease is left to expire
    clock.advance(101)  # past the item deadline; b's lease expired too
    lg.reconcile()
    assert {i.item_id: i.state for i in lg.items(run_id)} == {
        "i0": "quarantined",
        "i1": "quarantined",
    }


def test_reconciler_never_accepts_or_succeeds(lg: Ledger, clock: ManualClock) -> None:
    done = running(lg, 2, lease_seconds=10)
    for lease in lg.claim(done, WORKER, limit=2):
        lg.accept(lease)
    half = running(lg, 2, lease_seconds=10)
    lease, _ = lg.claim(half, WORKER, limit=2)
    lg.accept(lease)
    clock.advance(3600)
    for _ in range(3):
        lg.reconcile()
    # every item is final or reconciled; nothing is complete until the controller says so
    assert lg.status(done).state == "running" and lg.status(done).waiting_on == "controller"
    assert lg.status(half).state == "running"
    assert {i.item_id: i.state for i in lg.items(half)} == {"i0": "accepted", "i1": "retryable"}
    assert not reconciler_targets(lg) & NEVER_BY_RECONCILER
    assert lg.complete(done, CONTROLLER).state == "succeeded"


def test_reconcile_needs_the_reconciler_or_operator_role(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 1, lease_seconds=10)
    lg.claim(run_id, WORKER)
    clock.advance(60)
    before = event_count(lg)
    for actor in (WORKER, SUBMITTER, CONTROLLER, REVIEWER):
        with pytest.raises(NotAuthorized):
            lg.reconcile(actor=actor)
    assert event_count(lg) == before
    assert lg.reconcile(actor=OPERATOR).expired_leases == 1


def test_reconcile_leaves_terminal_runs_alone(lg: Ledger, clock: ManualClock) -> None:
    run_id = running(lg, 2, lease_seconds=10, run_deadline_seconds=5)
    lg.claim(run_id, WORKER)
    lg.fail(run_id, CONTROLLER, "gave up", transient=False, failure_reason="input_invalid")
    clock.advance(3600)
    before = event_count(lg)
    assert lg.reconcile() == type(lg.reconcile())(0, 0, 0, 0)
    assert event_count(lg) == before
    assert lg.status(run_id).failure_reason == "input_invalid"


# --------------------------------------------------------------------------
# several processes against one PostgreSQL database
# --------------------------------------------------------------------------
FAR = timedelta(days=30)
# fork starts a child in milliseconds (spawn re-imports everything); every ledger the
# parent opened is closed before a child starts, and children open their own.
MP_START = "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def _reconciler_proc(dsn: str, now_iso: str, go: Any, stop: Any, out: Any, name: str) -> None:
    """Reconcile in a loop with an explicit time until told to stop; report the sums."""
    now = datetime.fromisoformat(now_iso)
    totals = Counter[str]()
    # the time moves by an injected clock: a `now` ahead of the store's clock is refused
    # (rule 14 of the rule book)
    with Ledger.open(dsn, clock=lambda: now) as lg:
        go.wait(WAIT)
        passes = 0
        while not stop.is_set() or passes < 2:
            r = lg.reconcile(now=now, actor=Actor(name, "reconciler"))
            totals.update(
                expired=r.expired_leases,
                cancels=r.finished_cancels,
                pauses=r.finished_pauses,
                failed=r.failed_runs,
            )
            passes += 1
            if stop.is_set():
                continue
    out.put((name, dict(totals)))


def _worker_proc(dsn: str, leases_json: str, go: Any, out: Any, name: str) -> None:
    """Accept each lease once, as fast as possible; report which writes were acknowledged."""
    leases = [
        Lease(**{**d, "expires_at": datetime.fromisoformat(d["expires_at"])})
        for d in json.loads(leases_json)
    ]
    acked, lost = [], []
    with Ledger.open(dsn) as lg:
        go.wait(WAIT)
        for lease in leases:
            try:
                lg.accept(lease, evidence={"by": name})
            except LeaseLost:
                lost.append([lease.run_id, lease.item_id])
            else:
                acked.append([lease.run_id, lease.item_id])
    out.put((name, {"acked": acked, "lost": lost}))


def _lease_dicts(leases: list[Lease]) -> str:
    return json.dumps([{**le.to_dict(), "payload": None} for le in leases])


@pytest.fixture
def procs() -> Iterator[list[mp.process.BaseProcess]]:
    started: list[mp.process.BaseProcess] = []
    yield started
    for p in started:  # only our own processes, by handle
        if p.is_alive():
            p.kill()
        p.join(10)


def _collect(out: Any, n: int) -> dict[str, Any]:
    got = {}
    for _ in range(n):
        name, value = out.get(timeout=WAIT)
        got[name] = value
    return got


def _item_events(lg: Ledger, run_id: str) -> dict[str, list[Any]]:
    by_item: dict[str, list[Any]] = defaultdict(list)
    for t in lg.history(run_id):
        if t.item_id is not None:
            by_item[t.item_id].append(t)
    return by_item


@pytest.mark.postgres
def test_reconciler_processes_racing_workers_never_double_write(
    pg_dsn: str, procs: list[Any]
) -> None:
    """4 reconcilers and 3 workers race over 12 runs: each lease ends exactly once, either
    accepted (the worker was told so) or lease_expired (the worker got LeaseLost)."""
    ctx = mp.get_context(MP_START)
    go, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    with Ledger.open(pg_dsn) as lg:
        run_ids = [running(lg, 15, lease_seconds=3600, max_attempts=5) for _ in range(12)]
        leases = [le for r in run_ids for le in lg.claim(r, WORKER, limit=15)]
    reconcile_at = (max(le.expires_at for le in leases) + FAR).isoformat()
    # interleave runs between workers so they contend with the reconcilers everywhere
    shares = [leases[k::3] for k in range(3)]
    for k in range(4):
        procs.append(
            ctx.Process(
                target=_reconciler_proc, args=(pg_dsn, reconcile_at, go, stop, out, f"rec-{k}")
            )
        )
    for k, share in enumerate(shares):
        procs.append(
            ctx.Process(target=_worker_proc, args=(pg_dsn, _lease_dicts(share), go, out, f"w-{k}"))
        )
    for p in procs:
        p.start()
    go.set()
    # the workers finish on their own; then let the reconcilers do a last pass
    results: dict[str, Any] = {}
    while len([n for n in results if n.startswith("w-")]) < 3:
        name, value = out.get(timeout=WAIT)
        results[name] = value
    stop.set()
    while len(results) < 7:
        name, value = out.get(timeout=WAIT)
        results[name] = value
    for p in procs:
        p.join(WAIT)
        assert p.exitcode == 0

    acked = {tuple(x) for n, v in results.items() if n.startswith("w-") for x in v["acked"]}
    lost = {tuple(x) for n, v in results.items() if n.startswith("w-") for x in v["lost"]}
    expired_reported = sum(v["expired"] for n, v in results.items() if n.startswith("rec-"))
    assert not acked & lost and len(acked) + len(lost) == len(leases)

    with Ledger.open(pg_dsn) as lg:
        expired_seen = 0
        for run_id in run_ids:
            assert lg.status(run_id).state == "running"
            for item_id, events in _item_events(lg, run_id).items():
                ends = [t for t in events if t.from_state == "in_progress"]
                claims = [t for t in events if t.command == "claim"]
                assert len(claims) == 1 and len(ends) == 1, (
                    run_id,
                    item_id,
                    [t.command for t in events],
                )
                end = ends[0]
                if (run_id, item_id) in acked:
                    assert (end.command, end.to_state) == ("accept", "accepted")
                else:
                    assert (run_id, item_id) in lost
                    assert (end.command, end.to_state, end.evidence["outcome"]) == (
                        "expire",
                        "retryable",
                        "lease_expired",
                    )
                    expired_seen += 1
            attempts = lg.attempts(run_id)
            assert all(a.outcome in ("accepted", "lease_expired") for a in attempts)
            assert len(attempts) == 15
        # the reconcilers' reports add up to exactly the expiries in the log: none twice
        assert expired_reported == expired_seen == len(lost)
        assert not reconciler_targets(lg) & NEVER_BY_RECONCILER


def _holder_proc(dsn: str, run_ids: list[str], out: Any) -> None:
    """A worker that claims and then hangs until it is killed (its owner 'dies')."""
    with Ledger.open(dsn) as lg:
        n = sum(len(lg.claim(r, Actor("doomed", "worker"), limit=3)) for r in run_ids)
        out.put(("holder", n))
        time.sleep(WAIT)  # killed long before this returns


@pytest.mark.postgres
def test_reconciler_processes_finish_cancels_pauses_and_deadlines_once(
    pg_dsn: str, procs: list[Any]
) -> None:
    ctx = mp.get_context(MP_START)
    go, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    with Ledger.open(pg_dsn) as lg:
        cancel_runs = [running(lg, 5, lease_seconds=3600) for _ in range(3)]
        pause_runs = [running(lg, 5, lease_seconds=3600) for _ in range(3)]
        deadline_runs = [
            running(lg, 5, lease_seconds=3600, run_deadline_seconds=1) for _ in range(3)
        ]
    # its own queue: a process killed while using a queue may leave the queue's lock held
    holder_out = ctx.Queue()
    holder = ctx.Process(
        target=_holder_proc, args=(pg_dsn, cancel_runs + pause_runs + deadline_runs, holder_out)
    )
    procs.append(holder)
    holder.start()
    assert holder_out.get(timeout=WAIT) == ("holder", 27)
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)  # the owner of every lease dies
    holder.join(WAIT)
    with Ledger.open(pg_dsn) as lg:
        for r in cancel_runs:
            assert lg.cancel(r, OPERATOR, "stop it").state == "canceling"
        for r in pause_runs:
            assert lg.pause(r, OPERATOR, "hold on").state == "pausing"
        expires = max(
            i.lease.expires_at
            for r in deadline_runs
            for i in lg.items(r, "in_progress")
            if i.lease is not None
        )

    reconcile_at = (expires + FAR).isoformat()
    recs = [
        ctx.Process(target=_reconciler_proc, args=(pg_dsn, reconcile_at, go, stop, out, f"rec-{k}"))
        for k in range(4)
    ]
    procs.extend(recs)
    for p in recs:
        p.start()
    go.set()
    with Ledger.open(pg_dsn) as lg:
        deadline = time.monotonic() + WAIT
        targets = cancel_runs + pause_runs + deadline_runs
        while time.monotonic() < deadline:
            if all(lg.status(r).state in ("canceled", "paused", "failed") for r in targets):
                break
            time.sleep(0.05)  # polling other processes, not asserting timing
        stop.set()
        totals = _collect(out, 4)
        for p in recs:
            p.join(WAIT)
            assert p.exitcode == 0
        summed = Counter[str]()
        for v in totals.values():
            summed.update(v)
        assert summed == Counter(expired=27, cancels=3, pauses=3, failed=3)
        for r in cancel_runs:
            hist = lg.history(r)
            assert lg.status(r).state == "canceled"
            assert [t.command for t in hist].count("cancel_finished") == 1
            assert {i.state for i in lg.items(r)} == {"skipped"}
        for r in pause_runs:
            assert lg.status(r).state == "paused"
            assert [t.command for t in lg.history(r)].count("pause_finished") == 1
        for r in deadline_runs:
            st = lg.status(r)
            assert (st.state, st.failure_kind, st.failure_reason) == (
                "failed",
                "transient",
                "deadline_exceeded",
            )
            hist = lg.history(r)
            fails = [t for t in hist if t.to_state == "failed"]
            assert len(fails) == 1
            # failed only after every lease had ended
            assert all(t.position < fails[0].position for t in hist if t.command == "expire")
            assert len([t for t in hist if t.command == "expire"]) == 3
        for r in targets:
            assert all(a.outcome == "lease_expired" for a in lg.attempts(r))
            assert len(lg.attempts(r)) == 3
        assert not reconciler_targets(lg) & NEVER_BY_RECONCILER


def _accept_slowly_proc(dsn: str, leases_json: str, go: Any, out: Any) -> None:
    leases = [
        Lease(**{**d, "expires_at": datetime.fromisoformat(d["expires_at"])})
        for d in json.loads(leases_json)
    ]
    acked = 0
    with Ledger.open(dsn) as lg:
        go.wait(WAIT)
        for lease in leases:
            lg.accept(lease)
            acked += 1
            # let the reconcilers look at the run between outcomes
            lg.status(lease.run_id)
    out.put(("worker", acked))


@pytest.mark.postgres
def test_deadline_waits_for_a_live_worker_across_processes(pg_dsn: str, procs: list[Any]) -> None:
    """Reconcilers that see the run past its deadline keep polling while a live worker
    finishes its leases one by one: the run fails once, after the last outcome."""
    ctx = mp.get_context(MP_START)
    go, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 20, lease_seconds=3600, run_deadline_seconds=1)
        leases = lg.claim(run_id, WORKER, limit=20)
        started = lg.status(run_id).started_at
    assert started is not None
    # past the deadline, long before any lease expires
    reconcile_at = (started + timedelta(seconds=30)).isoformat()
    worker = ctx.Process(target=_accept_slowly_proc, args=(pg_dsn, _lease_dicts(leases), go, out))
    recs = [
        ctx.Process(target=_reconciler_proc, args=(pg_dsn, reconcile_at, go, stop, out, f"rec-{k}"))
        for k in range(3)
    ]
    procs.extend([worker, *recs])
    for p in procs:
        p.start()
    go.set()
    name, acked = out.get(timeout=WAIT)
    assert (name, acked) == ("worker", 20)  # no LeaseLost: the deadline fenced nothing
    stop.set()
    totals = _collect(out, 3)
    for p in procs:
        p.join(WAIT)
        assert p.exitcode == 0
    assert sum(v["failed"] for v in totals.values()) == 1
    assert sum(v["expired"] for v in totals.values()) == 0
    with Ledger.open(pg_dsn) as lg:
        st = lg.status(run_id)
        assert (st.state, st.failure_reason) == ("failed", "deadline_exceeded")
        hist = lg.history(run_id)
        (fail,) = [t for t in hist if t.to_state == "failed"]
        accepts = [t for t in hist if t.command == "accept"]
        assert len(accepts) == 20 and max(t.position for t in accepts) < fail.position


@pytest.mark.slow
@pytest.mark.postgres
def test_ledger_reconcile_watch_processes(pg_dsn: str, tmp_path: Any) -> None:
    """`ledger reconcile --watch` on the server's clock: two of them at once expire a dead
    worker's short leases once and finish the cancel it left behind."""
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 4, lease_seconds=0.5)
        lg.claim(run_id, WORKER, limit=2)
        assert lg.cancel(run_id, OPERATOR, "abort").state == "canceling"
    env = {**os.environ, "LEDGER_DSN": pg_dsn, "PYTHONPATH": os.getcwd()}
    cmd = [
        sys.executable,
        "-c",
        "from ledger.cli import main; main()",
        "reconcile",
        "--watch",
        "0.1",
        "--json",
    ]
    logs = [open(tmp_path / f"rec-{k}.log", "w+") for k in range(2)]  # noqa: SIM115
    watchers = [subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT) for f in logs]
    try:
        with Ledger.open(pg_dsn) as lg:
            deadline = time.monotonic() + WAIT
            while lg.status(run_id).state != "canceled" and time.monotonic() < deadline:
                time.sleep(0.1)  # waiting for the watchers, not asserting timing
            assert lg.status(run_id).state == "canceled"
            hist = lg.history(run_id)
            assert [t.command for t in hist].count("cancel_finished") == 1
            assert [t.command for t in hist].count("expire") == 2
            assert [a.outcome for a in lg.attempts(run_id)] == ["lease_expired", "lease_expired"]
        # both watchers are up and looping (each printed a pass) before they are stopped
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and not all(
            (tmp_path / f"rec-{k}.log").read_text().count("\n") >= 2 for k in range(2)
        ):
            time.sleep(0.1)
    finally:
        for w in watchers:
            w.send_signal(signal.SIGINT)
        for w in watchers:
            try:
                w.wait(20)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
    reports = []
    for f in logs:
        f.seek(0)
        lines = [json.loads(line) for line in f.read().splitlines() if line.startswith("{")]
        f.close()
        assert lines, "a watcher printed no report"
        reports.extend(lines)
    assert sum(r["expired_leases"] for r in reports) == 2
    assert sum(r["finished_cancels"] for r in reports) == 1
