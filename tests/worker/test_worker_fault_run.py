"""Three worker processes on PostgreSQL while their backends are terminated (about a
hundred), every statement is cancelled after 1 ms for a few seconds, and the server
restarts once: each process prints only the ledger's typed errors, never a traceback,
and the record verifies afterwards.

Marked `slow` (about half a minute; CI runs it). Not marked `postgres`: it starts (and
restarts) a server of its own."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from ledger import Ledger
from tests.support.pgserver import (
    TEST_SETTINGS,
    PgServer,
    create_database,
    memory_tmp_parent,
    with_dbname,
)
from tests.support.runs import running

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 24.0

# Each worker process works the run, reopening the ledger after a typed error; anything
# else escapes and prints its traceback (what the test looks for).
WORKER = r"""
import random, sys, time
from ledger import Accepted, Ledger, LedgerError, Worker

dsn, run_id, worker_id, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])

def handle(lease):
    if random.random() < 0.1:
        raise RuntimeError("simulated failure")
    return Accepted()

deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    try:
        with Ledger.open(dsn) as lg:
            while time.monotonic() < deadline:
                summary = Worker(
                    lg, run_id, handle, worker_id=worker_id, concurrency=3,
                    poll_interval=0.05, max_idle=1,
                ).run()
                if summary.run_state != "running":
                    break
    except LedgerError as e:
        print(f"typed: {type(e).__name__}", flush=True)
        time.sleep(0.1)
"""


def _terminate_some(admin_dsn: str, dbname: str, n: int) -> int:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        pids = [
            r[0]
            for r in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            ).fetchall()
        ]
        for pid in random.sample(pids, min(n, len(pids))):
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return min(n, len(pids))


def test_workers_see_only_typed_errors_through_kills_timeouts_and_a_restart(
    tmp_path: Path,
) -> None:
    with PgServer(settings=TEST_SETTINGS, tmp_parent=memory_tmp_parent()) as server:
        create_database(server.admin_dsn, "faults")
        dsn = with_dbname(server.admin_dsn, "faults")
        with Ledger.open(dsn) as lg:
            run_id = running(lg, 3000, max_attempts=100, lease_seconds=2)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        outputs = [tmp_path / f"w{k}.out" for k in range(3)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, dsn, run_id, f"w{k}", str(SECONDS)],
                stdout=out.open("w"),
                stderr=subprocess.STDOUT,
                env=env,
            )
            for k, out in enumerate(outputs)
        ]
        started = time.monotonic()
        kills, restarted, timeouts = 0, False, "off"
        try:
            while time.monotonic() - started < SECONDS - 2:
                elapsed = time.monotonic() - started
                with psycopg.connect(server.admin_dsn, autocommit=True) as admin:
                    if timeouts == "off" and elapsed > SECONDS / 6:
                        admin.execute("ALTER DATABASE faults SET statement_timeout = '1ms'")
                        timeouts = "on"
                    elif timeouts == "on" and elapsed > SECONDS / 6 + 4:
                        admin.execute("ALTER DATABASE faults RESET statement_timeout")
                        timeouts = "done"
                kills += _terminate_some(server.admin_dsn, "faults", 2)
                if not restarted and elapsed > SECONDS / 3:
                    server.restart()  # every connection is cut
                    restarted = True
                time.sleep(0.15)
        finally:
            for p in procs:
                p.wait(timeout=120)
        with psycopg.connect(server.admin_dsn, autocommit=True) as admin:
            admin.execute("ALTER DATABASE faults RESET statement_timeout")
        with Ledger.open(dsn) as lg:
            report = lg.verify()
    for out in outputs:
        text = out.read_text()
        assert "Traceback" not in text, text[-6000:]
    assert restarted and kills >= 50, kills  # the workers stayed up to be killed
    assert report.ok, report.problems[:5]
