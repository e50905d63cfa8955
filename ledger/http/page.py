"""The operator page: a static page (no external files) that calls the JSON API.

`GET /` is a read like any other: open to anonymous callers only with
`public_reads`; otherwise it answers 401 with the same page, which then offers
a sign-in form. Signing in (`POST /session`) keeps the token in an HttpOnly,
SameSite=Strict cookie that authorizes reads only, never commands.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials
from starlette.staticfiles import StaticFiles

from ledger.commands.bodies import TokenBody
from ledger.http.auth import SESSION_COOKIE, Reader, bearer, gate_of, read_actor
from ledger.http.errors import Unauthenticated, error_responses

router = APIRouter(tags=["operator page"])

STATIC_PACKAGE = "ledger.http"
# Refuse to be framed (clickjacking) and allow only this origin's scripts and styles.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def static_files() -> StaticFiles:
    """The page's script and style sheet, shipped as package data."""
    directory = resources.files(STATIC_PACKAGE) / "static"
    return StaticFiles(directory=str(directory))


def _index_html() -> str:
    return (resources.files(STATIC_PACKAGE) / "static" / "index.html").read_text(encoding="utf-8")


@router.get(
    "/",
    response_class=HTMLResponse,
    summary="The operator page",
    responses={401: {"description": "Sign-in needed (the page shows a form)"}},
)
async def operator_page(request: Request) -> HTMLResponse:
    """The runs table and run pages (`#/runs/{id}`), refreshed every few seconds."""
    credentials: HTTPAuthorizationCredentials | None = await bearer(request)
    status = 200
    try:
        read_actor(request, credentials)
    except Unauthenticated:
        status = 401
    headers = dict(PAGE_HEADERS)
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="ledger"'
    return HTMLResponse(_index_html(), status_code=status, headers=headers)


@router.get("/session", summary="Who the page reads as")
def session(reader: Reader) -> dict[str, Any]:
    """The actor of the session cookie or bearer token; nulls for an anonymous public read."""
    if reader is None:
        return {"actor_id": None, "role": None}
    return {"actor_id": reader.id, "role": reader.role}


@router.post(
    "/session", status_code=204, summary="Sign the page in", responses=error_responses(401, 422)
)
def sign_in(body: TokenBody, request: Request) -> Response:
    """Check a token and keep it in an HttpOnly cookie for the page's reads."""
    actor = gate_of(request).tokens.lookup(body.token)
    if actor is None:
        raise Unauthenticated("unknown token")
    response = Response(status_code=204)
    response.set_cookie(
        SESSION_COOKIE,
        body.token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.delete("/session", status_code=204, summary="Sign the page out")
def sign_out() -> Response:
    """Forget the session cookie."""
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.get("/healthz", summary="Liveness", include_in_schema=True)
def healthz() -> dict[str, bool]:
    """Answers while the server runs; needs no token and reads nothing."""
    return {"ok": True}
