"""Transient database faults and idempotency keys.

- Every command takes `idempotency_key=`: a repeat with the same key returns the first
  result and writes nothing; the same key with another command or other arguments is
  refused (`InvalidInput`), and a refused command leaves its key unused (every store).
- On PostgreSQL, a connection killed mid-command (`pg_terminate_backend` while the
  command waits on a lock it needs, holding the run's row lock) is retried: nothing had
  committed, so the command runs again and is applied exactly once.
- A TCP proxy in front of the server loses the reply to COMMIT (the commit happened) or
  the COMMIT itself (it did not): without a key the command raises `CommitUncertain`;
  with a key the ledger repeats it and answers from the record or applies it once.
- A server restart in the middle of a stream of keyed commands: every command returns,
  and each is applied exactly once.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ledger import Actor, InvalidInput, Ledger, NotComplete
from ledger.commands.idempotency import decode, encode
from ledger.core.errors import CommitUncertain, StoreUnavailable
from ledger.service.ledger import Outcome
from tests.support.clock import ManualClock
from tests.support.drive import event_count
from tests.support.pgserver import (
    TEST_SETTINGS,
    PgServer,
    create_database,
    memory_tmp_parent,
    with_dbname,
)
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest, running
from tests.support.waiting import wait_until

WAIT = 30.0  # a bound on waiting for another thread or the server, never a timing assertion


# --------------------------------------------------------------------------
# idempotency keys, every store
# --------------------------------------------------------------------------
def test_repeated_submit_with_a_key_makes_one_run(lg: Ledger) -> None:
    first = lg.submit(manifest(2), SUBMITTER, idempotency_key="submit-2026-11-28")
    before = event_count(lg)
    again = lg.submit(manifest(2), SUBMITTER, idempotency_key="submit-2026-11-28")
    assert again == first
    assert event_count(lg) == before
    assert [r.run_id for r in lg.runs()] == [first.run_id]


def test_repeat_returns_the_first_result_even_after_later_changes(lg: Ledger) -> None:
    submitted = lg.submit(manifest(2), SUBMITTER)
    run_id = submitted.run_id
    started = lg.start(run_id, CONTROLLER, idempotency_key="start-1")
    leases = lg.claim(run_id, WORKER, limit=2, idempotency_key="claim-1")
    accepted = lg.accept(leases[0], evidence={"receipt": "r1"}, idempotency_key="accept-1")
    before = event_count(lg)

    assert lg.start(run_id, CONTROLLER, idempotency_key="start-1") == started
    assert started.revision == submitted.revision + 1 and started.state == "running"
    # the same leases, tokens included: a worker that lost the reply keeps its leases
    assert lg.claim(run_id, WORKER, limit=2, idempotency_key="claim-1") == leases
    assert lg.accept(leases[0], evidence={"receipt": "r1"}, idempotency_key="accept-1") == accepted
    assert event_count(lg) == before
    assert lg.item(run_id, leases[1].item_id).lease.token == leases[1].token  # type: ignore[union-attr]
    # without a key, the repeat of an outcome is just a lost lease
    with pytest.raises(Exception, match="not live"):
        lg.accept(leases[0], evidence={"receipt": "r1"})


@pytest.mark.parametrize(
    "command", ["cancel", "amend", "record", "fail_attempt", "pause", "reconcile"]
)
def test_more_commands_answer_a_repeat_from_the_record(
    lg: Ledger, clock: ManualClock, command: str
) -> None:
    run_id = running(lg, 3, lease_seconds=30)
    leases = lg.claim(run_id, WORKER, limit=2)
    calls = {
        "cancel": lambda: lg.cancel(run_id, OPERATOR, "stop", idempotency_key="k"),
        "amend": lambda: lg.amend(
            run_id, SUBMITTER, "one more", items=[{"item_id": "new"}], idempotency_key="k"
        ),
        "record": lambda: lg.record(
            [Outcome(leases[0], "accept"), Outcome(leases[1], "fail", error="x")],
            idempotency_key="k",
        ),
        "fail_attempt": lambda: lg.fail_attempt(leases[0], "boom", idempotency_key="k"),
        "pause": lambda: lg.pause(run_id, OPERATOR, "hold", idempotency_key="k"),
        "reconcile": lambda: lg.reconcile(idempotency_key="k"),
    }
    if command == "reconcile":
        clock.advance(31)
    first = calls[command]()
    before = event_count(lg)
    status = lg.status(run_id)
    assert calls[command]() == first
    assert event_count(lg) == before and lg.status(run_id) == status


def test_same_key_with_other_arguments_or_command_is_refused(lg: Ledger) -> None:
    run_id = running(lg, 3)
    (lease,) = lg.claim(run_id, WORKER, idempotency_key="k-claim")
    before = event_count(lg)
    with pytest.raises(
        InvalidInput, match=r"idempotency_key .k-claim. was already used for another command"
    ):
        lg.claim(run_id, WORKER, limit=2, idempotency_key="k-claim")
    with pytest.raises(InvalidInput, match="already used for another command"):
        lg.accept(lease, idempotency_key="k-claim")
    with pytest.raises(InvalidInput, match="already used"):
        lg.claim(run_id, Actor("w2", "worker"), idempotency_key="k-claim")
    assert event_count(lg) == before
    assert lg.item(run_id, lease.item_id).state == "in_progress"


def test_a_refused_command_leaves_its_key_unused(lg: Ledger) -> None:
    run_id = running(lg, 1)
    with pytest.raises(NotComplete):
        lg.complete(run_id, CONTROLLER, idempotency_key="complete-1")
    (lease,) = lg.claim(run_id, WORKER)
    lg.accept(lease)
    assert lg.complete(run_id, CONTROLLER, idempotency_key="complete-1").state == "succeeded"


@pytest.mark.parametrize("key", ["", "x" * 201, "line\nbreak", "nul\x00", 42, b"bytes"])
def test_bad_keys_are_refused_before_anything_is_read(lg: Ledger, key: Any) -> None:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    before = event_count(lg)
    with pytest.raises(InvalidInput, match="idempotency_key"):
        lg.start(run_id, CONTROLLER, idempotency_key=key)
    with pytest.raises(InvalidInput, match="idempotency_key"):
        lg.start("not-a-run", CONTROLLER, idempotency_key=key)
    assert event_count(lg) == before


def test_keys_survive_a_projection_rebuild(lg: Ledger) -> None:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    started = lg.start(run_id, CONTROLLER, idempotency_key="start-x")
    try:
        lg.rebuild_projections()
    except (ImportError, NotImplementedError):
        pytest.skip("rebuild_projections is not there yet")
    before = event_count(lg)
    assert lg.start(run_id, CONTROLLER, idempotency_key="start-x") == started
    assert event_count(lg) == before


def test_concurrent_repeats_of_one_key_write_once(lg: Ledger) -> None:
    run_id = running(lg, 40)
    barrier = threading.Barrier(4)
    results: list[Any] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            barrier.wait(WAIT)
            results.append(lg.claim(run_id, WORKER, limit=10, idempotency_key="claim-once"))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not errors
    assert len(results) == 4 and all(r == results[0] for r in results)
    assert len(results[0]) == 10
    assert lg.status(run_id).counts["in_progress"] == 10
    assert [t.command for t in lg.history(run_id)].count("claim") == 10


def test_responses_round_trip() -> None:
    from ledger.core.errors import ItemNotFound, LeaseLost

    with Ledger.open("memory://") as lg:
        run_id = running(lg, 2)
        leases = lg.claim(run_id, WORKER, limit=2)
        values = [
            lg.status(run_id),
            leases,
            lg.items(run_id),
            lg.cancel(run_id, OPERATOR, "x"),
            lg.reconcile(),
            lg.heartbeat(leases[0]),
        ]
    for v in values:
        assert decode(encode(v)) == v
    lost = decode(encode([LeaseLost("gone"), ItemNotFound("r", "i")]))
    assert isinstance(lost[0], LeaseLost) and lost[0].message == "gone"
    assert isinstance(lost[1], ItemNotFound) and (lost[1].run_id, lost[1].item_id) == ("r", "i")


# --------------------------------------------------------------------------
# PostgreSQL: a connection killed mid-command
# --------------------------------------------------------------------------
def _backend_waiting_on_lock(admin: psycopg.Connection[Any], pattern: str) -> int | None:
    row = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND wait_event_type = 'Lock' AND query ILIKE %s",
        (pattern,),
    ).fetchone()
    return None if row is None else int(row[0])


@pytest.mark.postgres
@pytest.mark.parametrize("where", ["run row lock", "events table lock"])
def test_connection_killed_mid_command_is_retried_and_applied_once(pg_dsn: str, where: str) -> None:
    """The command waits on a lock; its backend is terminated; nothing had committed, so
    the ledger runs it again on a new connection and it is applied exactly once."""
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 3)
        before = event_count(lg)
        result: dict[str, Any] = {}

        def claim() -> None:
            try:
                result["leases"] = lg.claim(run_id, WORKER, limit=2)
            except BaseException as e:
                result["error"] = e

        with psycopg.connect(pg_dsn, autocommit=True) as admin, psycopg.connect(pg_dsn) as locker:
            if where == "run row lock":
                locker.execute("SELECT 1 FROM lg_runs WHERE run_id = %s FOR UPDATE", (run_id,))
                pattern = "%lg_runs%"
            else:
                # the claim locks its run row, reads, then blocks appending its events
                # (its INSERT needs ROW EXCLUSIVE on the table, which this lock excludes)
                locker.execute(f"LOCK TABLE {lg.store.events_table()} IN SHARE ROW EXCLUSIVE MODE")
                pattern = f"%INSERT INTO %{lg.store.events_table()}%"
            worker = threading.Thread(target=claim)
            worker.start()
            pid = wait_until(
                lambda: _backend_waiting_on_lock(admin, pattern), "the claim to wait on the lock"
            )
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            wait_until(
                lambda: admin.execute(
                    "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s)", (pid,)
                ).fetchone()[0],
                "the backend to go",
            )  # type: ignore[index]
            locker.rollback()
            worker.join(WAIT)
        assert "error" not in result, result.get("error")
        leases = result["leases"]
        assert [le.item_id for le in leases] == ["i0", "i1"]
        claims = [t for t in lg.history(run_id) if t.command == "claim"]
        assert [(t.item_id, t.evidence["lease_token"]) for t in claims] == [
            (le.item_id, le.token) for le in leases
        ]
        assert event_count(lg) == before + 2  # per item: the claim (its stream begins with it)
        for le in leases:
            assert lg.accept(le).state == "accepted"


@pytest.mark.postgres
def test_reconcile_retries_one_run_without_losing_the_others(pg_dsn: str) -> None:
    """The reconciler commits run by run. A connection killed while it waits on the second
    run repeats that run's pass only: the report still counts every lease it expired."""
    clock = ManualClock()
    with Ledger.open(pg_dsn, clock=clock) as lg:
        run_ids = [running(lg, 2, lease_seconds=10) for _ in range(3)]
        for r in run_ids:
            lg.claim(r, WORKER, limit=2)
        clock.advance(60)
        result: dict[str, Any] = {}

        def reconcile() -> None:
            try:
                result["report"] = lg.reconcile()
            except BaseException as e:
                result["error"] = e

        lockers = {r: psycopg.connect(pg_dsn) for r in run_ids}
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            try:
                pids = {}
                for r, conn in lockers.items():
                    conn.execute("SELECT 1 FROM lg_runs WHERE run_id = %s FOR UPDATE", (r,))
                    pids[conn.info.backend_pid] = r
                thread = threading.Thread(target=reconcile)
                thread.start()

                def blocked_on() -> tuple[int, str] | None:
                    pid = _backend_waiting_on_lock(admin, "%lg_runs%")
                    if pid is None:
                        return None
                    row = admin.execute("SELECT pg_blocking_pids(%s)", (pid,)).fetchone()
                    holders = [p for p in (row[0] if row else []) if p in pids]
                    return (pid, pids[holders[0]]) if holders else None

                _, first = wait_until(blocked_on, "the reconciler to wait on a run")
                lockers.pop(first).rollback()  # let the first run through: it commits
                pid, _ = wait_until(
                    lambda: (b := blocked_on()) and b[1] != first and b,
                    "the reconciler to wait on the next run",
                )
                assert lg.item(first, "i0").state == "retryable"  # the first run's pass committed
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                for conn in lockers.values():
                    conn.rollback()
                thread.join(WAIT)
            finally:
                for conn in lockers.values():
                    conn.close()
        assert "error" not in result, result.get("error")
        assert result["report"].expired_leases == 6
        for r in run_ids:
            assert [a.outcome for a in lg.attempts(r)] == ["lease_expired", "lease_expired"]
            assert [t.command for t in lg.history(r)].count("expire") == 2


