"""The feed's commands: `ledger events`, `ledger followers`, `ledger webhooks`.

Registered on the `ledger` app (ledger/cli/app.py) when ledger/cli/entry.py imports it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from ledger.cli.app import JsonOpt, _emit_json, _ledger, app

if TYPE_CHECKING:
    from ledger.core.views import Transition

followers_app = typer.Typer(
    cls=TyperGroup,
    invoke_without_command=True,
    help="Follower checkpoints: name, position, lag; reset one.",
)
webhooks_app = typer.Typer(cls=TyperGroup, no_args_is_help=True, help="Webhooks (signed POSTs).")
app.add_typer(followers_app, name="followers")
app.add_typer(webhooks_app, name="webhooks")

KindOpt = Annotated[
    list[str] | None,
    typer.Option("--kind", metavar="KIND", help="A command or a state entered (repeatable)"),
]
RunOpt = Annotated[str | None, typer.Option("--run", metavar="RUN")]
JsonlOpt = Annotated[bool, typer.Option("--jsonl", help="One JSON object per line")]


def _line(t: Transition) -> str:
    item = t.item_id if t.item_id is not None else "(run)"
    reason = f"  {t.reason}" if t.reason else ""
    return (
        f"{t.position:>8}  {t.at.isoformat(timespec='seconds')}  {t.run_id}  {item}  "
        f"{t.command}: {t.from_state} -> {t.to_state}  {t.actor_id}:{t.role}{reason}"
    )


@app.command()
def events(
    ctx: typer.Context,
    after: Annotated[
        int, typer.Option("--after", metavar="POSITION", help="Start after this position")
    ] = 0,
    run: RunOpt = None,
    kind: KindOpt = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Print new transitions as they commit")
    ] = False,
    as_jsonl: JsonlOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """The change feed: every transition after a position, in position order; with
    --follow, new ones as they commit, until Ctrl-C. `--json`: the transitions up to now
    as one JSON document (a list); `--jsonl`: one JSON object per line (also with
    --follow)."""
    from ledger.reads.feed import FeedFilter, Waiter, check_position, page

    with _ledger(ctx) as lg:
        cursor = check_position(after)
        flt = FeedFilter.of(run, kind)
        lg.events(after=cursor, run_id=run, kinds=kind, limit=1)  # validates, RunNotFound
        if as_json:
            if follow:
                raise typer.BadParameter("--json is one document; use --jsonl with --follow")
            everything: list[Transition] = []
            while True:
                with lg.store.read() as tx:
                    found, cursor = page(tx, cursor, flt, 1000)
                everything.extend(found)
                if len(found) < 1000:
                    break
            _emit_json(everything)
            return
        waiter = Waiter(lg.store)
        try:
            while True:
                with lg.store.read() as tx:
                    found, cursor = page(tx, cursor, flt, 1000)
                for t in found:
                    text = json.dumps(t.to_dict(), ensure_ascii=False) if as_jsonl else _line(t)
                    typer.echo(text)
                sys.stdout.flush()
                if len(found) == 1000:
                    continue
                if not follow:
                    return
                waiter.wait(cursor, 5.0)
        except KeyboardInterrupt:
            return
        finally:
            waiter.close()


@followers_app.callback()
def followers_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every follower: name, position, lag in transitions and seconds."""
    if ctx.invoked_subcommand is not None:
        return
    from ledger.feed.follower import followers

    with _ledger(ctx) as lg:
        found = followers(lg)
    if as_json:
        _emit_json(found)
        return
    if not found:
        typer.echo("no followers")
        return
    typer.echo(f"{'name':<30} {'position':>10} {'lag':>8} {'lag s':>8}  filter")
    for f in found:
        what = " ".join(
            ([f"run={f.run_id}"] if f.run_id else [])
            + ([f"kinds={','.join(f.kinds)}"] if f.kinds else [])
        )
        typer.echo(f"{f.name:<30} {f.position:>10} {f.lag:>8} {f.lag_seconds:>8.1f}  {what}")


