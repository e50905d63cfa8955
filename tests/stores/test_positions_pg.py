"""Rule 18 on PostgreSQL without a table lock: a reader paging by position never sees a
position appear behind one it has already read, and writers to different runs do not
wait for each other (ledger/stores/pg_positions.py).

Two kinds of proof: a deterministic one with two open transactions on two connections
(the slower writer holds a lower position while a faster one commits a higher one), and
several processes writing to their own runs at full speed while this process pages the
event log, the audit and the change feed by position, comparing everything it saw with the final log.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import queue
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from ledger import Actor, Ledger
from ledger.service.ledger import Outcome
from ledger.stores import pg_positions
from ledger.stores.postgres import EVENTS_TABLE

pytestmark = pytest.mark.postgres

SPAWN = multiprocessing.get_context("spawn")
WAIT = 120.0  # a bound on waiting for a child, never a timing assertion
SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")

INSERT = pg_positions.insert_json_statement(psycopg.sql.Identifier(EVENTS_TABLE))


def _insert(conn: psycopg.Connection[Any], n: int = 1) -> list[int]:
    """Insert `n` events of a new stream in the connection's open transaction."""
    oid = str(uuid.uuid4())
    rows = json.dumps([[oid, v, "test-event", "{}"] for v in range(1, n + 1)])
    return [r["notification_id"] for r in conn.execute(INSERT, (n, rows)).fetchall()]


