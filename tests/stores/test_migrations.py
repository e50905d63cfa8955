"""Schema changes are versioned migrations: however a database got to the latest
version, its catalog is the same as a fresh one's.

A "fresh" schema is what `Ledger.open` creates on an empty database (every
migration in one go). The other paths open the database as older releases of the
ledger would have (only the first k migrations, by narrowing the store's
`migrations()`), then upgrade. The checks are generic over however many
migrations exist, so a new one is covered without touching this file.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ledger import Ledger
from ledger.stores import postgres as pg_store
from ledger.stores import sqlite as sqlite_store
from ledger.stores.base import SCHEMA_VERSION
from tests.support.pgserver import create_database, drop_database

# --------------------------------------------------------------------------
# catalogs
# --------------------------------------------------------------------------
PG_CATALOG_QUERIES = {
    "tables": """SELECT table_name, table_type FROM information_schema.tables
                 WHERE table_schema = 'public' ORDER BY 1""",
    "columns": """SELECT table_name, column_name, ordinal_position, data_type, udt_name,
                         is_nullable, column_default, character_maximum_length, numeric_precision
                  FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 3""",
    "constraints": """SELECT c.conrelid::regclass::text, c.conname, c.contype,
                             pg_get_constraintdef(c.oid)
                      FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
                      WHERE n.nspname = 'public' ORDER BY 1, 2""",
    "indexes": """SELECT tablename, indexname, indexdef FROM pg_indexes
                  WHERE schemaname = 'public' ORDER BY 1, 2""",
    "sequences": """SELECT sequence_name, data_type, start_value, increment FROM
                    information_schema.sequences WHERE sequence_schema = 'public' ORDER BY 1""",
    "types": """SELECT t.typname, t.typtype, format_type(a.atttypid, a.atttypmod), a.attname, a.attnum
                FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
                LEFT JOIN pg_class c ON c.oid = t.typrelid
                LEFT JOIN pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0
                WHERE n.nspname = 'public' AND t.typtype IN ('c', 'd', 'e')
                  AND (c.relkind IS NULL OR c.relkind = 'c')
                ORDER BY 1, 5""",
    "functions": """SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prosrc
                    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                    WHERE n.nspname = 'public' ORDER BY 1, 2""",
    "triggers": """SELECT event_object_table, trigger_name, action_timing, event_manipulation,
                          action_statement
                   FROM information_schema.triggers WHERE trigger_schema = 'public' ORDER BY 1, 2""",
    # storage parameters (fillfactor, autovacuum settings)
    "reloptions": """SELECT c.relname, c.reloptions FROM pg_class c
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = 'public' AND c.reloptions IS NOT NULL ORDER BY 1""",
    "meta": "SELECT key, value FROM ledger_meta ORDER BY key",
}


def pg_catalog(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """Tables, columns with types, constraints, indexes, sequences, types, functions,
    triggers, storage parameters and the ledger_meta rows of the `public` schema."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            name: [tuple(r) for r in conn.execute(q).fetchall()]  # type: ignore[arg-type]
            for name, q in PG_CATALOG_QUERIES.items()
        }


def sqlite_catalog(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """sqlite_master (whitespace-normalised SQL), every table's columns, the ledger_meta rows."""
    conn = sqlite3.connect(path)
    try:
        # (ALTER TABLE ... RENAME rewrites a table's SQL with its new name quoted)
        master = [
            (
                t,
                n,
                tbl,
                " ".join((sql or "").split()).replace(f'CREATE TABLE "{n}"', f"CREATE TABLE {n}"),
            )
            for t, n, tbl, sql in conn.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
            )
        ]
        columns = [
            (name, *col)
            for kind, name, _, _ in master
            if kind == "table"
            for col in conn.execute("SELECT * FROM pragma_table_info(?)", (name,))
        ]
        meta = list(conn.execute("SELECT key, value FROM ledger_meta ORDER BY key"))
        return {"master": master, "columns": columns, "meta": meta}
    finally:
        conn.close()


