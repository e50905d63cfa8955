"""What every benchmark case shares: sizes, result rows, databases, timing helpers.

Standard library at import time; psycopg and the ledger are imported where used,
so a case that is not run costs nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"

PAYLOAD_BYTES = 200  # raw baselines: the size of one stored event's state


@dataclass(frozen=True)
class Sizes:
    """How big each case is. `DEFAULT` is the brief's sizes; QUICK ~30 s; TINY for tests."""

    throughput_items: int = 20_000  # case 1
    throughput_procs: int = 8
    throughput_batch: int = 50  # baseline B: queue rows per transaction (the brief's 50)
    throughput_ledger_batch: int = 250  # ledger side: claim(limit=...) and Worker prefetch
    worker_concurrency: int = 8  # case 1, ledger.Worker(concurrency=...)
    append_items: int = 5_000  # case 2: items claimed and accepted in batches of 100
    append_batch: int = 100
    submit_items: int = 100_000  # case 3
    submit_batch: int = 1_000
    store_events: int = 200_000  # cases 4 and 5: events in the big store
    small_events: int = 1_000  # case 5: events in the small store
    status_samples: int = 200  # case 5: status() calls per measurement
    sqlite_items: int = 20_000  # case 6
    sqlite_batch: int = 50
    startup_runs: int = 7  # case 7: processes started
    fill_batch: int = 1_000  # claim/record batch used to fill a store with events
    transfer_events: int = 50_000  # case 9: events exported and imported
    feed_events: int = 50_000  # case 10: events the follower reads
    feed_wake_samples: int = 20  # case 10: commits wait_for_events waits for
    feed_writers: int = 8  # case 10: writer processes during the lag measurement
    tree_leaves: int = 1_000_000  # case 12: leaves of the big tree (roots and proofs)
    feed_load_seconds: float = 10.0
    overview_runs: int = 50_000  # case 13: open runs
    overview_batch: int = 500  # case 13: commands per set-up transaction
    overview_writers: int = 4  # case 13: set-up processes on PostgreSQL
    overview_samples: int = 20  # case 13: calls per read measured
    overview_claims: int = 200  # case 13: claim+accept timed per side
    overview_scrape_seconds: float = 8.0
    async_runs_per_submitter: int = 20  # case 14: runs each of 50 submitters makes

    def scaled(self, **changes: Any) -> Sizes:
        return replace(self, **changes)


DEFAULT = Sizes()
FULL = DEFAULT.scaled(store_events=1_000_000)
QUICK = DEFAULT.scaled(
    throughput_items=1_000,
    throughput_ledger_batch=100,
    append_items=500,
    submit_items=10_000,
    store_events=5_000,
    status_samples=100,
    sqlite_items=1_000,
    startup_runs=3,
    transfer_events=5_000,
    feed_events=5_000,
    feed_wake_samples=10,
    feed_load_seconds=5.0,
    tree_leaves=100_000,
    overview_runs=5_000,
    overview_samples=10,
    overview_claims=100,
    overview_scrape_seconds=4.0,
    async_runs_per_submitter=4,
)
TINY = Sizes(
    throughput_items=60,
    throughput_procs=2,
    throughput_batch=10,
    throughput_ledger_batch=10,
    worker_concurrency=4,
    append_items=50,
    append_batch=20,
    submit_items=200,
    submit_batch=50,
    store_events=400,
    small_events=100,
    status_samples=10,
    sqlite_items=60,
    sqlite_batch=10,
    startup_runs=1,
    fill_batch=50,
    transfer_events=300,
    feed_events=300,
    feed_wake_samples=2,
    feed_writers=2,
    tree_leaves=2_000,
    feed_load_seconds=1.0,
    overview_runs=60,
    overview_batch=25,
    overview_samples=2,
    overview_claims=5,
    overview_scrape_seconds=1.0,
    async_runs_per_submitter=1,
)


@dataclass
class Row:
    """One line of the table. `ratio` is ledger / baseline unless the case says otherwise."""

    case: str
    name: str
    ledger: float | None
    ledger_unit: str
    baseline: float | None = None
    baseline_unit: str = ""
    ratio: float | None = None
    goal: str = ""
    met: bool | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ratio_row(
    case: str,
    name: str,
    ledger: float | None,
    baseline: float | None,
    unit: str,
    minimum: float,
    note: str = "",
    **extra: Any,
) -> Row:
    """A throughput row: higher is better; met when ledger/baseline >= minimum."""
    ratio = ledger / baseline if ledger is not None and baseline else None
    return Row(
        case,
        name,
        ledger,
        unit,
        baseline,
        unit,
        ratio,
        f"ratio >= {minimum:g}",
        None if ratio is None else ratio >= minimum,
        note,
        dict(extra),
    )


class Clock:
    """Wall time of a block: `with Clock() as c: ...; c.seconds`."""

    def __enter__(self) -> Clock:
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000.0


# --------------------------------------------------------------------------
# PostgreSQL: one fresh database per case on one server
# --------------------------------------------------------------------------


@dataclass
class PgTarget:
    """The server the PostgreSQL cases run on; each case gets its own database."""

    admin_dsn: str
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    made: list[str] = field(default_factory=list)
    keep: bool = False

    def dsn(self, dbname: str) -> str:
        from tests.support.pgserver import with_dbname

        return with_dbname(self.admin_dsn, dbname)

    @contextmanager
    def database(self, label: str) -> Iterator[str]:
        """A fresh database for one case, dropped afterwards (unless keep)."""
        from tests.support.pgserver import create_database, drop_database

        name = f"bench_{self.tag}_{label}"
        create_database(self.admin_dsn, name)
        self.made.append(name)
        try:
            yield self.dsn(name)
        finally:
            if not self.keep:
                drop_database(self.admin_dsn, name)
                self.made.remove(name)

    def settings(self) -> dict[str, str]:
        import psycopg

        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            out = {}
            for name in ("fsync", "synchronous_commit", "full_page_writes", "server_version"):
                row = conn.execute(f"SHOW {name}").fetchone()  # names are constants above
                out[name] = str(row[0]) if row else "?"
            return out


