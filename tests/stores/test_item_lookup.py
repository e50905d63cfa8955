"""Finding items of a run: the claim's `claimable` and `claimable_pending`, and looking
up named items: the commands' `items_by_id_locked`
(record, heartbeat, repair, ...) and `load_items` (the replay's, and the
commands' lookups that lock nothing).

Every store gives the rows of the named items that exist in that run, once each
(an id named twice, an id of another run or of no item add nothing); locked, in item
id order. On PostgreSQL each id is one search of the primary key, whatever the
planner's statistics say: the rows of a run being worked are mostly newer than the
table's last ANALYZE, and planned from those statistics `run_id = ? AND item_id =
ANY(?)` read every row of the run on every call (a record of 250 outcomes in a run of
100,000 items read all 100,000). A claim reads the claimable items it takes and no
others: from statistics taken while a run was all pending, `state = 'pending' ORDER BY
seq` walked the run in seq order past every item already done."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import psycopg.sql
import pytest

from ledger import Ledger
from ledger.commands.sql import SQL
from ledger.projections.sql import STATEMENTS
from ledger.service.ledger import Outcome
from ledger.stores.named import tx_list
from tests.support.runs import WORKER, running

STATEMENT_NAMES = ("items_by_id_locked", "load_items")


def _sql(tx: Any, name: str) -> str:
    if name == "load_items":
        return STATEMENTS.sql(tx, name, items="lg_items")
    return SQL.sql(tx, name)


@pytest.mark.parametrize("name", STATEMENT_NAMES)
def test_the_named_items_of_the_run_once_each(lg: Ledger, name: str) -> None:
    run_id = running(lg, 12)
    other = running(lg, 12)  # the same item ids in another run
    lg.claim(run_id, WORKER, limit=3)
    named = ["i7", "i3", "missing", "i3", "i10", "i0", "i7"]
    with lg.store.write() as tx:
        rows = tx.fetchall(_sql(tx, name), (run_id, tx_list(tx, named)))
    ids = [row["item_id"] for row in rows]
    assert sorted(ids) == ["i0", "i10", "i3", "i7"]
    assert {row["run_id"] for row in rows} == {run_id}
    assert other != run_id
    if name == "items_by_id_locked":
        assert ids == sorted(ids)  # the order the locks are taken in
    by_id = {row["item_id"]: row for row in rows}
    assert by_id["i0"]["state"] == "in_progress" and by_id["i10"]["state"] == "pending"


@pytest.mark.parametrize("name", STATEMENT_NAMES)
def test_no_ids_no_rows(lg: Ledger, name: str) -> None:
    run_id = running(lg, 3)
    with lg.store.write() as tx:
        assert tx.fetchall(_sql(tx, name), (run_id, tx_list(tx, []))) == []


def _scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if plan.get("Relation Name") == "lg_items" else []
    for child in plan.get("Plans", ()):
        found += _scans(child)
    return found


def _plan(
    conn: psycopg.Connection[Any], sql: str, types: tuple[str, ...], args: tuple[Any, ...]
) -> Any:
    """The executed plan of `sql` as a prepared statement (custom or generic, as the
    connection's plan_cache_mode says), as JSON."""
    assert sql.count("?") == len(types) == len(args)
    body = sql
    for k in range(1, len(types) + 1):
        body = body.replace("?", f"${k}", 1)
    conn.execute(f"PREPARE lookup ({', '.join(types)}) AS {body}")
    try:
        statement = psycopg.sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE lookup ({})")
        values = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(a) for a in args)
        found = conn.execute(statement.format(values)).fetchone()
    finally:
        conn.rollback()
        conn.execute("DEALLOCATE lookup")
    assert found is not None
    plan = found[0]
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


@pytest.mark.postgres
@pytest.mark.parametrize("earlier", ["one small run", "many small runs"])
@pytest.mark.parametrize("name", STATEMENT_NAMES)
def test_postgres_searches_the_primary_key_for_each_id_of_a_run_newer_than_its_statistics(
    pg_dsn: str, name: str, earlier: str
) -> None:
    with Ledger.open(pg_dsn) as lg:
        for _ in range(1 if earlier == "one small run" else 100):
            running(lg, 5)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("ANALYZE lg_items")  # statistics that know only the small runs
        run_id = running(lg, 2000)
        named = [f"i{k}" for k in range(1000, 1040)]
        with lg.store.write() as tx:
            sql = _sql(tx, name)
        with psycopg.connect(pg_dsn) as conn:
            for mode in ("force_custom_plan", "force_generic_plan"):
                conn.execute(f"SET plan_cache_mode = {mode}")
                conn.commit()
                plan = _plan(conn, sql, ("text", "text[]"), (run_id, named))
                scans = _scans(plan)
                assert scans, plan
                for scan in scans:
                    assert scan["Node Type"] == "Index Scan", (mode, scan)
                    assert scan["Index Name"] == "lg_items_pkey", (mode, scan)
                    # one row per search, none read and thrown away
                    assert scan["Actual Rows"] <= 1 and not scan.get("Rows Removed by Filter")


@pytest.mark.postgres
@pytest.mark.parametrize("statistics", ["older than the run", "taken while it was all pending"])
@pytest.mark.parametrize("name", ["claimable", "claimable_pending"])
def test_postgres_claims_read_only_the_claimable_items_they_take(
    pg_dsn: str, name: str, statistics: str
) -> None:
    with Ledger.open(pg_dsn) as lg:
        running(lg, 5)
        if statistics == "older than the run":
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute("ANALYZE lg_items")
        run_id = running(lg, 3000)
        if statistics == "taken while it was all pending":
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute("ANALYZE lg_items")
        for _ in range(3):
            lg.record([Outcome(lease, "accept") for lease in lg.claim(run_id, WORKER, limit=500)])
        now = "2026-01-01T00:00:00+00:00"
        with lg.store.write() as tx:
            sql = SQL.sql(tx, name)
        if name == "claimable":
            types: tuple[str, ...] = ("text", "int", "text", "text", "text", "int", "int")
            args: tuple[Any, ...] = (run_id, 50, run_id, now, now, 50, 50)
        else:
            types, args = ("text", "int"), (run_id, 50)
        with psycopg.connect(pg_dsn) as conn:
            for mode in ("force_custom_plan", "force_generic_plan"):
                conn.execute(f"SET plan_cache_mode = {mode}")
                conn.commit()
                scans = _scans(_plan(conn, sql, types, args))
                assert scans
                for scan in scans:
                    assert scan["Index Name"] == "lg_items_state", (mode, scan)
                    assert not scan.get("Rows Removed by Filter"), (mode, scan)
                    assert scan["Actual Rows"] <= 50