@followers_app.command("reset")
def followers_reset(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME")],
    to: Annotated[int, typer.Option("--to", metavar="POSITION", help="New checkpoint")] = 0,
) -> None:
    """Set a (stopped) follower's checkpoint: it is handed everything after it again."""
    from ledger.feed.follower import reset

    with _ledger(ctx) as lg:
        position = reset(lg, name, to)
    typer.echo(f"follower {name} reset to position {position}")


def _show(rows: list[Any], as_json: bool) -> None:
    if as_json:
        _emit_json(rows)
        return
    for row in rows:
        typer.echo("  ".join("" if v is None else str(v) for v in row.to_dict().values()))


def _read_secret(path: Path | None) -> str | None:
    from ledger.core.errors import InvalidInput

    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInput(f"cannot read the secret file {str(path)!r}: {e}") from e


def _show_hook(hook: Any, as_json: bool, what: str) -> None:
    if as_json:
        _emit_json(hook)
        return
    typer.echo(f"webhook {hook.webhook_id} {what} -> {hook.url}")
    if hook.secret is not None:
        typer.echo(f"signing secret (shown this once; keep it now): {hook.secret}")


SecretFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--secret-file",
        metavar="F",
        help="The signing secret (whsec_<base64>, as Standard Webhooks); "
        "without it the ledger makes one and prints it once",
    ),
]
AllowHostOpt = Annotated[
    str | None,
    typer.Option(
        "--allow-host",
        metavar="HOST",
        help="Allow the URL's host to resolve to a loopback, private, link-local or "
        "metadata address (it must be the URL's own host)",
    ),
]
WebhookReasonOpt = Annotated[
    str, typer.Option("--reason", help="Why (recorded with the change; required)")
]


@webhooks_app.command("add")
def webhooks_add(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(metavar="URL")],
    reason: WebhookReasonOpt,
    secret_file: SecretFileOpt = None,
    run: RunOpt = None,
    kind: KindOpt = None,
    allow_http: Annotated[
        bool, typer.Option("--allow-http", help="Allow a plain http:// URL")
    ] = False,
    allow_host: AllowHostOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Deliver every (matching) transition to URL as a signed POST (operator role). The
    URL must be https:// to a host whose addresses are public, unless --allow-http or
    --allow-host say otherwise. The secret is stored encrypted (LEDGER_WEBHOOK_KEYS)."""
    from ledger.cli.app import _actor
    from ledger.feed.webhooks import add_webhook

    secret = _read_secret(secret_file)
    with _ledger(ctx) as lg:
        hook = add_webhook(
            lg,
            _actor(ctx, "webhooks add"),
            url,
            reason=reason,
            secret=secret,
            run_id=run,
            kinds=kind,
            allow_http=allow_http,
            allow_host=allow_host,
        )
    _show_hook(hook, as_json, "added")


@webhooks_app.command("change")
def webhooks_change(
    ctx: typer.Context,
    webhook_id: Annotated[str, typer.Argument(metavar="WEBHOOK_ID")],
    reason: WebhookReasonOpt,
    url: Annotated[str | None, typer.Option("--url", metavar="URL", help="A new URL")] = None,
    rotate_secret: Annotated[
        bool,
        typer.Option(
            "--rotate-secret", help="A new signing secret, made by the ledger and printed once"
        ),
    ] = False,
    secret_file: Annotated[
        Path | None,
        typer.Option("--secret-file", metavar="F", help="A new signing secret, from a file"),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            metavar="SECONDS",
            help="How long the replaced secret still signs (beside the new one)",
        ),
    ] = 86_400.0,
    allow_http: Annotated[
        bool | None,
        typer.Option("--allow-http/--no-allow-http", help="Allow a plain http:// URL, or not"),
    ] = None,
    allow_host: AllowHostOpt = None,
    no_allow_host: Annotated[
        bool, typer.Option("--no-allow-host", help="Take the allowed host back")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Change a webhook's URL or policy, or rotate its signing secret (operator role)."""
    from ledger.cli.app import _actor
    from ledger.feed.webhooks import change_webhook

    changes: dict[str, Any] = {}
    if allow_host is not None and no_allow_host:
        raise typer.BadParameter("give --allow-host or --no-allow-host, not both")
    if allow_host is not None or no_allow_host:
        changes["allow_host"] = None if no_allow_host else allow_host
    with _ledger(ctx) as lg:
        hook = change_webhook(
            lg,
            _actor(ctx, "webhooks change"),
            webhook_id,
            reason=reason,
            url=url,
            allow_http=allow_http,
            rotate_secret=rotate_secret,
            secret=_read_secret(secret_file),
            grace_seconds=grace,
            **changes,
        )
    _show_hook(hook, as_json, "changed")


