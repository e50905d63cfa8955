"""The PostgreSQL test fixtures (tests/support/pg_fixtures.py) and tests/support/pgserver.py."""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from tests.support import pgserver
from tests.support.pg_fixtures import ExternalServer, PgDatabases
from tests.support.pgserver import PgServer, memory_tmp_parent, with_dbname


def _current_database(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.postgres
def test_fresh_database_answers(pg_dsn: str) -> None:
    assert pg_dsn.startswith("postgresql://")
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT version(), current_database()").fetchone()
    assert row is not None
    version, dbname = row
    assert version.startswith("PostgreSQL ")
    assert dbname.startswith("test_")


_seen: dict[int, str] = {}


@pytest.mark.postgres
@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_its_own_database(pg_dsn: str, run: int) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        dbname = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        leftover = conn.execute("SELECT to_regclass('public.left_by_a_test')").fetchone()
        assert leftover == (None,), "a previous test's table is visible"
        conn.execute("CREATE TABLE left_by_a_test (x int)")
    assert dbname not in _seen.values()
    _seen[run] = dbname


@pytest.mark.postgres
def test_template_initializer_table_appears_in_clone(
    pg_server: PgServer | ExternalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def install(dsn: str) -> None:
        calls.append(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE from_template (id int PRIMARY KEY, note text)")
            conn.execute("INSERT INTO from_template VALUES (1, 'seeded')")

    # The registry as tests/conftest.py would use it, on a separate template
    # so the session's own template is left alone.
    monkeypatch.setattr(pgserver, "TEMPLATE_INITIALIZERS", [install])
    databases = PgDatabases(pg_server, tag=f"_probe_{secrets.token_hex(3)}")
    try:
        first_name, first_dsn = databases.create()
        second_name, second_dsn = databases.create()
        assert calls == [databases.template_dsn]  # once, before the first clone
        assert first_name != second_name
        for dsn in (first_dsn, second_dsn):
            with psycopg.connect(dsn) as conn:
                rows = conn.execute("SELECT id, note FROM from_template").fetchall()
            assert rows == [(1, "seeded")]
    finally:
        databases.drop_all()
    with psycopg.connect(pg_server.admin_dsn) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)",
            ([first_name, second_name, databases.template_name],),
        ).fetchall()
    assert left == []


@pytest.mark.postgres
def test_template_dsn_is_clone_source(pg_template_dsn: str, pg_dsn: str) -> None:
    assert _current_database(pg_template_dsn).startswith("ledger_template")
    assert _current_database(pg_dsn) != _current_database(pg_template_dsn)


@pytest.mark.postgres
def test_pgserver_start_restart_stop() -> None:
    """The durable server that benchmarks and chaos scripts start themselves."""
    started = time.monotonic()
    server = PgServer(tmp_parent=memory_tmp_parent())  # durable settings
    try:
        server.start()
        startup = time.monotonic() - started
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
            assert conn.execute("SHOW max_connections").fetchone() == ("300",)
            conn.execute("CREATE TABLE survives (x int)")
            conn.execute("INSERT INTO survives VALUES (42)")
        pid_before = server.pid
        port = server.port
        server.restart()
        assert server.pid != pid_before
        assert server.port == port
        with psycopg.connect(server.dsn("postgres")) as conn:
            assert conn.execute("SELECT x FROM survives").fetchall() == [(42,)]
        server.stop()
        assert not server.running
        assert not (server.data_dir / "postmaster.pid").exists()
        server.start()  # an existing cluster starts again without initdb
        with psycopg.connect(server.dsn("postgres")) as conn:
            assert conn.execute("SELECT x FROM survives").fetchall() == [(42,)]
    finally:
        base = server.base_dir
        server.close()
    assert base is not None and not base.exists()
    assert startup < 10, f"initdb + start took {startup:.2f}s"


def test_with_dbname() -> None:
    assert (
        with_dbname("postgresql://postgres@127.0.0.1:5432/postgres?sslmode=disable", "t_1")
        == "postgresql://postgres@127.0.0.1:5432/t_1?sslmode=disable"
    )
    assert with_dbname("postgresql://u@h:1", "x") == "postgresql://u@h:1/x"
    assert "dbname=x" in with_dbname("host=127.0.0.1 port=5432 dbname=postgres", "x")


@pytest.mark.postgres
def test_runuser_fallback_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where `unshare --user` is refused, root runs PostgreSQL as the postgres OS user."""
    if os.geteuid() != 0:
        pytest.skip("only meaningful as root")
    monkeypatch.setenv("LEDGER_PG_AS_ROOT", "runuser")
    try:
        bin_dir = pgserver.find_bin_dir()
    except pgserver.PgServerError as exc:
        pytest.skip(f"no runuser setup here: {exc}")
    with PgServer(settings=pgserver.TEST_SETTINGS, tmp_parent=memory_tmp_parent()) as server:
        assert server.bin_dir == bin_dir
        with psycopg.connect(server.dsn()) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
        assert server.data_dir.stat().st_uid == pwd.getpwnam("postgres").pw_uid
        base = server.base_dir
    assert base is not None and not base.exists()


@pytest.mark.postgres
def test_orphaned_server_is_reaped(tmp_path: Path) -> None:
    """A cluster whose owning process died (SIGKILL) is stopped and removed by the next one."""
    parent = memory_tmp_parent() or str(tmp_path)
    orphan = PgServer(settings=pgserver.TEST_SETTINGS, tmp_parent=parent)
    try:
        orphan.start()
        base = orphan.base_dir
        assert base is not None
        child = subprocess.Popen(["true"])
        child.wait()
        (base / "owner.pid").write_text(f"{child.pid}\n")
        postmaster = orphan.pid
        removed = pgserver.reap_orphans(parent)
        assert base in removed and not base.exists()
        assert postmaster is not None
        assert not pgserver._is_postmaster_of(postmaster, base / "data")  # gone (or a zombie)
    finally:
        orphan._running = False  # already gone; close() only tidies up
        orphan.close()
