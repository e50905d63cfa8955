"""PostgreSQL as a first-class store: its clock, its row locks, its connections.

- With no clock injected, PostgreSQL's clock stamps events and judges leases: the
  tests set the process clock a day wrong and the ledger does not notice.
- Every run command locks its run's row FOR UPDATE, item commands FOR SHARE
  (tests/stores/test_item_locks_pg.py), so a claim and a cancel or pause of the same run
  never interleave: whichever holds the row first commits first, and the other
  sees its result. The tests hold one command inside its transaction and watch
  the other wait in pg_stat_activity.
- Each Ledger keeps a pool of 2 connections, growing to at most 12; `close()`
  leaves none behind.
"""

from __future__ import annotations

import gc
import secrets
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from ledger import IllegalTransition, InvalidInput, LeaseLost, Ledger
from ledger.stores.postgres import PostgresStore, _events_json
from tests.support.hold import MONITOR, STOPS, HeldInTransaction, backends, lock_waiters
from tests.support.pgserver import create_database, drop_database, free_port
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest, running
from tests.support.waiting import start_thread, wait_until

pytestmark = pytest.mark.postgres

WAIT = 30.0  # a bound on waiting for a condition, never a timing assertion
POOL_MIN, POOL_MAX = 2, 12


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def server_now(dsn: str) -> datetime:
    with psycopg.connect(dsn, autocommit=True, application_name=MONITOR) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


class SkewedDatetime(datetime):
    """`datetime` whose now() is `skew` away from the truth."""

    skew = timedelta(0)

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) + cls.skew


@pytest.fixture
def skewed_process_clock(monkeypatch: pytest.MonkeyPatch) -> type[SkewedDatetime]:
    """Every ledger and projections module sees a process clock `skew` away from the truth."""
    patched = 0
    for name, module in list(sys.modules.items()):
        if (
            name.split(".")[0] in ("ledger", "projections")
            and getattr(module, "datetime", None) is datetime
        ):
            monkeypatch.setattr(module, "datetime", SkewedDatetime)
            patched += 1
    assert patched, "no ledger module imports datetime: nothing to skew"
    monkeypatch.setattr(SkewedDatetime, "skew", timedelta(0))
    return SkewedDatetime


@pytest.fixture
def db_clock_ledger(pg_dsn: str) -> Iterator[Ledger]:
    """A ledger on PostgreSQL with no injected clock."""
    with Ledger.open(pg_dsn) as lg:
        yield lg


# --------------------------------------------------------------------------
# PostgreSQL's clock
# --------------------------------------------------------------------------
def test_event_times_come_from_the_server_clock(
    db_clock_ledger: Ledger, pg_dsn: str, skewed_process_clock: type[SkewedDatetime]
) -> None:
    lg = db_clock_ledger
    skewed_process_clock.skew = timedelta(days=-1)
    assert abs(datetime.now(UTC) - server_now(pg_dsn)) < timedelta(hours=1)  # same machine

    before = server_now(pg_dsn)
    run_id = running(lg, 3, lease_seconds=120)
    leases = lg.claim(run_id, WORKER, limit=2)
    lg.accept(leases[0])
    lg.heartbeat(leases[1])
    after = server_now(pg_dsn)

    history = lg.history(run_id)
    assert [t.command for t in history][:2] == ["submit", "start"]
    for t in history:
        assert before <= t.at <= after, (t.command, t.at, before, after)
    for le in leases:
        assert before + timedelta(seconds=120) <= le.expires_at <= after + timedelta(seconds=120)
    st = lg.status(run_id)
    assert before <= st.created_at <= st.updated_at <= after
    for a in lg.attempts(run_id):
        assert before <= a.started_at <= after
    times = [t.at for t in history]
    assert times == sorted(times)  # one run, one lock: stamps follow positions


def test_leases_expire_by_the_server_clock_not_the_process_clock(
    db_clock_ledger: Ledger, pg_dsn: str, skewed_process_clock: type[SkewedDatetime]
) -> None:
    lg = db_clock_ledger
    run_id = running(lg, 2, lease_seconds=0.5)
    live, other = lg.claim(run_id, WORKER, limit=2)

    # the process clock runs a day ahead: by it every lease expired long ago
    skewed_process_clock.skew = timedelta(days=1)
    assert lg.reconcile().expired_leases == 0
    assert lg.accept(live).state == "accepted"

    # the process clock runs a day behind: by it the lease has a day to go
    skewed_process_clock.skew = timedelta(days=-1)
    wait_until(lambda: server_now(pg_dsn) > other.expires_at, "the server clock to pass the lease")
    with pytest.raises(LeaseLost):
        lg.heartbeat(other)
    with pytest.raises(LeaseLost):
        lg.accept(other)
    report = lg.reconcile()
    assert report.expired_leases == 1
    [attempt] = lg.attempts(run_id, other.item_id)
    assert attempt.outcome == "lease_expired"
    assert attempt.finished_at is not None and attempt.finished_at > other.expires_at
    assert lg.item(run_id, other.item_id).state == "retryable"


