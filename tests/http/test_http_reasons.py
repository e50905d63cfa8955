"""Over HTTP, pause, resume and cancel need a reason in the request body, as fail does:
a body without one is refused (422 InvalidInput), and so is a blank one, and nothing is
written. The OpenAPI document marks the field required."""

# ruff: noqa: F811  (the fixtures of tests/support/http_api.py are imported, then requested by name)
from __future__ import annotations

import pytest

from ledger import Ledger
from tests.support.http_api import (  # noqa: F401  (fixtures)
    Api,
    api,
    error_of,
    ledger,
    make_api,
    tokens,
    tokens_file,
)

BODIES = {
    "pause": {},
    "resume": {},
    "cancel": {},
    "fail": {"transient": True},
}


@pytest.mark.parametrize("reason", [None, "", "  "], ids=["left-out", "empty", "blank"])
@pytest.mark.parametrize("command", list(BODIES))
def test_a_change_of_course_needs_a_reason_in_the_body(
    api: Api, ledger: Ledger, command: str, reason: str | None
) -> None:
    run_id = api.running()
    if command == "resume":
        paused = api.post(f"/runs/{run_id}/pause", "operator", json={"reason": "window"})
        assert paused.status_code == 200, paused.text
    before = len(ledger.audit(limit=10_000))
    body = dict(BODIES[command])
    if reason is not None:
        body["reason"] = reason
    refused = api.post(f"/runs/{run_id}/{command}", "operator", json=body)
    error_of(refused, 422, "InvalidInput")
    assert "reason" in refused.text
    assert len(ledger.audit(limit=10_000)) == before
    made = api.post(f"/runs/{run_id}/{command}", "operator", json={**body, "reason": "decided"})
    assert made.status_code == 200, made.text
    assert ledger.audit(limit=10_000)[-1].reason == "decided"


def test_the_openapi_document_marks_the_reason_required(api: Api) -> None:
    spec = api.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for command in BODIES:
        ref = spec["paths"][f"/runs/{{run_id}}/{command}"]["post"]["requestBody"]["content"][
            "application/json"
        ]["schema"]
        schema = schemas[ref.get("$ref", "").rsplit("/", 1)[-1]]
        assert "reason" in schema["required"], command
