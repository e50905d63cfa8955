"""The `ledger` command: a thin entry point over `Ledger`.

Global options (`--dsn`, `--as ID:ROLE`) go before the subcommand, and are also
accepted after it. Read commands take `--json` (one JSON document). Exit codes: 0 ok,
1 a ledger error (one line on stderr: `error: <Type>: <message>`), 2 bad usage (a
missing file, an unknown state, a flag that does not apply...). Only the commands in
`CREATES` (and `demo`) create a SQLite file that is missing; the others say it is.

Start-up is kept short: the service, rich and the worker are imported inside the
commands that need them, and `main` builds only the command being run.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

# re-exported: the other command modules and the tests take them from here
from .cli_progress import RebuildProgress as RebuildProgress
from .cli_progress import VerifyProgress as VerifyProgress
from .cli_progress import duration

if TYPE_CHECKING:
    from .service import Ledger
    from .views import Actor

_GLOBAL_OPTIONS = ("--dsn", "--as", "--idempotency-key")

# Commands that may create the store (a new SQLite file); any other command on a
# missing file says so and exits 1, so a typo in --dsn never leaves an empty ledger.
CREATES = frozenset({"submit", "import"})

# The role each command acts in unless --as names one.
DEFAULT_ROLES: dict[str, str] = {
    "submit": "submitter",
    "amend": "submitter",
    "start": "controller",
    "complete": "controller",
    "request-review": "controller",
    "fail": "controller",
    "review": "reviewer",
    "reject-item": "reviewer",
    "pause": "operator",
    "resume": "operator",
    "cancel": "operator",
    "skip": "operator",
    "release": "operator",
    "retry": "operator",
    "repair": "operator",
    "compensate": "operator",
    "reconcile": "reconciler",
    "work": "worker",
}


def _hoist_global_options(args: Sequence[str]) -> list[str]:
    """Move `--dsn X` / `--as X` found after the subcommand to the front (before `--`)."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        if arg in _GLOBAL_OPTIONS and i + 1 < len(args):
            front += [arg, args[i + 1]]
            i += 2
            continue
        if arg.startswith(tuple(f"{o}=" for o in _GLOBAL_OPTIONS)):
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


def _fail(error: BaseException) -> NoReturn:
    message = " ".join(str(error).split()) or type(error).__name__
    typer.echo(f"error: {type(error).__name__}: {message}", err=True)
    raise typer.Exit(1)


class _LedgerGroup(TyperGroup):
    """Accepts global options anywhere and turns ledger errors into one line and exit 1."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        return super().parse_args(ctx, _hoist_global_options(args))

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        from .errors import LedgerError
        from .extras import MissingExtra, missing_extra

        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _silence_stdout()
            raise typer.Exit(0) from None
        except LedgerError as e:
            _fail(e)
        except MissingExtra as e:
            _fail(e)
        except ModuleNotFoundError as e:  # an optional extra's module: name the pip command
            _fail(missing_extra(e) or e)
        except NotImplementedError as e:
            detail = str(e) or "this ledger does not support the command yet"
            _fail(NotImplementedError(detail))
        except (typer.Exit, typer.Abort):
            raise
        except Exception as e:  # a lost connection, an unreadable file...: no traceback
            if _is_usage_error(e) or os.environ.get("LEDGER_DEBUG"):
                raise
            _fail(e)


def _silence_stdout() -> None:
    """The reader of stdout went away (`ledger audit --jsonl | head -1`): that is its
    choice, not an error (exit 0). Later writes, and the flush at exit, go to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _is_usage_error(error: Exception) -> bool:
    # click's exceptions (typer vendors click, so match by shape, not by class)
    return hasattr(error, "exit_code") and hasattr(error, "show")


app = typer.Typer(
    cls=_LedgerGroup,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, pwsh)
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="The durable, auditable record of workflow and batch runs.",
)
projections_app = typer.Typer(cls=TyperGroup, no_args_is_help=True, help="Projection maintenance.")
token_app = typer.Typer(cls=TyperGroup, no_args_is_help=True, help="HTTP API tokens.")
keys_app = typer.Typer(cls=TyperGroup, no_args_is_help=True, help="Idempotency keys.")
app.add_typer(projections_app, name="projections")
app.add_typer(token_app, name="token")
app.add_typer(keys_app, name="keys")


