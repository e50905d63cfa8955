"""The benchmark code runs, with tiny sizes, so it cannot rot (no speed assertions).

Each case must produce positive figures (or "n/a" where the brief allows it: a
rebuild that is not implemented yet) and the table must print.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_cases  # noqa: E402 (found on the sys.path set just above)
from bench_cases import TINY, BenchConfig, PgTarget, Row, format_table, run_all  # noqa: E402


def check_rows(rows: list[Row], expected_cases: set[str]) -> None:
    failed = [r for r in rows if r.name.endswith("FAILED")]
    assert not failed, "\n".join(f"{r.note}\n{r.extra.get('traceback', '')}" for r in failed)
    assert {r.case for r in rows} == expected_cases
    for r in rows:
        if r.ledger is None:  # only a rebuild that is not implemented yet may be n/a
            assert r.case == "4" and r.note.startswith("n/a"), r
        else:
            assert r.ledger > 0, r
        if r.baseline_unit:
            assert r.baseline is not None and r.baseline > 0, r
        if r.ledger is not None and r.baseline:
            assert r.ratio is not None and r.ratio > 0, r
            assert r.met is not None
    table = format_table(rows, ["header"])
    print(table)
    assert "met?" in table
    for r in rows:
        assert r.name in table


def test_sqlite_cases(tmp_path: Path) -> None:
    cases = ("3", "4", "5", "6", "7", "13")
    config = BenchConfig(sizes=TINY, pg=None, cases=cases, tmp=tmp_path)
    check_rows(run_all(config), set(cases))


@pytest.mark.postgres
@pytest.mark.slow
def test_postgres_cases(pg_dsn: str, tmp_path: Path) -> None:
    # Cases make their own databases on the test server; they run on its fast test
    # settings here, which is fine: only the code path is under test.
    # spawn, not fork: this pytest process may run other threads
    config = BenchConfig(sizes=TINY, pg=PgTarget(pg_dsn), tmp=tmp_path, start_method="spawn")
    rows = run_all(config)
    check_rows(rows, set(bench_cases.ALL_CASES))
    assert {r.name for r in rows if r.case == "1"} >= {
        "PG items/s, claim(10)+record vs queue 1/txn (A)",
        "PG items/s, Worker(concurrency=4, prefetch=10) vs queue 10/txn (B)",
    }
    assert any(r.name.startswith("PG ") for r in rows if r.case == "3")
    assert any(r.name.startswith("SQLite ") for r in rows if r.case == "3")


def test_table_and_json_shape() -> None:
    rows = [
        Row("1", "a", 10.0, "items/s", 5.0, "items/s", 2.0, "ratio >= 1", True, note="x"),
        Row(
            "4",
            "b",
            None,
            "events/s",
            7.0,
            "events/s",
            None,
            "ratio >= 0.5",
            None,
            note="n/a: not yet",
        ),
    ]
    table = format_table(rows)
    assert "n/a" in table and "yes" in table and "[2] case 4: n/a: not yet" in table
    data: Any = json.loads(json.dumps([r.to_dict() for r in rows]))
    assert data[0]["ratio"] == 2.0


def test_command_line_help() -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--quick" in proc.stdout and "--json" in proc.stdout


@pytest.mark.postgres
def test_peers_case_measures_what_is_installed_and_names_what_is_not(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench_cases import peers

    # pretend nothing of the [bench] extra is installed: the ledger row still comes, and
    # every peer gets a row saying what to install
    monkeypatch.setattr(peers, "missing", lambda peer: list(peers.PEERS[peer]))
    config = BenchConfig(
        sizes=TINY, pg=PgTarget(pg_dsn), tmp=tmp_path, cases=("P",), start_method="spawn"
    )
    rows = run_all(config)
    assert [r.name for r in rows] == [
        "PG items/s, ledger 2 procs",
        "peer pgqueuer",
        "peer procrastinate",
        "peer dbos",
    ]
    assert rows[0].ledger is not None and rows[0].ledger > 0
    for r in rows[1:]:
        assert r.ledger is None and r.note.startswith("skipped: ") and ".[bench]" in r.note
    print(format_table(rows, ["header"]))


def test_side_by_side_pairs_measures_and_keeps_the_better_round() -> None:
    from bench_cases.against import _better, side_by_side

    before = [
        {"case": "2", "name": "append", "ledger": 100.0, "ledger_unit": "ev/s", "ratio": 0.1},
        {"case": "2", "name": "gone now", "ledger": 5.0, "ledger_unit": "ev/s", "ratio": None},
    ]
    now = [
        {
            "case": "2",
            "name": "append",
            "ledger": 150.0,
            "ledger_unit": "ev/s",
            "ratio": 0.15,
            "goal": "ratio >= 0.3",
            "met": False,
        },
        {"case": "2", "name": "new measure", "ledger": 7.0, "ledger_unit": "ms", "ratio": None},
    ]
    table = side_by_side(before, now, "abc1234").splitlines()
    assert "before (abc1234)" in table[0]
    append = next(line for line in table if line.startswith("2     append"))
    assert "100 ev/s" in append and "150 ev/s" in append and "1.50" in append and "NO" in append
    assert any(
        line.startswith("2     gone now") and line.rstrip().endswith("n/a") for line in table
    )
    new = next(line for line in table if line.startswith("2     new measure"))
    assert "  -  " in new  # no figure before
    # a rate keeps the higher of two rounds, a cost (a goal written with <) the lower
    assert _better({"ledger": 1.0, "goal": "ratio >= 1"}, {"ledger": 2.0})["ledger"] == 2.0
    assert (
        _better({"ledger": 1.0, "goal": "<= 3000"}, {"ledger": 2.0, "goal": "<= 3000"})["ledger"]
        == 1.0
    )
    assert _better({"ledger": None}, {"ledger": 2.0})["ledger"] == 2.0


@pytest.mark.slow
def test_against_a_saved_build_runs_both_and_prints_them_side_by_side(tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "against.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "bench.py"),
            "--against",
            "HEAD",
            "--cases",
            "7",
            "--no-postgres",
            "--quick",
            "--quiet",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["before"] and got["now"]
    names = {r["name"] for r in got["now"]}
    assert names == {r["name"] for r in got["before"]}
    assert all(r["ledger"] and r["ledger"] > 0 for r in got["before"] + got["now"])
    assert "now/before" in done.stdout


def test_statement_breakdown_is_counted_in_the_case_database_where_the_server_loads_it(
    tmp_path: Path,
) -> None:
    """The per-statement server time and WAL of case 8 come from pg_stat_statements on a
    server started by `bench_server`; each statement's calls, time and bytes are per item."""
    import psycopg
    from bench_cases.common import bench_server
    from bench_cases.scaling import _statements_reset, breakdown_lines, statements

    server = bench_server(tmp_path)
    try:
        with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
            if not _statements_reset(conn):
                pytest.skip("these PostgreSQL binaries have no pg_stat_statements")
            conn.execute("CREATE TABLE t (k int)")
            for k in range(20):
                conn.execute("INSERT INTO t VALUES (%s)", (k,))
            got = statements(conn, items=10)
    finally:
        server.close()
    assert got is not None
    insert = [s for s in got if s[0].startswith("INSERT INTO t")]
    assert len(insert) == 1
    _text, calls, ms, wal = insert[0]
    assert calls == 20 and ms > 0 and wal > 0
    lines = breakdown_lines({"statements": got})
    assert any("INSERT INTO t" in line for line in lines)