def schema_version_pg(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
    assert row is not None
    return int(row[0])


def schema_version_sqlite(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
    finally:
        conn.close()
    assert row is not None
    return int(row[0])


def upgrade_paths(latest: int) -> list[tuple[int, ...]]:
    """Every version sequence an upgrade can take to `latest` that is worth checking:
    one version per release (1, 2, ..., latest) and each jump (k, latest)."""
    paths = {tuple(range(1, latest + 1))} | {(k, latest) for k in range(1, latest)}
    return sorted(paths)


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------
@pytest.fixture
def empty_pg(pg_server: Any) -> Iterator[Callable[[], str]]:
    """Makes EMPTY databases (no template schema): returns their DSNs; drops them after."""
    yield from empty_databases(pg_server)


def empty_databases(pg_server: Any) -> Iterator[Callable[[], str]]:
    """The body of an `empty_pg` fixture (shared with test_schema_race.py)."""
    made: list[str] = []
    tag = secrets.token_hex(3)

    def make() -> str:
        name = f"ledger_empty_{tag}_{len(made)}"
        create_database(pg_server.admin_dsn, name)
        made.append(name)
        dsn: str = pg_server.dsn(name)
        return dsn

    try:
        yield make
    finally:
        for name in made:
            drop_database(pg_server.admin_dsn, name)


def open_at(monkeypatch: pytest.MonkeyPatch, module: Any, version: int, dsn: str) -> None:
    """Open (and close) a ledger as a release whose latest migration is `version`."""
    full = module.migrations
    with monkeypatch.context() as m:
        m.setattr(module, "migrations", lambda *a: full(*a)[:version])
        Ledger.open(dsn).close()


# --------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------
def test_migrations_are_numbered_one_per_schema_version() -> None:
    assert SCHEMA_VERSION >= 1
    assert len(sqlite_store.migrations()) == SCHEMA_VERSION
    # every migration is a non-empty list of statements
    assert all(statements for statements in sqlite_store.migrations())


@pytest.mark.postgres
def test_pg_template_schema_is_a_fresh_schema(empty_pg: Callable[[], str], pg_dsn: str) -> None:
    # the per-test databases (cloned from the template) carry exactly the fresh schema
    fresh = empty_pg()
    Ledger.open(fresh).close()
    assert schema_version_pg(fresh) == SCHEMA_VERSION
    assert pg_catalog(pg_dsn) == pg_catalog(fresh)


@pytest.mark.postgres
@pytest.mark.parametrize("path", upgrade_paths(SCHEMA_VERSION), ids=lambda p: "-".join(map(str, p)))
def test_pg_every_upgrade_path_ends_in_the_fresh_schema(
    path: tuple[int, ...], empty_pg: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = empty_pg()
    Ledger.open(fresh).close()
    want = pg_catalog(fresh)
    assert want["tables"], "the fresh schema has no tables"

    dsn = empty_pg()
    for version in path:
        open_at(monkeypatch, pg_store, version, dsn)
        assert schema_version_pg(dsn) == version
    assert pg_catalog(dsn) == want
    Ledger.open(dsn).close()  # reopening at the latest version changes nothing
    assert pg_catalog(dsn) == want


@pytest.mark.postgres
def test_pg_catalog_notices_a_difference(
    empty_pg: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison can fail: a schema one migration short is a different catalog."""
    if SCHEMA_VERSION == 1:
        pytest.skip("only one migration")
    fresh, old = empty_pg(), empty_pg()
    Ledger.open(fresh).close()
    open_at(monkeypatch, pg_store, SCHEMA_VERSION - 1, old)
    assert pg_catalog(old) != pg_catalog(fresh)


@pytest.mark.parametrize("path", upgrade_paths(SCHEMA_VERSION), ids=lambda p: "-".join(map(str, p)))
def test_sqlite_every_upgrade_path_ends_in_the_fresh_schema(
    path: tuple[int, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = tmp_path / "fresh.db"
    Ledger.open(f"sqlite:///{fresh}").close()
    want = sqlite_catalog(fresh)
    assert any(t == "table" for t, *_ in want["master"])

    db = tmp_path / "upgraded.db"
    for version in path:
        open_at(monkeypatch, sqlite_store, version, f"sqlite:///{db}")
        assert schema_version_sqlite(db) == version
    assert sqlite_catalog(db) == want
    Ledger.open(f"sqlite:///{db}").close()
    assert sqlite_catalog(db) == want


@pytest.mark.postgres
def test_pg_a_database_newer_than_the_code_is_refused(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE ledger_meta SET value = %s WHERE key = 'schema_version'",
            (str(SCHEMA_VERSION + 1),),
        )
    before = pg_catalog(pg_dsn)
    with pytest.raises(RuntimeError, match=f"version {SCHEMA_VERSION + 1}, newer"):
        Ledger.open(pg_dsn)
    assert pg_catalog(pg_dsn) == before


def test_sqlite_a_database_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "newer.db"
    Ledger.open(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE ledger_meta SET value = ? WHERE key = 'schema_version'",
            (str(SCHEMA_VERSION + 1),),
        )
    before = sqlite_catalog(db)
    with pytest.raises(RuntimeError, match=f"version {SCHEMA_VERSION + 1}, newer"):
        Ledger.open(f"sqlite:///{db}")
    assert sqlite_catalog(db) == before
    assert schema_version_sqlite(db) == SCHEMA_VERSION + 1


def _some_history(lg: Ledger) -> None:
    from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest

    run_id = lg.submit(manifest(3), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    for le in lg.claim(run_id, WORKER, limit=2):
        lg.accept(le)


@pytest.mark.postgres
def test_pg_a_projection_rebuild_leaves_the_fresh_catalog(pg_dsn: str) -> None:
    want = pg_catalog(pg_dsn)
    with Ledger.open(pg_dsn) as lg:
        _some_history(lg)
        lg.rebuild_projections()
    got = pg_catalog(pg_dsn)
    # tables, columns, types, indexes and constraints with their names, keys, meta rows: as
    # fresh (PostgreSQL 18 names NOT NULL constraints too: the switch renames them)
    assert got == want


def test_sqlite_a_projection_rebuild_leaves_the_fresh_catalog(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    Ledger.open(f"sqlite:///{db}").close()
    want = sqlite_catalog(db)
    with Ledger.open(f"sqlite:///{db}") as lg:
        _some_history(lg)
        lg.rebuild_projections()
    assert sqlite_catalog(db) == want