def _readable(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute(pg_positions.READABLE_QUERY).fetchone()
    assert row is not None
    return row["p"]  # type: ignore[no-any-return]


def _positions(lg: Ledger) -> list[int]:
    """Positions a reader paging from 0 is offered now (stored rows, not decoded)."""
    with lg.store.read() as tx:
        return [p for p, _se in lg.store.read_stored_rows(tx, 0, 1000)]


@pytest.fixture
def conns(pg_dsn: str) -> Iterator[list[psycopg.Connection[Any]]]:
    Ledger.open(pg_dsn).close()
    opened = [psycopg.connect(pg_dsn, row_factory=dict_row) for _ in range(3)]
    yield opened
    for c in opened:
        c.close()


def test_a_slower_writer_holds_readers_below_its_position(
    conns: list[psycopg.Connection[Any]], pg_dsn: str
) -> None:
    slow, fast, reader = conns
    reader.autocommit = True
    low = _insert(slow, 3)  # drawn first, left uncommitted
    fast.execute("SET lock_timeout = '2s'")  # a table lock would make this fail
    high = _insert(fast, 2)
    fast.commit()
    assert min(high) > max(low)
    assert low == list(range(low[0], low[0] + 3))  # one transaction's block is contiguous
    with Ledger.open(pg_dsn) as lg:
        # visible to a plain SELECT, but not offered to a reader paging by position
        seen = _positions(lg)
        assert not set(high) & set(seen)
        bound = _readable(reader)
        assert bound is not None and bound < low[0]
        slow.commit()
        seen = _positions(lg)
        assert seen[-5:] == [*low, *high]


def test_a_rolled_back_writer_leaves_a_gap_readers_pass(
    conns: list[psycopg.Connection[Any]], pg_dsn: str
) -> None:
    slow, fast, _ = conns
    _insert(slow, 1)
    high = _insert(fast, 1)
    fast.commit()
    with Ledger.open(pg_dsn) as lg:
        assert high[0] not in _positions(lg)
        slow.rollback()
        assert _positions(lg)[-1] == high[0]


def test_a_repeatable_read_snapshot_reads_what_it_holds(
    conns: list[psycopg.Connection[Any]],
) -> None:
    slow, fast, reader = conns
    _insert(slow, 1)
    reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert _readable(reader) is None
    reader.rollback()
    slow.rollback()
    _insert(fast, 1)
    fast.commit()


# --------------------------------------------------------------------------
# several processes at full speed, one reader
# --------------------------------------------------------------------------
def _accepted_run(lg: Ledger, worker: Actor, item_ids: list[str], limit: int) -> str:
    """Submit and start a run of these items, then claim (`limit` at a time) and accept
    every one; its run id."""
    manifest = {
        "source_version": "s",
        "config_version": "c",
        "items": [{"item_id": i} for i in item_ids],
    }
    run_id = lg.submit(manifest, SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    while leases := lg.claim(run_id, worker, limit=limit):
        lg.record([Outcome(le, "accept") for le in leases])
    return run_id


def _writer(dsn: str, name: str, runs: int, items: int, go: Any, out: Any) -> None:
    """Submits, starts and works through its own runs (claims of 10, one record each)."""
    try:
        worker = Actor(name, "worker")
        with Ledger.open(dsn) as lg:
            go.wait(WAIT)
            for r in range(runs):
                _accepted_run(lg, worker, [f"{name}-{r}-{k}" for k in range(items)], 10)
        out.put((name, "ok", None))
    except BaseException:
        out.put((name, "error", traceback.format_exc()))


def test_processes_writing_at_once_never_fill_in_behind_a_reader(pg_dsn: str) -> None:
    Ledger.open(pg_dsn).close()
    go, out = SPAWN.Event(), SPAWN.Queue()
    names = [f"w{k}" for k in range(4)]
    procs = [
        SPAWN.Process(target=_writer, args=(pg_dsn, n, 3, 40, go, out), daemon=True) for n in names
    ]
    for p in procs:
        p.start()
    events_seen: list[int] = []
    audit_seen: list[int] = []
    feed_seen: list[int] = []
    done: set[str] = set()
    try:
        with Ledger.open(pg_dsn) as lg:
            go.set()
            deadline = time.monotonic() + WAIT
            while len(done) < len(names):
                assert time.monotonic() < deadline, "the writers did not finish"
                after = events_seen[-1] if events_seen else 0
                events_seen += [p for p, _e in lg.store.read_events(after, 50)]
                after = audit_seen[-1] if audit_seen else 0
                audit_seen += [t.position for t in lg.audit(after=after, limit=50)]
                after = feed_seen[-1] if feed_seen else 0
                feed_seen += [t.position for t in lg.events(after=after, limit=50)]
                try:
                    name, kind, value = out.get_nowait()
                except queue.Empty:
                    continue
                assert kind == "ok", f"writer {name} failed:\n{value}"
                done.add(name)
            final_events = [p for p, _e in lg.store.read_events(0, 1_000_000)]
            final_audit = [t.position for t in lg.audit()]
    finally:
        for p in procs:
            p.join(WAIT)
            if p.is_alive():
                p.kill()
    for seen, final in (
        (events_seen, final_events),
        (audit_seen, final_audit),
        (feed_seen, final_audit),
    ):
        assert seen, "the reader read nothing while the writers ran"
        assert seen == sorted(set(seen)), "a page went backwards"
        # everything at or below the last position read was read, in order: nothing
        # committed later took a position behind the reader
        assert seen == [p for p in final if p <= seen[-1]]
        assert len(seen) < len(final) or seen == final
    assert len(final_events) == 4 * 3 * (1 + 1 + 40 * 2)  # sanity: every write landed


def test_writers_to_different_runs_do_not_wait_for_each_other(pg_dsn: str) -> None:
    """One command holds its transaction open after appending; another run's command
    commits meanwhile (with the stock table lock it waited until lock_timeout)."""
    with Ledger.open(pg_dsn) as lg:
        manifest = {"source_version": "s", "config_version": "c", "items": [{"item_id": "a"}]}
        r1 = lg.submit(manifest, SUBMITTER).run_id
        r2 = lg.submit(manifest, SUBMITTER).run_id
        with lg.store.write() as tx:
            tx.execute("SET LOCAL lock_timeout = '1s'")
            with Ledger.open(pg_dsn) as other:
                holder = psycopg.connect(pg_dsn, row_factory=dict_row)
                try:
                    _insert(holder, 1)  # an uncommitted append of another writer
                    other.start(r2, CONTROLLER)  # no wait, no lock timeout
                    holder.rollback()
                finally:
                    holder.close()
            tx.execute("SELECT 1")
        lg.start(r1, CONTROLLER)
        assert lg.status(r2).state == "running" and lg.status(r1).state == "running"


def test_an_import_at_given_positions_holds_readers_below_it(pg_dsn: str) -> None:
    """ledger import keeps the positions it is given and moves the sequence past them
    before it commits; readers must not pass them meanwhile."""
    from ledger.stores.raw import RawEvent, append_raw

    with Ledger.open(pg_dsn) as lg, Ledger.open(pg_dsn) as reader:
        event = RawEvent(1000, uuid.uuid4(), 1, "test-event", b"{}", None)
        with lg.store.write() as tx:
            append_raw(tx, [event], keep_positions=True)
            assert tx.fetchone("SELECT 1 AS done")  # the pipeline ran up to here: setval too
            with reader.store.read() as rtx:
                bound = rtx.readable_position()
            assert bound is not None and bound < 1000
            assert 1000 not in _positions(reader)
        assert 1000 in _positions(reader)


def _reserver(dsn: str, calls: int, out: Any) -> None:
    """Reserves blocks of 1 to 4 positions as fast as it can (each call its own
    transaction); reports every block it got."""
    try:
        blocks = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            fn = psycopg.sql.Identifier(pg_positions.RESERVE_FUNCTION)
            statement = psycopg.sql.SQL("SELECT {}(%s)").format(fn)
            for k in range(calls):
                n = 1 + k % 4
                row = conn.execute(statement, (n,)).fetchone()
                assert row is not None
                blocks.append((row[0], n))
        out.put(("ok", blocks))
    except BaseException:
        out.put(("error", traceback.format_exc()))


def test_blocks_and_single_positions_drawn_at_once_never_overlap(pg_dsn: str) -> None:
    # Single positions and blocks come from one sequence: a position is never handed to
    # two transactions (a duplicate would refuse an insert as a conflict).
    Ledger.open(pg_dsn).close()
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_reserver, args=(pg_dsn, 3000, out)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=WAIT) for _ in procs]
    finally:
        for p in procs:
            p.join(WAIT)
    drawn: list[int] = []
    for kind, value in results:
        assert kind == "ok", value
        for first, n in value:
            drawn.extend(range(first, first + n))
    assert len(drawn) == len(set(drawn)), "a position was drawn twice"


