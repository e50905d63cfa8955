"""The written-out forms of a row statement (ledger/stores/statements.py): the one-row
form, its many-row VALUES form and, on PostgreSQL, its COPY form store the same rows.
The replay writes a batch's inserts with the many-row forms: a form that dropped a
column, misplaced a constant or quoted it wrongly would store other rows than the
live commands do."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
import pytest

from ledger.stores import statements
from ledger.stores.postgres import to_pg

COLUMNS = ("k", "name", "state", "n")
# one constant with a quote in it: it is written into the SQL as a literal
CONSTANTS = {"state": "it's pending", "n": 0}
ROWS = [(1, "a"), (2, "b'c"), (3, None)]
EXPECTED = [
    (1, "a", "it's pending", 0),
    (2, "b'c", "it's pending", 0),
    (3, None, "it's pending", 0),
]
CREATE = (
    "CREATE TABLE t (k INTEGER PRIMARY KEY, name TEXT, state TEXT NOT NULL, n INTEGER NOT NULL)"
)


def _sql() -> statements.RowsSql:
    return statements.insert("t", COLUMNS, CONSTANTS)


def test_the_forms_name_the_columns_and_constants_they_were_made_of() -> None:
    sql = _sql()
    assert sql.names == ("k", "name")  # the parameters of one row
    assert sql.columns == COLUMNS
    assert sql.plain_insert
    assert sql.copy_row((7, "x")) == [7, "x", "it's pending", 0]
    upsert = statements.insert("t", COLUMNS, CONSTANTS, tail=" ON CONFLICT (k) DO NOTHING")
    assert not upsert.plain_insert  # its tail has no COPY form
    assert upsert.values_many(2).endswith(" ON CONFLICT (k) DO NOTHING")
    with pytest.raises(AssertionError):
        _ = upsert.copy_sql
    update = statements.update("t", ("name",), ("k",))
    assert not update.plain_insert
    assert update.columns == ("name",) and update.names == ("name", "k")


@pytest.mark.parametrize("form", ["one_row", "values_many"])
def test_sqlite_stores_the_same_rows_through_every_form(form: str) -> None:
    sql = _sql()
    db = sqlite3.connect(":memory:")
    db.execute(CREATE)
    if form == "one_row":
        for row in ROWS:
            db.execute(sql, row)
    else:
        db.execute(sql.values_many(len(ROWS)), [v for r in ROWS for v in r])
    assert db.execute("SELECT k, name, state, n FROM t ORDER BY k").fetchall() == EXPECTED


@pytest.mark.postgres
@pytest.mark.parametrize("form", ["one_row", "values_many", "copy", "bulk"])
def test_postgres_stores_the_same_rows_through_every_form(pg_dsn: str, form: str) -> None:
    sql = _sql()
    with psycopg.connect(pg_dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(CREATE)
        if form == "one_row":
            for row in ROWS:
                cur.execute(to_pg(sql), row)
        elif form == "values_many":
            cur.execute(to_pg(sql.values_many(len(ROWS))), [v for r in ROWS for v in r])
        elif form == "copy":
            with cur.copy(sql.copy_sql) as copy:
                for row in ROWS:
                    copy.write_row(sql.copy_row(row))
        else:
            import json

            objects: list[dict[str, Any]] = [dict(zip(sql.names, r, strict=True)) for r in ROWS]
            cur.execute(sql.pg_bulk, (json.dumps(objects),))
        cur.execute("SELECT k, name, state, n FROM t ORDER BY k")
        assert cur.fetchall() == EXPECTED
