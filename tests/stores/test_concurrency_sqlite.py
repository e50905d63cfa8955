"""Concurrent claimers on one SQLite file: threads sharing one Ledger, and spawned processes
each opening the file. Short real-clock leases, a reconciler running alongside, workers
that fail attempts or stall past their lease: whatever the interleaving, no item is ever
held by two live leases and every item ends accepted exactly once.

Assertions are invariants of the record, never timings.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from ledger import Actor, Conflict, LeaseLost, Ledger

N_THREAD_ITEMS = 300
N_PROCESS_ITEMS = 200
LEASE_SECONDS = 2.0
POLICY = {"lease_seconds": LEASE_SECONDS, "max_attempts": 100, "backoff_seconds": 0}
SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")


@dataclass
class Tally:
    """What one worker saw: the leases it accepted and the ones it lost."""

    worker_id: str
    accepted: list[tuple[str, str]] = field(default_factory=list)  # (item_id, token)
    lost: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def work(lg: Ledger, run_id: str, worker_id: str, seed: int, deadline: float) -> Tally:
    """Claim and finish items until none is open. One stall past the lease per worker."""
    rng = random.Random(seed)
    who = Actor(worker_id, "worker")
    tally = Tally(worker_id)
    stalled = False
    while time.monotonic() < deadline:
        try:
            leases = lg.claim(run_id, who, limit=rng.randint(1, 4))
        except Conflict as e:  # would mean two writers raced one stream: reported, not hidden
            tally.errors.append(f"claim Conflict: {e}")
            continue
        if not leases:
            counts = lg.status(run_id).counts
            if counts["pending"] + counts["retryable"] + counts["in_progress"] == 0:
                return tally
            time.sleep(0.005)  # others hold the rest; poll again (no assertion on timing)
            continue
        for le in leases:
            roll = rng.random()
            try:
                if roll < 0.1:
                    lg.fail_attempt(le, "flaky upstream")
                    tally.failed.append((le.item_id, le.token))
                    continue
                if roll < 0.2 and not stalled:
                    stalled = True
                    time.sleep(LEASE_SECONDS * 1.3)  # the lease lapses meanwhile
                lg.accept(le, evidence={"worker": worker_id})
                tally.accepted.append((le.item_id, le.token))
            except LeaseLost:
                tally.lost.append((le.item_id, le.token))
            except Exception as e:
                tally.errors.append(f"{type(e).__name__}: {e}")
    tally.errors.append("deadline passed before the run drained")
    return tally


def _process_worker(dsn: str, run_id: str, worker_id: str, seed: int, budget: float) -> Tally:
    with Ledger.open(dsn) as lg:
        return work(lg, run_id, worker_id, seed, time.monotonic() + budget)


def reconcile_until(lg: Ledger, stop: threading.Event, errors: list[str]) -> None:
    while not stop.is_set():
        try:
            lg.reconcile()
        except Exception as e:
            errors.append(f"reconcile {type(e).__name__}: {e}")
        stop.wait(0.05)


def check_record(lg: Ledger, run_id: str, n_items: int, tallies: list[Tally]) -> None:
    errors = [e for t in tallies for e in t.errors]
    assert errors == []
    items = lg.items(run_id)
    assert len(items) == n_items
    assert Counter(i.state for i in items) == {"accepted": n_items}

    attempts = lg.attempts(run_id)
    by_item: dict[str, list[Any]] = defaultdict(list)
    for a in attempts:
        by_item[a.item_id].append(a)
    accepted_tokens: set[tuple[str, str]] = set()
    for item_id, atts in by_item.items():
        atts.sort(key=lambda a: a.attempt)
        assert [a.attempt for a in atts] == list(range(1, len(atts) + 1)), item_id
        outcomes = Counter(a.outcome for a in atts)
        assert outcomes["accepted"] == 1, (item_id, outcomes)
        assert atts[-1].outcome == "accepted", (item_id, [a.outcome for a in atts])
        assert set(outcomes) <= {"accepted", "failed", "lease_expired"}, outcomes
        assert len({a.lease_token for a in atts}) == len(atts)
        for a in atts:
            assert a.finished_at is not None, (item_id, a)  # no lease is left live
            assert a.started_at <= a.finished_at
        # attempt windows never overlap: each ends before the next begins
        for prev, nxt in pairwise(atts):
            assert prev.finished_at <= nxt.started_at, (item_id, prev, nxt)
        accepted_tokens.add((item_id, atts[-1].lease_token))

    # every item accepted exactly once, by the worker that held the live lease
    reported = [pair for t in tallies for pair in t.accepted]
    assert len(reported) == n_items
    assert set(reported) == accepted_tokens
    # a worker that lost its lease never got its outcome recorded
    for t in tallies:
        for item_id, token in t.lost:
            att = next(a for a in by_item[item_id] if a.lease_token == token)
            assert att.outcome == "lease_expired", (item_id, att)
        for item_id, token in t.failed:
            att = next(a for a in by_item[item_id] if a.lease_token == token)
            assert att.outcome == "failed", (item_id, att)
    accepts = Counter(tr.item_id for tr in lg.history(run_id) if tr.command == "accept")
    assert accepts == {i.item_id: 1 for i in items}


def _run(lg: Ledger, n: int) -> str:
    m = {
        "source_version": "s",
        "config_version": "c",
        "items": [{"item_id": f"it-{k:04d}", "payload": {"k": k}} for k in range(n)],
        "policy": POLICY,
    }
    run_id = lg.submit(m, SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    return run_id


def test_threads_sharing_one_ledger(tmp_path: Any) -> None:
    dsn = f"sqlite:///{tmp_path}/threads.db"
    with Ledger.open(dsn) as lg:
        run_id = _run(lg, N_THREAD_ITEMS)
        stop = threading.Event()
        rec_errors: list[str] = []
        reconciler = threading.Thread(target=reconcile_until, args=(lg, stop, rec_errors))
        reconciler.start()
        tallies: list[Tally] = []
        deadline = time.monotonic() + 240
        threads = [
            threading.Thread(
                target=lambda k=k: tallies.append(work(lg, run_id, f"t{k}", 1000 + k, deadline))
            )
            for k in range(6)
        ]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            stop.set()
            reconciler.join()
        assert rec_errors == []
        assert len(tallies) == 6
        check_record(lg, run_id, N_THREAD_ITEMS, tallies)
        assert lg.complete(run_id, CONTROLLER).state == "succeeded"


def test_spawned_processes_on_one_file(tmp_path: Any) -> None:
    dsn = f"sqlite:///{tmp_path}/procs.db"
    with Ledger.open(dsn) as lg:
        run_id = _run(lg, N_PROCESS_ITEMS)
        stop = threading.Event()
        rec_errors: list[str] = []
        reconciler = threading.Thread(target=reconcile_until, args=(lg, stop, rec_errors))
        reconciler.start()
        ctx = multiprocessing.get_context("spawn")
        try:
            with ctx.Pool(4) as pool:
                tallies = pool.starmap(
                    _process_worker, [(dsn, run_id, f"p{k}", 2000 + k, 240.0) for k in range(4)]
                )
        finally:
            stop.set()
            reconciler.join()
        assert rec_errors == []
        assert {t.worker_id for t in tallies} == {"p0", "p1", "p2", "p3"}
        check_record(lg, run_id, N_PROCESS_ITEMS, tallies)
        assert lg.complete(run_id, CONTROLLER).state == "succeeded"
