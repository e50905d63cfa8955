"""What HTTP readers can see and who can act: lease
tokens only to their holder and operators, the ledger's own actor ids unusable, an
idempotency key reused by another actor refused after authorization without naming the
other command, and /docs served from the package under the page's CSP and auth."""

# ruff: noqa: F811  (the fixtures of tests/support/http_api.py are imported, then requested by name)
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ledger import InvalidInput
from ledger.cli.entry import app as cli_app
from ledger.core.validation import RESERVED_ACTOR_IDS
from ledger.http.tokens import add_token, parse_tokens
from ledger.http.visibility import FINGERPRINT_PREFIX, fingerprint
from tests.support.http_api import (  # noqa: F401  (fixtures)
    Api,
    api,
    error_of,
    ledger,
    make_api,
    tokens,
    tokens_file,
)


def _tokens_in(value: Any) -> set[str]:
    """Every lease token (a `token` or `lease_token` field) anywhere in a JSON value."""
    found: set[str] = set()
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("token", "lease_token") and isinstance(v, str):
                    found.add(v)
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _reads(api: Api, run_id: str, as_: str | None) -> dict[str, Any]:
    out = {}
    for path in (
        f"/runs/{run_id}/items",
        f"/runs/{run_id}/attempts",
        f"/runs/{run_id}/history",
        f"/audit?run_id={run_id}&limit=1000",
    ):
        r = api.get(path, as_)
        assert r.status_code == 200, (path, r.text)
        out[path] = r.json()
    return out


def test_lease_tokens_only_to_their_holder_and_operators(make_api: Any) -> None:
    api = make_api(public_reads=True)
    run_id = api.running()
    (mine,) = api.claim(run_id, 1, as_="worker")
    (theirs,) = api.claim(run_id, 1, as_="worker-2")
    live = {mine["token"], theirs["token"]}

    everything = set().union(*map(_tokens_in, _reads(api, run_id, "operator").values()))
    assert live <= everything  # operators see tokens as they are

    for reader in (None, "reviewer", "submitter", "controller"):
        seen = set().union(*map(_tokens_in, _reads(api, run_id, reader).values()))
        assert not (seen & live), reader
        assert seen and all(t.startswith(FINGERPRINT_PREFIX) for t in seen)
        assert fingerprint(mine["token"]) in seen

    # a worker sees its own lease's token, and only a fingerprint of another's
    seen = set().union(*map(_tokens_in, _reads(api, run_id, "worker").values()))
    assert mine["token"] in seen and theirs["token"] not in seen
    assert fingerprint(theirs["token"]) in seen
    # the holder can still heartbeat with what claim gave it
    assert api.post("/leases/heartbeat", "worker", json=mine).status_code == 200


@pytest.mark.parametrize("reserved", sorted(RESERVED_ACTOR_IDS))
def test_reserved_actor_ids_get_no_token_and_no_as(tmp_path: Path, reserved: str) -> None:
    with pytest.raises(InvalidInput, match="reserved"):
        add_token(reserved, "controller", tmp_path / "t")
    with pytest.raises(InvalidInput, match="reserved"):
        add_token(reserved.upper(), "operator", tmp_path / "t")
    with pytest.raises(InvalidInput, match="reserved"):
        parse_tokens(f"{'a' * 64} {reserved} controller\n")
    runner = CliRunner()
    dsn = f"sqlite:///{tmp_path}/l.db"
    result = runner.invoke(
        cli_app, [f"--dsn={dsn}", "--as", f"{reserved}:operator", "pause", "r1", "--reason", "x"]
    )
    assert result.exit_code != 0
    assert "reserved" in result.output
    result = runner.invoke(
        cli_app, ["token", "add", reserved, "controller", "--tokens", str(tmp_path / "t2")]
    )
    assert result.exit_code != 0 and "reserved" in result.output
    assert not (tmp_path / "t2").exists() or reserved not in (tmp_path / "t2").read_text()


def test_key_reuse_by_another_actor_is_refused_after_authorization(api: Api) -> None:
    run_id = api.running()
    key = {"Idempotency-Key": "k-shared-1"}
    r = api.post(f"/runs/{run_id}/pause", "operator", json={"reason": "maintenance"}, headers=key)
    assert r.status_code == 200, r.text
    # a role that may never make the command: 403, whatever the key
    body = error_of(
        api.post(f"/runs/{run_id}/complete", "worker", json={}, headers=key), 403, "NotAuthorized"
    )
    assert "pause" not in body["message"]
    # an allowed role reusing the key: refused without naming the other command
    body = error_of(
        api.post(f"/runs/{run_id}/resume", "operator", json={"reason": "go"}, headers=key),
        422,
        "InvalidInput",
    )
    assert "already used" in body["message"]
    assert "pause" not in body["message"] and "maintenance" not in body["message"]
    assert api.get(f"/runs/{run_id}").json()["state"] == "paused"  # nothing written


def test_docs_are_served_from_the_package_under_csp_and_auth(make_api: Any) -> None:
    api = make_api()
    r = api.get("/docs", None)
    assert r.status_code == 401
    assert "Content-Security-Policy" in r.headers
    r = api.get("/docs", "reviewer")
    assert r.status_code == 200
    csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'self'" in csp
    html = r.text
    assert "cdn" not in html.lower() and "https://" not in html and "http://" not in html
    assert '<script src="/static/docs.js"' in html
    script = api.get("/static/docs.js", None)
    assert script.status_code == 200 and "https://" not in script.text
    public = make_api(public_reads=True)
    assert public.get("/docs", None).status_code == 200
    doc = json.loads(api.get("/openapi.json", None).text)
    assert "/docs" in doc["paths"]
