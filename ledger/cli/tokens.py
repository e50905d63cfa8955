"""`ledger token add|list|revoke` (registered on the app by `ledger/cli/entry.py`): the HTTP
API's bearer tokens file (ledger/http/tokens.py), which never holds a token."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ledger.cli.app import JsonOpt, _emit_json, token_app

TokensOpt = Annotated[
    Path | None,
    typer.Option(
        "--tokens", metavar="PATH", help="[default: $LEDGER_TOKENS, else ./ledger.tokens]"
    ),
]


@token_app.command("add")
def token_add(
    actor_id: Annotated[str, typer.Argument(metavar="ACTOR_ID")],
    role: Annotated[str, typer.Argument(metavar="ROLE")],
    tokens: TokensOpt = None,
) -> None:
    """Create a bearer token for ACTOR_ID acting as ROLE; it is shown once, only here."""
    from ledger.http.tokens import add_token

    typer.echo(add_token(actor_id, role, tokens))


@token_app.command("list")
def token_list(tokens: TokensOpt = None, as_json: JsonOpt = False) -> None:
    """The tokens: actor, role, when added, a fingerprint (never the token)."""
    from ledger.http.tokens import list_tokens

    found = list_tokens(tokens)
    if as_json:
        _emit_json(found)
        return
    if not found:
        typer.echo("no tokens")
    for t in found:
        typer.echo(f"{t.fingerprint}  {t.actor_id:<20} {t.role:<11} {t.added_at or '(unknown)'}")


@token_app.command("revoke")
def token_revoke(
    who: Annotated[str, typer.Argument(metavar="ACTOR|FINGERPRINT")],
    tokens: TokensOpt = None,
) -> None:
    """Revoke every token of ACTOR, or the one token with FINGERPRINT (from token list)."""
    from ledger.http.tokens import revoke_tokens

    for t in revoke_tokens(who, tokens):
        typer.echo(f"revoked {t.fingerprint} ({t.actor_id}:{t.role})")