def bench_server(tmp_parent: Any) -> Any:
    """A started throwaway server with PostgreSQL's durable defaults, and
    pg_stat_statements loaded where the binaries have it: case 8's breakdown reads the
    server time and WAL of each statement from it (its cost, a few percent of a
    statement's, is the same for the ledger and the peers)."""
    from tests.support.pgserver import DURABLE_SETTINGS, PgServer

    server = PgServer(tmp_parent=tmp_parent)
    if (server.bin_dir.parent / "lib" / "pg_stat_statements.so").exists():
        server.settings = {**DURABLE_SETTINGS, "shared_preload_libraries": "pg_stat_statements"}
    return server.start()


def durable(settings: dict[str, str]) -> bool:
    return settings.get("fsync") == "on" and settings.get("synchronous_commit") == "on"


# --------------------------------------------------------------------------
# The ledger side
# --------------------------------------------------------------------------


def manifest(n: int, prefix: str = "i", scope: str = "bench") -> dict[str, Any]:
    """A valid manifest with `n` small items."""
    return {
        "source_version": "bench/1",
        "config_version": "cfg-bench",
        "scope": scope,
        "items": [{"item_id": f"{prefix}{k}", "payload": {"n": k}} for k in range(n)],
        "policy": {"lease_seconds": 600},
    }


def actors() -> tuple[Any, Any]:
    from ledger import Actor

    return Actor("bench-submitter", "submitter"), Actor("bench-controller", "controller")


def running_run(lg: Any, n: int, prefix: str = "i") -> str:
    """Submit and start a run of `n` items; its run id."""
    submitter, controller = actors()
    status = lg.submit(manifest(n, prefix), submitter)
    lg.start(status.run_id, controller)
    return str(status.run_id)


def accept_all(
    lg: Any, run_id: str, worker: Any, batch: int, limit_items: int | None = None
) -> int:
    """claim(limit=batch) + record(accepts) until nothing is claimable; items done."""
    from ledger.service.ledger import Outcome

    done = 0
    while limit_items is None or done < limit_items:
        want = batch if limit_items is None else min(batch, limit_items - done)
        leases = lg.claim(run_id, worker, limit=want)
        if not leases:
            break
        results = lg.record([Outcome(lease, "accept") for lease in leases])
        bad = [r for r in results if isinstance(r, Exception)]
        if bad:
            raise RuntimeError(f"record refused {len(bad)} accepts, first: {bad[0]!r}")
        done += len(leases)
    return done


def event_count(lg: Any) -> int:
    """Events in the ledger's store."""
    table = lg.store.events_table()
    with lg.store.read() as tx:
        row = tx.fetchone(f"SELECT COUNT(*) AS n FROM {table}")  # noqa: S608 (the table name is the store's own)
    return int(row["n"]) if row else 0


def fill_events(
    lg: Any, target: int, batch: int, items_per_run: int = 20_000, prefix: str = "fill"
) -> int:
    """Add runs whose items are claimed and accepted until the store holds >= target events.

    Each item costs about 3 events (stream registered, claimed, accepted), each
    run 2 (submitted, started). Returns the final event count.
    """
    from ledger import Actor

    worker = Actor("bench-filler", "worker")
    count = event_count(lg)
    k = 0
    while count < target:
        missing = target - count
        n = max(1, min(items_per_run, -(-(missing - 2) // 3)))
        run_id = running_run(lg, n, prefix=f"{prefix}{k}-")
        accept_all(lg, run_id, worker, batch)
        count = event_count(lg)
        k += 1
    return count


# --------------------------------------------------------------------------
# Subprocesses
# --------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """Environment for child Python processes: the repo and scripts/ importable."""
    env = dict(os.environ)
    parts = [str(REPO), str(SCRIPTS)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def run_json_child(code: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run `python -c code args...`; its last stdout line is a JSON object."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=timeout,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"child failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# --------------------------------------------------------------------------
# Profiling (optional): cProfile around the ledger side of a case
# --------------------------------------------------------------------------


class Profiler:
    """cProfile the blocks wrapped in `with profiler.section(name):`, saved to `out_dir`
    (NAME.txt, NAME.pstats), with PostgreSQL time per statement (NAME.sql.txt)."""

    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)

    @property
    def enabled(self) -> bool:
        return self.out_dir is not None

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        if self.out_dir is None:
            yield
            return
        import cProfile

        from . import sqltrace

        with sqltrace.trace() as sql:
            prof = cProfile.Profile()
            start = time.perf_counter()
            prof.enable()
            try:
                yield
            finally:
                prof.disable()
                wall = time.perf_counter() - start
                save_profile(prof, self.out_dir, name)
                if sql.stats:
                    sqltrace.save(sql, self.out_dir, name, wall)


def save_profile(prof: Any, out_dir: Path, name: str) -> None:
    """Write NAME.pstats and NAME.txt (top functions by cumulative and own time)."""
    import io
    import pstats

    prof.dump_stats(str(out_dir / f"{name}.pstats"))
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    buf.write(f"== {name}: by cumulative time ==\n")
    stats.sort_stats("cumulative").print_stats(40)
    buf.write(f"== {name}: by own time ==\n")
    stats.sort_stats("tottime").print_stats(30)
    (out_dir / f"{name}.txt").write_text(buf.getvalue())


def getenv_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


Callback = Callable[[str], None]
