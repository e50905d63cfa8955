"""HTTP paging of a run's items, attempts and history (issue 14): a page of 1,000 by
default, at most 10,000 (more is a typed 422), `after` as the cursor and the next
cursor in the `X-Next-After` header; the body stays a JSON list."""

# ruff: noqa: F811  (the fixtures of tests/test_http.py are imported, then requested by name)
from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import manifest
from tests.test_http import (  # noqa: F401  (fixtures)
    Api,
    api,
    error_of,
    http_dsn,
    ledger,
    make_api,
    tokens,
    tokens_file,
)


def walk(api: Api, path: str, limit: int, **params: Any) -> list[dict[str, Any]]:
    """Every value of a paged route, following X-Next-After."""
    seen: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        query = {**params, "limit": limit, **({} if after is None else {"after": after})}
        r = api.get(path, params=query)
        assert r.status_code == 200, r.text
        page = r.json()
        assert isinstance(page, list) and len(page) <= limit
        seen += page
        after = r.headers.get("X-Next-After")
        if after is None:
            assert len(page) < limit
            return seen
        assert len(page) == limit


def test_default_and_largest_page(api: Api) -> None:
    run = api.submit(manifest(1001))["run_id"]
    r = api.get(f"/runs/{run}/items")
    assert r.status_code == 200
    assert [i["item_id"] for i in r.json()] == [f"i{k}" for k in range(1000)]
    assert r.headers["X-Next-After"] == "i999"
    r = api.get(f"/runs/{run}/items", params={"after": "i999"})
    assert [i["item_id"] for i in r.json()] == ["i1000"]
    assert "X-Next-After" not in r.headers
    r = api.get(f"/runs/{run}/items", params={"limit": 10_000})
    assert len(r.json()) == 1001 and "X-Next-After" not in r.headers
    for path in ("items", "attempts", "history"):
        for bad in (10_001, 0, -5, "x"):
            body = error_of(
                api.get(f"/runs/{run}/{path}", params={"limit": bad}), 422, "InvalidInput"
            )
            assert "limit" in body["message"], body


def test_paging_every_route(api: Api) -> None:
    run = api.running(manifest(9, max_attempts=5))
    for rnd in range(3):
        for k, lease in enumerate(api.claim(run, limit=4)):
            if k % 2:
                r = api.post("/leases/accept", "worker", json=lease)
            else:
                r = api.post("/leases/fail_attempt", "worker", json={**lease, "error": f"r{rnd}"})
            assert r.status_code == 200, r.text
    items = api.get(f"/runs/{run}/items", params={"limit": 10_000}).json()
    attempts = api.get(f"/runs/{run}/attempts", params={"limit": 10_000}).json()
    history = api.get(f"/runs/{run}/history", params={"limit": 10_000}).json()
    assert [i["item_id"] for i in items] == [f"i{k}" for k in range(9)]
    assert len(attempts) == 12 and len(history) == 2 + 2 * 12
    assert len({(a["item_id"], a["attempt"]) for a in attempts}) == 12
    for limit in (1, 5, 12):
        assert walk(api, f"/runs/{run}/items", limit) == items
        assert walk(api, f"/runs/{run}/attempts", limit) == attempts
        assert walk(api, f"/runs/{run}/history", limit) == history
    accepted = [i for i in items if i["state"] == "accepted"]
    assert walk(api, f"/runs/{run}/items", 2, state="accepted") == accepted
    one = [a for a in attempts if a["item_id"] == "i0"]
    assert walk(api, f"/runs/{run}/attempts", 1, item_id="i0") == one
    # past the end: an empty page
    last = attempts[-1]
    for path, after in (
        ("items", "i8"),
        ("attempts", f"{last['item_id']}:{last['attempt']}"),
        ("history", str(history[-1]["position"])),
    ):
        r = api.get(f"/runs/{run}/{path}", params={"after": after})
        assert r.status_code == 200 and r.json() == []


@pytest.mark.parametrize(
    ("path", "after"),
    [
        ("items", "nope"),
        ("items", "bad\u202eid"),
        ("attempts", "i0"),
        ("attempts", "i0:x"),
        ("attempts", "i0:99"),
        ("history", "-1"),
        ("history", "x"),
        ("history", str(2**63)),
    ],
)
def test_bad_cursor(api: Api, path: str, after: str) -> None:
    run = api.running(manifest(2))
    api.claim(run)
    error_of(api.get(f"/runs/{run}/{path}", params={"after": after}), 422, "InvalidInput")
