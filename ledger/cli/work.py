"""`ledger work` (registered on the app of `ledger/cli/app.py`): a worker pool that
processes a run's items with a handler loaded by `MODULE:FUNCTION`."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from ledger.cli.app import (
    JsonOpt,
    RuleBookCommand,
    RunArg,
    _actor,
    _emit_json,
    _ledger,
    _one_command_only,
    app,
)


@app.command(cls=RuleBookCommand)
def work(
    ctx: typer.Context,
    run_id: RunArg,
    handler: Annotated[
        str,
        typer.Option("--handler", metavar="MODULE:FUNCTION", help="Called with each item's Lease"),
    ],
    workers: Annotated[int, typer.Option("--workers", min=1, max=256)] = 4,
    worker_id: Annotated[
        str | None,
        typer.Option(
            "--worker-id",
            metavar="ID",
            help="The worker's id, recorded as the actor of its claims and outcomes "
            "[default: USER@HOST:PID, USER as for --as]",
        ),
    ] = None,
    prefetch: Annotated[
        int | None,
        typer.Option(
            "--prefetch",
            min=1,
            max=100_000,
            help="Leases held at once, queued behind busy threads (at least --workers) "
            "[default: --workers]",
        ),
    ] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Process a run's items with a handler until nothing is left."""
    import socket

    from ledger.cli.progress import watch_run
    from ledger.core.errors import IllegalTransition
    from ledger.worker.worker import Worker

    _one_command_only(ctx, "work")
    if prefetch is not None and prefetch < workers:
        raise typer.BadParameter(
            f"{prefetch} is less than --workers {workers}", param_hint="--prefetch"
        )
    handle = _load_handler(handler)
    actor = _actor(ctx, "work")
    ident = worker_id or f"{actor.id}@{socket.gethostname()}:{os.getpid()}"
    with _ledger(ctx) as lg:
        state = lg.status(run_id).state
        if state == "queued":
            raise IllegalTransition(
                f"run {run_id} is queued: start it first with 'ledger start {run_id}'", state
            )
        worker = Worker(lg, run_id, handle, worker_id=ident, concurrency=workers, prefetch=prefetch)
        try:
            with watch_run(lambda: lg.status(run_id).counts, enabled=not no_progress):
                summary = worker.run()
        except KeyboardInterrupt:
            typer.echo(
                "interrupted: stopped claiming; the outcomes in flight were recorded", err=True
            )
            raise typer.Exit(130) from None
    if as_json:
        _emit_json(summary)
        return
    typer.echo(
        f"worker {summary.worker_id}: claimed {summary.claimed}, accepted {summary.accepted}, "
        f"rejected {summary.rejected}, retryable {summary.retryable}, quarantined "
        f"{summary.quarantined}, lease lost {summary.lease_lost}; stopped: {summary.stopped}; "
        f"run is {summary.run_state}"
    )
    for line in summary.errors:
        typer.echo(f"  not recorded: {line}", err=True)


def _load_handler(spec: str) -> Any:
    import importlib

    from ledger.core.errors import InvalidInput

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidInput(f"--handler must look like module:function, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidInput(f"cannot import handler module {module_name!r}: {e}") from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise InvalidInput(f"module {module_name!r} has no {attr!r}")
    if not callable(target):
        raise InvalidInput(f"handler {spec!r} is not callable")
    return target
