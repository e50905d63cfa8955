"""The read commands (`status`, `runs`, `items`, `attempts`, `history`, `lineage`,
`audit`, `verify`), registered on the app of `ledger/cli/app.py`. Each takes `--json`;
the long ones print page by page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ledger.cli.app import (
    JsonOpt,
    RunArg,
    WideOpt,
    _console,
    _core_feature,
    _emit_json,
    _ledger,
    _parse_time,
    _short,
    _show_run,
    app,
)
from ledger.cli.progress import VerifyProgress
from ledger.cli.values import _one_of, complete_one_of, values_help

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger


@app.command()
def status(
    ctx: typer.Context,
    run_id: RunArg,
    at: Annotated[
        str | None,
        typer.Option("--at", metavar="TIME", help="The status as accepted at TIME (ISO 8601)"),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """A run's accepted state: counts, summary, what it waits on."""
    when = _parse_time(at)
    with _ledger(ctx) as lg, _core_feature("status --at"):
        result = lg.status(run_id) if when is None else lg.status_at(run_id, when)
    _show_run(result, as_json)


@app.command()
def runs(
    ctx: typer.Context,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="STATE",
            callback=_one_of("run"),
            help=values_help("run", "Only runs in this state"),
            autocompletion=complete_one_of("run"),
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1)] = 100,
    wide: WideOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Runs, newest first."""
    with _ledger(ctx) as lg:
        result = lg.runs(state=state, limit=limit)
    if as_json:
        _emit_json(result)
        return
    from ledger.cli.render import show_runs

    show_runs(_console(wide), result, short=_short(wide))


PageLimitOpt = Annotated[
    int | None,
    typer.Option("--limit", min=1, max=10_000, help="One page of N (default: every page)"),
]
JsonlOpt = Annotated[bool, typer.Option("--jsonl", help="One JSON object per line")]


def _formats(as_json: bool, as_jsonl: bool) -> None:
    if as_json and as_jsonl:
        raise typer.BadParameter("give --json or --jsonl, not both")


@app.command()
def items(
    ctx: typer.Context,
    run_id: RunArg,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="STATE",
            callback=_one_of("item"),
            help=values_help("item", "Only items in this state"),
            autocompletion=complete_one_of("item"),
        ),
    ] = None,
    limit: PageLimitOpt = None,
    after: Annotated[
        str | None, typer.Option("--after", metavar="ITEM", help="Only items after this one")
    ] = None,
    wide: WideOpt = False,
    as_json: JsonOpt = False,
    as_jsonl: JsonlOpt = False,
) -> None:
    """A run's items in manifest order, printed page by page as they are read."""
    _formats(as_json, as_jsonl)
    from ledger.cli.pages import emit_pages
    from ledger.cli.render import show_items
    from ledger.reads import paging

    with _ledger(ctx) as lg:
        emit_pages(
            paging.iter_items(lg.store, run_id, state=state, limit=limit, after=after),
            as_json=as_json,
            as_jsonl=as_jsonl,
            show=lambda page: show_items(_console(wide), page, short=_short(wide)),
            limit=limit,
            cursor=lambda i: str(i.item_id),
        )


@app.command()
def attempts(
    ctx: typer.Context,
    run_id: RunArg,
    item: Annotated[str | None, typer.Option("--item", metavar="ITEM")] = None,
    limit: PageLimitOpt = None,
    after: Annotated[
        str | None,
        typer.Option(
            "--after", metavar="ITEM:ATTEMPT", help="Only attempts after this one (oldest first)"
        ),
    ] = None,
    wide: WideOpt = False,
    as_json: JsonOpt = False,
    as_jsonl: JsonlOpt = False,
) -> None:
    """Every attempt of a run's items (or of one item), printed page by page."""
    _formats(as_json, as_jsonl)
    from ledger.cli.pages import emit_pages
    from ledger.cli.render import show_attempts
    from ledger.reads import paging

    with _ledger(ctx) as lg:
        first = emit_pages(
            paging.iter_attempts(lg.store, run_id, item_id=item, limit=limit, after=after),
            as_json=as_json,
            as_jsonl=as_jsonl,
            show=lambda page: show_attempts(_console(wide), page, short=_short(wide)),
            limit=limit,
            cursor=lambda a: f"{a.item_id}:{a.attempt}",
        )
        if after is None:
            _say_if_archived(lg, run_id, first)


def _say_if_archived(lg: Ledger, run_id: str, result: list[Any]) -> None:
    """An archived run's history and attempts are in its archive file: say where (stderr)."""
    if not result:
        record = lg.archived(run_id)
        if record is not None:
            typer.echo(
                f"run {run_id} is archived: its {record['events']} events are in "
                f"{record['archive']} (sha256 {record['archive_sha256']}); "
                f"`ledger restore {record['archive']}` brings them back",
                err=True,
            )


