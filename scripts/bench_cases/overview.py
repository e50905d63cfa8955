"""Case 13: the operator reads with many open runs, and claims while a scraper loops.

A ledger gets `overview_runs` open runs of 2 items each (half queued, half running),
written in bulk: `overview_batch` submits (or starts) share one transaction, through the
commands' own handlers (the same events, checks and projections as one command each, far
fewer commits), from `overview_writers` processes at once on PostgreSQL. Then, one process:

- `overview()` read fresh, `GET /overview` and `GET /metrics` as a server answers them
  (from its overview snapshot, read again at most every 2 s: the median is what a
  client waits; the reads of the ledger behind it are the `overview()` row), one frame
  of `ledger top --once` (a fresh overview rendered as a table) and one of its live view
  (from its snapshot, read again in the background every 2 s): median milliseconds,
  against the baseline of the rule applied to every open run (`overview_recount`, what
  these reads cost before they counted); goal < 200 ms each;
- `overview()` read fresh by a clock 16 minutes ahead: every running run quiet past the
  default stall threshold, so each is stalled, counted, and probed for its latest
  transition (the worst case of the stall count);
- claim + accept of one item on a separate running run: the median latency while a
  second process loops `GET /metrics` on a server app with its default snapshot (an
  operator's Prometheus scraping 20 times a second), against the same without it (ratio
  goal <= 1.2, on a 2-core machine shared with the scraper).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .common import PgTarget, Row, Sizes, actors, child_env, manifest, median_ms

GOAL_MS = 200.0
# Between two scrapes of the looping scraper: 20 scrapes a second, hundreds of times what a
# Prometheus server asks (every 15 s or more), without the scraper's own Python loop
# taking a whole core of the two the benchmark's machine has.
PAUSE = 0.05

_SCRAPER = """
import sys, time
from fastapi.testclient import TestClient
from ledger import Ledger
from ledger.http import create_app
dsn, seconds, pause = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
with Ledger.open(dsn) as lg, TestClient(create_app(lg, tokens_path="/dev/null", public_reads=True)) as client:
    print("ready", flush=True)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        assert client.get("/metrics").status_code == 200
        n += 1
        time.sleep(pause)
    print(n, flush=True)
"""


_WRITER = """
import sys
from ledger import Ledger
from bench_cases.overview import bulk_open_runs
dsn, n, batch, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with Ledger.open(dsn) as lg:
    bulk_open_runs(lg, n, batch, lambda line: None, first)
