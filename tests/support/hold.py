"""Holding a run's lock on purpose: `HeldInTransaction`, a command stopped inside its
transaction, its run loaded and locked, while the test does something else (the `hold`
fixture of tests/conftest.py); the run commands that wait on it (`STOPS`); and the
sessions of a PostgreSQL database, or those waiting for a lock, counted."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from ledger import Ledger
from ledger.reads import queries
from tests.support.runs import OPERATOR, SUBMITTER

WAIT = 30.0  # a bound on waiting for a condition, never a timing assertion


class HeldInTransaction:
    """Makes the next command started by `start` stop inside its transaction, right after
    it has loaded (and locked) its run, until `release()`. Commands of other threads
    load their runs as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loaded = threading.Event()
        self.go = threading.Event()
        self.thread: threading.Thread | None = None
        self.result: list[Any] = []
        original = queries.load_run

        def load_and_hold(tx: Any, run_id: str, lock: bool | str = True) -> Any:
            run = original(tx, run_id, lock)
            if threading.current_thread() is self.thread:
                self.loaded.set()
                assert self.go.wait(WAIT)
            return run

        monkeypatch.setattr(queries, "load_run", load_and_hold)

    def start(self, command: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self.result.append(command())
            except Exception as e:
                self.result.append(e)

        self.thread = threading.Thread(target=run)
        self.thread.start()
        assert self.loaded.wait(WAIT)

    def release(self) -> Any:
        self.go.set()
        assert self.thread is not None
        self.thread.join(WAIT)
        [result] = self.result
        return result


MONITOR = "ledger-test-monitor"  # application_name of the tests' own look-up connections


def backends(dsn: str, where: str = "TRUE") -> int:
    """Sessions connected to this test's database, other than the tests' own look-ups
    (a look-up connection just closed may linger in pg_stat_activity for a moment)."""
    with psycopg.connect(dsn, autocommit=True, application_name=MONITOR) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "  # noqa: S608 (our own table/column names; values are bound parameters)
            "AND backend_type = 'client backend' AND application_name <> %s "
            f"AND {where}",
            (MONITOR,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def lock_waiters(dsn: str) -> int:
    return backends(dsn, "wait_event_type = 'Lock'")


STOPS: dict[str, tuple[Callable[[Ledger, str], Any], str]] = {
    "cancel": (lambda lg, run_id: lg.cancel(run_id, SUBMITTER, reason="stop"), "canceling"),
    "pause": (lambda lg, run_id: lg.pause(run_id, OPERATOR, reason="hold"), "pausing"),
}