# --------------------------------------------------------------------------
# PostgreSQL: the reply to COMMIT (or the COMMIT itself) is lost
# --------------------------------------------------------------------------
# psycopg sends COMMIT as a simple query, or (pipeline mode) as an unnamed Parse message
COMMIT_QUERIES = (b"Q\x00\x00\x00\x0bCOMMIT\x00", b"\x00COMMIT\x00")
COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"  # the server's CommandComplete for it


class CommitCutter:
    """A TCP proxy to PostgreSQL that, when armed, cuts the connection at the next COMMIT:
    `lose_reply` forwards the COMMIT, waits for the server's answer and drops it (the
    transaction committed; the client cannot know); `lose_commit` drops the COMMIT
    itself (the server rolls the transaction back when the connection goes)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.mode: str | None = None
        self.tripped = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, mode: str) -> None:
        with self._lock:
            self.mode = mode
            self.tripped.clear()

    def _take(self) -> str | None:
        with self._lock:
            mode, self.mode = self.mode, None
            return mode

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self._lock:
                self._socks += [client, server]
            cut = threading.Event()
            waiting_reply = threading.Event()
            threading.Thread(
                target=self._up, args=(client, server, cut, waiting_reply), daemon=True
            ).start()
            threading.Thread(
                target=self._down, args=(client, server, cut, waiting_reply), daemon=True
            ).start()

    @staticmethod
    def _cut(*socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _up(
        self,
        client: socket.socket,
        server: socket.socket,
        cut: threading.Event,
        waiting_reply: threading.Event,
    ) -> None:
        try:
            while data := client.recv(65536):
                if any(q in data for q in COMMIT_QUERIES) and self.mode is not None:
                    mode = self._take()
                    if mode == "lose_commit":
                        cut.set()
                        self.tripped.set()
                        self._cut(client, server)
                        return
                    if mode == "lose_reply":
                        waiting_reply.set()
                server.sendall(data)
        except OSError:
            pass

    def _down(
        self,
        client: socket.socket,
        server: socket.socket,
        cut: threading.Event,
        waiting_reply: threading.Event,
    ) -> None:
        buffered = b""
        try:
            while data := server.recv(65536):
                if waiting_reply.is_set():
                    buffered += data
                    if COMMIT_DONE in buffered:  # the server committed: the reply never arrives
                        cut.set()
                        self.tripped.set()
                        self._cut(client, server)
                        return
                    continue
                client.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.close()


@pytest.fixture
def cutter(pg_dsn: str) -> Iterator[tuple[CommitCutter, str]]:
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    proxy = CommitCutter(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    dsn = f"postgresql://{info.get('user') or 'postgres'}@127.0.0.1:{proxy.port}/{info['dbname']}"
    try:
        yield proxy, dsn
    finally:
        proxy.close()


@pytest.mark.postgres
def test_lost_commit_reply_without_a_key_is_reported_as_uncertain(
    cutter: tuple[CommitCutter, str],
) -> None:
    proxy, dsn = cutter
    with Ledger.open(dsn) as lg:
        run_id = lg.submit(manifest(2), SUBMITTER).run_id
        before = event_count(lg)
        proxy.arm("lose_reply")
        with pytest.raises(CommitUncertain, match="may or may not have been applied"):
            lg.start(run_id, CONTROLLER)
        assert proxy.tripped.is_set()
        # it was applied: exactly why the ledger cannot repeat it blindly
        assert lg.status(run_id).state == "running" and event_count(lg) == before + 1


@pytest.mark.postgres
def test_lost_commit_reply_with_a_key_is_answered_from_the_record(
    cutter: tuple[CommitCutter, str],
) -> None:
    proxy, dsn = cutter
    with Ledger.open(dsn) as lg:
        submitted = lg.submit(manifest(3), SUBMITTER)
        run_id = submitted.run_id
        before = event_count(lg)
        proxy.arm("lose_reply")
        started = lg.start(run_id, CONTROLLER, idempotency_key="start-77")
        assert proxy.tripped.is_set()
        assert (started.state, started.revision) == ("running", submitted.revision + 1)
        assert event_count(lg) == before + 1

        proxy.arm("lose_reply")
        leases = lg.claim(run_id, WORKER, limit=3, idempotency_key="claim-77")
        assert proxy.tripped.is_set()
        # the worker holds exactly the leases that were committed
        live = {i.item_id: i.lease.token for i in lg.items(run_id) if i.lease is not None}
        assert live == {le.item_id: le.token for le in leases} and len(live) == 3
        assert [t.command for t in lg.history(run_id)].count("claim") == 3

        proxy.arm("lose_reply")
        outcome = lg.record([Outcome(le, "accept") for le in leases], idempotency_key="record-77")
        assert proxy.tripped.is_set()
        assert [getattr(o, "state", o) for o in outcome] == ["accepted"] * 3
        assert [t.command for t in lg.history(run_id)].count("accept") == 3


@pytest.mark.postgres
def test_lost_commit_with_a_key_is_applied_once(cutter: tuple[CommitCutter, str]) -> None:
    proxy, dsn = cutter
    with Ledger.open(dsn) as lg:
        run_id = running(lg, 2)
        (lease,) = lg.claim(run_id, WORKER)
        before = event_count(lg)
        proxy.arm("lose_commit")
        status = lg.accept(lease, evidence={"receipt": 1}, idempotency_key="accept-9")
        assert proxy.tripped.is_set()
        assert status.state == "accepted"
        assert event_count(lg) == before + 1
        assert [t.command for t in lg.history(run_id)].count("accept") == 1

        proxy.arm("lose_commit")
        with pytest.raises(CommitUncertain):  # no key: the caller is told, and may re-read
            lg.skip(run_id, "i1", OPERATOR, "not needed")
        assert lg.item(run_id, "i1").state == "pending"  # this time it had not committed


@pytest.mark.postgres
@pytest.mark.parametrize("mode", ["lose_reply", "lose_commit"])
def test_a_worker_whose_outcome_commit_is_in_doubt_reads_the_store_and_goes_on(
    cutter: tuple[CommitCutter, str], mode: str
) -> None:
    from ledger import Accepted, Lease, Worker

    proxy, dsn = cutter
    with Ledger.open(dsn) as lg:
        run_id = running(lg, 4)
        armed = threading.Event()

        def handle(lease: Lease) -> Accepted:
            if not armed.is_set():  # the next COMMIT is this outcome's
                armed.set()
                proxy.arm(mode)
            return Accepted()

        summary = Worker(lg, run_id, handle, concurrency=1, prefetch=1).run()
        assert proxy.tripped.is_set()
        assert (summary.accepted, summary.lease_lost, summary.errors) == (4, 0, [])
        assert lg.status(run_id).counts["accepted"] == 4
        assert Counter(t.command for t in lg.history(run_id) if t.item_id) == Counter(
            claim=4, accept=4
        )


@pytest.mark.postgres
@pytest.mark.parametrize("mode", ["lose_reply", "lose_commit"])
def test_a_worker_whose_claim_commit_is_in_doubt_says_so_and_goes_on(
    cutter: tuple[CommitCutter, str], mode: str
) -> None:
    from ledger import Accepted, Worker

    proxy, dsn = cutter
    with Ledger.open(dsn) as lg:
        run_id = running(lg, 4)
        real_claim = lg.claim

        def claim(*args: Any, **kwargs: Any) -> Any:
            if not proxy.tripped.is_set():
                proxy.arm(mode)  # the next COMMIT is this claim's (the worker's first: 2 items)
            return real_claim(*args, **kwargs)

        lg.claim = claim  # type: ignore[method-assign]
        summary = Worker(lg, run_id, lambda lease: Accepted(), concurrency=1, prefetch=2).run()
        assert proxy.tripped.is_set()
        assert len(summary.errors) == 1 and summary.errors[0].startswith("claim in doubt")
        counts = lg.status(run_id).counts
        if mode == "lose_reply":  # it committed: two items stay leased until their leases expire
            assert (summary.accepted, counts["accepted"], counts["in_progress"]) == (2, 2, 2)
            assert "remaining items are leased" in summary.stopped
        else:  # it did not: the next claims took every item
            assert (summary.accepted, counts["accepted"], counts["in_progress"]) == (4, 4, 0)


# --------------------------------------------------------------------------
# PostgreSQL: the server restarts while commands run
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def own_server() -> Iterator[PgServer]:
    """A server of our own, so restarting it disturbs no other test."""
    server = PgServer(settings=TEST_SETTINGS, tmp_parent=memory_tmp_parent())
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.mark.postgres
def test_server_restart_during_keyed_commands(own_server: PgServer) -> None:
    create_database(own_server.admin_dsn, "restart_test")
    dsn = with_dbname(own_server.admin_dsn, "restart_test")
    n = 150
    done = threading.Event()
    progress = Counter[str]()
    errors: list[BaseException] = []
    with Ledger.open(dsn) as lg:
        run_id = running(lg, n, lease_seconds=600)

        def work() -> None:
            try:
                for k in range(n):
                    (lease,) = lg.claim(run_id, WORKER, idempotency_key=f"claim-{k}")
                    progress["claimed"] += 1
                    lg.accept(lease, evidence={"k": k}, idempotency_key=f"accept-{k}")
                    progress["accepted"] += 1
            except BaseException as e:
                errors.append(e)
            finally:
                done.set()

        worker = threading.Thread(target=work)
        worker.start()
        wait_until(lambda: progress["accepted"] >= 5 or done.is_set(), "the first outcomes")
        own_server.restart()  # pg_ctl restart -m fast: every connection is cut
        assert progress["accepted"] < n  # the restart came in the middle of the stream
        worker.join(WAIT * 2)
        assert not worker.is_alive()
        assert not errors, errors
        assert progress == Counter(claimed=n, accepted=n)
        st = lg.status(run_id)
        assert st.counts["accepted"] == n and st.counts["in_progress"] == 0
        hist = lg.history(run_id)
        per_item = Counter((t.item_id, t.command) for t in hist if t.item_id)
        assert set(per_item.values()) == {1}  # one claim and one accept per item, none twice
        assert len(per_item) == 2 * n


@pytest.mark.postgres
def test_a_follower_rides_out_a_server_restart_and_handles_each_transition_once(
    own_server: PgServer,
) -> None:
    from ledger import Follower

    create_database(own_server.admin_dsn, "follower_restart")
    dsn = with_dbname(own_server.admin_dsn, "follower_restart")
    with Ledger.open(dsn) as lg:
        with lg.store.write() as tx:  # a read model of the user's, in the ledger's database
            tx.execute("CREATE TABLE seen (position BIGINT PRIMARY KEY)")

        def handle(batch: list[Any], tx: Any) -> None:  # in-database: exactly once
            tx.executemany("INSERT INTO seen (position) VALUES (?)", [(t.position,) for t in batch])

        def everything() -> list[int]:
            out: list[int] = []
            while page := lg.events(after=out[-1] if out else 0):
                out += [t.position for t in page]
            return out

        follower = Follower(lg, "restart", handle, batch=5)
        errors: list[BaseException] = []

        def follow() -> None:
            try:
                follower.run()
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=follow)
        thread.start()
        try:
            running(lg, 10)
            wait_until(lambda: follower.position == everything()[-1], "the first catch-up")
            own_server.restart()  # every connection is cut: the pool's, the lock's, LISTEN's
            running(lg, 10)  # commits after the restart
            wait_until(
                lambda: errors or follower.position == everything()[-1],
                "the follower to go on after the restart",
            )
        finally:
            follower.stop()
            thread.join(WAIT)
        assert not thread.is_alive()
        assert errors == []
        with lg.store.read() as tx:
            seen = [r["position"] for r in tx.fetchall("SELECT position FROM seen ORDER BY 1")]
        assert seen == everything()  # none skipped, none twice (the key would refuse it)


@pytest.mark.postgres
def test_unreachable_server_surfaces_store_unavailable(
    own_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.commands import idempotency

    monkeypatch.setattr(idempotency, "RETRY_DELAYS", (0.01, 0.01))
    create_database(own_server.admin_dsn, "unreachable_test")
    dsn = with_dbname(own_server.admin_dsn, "unreachable_test")
    with Ledger.open(dsn) as lg:
        run_id = lg.submit(manifest(1), SUBMITTER).run_id
        lg.store.datastore.pool.timeout = 0.5  # type: ignore[attr-defined]
        own_server.stop()
        try:
            with pytest.raises(StoreUnavailable, match="nothing was written"):
                lg.start(run_id, CONTROLLER)
        finally:
            own_server.start()
        assert lg.start(run_id, CONTROLLER).state == "running"


def test_pruning_forgets_only_keys_older_than_asked(
    lg: Ledger, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from ledger.commands import idempotency

    monkeypatch.setattr(idempotency, "PRUNE_PAGE", 2)  # several pages
    old = [lg.submit(manifest(1), SUBMITTER, idempotency_key=f"old-{k}") for k in range(3)]
    clock.advance(3 * 86400)
    new = lg.submit(manifest(1), SUBMITTER, idempotency_key="new-0")
    with pytest.raises(InvalidInput, match="non-negative timedelta"):
        lg.prune_idempotency_keys(-timedelta(days=1))
    assert lg.prune_idempotency_keys(timedelta(days=2)) == 3
    assert lg.prune_idempotency_keys(timedelta(days=2)) == 0
    # a kept key still answers from the record; a forgotten one is a new command
    assert lg.submit(manifest(1), SUBMITTER, idempotency_key="new-0").run_id == new.run_id
    again = lg.submit(manifest(1), SUBMITTER, idempotency_key="old-0")
    assert again.run_id not in {s.run_id for s in old}
    assert len(lg.runs()) == 5


def test_pruning_refuses_what_is_not_an_age_and_writes_nothing(lg: Ledger) -> None:
    from datetime import timedelta

    lg.submit(manifest(1), SUBMITTER, idempotency_key="kept")
    for bad in ("30", None, 30, -timedelta(seconds=1)):
        with pytest.raises(InvalidInput, match="older_than"):
            lg.prune_idempotency_keys(bad)  # type: ignore[arg-type]
    assert lg.prune_idempotency_keys(timedelta.max) == 0  # older than the calendar: none
    first = lg.submit(manifest(1), SUBMITTER, idempotency_key="kept")
    assert [r.run_id for r in lg.runs()] == [first.run_id]  # the key still answers
