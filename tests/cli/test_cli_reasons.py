"""`ledger pause|resume|cancel|fail|skip|release|compensate` need `--reason`: left out or
blank, the ledger refuses the command as InvalidInput (one line, exit 1) and writes
nothing, as over the Python API and HTTP; `--help` says that the reason is required."""

# ruff: noqa: F811  (the fixtures of tests/support/cli.py are imported, then requested by name)
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger
from tests.support.cli import cli, dsn, lg, ok, submitted  # noqa: F401  (fixtures)
from tests.support.runs import CONTROLLER, OPERATOR


def _events(dsn: str) -> tuple[Any, ...]:
    with Ledger.open(dsn) as lg:
        return tuple((r.run_id, r.state, r.revision) for r in lg.runs(limit=1000)), len(
            lg.audit(limit=10_000)
        )


COMMANDS = {
    "pause": ("running", ("pause",)),
    "resume": ("paused", ("resume",)),
    "cancel": ("running", ("cancel",)),
    "fail": ("running", ("fail",)),
    "skip": ("running", ("skip", "{run}", "i0")),
}


@pytest.mark.parametrize("blank", [False, True], ids=["left-out", "blank"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_that_needs_a_reason_is_refused_without_one(
    dsn: str, tmp_path: Path, command: str, blank: bool
) -> None:
    state, words = COMMANDS[command]
    run = submitted(dsn, tmp_path, n=1)
    with Ledger.open(dsn) as lg:
        lg.start(run, CONTROLLER)
        if state == "paused":
            lg.pause(run, OPERATOR, "maintenance window")
    args = [w.format(run=run) for w in words]
    if len(args) == 1:
        args.append(run)
    before = _events(dsn)
    result = cli(dsn, *args, *(["--reason", "  "] if blank else []))
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: InvalidInput: reason is required"), result.stderr
    assert "Traceback" not in result.stderr
    assert _events(dsn) == before
    ok(dsn, *args, "--reason", "an operator's decision")
    with Ledger.open(dsn) as lg:
        assert lg.audit(limit=10_000)[-1].reason == "an operator's decision"


@pytest.mark.parametrize("command", ["pause", "resume", "cancel", "fail", "compensate"])
def test_help_says_the_reason_is_required(command: str) -> None:
    result = cli("memory://", command, "--help")
    assert result.exit_code == 0
    assert "required" in " ".join(result.stdout.split())
