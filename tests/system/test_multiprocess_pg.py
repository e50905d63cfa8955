"""Many processes, one PostgreSQL run: leases never overlap, claims stop at a cancel or pause.

Every process opens its own `Ledger` on the test database (multiprocessing
"spawn", so nothing is inherited but the DSN). The checks read the recorded
history: a command draws its positions while it holds its run's row lock, and a
cancel or pause holds it exclusively, so "no claim after the cancel" means no claim
transition has a position greater than the cancel's.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from multiprocessing.context import SpawnProcess
from typing import Any, Self

import psycopg
import pytest

from ledger import Actor, Conflict, IllegalTransition, Ledger, Transition
from ledger.service.ledger import Outcome
from tests.support.runs import running

pytestmark = pytest.mark.postgres

SPAWN = multiprocessing.get_context("spawn")
WAIT = 120.0  # a bound on waiting for a child process, never a timing assertion

SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")
OPERATOR = Actor("olga", "operator")

# states an item leaves a lease for; `in_progress -> in_progress` is a heartbeat
ENDING = {"accepted", "rejected", "retryable", "quarantined", "skipped"}


# --------------------------------------------------------------------------
# child processes (module-level so "spawn" can import them)
# --------------------------------------------------------------------------
def _report(out: Any, name: str, body: Callable[[], Any]) -> None:
    try:
        out.put((name, "ok", body()))
    except BaseException:
        out.put((name, "error", traceback.format_exc()))


def _claim_until_stopped(
    lg: Ledger, run_id: str, worker: Actor, limit: int, fail_first_of: int
) -> dict[str, Any]:
    """claim(limit) then record the outcomes, until the run refuses claims or is drained.

    The first attempt of every `fail_first_of`-th item fails (retryable), so items
    are claimed again by whichever process gets there first.
    """
    claims = leases_total = conflicts = 0
    stopped_by = "drained"
    deadline = time.monotonic() + WAIT / 2  # fail here, with the counts, before the parent gives up
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"still claiming after {WAIT / 2}s: {lg.status(run_id).counts}")
        try:
            leases = lg.claim(run_id, worker, limit=limit)
        except IllegalTransition as e:
            stopped_by = str(e.state)
            break
        except Conflict:  # another writer got there first: nothing was written, re-read
            conflicts += 1
            continue
        claims += 1
        if not leases:
            counts = lg.status(run_id).counts
            if (
                counts.get("pending", 0) + counts.get("retryable", 0) + counts.get("in_progress", 0)
                == 0
            ):
                break
            time.sleep(0.005)  # others still hold leases that may come back as retryable
            continue
        leases_total += len(leases)
        outcomes = []
        for le in leases:
            n = int(le.item_id[1:])
            if fail_first_of and n % fail_first_of == 0 and le.attempt == 1:
                outcomes.append(Outcome(le, "fail", error="transient: upstream reset"))
            else:
                outcomes.append(Outcome(le, "accept", evidence={"by": worker.id}))
        results = lg.record(outcomes)
        bad = [r for r in results if isinstance(r, Exception)]
        assert not bad, bad  # our leases are live (long lease_seconds), so every outcome counts
    return {
        "claims": claims,
        "leases": leases_total,
        "stopped_by": stopped_by,
        "conflicts": conflicts,
    }


def _claimer(
    dsn: str, run_id: str, worker_id: str, limit: int, fail_first_of: int, go: Any, out: Any
) -> None:
    def body() -> dict[str, Any]:
        with Ledger.open(dsn) as lg:
            go.wait(WAIT)
            done = _claim_until_stopped(
                lg, run_id, Actor(worker_id, "worker"), limit, fail_first_of
            )
            pool = lg.store.datastore.pool  # type: ignore[attr-defined]
            return {**done, "pool_max": pool.max_size, "pool_size": pool.get_stats()["pool_size"]}

    _report(out, worker_id, body)


def _stopper(dsn: str, run_id: str, command: str, after_accepted: int, go: Any, out: Any) -> None:
    """Waits until `after_accepted` items are accepted, then cancels or pauses the run."""

    def body() -> Any:
        with Ledger.open(dsn) as lg:
            go.wait(WAIT)
            deadline = time.monotonic() + WAIT / 2
            while lg.status(run_id).counts.get("accepted", 0) < after_accepted:
                if time.monotonic() > deadline:
                    raise TimeoutError("the claimers never got far enough")
                time.sleep(0.005)
            if command == "cancel":
                o = lg.cancel(run_id, SUBMITTER, reason="stop it midway")
                return {"state": o.state, "in_flight": o.in_flight}
            st = lg.pause(run_id, OPERATOR, reason="hold on")
            return {"state": st.state}

    _report(out, "stopper", body)


def _round_claimer(dsn: str, worker_id: str, limit: int, runs: Any, out: Any) -> None:
    """Serves several rounds: for each run id received, claims until stopped."""

    def body() -> list[dict[str, Any]]:
        done = []
        with Ledger.open(dsn) as lg:
            while (run_id := runs.get(timeout=WAIT)) is not None:
                done.append(_claim_until_stopped(lg, run_id, Actor(worker_id, "worker"), limit, 0))
                out.put((worker_id, "round", done[-1]))
        return done

    _report(out, worker_id, body)


def _round_stopper(dsn: str, runs: Any, out: Any) -> None:
    """For each (run id, command, threshold) received: waits for the threshold, then acts."""

    def body() -> int:
        n = 0
        with Ledger.open(dsn) as lg:
            while (job := runs.get(timeout=WAIT)) is not None:
                run_id, command, after_accepted = job
                deadline = time.monotonic() + WAIT / 2
                while lg.status(run_id).counts.get("accepted", 0) < after_accepted:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the claimers never got far enough")
                    time.sleep(0.002)
                if command == "cancel":
                    lg.cancel(run_id, OPERATOR, reason="race a cancel")
                else:
                    lg.pause(run_id, OPERATOR, reason="race a pause")
                out.put(("stopper", "round", command))
                n += 1
        return n

    _report(out, "stopper", body)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
class Children:
    """Spawned processes and the queue they report on; every one is joined at the end."""

    def __init__(self) -> None:
        self.out: Any = SPAWN.Queue()
        self.procs: list[SpawnProcess] = []

    def start(self, target: Callable[..., None], *args: Any) -> None:
        p = SPAWN.Process(target=target, args=(*args, self.out), daemon=True)
        p.start()
        self.procs.append(p)

    def get(self) -> tuple[str, str, Any]:
        try:
            name, kind, value = self.out.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"no report from the children within {WAIT}s") from None
        if kind == "error":
            raise AssertionError(f"child {name} failed:\n{value}")
        return name, kind, value

    def results(self, n: int) -> dict[str, Any]:
        got = {}
        while len(got) < n:
            name, kind, value = self.get()
            if kind == "ok":
                got[name] = value
        return got

    def close(self) -> None:
        for p in self.procs:
            p.join(WAIT)
            if p.is_alive():  # a stuck child: end it (only our own, by its handle)
                p.kill()
                p.join(10)
        self.out.close()
        self.out.join_thread()


def big_manifest(n: int, **policy: Any) -> dict[str, Any]:
    return {
        "source_version": "exports/2026-11-28",
        "config_version": "cfg-1",
        "scope": "multiprocess",
        "items": [{"item_id": f"i{k}", "payload": {"n": k}} for k in range(n)],
        "policy": {"lease_seconds": 600, "max_attempts": 5, **policy},
    }


def assert_one_live_lease_at_a_time(history: Sequence[Transition]) -> dict[str, int]:
    """Walks the history in position order: an item is claimed only when it holds no
    live lease, and every lease ends before the next claim. Returns claims per item."""
    assert [t.position for t in history] == sorted(t.position for t in history)
    live: dict[str, str] = {}
    claims: Counter[str] = Counter()
    for t in history:
        if t.item_id is None:
            continue
        if t.to_state == "in_progress" and t.from_state != "in_progress":
            assert t.command == "claim", t
            assert t.item_id not in live, (
                f"item {t.item_id} claimed at position {t.position} while lease "
                f"{live[t.item_id][:8]} was live"
            )
            live[t.item_id] = t.evidence["lease_token"]
            claims[t.item_id] += 1
        elif t.from_state == "in_progress" and t.to_state in ENDING:
            assert t.item_id in live, t
            token = t.evidence.get("lease_token")
            assert token in (None, live[t.item_id]), (t, live[t.item_id])
            del live[t.item_id]
    return dict(claims)


def assert_attempts_consistent(lg: Ledger, run_id: str, claims: dict[str, int]) -> None:
    """Per item: attempts 1..n, one per claim, never two unfinished, each begun after the
    previous one finished."""
    by_item: defaultdict[str, list[Any]] = defaultdict(list)
    for a in lg.attempts(run_id):
        by_item[a.item_id].append(a)
    assert {k: len(v) for k, v in by_item.items()} == claims
    for item_id, attempts in by_item.items():
        attempts.sort(key=lambda a: a.attempt)
        assert [a.attempt for a in attempts] == list(range(1, len(attempts) + 1)), item_id
        assert sum(a.finished_at is None for a in attempts) <= 1, item_id
        assert all(a.finished_at is not None for a in attempts[:-1]), item_id
        for before, after in itertools.pairwise(attempts):
            assert before.finished_at is not None and before.finished_at <= after.started_at, (
                item_id
            )
        assert len({a.lease_token for a in attempts}) == len(attempts), item_id


def positions(history: Sequence[Transition], command: str, run_level: bool) -> list[int]:
    return [
        t.position for t in history if t.command == command and (t.item_id is None) == run_level
    ]


# --------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------
class ConnectionWatch:
    """Samples how many sessions are connected to the database (not counting itself)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch)

    def _watch(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
                ).fetchone()
                self.peak = max(self.peak, row[0] if row else 0)
                self._stop.wait(0.02)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(WAIT)


