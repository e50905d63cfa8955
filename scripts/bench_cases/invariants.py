"""Case 11: the cost of the pre-commit rule checks (the rule checker, ledger/core/rule_check.py,
called by ledger/commands/uow.py before each commit; rule 12 of the rule book).

Case 1's work in one process: claim(limit=B) + record(B accepts) until a run is drained,
on PostgreSQL when a server is given, and on SQLite. The same work runs with the checks
and with them switched off (`ledger.commands.uow.check_batch` replaced by a no-op), alternating
in rounds on fresh runs of the same size so that noise falls on both sides alike.
Ratio = items/s with the checks / without; goal >= 0.95 (a cost under 5%).

On a shared 2-core machine two equal workloads differ by a few per cent from round to
round, as much as the cost measured, so a second row times the checks themselves: the
seconds spent inside `check_batch` during the rounds with the checks on, as a share
of those rounds' wall time (goal < 5%). The wrapper's own cost is two clock reads per
commit.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import Callback, Clock, PgTarget, Row, Sizes, accept_all, ratio_row, running_run

ROUNDS = 4


def _measure(lg: Any, n: int, batch: int, checks: bool, inside: list[float]) -> float:
    """Seconds to drain a fresh run of n items; adds the seconds inside the checks to
    inside[0]."""
    import time

    from ledger import Actor
    from ledger.commands import uow

    real = uow.check_batch

    def timed(*args: Any) -> None:
        start = time.perf_counter()
        try:
            real(*args)
        finally:
            inside[0] += time.perf_counter() - start

    uow.check_batch = timed if checks else _skip
    try:
        run_id = running_run(lg, n)
        with Clock() as clock:
            done = accept_all(lg, run_id, Actor("bench-w", "worker"), batch)
    finally:
        uow.check_batch = real
    if done != n:
        raise RuntimeError(f"{done} of {n} items accepted")
    return clock.seconds


def _skip(*args: Any, **kwargs: Any) -> None:
    return None


def _compare(open_ledger: Callable[[], Any], n: int, batch: int) -> tuple[float, float, float]:
    """Items/s (with checks, without), each side the sum of ROUNDS alternating rounds, and
    the share of the with-checks rounds' time spent inside the checks."""
    per_round = max(batch, n // ROUNDS)
    with_s = without_s = 0.0
    inside = [0.0]
    with open_ledger() as lg:
        _measure(lg, batch, batch, True, [0.0])  # warm-up: imports, statement caches
        for k in range(ROUNDS):
            # alternate which side goes first, so a drift in the machine's load is shared
            order = (True, False) if k % 2 == 0 else (False, True)
            for checks in order:
                seconds = _measure(lg, per_round, batch, checks, inside)
                if checks:
                    with_s += seconds
                else:
                    without_s += seconds
    total = per_round * ROUNDS
    return total / with_s, total / without_s, inside[0] / with_s


def run(pg: PgTarget | None, sizes: Sizes, say: Callback, tmp: Path | None = None) -> list[Row]:
    from ledger import Ledger

    n, batch = sizes.sqlite_items, sizes.throughput_ledger_batch
    rows = []

    def one(name: str, dsn: str) -> None:
        say(f"case 11: {name}, {n} items, claim({batch})+record, rule checks on vs off")
        on, off, share = _compare(lambda: Ledger.open(dsn), n, batch)
        say(
            f"  with checks {on:,.0f} items/s, without {off:,.0f} items/s; "
            f"{share * 100:.1f}% of the time inside the checks"
        )
        rows.append(
            ratio_row(
                "11",
                f"{name} items/s, pre-commit rule checks on vs off",
                on,
                off,
                "items/s",
                0.95,
                note=f"{n} items in {ROUNDS} alternating rounds a side; cost "
                f"{(1 - on / off) * 100:.1f}%",
            )
        )
        rows.append(
            Row(
                "11",
                f"{name} share of command time inside the rule checks",
                share * 100,
                "%",
                goal="< 5%",
                met=share < 0.05,
                note="seconds inside check_batch / wall seconds, checks-on rounds",
            )
        )

    if pg is not None:
        with pg.database("c11") as dsn:
            one("PG", dsn)
    with tempfile.TemporaryDirectory(dir=tmp, prefix="bench-c11-") as d:
        one("SQLite", f"sqlite:///{d}/ledger.db")
    return rows