def test_a_server_in_another_time_zone_records_the_same_instants(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        db = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        conn.execute(f"ALTER DATABASE \"{db}\" SET timezone TO 'Pacific/Chatham'")  # +12:45/+13:45
    with Ledger.open(pg_dsn) as lg:
        before = server_now(pg_dsn)
        assert before.utcoffset() != timedelta(0)  # sessions really are in that zone
        run_id = running(lg, 2, lease_seconds=60)
        [le] = lg.claim(run_id, WORKER)
        after = server_now(pg_dsn)
        assert before + timedelta(seconds=60) <= le.expires_at <= after + timedelta(seconds=60)
        assert all(before <= t.at <= after for t in lg.history(run_id))
        assert lg.reconcile().expired_leases == 0  # compared as instants, not as local text
        with pytest.raises(
            InvalidInput
        ):  # rule 14 of the rule book: a now ahead of the store's clock
            lg.reconcile(now=le.expires_at + timedelta(seconds=1))


def test_a_command_waiting_for_the_run_lock_reads_the_clock_after_the_wait(
    db_clock_ledger: Ledger, pg_dsn: str
) -> None:
    """A worker whose lease expires while its outcome waits for the run's row lock has
    lost it: the clock that judges the lease is read once the lock is granted."""
    lg = db_clock_ledger
    run_id = running(lg, 1, lease_seconds=0.5)
    [le] = lg.claim(run_id, WORKER)
    outcome: list[Any] = []

    def accept() -> None:
        try:
            outcome.append(lg.accept(le))
        except Exception as e:
            outcome.append(e)

    with psycopg.connect(pg_dsn) as holder:  # another transaction holding the run's row
        holder.execute("SELECT 1 FROM lg_runs WHERE run_id = %s FOR UPDATE", (run_id,))
        worker = threading.Thread(target=accept)
        worker.start()
        wait_until(lambda: lock_waiters(pg_dsn), "the accept to wait for the run's row lock")
        wait_until(lambda: server_now(pg_dsn) > le.expires_at, "the lease to expire")
        holder.rollback()
        worker.join(WAIT)
    [result] = outcome
    assert isinstance(result, LeaseLost), result
    assert lg.item(run_id, le.item_id).state == "in_progress"  # the reconciler will expire it


# --------------------------------------------------------------------------
# the run row lock: claims and a cancel or pause never interleave
# --------------------------------------------------------------------------
@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_stop_waits_for_a_claim_holding_the_run_and_then_sees_its_leases(
    stop: str, pg_dsn: str, hold: Callable[[], HeldInTransaction]
) -> None:
    command, state_with_leases = STOPS[stop]
    with Ledger.open(pg_dsn) as claimer, Ledger.open(pg_dsn) as stopper:
        run_id = running(claimer, 5)
        held = hold()
        held.start(lambda: claimer.claim(run_id, WORKER, limit=3))

        stopped: list[Any] = []
        t = start_thread(lambda: command(stopper, run_id), stopped)
        wait_until(lambda: lock_waiters(pg_dsn), f"the {stop} to wait for the claim's row lock")
        assert stopped == []  # it waits; it has not acted on what it would have read

        leases = held.release()
        t.join(WAIT)
        assert len(leases) == 3
        [result] = stopped
        assert not isinstance(result, Exception), result
        assert result.state == state_with_leases  # it saw the 3 live leases the claim committed
        if stop == "cancel":
            assert result.in_flight == 3

        history = stopper.history(run_id)
        [stop_at] = [t.position for t in history if t.command == stop and t.item_id is None]
        assert all(t.position < stop_at for t in history if t.command == "claim")
        with pytest.raises(IllegalTransition):
            claimer.claim(run_id, WORKER)


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_claim_that_began_before_a_stop_committed_claims_nothing(
    stop: str, pg_dsn: str, hold: Callable[[], HeldInTransaction]
) -> None:
    command, _ = STOPS[stop]
    with Ledger.open(pg_dsn) as claimer, Ledger.open(pg_dsn) as stopper:
        run_id = running(claimer, 5)
        held = hold()
        held.start(lambda: command(stopper, run_id))  # the stop has read the run, not committed

        claimed: list[Any] = []
        t = start_thread(lambda: claimer.claim(run_id, WORKER, limit=3), claimed)
        wait_until(lambda: lock_waiters(pg_dsn), "the claim to wait for the stop's row lock")
        assert claimed == []

        stop_result = held.release()
        t.join(WAIT)
        assert not isinstance(stop_result, Exception), stop_result
        [result] = claimed
        assert isinstance(result, IllegalTransition), result
        assert result.state == ("canceled" if stop == "cancel" else "paused")
        history = claimer.history(run_id)
        assert [t for t in history if t.command == "claim"] == []
        assert claimer.status(run_id).counts.get("in_progress", 0) == 0


# --------------------------------------------------------------------------
# connections
# --------------------------------------------------------------------------
def test_every_connection_is_the_pools_and_close_leaves_none(pg_dsn: str) -> None:
    lg = Ledger.open(pg_dsn)
    try:
        run_id = running(lg, 3)
        lg.claim(run_id, WORKER, limit=3)
        assert isinstance(lg.store, PostgresStore)
        pool = lg.store.datastore.pool
        assert (pool.min_size, pool.max_size) == (POOL_MIN, POOL_MAX)
        wait_until(lambda: backends(pg_dsn) >= POOL_MIN, "the pool to fill to its minimum")
        # no connection outside the pool (the pool may open one more than its minimum
        # when the first command arrives before the pool has filled)
        assert backends(pg_dsn) == pool.get_stats()["pool_size"] <= POOL_MIN + 1
    finally:
        lg.close()
    wait_until(lambda: backends(pg_dsn) == 0, "the closed ledger's connections to go")


def test_twelve_connections_at_most_and_the_thirteenth_caller_waits(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 2)
        assert isinstance(lg.store, PostgresStore)
        pool = lg.store.datastore.pool
        with ExitStack() as held:
            for _ in range(POOL_MAX):  # every connection busy, e.g. 12 threads mid-command
                held.enter_context(lg.store.read())
            assert backends(pg_dsn) == POOL_MAX
            got: list[Any] = []
            t = start_thread(lambda: lg.status(run_id).state, got)
            wait_until(
                lambda: pool.get_stats().get("requests_waiting", 0) == 1,
                "the 13th caller to queue for a connection",
            )
            assert got == [] and backends(pg_dsn) == POOL_MAX
        t.join(WAIT)
        assert got == ["running"]
        assert backends(pg_dsn) <= POOL_MAX


def test_many_threads_on_one_ledger_stay_within_the_pool(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg:
        run_id = running(lg, 60)
        errors: list[BaseException] = []
        peak = 0
        stop = threading.Event()

        def work() -> None:
            try:
                for _ in range(3):
                    for le in lg.claim(run_id, WORKER, limit=2):
                        lg.accept(le)
                    lg.status(run_id)
            except BaseException as e:
                errors.append(e)

        def watch() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, backends(pg_dsn))

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=work) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 4)
        stop.set()
        watcher.join(WAIT)
        assert errors == []
        assert lg.status(run_id).counts["accepted"] == 60
        assert 0 < peak <= POOL_MAX