@dataclass
class _Globals:
    dsn: str | None
    actor: str | None
    idempotency_key: str | None = None


def _show_version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"ledger (run-ledger) {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_show_version,
            help="Print the version and exit",
        ),
    ] = False,
    dsn: Annotated[
        str | None,
        typer.Option(
            "--dsn",
            metavar="DSN",
            help="Ledger store: memory://, sqlite:///PATH, postgresql://... "
            "[default: $LEDGER_DSN, else sqlite:///./ledger.db]",
        ),
    ] = None,
    actor: Annotated[
        str | None,
        typer.Option(
            "--as",
            metavar="ID:ROLE",
            help="Who makes the command [default: $LEDGER_ACTOR, else your OS user name; "
            "the role the command needs]",
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            metavar="KEY",
            help="Repeating the command with the same key returns the first result and "
            "writes nothing (a command, not work/demo/serve)",
        ),
    ] = None,
) -> None:
    """The durable, auditable record of workflow and batch runs."""
    # dsn None: Ledger.open resolves LEDGER_DSN, then the default
    ctx.obj = _Globals(dsn, actor, idempotency_key)


# -- helpers --------------------------------------------------------------------


def _globals(ctx: typer.Context) -> _Globals:
    obj = ctx.find_object(_Globals)
    assert obj is not None
    return obj


@contextmanager
def _ledger(ctx: typer.Context, create: bool | None = None) -> Iterator[Ledger]:
    """The ledger of --dsn; `create` defaults to whether the command is in `CREATES`."""
    from .service import Ledger

    key = _globals(ctx).idempotency_key
    if key is not None:
        from .idempotency import check_key

        check_key(key)  # refused before anything is opened
    if create is None:
        create = ctx.info_name in CREATES
    lg = Ledger.open(_globals(ctx).dsn, create=create)
    try:
        yield lg if key is None else lg.keyed(key)
    finally:
        lg.close()


def _one_command_only(ctx: typer.Context, what: str) -> None:
    """`--idempotency-key` names one command: refused, before anything is done, where many run."""
    _refuse_key(ctx, f"--idempotency-key names one command; {what} makes many")


def _refuse_key(ctx: typer.Context, why: str) -> None:
    """A flag that does not apply to the command is bad usage (exit 2), refused up front."""
    if _globals(ctx).idempotency_key is not None:
        raise typer.BadParameter(why, param_hint="--idempotency-key")


def _actor(ctx: typer.Context, command: str) -> Actor:
    """`--as ID:ROLE`, `--as ID` or `--as :ROLE`; missing parts take the defaults."""
    from .views import Actor

    default_id = default_actor_id()
    default_role = DEFAULT_ROLES.get(command, "operator")
    text = _globals(ctx).actor
    if not text:
        return Actor(default_id, default_role)
    ident, sep, role = text.rpartition(":")
    if not sep:
        ident, role = text, default_role
    from .validation import check_not_reserved

    # a person may not act under the ids the ledger writes itself (`ledger`, ...)
    check_not_reserved(ident or default_id, "--as")
    return Actor(ident or default_id, role or default_role)


def default_actor_id() -> str:
    """`$LEDGER_ACTOR`, else the OS user name: every record names a person, never `cli`."""
    import getpass

    configured = os.environ.get("LEDGER_ACTOR", "").strip()
    if configured:
        return configured
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return f"uid-{os.getuid()}"


def _emit_json(value: Any) -> None:
    typer.echo(json.dumps(_jsonable(value), indent=2, ensure_ascii=False))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _parse_time(text: str | None) -> datetime | None:
    """ISO 8601 (`2026-11-28T10:00:00Z`, a date, or `now`); a naive time is UTC."""
    if text is None:
        return None
    if text.strip().lower() == "now":
        return datetime.now(UTC)
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO 8601 time (e.g. 2026-11-28T10:00:00Z)"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _read_json_file(path: Path, what: str) -> Any:
    from .errors import ManifestInvalid
    from .validation import MAX_MANIFEST_BYTES, strict_loads

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ManifestInvalid(
            f"cannot read {what} file {str(path)!r}: {e.strerror}", field=what
        ) from None
    # strict JSON, as every entry point reads it (ledger.validation)
    return strict_loads(
        data,
        f"{what} file {str(path)!r}",
        MAX_MANIFEST_BYTES + 64 * 1024,
        error=lambda message: ManifestInvalid(message, field=what),
    )


