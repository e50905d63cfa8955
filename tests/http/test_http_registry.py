"""The HTTP command routes are generated from the command registry (one
command registry drives the service, the CLI and the HTTP routes, so a command is
declared once): every entry with an `Http` mapping has exactly one route, made from
that entry; every other entry says why it has none (`NotOverHttp`); no command route
is written by hand; and an entry that does not fit its facade method is refused when
the routes are built, so the drift cannot come back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from ledger import Ledger
from ledger.commands import bodies as B
from ledger.commands.registry import COMMANDS, CommandSpec, Http, NotOverHttp
from ledger.core.views import Lease, RunStatus
from ledger.http import add_token, create_app
from ledger.http.commands import command_router, response_model
from ledger.http.commands import router as commands_router
from tests.support.runs import manifest

ROUTED = {name: spec for name, spec in COMMANDS.items() if isinstance(spec.http, Http)}


def post_routes(router: APIRouter) -> dict[str, APIRoute]:
    return {
        route.path: route
        for route in router.routes
        if isinstance(route, APIRoute) and "POST" in route.methods
    }


def openapi_posts(app: FastAPI) -> dict[str, dict[str, Any]]:
    """`path -> operation` of every POST the app serves (its OpenAPI document)."""
    paths = app.openapi()["paths"]
    return {path: ops["post"] for path, ops in paths.items() if "post" in ops}


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(None, tokens_path=os.devnull)  # type: ignore[arg-type]


def test_every_registry_command_is_routed_or_says_why_not() -> None:
    for name, spec in COMMANDS.items():
        assert isinstance(spec.http, Http | NotOverHttp), name
        if isinstance(spec.http, NotOverHttp):
            assert spec.http.why.strip(), name
            assert spec.http_path is None
        else:
            assert spec.http_path is not None and spec.http.doc, name
    # the two without a route of their own, by name, so a new one is a decision
    assert set(COMMANDS) - set(ROUTED) == {"approve", "record"}


def test_the_app_serves_the_registrys_command_routes_and_no_other(app: FastAPI) -> None:
    served = openapi_posts(app)
    commands = {path for path, op in served.items() if "commands" in op["tags"]}
    # no command route besides the registry's, and no POST route outside it but /session
    paths = {str(spec.http_path).replace(":path}", "}") for spec in ROUTED.values()}
    assert commands == paths
    assert set(served) - commands == {"/session"}
    for spec in ROUTED.values():
        op = served[str(spec.http_path).replace(":path}", "}")]
        assert op["summary"] == spec.summary and op["operationId"].startswith(f"{spec.name}_")


def test_every_command_route_is_made_from_its_registry_entry() -> None:
    routes = post_routes(commands_router)
    assert set(routes) == {spec.http_path for spec in ROUTED.values()}
    for name, spec in ROUTED.items():
        assert isinstance(spec.http, Http)
        route = routes[str(spec.http_path)]
        assert route.name == name and route.endpoint.__name__ == name
        assert route.summary == spec.summary
        assert route.description == spec.http.doc
        assert route.status_code == (201 if spec.creates_run else None), name
        assert route.response_model == response_model(spec), name
        body = route.body_field
        if spec.http.body is None:
            assert body is None or spec.http.raw_body is not None, name
        else:
            assert body is not None and body.field_info.annotation in (
                spec.http.body,
                spec.http.body | None,
            ), name
            assert body.field_info.is_required() == spec.http.requires_body, name


def test_the_response_model_is_the_facade_methods_return_type() -> None:
    assert response_model(COMMANDS["submit"]) is RunStatus
    assert response_model(COMMANDS["claim"]) == list[Lease]


def test_a_command_added_to_the_registry_gets_its_route(monkeypatch: pytest.MonkeyPatch) -> None:
    def snooze(uow: Any, run_id: str, actor: Any, reason: str | None = None) -> RunStatus:
        raise NotImplementedError

    def facade(
        self: Ledger,
        run_id: str,
        actor: Any,
        reason: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> RunStatus:
        raise NotImplementedError

    monkeypatch.setattr(Ledger, "snooze", facade, raising=False)
    spec = replace(
        COMMANDS["pause"],
        name="snooze",
        handler=snooze,
        http=Http("`lg.snooze(run_id, actor, reason)`.", B.RetryBody),
    )
    router = command_router({**COMMANDS, "snooze": spec})
    route = post_routes(router)["/runs/{run_id}/snooze"]
    assert route.summary == spec.summary and route.name == "snooze"
    app = FastAPI()
    app.include_router(router)
    assert openapi_posts(app)["/runs/{run_id}/snooze"]["requestBody"]["content"]
    # marked as not over HTTP, it has no route
    hidden = replace(spec, http=NotOverHttp("in-process only"))
    assert "/runs/{run_id}/snooze" not in post_routes(
        command_router({**COMMANDS, "snooze": hidden})
    )


def test_an_entry_that_does_not_fit_its_facade_method_is_refused() -> None:
    def routed(name: str, http: Http) -> dict[str, CommandSpec]:
        return {name: replace(COMMANDS[name], http=http)}

    # a body field the command does not take
    with pytest.raises(ValueError, match=r"start: body fields \['failure_reason', 'reason'"):
        command_router(routed("start", Http("x", B.FailBody)))
    # an argument nothing fills
    with pytest.raises(ValueError, match=r"decide: nothing over HTTP fills \['input_version'"):
        command_router(routed("decide", Http("x", B.Expected)))
    # a lease command whose body is not a lease
    with pytest.raises(ValueError, match="accept: a lease command's body is a LeaseBody"):
        command_router(routed("accept", Http("x", B.ReasonBody)))
    # a command whose path cannot be derived from its arguments
    with pytest.raises(ValueError, match="reconcile: name the HTTP path"):
        command_router(routed("reconcile", Http("x")))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    tokens = tmp_path / "tokens"
    made = {role: add_token(f"{role}-1", role, tokens) for role in ("submitter", "controller")}
    lg = Ledger.open("memory://")
    try:
        with TestClient(create_app(lg, tokens_path=tokens)) as c:
            yield c, {role: f"Bearer {token}" for role, token in made.items()}
    finally:
        lg.close()


def test_every_command_that_creates_a_run_answers_201_with_its_location(
    client: tuple[TestClient, dict[str, str]],
) -> None:
    c, auth = client
    submitted = c.post("/runs", json=manifest(1), headers={"Authorization": auth["submitter"]})
    run_id = submitted.json()["run_id"]
    assert submitted.status_code == 201
    assert submitted.headers["Location"] == f"/runs/{run_id}"
    as_controller = {"Authorization": auth["controller"]}
    assert c.post(f"/runs/{run_id}/start", headers=as_controller).status_code == 200
    failed = c.post(
        f"/runs/{run_id}/fail", json={"reason": "db down", "transient": True}, headers=as_controller
    )
    assert failed.status_code == 200, failed.text
    retry = c.post(f"/runs/{run_id}/retry", headers={"Authorization": auth["submitter"]})
    assert retry.status_code == 201, retry.text
    assert retry.headers["Location"] == f"/runs/{retry.json()['run_id']}"


def test_a_command_whose_body_carries_items_gets_the_items_body_limit() -> None:
    from ledger.http.guard import (
        DEFAULT_BODY_BYTES,
        ITEMS_BODY_BYTES,
        LEASE_BODY_BYTES,
        SUBMIT_BODY_BYTES,
        body_limit,
        item_routes,
    )

    # the limit of every route follows from its registry entry
    for name, spec in ROUTED.items():
        assert isinstance(spec.http, Http)
        path = str(spec.http_path).replace("{run_id}", "r").replace("{item_id:path}", "i")
        fields = set(spec.http.body.model_fields) if spec.http.body else set()
        if spec.http.raw_body is not None:
            expected = SUBMIT_BODY_BYTES
        elif fields & {"items", "corrections"}:
            expected = ITEMS_BODY_BYTES
        elif spec.arguments[:1] == ("lease",):
            expected = LEASE_BODY_BYTES
        else:
            expected = DEFAULT_BODY_BYTES
        assert body_limit("POST", path) == expected, name
    # a new command with items in its body is an items route without another list
    bulk = replace(COMMANDS["pause"], name="bulk", http=Http("x", B.CompensateBody))
    assert item_routes({"bulk": bulk}) == ("/bulk",)
    assert item_routes({"pause": COMMANDS["pause"]}) == ()