print("done", flush=True)
"""


def bulk_open_runs(lg: Any, n: int, batch: int, say: Callable[[str], None], first: int = 0) -> None:
    """`n` open runs of 2 items, every other one started, `batch` commands per transaction
    (`first`: the number of the first, in their scopes)."""
    from ledger.commands import lineage, runs
    from ledger.commands.uow import UnitOfWork

    submitter, controller = actors()
    made = 0
    while made < n:
        k = min(batch, n - made)
        with lg.store.write() as tx:
            for j in range(k):
                number = first + made + j
                uow = UnitOfWork(lg.store, lg._projector, tx)
                status = lineage.submit(uow, manifest(2, scope=f"bench open {number}"), submitter)
                if number % 2:
                    runs.start(UnitOfWork(lg.store, lg._projector, tx), status.run_id, controller)
        made += k
        if made % (batch * 20) == 0 or made == n:
            say(f"  {made} open runs")


def _bulk(dsn: str, lg: Any, sizes: Sizes, say: Callable[[str], None]) -> None:
    """The open runs, from `overview_writers` processes on PostgreSQL (SQLite: this one)."""
    import subprocess
    import sys

    n, writers = sizes.overview_runs, sizes.overview_writers
    if dsn.startswith("sqlite") or writers <= 1:
        bulk_open_runs(lg, n, sizes.overview_batch, say)
        return
    share = -(-n // writers)
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, "-c", _WRITER, dsn),
                *(str(min(share, n - k * share)), str(sizes.overview_batch), str(k * share)),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for k in range(writers)
        if k * share < n
    ]
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode or "done" not in out:
            raise RuntimeError(f"a set-up writer failed ({proc.returncode})")
    say(f"  {n} open runs ({len(procs)} writers)")


def _vacuum(dsn: str) -> str:
    """On PostgreSQL, VACUUM ANALYZE after the bulk set-up, as autovacuum would soon after
    it (a fresh bulk load has no statistics and no visibility map, so every index-only
    scan reads the table too); a note saying so, and whether autovacuum is on."""
    if not dsn.startswith("postgres"):
        return ""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        conn.execute("VACUUM ANALYZE")
    return f"; VACUUM ANALYZE after it (autovacuum {row[0] if row else '?'})"


def _median_ms(fn: Callable[[], Any], samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median_ms(times)


def _claim_latency(lg: Any, run_id: str, samples: int) -> list[float]:
    from ledger import Actor

    worker = Actor("bench-w", "worker")
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        (lease,) = lg.claim(run_id, worker, limit=1)
        lg.accept(lease)
        out.append(time.perf_counter() - start)
    return out


def _measure(dsn: str, label: str, sizes: Sizes, say: Callable[[str], None]) -> list[Row]:
    import subprocess
    import sys

    from fastapi.testclient import TestClient
    from rich.console import Console

    from ledger import Ledger
    from ledger.cli.top import render_overview
    from ledger.http import create_app
    from ledger.reads.overview import OverviewSnapshot, overview, overview_recount

    from .common import running_run

    n = sizes.overview_runs
    rows: list[Row] = []
    with Ledger.open(dsn) as lg:
        say(f"{label}: {n} open runs in bulk")
        start = time.perf_counter()
        _bulk(dsn, lg, sizes, say)
        setup = time.perf_counter() - start
        vacuumed = _vacuum(dsn)
        work = running_run(lg, 2 * sizes.overview_claims + 10, prefix="w")
        recount = _median_ms(lambda: overview_recount(lg.store), 2)
        samples = sizes.overview_samples
        got = overview(lg.store)
        if got.open_runs != n + 1:
            raise RuntimeError(f"{got.open_runs} open runs counted, {n + 1} written")

        live = OverviewSnapshot(lg.store, max_age=2.0)  # `ledger top`'s live view

        def frame(read: Callable[[], Any]) -> Callable[[], None]:
            def draw() -> None:
                with open(os.devnull, "w") as devnull:
                    Console(file=devnull, width=160).print(render_overview(read()))

            return draw

        app = create_app(lg, tokens_path="/dev/null", public_reads=True)
        with TestClient(app) as client:
            timings = {
                "overview()": _median_ms(lambda: overview(lg.store), samples),
                "GET /overview": _median_ms(
                    lambda: client.get("/overview").raise_for_status(), samples
                ),
                "GET /metrics": _median_ms(
                    lambda: client.get("/metrics").raise_for_status(), samples
                ),
                "`ledger top --once` frame (a fresh overview)": _median_ms(
                    frame(lg.overview), samples
                ),
                "`ledger top` live frame (its snapshot)": _median_ms(frame(live.get), samples),
            }
        ahead = Ledger.open(dsn, clock=lambda: datetime.now(UTC) + timedelta(minutes=16))
        with ahead:
            quiet = overview(ahead.store)
            if quiet.stalled != n // 2 + 1:
                raise RuntimeError(f"{quiet.stalled} stalled, {n // 2 + 1} running runs quiet")
            timings["overview() every running run quiet 16 min"] = _median_ms(
                lambda: overview(ahead.store), samples
            )
        for what, ms in timings.items():
            rows.append(
                Row(
                    "13",
                    f"{label} {what} median, {n} open runs vs the per-run recount",
                    ms,
                    "ms",
                    recount,
                    "ms",
                    ms / recount if recount else None,
                    f"< {GOAL_MS:g} ms",
                    ms < GOAL_MS,
                    note=f"set-up {setup:.0f}s (bulk, {sizes.overview_batch} per transaction"
                    f"{vacuumed})"
                    if what == "overview()"
                    else "",
                )
            )
        claims = sizes.overview_claims
        _claim_latency(lg, work, 5)  # warm-up
        quiet = _claim_latency(lg, work, claims)
        scraper = subprocess.Popen(
            [sys.executable, "-c", _SCRAPER, dsn, str(sizes.overview_scrape_seconds), str(PAUSE)],
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        try:
            assert scraper.stdout is not None
            if scraper.stdout.readline().strip() != "ready":
                raise RuntimeError("the scraper did not start")
            time.sleep(0.5)  # its first scrape reads the overview
            busy = _claim_latency(lg, work, claims)
        finally:
            out, _ = scraper.communicate(timeout=sizes.overview_scrape_seconds + 60)
        scrapes = int(out.split()[-1]) if out.split() else 0
        q, b = statistics.median(quiet) * 1000, statistics.median(busy) * 1000
        rows.append(
            Row(
                "13",
                f"{label} claim+accept median, a scraper looping GET /metrics vs none",
                b,
                "ms",
                q,
                "ms",
                b / q if q else None,
                "ratio <= 1.2",
                (b / q) <= 1.2 if q else None,
                note=f"{scrapes} scrapes in {sizes.overview_scrape_seconds:g}s "
                "(the server's overview snapshot: one read of the ledger per 2 s)",
            )
        )
    return rows


def run(
    pg: PgTarget | None, sizes: Sizes, say: Callable[[str], None], tmp: Path | None
) -> list[Row]:
    rows: list[Row] = []
    if pg is not None:
        with pg.database("overview") as dsn:
            rows.extend(_measure(dsn, "PG", sizes, say))
    with tempfile.TemporaryDirectory(dir=tmp) as d:
        rows.extend(_measure(f"sqlite:///{d}/overview.db", "SQLite", sizes, say))
    return rows