@contextmanager
def _core_feature(what: str) -> Iterator[None]:
    """A read the core may not ship yet: a clean NotImplementedError, not a stack trace."""
    try:
        yield
    except ImportError as e:
        raise NotImplementedError(f"{what} is not available in this build yet ({e})") from None


def _split_ids(text: str | None) -> list[str] | None:
    if text is None:
        return None
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise typer.BadParameter("give at least one item id, separated by commas")
    return ids


def _console(wide: bool = False) -> Any:
    from .render import console

    return console(wide)


def _show_run(status: Any, as_json: bool, verb: str | None = None) -> None:
    if as_json:
        _emit_json(status)
        return
    if verb:
        typer.echo(f"{verb} run {status.run_id}: {status.state} (revision {status.revision})")
    else:
        from .render import show_status

        show_status(_console(), status)


def _show_item(item: Any, as_json: bool) -> None:
    if as_json:
        _emit_json(item)
        return
    extra = f" ({item.reason})" if getattr(item, "reason", None) else ""
    typer.echo(f"item {item.item_id} of run {item.run_id}: {item.state}{extra}")


def _one_of(kind: str) -> Any:
    """An option callback refusing a value outside ledger.states as bad usage (exit 2):
    `kind` is "run" (a run state), "item" (an item state), "state" (either) or "role"."""

    def check(value: str | None) -> str | None:
        from . import states as S

        allowed = {
            "run": S.RUN_STATES,
            "item": S.ITEM_STATES,
            "state": tuple(dict.fromkeys(S.RUN_STATES + S.ITEM_STATES)),
            "role": S.ROLES,
        }[kind]
        if value is not None and value not in allowed:
            what = {"run": "run state", "item": "item state"}.get(kind, kind)
            raise typer.BadParameter(f"unknown {what} {value!r}; one of: {', '.join(allowed)}")
        return value

    return check


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document")]
WideOpt = Annotated[
    bool,
    typer.Option("--wide", help="Full ids and times, rows may wrap (the default in a pipe)"),
]


def _short(wide: bool) -> bool:
    """Tables on a terminal show short ids and keep each row on one line; a pipe (or
    --wide) gets every id in full."""
    return not wide and sys.stdout.isatty()


ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (recorded with the event)")]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="Run id")]
ItemArg = Annotated[str, typer.Argument(metavar="ITEM", help="Item id")]


# -- commands that create or move runs ---------------------------------------------


@app.command()
def submit(
    ctx: typer.Context,
    manifest: Annotated[Path, typer.Argument(metavar="MANIFEST.json", exists=True, dir_okay=False)],
    as_json: JsonOpt = False,
) -> None:
    """Submit a manifest: a new run, queued."""
    from .manifest import parse_manifest

    parsed = parse_manifest(_read_json_file(manifest, "manifest"))
    with _ledger(ctx) as lg:
        status = lg.submit(parsed, _actor(ctx, "submit"))
    _show_run(status, as_json, "submitted")


@app.command()
def start(ctx: typer.Context, run_id: RunArg, as_json: JsonOpt = False) -> None:
    """Start a queued run (controller)."""
    with _ledger(ctx) as lg:
        status = lg.start(run_id, _actor(ctx, "start"))
    _show_run(status, as_json, "started")


@app.command()
def complete(ctx: typer.Context, run_id: RunArg, as_json: JsonOpt = False) -> None:
    """Complete a running run: succeeded or completed_with_errors (controller)."""
    with _ledger(ctx) as lg:
        status = lg.complete(run_id, _actor(ctx, "complete"))
    _show_run(status, as_json, "completed")


_AMEND_KEYS = ("items", "withdraw", "policy")


