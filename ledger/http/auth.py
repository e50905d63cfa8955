"""Who is calling: a bearer token from the tokens file, mapped to an actor and role.

Commands need `Authorization: Bearer <token>`. Reads accept the same header or
the operator page's session cookie (HttpOnly, SameSite=Strict, set from a token
by `POST /session`), and are open to anonymous callers only with `public_reads`.
The cookie never authorizes a command, so a page on another site cannot make
one (no CSRF). Whether the role may make the command is the service's check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ledger.core.views import Actor
from ledger.http.errors import Unauthenticated
from ledger.http.tokens import TokenFile

SESSION_COOKIE = "ledger_session"

bearer = HTTPBearer(
    auto_error=False,
    description="A token made by `ledger token add ACTOR_ID ROLE`; it stands for that actor and role.",
)


@dataclass
class Gate:
    """The tokens in force and whether anonymous reads are allowed."""

    tokens: TokenFile
    public_reads: bool


def gate_of(request: Request) -> Gate:
    gate = request.app.state.gate
    assert isinstance(gate, Gate)
    return gate


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def command_actor(request: Request, credentials: Credentials) -> Actor:
    """The actor making a command: a known bearer token is required (else 401)."""
    if credentials is None:
        raise Unauthenticated("this command needs a bearer token (Authorization: Bearer <token>)")
    actor = gate_of(request).tokens.lookup(credentials.credentials)
    if actor is None:
        raise Unauthenticated("unknown bearer token")
    return actor


def read_actor(request: Request, credentials: Credentials) -> Actor | None:
    """The actor reading, or None for an anonymous read where reads are public."""
    gate = gate_of(request)
    if credentials is not None:
        actor = gate.tokens.lookup(credentials.credentials)
        if actor is None:
            raise Unauthenticated("unknown bearer token")
        return actor
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        actor = gate.tokens.lookup(cookie)
        if actor is not None:
            return actor
        if not gate.public_reads:
            raise Unauthenticated("the session's token is no longer known; sign in again")
    if gate.public_reads:
        return None
    raise Unauthenticated(
        "reads need a bearer token (Authorization: Bearer <token>) unless the server runs "
        "with --public-reads"
    )


CommandActor = Annotated[Actor, Depends(command_actor)]
Reader = Annotated[Actor | None, Depends(read_actor)]
