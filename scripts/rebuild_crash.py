"""Kill a rebuilding process with SIGKILL at random moments; resume; compare with a clean rebuild.

    python scripts/rebuild_crash.py                 # starts its own PostgreSQL
    python scripts/rebuild_crash.py --dsn postgresql://postgres@127.0.0.1:5432/crash
    python scripts/rebuild_crash.py --events 200000 --kills 10 --seed 7

Without --dsn it starts a throwaway PostgreSQL (tests/support/pgserver.PgServer, durable
settings). The ledger gets --events events (made in bulk on memory ledgers with
claims and records of 1,000 items, then imported with their hashes), unless the
database already holds that many. A clean rebuild gives the reference checksums
of every projection table. Then, --kills times: a child process starts
`rebuild_projections`, is sent SIGKILL after a random delay (uniform over the
clean rebuild's duration), the live tables are checked (they must still equal the
clean ones: readers never see a half-built table), and this process resumes the
rebuild from where the child's last committed batch left it. A child that
finished before its kill does not count (the next delay is shorter). It prints
one line per attempt and how many resumes after a SIGKILL ended with tables equal
to the clean rebuild (exit status 0 only if all --kills did).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ledger import Actor, Ledger
from ledger.projections.checksums import checksums
from ledger.projections.rebuild import TRACKING_NAME, rebuild, tracked_position
from ledger.service.ledger import Outcome
from tests.histories.load import import_stored, stored_events
from tests.support.clock import ManualClock

SUBMITTER = Actor("sam", "submitter")
CONTROLLER = Actor("ctl", "controller")
WORKER = Actor("w1", "worker")
ITEMS_PER_RUN = 5000


def count_events(lg: Ledger) -> int:
    with lg.store.read() as tx:
        row = tx.fetchone(f"SELECT COUNT(*) AS n FROM {lg.store.events_table()}")  # noqa: S608 (our own table/column names; values are bound parameters)
    return int(row["n"]) if row else 0


def live(lg: Ledger) -> dict[str, str]:
    with lg.store.read() as tx:
        return checksums(tx)


def generate(lg: Ledger, target: int, seed: int) -> None:
    """Add events until the ledger holds `target`: runs made on a memory ledger, imported."""
    rng = random.Random(seed)
    clock = ManualClock()
    have = count_events(lg)
    started = time.monotonic()
    while have < target:
        with Ledger.open("memory://", clock=clock) as src:
            run = src.submit(
                {
                    "source_version": "crash",
                    "config_version": "c1",
                    "scope": "rebuild crash",
                    "items": [
                        {"item_id": f"i{k}", "payload": {"k": k}} for k in range(ITEMS_PER_RUN)
                    ],
                    "policy": {"max_attempts": 2},
                },
                SUBMITTER,
            ).run_id
            src.start(run, CONTROLLER)
            while leases := src.claim(run, WORKER, limit=1000):
                clock.advance(1)
                src.record(
                    [
                        Outcome(le, "fail" if rng.random() < 0.15 else "accept", error="flaky")
                        for le in leases
                    ]
                )
            have += import_stored(lg, (se for _p, se in stored_events(src)))
        print(f"  {have:,} events ({time.monotonic() - started:.0f}s)", flush=True)


def child(dsn: str) -> int:
    """The process that gets killed: a rebuild that prints its progress."""
    with Ledger.open(dsn) as lg:
        print("started", flush=True)
        rebuild(lg, progress=lambda done, total: print(f"progress {done} {total}", flush=True))
        print("finished", flush=True)
    return 0


def kill_one(dsn: str, delay: float) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", dsn], stdout=subprocess.PIPE, text=True, cwd=str(ROOT)
    )
    assert proc.stdout is not None
    lines: list[str] = []
    started = threading.Event()

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("started"):
                started.set()
        started.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    started.wait(timeout=120)
    t0 = time.monotonic()
    while time.monotonic() - t0 < delay and proc.poll() is None:
        time.sleep(0.005)
    finished = proc.poll() is not None
    if not finished:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(timeout=10)
    progress = [ln for ln in lines if ln.startswith("progress")]
    return {
        "finished": finished or "finished" in lines,
        "last": progress[-1] if progress else None,
        "signal": -proc.returncode if proc.returncode and proc.returncode < 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--dsn", help="a PostgreSQL database to use (default: start a throwaway server)"
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--child", metavar="DSN", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    server = None
    dsn = args.dsn
    if dsn is None:
        from tests.support.pgserver import PgServer, create_database

        server = PgServer().start()
        create_database(server.admin_dsn, "crash")
        dsn = server.dsn("crash")
    try:
        return run(dsn, args.events, args.kills, seed, rng)
    finally:
        if server is not None:
            server.close()


def run(dsn: str, events: int, kills: int, seed: int, rng: random.Random) -> int:
    print(f"rebuild crash test on {dsn} (seed {seed})", flush=True)
    with Ledger.open(dsn) as lg:
        generate(lg, events, seed)
        total = count_events(lg)
        t0 = time.monotonic()
        lg.rebuild_projections()
        clean_s = time.monotonic() - t0
        clean = live(lg)
        print(
            f"clean rebuild: {total:,} events in {clean_s:.1f}s; rows: "
            + ", ".join(f"{t}={c.split(':')[0]}" for t, c in clean.items()),
            flush=True,
        )
        equal = killed = tries = 0
        estimate = clean_s  # how long a child's whole rebuild takes (the machine's load varies)
        while killed < kills and tries < 3 * kills:
            tries += 1
            delay = rng.uniform(0.0, 0.9 * estimate)
            outcome = kill_one(dsn, delay)
            killed += not outcome["finished"]
            k = killed
            with lg.store.read() as tx:
                position = tracked_position(tx, TRACKING_NAME)
            untouched = live(lg) == clean
            firsts: list[int] = []
            t1 = time.monotonic()
            rebuild(lg, progress=lambda done, _t, firsts=firsts: firsts.append(done))
            resumed_s = time.monotonic() - t1
            same = live(lg) == clean
            if outcome["finished"]:
                estimate = min(estimate, delay)
                when = "finished before the kill (not counted; aiming earlier)"
            elif position is None:
                when = "killed before its first batch or after the switch committed"
            else:
                when = f"killed by SIGKILL at tracked position {position:,} (last report: {outcome['last']})"
            label = f"{k:2}/{kills}" if not outcome["finished"] else "  --"
            print(
                f"{label}: after {delay:5.2f}s {when}; live tables intact: {'yes' if untouched else 'NO'}; "
                f"resumed from {firsts[0] if firsts else 0:,} of {total:,} events in {resumed_s:.1f}s; "
                f"equal to the clean rebuild: {'yes' if same else 'NO'}",
                flush=True,
            )
            equal += same and not outcome["finished"]
            if not same:
                print(
                    "    checksums differ: "
                    + ", ".join(t for t in clean if live(lg).get(t) != clean[t]),
                    flush=True,
                )
    print(f"{equal} of {killed} resumes after a SIGKILL ended equal to a clean rebuild", flush=True)
    return 0 if equal == killed == kills else 1


if __name__ == "__main__":
    raise SystemExit(main())
