"""`ledger export`, `import`, `copy`, `archive` and `restore` (registered on the app by
`ledger/cli/entry.py`): moving the record between stores and into verified archives."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ledger.cli.app import (
    JsonOpt,
    _actor,
    _emit_json,
    _ledger,
    _one_command_only,
    _parse_time,
    app,
)
from ledger.cli.progress import RebuildProgress

if TYPE_CHECKING:
    from ledger.transfer.exports import TransferSummary

NoProgress = Annotated[bool, typer.Option("--no-progress", help="No progress bar on stderr")]


@contextmanager
def _progress(enabled: bool, label: str) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    with RebuildProgress.on_stderr() as bar:
        bar.label = label
        yield bar


@app.command("export")
def export_cmd(
    ctx: typer.Context,
    run: Annotated[
        list[str] | None, typer.Option("--run", metavar="RUN", help="Only this run (repeatable)")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", metavar="TIME", help="Only events recorded at or after TIME"),
    ] = None,
    to: Annotated[
        Path | None, typer.Option("--to", metavar="FILE", help="Write here [default: stdout]")
    ] = None,
    no_progress: NoProgress = False,
) -> None:
    """Write the events (with their hashes, then the stream heads) as JSON lines."""
    from ledger.transfer.exports import export

    _one_command_only(ctx, "export")
    with _ledger(ctx) as lg, _progress(not no_progress, "export: events") as bar:
        if to is None:
            summary = export(lg, sys.stdout, runs=run, since=_parse_time(since), progress=bar)
        else:
            with open(to, "w", encoding="utf-8") as out:
                summary = export(lg, out, runs=run, since=_parse_time(since), progress=bar)
    typer.echo(
        f"exported {summary.events} events of {summary.streams} streams; heads {summary.digest}",
        err=True,
    )


@app.command("import")
def import_cmd(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(metavar="FILE", help="A history file, or - for stdin")],
    no_verify: Annotated[
        bool, typer.Option("--no-verify", help="Skip the verify that follows the import")
    ] = False,
    as_json: JsonOpt = False,
    no_progress: NoProgress = False,
) -> None:
    """Check a history file, append its events with their hashes, project them, verify."""
    from ledger.transfer.imports import import_file

    _one_command_only(ctx, "import")
    source: Any = sys.stdin if file == "-" else Path(file)
    with _ledger(ctx) as lg, _progress(not no_progress, "import: events") as bar:
        summary = import_file(lg, source, progress=bar, verify=not no_verify)
    _show(summary, as_json, "imported")


@app.command("copy")
def copy_cmd(
    ctx: typer.Context,
    source: Annotated[str, typer.Option("--from", metavar="DSN", help="The ledger to copy")],
    target: Annotated[str, typer.Option("--to", metavar="DSN", help="The ledger to copy into")],
    no_verify: Annotated[bool, typer.Option("--no-verify")] = False,
    as_json: JsonOpt = False,
    no_progress: NoProgress = False,
) -> None:
    """Copy every event of one ledger into another (export piped into import), then verify."""
    from ledger.service.copy import copy_ledger

    _one_command_only(ctx, "copy")
    if no_progress:
        summary = copy_ledger(source, target, verify=not no_verify)
    else:
        bars: dict[str, RebuildProgress] = {}

        def progress(stage: str, done: int, total: int) -> None:
            # one line-mode reporter per stage: each counts its own rate from its start
            if stage not in bars:
                label = "copy: exported" if stage == "export" else "copy: imported"
                bars[stage] = RebuildProgress(
                    write=lambda line: typer.echo(line, err=True), label=label
                )
            bars[stage](done, total)

        summary = copy_ledger(source, target, progress=progress, verify=not no_verify)
    _show(summary, as_json, "copied")


def _show(summary: TransferSummary, as_json: bool, verb: str) -> None:
    if as_json:
        _emit_json(summary)
    else:
        typer.echo(
            f"{verb} {summary.events} events of {len(summary.runs)} runs "
            f"({summary.skipped} already held); heads {summary.digest}"
        )
        if summary.verify_ok is not None:
            typer.echo(
                "verify: ok"
                if summary.verify_ok
                else f"verify: {len(summary.problems)} problem(s); run `ledger verify`"
            )
    if summary.verify_ok is False:
        raise typer.Exit(1)


def _checkpoints() -> Any:
    """Fault injection for the crash tests: LEDGER_ARCHIVE_KILL_AT=N kills this process
    (SIGKILL) at the archiver's N-th checkpoint."""
    import os
    import signal

    target = int(os.environ.get("LEDGER_ARCHIVE_KILL_AT", "0") or 0)
    seen = [0]

    def checkpoint(point: str) -> None:
        seen[0] += 1
        if seen[0] == target:
            os.kill(os.getpid(), signal.SIGKILL)

    return checkpoint


@app.command("archive")
def archive_cmd(
    ctx: typer.Context,
    to: Annotated[Path, typer.Option("--to", metavar="FILE", help="The archive file")],
    terminal_before: Annotated[
        str | None,
        typer.Option("--terminal-before", metavar="DATE", help="Runs terminal since before DATE"),
    ] = None,
    run: Annotated[
        list[str] | None, typer.Option("--run", metavar="RUN", help="This run (repeatable)")
    ] = None,
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation")] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Archive even while followers or webhooks have not passed the runs "
            "(needs --reason, recorded in each Archived event)",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Move the events of old terminal runs into a verified archive file; one Archived
    event per run stays in the chain (operator role). Refused while a follower or webhook
    has not passed the runs' transitions, unless --force with --reason."""
    from ledger.transfer.archive import archive

    _one_command_only(ctx, "archive")
    before = _parse_time(terminal_before)
    with _ledger(ctx) as lg:
        actor = _actor(ctx, "archive")
        if not yes and not to.exists():
            from ledger.transfer.archive import _choose

            chosen = _choose(lg, before, run)
            if chosen and not typer.confirm(
                f"archive the events of {len(chosen)} run(s) to {to} and remove them from "
                "the store?",
                err=True,
            ):
                raise typer.Abort()
        summary = archive(
            lg,
            actor,
            to,
            terminal_before=before,
            runs=run,
            reason=reason,
            checkpoint=_checkpoints(),
            force=force,
        )
    if as_json:
        _emit_json(summary)
        return
    typer.echo(
        f"archived {len(summary.runs)} run(s), {summary.events} events removed from the store, "
        f"to {summary.archive} (sha256 {summary.sha256 or '-'})"
        + (f"; finished {len(summary.resumed)} interrupted" if summary.resumed else "")
    )


@app.command("restore")
def restore_cmd(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(metavar="FILE", help="An archive file")],
    as_json: JsonOpt = False,
) -> None:
    """Bring archived runs back from their archive file, after proving it holds the
    events that left (operator role)."""
    from ledger.transfer.archive import restore

    _one_command_only(ctx, "restore")
    with _ledger(ctx) as lg:
        summary = restore(lg, _actor(ctx, "restore"), file)
    if as_json:
        _emit_json(summary)
        return
    typer.echo(
        f"restored {len(summary.runs)} run(s), {summary.events} events from {summary.archive} "
        f"(sha256 {summary.sha256})"
    )