def _sequence_value(dsn: str) -> int:
    from ledger.stores.pg_positions import sequence_name

    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT last_value FROM {sequence_name(EVENTS_TABLE)}").fetchone()  # noqa: S608 (our own sequence name)
        assert row is not None
        return int(row[0])


def test_an_import_whose_position_claim_loses_to_live_writers_lands_every_event_once(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import read from a stream claims the file's positions a page at a time (it
    cannot read the file's end first). Writer processes draw positions meanwhile: once
    one has drawn past a page's claim, the import numbers the rest as any append. Every
    event of the file lands once with its stream version and hash, the first page at
    its file positions, and the ledger verifies clean, the writers' runs too."""
    from ledger.stores.raw import RawEvent, read_raw
    from ledger.transfer import imports as transfer

    source = f"sqlite:///{tmp_path}/source.db"
    worker = Actor("src-worker", "worker")
    with Ledger.open(source) as src:
        # a run the export leaves out: the file's positions start high
        _accepted_run(src, worker, [f"b{k}" for k in range(150)], 50)
        runs = [_accepted_run(src, worker, [f"i{r}-{k}" for k in range(6)], 4) for r in range(3)]
        out_file = io.StringIO()
        src.export(out_file, runs=runs)
    text = out_file.getvalue()
    file_events = [json.loads(line) for line in text.splitlines()[:-1]]
    page = 5
    assert len(file_events) > 3 * page and file_events[0]["position"] > 100

    claims: list[bool] = []
    real_reserve = transfer.reserve_positions

    def reserve_after_a_writer_drew(tx: Any, first: int, last: int) -> bool:
        if claims:  # every page after the first: wait until a writer has drawn past `first`
            deadline = time.monotonic() + WAIT
            while _sequence_value(pg_dsn) < first:
                assert time.monotonic() < deadline, "no writer drew a position"
                time.sleep(0.01)
        claims.append(real_reserve(tx, first, last))
        return claims[-1]

    monkeypatch.setattr(transfer, "IMPORT_PAGE", page)
    monkeypatch.setattr(transfer, "reserve_positions", reserve_after_a_writer_drew)
    Ledger.open(pg_dsn).close()
    go, out = SPAWN.Event(), SPAWN.Queue()
    names = ["w0", "w1"]
    procs = [
        SPAWN.Process(target=_writer, args=(pg_dsn, n, 4, 40, go, out), daemon=True) for n in names
    ]
    for p in procs:
        p.start()
    try:
        with Ledger.open(pg_dsn) as lg:
            go.set()
            summary = lg.import_file(io.StringIO(text), verify=False)  # a stream: no end to read
            results = [out.get(timeout=WAIT) for _ in names]
            report = lg.verify()
            with lg.store.read() as tx:
                stored = read_raw(tx, 0, 1_000_000)
    finally:
        for p in procs:
            p.join(WAIT)
            if p.is_alive():
                p.kill()
    for name, kind, value in results:
        assert kind == "ok", f"writer {name} failed:\n{value}"
    assert claims[0] and not claims[-1], claims  # the first page's claim held, a later one lost
    assert summary.events == len(file_events) and report.ok, report.problems
    by_key: dict[tuple[str, int], RawEvent] = {(str(e.stream), e.version): e for e in stored}
    assert len(by_key) == len(stored)
    landed = [by_key[(d["stream"], d["version"])] for d in file_events]
    assert [e.hash for e in landed] == [d["hash"] for d in file_events]
    assert [e.state for e in landed] == [d["state"].encode() for d in file_events]
    kept = [e.position for e in landed[:page]]
    assert kept == [d["position"] for d in file_events[:page]]  # the claimed page kept them
    later = [e.position for e in landed[page:]]
    assert later == sorted(later) and min(later) > max(kept)  # numbered as appends, in order
    assert later != [d["position"] for d in file_events[page:]]
    with Ledger.open(pg_dsn) as lg:
        assert {str(r) for r in runs} <= {r.run_id for r in lg.runs()}
        for run_id in runs:
            assert lg.status(run_id).counts["accepted"] == 6
