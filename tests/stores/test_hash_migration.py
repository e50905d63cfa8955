"""Schema v11 (fewer bytes per item): each event's hash moves from a row of
its own in `ledger_event_hashes` onto the event's row. A database written at v10 (events
in the events table, their hashes beside them) upgrades with its history: the same
hashes on the same events, the hash table gone, `verify` clean with the same heads, and
the chains go on from the migrated hashes when its runs take more work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger
from ledger.stores import postgres as pg_store
from ledger.stores import sqlite as sqlite_store
from ledger.stores.base import SCHEMA_VERSION
from ledger.stores.hashchain import LEGACY_HASH_TABLE, ddl, event_hash, oid_param
from ledger.stores.raw import RawEvent, read_raw
from tests.stores.test_counts_migration import some_runs
from tests.stores.test_migrations import empty_databases
from tests.support.runs import SUBMITTER, WORKER, manifest


def hashes_as_v10(execute: Any, dialect: str) -> None:
    """Put a database's hashes in the shape schema versions 2-10 had: each in a row of the
    hash table, none on the event rows (for tests that write with this release and then
    make the database look older, test_counts_migration.py and test_index_migration.py)."""
    ev = "ledger_events" if dialect == "postgres" else "stored_events"
    for statement in ddl(dialect):
        execute(statement)
    execute(
        f"INSERT INTO {LEGACY_HASH_TABLE} (originator_id, originator_version, hash) "  # noqa: S608 (our own table/column names)
        f"SELECT originator_id, originator_version, hash FROM {ev} WHERE hash IS NOT NULL"
    )
    execute(f"ALTER TABLE {ev} DROP COLUMN hash")


def hash_column_added(execute: Any, dialect: str) -> None:
    """The hash column on a database opened at an older version, so that this release
    can write there (`hashes_as_v10` takes it away again)."""
    ev = "ledger_events" if dialect == "postgres" else "stored_events"
    execute(f"ALTER TABLE {ev} ADD COLUMN hash TEXT")


def history_with_hashes() -> tuple[list[RawEvent], list[str], str]:
    """Some runs written by this release in memory: the stored events with their
    hashes, the run ids and the heads digest."""
    with Ledger.open("memory://") as lg:
        runs = some_runs(lg)
        with lg.store.read() as tx:
            events = read_raw(tx, 0, 100_000)
        heads = lg.verify().heads
    assert events and all(e.hash for e in events)
    return events, runs, heads


def write_as_v10(module: Any, dsn: str, events: list[RawEvent], mp: pytest.MonkeyPatch) -> None:
    """A database at schema v10 holding `events` as v10 wrote them: each event in the
    events table (no hash column there yet), each hash in the hash table."""
    full = module.migrations
    with mp.context() as m:
        m.setattr(module, "migrations", lambda *a: full(*a)[:10])
        with Ledger.open(dsn) as lg, lg.store.write() as tx:
            dialect, ev = lg.store.dialect, lg.store.events_table()
            cols = [r["name"] for r in columns(tx, dialect, ev)]
            assert "hash" not in cols, cols
            pos = "notification_id" if dialect == "postgres" else "rowid"
            tx.executemany(
                f"INSERT INTO {ev} ({pos}, originator_id, originator_version, topic, state) "  # noqa: S608 (our own table/column names)
                "VALUES (?, ?, ?, ?, ?)",
                [
                    (e.position, oid_param(dialect, e.stream), e.version, e.topic, e.state)
                    for e in events
                ],
            )
            tx.executemany(
                f"INSERT INTO {LEGACY_HASH_TABLE} (originator_id, originator_version, hash) "  # noqa: S608 (our own table/column names)
                "VALUES (?, ?, ?)",
                [(oid_param(dialect, e.stream), e.version, e.hash) for e in events],
            )
            if dialect == "postgres":
                tx.execute(
                    f"SELECT setval('{ev}_notification_id_seq', ?)",
                    (events[-1].position,),
                )


def columns(tx: Any, dialect: str, table: str) -> list[dict[str, Any]]:
    if dialect == "postgres":
        return tx.fetchall(
            "SELECT column_name AS name FROM information_schema.columns WHERE table_name = ?",
            (table,),
        )
    return tx.fetchall(f"SELECT name FROM pragma_table_info('{table}')")  # noqa: S608 (our own table name)


def has_table(tx: Any, dialect: str, table: str) -> bool:
    if dialect == "postgres":
        row = tx.fetchone("SELECT to_regclass(?) IS NOT NULL AS present", (table,))
        return bool(row["present"])
    return bool(
        tx.fetchall("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
    )


def check_upgrade(dsn: str, events: list[RawEvent], runs: list[str], heads: str) -> None:
    with Ledger.open(dsn) as lg:  # upgrades to v11
        lg.rebuild_projections()  # the projections of the history written by hand
        with lg.store.read() as tx:
            dialect = lg.store.dialect
            assert not has_table(tx, dialect, LEGACY_HASH_TABLE)
            row = tx.fetchone("SELECT value FROM ledger_meta WHERE key = 'schema_version'")
            assert int(row["value"]) == SCHEMA_VERSION >= 11
            migrated = read_raw(tx, 0, 100_000)
        assert [(e.stream, e.version, e.hash) for e in migrated] == [
            (e.stream, e.version, e.hash) for e in events
        ]
        report = lg.verify()
        assert report.ok, report.problems
        assert report.heads == heads

        # the open run takes more work: its new events chain to the migrated hashes
        open_run = runs[0]
        before = {(e.stream, e.version): e.hash for e in migrated}
        accepted = lg.status(open_run).counts["accepted"]
        leases = lg.claim(open_run, WORKER, limit=10)
        assert leases
        for le in leases:
            lg.accept(le)
        with lg.store.read() as tx:
            after = read_raw(tx, 0, 100_000)
        new = [e for e in after if (e.stream, e.version) not in before]
        continued = [e for e in new if e.version > 1 and (e.stream, e.version - 1) in before]
        assert continued, "no new event continues a migrated stream"
        for e in continued:
            assert e.hash == event_hash(
                before[(e.stream, e.version - 1)], e.stream, e.version, e.topic, e.state
            )
        assert lg.verify().ok
        assert lg.status(open_run).counts["accepted"] == accepted + len(leases)
        again = lg.submit(manifest(2), SUBMITTER).run_id  # and new runs work
        assert lg.status(again).state == "queued" and lg.verify().ok


@pytest.fixture
def empty_pg(pg_server: Any) -> Iterator[Any]:
    yield from empty_databases(pg_server)


def test_sqlite_v10_hashes_move_onto_the_event_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events, runs, heads = history_with_hashes()
    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    write_as_v10(sqlite_store, dsn, events, monkeypatch)
    check_upgrade(dsn, events, runs, heads)


@pytest.mark.postgres
def test_pg_v10_hashes_move_onto_the_event_rows(
    empty_pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    events, runs, heads = history_with_hashes()
    dsn = empty_pg()
    write_as_v10(pg_store, dsn, events, monkeypatch)
    check_upgrade(dsn, events, runs, heads)


def test_a_deleted_last_event_of_a_stream_is_reported(tmp_path: Path) -> None:
    """With the hash on the event's row, deleting a stream's last event leaves no hash
    behind to point at it: the projections' drift reports it, and the heads change."""
    with Ledger.open(f"sqlite:///{tmp_path / 'l.db'}") as lg:
        runs = some_runs(lg)
        clean = lg.verify()
        assert clean.ok
        with lg.store.read() as tx:
            events = read_raw(tx, 0, 100_000)
        last_of = {e.stream: e for e in events}  # position order: the last one wins
        item_stream = next(e for e in last_of.values() if str(e.stream) not in runs)
        with lg.store.write() as tx:
            tx.execute("DELETE FROM stored_events WHERE rowid = ?", (item_stream.position,))
        report = lg.verify()
        assert not report.ok
        assert {p["kind"] for p in report.problems} >= {"projection"}
        assert report.heads != clean.heads
