"""Projection rebuilds: identical to the live tables, resumable after a crash,
safe while the ledger is in use (rule 10 of the rule book)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import Actor, Ledger, LedgerError
from ledger.projections.checksums import checksums
from ledger.projections.rebuild import (
    REBUILD_SUFFIX,
    TRACKING_NAME,
    Replayer,
    rebuild,
    tracked_position,
)
from ledger.service.ledger import Outcome
from tests.histories.load import import_stored, stored_events
from tests.support.clock import ManualClock
from tests.support.runs import (
    CONTROLLER,
    OPERATOR,
    RECONCILER,
    REVIEWER,
    SUBMITTER,
    WORKER,
    manifest,
)

WORKER2 = Actor("w2", "worker")

# --------------------------------------------------------------------------
# random command programs (also used by test_audit and test_verify)
# --------------------------------------------------------------------------
POLICIES: list[dict[str, Any]] = [
    {},
    {"max_attempts": 1},
    {"partial_delivery": True, "tolerated_failures": 1},
    {"review": {"decision": "ok"}},
    {"lease_seconds": 30, "run_deadline_seconds": 200},
    {"backoff_seconds": 10, "item_deadline_seconds": 100, "max_attempts": 2},
]
RUN_OPS = [
    "start",
    "start",
    "claim",
    "claim",
    "claim",
    "pause",
    "resume",
    "cancel",
    "complete",
    "drain",
    "fail_run",
    "request_review",
    "approve",
    "reject_review",
    "retry",
    "repair",
    "compensate",
    "amend_add",
    "amend_policy",
    "reconcile",
]
LEASE_OPS = ["accept", "accept", "accept", "reject", "fail", "fail_nr", "heartbeat", "record"]
ITEM_OPS = ["skip", "release", "reject_item", "withdraw", "replace"]

OP = st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 4), st.integers(0, len(POLICIES) - 1)),
    st.tuples(st.sampled_from(RUN_OPS), st.integers(0, 7)),
    st.tuples(st.sampled_from(LEASE_OPS), st.integers(0, 15)),
    st.tuples(st.sampled_from(ITEM_OPS), st.integers(0, 7), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.sampled_from([0, 0, 1, 30, 120])),
)
# every program starts from a few running runs with leases, so most commands apply
PRELUDE: list[tuple[Any, ...]] = [
    ("submit", 3, 0),
    ("submit", 3, 3),
    ("submit", 2, 2),
    ("submit", 2, 0),
    ("start", 0),
    ("start", 1),
    ("start", 2),
    ("start", 3),
    ("claim", 0),
    ("claim", 1),
    ("claim", 2),
    ("drain", 3),
]
PROGRAM = st.lists(OP, min_size=1, max_size=30).map(lambda ops: PRELUDE + ops)


class Program:
    """Runs random commands against a ledger; refused commands are simply refused."""

    def __init__(self, lg: Ledger, clock: ManualClock) -> None:
        self.lg = lg
        self.clock = clock
        self.runs: list[str] = []
        self.leases: list[Any] = []
        self.n = 0

    def run(self, ops: list[tuple[Any, ...]]) -> None:
        for op in ops:
            with contextlib.suppress(LedgerError):
                self.step(op)

    def _run(self, i: int) -> str | None:
        return self.runs[i % len(self.runs)] if self.runs else None

    def step(self, op: tuple[Any, ...]) -> None:
        lg = self.lg
        kind = op[0]
        self.n += 1
        if kind == "submit":
            self.runs.append(lg.submit(manifest(op[1], **POLICIES[op[2]]), SUBMITTER).run_id)
            return
        if kind == "advance":
            self.clock.advance(op[1])
            return
        if kind in LEASE_OPS:
            if not self.leases:
                return
            lease = self.leases[op[1] % len(self.leases)]
            if kind == "accept":
                lg.accept(lease, evidence={"by": lease.worker_id}, stage="done")
            elif kind == "reject":
                lg.reject(lease, "bad-row", detail="column 3")
            elif kind == "fail":
                lg.fail_attempt(
                    lease, "timeout talking to postgresql://u:secret@db/x", stage="load"
                )
            elif kind == "fail_nr":
                lg.fail_attempt(lease, "corrupt", retryable=False)
            elif kind == "heartbeat":
                self.leases.append(lg.heartbeat(lease))
            else:
                lg.record([Outcome(lease, "accept")])
            return
        run_id = self._run(op[1])
        if run_id is None:
            return
        if kind in ITEM_OPS:
            item = f"i{op[2]}"
            if kind == "skip":
                lg.skip(run_id, item, OPERATOR, "not needed")
            elif kind == "release":
                lg.release(run_id, item, REVIEWER, "looked at it")
            elif kind == "reject_item":
                lg.reject_item(run_id, item, REVIEWER, "bad-input")
            elif kind == "withdraw":
                lg.amend(run_id, SUBMITTER, "withdraw one", withdraw=[item])
            else:
                lg.amend(
                    run_id,
                    SUBMITTER,
                    "replace one",
                    items=[{"item_id": item, "payload": {"v": self.n}}],
                )
            return
        if kind == "start":
            lg.start(run_id, CONTROLLER)
        elif kind == "claim":
            self.leases += lg.claim(run_id, WORKER if self.n % 2 else WORKER2, limit=1 + self.n % 3)
        elif kind == "pause":
            lg.pause(run_id, OPERATOR, "hold on")
        elif kind == "resume":
            lg.resume(run_id, OPERATOR, reason="back to work")
        elif kind == "cancel":
            lg.cancel(run_id, OPERATOR, "stop it")
        elif kind == "complete":
            lg.complete(run_id, CONTROLLER)
        elif kind == "drain":  # finish every item of the run (past any backoff), then complete it
            leases = [i.lease for i in lg.items(run_id, state="in_progress") if i.lease]
            for _round in range(3):
                lg.record([Outcome(le, "accept", evidence={"k": k}) for k, le in enumerate(leases)])
                self.clock.advance(11)
                leases = lg.claim(run_id, WORKER, limit=100)
            if lg.status(run_id).policy.get("review"):
                lg.request_review(run_id, CONTROLLER, "ok")
                lg.decide(run_id, REVIEWER, lg.status(run_id).input_version, True, "fine")
            lg.complete(run_id, CONTROLLER)
        elif kind == "fail_run":
            lg.fail(run_id, CONTROLLER, "source gone", transient=self.n % 2 == 0)
        elif kind == "request_review":
            lg.request_review(run_id, CONTROLLER, "ok")
        elif kind in ("approve", "reject_review"):
            version = lg.status(run_id).input_version
            lg.decide(run_id, REVIEWER, version, kind == "approve", "looked")
        elif kind == "retry":
            self.runs.append(lg.retry(run_id, OPERATOR).run_id)
        elif kind == "repair":
            self.runs.append(lg.repair(run_id, OPERATOR).run_id)
        elif kind == "compensate":
            self.runs.append(lg.compensate(run_id, OPERATOR, "undo").run_id)
        elif kind == "amend_add":
            lg.amend(
                run_id,
                SUBMITTER,
                "one more",
                items=[{"item_id": f"x{self.n}", "required": self.n % 2 == 0}],
            )
        elif kind == "amend_policy":
            lg.amend(run_id, OPERATOR, "more attempts", policy={"max_attempts": 4})
        elif kind == "reconcile":
            lg.reconcile(actor=RECONCILER)


def live_checksums(lg: Ledger) -> dict[str, str]:
    with lg.store.read() as tx:
        return checksums(tx)


# --------------------------------------------------------------------------
# rebuild == live
# --------------------------------------------------------------------------
@settings(
    max_examples=8,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=PROGRAM)
def test_rebuild_equals_live_after_random_commands(
    lg: Ledger, clock: ManualClock, ops: list[tuple[Any, ...]]
) -> None:
    Program(lg, clock).run(ops)
    before = live_checksums(lg)
    lg.rebuild_projections()
    assert live_checksums(lg) == before
    report = lg.verify()
    assert report.ok, report.problems


def test_rebuild_reports_progress_and_keeps_reads(lg: Ledger, clock: ManualClock) -> None:
    prog = Program(lg, clock)
    prog.run([("submit", 3, 0), ("start", 0), ("claim", 0), ("accept", 0), ("submit", 2, 2)])
    status = {r: lg.status(r) for r in prog.runs}
    history = {r: lg.history(r) for r in prog.runs}
    with lg.store.read() as tx:
        n_events = tx.fetchone(f"SELECT COUNT(*) AS n FROM {lg.store.events_table()}")  # noqa: S608 (our own table/column names; values are bound parameters)
    assert n_events is not None
    calls: list[tuple[int, int]] = []
    assert rebuild(lg, progress=lambda d, t: calls.append((d, t)), batch_size=3) == n_events["n"]
    assert calls[0] == (0, n_events["n"]) and calls[-1] == (n_events["n"], n_events["n"])
    assert [d for d, _t in calls] == sorted(d for d, _t in calls)
    assert {r: lg.status(r) for r in prog.runs} == status
    assert {r: lg.history(r) for r in prog.runs} == history
    with lg.store.read() as tx:
        assert tracked_position(tx, TRACKING_NAME) is None  # nothing left behind
    # the ledger keeps working on the new tables (prepared statements, indexes)
    lg.start(prog.runs[1], CONTROLLER)
    assert lg.status(prog.runs[1]).state == "running"


def index_names(lg: Ledger) -> set[tuple[str, str]]:
    with lg.store.read() as tx:
        if lg.store.dialect == "postgres":
            rows = tx.fetchall(
                "SELECT indexname AS n, tablename AS t FROM pg_indexes "
                "WHERE schemaname = current_schema()"
            )
        else:
            rows = tx.fetchall(
                "SELECT name AS n, tbl_name AS t FROM sqlite_master WHERE type = 'index'"
            )
    return {(r["n"], r["t"]) for r in rows}


def test_rebuild_keeps_the_indexes_and_leaves_no_scratch_tables(lg: Ledger) -> None:
    lg.submit(manifest(2), SUBMITTER)
    before = index_names(lg)
    lg.rebuild_projections()
    lg.rebuild_projections()
    after = index_names(lg)
    assert after == before
    assert not any(REBUILD_SUFFIX in t for _n, t in after)


def test_replayer_holds_only_one_batch_of_aggregates(lg: Ledger) -> None:
    st_ = lg.submit(manifest(40), SUBMITTER)
    lg.start(st_.run_id, CONTROLLER)
    for lease in lg.claim(st_.run_id, WORKER, limit=40):
        lg.accept(lease)
    rp = Replayer("_bounded")
    from ledger.projections.rebuild import create_tables, drop_tables, replay_batch

    position, sizes = 0, []
    while True:
        with lg.store.write() as tx:
            if position == 0:
                create_tables(tx, "_bounded")
            position, n = replay_batch(tx, rp, position, 10)
            sizes.append(len(rp.items) + len(rp.runs))
        if n < 10:
            break
    with lg.store.write() as tx:
        assert checksums(tx, "_bounded") == checksums(tx)
        drop_tables(tx, "_bounded")
    assert max(sizes) <= 11  # a batch of 10 events touches at most 10 items and their run


@pytest.mark.parametrize("replay_page", [None, 4], ids=["one page a batch", "pages of 4"])
def test_replayer_cache_is_bounded_and_never_serves_rows_another_replayer_moved(
    lg: Ledger, replay_page: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replayers take turns on one set of tables (two rebuild processes): each may keep
    the aggregates of the batch it committed, but must not use them once the other has
    moved the tables on; and the cache stays within its bounds. With pages smaller than
    the batch, each keeps them from page to page within its transaction as well."""
    import random

    import ledger.projections.rebuild as rebuild_module
    from ledger.projections.rebuild import create_tables, drop_tables, replay_batch

    if replay_page is not None:
        monkeypatch.setattr(rebuild_module, "REPLAY_PAGE", replay_page)

    for r in range(2):
        run = lg.submit(manifest(30), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
        while leases := lg.claim(run, WORKER, limit=7):
            lg.heartbeat(leases[0])
            lg.record(
                [
                    Outcome(le, "fail" if (i + r) % 4 == 0 else "accept", error="flaky")
                    for i, le in enumerate(leases)
                ]
            )
    a, b = (
        Replayer("_two", cache_items=6, cache_runs=1),
        Replayer("_two", cache_items=6, cache_runs=1),
    )
    rng = random.Random(3)
    position, turns, cached = 0, [], []
    while True:
        rp = a if rng.random() < 0.5 else b
        with lg.store.write() as tx:
            if position == 0:
                create_tables(tx, "_two")
            position, n = replay_batch(tx, rp, position, 9)
        rp.committed(position)
        turns.append(rp is a)
        cached.append(a.cached() + b.cached())
        if n < 9:
            break
    assert True in turns and False in turns
    assert 0 < max(cached) <= 2 * (6 + 1)
    with lg.store.write() as tx:
        assert checksums(tx, "_two") == checksums(tx)
        drop_tables(tx, "_two")


# --------------------------------------------------------------------------
# crash safety
# --------------------------------------------------------------------------
class Crash(Exception):
    """An injected fault."""


@pytest.fixture(scope="module")
def big_history() -> Iterator[tuple[list[Any], dict[str, str]]]:
    """~16k stored events made quickly on a memory ledger (claims and records in bulk),
    and the checksums of a clean rebuild of them (checksums do not depend on the store)."""
    clock = ManualClock()
    with Ledger.open("memory://", clock=clock) as src:
        for r in range(3):
            run = src.submit(manifest(2300, max_attempts=2), SUBMITTER).run_id
            src.start(run, CONTROLLER)
            while leases := src.claim(run, WORKER, limit=1000):
                clock.advance(1)
                src.record(
                    [
                        Outcome(le, "fail" if (i + r) % 7 == 0 else "accept", error="flaky")
                        for i, le in enumerate(leases)
                    ]
                )
        src.rebuild_projections()
        yield [se for _p, se in stored_events(src)], live_checksums(src)


@pytest.mark.parametrize(
    "store_dsn", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_rebuild_resumes_after_faults_to_a_clean_rebuild(
    lg: Ledger, big_history: tuple[list[Any], dict[str, str]]
) -> None:
    events, clean = big_history
    assert len(events) > 15_000
    import_stored(lg, events)  # the events only: the projection tables are empty
    # every event is a transition (item streams begin with their first transition), its
    # columns on its row of the log, written with it
    with lg.store.read() as tx:
        assert tx.fetchone("SELECT COUNT(*) AS n FROM lg_transitions")["n"] == len(events)
    empty = live_checksums(lg)
    batch = 2500

    def crash_at(stage: str, n: int) -> Any:
        def fault(s: str, k: int) -> None:
            if (s, k) == (stage, n):
                raise Crash(f"{s} {k}")

        return fault

    # one rebuild, killed at several points, each time resumed from where it was
    starts: list[int] = []
    for stage, n in [("batch", 2), ("batch", 1), ("batch", 3), ("switch", 0)]:
        seen: list[int] = []
        with pytest.raises(Crash):
            rebuild(
                lg,
                progress=lambda d, t, seen=seen: seen.append(d),
                batch_size=batch,
                fault=crash_at(stage, n),
            )
        starts.append(seen[0])
        assert live_checksums(lg) == empty  # the live tables were not touched
        with lg.store.read() as tx:
            assert tracked_position(tx, TRACKING_NAME) is not None
    # every resume started where the previous attempt's last committed batch ended:
    # batch 2 failed (1 kept); batch 1 failed (none kept); batch 3 failed (2 more kept);
    # the switch failed after every batch was kept
    assert starts == [0, batch, batch, 3 * batch]
    seen = []
    total = rebuild(lg, progress=lambda d, t: seen.append(d), batch_size=batch)
    # the batches up to two behind the head were kept; the switch's catch-up was not
    assert seen[0] % batch == 0 and len(events) - 2 * batch <= seen[0] < len(events)
    assert total == len(events)
    assert live_checksums(lg) == clean  # the same tables as a clean rebuild (on a memory store)


# --------------------------------------------------------------------------
# the ledger in use during a rebuild
# --------------------------------------------------------------------------
def test_writes_during_a_rebuild_are_not_lost(lg: Ledger, clock: ManualClock) -> None:
    prog = Program(lg, clock)
    prog.run([("submit", 4, 0), ("start", 0), ("claim", 0), ("claim", 0), ("submit", 3, 0)])
    for _k in range(12):
        prog.run([("submit", 1, 0)])
    a, b = prog.runs[0], prog.runs[1]
    writes: list[Any] = []

    def progress(done: int, total: int) -> None:
        # commands arriving between batches: events behind and ahead of the rebuild's position
        if len(writes) == 1:
            writes.append(lg.accept(prog.leases[0]))
            writes.append(lg.start(b, CONTROLLER))
            writes.append(lg.submit(manifest(2), SUBMITTER))
        if not writes:
            writes.append(None)

    rebuild(lg, progress=progress, batch_size=5)
    assert len(writes) == 4
    assert lg.item(a, prog.leases[0].item_id).state == "accepted"
    assert lg.status(b).state == "running"
    assert lg.status(writes[3].run_id).counts["pending"] == 2
    before = live_checksums(lg)
    lg.rebuild_projections()
    assert live_checksums(lg) == before


@pytest.mark.parametrize(
    "store_dsn", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_readers_and_writers_during_a_rebuild(store_dsn: str, lg: Ledger) -> None:
    """Writers and a reader run while rebuilds run: no write is lost and the reader
    never sees an empty or half-built table. One writer writes once between every
    two batches (so writes land behind and ahead of the rebuild's position); another
    writes freely, a bounded number of times, so some writes meet the switch."""
    base = [lg.submit(manifest(3), SUBMITTER).run_id for _ in range(30)]
    stop = threading.Event()
    go, wrote = threading.Event(), threading.Event()
    reading = threading.Event()
    errors: list[BaseException] = []
    created: list[str] = []
    seen_counts: list[int] = []

    def write_one(w: Ledger) -> None:
        run_id = w.submit(manifest(2), SUBMITTER).run_id
        created.append(run_id)
        w.start(run_id, CONTROLLER)

    def paced_writer() -> None:
        with Ledger.open(store_dsn) as w:
            try:
                while not stop.is_set():
                    if go.wait(timeout=0.05):
                        go.clear()
                        write_one(w)
                        wrote.set()
            except BaseException as e:
                errors.append(e)
                wrote.set()

    def free_writer() -> None:
        with Ledger.open(store_dsn) as w:
            try:
                for _ in range(40):
                    write_one(w)
            except BaseException as e:
                errors.append(e)

    def reader() -> None:
        with Ledger.open(store_dsn) as r:
            try:
                while not stop.is_set():
                    seen_counts.append(len(r.runs(limit=10_000)))
                    reading.set()
                    st_ = r.status(base[len(seen_counts) % len(base)])
                    assert st_.counts["pending"] == 3
            except BaseException as e:
                errors.append(e)
                reading.set()

    def between_batches(done: int, total: int) -> None:
        wrote.clear()
        go.set()
        wrote.wait(timeout=30)  # one paced write lands between any two batches

    threads = [threading.Thread(target=f) for f in (paced_writer, free_writer, reader)]
    for t in threads:
        t.start()
    reading.wait(timeout=60)  # the reader is reading before the first rebuild starts
    try:
        for _ in range(3):
            rebuild(lg, progress=between_batches, batch_size=10)
    finally:
        threads[1].join()
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(created) > 40
    assert seen_counts and min(seen_counts) >= len(base)
    assert seen_counts == sorted(seen_counts)  # never fewer runs than a read before it saw
    assert [lg.status(r).state for r in created] == ["running"] * len(created)
    report = lg.verify()
    assert report.ok, report.problems


@pytest.mark.parametrize(
    "store_dsn", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_the_switch_gives_way_to_a_transaction_holding_the_tables(
    store_dsn: str, lg: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: while another transaction holds a projection table, the switch times
    out (well before deadlock detection could pick that transaction), retries, and
    completes once it ends; that transaction is never aborted."""
    import psycopg

    import ledger.projections.rebuild as rb

    run_id = lg.submit(manifest(3), SUBMITTER).run_id
    before = live_checksums(lg)
    retries = threading.Event()
    tries: list[float] = []
    real_sleep = rb.time.sleep

    def counting_sleep(seconds: float) -> None:
        tries.append(seconds)
        if len(tries) >= 3:
            retries.set()
        real_sleep(seconds)

    monkeypatch.setattr(rb.time, "sleep", counting_sleep)
    outcome: list[Any] = []
    with psycopg.connect(store_dsn) as holder:
        holder.execute("SELECT state FROM lg_runs WHERE run_id = %s FOR UPDATE", (run_id,))
        thread = threading.Thread(target=lambda: outcome.append(rebuild(lg)))
        thread.start()
        assert retries.wait(timeout=60)  # it retried three times while we held the row
        assert thread.is_alive() and not outcome
        holder.execute("UPDATE lg_items SET reason = reason WHERE run_id = %s", (run_id,))
        holder.commit()  # our transaction was not chosen as a victim
    thread.join(timeout=60)
    assert outcome and outcome[0] >= 1
    assert live_checksums(lg) == before
