"""The run-ledger benchmark cases, run by scripts/bench.py.

`run_all(config)` runs the selected cases and returns their rows;
`format_table(rows, header)` prints them. Each case measures the ledger and its
raw baseline in the same run, on the same server, so the ratio is fair.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import (
    DEFAULT,
    FULL,
    QUICK,
    TINY,
    PgTarget,
    Profiler,
    Row,
    Sizes,
    bench_server,
    durable,
)

ALL_CASES = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14")

__all__ = [
    "ALL_CASES",
    "DEFAULT",
    "FULL",
    "QUICK",
    "TINY",
    "BenchConfig",
    "PgTarget",
    "Row",
    "Sizes",
    "bench_server",
    "format_table",
    "run_all",
]


@dataclass
class BenchConfig:
    sizes: Sizes = DEFAULT
    pg: PgTarget | None = None  # None: SQLite-only cases and rows
    cases: tuple[str, ...] = ALL_CASES
    profile_dir: Path | None = None
    tmp: Path | None = None  # parent of SQLite files (default: the system temp dir, on disk)
    start_method: str | None = None  # case 1's processes: fork where available, else spawn
    say: Callable[[str], None] = field(default=lambda text: None)


def _error_row(case: str, exc: BaseException) -> Row:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return Row(
        case,
        f"case {case} FAILED",
        None,
        "",
        note="error: " + " | ".join(text)[:500],
        extra={"traceback": traceback.format_exc()},
    )


def run_all(config: BenchConfig) -> list[Row]:
    """Run the selected cases; a case that raises yields one 'FAILED' row, the rest go on."""
    from . import (
        append,
        async_api,
        feed,
        invariants,
        overview,
        peers,
        scaling,
        sqlite_items,
        startup,
        store,
        submit,
        throughput,
        transfer,
        tree,
    )

    sizes, pg, say = config.sizes, config.pg, config.say
    profiler = Profiler(config.profile_dir)
    wanted = set(config.cases)
    rows: list[Row] = []

    def attempt(case: str, fn: Callable[[], list[Row]]) -> None:
        started = time.perf_counter()
        try:
            got = fn()
        except Exception as e:
            say(f"case {case} FAILED: {e!r}")
            got = [_error_row(case, e)]
        for row in got:
            row.extra.setdefault("case_seconds", round(time.perf_counter() - started, 2))
        rows.extend(got)

    tmp = config.tmp
    if "1" in wanted and pg is not None:
        attempt(
            "1", lambda: throughput.run(pg, sizes, say, config.profile_dir, config.start_method)
        )
    if "2" in wanted and pg is not None:
        attempt("2", lambda: append.run(pg, sizes, say, profiler))
    if "3" in wanted:
        if pg is not None:
            attempt("3", lambda: submit.run_pg(pg, sizes, say, profiler))
        attempt("3", lambda: submit.run_sqlite(sizes, say, profiler, tmp))
    if "4" in wanted or "5" in wanted:
        # one big store per database serves both cases
        label = "4+5" if {"4", "5"} <= wanted else ("4" if "4" in wanted else "5")
        if pg is not None:
            attempt(
                label,
                lambda: [
                    r
                    for r in store.run_pg(pg, sizes, say, profile_dir=config.profile_dir)
                    if r.case in wanted
                ],
            )
        attempt(
            label,
            lambda: [
                r
                for r in store.run_sqlite(sizes, say, tmp, profile_dir=config.profile_dir)
                if r.case in wanted
            ],
        )
    if "6" in wanted:
        attempt("6", lambda: sqlite_items.run(sizes, say, profiler, tmp))
    if "8" in wanted and pg is not None:
        attempt("8", lambda: scaling.run(pg, sizes, say, config.start_method))
    if "P" in wanted and pg is not None:  # --peers: not in ALL_CASES
        attempt("P", lambda: peers.run(pg, sizes, say, config.start_method))
    if "7" in wanted:
        attempt("7", lambda: startup.run_sqlite(sizes, say, tmp))
        if pg is not None:
            attempt("7", lambda: startup.run_pg(pg, sizes, say))
    if "9" in wanted:
        attempt("9", lambda: transfer.run(pg, sizes, say, tmp, profiler))
    if "10" in wanted and pg is not None:
        attempt("10", lambda: feed.run(pg, sizes, say))
    if "11" in wanted:
        attempt("11", lambda: invariants.run(pg, sizes, say, tmp))
    if "12" in wanted:
        attempt("12", lambda: tree.run(pg, sizes, say, tmp))
    if "13" in wanted:
        attempt("13", lambda: overview.run(pg, sizes, say, tmp))
    if "14" in wanted and pg is not None:
        attempt("14", lambda: async_api.run(pg, sizes, say))
    # in case order: 1, 2, ..., 12, 13, then the peers (P)
    return sorted(rows, key=lambda r: (0, int(r.case)) if r.case.isdigit() else (1, 0))


def _num(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ms":
        return f"{value:.3f} ms"
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "MB":
        return f"{value:.0f} MB"
    if unit == "%":
        return f"{value:.1f} %"
    return f"{value:,.0f} {unit}"


def format_table(rows: list[Row], header: list[str] | None = None) -> str:
    """The results as a plain-text table, with notes under it."""
    cols = ["case", "measure", "ledger", "baseline", "ratio", "goal", "met?"]
    body = []
    for r in rows:
        met = "n/a" if r.met is None else ("yes" if r.met else "NO")
        body.append(
            [
                r.case,
                r.name,
                _num(r.ledger, r.ledger_unit),
                _num(r.baseline, r.baseline_unit) if r.baseline_unit else "-",
                "n/a" if r.ratio is None else f"{r.ratio:.2f}",
                r.goal or "-",
                met,
            ]
        )
    widths = [
        max(len(c), *(len(line[i]) for line in body)) if body else len(c)
        for i, c in enumerate(cols)
    ]
    right = {2, 3, 4}

    def fmt(line: list[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()

    out = list(header or [])
    out.append(fmt(cols))
    out.append("  ".join("-" * w for w in widths))
    out.extend(fmt(line) for line in body)
    notes = [(i, r.note) for i, r in enumerate(rows, 1) if r.note]
    if notes:
        out.append("")
        out.append("notes:")
        out.extend(f"  [{i}] case {rows[i - 1].case}: {note}" for i, note in notes)
    return "\n".join(out)


def durable_header(pg: PgTarget | None) -> tuple[list[str], dict[str, Any]]:
    """Lines describing the server, and its settings for the JSON output."""
    if pg is None:
        return ["PostgreSQL: not used (SQLite rows only)"], {}
    settings = pg.settings()
    line = (
        f"PostgreSQL {settings.get('server_version')}: fsync={settings.get('fsync')}, "
        f"synchronous_commit={settings.get('synchronous_commit')}, "
        f"full_page_writes={settings.get('full_page_writes')}"
    )
    if not durable(settings):
        line += "  << NOT DURABLE: figures are not comparable to the goals"
    return [line], settings
