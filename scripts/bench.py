#!/usr/bin/env python
"""Benchmark the run ledger against raw baselines measured in the same run.

    python scripts/bench.py                 # brief's sizes, throwaway durable PostgreSQL
    python scripts/bench.py --quick         # ~30 s version
    python scripts/bench.py --full          # cases 4 and 5 with 1,000,000 events
    python scripts/bench.py --dsn postgresql://user@host/db   # an existing server (CREATEDB)
    python scripts/bench.py --cases 1,6 --json out.json --profile prof/
    python scripts/bench.py --cases 8 --peers   # scaling, then the peers (the [bench] extra)
    python scripts/bench.py --cases 2,4,8 --peers --against cb8d767   # beside a saved build

Cases (ratio = ledger / baseline, same run, same server):
  1 item throughput, PostgreSQL, 8 processes: Worker and claim+record loop vs a raw
    SKIP LOCKED queue, 1 item per transaction (A, goal >= 1.0) and 50 (B, >= 0.3)
  2 append throughput, PostgreSQL, one process, batches of 100 vs raw executemany (>= 0.3)
  3 bulk submit of 100,000 items to claimable vs raw executemany, PostgreSQL and SQLite (>= 0.3)
  4 rebuild_projections over 200,000 events vs reading + decoding them (>= 0.35, RSS < 300 MB)
  5 status() median latency with 1,000 vs 200,000 events (<= 1.5x; < 2 ms PG, < 1 ms SQLite)
  6 SQLite, one process, claim+accept in batches of 50 vs raw sqlite3 (>= 0.3)
  7 `ledger status RUN --json` start-up (< 0.5 s median)
  8 scaling on PostgreSQL: claim+record with 1 / 2 / 8 processes on one run
    and 4 runs x 2 processes; WAL bytes, client and server CPU per item (/proc), top
    wait events of the active backends (pg_stat_activity every 100 ms)
  9 export (SQLite, PostgreSQL) vs reading the same rows, import into PostgreSQL vs COPY (>= 0.3)
  P (--peers) the ledger with 8 processes against pgqueuer (asyncpg) on the same server
    (items/s >= 0.6x; CPU per item <= 1.5x; WAL per item <= 3,000 B); procrastinate
    and dbos rows say what was not run
  10 change feed, PostgreSQL: Follower transitions/s vs a psycopg read (>= 0.5), with
    payloads=True vs without (>= 0.7), wait_for_events wake-up (< 100 ms), follower lag
    under 8 writer processes (< 1 s)
  11 the pre-commit rule checks: claim+record with the checks on vs off, in
    alternating rounds, PostgreSQL and SQLite (>= 0.95: a cost under 5%)
  12 the stored Merkle tree: extending it per append as a share of case 1's work
    (< 5%), PostgreSQL and SQLite; a root and proofs at 1,000,000 leaves on PostgreSQL
    (< 1 s each) vs the root from scratch
  13 operator reads with 50,000 open runs: overview(), GET /overview, GET /metrics and a
    `ledger top` frame vs the per-run recount (< 200 ms each); claim+accept latency with a
    scraper looping GET /metrics vs none (<= 1.2), PostgreSQL and SQLite
  14 AsyncLedger vs the sync API, PostgreSQL: 50 concurrent submitters (asyncio tasks vs
    threads), runs/s (>= 1), and the event loop's worst lag meanwhile

The throwaway server keeps PostgreSQL's durable defaults (fsync and
synchronous_commit on) and its data on disk. `--profile DIR` runs cProfile
around the ledger side of cases 1 (first worker process), 2, 3, 4 (the rebuild
process), 6 and 9 (export and import) and writes DIR/<case>.txt and .pstats, plus DIR/<case>.sql.txt:
wall time per SQL statement; profiled timings are inflated.
Exit status: 0 when every case ran (goals met or not), 1 when a case failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE.parent), str(HERE)) if p not in sys.path]

from bench_cases import (
    ALL_CASES,
    DEFAULT,
    FULL,
    QUICK,
    BenchConfig,
    PgTarget,
    bench_server,
    durable_header,
    format_table,
    run_all,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes, about 30 seconds")
    size.add_argument("--full", action="store_true", help="cases 4 and 5 over 1,000,000 events")
    parser.add_argument(
        "--dsn",
        help="an existing PostgreSQL server (its user needs CREATEDB); "
        "each case gets its own database there, dropped afterwards",
    )
    parser.add_argument("--no-postgres", action="store_true", help="SQLite rows only")
    parser.add_argument(
        "--cases", default=",".join(ALL_CASES), help="comma-separated case numbers (default: all)"
    )
    parser.add_argument("--json", metavar="PATH", help="also save the results as JSON")
    parser.add_argument(
        "--profile", metavar="DIR", help="cProfile the ledger side of 1, 2, 3, 4, 6, 9"
    )
    parser.add_argument("--worker-concurrency", type=int, help="Worker(concurrency=...) in case 1")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=N",
        help="override one size, e.g. --set throughput_items=5000 (see "
        "bench_cases/common.py Sizes); repeatable",
    )
    parser.add_argument(
        "--tmp",
        metavar="DIR",
        help="where SQLite files and the server live (default: the system temp dir)",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the table")
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="copy ledger/, scripts/ and tests/support/pgserver.py to a "
        "temporary directory first and run from there, so edits made to "
        "the working tree during a long run cannot break it",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also case P: pgqueuer, procrastinate and dbos on the same server "
        "(pip install -e '.[bench]'; a peer not installed is skipped with a note)",
    )
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also run the cases with the code at git revision REV (a saved build), one "
        "case at a time alternating with the code as it is now, on the same server, and "
        "print each figure beside the saved build's (bench_cases/against.py)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="with --against: N rounds (the order alternates each round; each side keeps "
        "its best figure of a measure)",
    )
    args = parser.parse_args(argv)
    args.case_list = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    if args.peers and "P" not in args.case_list:
        args.case_list = (*args.case_list, "P")
    unknown = set(args.case_list) - {*ALL_CASES, "P"}
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; cases are {', '.join(ALL_CASES)}")
    return args


SNAPSHOT_ENV = "BENCH_SNAPSHOT_OF"
SNAPSHOT_PARTS = (
    "ledger",
    "scripts",
    "tests/__init__.py",
    "tests/support/__init__.py",
    "tests/support/pgserver.py",
)


def run_from_snapshot(argv: list[str]) -> int:
    """Copy the code as it is now and run this script from the copy."""
    import shutil
    import subprocess
    import tempfile

    repo = HERE.parent
    snap = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    try:
        for part in SNAPSHOT_PARTS:
            src, dst = repo / part, snap / part
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.db*"))
            else:
                shutil.copy2(src, dst)
        env = dict(os.environ, **{SNAPSHOT_ENV: str(repo)})
        env["PYTHONPATH"] = os.pathsep.join(
            [str(snap), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        )
        args = [a for a in argv if a != "--snapshot"]
        return subprocess.call([sys.executable, str(snap / "scripts" / "bench.py"), *args], env=env)
    finally:
        shutil.rmtree(snap, ignore_errors=True)


def code_origin() -> str:
    import subprocess

    import ledger

    origin = os.environ.get(SNAPSHOT_ENV)
    repo = Path(origin) if origin else HERE.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "ledger", "projections"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head, dirty = "?", ""
    where = Path(ledger.__file__).resolve().parent.parent
    return (
        f"code: {'snapshot of ' if origin else ''}{repo} at git {head or '?'}"
        f"{' + uncommitted changes in ledger/ or projections/' if dirty else ''}"
        f" (ledger imported from {where})"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.against:
        return main_against(args)
    if args.snapshot and not os.environ.get(SNAPSHOT_ENV):
        return run_from_snapshot(list(sys.argv[1:] if argv is None else argv))
    sizes = QUICK if args.quick else FULL if args.full else DEFAULT
    if args.worker_concurrency:
        sizes = sizes.scaled(worker_concurrency=args.worker_concurrency)
    for assignment in args.set:
        name, _, value = assignment.partition("=")
        if not hasattr(sizes, name.strip()) or not value.strip().isdigit():
            print(
                f"--set {assignment!r}: expected NAME=N with NAME one of "
                f"{', '.join(sizes.__dataclass_fields__)}",
                file=sys.stderr,
            )
            return 2
        sizes = sizes.scaled(**{name.strip(): int(value)})
    profile = "quick" if args.quick else "full" if args.full else "default"
    tmp = Path(args.tmp) if args.tmp else None

    def say(text: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    load_before = os.getloadavg()
    server = None
    pg: PgTarget | None = None
    needs_pg = not args.no_postgres and bool(set(args.case_list) - {"6"})
    try:
        if needs_pg and args.dsn:
            pg = PgTarget(args.dsn)
        elif needs_pg:
            say("starting a throwaway PostgreSQL (durable settings, data on disk)")
            server = bench_server(tmp)
            pg = PgTarget(server.admin_dsn)
        header, settings = durable_header(pg)
        config = BenchConfig(
            sizes=sizes,
            pg=pg,
            cases=args.case_list,
            profile_dir=Path(args.profile) if args.profile else None,
            tmp=tmp,
            say=say,
        )
        rows = run_all(config)
    finally:
        if server is not None:
            server.close()
    total = time.perf_counter() - started
    header = [
        f"run-ledger benchmark: sizes={profile}, cases={','.join(args.case_list)}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, total {total:.0f}s"
        + ("  (PROFILED: timings inflated)" if args.profile else ""),
        code_origin(),
        *header,
        (
            f"load average (1 min) {load_before[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end "
            "(other processes on this machine skew the figures; ratios less so)"
        ),
        "",
    ]
    print(format_table(rows, header), flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "sizes": profile,
                    "size_values": sizes.__dict__,
                    "cases": args.case_list,
                    "total_seconds": total,
                    "postgres": settings,
                    "profiled": bool(args.profile),
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "load_average": [load_before[0], os.getloadavg()[0]],
                    "rows": [r.to_dict() for r in rows],
                },
                indent=2,
                default=str,
            )
        )
    return 1 if any(r.name.endswith("FAILED") for r in rows) else 0


def main_against(args: argparse.Namespace) -> int:
    """`--against REV`: both builds, case by case, on one server (bench_cases/against.py)."""
    from bench_cases.against import run_against, side_by_side

    started = time.perf_counter()

    def say(text: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)

    passthrough = ["--quiet"]
    if args.quick:
        passthrough.append("--quick")
    if args.full:
        passthrough.append("--full")
    if args.no_postgres:
        passthrough.append("--no-postgres")
    if args.worker_concurrency:
        passthrough += ["--worker-concurrency", str(args.worker_concurrency)]
    if args.tmp:
        passthrough += ["--tmp", args.tmp]
    for assignment in args.set:
        passthrough += ["--set", assignment]
    server = None
    dsn = args.dsn
    try:
        if dsn is None and not args.no_postgres:
            say("starting a throwaway PostgreSQL (durable settings, data on disk)")
            server = bench_server(Path(args.tmp) if args.tmp else None)
            dsn = server.admin_dsn
        rev, before, now = run_against(
            HERE.parent, args.against, args.case_list, max(1, args.rounds), dsn, passthrough, say
        )
    finally:
        if server is not None:
            server.close()
    print(
        f"run-ledger benchmark against {rev}: cases={','.join(args.case_list)}, "
        f"{args.rounds} round(s), {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"total {time.perf_counter() - started:.0f}s\n"
        f"before: git {rev}; now: the working tree of {HERE.parent} (each a copy, run as "
        "its own bench.py per case)\n"
    )
    print(side_by_side(before, now, rev), flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"against": rev, "before": before, "now": now}, indent=2, default=str)
        )
    return 1 if any(r["name"].endswith("FAILED") for r in now) else 0


if __name__ == "__main__":
    raise SystemExit(main())