@app.command()
def history(
    ctx: typer.Context,
    run_id: RunArg,
    limit: PageLimitOpt = None,
    after: Annotated[
        int | None,
        typer.Option(
            "--after", metavar="POSITION", min=0, help="Only transitions after this position"
        ),
    ] = None,
    wide: WideOpt = False,
    as_json: JsonOpt = False,
    as_jsonl: JsonlOpt = False,
) -> None:
    """Every run and item transition of a run, in order, printed page by page."""
    _formats(as_json, as_jsonl)
    from ledger.cli.pages import emit_pages
    from ledger.cli.render import show_transitions
    from ledger.reads import paging

    title = f"history of run {run_id}"
    with _ledger(ctx) as lg:
        first = emit_pages(
            paging.iter_history(lg.store, run_id, limit=limit, after=after),
            as_json=as_json,
            as_jsonl=as_jsonl,
            show=lambda page: show_transitions(
                _console(wide), page, title=title, short=_short(wide)
            ),
            limit=limit,
            cursor=lambda t: str(t.position),
        )
        if after is None:
            _say_if_archived(lg, run_id, first)


@app.command()
def lineage(
    ctx: typer.Context, run_id: RunArg, wide: WideOpt = False, as_json: JsonOpt = False
) -> None:
    """The runs linked to a run (retries, repairs, compensations), root first."""
    with _ledger(ctx) as lg:
        result = lg.lineage(run_id)
    if as_json:
        _emit_json(result)
        return
    from ledger.cli.render import show_runs

    show_runs(_console(wide), result, title=f"lineage of run {run_id}", short=_short(wide))


@app.command()
def audit(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run", metavar="RUN")] = None,
    actor: Annotated[str | None, typer.Option("--actor", metavar="ACTOR_ID")] = None,
    role: Annotated[
        str | None,
        typer.Option(
            "--role",
            metavar="ROLE",
            callback=_one_of("role"),
            help=values_help("role", "Only transitions made in this role"),
            autocompletion=complete_one_of("role"),
        ),
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="STATE",
            callback=_one_of("state"),
            help=values_help("state", "The state entered"),
            autocompletion=complete_one_of("state"),
        ),
    ] = None,
    since: Annotated[str | None, typer.Option("--since", metavar="TIME")] = None,
    until: Annotated[str | None, typer.Option("--until", metavar="TIME")] = None,
    newest_first: Annotated[bool, typer.Option("--newest-first")] = False,
    after: Annotated[
        int | None,
        typer.Option("--after", metavar="POSITION", help="Only transitions after this position"),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1)] = None,
    wide: WideOpt = False,
    as_json: JsonOpt = False,
    as_jsonl: Annotated[bool, typer.Option("--jsonl", help="One JSON object per line")] = False,
) -> None:
    """Transitions across runs, filtered by run, actor, role, state and time."""
    if as_json and as_jsonl:
        raise typer.BadParameter("give --json or --jsonl, not both")
    start_at, end_at = _parse_time(since), _parse_time(until)
    with _ledger(ctx) as lg:
        found = lg.iter_audit(
            run_id=run,
            actor=actor,
            role=role,
            state=state,
            since=start_at,
            until=end_at,
            newest_first=newest_first,
            after=after,
            limit=limit,
        )
        if as_jsonl:
            for transition in found:  # streamed: the audit log can be long
                typer.echo(json.dumps(transition.to_dict(), ensure_ascii=False))
            return
        result = list(found)
    if as_json:
        _emit_json(result)
        return
    from ledger.cli.render import show_transitions

    show_transitions(_console(wide), result, title="audit", with_run=True, short=_short(wide))


@app.command()
def verify(
    ctx: typer.Context,
    heads: Annotated[
        bool,
        typer.Option(
            "--heads",
            help="Also print the digest of every stream's head: keep it elsewhere to "
            "detect a history rewritten wholesale",
        ),
    ] = False,
    as_json: JsonOpt = False,
    no_progress: Annotated[bool, typer.Option("--no-progress")] = False,
    checkpoint: Annotated[
        list[Path] | None,
        typer.Option("--checkpoint", help="Also check against this signed checkpoint file"),
    ] = None,
    vkey: Annotated[
        list[Path] | None,
        typer.Option("--vkey", help="A verifier key file the checkpoints must be signed by"),
    ] = None,
) -> None:
    """Replay every event and check the rules, hash chains and projections (exit 1 on problems)."""
    from ledger.cli.checkpoint import read_checkpoint_args

    checkpoints, vkeys = read_checkpoint_args(checkpoint, vkey)
    with _ledger(ctx) as lg, _core_feature("verify"):
        report = lg.verify(
            None if no_progress else VerifyProgress(lambda line: typer.echo(line, err=True)),
            checkpoints=checkpoints,
            vkeys=vkeys,
        )
    if as_json:
        _emit_json(report)
    else:
        from ledger.cli.render import show_verify

        show_verify(_console(), report)
        if heads:
            typer.echo(f"heads {report.heads}")
    if not report.ok:
        raise typer.Exit(1)
