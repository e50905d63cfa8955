"""HTTP paging of a run's items, attempts and history, the audit and the feed (issue
14): a page of 1,000 by default, at most 10,000 (more is a typed 422), `after` as the
cursor; the body is `{"items": [...], "next": cursor | null}`, the next cursor also in
the `X-Next-After` and `Link: <...>; rel="next"` headers."""

# ruff: noqa: F811  (the fixtures of tests/support/http_api.py are imported, then requested by name)
from __future__ import annotations

from typing import Any

import pytest

from tests.support.http_api import (  # noqa: F401  (fixtures)
    Api,
    api,
    error_of,
    ledger,
    make_api,
    tokens,
    tokens_file,
)
from tests.support.runs import manifest


def walk(api: Api, path: str, limit: int, **params: Any) -> list[dict[str, Any]]:
    """Every value of a paged route, following `next` in the body (and checking that the
    headers say the same)."""
    seen: list[dict[str, Any]] = []
    after: str | int | None = None
    while True:
        query = {**params, "limit": limit, **({} if after is None else {"after": after})}
        r = api.get(path, params=query)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"items", "next"}, body
        page = body["items"]
        assert isinstance(page, list) and len(page) <= limit
        seen += page
        after = body["next"]
        if after is None:
            assert len(page) < limit
            assert "X-Next-After" not in r.headers and "Link" not in r.headers
            return seen
        assert len(page) == limit
        assert r.headers["X-Next-After"] == str(after)
        link = r.headers["Link"]
        assert link.startswith(f"<{path}?") and link.endswith('>; rel="next"'), link


def test_default_and_largest_page(api: Api) -> None:
    run = api.submit(manifest(1001))["run_id"]
    r = api.get(f"/runs/{run}/items")
    assert r.status_code == 200
    assert [i["item_id"] for i in r.json()["items"]] == [f"i{k}" for k in range(1000)]
    assert r.json()["next"] == "i999" and r.headers["X-Next-After"] == "i999"
    assert r.headers["Link"] == f'</runs/{run}/items?after=i999>; rel="next"'
    r = api.get(f"/runs/{run}/items", params={"after": "i999"})
    assert r.json() == {"items": [r.json()["items"][0]], "next": None}
    assert r.json()["items"][0]["item_id"] == "i1000"
    assert "X-Next-After" not in r.headers and "Link" not in r.headers
    r = api.get(f"/runs/{run}/items", params={"limit": 10_000})
    assert len(r.json()["items"]) == 1001 and r.json()["next"] is None
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
    items = api.get(f"/runs/{run}/items", params={"limit": 10_000}).json()["items"]
    attempts = api.get(f"/runs/{run}/attempts", params={"limit": 10_000}).json()["items"]
    history = api.get(f"/runs/{run}/history", params={"limit": 10_000}).json()["items"]
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
        assert r.status_code == 200 and r.json() == {"items": [], "next": None}


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


def test_audit_and_feed_pages_carry_next_in_the_body(api: Api) -> None:
    run = api.running(manifest(3))
    api.claim(run, limit=3)
    audit = walk(api, "/audit", 2, run_id=run)
    assert [t["position"] for t in audit] == sorted(t["position"] for t in audit)
    assert audit == api.get(f"/runs/{run}/history", params={"limit": 100}).json()["items"]
    assert walk(api, "/audit", 1, run_id=run, role="worker") == [
        t for t in audit if t["role"] == "worker"
    ]
    newest = walk(api, "/audit", 2, run_id=run, newest_first="true")
    assert newest == audit[::-1]
    # the audit pages as the run reads do: 1,000 by default, at most 10,000
    r = api.get("/audit")
    assert r.status_code == 200 and r.json()["next"] is None
    assert api.get("/audit", params={"limit": 10_000}).status_code == 200
    error_of(api.get("/audit", params={"limit": 10_001}), 422, "InvalidInput")
    # the feed always names the next cursor: everything up to it has been seen
    body = api.get("/events", params={"run_id": run, "limit": 2}).json()
    assert [t["position"] for t in body["items"]] == [t["position"] for t in audit[:2]]
    assert body["next"] == audit[1]["position"]
    last = api.get("/events", params={"run_id": run, "after": body["next"], "limit": 1000})
    assert last.json()["items"] == audit[2:] and last.json()["next"] == audit[-1]["position"]
    assert last.headers["X-Next-After"] == str(audit[-1]["position"])
    assert last.headers["Link"].endswith(f'after={audit[-1]["position"]}>; rel="next"')


def test_the_default_audit_page_is_1000(api: Api) -> None:
    run = api.running(manifest(600, lease_seconds=600))
    api.claim(run, limit=600)  # submit, start and 600 claims: 602 transitions of the run
    body = api.get("/audit", params={"run_id": run}).json()
    assert len(body["items"]) == 602 and body["next"] is None  # one default page (1,000)


def test_the_link_header_leads_to_the_next_page(api: Api) -> None:
    """Any cursor fits the Link header (percent-encoded), even one no header can carry as
    is: an item id outside ASCII is in the body and Link, never a 500."""
    ids = ["日本-1", "日本-2", "x/y z&after=1", "ok"]
    m = manifest(0)
    m["items"] = [{"item_id": i, "payload": {}} for i in ids]
    run = api.submit(m)["run_id"]
    seen: list[str] = []
    path = f"/runs/{run}/items?state=pending&limit=1"
    while path:
        r = api.get(path)
        assert r.status_code == 200, r.text
        body = r.json()
        seen += [i["item_id"] for i in body["items"]]
        link = r.headers.get("Link")
        assert (link is None) == (body["next"] is None)
        if link is None:
            break
        assert link.isascii() and link.endswith('>; rel="next"')
        path = link[1 : link.index(">")]
        assert path.startswith(f"/runs/{run}/items?") and "state=pending" in path
        if body["next"].isascii():
            assert r.headers["X-Next-After"] == body["next"]
        else:
            assert "X-Next-After" not in r.headers
    assert seen == ids


def test_the_feed_masks_lease_tokens_as_every_read(api: Api) -> None:
    """GET /events and /events/stream show a lease token only to its holder and operators
    (as items, attempts, history and audit do)."""
    run = api.running(manifest(2))
    (lease,) = api.claim(run, 1, as_="worker")
    r = api.post("/leases/accept", "worker", json=lease)
    assert r.status_code == 200, r.text
    token = lease["token"]
    for as_, sees in (
        ("operator", True),
        ("worker", True),
        ("worker-2", False),
        ("reviewer", False),
    ):
        body = api.get("/events", as_, params={"run_id": run}).text
        assert (token in body) is sees, as_
        stream = api.get("/events/stream", as_, params={"run_id": run, "after": 0, "limit": 4})
        assert stream.status_code == 200
        assert (token in stream.text) is sees, as_
        assert "fp:" in stream.text or sees


@pytest.mark.parametrize(
    "path",
    [
        "/runs/{run_id}/items",
        "/runs/{run_id}/attempts",
        "/runs/{run_id}/history",
        "/audit",
        "/events",
    ],
)
def test_openapi_documents_the_page_body(api: Api, path: str) -> None:
    doc = api.client.get("/openapi.json").json()
    ref = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    schema = doc["components"]["schemas"][ref["$ref"].rsplit("/", 1)[-1]]
    assert schema["type"] == "object" and set(schema["required"]) == {"items", "next"}
    assert schema["properties"]["items"]["type"] == "array"