def test_four_processes_share_one_run_without_overlapping_leases(pg_dsn: str) -> None:
    n = 2000
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, n, manifest_of=big_manifest)
    children = Children()
    go = SPAWN.Event()
    try:
        with ConnectionWatch(pg_dsn) as watch:
            for k in range(4):
                children.start(_claimer, pg_dsn, run_id, f"w{k}", 25, 20, go)
            go.set()
            results = children.results(4)
    finally:
        children.close()

    assert all(r["stopped_by"] == "drained" for r in results.values()), results
    # every process got a share of the work (they really ran concurrently)
    assert all(r["leases"] > 0 for r in results.values()), results
    # pool sizing: each process's pool stays within its 12; together at most 4 x 12
    assert all(r["pool_max"] == 12 and 0 < r["pool_size"] <= 12 for r in results.values()), results
    assert 4 <= watch.peak <= 4 * 12

    with Ledger.open(pg_dsn) as lg:
        history = lg.history(run_id)
        claims = assert_one_live_lease_at_a_time(history)
        assert_attempts_consistent(lg, run_id, claims)
        accepted = Counter(t.item_id for t in history if t.to_state == "accepted")
        assert accepted == {f"i{k}": 1 for k in range(n)}  # every item accepted exactly once
        retried = {f"i{k}" for k in range(0, n, 20)}
        assert {i for i, c in claims.items() if c == 2} == retried
        assert all(c == 1 for i, c in claims.items() if i not in retried)
        assert sum(r["leases"] for r in results.values()) == n + len(retried)
        st = lg.status(run_id)
        assert st.counts["accepted"] == n and st.waiting_on == "controller"
        assert lg.complete(run_id, CONTROLLER).state == "succeeded"


