"""pytest fixtures for tests that need PostgreSQL.

Enable from tests/conftest.py with ``from tests.support.pg_fixtures import *``
(or ``pytest_plugins = ["tests.support.pg_fixtures"]``).

Fixtures
--------
``pg_server`` (session)
    The server. With ``LEDGER_TEST_DSN`` set, that server (an
    :class:`ExternalServer`, never started or stopped here); otherwise a
    throwaway :class:`tests.support.pgserver.PgServer` with fast, non-durable test
    settings and its data in /dev/shm, started on first use and stopped (``pg_ctl -m fast -w stop``)
    and deleted at the end of the session. Both have ``dsn(dbname)``,
    ``admin_dsn`` and ``external``.
``pg_databases`` (session)
    Makes databases cloned from the template: ``create() -> (name, dsn)``,
    ``drop(name)``; whatever it made and did not drop is dropped at the end.
``pg_template_dsn`` (session)
    DSN of the template database. Every callable in
    ``tests.support.pgserver.TEMPLATE_INITIALIZERS`` has been run once on it (with
    this DSN) before the first clone. Do not leave connections to it open:
    PostgreSQL cannot clone a database that has other sessions.
``pg_dsn`` (function)
    DSN of a fresh database for this test (``CREATE DATABASE ... TEMPLATE``),
    dropped afterwards with ``DROP DATABASE ... WITH (FORCE)``.

On a ``LEDGER_TEST_DSN`` server the names carry a random suffix
(``ledger_template_<hex>``, ``test_<hex>_<n>``) so parallel runs do not collide;
its user needs the CREATEDB privilege.

Register a schema installer, e.g. in tests/conftest.py::

    from tests.support import pgserver

    def _install_schema(dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA_SQL)

    pgserver.TEMPLATE_INITIALIZERS.append(_install_schema)
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable, Iterator, Sequence

import psycopg
import pytest

from tests.support import pgserver
from tests.support.pgserver import (
    TEST_SETTINGS,
    PgServer,
    create_database,
    drop_database,
    mark_template,
    memory_tmp_parent,
    with_dbname,
)

__all__ = ["pg_databases", "pg_dsn", "pg_server", "pg_template_dsn"]

ENV_DSN = "LEDGER_TEST_DSN"


class ExternalServer:
    """The server named by ``LEDGER_TEST_DSN``: used as is, never started or stopped."""

    external = True

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn

    def dsn(self, dbname: str = "postgres") -> str:
        return with_dbname(self.admin_dsn, dbname)

    def check(self) -> None:
        try:
            with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute(
                    "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user"
                ).fetchone()
        except psycopg.Error as exc:
            raise RuntimeError(f"{ENV_DSN}={self.admin_dsn!r}: cannot connect: {exc}") from exc
        if not (row and row[0]):
            raise RuntimeError(
                f"{ENV_DSN}={self.admin_dsn!r}: this user may not CREATE DATABASE; the tests need "
                "a user with CREATEDB (each test gets its own database cloned from a template)."
            )

    def __repr__(self) -> str:
        return f"ExternalServer({self.admin_dsn!r})"


class PgDatabases:
    """Databases cloned from a template database.

    ``tag`` goes into the names (default: a random one on an external server,
    none on our own); ``initializers`` default to
    ``pgserver.TEMPLATE_INITIALIZERS`` as it is when the template is made.
    """

    def __init__(
        self,
        server: PgServer | ExternalServer,
        *,
        tag: str | None = None,
        initializers: Sequence[Callable[[str], None]] | None = None,
    ) -> None:
        self.server = server
        if tag is None:
            tag = f"_{secrets.token_hex(4)}" if server.external else ""
        self._initializers = initializers
        self.template_name = f"ledger_template{tag}"
        self._prefix = f"test{tag}_"
        self._counter = itertools.count(1)
        self._live: set[str] = set()
        self._template_ready = False
        self._strategy: str | None = None

    @property
    def template_dsn(self) -> str:
        return self.server.dsn(self.template_name)

    def ensure_template(self) -> str:
        """Create and initialise the template once; returns its DSN."""
        if not self._template_ready:
            self._make_template()
        return self.template_dsn

    def _make_template(self) -> None:
        admin = self.server.admin_dsn
        try:
            create_database(admin, self.template_name)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise RuntimeError(
                f"cannot CREATE DATABASE on {admin!r} (the tests need CREATEDB): {exc}"
            ) from exc
        try:
            initializers = (
                pgserver.TEMPLATE_INITIALIZERS if self._initializers is None else self._initializers
            )
            for initializer in list(initializers):
                initializer(self.template_dsn)
            mark_template(admin, self.template_name)
            with psycopg.connect(admin, autocommit=True) as conn:
                fsync = conn.execute("SHOW fsync").fetchone()
                version = conn.info.server_version
            # Our own server runs with fsync=off, where copying the files clones
            # a small template faster than WAL-logging it (10 ms against 24 ms
            # here); on a durable server WAL_LOG, the default, is the faster one.
            if not self.server.external and version >= 150000 and fsync == ("off",):
                self._strategy = "FILE_COPY"
        except BaseException:
            drop_database(admin, self.template_name)
            raise
        self._template_ready = True

    def create(self) -> tuple[str, str]:
        """A fresh database cloned from the template: ``(name, dsn)``."""
        self.ensure_template()
        name = f"{self._prefix}{next(self._counter)}"
        create_database(
            self.server.admin_dsn, name, template=self.template_name, strategy=self._strategy
        )
        self._live.add(name)
        return name, self.server.dsn(name)

    def drop(self, name: str) -> None:
        drop_database(self.server.admin_dsn, name)
        self._live.discard(name)

    def drop_all(self) -> None:
        """Drop every database made here, the template last."""
        for name in sorted(self._live):
            self.drop(name)
        if self._template_ready:
            drop_database(self.server.admin_dsn, self.template_name)
            self._template_ready = False


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer | ExternalServer]:
    """The PostgreSQL server for this session (see module docstring)."""
    env_dsn = os.environ.get(ENV_DSN, "").strip()
    if env_dsn:
        external = ExternalServer(env_dsn)
        external.check()
        yield external
        return
    server = PgServer(settings=TEST_SETTINGS, tmp_parent=memory_tmp_parent())
    try:
        server.start()
        yield server
    finally:
        server.close()  # pg_ctl -m fast -w stop, then delete the directory


@pytest.fixture(scope="session")
def pg_databases(pg_server: PgServer | ExternalServer) -> Iterator[PgDatabases]:
    databases = PgDatabases(pg_server)
    try:
        yield databases
    finally:
        # A throwaway server is deleted whole; on a shared one, clean up.
        if pg_server.external:
            databases.drop_all()


@pytest.fixture(scope="session")
def pg_template_dsn(pg_databases: PgDatabases) -> str:
    """DSN of the template database, initialised by TEMPLATE_INITIALIZERS."""
    return pg_databases.ensure_template()


@pytest.fixture
def pg_dsn(pg_databases: PgDatabases, pg_template_dsn: str) -> Iterator[str]:
    """DSN of a fresh database for this test, dropped afterwards."""
    name, dsn = pg_databases.create()
    try:
        yield dsn
    finally:
        pg_databases.drop(name)
