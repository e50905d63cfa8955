"""Maintenance commands (`projections rebuild|checksums`, `keys prune`), the HTTP
server (`serve`, a thin wrapper over ledger/http; tokens: tokens.py) and the `demo`,
registered on the app of `ledger/cli/app.py`."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from ledger.cli.app import (
    JsonOpt,
    _core_feature,
    _emit_json,
    _globals,
    _ledger,
    _one_command_only,
    _refuse_key,
    app,
    keys_app,
    projections_app,
)
from ledger.cli.progress import RebuildProgress, duration


@projections_app.command("rebuild")
def projections_rebuild(
    ctx: typer.Context,
    no_progress: Annotated[bool, typer.Option("--no-progress")] = False,
) -> None:
    """Drop every projection and rebuild it from the events."""
    import time

    started = time.monotonic()
    with _ledger(ctx) as lg, _core_feature("projections rebuild"):
        if no_progress:
            replayed = lg.rebuild_projections()
        else:
            with RebuildProgress.on_stderr() as progress:
                replayed = lg.rebuild_projections(progress=progress)
    seconds = time.monotonic() - started
    typer.echo(f"projections rebuilt from {replayed} events in {duration(seconds)}")


@keys_app.command("prune")
def keys_prune(
    ctx: typer.Context,
    older_than: Annotated[
        float,
        typer.Option(
            "--older-than",
            metavar="DAYS",
            min=0,
            max=365_000,
            help="Forget keys recorded more than DAYS ago",
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Forget old idempotency keys (a repeat with a forgotten key is a new command)."""
    _refuse_key(ctx, "--idempotency-key applies to commands, not to keys prune")
    with _ledger(ctx) as lg:
        removed = lg.prune_idempotency_keys(timedelta(days=older_than))
    if as_json:
        _emit_json({"removed": removed})
    else:
        typer.echo(f"{removed} idempotency key(s) older than {older_than:g} day(s) forgotten")


@projections_app.command("checksums")
def projections_checksums(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Row count and checksum of each live projection table (equal tables, equal checksums,
    on any store): compare before and after a rebuild, or two ledgers."""
    from ledger.projections.checksums import checksums

    with _ledger(ctx) as lg, lg.store.read() as tx:
        found = checksums(tx)
    if as_json:
        _emit_json(found)
        return
    for table, value in found.items():
        rows, digest = value.split(":")
        typer.echo(f"{table:<15} {int(rows):>10,} rows  {digest}")


# -- the HTTP API (ledger/http): a thin wrapper over its serve(); tokens: tokens.py --


@app.command()
def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8080,
    tokens: Annotated[
        Path | None,
        typer.Option(
            "--tokens", metavar="PATH", help="[default: $LEDGER_TOKENS, else ./ledger.tokens]"
        ),
    ] = None,
    public_reads: Annotated[
        bool, typer.Option("--public-reads", help="Reads need no token")
    ] = False,
    checkpoint_key: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint-key",
            metavar="FILE",
            help="Sign GET /checkpoint with this key [default: $LEDGER_CHECKPOINT_KEY, the key's text]",
        ),
    ] = None,
) -> None:
    """Serve the HTTP API and the operator page until interrupted."""
    from ledger.http.serve import serve as serve_http

    _one_command_only(ctx, "serve (clients send an Idempotency-Key header per request)")
    serve_http(
        _globals(ctx).dsn,
        host=host,
        port=port,
        tokens_path=tokens,
        public_reads=public_reads,
        checkpoint_key=None if checkpoint_key is None else _key_text(checkpoint_key),
        create=False,  # a mistyped --dsn is refused, as by every command that only reads
        announce=lambda line: typer.echo(line, err=True),
    )


def _key_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        typer.echo(f"error: cannot read the key file {path}: {e.strerror}", err=True)
        raise typer.Exit(2) from None


# -- the demo -------------------------------------------------------------------


@app.command()
def demo(
    ctx: typer.Context,
    items: Annotated[
        int, typer.Option("--items", min=4, max=5000, help="Items per scenario run")
    ] = 20,
    workers: Annotated[int, typer.Option("--workers", min=1, max=64)] = 4,
    seed: Annotated[int, typer.Option("--seed")] = 7,
    as_json: JsonOpt = False,
) -> None:
    """Run five seeded scenarios end to end and show what the ledger recorded."""
    from ledger.cli.demo import run_demo

    _one_command_only(ctx, "demo")
    run_demo(_globals(ctx).dsn, items=items, workers=workers, seed=seed, as_json=as_json)


# export, import, copy, archive, restore; top; the change feed (events, followers,
