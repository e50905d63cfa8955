"""Where PostgreSQL time goes: wall time per SQL statement, measured at the client.

cProfile shows PostgreSQL work only as `connection.wait`; this patches psycopg's
`Cursor.execute`, `Cursor.executemany` and `Transaction.__exit__` (the COMMIT or
RELEASE SAVEPOINT), and the ledger's SQLite Tx methods, for the duration of a `with trace() as t:` block and adds up
calls and seconds per statement (first 90 characters, whitespace folded). The
time is the round trip: network, parse/plan, execution, lock waits, fsync.
Profiling only (`bench.py --profile`); nothing here runs in a measured case.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SPACE = re.compile(r"\s+")


class SqlTrace:
    def __init__(self) -> None:
        self.stats: dict[str, list[float]] = {}  # key -> [calls, rows or params, seconds]

    def add(self, key: str, n: int, seconds: float) -> None:
        entry = self.stats.setdefault(key, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += n
        entry[2] += seconds

    def report(self, title: str, wall: float | None = None, top: int = 25) -> str:
        total = sum(v[2] for v in self.stats.values())
        lines = [
            f"== {title}: client-side SQL time {total:.3f}s"
            + (f" of {wall:.3f}s wall ({100 * total / wall:.0f}%)" if wall else "")
            + " =="
        ]
        lines.append(f"{'seconds':>8} {'%':>5} {'calls':>7} {'rows':>8} {'ms/call':>8}  statement")
        for key, (calls, rows, secs) in sorted(self.stats.items(), key=lambda kv: -kv[1][2])[:top]:
            share = 100 * secs / total if total else 0.0
            lines.append(
                f"{secs:8.3f} {share:5.1f} {int(calls):7d} {int(rows):8d} "
                f"{1000 * secs / calls:8.2f}  {key}"
            )
        return "\n".join(lines)


def _key(query: Any) -> str:
    if not isinstance(query, (str, bytes)):
        try:
            query = query.as_string(None)
        except Exception:
            query = repr(query)
    if isinstance(query, bytes):
        query = query.decode(errors="replace")
    return _SPACE.sub(" ", query).strip()[:90]


@contextmanager
def trace() -> Iterator[SqlTrace]:
    import psycopg

    t = SqlTrace()
    cursor_execute = psycopg.Cursor.execute
    cursor_executemany = psycopg.Cursor.executemany
    tx_exit = psycopg.Transaction.__exit__

    def execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return cursor_execute(self, query, params, **kw)
        finally:
            t.add(_key(query), 1, time.perf_counter() - start)

    def executemany(self: Any, query: Any, params_seq: Any, **kw: Any) -> Any:
        params_seq = list(params_seq)
        start = time.perf_counter()
        try:
            return cursor_executemany(self, query, params_seq, **kw)
        finally:
            t.add("executemany: " + _key(query), len(params_seq), time.perf_counter() - start)

    def exit_(self: Any, *exc: Any) -> Any:
        start = time.perf_counter()
        try:
            return tx_exit(self, *exc)
        finally:
            what = "RELEASE SAVEPOINT" if getattr(self, "savepoint_name", None) else "COMMIT"
            t.add(f"<{what} (transaction exit)>", 0, time.perf_counter() - start)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]
    psycopg.Transaction.__exit__ = exit_  # type: ignore[method-assign]
    restore = _trace_sqlite(t)
    try:
        yield t
    finally:
        psycopg.Cursor.execute = cursor_execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = cursor_executemany  # type: ignore[method-assign]
        psycopg.Transaction.__exit__ = tx_exit  # type: ignore[method-assign]
        restore()


def _trace_sqlite(t: SqlTrace) -> Any:
    """SQLite's cursor is C code: wrap the ledger's SqliteTx methods instead, where they
    exist (COMMIT is not seen here; cProfile shows it as `sqlite3.Connection.commit`)."""
    try:
        from ledger.stores.sqlite import SqliteTx
    except ImportError:
        return lambda: None
    saved = {}
    for name in ("execute", "executemany", "fetchall"):
        original = SqliteTx.__dict__.get(name)
        if original is None:
            continue
        saved[name] = original

        def wrapper(
            self: Any, sql: Any, params: Any = (), _orig: Any = original, _name: str = name
        ) -> Any:
            if _name == "executemany":
                params = list(params)
            start = time.perf_counter()
            try:
                return _orig(self, sql, params)
            finally:
                n = len(params) if _name == "executemany" else 1
                prefix = "executemany: " if _name == "executemany" else ""
                t.add(prefix + _key(sql), n, time.perf_counter() - start)

        setattr(SqliteTx, name, wrapper)

    def restore() -> None:
        for name, original in saved.items():
            setattr(SqliteTx, name, original)

    return restore


def save(t: SqlTrace, out_dir: Path, name: str, wall: float | None = None) -> None:
    (out_dir / f"{name}.sql.txt").write_text(t.report(name, wall) + "\n")
