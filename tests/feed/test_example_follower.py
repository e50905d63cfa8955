"""The README's own projection (examples/accepted_per_customer.py) on a SQLite file: run it
while the demo writes, SIGKILL it, write more while it is down, restart it, stop it with
SIGTERM, rebuild it: its numbers are always those of the ledger's own item table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ledger import Ledger
from ledger.feed.follower import followers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "accepted_per_customer.py"
WAIT = 120.0  # a bound on waiting, never a timing assertion
NAME = "accepted-per-customer"


def _env(dsn: str) -> dict[str, str]:
    return {**os.environ, "LEDGER_DSN": dsn, "PYTHONPATH": str(ROOT)}


def _demo(dsn: str, seed: int) -> None:
    subprocess.run(
        [sys.executable, "-m", "ledger.cli.entry", "demo", "--items", "12", "--seed", str(seed)],
        env=_env(dsn),
        check=True,
        capture_output=True,
        timeout=WAIT,
    )


def _example(dsn: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), *args],
        env=_env(dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _caught_up(lg: Ledger) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        found = {f.name: f for f in followers(lg)}.get(NAME)
        if found is not None and found.lag == 0:
            return
        assert time.monotonic() < deadline, f"the example did not catch up: {found}"
        time.sleep(0.05)


def _shown(dsn: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "show"],
        env=_env(dsn),
        check=True,
        capture_output=True,
        text=True,
        timeout=WAIT,
    ).stdout
    return {line.split()[0]: int(line.split()[1]) for line in out.splitlines()}


def _truth(lg: Ledger) -> dict[str, int]:
    counts: dict[str, int] = {}
    with lg.store.read() as tx:
        for row in tx.fetchall("SELECT payload FROM lg_items WHERE state = 'accepted'"):
            customer = json.loads(row["payload"]).get("customer", "?")
            counts[customer] = counts.get(customer, 0) + 1
    return counts


def test_the_readme_projection_survives_kill_restart_and_rebuild(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/ledger.db"
    _demo(dsn, 7)
    with Ledger.open(dsn) as lg:
        running = _example(dsn, "run")
        _caught_up(lg)
        running.kill()  # SIGKILL
        running.wait(WAIT)
        assert _shown(dsn) == _truth(lg)
        _demo(dsn, 8)  # more while it is down
        assert {f.name: f for f in followers(lg)}[NAME].lag > 0
        running = _example(dsn, "run")
        _caught_up(lg)
        running.send_signal(signal.SIGTERM)  # the example stops after its batch
        assert running.wait(WAIT) == 0
        truth = _truth(lg)
        assert sum(truth.values()) > 0
        assert _shown(dsn) == truth
        rebuilt = _example(dsn, "rebuild")
        out, err = rebuilt.communicate(timeout=WAIT)
        assert rebuilt.returncode == 0, err
        assert out.startswith("replayed ")
        assert _shown(dsn) == truth
