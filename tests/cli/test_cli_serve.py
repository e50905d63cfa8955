"""`ledger serve` refuses a ledger that does not exist (as every command that only reads
does) and says on start-up what it serves and whether anyone can sign in."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ledger import Ledger
from tests.support.pgserver import free_port

WAIT = 60.0  # a bound on waiting, never a timing assertion
CLI = [sys.executable, "-c", "from ledger.cli import main; raise SystemExit(main())"]


def test_serve_refuses_a_missing_sqlite_file(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    done = subprocess.run(
        [*CLI, "--dsn", f"sqlite:///{typo}", "serve", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 1
    assert "StoreUnavailable" in done.stderr
    assert not typo.exists()


def test_serve_says_what_it_serves_and_that_no_token_exists(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    Ledger.open(f"sqlite:///{db}").close()
    port = free_port()
    proc = subprocess.Popen(
        [
            *CLI,
            "--dsn",
            f"sqlite:///{db}",
            "serve",
            "--port",
            str(port),
            "--tokens",
            str(tmp_path / "t"),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + WAIT
        assert proc.stderr is not None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line.strip())
            if "ledger token add" in line:
                break
    finally:
        proc.terminate()
        proc.wait(WAIT)
    assert any(f"sqlite:///{db}" in line and f":{port}/" in line for line in lines), lines
    assert any("no token" in line and "ledger token add" in line for line in lines), lines
