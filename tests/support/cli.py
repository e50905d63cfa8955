"""The `ledger` command under test: typer's `CliRunner` over the real app, on a store
made beforehand (the `dsn` and `lg` fixtures; import them into a test module)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from ledger import Ledger
from ledger.cli.entry import app
from tests.support.runs import manifest

runner = CliRunner()


@pytest.fixture
def dsn(dsn: str) -> str:
    """A store that outlives one command (memory:// would not), already made (read
    commands do not create a SQLite file; tests/cli/test_cli_person.py checks that)."""
    if dsn.startswith("sqlite"):
        Ledger.open(dsn).close()
    return dsn


@pytest.fixture
def lg(dsn: str) -> Iterator[Ledger]:
    with Ledger.open(dsn) as ledger:
        yield ledger


def cli(dsn: str, *args: str) -> Result:
    return runner.invoke(app, ["--dsn", dsn, *args])


def ok(dsn: str, *args: str) -> Result:
    result = cli(dsn, *args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def doc(dsn: str, *args: str) -> Any:
    """Run a read command with --json and parse its single JSON document."""
    return json.loads(ok(dsn, *args, "--json").stdout)


def write_json(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def submitted(dsn: str, tmp_path: Path, n: int = 2, **policy: Any) -> str:
    run: str = doc(dsn, "submit", write_json(tmp_path / "m.json", manifest(n, **policy)))["run_id"]
    return run
