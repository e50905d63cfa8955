"""The `ledger` app itself: the typer app and its groups, the global options (`--dsn`,
`--as`, `--idempotency-key`, accepted before or after the subcommand), the one-line
error handling, and the helpers every command module shares (opening the ledger, the
actor, JSON output, option types). The commands live in the `cli_*` modules that
`ledger/cli/entry.py` imports; heavy imports happen inside the commands.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from ledger.core.views import Actor, ItemStatus, RunStatus
    from ledger.service.ledger import Ledger


_GLOBAL_OPTIONS = ("--dsn", "--as", "--idempotency-key")

# Commands that may create the store (a new SQLite file); any other command on a
# missing file says so and exits 1, so a typo in --dsn never leaves an empty ledger.
CREATES = frozenset({"submit", "import"})


class _DefaultRoles(Mapping[str, str]):
    """The role each write command acts in unless --as names one: read from the command
    registry on first use (`CommandSpec.default_role`: the rule's only role, or the
    command's documented `cli_role`), so start-up imports nothing for it. Commands the
    registry does not name (archive, restore) act as an operator."""

    def _roles(self) -> dict[str, str]:
        from ledger.commands.registry import cli_default_roles

        return cli_default_roles()

    def __getitem__(self, command: str) -> str:
        return self._roles()[command]

    def __iter__(self) -> Iterator[str]:
        return iter(self._roles())

    def __len__(self) -> int:
        return len(self._roles())


DEFAULT_ROLES: Mapping[str, str] = _DefaultRoles()


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
        from ledger.core.errors import LedgerError
        from ledger.core.extras import MissingExtra, missing_extra

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

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """`ledger --help`: the commands in groups, each with its whole summary."""
        from ledger.cli.listing import format_grouped

        format_grouped(self, ctx, formatter)


def _silence_stdout() -> None:
    """The reader of stdout went away (`ledger audit --jsonl | head -1`): that is its
    choice, not an error (exit 0). Later writes, and the flush at exit, go to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _is_usage_error(error: Exception) -> bool:
    # click's exceptions (typer vendors click, so match by shape, not by class)
    return hasattr(error, "exit_code") and hasattr(error, "show")


class RuleBookCommand(TyperCommand):
    """A write command whose help ends with its rows of the rule book, rendered from the
    command registry (`CommandSpec.summary`, ledger/commands/registry.py) when the help
    is shown, so the states and roles that `ledger COMMAND --help` prints are the ones
    the ledger enforces, and start-up imports nothing for them. The short help (the
    listing of `ledger --help`) ends its first sentence with the roles."""

    def _specs(self) -> list[Any]:
        from ledger.commands.registry import COMMANDS

        specs: list[Any] = []
        for spec in COMMANDS.values():
            # one row per rule: `approve` (decide's) and `record` (accept's) add nothing
            if spec.cli == self.name and all(spec.rule != seen.rule for seen in specs):
                specs.append(spec)
        return specs

    def format_help_text(self, ctx: Any, formatter: Any) -> None:
        super().format_help_text(ctx, formatter)
        # each summary as "name:" and the move, wrapped under the move
        rows = [spec.summary.partition(" ") for spec in self._specs()]
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text("Rule book:")
            with formatter.indentation():
                formatter.write_dl([(name, move) for name, _, move in rows])

    def get_short_help_str(self, limit: int = 45) -> str:
        from ledger.core.states import describe_roles

        roles = describe_roles(frozenset().union(*(spec.roles for spec in self._specs())))
        words = inspect.cleandoc(self.help or "").split()
        # the first sentence, as click takes it (up to the first word ending with ".")
        end = next((i for i, word in enumerate(words) if word.endswith(".")), len(words) - 1)
        first = " ".join(words[: end + 1]).rstrip(".")
        text = self.help
        self.help = f"{first} ({roles})."
        try:
            return super().get_short_help_str(limit)
        finally:
            self.help = text


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
        from ledger import __version__

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
    from ledger.service.ledger import Ledger

    key = _globals(ctx).idempotency_key
    if key is not None:
        from ledger.commands.idempotency import check_key

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
    from ledger.core.views import Actor

    default_id = default_actor_id()
    default_role = DEFAULT_ROLES.get(command, "operator")
    text = _globals(ctx).actor
    if not text:
        return Actor(default_id, default_role)
    ident, sep, role = text.rpartition(":")
    if not sep:
        ident, role = text, default_role
    from ledger.core.validation import check_not_reserved

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
    from ledger.core.errors import ManifestInvalid
    from ledger.core.validation import MAX_MANIFEST_BYTES, strict_loads

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ManifestInvalid(
            f"cannot read {what} file {str(path)!r}: {e.strerror}", field=what
        ) from None
    # strict JSON, as every entry point reads it (ledger.core.validation)
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
    from ledger.cli.render import console

    return console(wide)


def _show_run(status: RunStatus, as_json: bool, verb: str | None = None) -> None:
    if as_json:
        _emit_json(status)
        return
    if verb:
        typer.echo(f"{verb} run {status.run_id}: {status.state} (revision {status.revision})")
    else:
        from ledger.cli.render import show_status

        show_status(_console(), status)


def _show_item(item: ItemStatus, as_json: bool) -> None:
    if as_json:
        _emit_json(item)
        return
    extra = f" ({item.reason})" if getattr(item, "reason", None) else ""
    typer.echo(f"item {item.item_id} of run {item.run_id}: {item.state}{extra}")


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
# The commands whose caller must say why (states.REASON_REQUIRED): left out or blank, the
# ledger refuses it as InvalidInput, as over the Python API and HTTP.
StatedReasonOpt = Annotated[
    str | None,
    typer.Option("--reason", help="Why (required: the ledger records it with the transition)"),
]


def _whole_run_id(ctx: typer.Context, value: str) -> str:
    """A run id as given, or the one run id a short prefix names (as the tables show
    them): resolved against the ledger, an ambiguous prefix refused listing its runs."""
    text = value.strip().lower() if isinstance(value, str) else ""
    if not 4 <= len(text) < 36 or not set(text) <= set("0123456789abcdef-"):
        return value  # a whole id, or no prefix of one: the command answers for it
    if ctx.resilient_parsing:
        return value
    with _ledger(ctx, create=False) as lg:
        return lg.resolve_run_id(value)


RunArg = Annotated[
    str,
    typer.Argument(
        metavar="RUN",
        help="Run id, or a unique prefix of one (4 or more characters)",
        callback=_whole_run_id,
    ),
]
ItemArg = Annotated[str, typer.Argument(metavar="ITEM", help="Item id")]
