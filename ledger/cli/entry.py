"""The `ledger` command: a thin entry point over `Ledger`.

Global options (`--dsn`, `--as ID:ROLE`) go before the subcommand, and are also
accepted after it. Read commands take `--json` (one JSON document). Exit codes: 0 ok,
1 a ledger error (one line on stderr: `error: <Type>: <message>`), 2 bad usage (a
missing file, an unknown state, a flag that does not apply...). Only the commands in
`CREATES` (and `demo`) create a SQLite file that is missing; the others say it is.

Start-up is kept short: the service, rich and the worker are imported inside the
commands that need them, and `main` builds only the command being run.

The app, its global options and error handling are in `app.py`; the commands, by
job, in `runs.py` (writes), `work.py`, `reads.py`, `admin.py`,
`feed.py`, `tokens.py`, `top.py` and `transfer.py`, imported below in
the order `ledger --help` lists them. This module keeps the names other code imports
from `ledger.cli.entry`.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence

import typer

# The commands register themselves on `app` when imported, in the order of the help.
# isort: off
from ledger.cli import runs as cli_runs
from ledger.cli import work as cli_work
from ledger.cli import reads as cli_reads
from ledger.cli import admin as cli_admin
from ledger.cli import feed as cli_feed
from ledger.cli import tokens as cli_tokens
from ledger.cli import top as cli_top
from ledger.cli import transfer as cli_transfer
from ledger.cli import checkpoint as cli_checkpoint

# isort: on
from ledger.cli.app import (
    _GLOBAL_OPTIONS,
    CREATES,
    DEFAULT_ROLES,
    ItemArg,
    JsonOpt,
    ReasonOpt,
    RunArg,
    WideOpt,
    _actor,
    _emit_json,
    _hoist_global_options,
    _ledger,
    _one_command_only,
    _parse_time,
    _refuse_key,
    _silence_stdout,
    app,
    default_actor_id,
    keys_app,
    projections_app,
    token_app,
)
from ledger.cli.progress import RebuildProgress, VerifyProgress

__all__ = [
    "CREATES",
    "DEFAULT_ROLES",
    "ItemArg",
    "JsonOpt",
    "ReasonOpt",
    "RebuildProgress",
    "RunArg",
    "VerifyProgress",
    "WideOpt",
    "_actor",
    "_emit_json",
    "_ledger",
    "_one_command_only",
    "_parse_time",
    "_refuse_key",
    "app",
    "cli_admin",
    "cli_checkpoint",
    "cli_feed",
    "cli_reads",
    "cli_runs",
    "cli_tokens",
    "cli_top",
    "cli_transfer",
    "cli_work",
    "default_actor_id",
    "keys_app",
    "main",
    "projections_app",
    "token_app",
]


def _command_name(args: Sequence[str]) -> str | None:
    """The subcommand named in `args` (global options skipped), if any."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _GLOBAL_OPTIONS:
            i += 2
            continue
        if arg.startswith("-"):
            return None  # --help and the like: the full app answers
        return arg
    return None


def _lean_app(args: Sequence[str]) -> typer.Typer:
    """The app with only the command being run: typer inspects every command's signature
    when it builds the CLI, which would cost ~80 ms per call for commands never used."""
    name = _command_name(_hoist_global_options(args))
    for info in app.registered_commands:
        callback = info.callback
        if (
            name is not None
            and callback is not None
            and name == (info.name or callback.__name__.replace("_", "-"))
        ):
            lean = copy.copy(app)
            lean.registered_commands = [info]
            lean.registered_groups = []
            return lean
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    code: int = 0
    try:
        _lean_app(args)(args=args, prog_name="ledger", standalone_mode=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    try:
        sys.stdout.flush()  # here, not at exit, where a closed pipe prints a warning
    except BrokenPipeError:
        _silence_stdout()
    return code


if __name__ == "__main__":
    sys.exit(main())
