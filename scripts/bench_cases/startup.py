"""Case 7: command start-up, `ledger status RUN --json` as a whole process.

The `ledger` console script beside this interpreter when installed, else
`python -c "from ledger.cli import main; ..."` (said in the note). Median wall
time of several runs on a SQLite file (and PostgreSQL when there is one); the
baseline column is a bare `python -c pass` for scale. Goal: median under 0.5 s.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import Callback, PgTarget, Row, Sizes, child_env, running_run

GOAL_S = 0.5


def ledger_command() -> tuple[list[str], str]:
    script = Path(sys.executable).parent / "ledger"
    if script.exists():
        return [str(script)], "ledger console script"
    return (
        [sys.executable, "-c", "import sys; from ledger.cli import main; sys.exit(main())"],
        "no console script: python -c 'from ledger.cli import main'",
    )


def timed(cmd: list[str], runs: int, check_run_id: str | None = None) -> float:
    """Median seconds of `runs` executions (one unmeasured warm-up for the page cache)."""
    times = []
    for k in range(runs + 1):
        start = time.perf_counter()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=child_env(), timeout=120, check=False
        )
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd} exited {proc.returncode}: {proc.stderr[-2000:]}")
        if check_run_id is not None and json.loads(proc.stdout).get("run_id") != check_run_id:
            raise RuntimeError(f"{cmd} printed {proc.stdout[:300]!r}")
        if k:
            times.append(elapsed)
    return statistics.median(times)


def _row(store: str, dsn: str, sizes: Sizes, base: float, say: Callback) -> Row:
    from ledger import Ledger

    with Ledger.open(dsn) as lg:
        run_id = running_run(lg, 10)
    cmd, how = ledger_command()
    median = timed([*cmd, "--dsn", dsn, "status", run_id, "--json"], sizes.startup_runs, run_id)
    say(f"  {store}: {median * 1000:.0f} ms median ({how})")
    return Row(
        "7",
        f"`ledger status RUN --json` start-up, {store}",
        median,
        "s",
        base,
        "s",
        median / base if base else None,
        f"< {GOAL_S:g} s",
        median < GOAL_S,
        note=f"median of {sizes.startup_runs}; {how}; baseline = python -c pass",
    )


def python_floor(sizes: Sizes) -> float:
    """Median start-up of a bare interpreter, for scale."""
    return timed([sys.executable, "-c", "pass"], sizes.startup_runs)


def run_sqlite(sizes: Sizes, say: Callback, tmp: Path | None = None) -> list[Row]:
    say("case 7: command start-up, SQLite")
    base = python_floor(sizes)
    with tempfile.TemporaryDirectory(dir=tmp, prefix="bench-c7-") as d:
        return [_row("SQLite", f"sqlite:///{d}/ledger.db", sizes, base, say)]


def run_pg(pg: PgTarget, sizes: Sizes, say: Callback) -> list[Row]:
    say("case 7: command start-up, PostgreSQL")
    base = python_floor(sizes)
    with pg.database("c7") as dsn:
        return [_row("PG", dsn, sizes, base, say)]
