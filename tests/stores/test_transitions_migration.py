"""Schema v17 puts each transition's columns on its event's row and makes `lg_transitions`
a view of them (ledger/core/recorded.py). A database written at v16 (its transitions in
their own table, reason and evidence repeated there) upgrades with its data: the same
audits, history and feed, the same heads, it verifies, and its runs go on.

tests/support/old_transitions.py lets the migration tests play an older release with this
code."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger
from ledger.stores import postgres as pg_store
from ledger.stores import sqlite as sqlite_store
from ledger.stores.base import SCHEMA_VERSION
from tests.stores.test_attempts_migration import lease_started_column_added, open_attempts_as_rows
from tests.stores.test_counts_migration import some_runs
from tests.stores.test_index_migration import db
from tests.stores.test_migrations import empty_databases
from tests.support.old_transitions import transitions_as_table, transitions_on_the_log
from tests.support.runs import OPERATOR, SUBMITTER, WORKER, manifest


@pytest.fixture
def empty_pg(pg_server: Any) -> Iterator[Any]:
    yield from empty_databases(pg_server)


def reads(lg: Ledger, runs: list[str]) -> dict[str, Any]:
    """What an operator reads of the transitions: audits, each run's history, the feed."""
    out: dict[str, Any] = {
        "audit": [t.to_dict() for t in lg.audit(page_size=1000)],
        "audit operator": [t.to_dict() for t in lg.audit(role="operator")],
        "audit rejected newest": [
            t.to_dict() for t in lg.audit(state="rejected", newest_first=True)
        ],
        "audit w1": [t.to_dict() for t in lg.audit(actor="w1")],
        "feed": [t.to_dict() for t in lg.events(limit=1000)],
        "feed accepted": [t.to_dict() for t in lg.events(kinds=["accepted"], limit=1000)],
    }
    for run_id in runs:
        out["history " + run_id] = [t.to_dict() for t in lg.history(run_id)]
    return out


def write_at_v16(module: Any, dsn: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """A database at v16 holding some runs, as v16 wrote them; what was read of it then."""
    full = module.migrations
    dialect = "postgres" if module is pg_store else "sqlite"
    with monkeypatch.context() as m:
        m.setattr(module, "migrations", lambda *a: full(*a)[:16])
        Ledger.open(dsn).close()
        with db(dsn) as execute:
            transitions_on_the_log(execute, dialect)
            lease_started_column_added(execute)  # this release writes it (schema v18)
        with Ledger.open(dsn) as lg:
            runs = some_runs(lg)
            lg.skip(runs[0], "i6", OPERATOR, "a reason with ünïcode")
            before = reads(lg, runs)
            statuses = {r: lg.status(r) for r in runs}
            heads = lg.verify().heads
        with db(dsn) as execute:
            open_attempts_as_rows(execute)
            transitions_as_table(execute, dialect)
    return runs, before, statuses, heads


def check_upgraded(dsn: str, dialect: str, runs: list[str], before: Any) -> None:
    reads_before, statuses, heads = before
    with db(dsn) as execute:  # v16: the transitions in their own table, with their evidence
        n = execute("SELECT COUNT(*) FROM lg_transitions").fetchone()[0]
        assert n == len(reads_before["audit"]) > 20
    with Ledger.open(dsn) as lg:  # upgrades to v17
        with lg.store.read() as tx:
            row = tx.fetchone("SELECT value FROM ledger_meta WHERE key = 'schema_version'")
            assert int(row["value"]) == SCHEMA_VERSION >= 17
        # the columns came from the v16 table: the reads are the same, evidence and all
        assert reads(lg, runs) == reads_before
        for run_id in runs:
            now, was = lg.status(run_id), statuses[run_id]
            assert (now.state, now.revision, now.counts) == (was.state, was.revision, was.counts)
        report = lg.verify()
        assert report.ok, report.problems
        assert report.heads == heads
        # and the runs go on, their new transitions read beside the migrated ones
        open_run = runs[0]
        leases = lg.claim(open_run, WORKER, limit=10)
        assert leases
        for le in leases:
            lg.accept(le)
        was = reads_before["history " + open_run]
        history = [t.to_dict() for t in lg.history(open_run)]
        assert history[: len(was)] == was
        assert [t["command"] for t in history[len(was) :]] == ["claim"] * len(leases) + [
            "accept"
        ] * len(leases)
        again = lg.submit(manifest(2), SUBMITTER).run_id
        assert [t.command for t in lg.history(again)] == ["submit"]
        assert lg.verify().ok
    with db(dsn) as execute:  # no second table: the view of the log
        if dialect == "postgres":
            kind = execute(
                "SELECT table_type FROM information_schema.tables WHERE table_name = 'lg_transitions'"
            ).fetchone()[0]
            assert kind == "VIEW"
        else:
            kind = execute(
                "SELECT type FROM sqlite_master WHERE name = 'lg_transitions'"
            ).fetchone()[0]
            assert kind == "view"


def test_sqlite_v16_database_upgrades_to_the_same_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    runs, *before = write_at_v16(sqlite_store, dsn, monkeypatch)
    check_upgraded(dsn, "sqlite", runs, before)


@pytest.mark.postgres
def test_pg_v16_database_upgrades_to_the_same_reads(
    empty_pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = empty_pg()
    runs, *before = write_at_v16(pg_store, dsn, monkeypatch)
    check_upgraded(dsn, "postgres", runs, before)


def test_a_transition_is_one_row_of_the_log(tmp_path: Path) -> None:
    """No second table: each transition's columns are on its event's row, every other
    event's are NULL, and the view shows exactly the transitions."""
    path = tmp_path / "l.db"
    with Ledger.open(f"sqlite:///{path}") as lg:
        runs = some_runs(lg)
        audited = list(lg.audit(page_size=1000))
        assert len(audited) > 20
    conn = sqlite3.connect(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "lg_transitions" not in tables
        logged = conn.execute(
            "SELECT rowid, run_id, command, actor_id FROM stored_events WHERE run_id IS NOT NULL "
            "ORDER BY rowid"
        ).fetchall()
        assert [(t.position, t.run_id, t.command, t.actor_id) for t in audited] == logged
        others = conn.execute(
            "SELECT topic, item_id, command, from_state, to_state, actor_id, role, at "
            "FROM stored_events WHERE run_id IS NULL"
        ).fetchall()
        assert all(set(r[1:]) == {None} for r in others), others
    finally:
        conn.close()
    assert runs
