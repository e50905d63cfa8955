"""The eventsourcing library's own recorder test cases, run against the recorders we use.

`ledger.stores.sqlite.LedgerSQLiteRecorder` and `ledger.stores.postgres.LedgerPostgresRecorder`
are the stock recorders whose insert the ledger calls inside its own transactions. Here
they run the library's shipped suites (`eventsourcing.tests.persistence`), the way
eventsourcing's tests/persistence_tests/test_sqlite.py and test_postgres.py subclass them,
but in a ledger database: the schema comes from `Ledger.open` (our migrations), and on
PostgreSQL the events table is the ledger's (`ledger_events`).

The tracking suite runs on the library's tracking recorders in a ledger database: the
ledger keeps projection positions in its own `lg_tracking` table, so this only shows that
an eventsourcing projection runner following the ledger can keep its position beside our
tables.

These are unittest TestCases; pytest collects them. Class-level autouse fixtures hand them a
fresh temporary file (SQLite) or a fresh database cloned from the ledger template
(PostgreSQL, the `pg_dsn` fixture), and close every datastore they opened.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import ApplicationRecorder, TrackingRecorder
from eventsourcing.sqlite import SQLiteDatastore, SQLiteTrackingRecorder
from eventsourcing.tests.persistence import (
    ApplicationRecorderTestCase,
    NonInterleavingNotificationIDsBaseCase,
    TrackingRecorderTestCase,
)

from ledger import Ledger
from ledger.stores.sqlite import LedgerSQLiteRecorder


def _join_stray_readers() -> None:
    """The shipped concurrency tests signal their reader threads to stop but do not join
    them; closing a datastore under a reader still mid-query crashed the interpreter
    (sqlite3). Wait for them before closing anything."""
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        if (
            thread is not threading.current_thread()
            and getattr(target, "__name__", "") == "read_continuously"
        ):
            thread.join(timeout=30)


# ---------------------------------------------------------------------------
# SQLite: a ledger database file per recorder
# ---------------------------------------------------------------------------
class SQLiteLedgerFile:
    """Mixin: `new_datastore()` opens a new ledger database file (schema by Ledger.open)."""

    tmp: Path
    datastores: list[Any]

    @pytest.fixture(autouse=True)
    def _ledger_files(self, tmp_path: Path) -> Iterator[None]:
        self.tmp = tmp_path
        self.datastores = []
        yield
        _join_stray_readers()
        for ds in self.datastores:
            ds.close()

    def new_datastore(self, **kwargs: Any) -> SQLiteDatastore:
        path = self.tmp / f"ledger-{len(self.datastores)}.db"
        Ledger.open(f"sqlite:///{path}").close()  # the ledger's schema, by its migrations
        ds = SQLiteDatastore(str(path), **kwargs)
        self.datastores.append(ds)
        return ds


class TestLedgerSQLiteRecorder(SQLiteLedgerFile, ApplicationRecorderTestCase[LedgerSQLiteRecorder]):
    def create_recorder(self) -> LedgerSQLiteRecorder:
        recorder = LedgerSQLiteRecorder(self.new_datastore(pool_size=20))
        recorder.create_table()  # idempotent on the ledger's schema
        return recorder

    def test_recorder_is_the_one_the_ledger_uses(self) -> None:
        with Ledger.open(f"sqlite:///{self.tmp}/check.db") as lg:
            assert type(lg.store.recorder) is LedgerSQLiteRecorder  # type: ignore[attr-defined]
            assert lg.store.events_table() == "stored_events"


class TestLedgerSQLiteNonInterleaving(SQLiteLedgerFile, NonInterleavingNotificationIDsBaseCase):
    insert_num = 2000

    def create_recorder(self) -> ApplicationRecorder:
        recorder = LedgerSQLiteRecorder(self.new_datastore())
        recorder.create_table()
        return recorder


class TestTrackingRecorderInLedgerSQLite(SQLiteLedgerFile, TrackingRecorderTestCase):
    def create_recorder(self) -> TrackingRecorder:
        recorder = SQLiteTrackingRecorder(self.new_datastore())
        recorder.create_table()
        return recorder


# ---------------------------------------------------------------------------
# PostgreSQL: a fresh database cloned from the ledger template per test
# ---------------------------------------------------------------------------
class PostgresLedgerDatabase:
    """Mixin: `new_datastore()` connects to this test's database (ledger schema installed)."""

    dsn: str
    datastores: list[Any]

    @pytest.fixture(autouse=True)
    def _ledger_database(self, pg_dsn: str) -> Iterator[None]:
        self.dsn = pg_dsn
        self.datastores = []
        yield
        _join_stray_readers()
        for ds in self.datastores:
            ds.close()

    def new_datastore(self) -> Any:
        from eventsourcing.postgres import PostgresDatastore
        from psycopg.conninfo import conninfo_to_dict

        info = conninfo_to_dict(self.dsn)
        ds = PostgresDatastore(
            dbname=str(info.get("dbname") or "postgres"),
            host=str(info.get("host") or "127.0.0.1"),
            port=str(info.get("port") or 5432),
            user=str(info.get("user") or "postgres"),
            password=str(info.get("password") or ""),
            pool_size=4,
            max_overflow=10,  # the concurrent cases use up to 12 connections at once
            connect_timeout=10,
        )
        self.datastores.append(ds)
        return ds


@pytest.mark.postgres
class TestLedgerPostgresRecorder(PostgresLedgerDatabase, ApplicationRecorderTestCase[Any]):
    def create_recorder(self) -> Any:
        from ledger.stores.postgres import EVENTS_TABLE, LedgerPostgresRecorder

        recorder = LedgerPostgresRecorder(self.new_datastore(), events_table_name=EVENTS_TABLE)
        recorder.create_table()  # idempotent: the template already has the table
        return recorder

    def test_recorder_is_the_one_the_ledger_uses(self) -> None:
        from ledger.stores.postgres import EVENTS_TABLE, LedgerPostgresRecorder

        with Ledger.open(self.dsn) as lg:
            assert type(lg.store.recorder) is LedgerPostgresRecorder  # type: ignore[attr-defined]
            assert lg.store.events_table() == EVENTS_TABLE


@pytest.mark.postgres
class TestLedgerPostgresNonInterleaving(
    PostgresLedgerDatabase, NonInterleavingNotificationIDsBaseCase
):
    insert_num = 200

    def create_recorder(self) -> ApplicationRecorder:
        from ledger.stores.postgres import EVENTS_TABLE, LedgerPostgresRecorder

        recorder = LedgerPostgresRecorder(self.new_datastore(), events_table_name=EVENTS_TABLE)
        recorder.create_table()
        return recorder  # type: ignore[no-any-return]


@pytest.mark.postgres
class TestTrackingRecorderInLedgerPostgres(PostgresLedgerDatabase, TrackingRecorderTestCase):
    def create_recorder(self) -> TrackingRecorder:
        from eventsourcing.postgres import PostgresTrackingRecorder

        recorder = PostgresTrackingRecorder(self.new_datastore(), tracking_table_name="es_tracking")
        recorder.create_table()
        return recorder  # type: ignore[no-any-return]


# The abstract bases are imported into this module; keep pytest from collecting them.
del ApplicationRecorderTestCase, NonInterleavingNotificationIDsBaseCase, TrackingRecorderTestCase
