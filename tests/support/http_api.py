"""The HTTP API under test: a `TestClient` over `create_app` on a SQLite file or
PostgreSQL (the `dsn` fixture of tests/conftest.py), one token per role, and `Api`, the
client with those tokens. Import the fixtures into a test module to use them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ledger import Ledger
from ledger.core.states import ROLES
from ledger.http import add_token, create_app
from tests.support.clock import ManualClock
from tests.support.runs import manifest


def actor_id(role: str) -> str:
    return f"{role}-1"


@pytest.fixture
def ledger(dsn: str, clock: ManualClock) -> Iterator[Ledger]:
    lg = Ledger.open(dsn, clock=clock)
    try:
        yield lg
    finally:
        lg.close()


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    return tmp_path / "tokens"


@pytest.fixture
def tokens(tokens_file: Path) -> dict[str, str]:
    """One token per role (actor `<role>-1`), plus a second worker under "worker-2"."""
    made = {role: add_token(actor_id(role), role, tokens_file) for role in ROLES}
    made["worker-2"] = add_token("worker-2", "worker", tokens_file)
    return made


class Api:
    """A TestClient plus the tokens: `api.post(path, as_="worker", json=...)`."""

    def __init__(self, client: TestClient, tokens: dict[str, str]) -> None:
        self.client = client
        self.tokens = tokens

    def headers(self, as_: str | None) -> dict[str, str]:
        return {} if as_ is None else {"Authorization": f"Bearer {self.tokens[as_]}"}

    def get(self, path: str, as_: str | None = "operator", **kw: Any) -> Any:
        return self.client.get(path, headers={**self.headers(as_), **kw.pop("headers", {})}, **kw)

    def post(self, path: str, as_: str | None, **kw: Any) -> Any:
        return self.client.post(path, headers={**self.headers(as_), **kw.pop("headers", {})}, **kw)

    # a few steps used by many tests
    def submit(self, m: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.post("/runs", "submitter", json=m or manifest(3))
        assert r.status_code == 201, r.text
        body: dict[str, Any] = r.json()
        return body

    def running(self, m: dict[str, Any] | None = None) -> str:
        run_id: str = self.submit(m)["run_id"]
        r = self.post(f"/runs/{run_id}/start", "controller")
        assert r.status_code == 200, r.text
        return run_id

    def claim(self, run_id: str, limit: int = 1, as_: str = "worker") -> list[dict[str, Any]]:
        r = self.post(f"/runs/{run_id}/claim", as_, json={"limit": limit})
        assert r.status_code == 200, r.text
        leases: list[dict[str, Any]] = r.json()
        return leases


@pytest.fixture
def make_api(
    ledger: Ledger, tokens_file: Path, tokens: dict[str, str]
) -> Iterator[Callable[..., Api]]:
    clients: list[TestClient] = []

    def make(public_reads: bool = False) -> Api:
        client = TestClient(create_app(ledger, tokens_path=tokens_file, public_reads=public_reads))
        client.__enter__()
        clients.append(client)
        return Api(client, tokens)

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api()


def error_of(response: Any, status: int, error: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["error"] == error, body
    assert isinstance(body["message"], str) and body["message"]
    return body