@app.command()
def amend(
    ctx: typer.Context,
    run_id: RunArg,
    part: Annotated[
        Path,
        typer.Argument(
            metavar="PART.json",
            exists=True,
            dir_okay=False,
            help='{"items": [...], "withdraw": [ids], "policy": {...}}',
        ),
    ],
    reason: ReasonOpt,
    as_json: JsonOpt = False,
) -> None:
    """Amend a run: add or replace items, withdraw item ids, change policy."""
    from .errors import ManifestInvalid

    data = _read_json_file(part, "amendment")
    if isinstance(data, list):
        data = {"items": data}
    if not isinstance(data, dict):
        raise ManifestInvalid(
            "amendment must be a JSON object with items, withdraw or policy", field="amendment"
        )
    unknown = sorted(set(data) - set(_AMEND_KEYS))
    if unknown:
        raise ManifestInvalid(
            f"amendment field {unknown[0]}: unknown key; allowed keys are {', '.join(_AMEND_KEYS)}",
            field=unknown[0],
        )
    if not any(data.get(k) is not None for k in _AMEND_KEYS):
        raise ManifestInvalid(
            "amendment changes nothing; give items, withdraw or policy", field="amendment"
        )
    with _ledger(ctx) as lg:
        status = lg.amend(
            run_id,
            _actor(ctx, "amend"),
            reason,
            items=data.get("items"),
            withdraw=data.get("withdraw"),
            policy=data.get("policy"),
        )
    _show_run(status, as_json, "amended")


