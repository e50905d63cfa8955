"""`GET /docs`: the API reference, served from the package (no CDN script, no external
file), under the operator page's Content-Security-Policy and its auth: anonymous
readers get it only with `--public-reads`; others get 401 and a pointer to sign in."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from ledger.http.auth import bearer, read_actor
from ledger.http.errors import Unauthenticated
from ledger.http.page import PAGE_HEADERS, STATIC_PACKAGE

router = APIRouter(tags=["operator page"])

_SIGN_IN = (
    "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Run ledger</title>"
    "<link rel='stylesheet' href='/static/style.css'></head><body><main><p class='notice'>"
    "The API reference needs a sign-in: <a href='/'>sign in on the operator page</a>, "
    "then come back.</p></main></body></html>"
)


@router.get(
    "/docs",
    response_class=HTMLResponse,
    summary="The API reference (from /openapi.json)",
    responses={401: {"description": "Sign-in needed"}},
)
async def api_reference(request: Request) -> HTMLResponse:
    """Every route with its parameters, body and statuses, rendered from /openapi.json."""
    try:
        read_actor(request, await bearer(request))
    except Unauthenticated:
        headers = {**PAGE_HEADERS, "WWW-Authenticate": 'Bearer realm="ledger"'}
        return HTMLResponse(_SIGN_IN, status_code=401, headers=headers)
    html = (resources.files(STATIC_PACKAGE) / "static" / "docs.html").read_text(encoding="utf-8")
    return HTMLResponse(html, headers=dict(PAGE_HEADERS))