def test_a_fifth_process_cancels_midway_and_no_claim_follows_it(pg_dsn: str) -> None:
    n = 2000
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, n, manifest_of=big_manifest)
    children = Children()
    go = SPAWN.Event()
    try:
        for k in range(4):
            children.start(_claimer, pg_dsn, run_id, f"w{k}", 25, 0, go)
        children.start(_stopper, pg_dsn, run_id, "cancel", n // 4, go)
        go.set()
        results = children.results(5)
    finally:
        children.close()

    cancel = results.pop("stopper")
    assert {r["stopped_by"] for r in results.values()} <= {"canceling", "canceled"}, results

    with Ledger.open(pg_dsn) as lg:
        history = lg.history(run_id)
        [cancel_at] = positions(history, "cancel", run_level=True)
        late = [t for t in history if t.command == "claim" and t.position > cancel_at]
        assert late == [], f"{len(late)} claims committed after the cancel at position {cancel_at}"

        claims = assert_one_live_lease_at_a_time(history)
        assert_attempts_consistent(lg, run_id, claims)
        # in-flight attempts finished and were kept; the rest was skipped as canceled
        finished_late = [
            t
            for t in history
            if t.item_id and t.position > cancel_at and t.from_state == "in_progress"
        ]
        assert len(finished_late) == cancel["in_flight"]
        assert all(t.to_state == "accepted" for t in finished_late)
        st = lg.status(run_id)
        assert st.state == "canceled"
        assert st.counts.get("in_progress", 0) == 0
        assert st.counts["accepted"] + st.counts["skipped"] == n
        assert st.counts["accepted"] == sum(claims.values()) >= n // 4
        skipped = [t for t in history if t.to_state == "skipped"]
        assert len(skipped) == st.counts["skipped"] and all(t.reason == "canceled" for t in skipped)
        # skipped by the cancel itself, in its transaction: the skips are written just
        # before the run's cancel event (a run's items never change after it ended), and
        # nothing else lies between them
        first_skip = min(t.position for t in skipped)
        between = [t for t in history if first_skip <= t.position < cancel_at]
        assert between == skipped


def test_claims_racing_a_cancel_or_pause_never_commit_after_it(pg_dsn: str) -> None:
    rounds = ["cancel", "pause", "cancel", "pause"]
    n = 400
    claimers = 3
    children = Children()
    run_queues = [SPAWN.Queue() for _ in range(claimers)]
    stop_queue = SPAWN.Queue()
    try:
        for k in range(claimers):
            children.start(_round_claimer, pg_dsn, f"w{k}", 3, run_queues[k])
        children.start(_round_stopper, pg_dsn, stop_queue)
        with Ledger.open(pg_dsn) as lg:
            for r, command in enumerate(rounds):
                run_id = running(lg, n, manifest_of=big_manifest)
                for q in run_queues:
                    q.put(run_id)
                stop_queue.put((run_id, command, 20 + 10 * r))
                reports = []
                while len(reports) < claimers + 1:
                    name, kind, value = children.get()
                    assert kind == "round", (name, kind, value)
                    reports.append((name, value))
                stops = {v["stopped_by"] for name, v in reports if name != "stopper"}
                expected = (
                    {"canceling", "canceled"} if command == "cancel" else {"pausing", "paused"}
                )
                assert stops <= expected, (command, reports)

                history = lg.history(run_id)
                [stop_at] = positions(history, command, run_level=True)
                claim_at = positions(history, "claim", run_level=False)
                assert claim_at, "no claims happened before the stop: the race was not exercised"
                assert max(claim_at) < stop_at, (
                    f"round {r}: a claim committed at {max(claim_at)}, after the {command} at {stop_at}"
                )
                assert_one_live_lease_at_a_time(history)
                st = lg.status(run_id)
                assert st.state in ({"canceled"} if command == "cancel" else {"paused"}), st.state
            for q in run_queues:
                q.put(None)
            stop_queue.put(None)
        children.results(claimers + 1)
    finally:
        children.close()
        for q in [*run_queues, stop_queue]:
            q.close()
            q.join_thread()


def test_sixteen_processes_on_two_runs_one_canceled_midway(pg_dsn: str) -> None:
    """Eight processes on each of two runs at once; a seventeenth cancels the second run
    midway. The first run: no double lease, every item accepted exactly once. The second:
    no claim commits after the cancel, in-flight attempts finish and are kept."""
    n = 600
    with Ledger.open(pg_dsn) as lg:
        first, second = (
            running(lg, n, manifest_of=big_manifest),
            running(lg, n, manifest_of=big_manifest),
        )
    children = Children()
    go = SPAWN.Event()
    try:
        for k in range(8):
            children.start(_claimer, pg_dsn, first, f"a{k}", 10, 0, go)
            children.start(_claimer, pg_dsn, second, f"b{k}", 10, 0, go)
        children.start(_stopper, pg_dsn, second, "cancel", n // 4, go)
        go.set()
        results = children.results(17)
    finally:
        children.close()

    results.pop("stopper")
    assert all(results[f"a{k}"]["stopped_by"] == "drained" for k in range(8)), results
    with Ledger.open(pg_dsn) as lg:
        history = lg.history(first)
        claims = assert_one_live_lease_at_a_time(history)
        assert_attempts_consistent(lg, first, claims)
        accepted = Counter(t.item_id for t in history if t.to_state == "accepted")
        assert accepted == {f"i{k}": 1 for k in range(n)}

        history = lg.history(second)
        [cancel_at] = positions(history, "cancel", run_level=True)
        assert [t for t in history if t.command == "claim" and t.position > cancel_at] == []
        claims = assert_one_live_lease_at_a_time(history)
        assert_attempts_consistent(lg, second, claims)
        st = lg.status(second)
        assert st.state == "canceled" and st.counts.get("in_progress", 0) == 0
        assert st.counts["accepted"] + st.counts["skipped"] == n