@app.command("request-review")
def request_review(
    ctx: typer.Context,
    run_id: RunArg,
    decision: Annotated[str, typer.Option("--decision", help="The decision required")],
    reviewer: Annotated[
        str | None, typer.Option("--reviewer", metavar="ACTOR_ID", help="Route it to this person")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask for a review decision bound to the run's current input version (controller)."""
    with _ledger(ctx) as lg:
        status = lg.request_review(
            run_id, _actor(ctx, "request-review"), decision, reviewer=reviewer
        )
    _show_run(status, as_json, f"review requested ({status.input_version}) for")


@app.command()
def review(
    ctx: typer.Context,
    run_id: RunArg,
    input_version: Annotated[
        str, typer.Option("--input-version", help="The input version you reviewed")
    ],
    reason: ReasonOpt,
    approve: Annotated[
        bool, typer.Option("--approve", help="Approve: the run goes back to running")
    ] = False,
    reject: Annotated[bool, typer.Option("--reject", help="Reject: the run fails")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Decide a review: exactly one of --approve (back to running) or --reject (failed)
    (reviewer)."""
    if approve == reject:
        raise typer.BadParameter("give exactly one of them", param_hint="--approve / --reject")
    with _ledger(ctx) as lg:
        asked = (lg.status(run_id).review or {}).get("decision")
        status = lg.decide(run_id, _actor(ctx, "review"), input_version, approve, reason)
    if as_json:
        _emit_json(status)
        return
    decision = "approved" if approve else "rejected"
    what = f"review {asked!r}" if asked else "the review"
    typer.echo(
        f"{decision} {what} of input {input_version} on run {status.run_id}: "
        f"{status.state} (revision {status.revision})"
    )


@app.command()
def pause(
    ctx: typer.Context,
    run_id: RunArg,
    reason: Annotated[str, typer.Option("--reason")] = "paused from the command line",
    as_json: JsonOpt = False,
) -> None:
    """Pause a running run: pausing until its leases end, then paused (operator)."""
    with _ledger(ctx) as lg:
        status = lg.pause(run_id, _actor(ctx, "pause"), reason)
    _show_run(status, as_json, "paused")


@app.command()
def resume(
    ctx: typer.Context,
    run_id: RunArg,
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Resume a pausing or paused run (operator)."""
    with _ledger(ctx) as lg:
        status = lg.resume(run_id, _actor(ctx, "resume"), reason=reason)
    _show_run(status, as_json, "resumed")


@app.command()
def cancel(
    ctx: typer.Context,
    run_id: RunArg,
    reason: Annotated[str, typer.Option("--reason")] = "canceled from the command line",
    as_json: JsonOpt = False,
) -> None:
    """Record the intent to cancel: canceling while leases are live, then canceled."""
    with _ledger(ctx) as lg:
        outcome = lg.cancel(run_id, _actor(ctx, "cancel"), reason)
    if as_json:
        _emit_json(outcome)
        return
    already = " (the cancel was already recorded)" if outcome.already else ""
    typer.echo(
        f"run {outcome.run_id}: {outcome.state}, {outcome.in_flight} attempt(s) in flight{already}"
    )


@app.command()
def fail(
    ctx: typer.Context,
    run_id: RunArg,
    reason: ReasonOpt,
    permanent: Annotated[
        bool, typer.Option("--permanent", help="A retry would fail identically")
    ] = False,
    failure_reason: Annotated[
        str | None,
        typer.Option(
            "--failure-reason",
            help="input_unavailable, input_invalid, record_corrupt, "
            "invariant_violated, deadline_exceeded, review_rejected, "
            "required_items_not_accepted or operator_decision",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fail a run, transient unless --permanent (controller; operators: transient only)."""
    with _ledger(ctx) as lg:
        status = lg.fail(
            run_id,
            _actor(ctx, "fail"),
            reason,
            transient=not permanent,
            failure_reason=failure_reason,
        )
    _show_run(status, as_json, "failed")


@app.command()
def skip(
    ctx: typer.Context,
    run_id: RunArg,
    item_id: ItemArg,
    reason: ReasonOpt,
    as_json: JsonOpt = False,
) -> None:
    """Skip a pending, retryable or quarantined item (operator)."""
    with _ledger(ctx) as lg:
        item = lg.skip(run_id, item_id, _actor(ctx, "skip"), reason)
    _show_item(item, as_json)


@app.command()
def release(
    ctx: typer.Context,
    run_id: RunArg,
    item_id: ItemArg,
    reason: ReasonOpt,
    as_json: JsonOpt = False,
) -> None:
    """Release a quarantined item for another attempt (operator)."""
    with _ledger(ctx) as lg:
        item = lg.release(run_id, item_id, _actor(ctx, "release"), reason)
    _show_item(item, as_json)


@app.command("reject-item")
def reject_item(
    ctx: typer.Context,
    run_id: RunArg,
    item_id: ItemArg,
    reason: ReasonOpt,
    rule: Annotated[
        str | None, typer.Option("--rule", help="The rule the item fails (default: the reason)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Reject a quarantined item for good (reviewer)."""
    with _ledger(ctx) as lg:
        item = lg.reject_item(
            run_id,
            item_id,
            _actor(ctx, "reject-item"),
            rule or reason,
            detail=reason if rule else None,
        )
    _show_item(item, as_json)


OptionalReason = Annotated[str | None, typer.Option("--reason", help="Why (recorded)")]


@app.command()
def retry(
    ctx: typer.Context, run_id: RunArg, reason: OptionalReason = None, as_json: JsonOpt = False
) -> None:
    """New run replaying a failed(transient) run's latest input, linked retry_of (operator)."""
    with _ledger(ctx) as lg:
        status = lg.retry(run_id, _actor(ctx, "retry"), reason=reason)
    _show_run(status, as_json, f"retry of {run_id}:")


@app.command()
def repair(
    ctx: typer.Context,
    run_id: RunArg,
    items: Annotated[
        str | None,
        typer.Option(
            "--items", metavar="ID,...", help="Items to repair (default: those not accepted)"
        ),
    ] = None,
    corrections: Annotated[
        Path | None,
        typer.Option(
            "--corrections",
            metavar="ITEMS.json",
            exists=True,
            dir_okay=False,
            help="Corrected items (a JSON list); links correction_of",
        ),
    ] = None,
    reason: OptionalReason = None,
    as_json: JsonOpt = False,
) -> None:
    """New run for a run's items not accepted, linked repair_of / correction_of (operator)."""
    fixed = _read_json_file(corrections, "corrections") if corrections else None
    with _ledger(ctx) as lg:
        status = lg.repair(
            run_id, _actor(ctx, "repair"), items=_split_ids(items), corrections=fixed, reason=reason
        )
    _show_run(status, as_json, f"repair of {run_id}:")


@app.command()
def compensate(
    ctx: typer.Context,
    run_id: RunArg,
    reason: ReasonOpt,
    items: Annotated[str | None, typer.Option("--items", metavar="ID,...")] = None,
    as_json: JsonOpt = False,
) -> None:
    """New run that undoes a run's effects, linked compensates (operator)."""
    with _ledger(ctx) as lg:
        status = lg.compensate(run_id, _actor(ctx, "compensate"), reason, items=_split_ids(items))
    _show_run(status, as_json, f"compensation of {run_id}:")


@app.command()
def reconcile(
    ctx: typer.Context,
    watch: Annotated[
        float | None,
        typer.Option(
            "--watch", metavar="SECONDS", min=0.05, help="Repeat every SECONDS until interrupted"
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Expire stale leases, finish cancels and pauses, fail runs past their deadline."""
    import time

    if watch is not None:
        _one_command_only(ctx, "reconcile --watch")
    with _ledger(ctx) as lg:
        while True:
            report = lg.reconcile()
            if as_json:
                typer.echo(json.dumps(report.to_dict()))
            else:
                typer.echo(
                    f"{datetime.now(UTC).isoformat(timespec='seconds')} reconciled: "
                    f"{report.expired_leases} lease(s) expired, {report.finished_cancels} "
                    f"cancel(s) and {report.finished_pauses} pause(s) finished, "
                    f"{report.failed_runs} run(s) failed"
                )
            if watch is None:
                return
            try:
                time.sleep(watch)
            except KeyboardInterrupt:
                return


@app.command()
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
    """Process a run's items with a handler until nothing is left (worker)."""
    import socket

    from .cli_progress import watch_run
    from .errors import IllegalTransition
    from .worker import Worker

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

    from .errors import InvalidInput

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


# -- reads ----------------------------------------------------------------------


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
    state: Annotated[str | None, typer.Option("--state", callback=_one_of("run"))] = None,
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
    from .render import show_runs

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
    state: Annotated[str | None, typer.Option("--state", callback=_one_of("item"))] = None,
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
    from . import paging
    from .cli_pages import emit_pages
    from .render import show_items

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
    from . import paging
    from .cli_pages import emit_pages
    from .render import show_attempts

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


def _say_if_archived(lg: Any, run_id: str, result: Any) -> None:
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
    from . import paging
    from .cli_pages import emit_pages
    from .render import show_transitions

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
    from .render import show_runs

    show_runs(_console(wide), result, title=f"lineage of run {run_id}", short=_short(wide))


@app.command()
def audit(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run", metavar="RUN")] = None,
    actor: Annotated[str | None, typer.Option("--actor", metavar="ACTOR_ID")] = None,
    role: Annotated[str | None, typer.Option("--role", callback=_one_of("role"))] = None,
    state: Annotated[
        str | None, typer.Option("--state", callback=_one_of("state"), help="The state entered")
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
        found = lg.audit(
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
    from .render import show_transitions

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
) -> None:
    """Replay every event and check the rules, hash chains and projections (exit 1 on problems)."""
    with _ledger(ctx) as lg, _core_feature("verify"):
        report = lg.verify(
            None if no_progress else VerifyProgress(lambda line: typer.echo(line, err=True))
        )
    if as_json:
        _emit_json(report)
    else:
        from .render import show_verify

        show_verify(_console(), report)
        if heads:
            typer.echo(f"heads {report.heads}")
    if not report.ok:
        raise typer.Exit(1)


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
    from projections.checksums import checksums

    with _ledger(ctx) as lg, lg.store.read() as tx:
        found = checksums(tx)
    if as_json:
        _emit_json(found)
        return
    for table, value in found.items():
        rows, digest = value.split(":")
        typer.echo(f"{table:<15} {int(rows):>10,} rows  {digest}")


# -- the HTTP API (ledger/http): a thin wrapper over its serve(); tokens: cli_tokens.py --


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
) -> None:
    """Serve the HTTP API and the operator page until interrupted."""
    from .http.serve import serve as serve_http

    _one_command_only(ctx, "serve (clients send an Idempotency-Key header per request)")
    serve_http(
        _globals(ctx).dsn, host=host, port=port, tokens_path=tokens, public_reads=public_reads
    )


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
    from .demo import run_demo

    _one_command_only(ctx, "demo")
    run_demo(_globals(ctx).dsn, items=items, workers=workers, seed=seed, as_json=as_json)


# export, import, copy, archive, restore; top; the change feed (events, followers,
# webhooks): their own modules, on this app
from . import cli_feed, cli_tokens, cli_top, cli_transfer  # noqa: E402, F401 (they import `app` from this module)


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