@webhooks_app.command("list")
def webhooks_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every webhook, with its follower's position and its secret's fingerprint."""
    from ledger.feed.webhooks import list_webhooks

    with _ledger(ctx) as lg:
        _show(list_webhooks(lg), as_json)


@webhooks_app.command("remove")
def webhooks_remove(
    ctx: typer.Context,
    webhook_id: Annotated[str, typer.Argument(metavar="WEBHOOK_ID")],
    reason: WebhookReasonOpt,
) -> None:
    """Stop delivering to a webhook (operator role; its delivery records are kept)."""
    from ledger.cli.app import _actor
    from ledger.feed.webhooks import remove_webhook

    with _ledger(ctx) as lg:
        remove_webhook(lg, _actor(ctx, "webhooks remove"), webhook_id, reason=reason)
    typer.echo(f"webhook {webhook_id} removed")


@webhooks_app.command("changes")
def webhooks_changes(
    ctx: typer.Context,
    webhook_id: Annotated[str | None, typer.Option("--webhook", metavar="WEBHOOK_ID")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10000)] = 100,
    as_json: JsonOpt = False,
) -> None:
    """Who added, changed, rotated, re-encrypted and removed webhooks, when and why."""
    from ledger.feed.webhooks import webhook_changes

    with _ledger(ctx) as lg:
        _show(webhook_changes(lg, webhook_id=webhook_id, limit=limit), as_json)


@webhooks_app.command("rekey")
def webhooks_rekey(ctx: typer.Context, reason: WebhookReasonOpt) -> None:
    """Encrypt every stored secret with the first key of LEDGER_WEBHOOK_KEYS (after a key
    rotation; operator role). Then the old key may be dropped."""
    from ledger.cli.app import _actor
    from ledger.feed.webhooks import rekey_webhooks

    with _ledger(ctx) as lg:
        n = rekey_webhooks(lg, _actor(ctx, "webhooks rekey"), reason=reason)
    typer.echo(f"{n} webhook secret(s) encrypted with the first key")


@webhooks_app.command("keygen")
def webhooks_keygen() -> None:
    """Print a new key for LEDGER_WEBHOOK_KEYS (or the LEDGER_WEBHOOK_KEY_FILE file)."""
    from ledger.feed.webhook_secrets import new_key

    typer.echo(new_key())


@webhooks_app.command("deliveries")
def webhooks_deliveries(
    ctx: typer.Context,
    webhook_id: Annotated[str | None, typer.Option("--webhook", metavar="WEBHOOK_ID")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10000)] = 100,
    as_json: JsonOpt = False,
) -> None:
    """Delivery attempts, newest first: status, time, error."""
    from ledger.feed.webhooks import deliveries

    with _ledger(ctx) as lg:
        _show(deliveries(lg, webhook_id=webhook_id, limit=limit), as_json)


@webhooks_app.command("run")
def webhooks_run(ctx: typer.Context) -> None:
    """Deliver to every webhook until Ctrl-C (`ledger serve` does this too)."""
    from ledger.feed.webhooks import Dispatcher

    with _ledger(ctx) as lg:
        dispatcher = Dispatcher(lg)
        try:
            dispatcher.run()
        except KeyboardInterrupt:
            dispatcher.stop()