def test_opening_and_closing_many_ledgers_leaks_nothing(pg_dsn: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _k in range(10):
            with Ledger.open(pg_dsn) as lg:
                run_id = running(lg, 1)
                lg.status(run_id)
        del lg
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    wait_until(lambda: backends(pg_dsn) == 0, "every closed ledger's connections to go")


def test_a_closed_ledger_does_not_reconnect(pg_dsn: str) -> None:
    lg = Ledger.open(pg_dsn)
    run_id = running(lg, 1)
    lg.close()
    lg.close()  # twice is fine
    with pytest.raises(Exception):  # noqa: B017 - which error is the pool's business
        lg.status(run_id)
    wait_until(lambda: backends(pg_dsn) == 0, "the closed ledger's connections to go")


# --------------------------------------------------------------------------
# the DSN
# --------------------------------------------------------------------------
def with_params(dsn: str, params: str) -> str:
    return dsn + ("&" if "?" in dsn else "?") + params


def test_every_dsn_parameter_reaches_the_server(pg_dsn: str) -> None:
    dsn = with_params(
        pg_dsn, "application_name=ledger-dsn-test&options=-c%20statement_timeout%3D4321"
    )
    with Ledger.open(dsn) as lg:
        run_id = running(lg, 1)
        with lg.store.read() as tx:
            row = tx.fetchone("SELECT current_setting('statement_timeout') AS v")
        assert row == {"v": "4321ms"}
        assert backends(pg_dsn, "application_name = 'ledger-dsn-test'") >= 1
        assert lg.status(run_id).state == "running"


def test_a_dsn_without_host_port_or_user_uses_the_libpq_environment(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = conninfo_to_dict(pg_dsn)
    monkeypatch.setenv("PGHOST", str(info["host"]))
    monkeypatch.setenv("PGPORT", str(info["port"]))
    monkeypatch.setenv("PGUSER", str(info["user"]))
    with Ledger.open(f"postgresql:///{info['dbname']}") as lg:
        run_id = running(lg, 1)
    with Ledger.open(pg_dsn) as lg:  # the same database
        assert lg.status(run_id).state == "running"


def test_an_unreachable_server_is_refused_at_once_with_the_reason() -> None:
    before = set(threading.enumerate())
    with pytest.raises(Exception) as refused:  # the reason matters, not the class
        Ledger.open(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere")
    assert "refused" in str(refused.value).lower(), refused.value
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


def test_a_missing_database_is_named(pg_server: Any) -> None:
    with pytest.raises(Exception) as missing:
        Ledger.open(pg_server.dsn("no_such_ledger_db"))
    assert 'database "no_such_ledger_db" does not exist' in str(missing.value)


# --------------------------------------------------------------------------
# privileges
# --------------------------------------------------------------------------
@pytest.fixture
def login_role(pg_dsn: str) -> Iterator[str]:
    """A new login role with no privileges in the test database (dropped afterwards)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        can = conn.execute(
            "SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        if not (can and can[0]):
            pytest.skip("the test server's user may not create roles")
        role = f"ledger_app_{secrets.token_hex(4)}"
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    try:
        yield role
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def as_role(dsn: str, role: str) -> str:
    info = conninfo_to_dict(dsn)
    return f"postgresql://{role}@{info['host']}:{info['port']}/{info['dbname']}"


def test_a_role_with_table_privileges_only_can_use_a_migrated_database(
    pg_dsn: str, login_role: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{login_role}"'
        )
        conn.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{login_role}"')
        row = conn.execute(
            "SELECT has_schema_privilege(%s, 'public', 'CREATE')", (login_role,)
        ).fetchone()
        assert row == (False,)
    before = server_now(pg_dsn)
    with Ledger.open(as_role(pg_dsn, login_role)) as lg:
        run_id = running(lg, 2)
        for le in lg.claim(run_id, WORKER, limit=2):
            lg.accept(le)
        assert lg.complete(run_id, CONTROLLER).state == "succeeded"
        assert all(t.at >= before for t in lg.history(run_id))


def _items_statistics(dsn: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'lg_items'::regclass")
        found = row.fetchone()
    assert found is not None
    return float(found[0])


def _no_autovacuum(dsn: str) -> float:
    """Keep autovacuum off the items table (what it would do is what is checked); the
    rows the statistics know now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE lg_items SET (autovacuum_enabled = false)")
    return _items_statistics(dsn)


def test_a_commit_that_inserts_many_items_refreshes_their_statistics(pg_dsn: str) -> None:
    # Until the table is analyzed, the planner believes it holds what it held before and
    # may plan the item rows' updates as a scan of the whole table, for every batch.
    with Ledger.open(pg_dsn) as lg:
        known = _no_autovacuum(pg_dsn)
        running(lg, 20)
        assert _items_statistics(pg_dsn) == known  # a small run: nothing to refresh
        lg.submit(manifest(1500), SUBMITTER)
        assert _items_statistics(pg_dsn) == 1520  # before submit returned
        lg.submit(manifest(100), SUBMITTER)
        assert _items_statistics(pg_dsn) == 1520  # a tenth of what is known: not yet


def test_a_rebuilt_items_table_gets_statistics_of_its_own(pg_dsn: str) -> None:
    from ledger.projections.rebuild import rebuild

    with Ledger.open(pg_dsn) as lg:
        _no_autovacuum(pg_dsn)
        running(lg, 30)
        running(lg, 12)
        rebuild(lg)
        assert _items_statistics(pg_dsn) == 42  # a new table: never analyzed would be -1


def test_a_role_that_may_not_analyze_still_submits_a_big_run(pg_dsn: str, login_role: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{login_role}"'
        )
        conn.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{login_role}"')
    known = _no_autovacuum(pg_dsn)
    with Ledger.open(as_role(pg_dsn, login_role)) as lg:
        status = lg.submit(manifest(1200), SUBMITTER)
        assert lg.status(status.run_id).counts["pending"] == 1200
    assert _items_statistics(pg_dsn) == known  # the owner's ANALYZE: passed over


def test_a_role_that_may_not_create_tables_cannot_set_up_an_empty_database(
    pg_server: Any, login_role: str
) -> None:
    name = f"ledger_noschema_{secrets.token_hex(3)}"
    create_database(pg_server.admin_dsn, name)
    try:
        dsn = pg_server.dsn(name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        with pytest.raises(Exception) as refused:
            Ledger.open(as_role(dsn, login_role))
        assert "permission denied" in str(refused.value)
    finally:
        drop_database(pg_server.admin_dsn, name)


@pytest.mark.timeout(120)
def test_a_manifest_of_100000_items_is_submitted_in_one_transaction(pg_dsn: str) -> None:
    # Its event and its item rows are statements of several megabytes in one pipelined
    # transaction: psycopg's pipeline left such a statement half sent and waited for its
    # answer forever (psycopg/psycopg#685) until the store drained the output buffer.
    n = 100_000
    with Ledger.open(pg_dsn) as lg:
        status = lg.submit(manifest(n), SUBMITTER)
        assert status.counts["pending"] == n
        lg.start(status.run_id, CONTROLLER)
        leases = lg.claim(status.run_id, WORKER, limit=3)
        assert [le.item_id for le in leases] == ["i0", "i1", "i2"]
        assert len(lg.items(status.run_id)) == n


@pytest.mark.timeout(120)
def test_a_statement_larger_than_the_socket_buffers_is_sent_whole_in_a_pipeline(
    pg_dsn: str,
) -> None:
    with Ledger.open(pg_dsn) as lg:
        with lg.store.write() as tx:
            tx.execute("CREATE TEMP TABLE big (t TEXT)")
            tx.execute("INSERT INTO big VALUES (?)", ("x" * 20_000_000,))
            row = tx.fetchone("SELECT length(t) AS n FROM big")
        assert row == {"n": 20_000_000}


def test_the_recorder_stores_every_state_byte_for_byte(pg_dsn: str) -> None:
    # UTF-8 states travel as JSON text and come back as the same bytes; other bytes (a NUL,
    # invalid UTF-8) take the stock composite-array insert. Positions follow the order given.
    import uuid

    from eventsourcing.persistence import StoredEvent

    with Ledger.open(pg_dsn) as lg:
        rec = lg.store.recorder
        oid = uuid.uuid4()
        states = [
            b'{"a":"\\u0000 \xc3\xa9 \xf0\x9f\x98\x80 \\"q\\" \\\\"}',
            b"\xff\xfe not utf-8",
            b"nul \x00 inside",
            "tab\tnewline\n é".encode(),
        ]
        for batch in ([states[0], states[3]], [states[1]], [states[2], states[0]]):
            start = rec.max_notification_id() or 0
            version = len(rec.select_events(oid))
            ids = rec.insert_events(
                [StoredEvent(oid, version + k + 1, "t", st) for k, st in enumerate(batch)]
            )
            assert ids == sorted(ids) and ids[0] > start
        stored = rec.select_events(oid)
        assert [se.state for se in stored] == [
            states[0],
            states[3],
            states[1],
            states[2],
            states[0],
        ]
        with psycopg.connect(pg_dsn) as conn:  # which insert each kind of state takes
            assert [
                _events_json(conn, [StoredEvent(oid, 1, "t", st)]) is not None for st in states
            ] == [True, False, False, True]
        assert [se.originator_version for se in stored] == [1, 2, 3, 4, 5]


def test_a_lock_timeout_is_named_as_such_and_writes_nothing(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.commands import idempotency
    from ledger.core.errors import StoreUnavailable

    monkeypatch.setattr(idempotency, "RETRY_DELAYS", (0.01, 0.01))
    with Ledger.open(pg_dsn) as lg:
        run_id = lg.submit(manifest(1), SUBMITTER).run_id
    with (
        psycopg.connect(pg_dsn) as holder,
        Ledger.open(with_params(pg_dsn, "options=-c%20lock_timeout%3D50")) as lg,
    ):
        holder.execute("LOCK TABLE lg_runs IN ACCESS EXCLUSIVE MODE")  # held until rollback
        with pytest.raises(StoreUnavailable) as refused:
            lg.start(run_id, CONTROLLER)
        holder.rollback()
        message = str(refused.value)
        assert "could not be taken in time" in message and "55P03" in message
        assert "nothing was written" in message and "unavailable" not in message
        assert lg.status(run_id).state == "queued"  # nothing was written
        assert lg.start(run_id, CONTROLLER).state == "running"
