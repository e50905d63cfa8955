"""The HTTP API through its real stack (FastAPI TestClient over httpx) on SQLite and
PostgreSQL: every read and command, every authentication failure, every error
mapping, bad input that must never be a 500, the OpenAPI document, and a
schemathesis run against that document.
"""

# ruff: noqa: F811  (the fixtures of tests/support/http_api.py are imported, then requested by name)
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from ledger import Actor, Ledger, NotAuthorized
from ledger.core.errors import InvalidInput
from ledger.core.states import ROLES, RUN_COMMAND_ROLES, item_rule, run_rule
from ledger.http import add_token, create_app
from ledger.http.tokens import hash_token, parse_tokens
from tests.support.clock import ManualClock
from tests.support.http_api import (  # noqa: F401  (fixtures)
    Api,
    actor_id,
    api,
    error_of,
    ledger,
    make_api,
    tokens,
    tokens_file,
)
from tests.support.runs import manifest

ROOT = Path(__file__).resolve().parents[2]


# --- the whole life of a run over HTTP --------------------------------------------


def test_run_lifecycle_every_read_and_command(api: Api, ledger: Ledger) -> None:
    m = manifest(4, review={"decision": "sign-off"}, max_attempts=2, partial_delivery=True)
    submitted = api.submit(m)
    run_id = submitted["run_id"]
    assert submitted["state"] == "queued" and submitted["waiting_on"] == "controller"
    assert api.get(f"/runs/{run_id}").json() == ledger.status(run_id).to_dict()

    assert (
        api.post(
            f"/runs/{run_id}/start", "controller", json={"expected_revision": submitted["revision"]}
        ).json()["state"]
        == "running"
    )
    amended = api.post(
        f"/runs/{run_id}/amend",
        "submitter",
        json={
            "reason": "one more",
            "items": [{"item_id": "extra", "payload": {"x": 1}}],
            "withdraw": ["i3"],
        },
    )
    assert amended.status_code == 200, amended.text
    assert amended.json()["input_version"] != submitted["input_version"]

    leases = api.claim(run_id, limit=10)
    assert {lease["item_id"] for lease in leases} == {"i0", "i1", "i2", "extra"}
    by_item = {lease["item_id"]: lease for lease in leases}
    assert all(lease["worker_id"] == actor_id("worker") for lease in leases)

    hb = api.post("/leases/heartbeat", "worker", json=by_item["i0"])
    assert hb.status_code == 200 and hb.json()["token"] == by_item["i0"]["token"]
    acc = api.post(
        "/leases/accept", "worker", json={**by_item["i0"], "evidence": {"rows": 3}, "stage": "load"}
    )
    assert acc.json()["state"] == "accepted"
    rej = api.post(
        "/leases/reject",
        "worker",
        json={**by_item["i1"], "rule": "bad-total", "detail": "sum differs"},
    )
    assert rej.json()["state"] == "rejected"
    failed = api.post(
        "/leases/fail_attempt",
        "worker",
        json={**by_item["i2"], "error": "timeout", "retryable": False},
    )
    assert failed.json()["state"] == "quarantined"
    assert api.post("/leases/accept", "worker", json=by_item["extra"]).json()["state"] == "accepted"

    status = api.get(f"/runs/{run_id}").json()
    assert status["waiting_on"] == "reviewer"  # only a quarantined item is left
    released = api.post(f"/runs/{run_id}/items/i2/release", "reviewer", json={"reason": "retry it"})
    assert released.json()["state"] == "retryable"
    (again,) = api.claim(run_id)
    assert again["attempt"] == 2
    api.post("/leases/fail_attempt", "worker", json={**again, "error": "timeout again"})
    assert (
        api.get(f"/runs/{run_id}/items", params={"state": "quarantined"}).json()["items"][0][
            "item_id"
        ]
        == "i2"
    )
    assert (
        api.post(
            f"/runs/{run_id}/items/i2/reject_item", "reviewer", json={"rule": "unfixable"}
        ).json()["state"]
        == "rejected"
    )

    review = api.post(
        f"/runs/{run_id}/request_review", "controller", json={"decision": "sign-off"}
    ).json()
    assert review["state"] == "awaiting_review" and review["waiting_on"] == "reviewer"
    decided = api.post(
        f"/runs/{run_id}/decide",
        "reviewer",
        json={"input_version": review["input_version"], "approve": True, "reason": "looks right"},
    )
    assert decided.json()["state"] == "running"
    done = api.post(f"/runs/{run_id}/complete", "controller").json()
    assert done["state"] == "completed_with_errors" and done["waiting_on"] == "nobody"

    items = api.get(f"/runs/{run_id}/items").json()["items"]
    assert [i["item_id"] for i in items] == [i.item_id for i in ledger.items(run_id)]
    attempts = api.get(f"/runs/{run_id}/attempts").json()["items"]
    assert len(attempts) == 5
    assert [
        a["outcome"]
        for a in api.get(f"/runs/{run_id}/attempts", params={"item_id": "i2"}).json()["items"]
    ] == ["failed", "failed"]
    history = api.get(f"/runs/{run_id}/history").json()["items"]
    assert history == [t.to_dict() for t in ledger.history(run_id)]
    assert history[0]["to_state"] == "queued" and history[-1]["to_state"] == "completed_with_errors"

    repair = api.post(f"/runs/{run_id}/repair", "operator", json={})
    assert repair.status_code == 201, repair.text
    repair_id = repair.json()["run_id"]
    assert repair.json()["links"] == [{"relation": "repair_of", "run_id": run_id}]
    lineage = api.get(f"/runs/{repair_id}/lineage").json()
    assert [r["run_id"] for r in lineage] == [run_id, repair_id]
    # a repair under a corrected configuration is a correction_of; the original keeps its own
    corrected = api.post(
        f"/runs/{run_id}/repair",
        "operator",
        json={"config_version": "cfg-fixed", "policy": {"max_attempts": 4}, "reason": "cfg"},
    )
    assert corrected.status_code == 201, corrected.text
    assert corrected.json()["links"] == [{"relation": "correction_of", "run_id": run_id}]
    assert corrected.json()["config_version"] == "cfg-fixed"
    assert corrected.json()["policy"]["max_attempts"] == 4
    assert api.get(f"/runs/{run_id}").json()["config_version"] != "cfg-fixed"
    bad = api.post(f"/runs/{run_id}/repair", "operator", json={"policy": {"max_attempts": 0}})
    assert bad.status_code == 422 and bad.json()["error"] in ("ManifestInvalid", "InvalidInput")
    comp = api.post(
        f"/runs/{run_id}/compensate", "operator", json={"reason": "undo i0", "items": ["i0"]}
    )
    assert comp.status_code == 201 and comp.json()["links"][0]["relation"] == "compensates"

    runs = api.get("/runs").json()
    assert [r["run_id"] for r in runs][:4] == [
        comp.json()["run_id"],
        corrected.json()["run_id"],
        repair_id,
        run_id,
    ]
    assert [
        r["run_id"] for r in api.get("/runs", params={"state": "completed_with_errors"}).json()
    ] == [run_id]
    assert len(api.get("/runs", params={"limit": 1}).json()) == 1


def test_pause_resume_cancel_fail_retry_reconcile(api: Api, clock: ManualClock) -> None:
    run_id = api.running(manifest(2, lease_seconds=30))
    (lease,) = api.claim(run_id)
    paused = api.post(f"/runs/{run_id}/pause", "operator", json={"reason": "maintenance"}).json()
    assert paused["state"] == "pausing"
    clock.advance(31)
    report = api.post("/reconcile", "reconciler").json()
    assert report["expired_leases"] == 1 and report["finished_pauses"] == 1
    assert api.get(f"/runs/{run_id}").json()["waiting_on"] == "operator"
    lost = api.post("/leases/accept", "worker", json=lease)
    error_of(lost, 409, "LeaseLost")
    resumed = api.post(f"/runs/{run_id}/resume", "operator", json={"reason": "window over"})
    assert resumed.json()["state"] == "running"

    failed = api.post(
        f"/runs/{run_id}/fail",
        "controller",
        json={"reason": "source gone", "transient": True, "failure_reason": "input_unavailable"},
    ).json()
    assert (failed["state"], failed["failure_kind"], failed["failure_reason"]) == (
        "failed",
        "transient",
        "input_unavailable",
    )
    retry = api.post(f"/runs/{run_id}/retry", "submitter")
    assert retry.status_code == 201 and retry.json()["links"] == [
        {"relation": "retry_of", "run_id": run_id}
    ]

    canceled = api.post(
        f"/runs/{retry.json()['run_id']}/cancel", "submitter", json={"reason": "not needed"}
    )
    assert canceled.json() == {
        "run_id": retry.json()["run_id"],
        "state": "canceled",
        "in_flight": 0,
        "already": False,
    }
    again = api.post(
        f"/runs/{retry.json()['run_id']}/cancel", "operator", json={"reason": "not needed"}
    )
    assert again.json()["already"] is True

    skip_run = api.running()
    skipped = api.post(f"/runs/{skip_run}/items/i1/skip", "operator", json={"reason": "not needed"})
    assert skipped.json()["state"] == "skipped"


def test_status_at_a_past_time(api: Api, clock: ManualClock) -> None:
    submitted = api.submit()
    clock.advance(60)
    run_id = submitted["run_id"]
    api.post(f"/runs/{run_id}/start", "controller")
    r = api.get(f"/runs/{run_id}", params={"at": submitted["created_at"]})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "queued"
    naive = submitted["created_at"].replace("+00:00", "")
    assert api.get(f"/runs/{run_id}", params={"at": naive}).json()["state"] == "queued"
    assert api.get(f"/runs/{run_id}").json()["state"] == "running"


def test_item_ids_with_slashes_reach_item_commands(api: Api) -> None:
    m = manifest(1)
    m["items"].append({"item_id": "dir/file.csv"})
    run_id = api.running(m)
    r = api.post(f"/runs/{run_id}/items/dir/file.csv/skip", "reviewer", json={"reason": "later"})
    assert r.status_code == 200, r.text
    assert r.json()["item_id"] == "dir/file.csv"


def test_audit_filters_and_keyset_paging(api: Api, ledger: Ledger) -> None:
    first = api.running()
    second = api.running()
    everything = [t.to_dict() for t in ledger.audit()]
    assert api.get("/audit", params={"limit": 1000}).json()["items"] == everything

    seen: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 3}
        if after is not None:
            params["after"] = after
        r = api.get("/audit", params=params)
        seen += r.json()["items"]
        after = r.json()["next"]
        assert r.headers.get("X-Next-After") == (None if after is None else str(after))
        if after is None:
            break
    assert seen == everything

    newest = api.get("/audit", params={"newest_first": "true", "limit": 2}).json()["items"]
    assert [t["position"] for t in newest] == sorted(
        (t["position"] for t in everything), reverse=True
    )[:2]
    older = api.get(
        "/audit", params={"newest_first": "true", "after": newest[-1]["position"], "limit": 1}
    ).json()["items"]
    assert older[0]["position"] < newest[-1]["position"]

    assert {t["run_id"] for t in api.get("/audit", params={"run_id": first}).json()["items"]} == {
        first
    }
    by_role = api.get("/audit", params={"role": "controller"}).json()["items"]
    assert {t["to_state"] for t in by_role} == {"running"} and len(by_role) == 2
    assert {
        t["actor_id"]
        for t in api.get("/audit", params={"actor": actor_id("submitter")}).json()["items"]
    } == {actor_id("submitter")}
    assert [
        t["run_id"] for t in api.get("/audit", params={"state": "running"}).json()["items"]
    ] == [
        first,
        second,
    ]
    at = everything[-1]["at"]
    assert api.get("/audit", params={"since": at}).json()["items"][-1] == everything[-1]
    assert api.get("/audit", params={"until": "2000-01-01T00:00:00Z"}).json()["items"] == []


# --- authentication --------------------------------------------------------------


def test_commands_need_a_known_bearer_token(api: Api) -> None:
    run_id = api.submit()["run_id"]
    for headers in (
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer " + "x" * 5000},
    ):
        r = api.client.post(f"/runs/{run_id}/start", headers=headers)
        body = error_of(r, 401, "Unauthenticated")
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert "nope" not in body["message"]
    assert api.get(f"/runs/{run_id}").json()["state"] == "queued"  # nothing was written


def test_reads_need_a_token_unless_public(make_api: Callable[..., Api]) -> None:
    private = make_api()
    run_id = private.submit()["run_id"]
    reads = [
        "/runs",
        f"/runs/{run_id}",
        f"/runs/{run_id}/items",
        f"/runs/{run_id}/attempts",
        f"/runs/{run_id}/history",
        f"/runs/{run_id}/lineage",
        "/audit",
    ]
    for path in reads:
        error_of(private.get(path, as_=None), 401, "Unauthenticated")
        error_of(
            private.get(path, as_=None, headers={"Authorization": "Bearer unknown"}),
            401,
            "Unauthenticated",
        )
        assert private.get(path, as_="worker").status_code == 200
    page = private.client.get("/")
    assert page.status_code == 401 and "text/html" in page.headers["content-type"]

    public = make_api(public_reads=True)
    for path in reads:
        assert public.get(path, as_=None).status_code == 200, path
    assert public.client.get("/").status_code == 200
    # public reads never open commands, and an unknown token is still refused
    error_of(public.post(f"/runs/{run_id}/start", None), 401, "Unauthenticated")
    error_of(
        public.get("/runs", as_=None, headers={"Authorization": "Bearer unknown"}),
        401,
        "Unauthenticated",
    )


def test_page_session_cookie_reads_but_never_commands(api: Api) -> None:
    run_id = api.submit()["run_id"]
    error_of(api.client.post("/session", json={"token": "wrong"}), 401, "Unauthenticated")
    r = api.client.post("/session", json={"token": api.tokens["reviewer"]})
    assert r.status_code == 204
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert api.client.get("/").status_code == 200
    assert api.client.get("/runs").status_code == 200
    assert api.client.get("/session").json() == {
        "actor_id": actor_id("reviewer"),
        "role": "reviewer",
    }
    # the cookie alone must not make a command (a page on another site could send it)
    error_of(
        api.client.post(f"/runs/{run_id}/cancel", json={"reason": "csrf"}), 401, "Unauthenticated"
    )
    assert api.client.delete("/session").status_code == 204
    api.client.cookies.clear()
    assert api.client.get("/runs").status_code == 401


def test_tokens_file_changes_apply_without_restart(api: Api, tokens_file: Path) -> None:
    late = add_token("late-op", "operator", tokens_file)
    r = api.client.get("/runs", headers={"Authorization": f"Bearer {late}"})
    assert r.status_code == 200
    tokens_file.write_text("")  # every token revoked
    error_of(api.get("/runs"), 401, "Unauthenticated")


def test_add_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sub" / "tokens"
    token = add_token("alice", "reviewer", path)
    assert capsys.readouterr() == ("", "")
    assert token not in path.read_text()
    digest, actor, role, added = path.read_text().split()  # the time it was added, last
    assert (digest, actor, role) == (hash_token(token), "alice", "reviewer")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", added)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = add_token("bob", "operator", path)
    assert second != token
    table = parse_tokens(path.read_text())
    assert table[hash_token(second)] == Actor("bob", "operator")
    with pytest.raises(InvalidInput, match="role must be one of"):
        add_token("carol", "admin", path)
    with pytest.raises(InvalidInput, match="whitespace"):
        add_token("carol smith", "operator", path)
    with pytest.raises(InvalidInput):
        add_token("", "operator", path)


def test_add_token_uses_the_environment_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGER_TOKENS", str(tmp_path / "env-tokens"))
    add_token("alice", "reviewer")
    assert (tmp_path / "env-tokens").read_text().split()[1:3] == ["alice", "reviewer"]


def test_malformed_tokens_file_is_refused_at_start(ledger: Ledger, tmp_path: Path) -> None:
    bad = tmp_path / "tokens"
    bad.write_text("# comment\n\nnot-a-hash alice operator\n")
    with pytest.raises(InvalidInput, match="line 3"):
        create_app(ledger, tokens_path=bad)
    bad.write_text(f"{'a' * 64} alice admin\n")
    with pytest.raises(InvalidInput, match="role must be one of"):
        create_app(ledger, tokens_path=bad)


# --- roles: 403 with the service's own NotAuthorized message -------------------------

# command -> (roles allowed, how to call it over HTTP given a run and a lease)
RUN_COMMANDS: dict[str, tuple[frozenset[str], str, dict[str, Any]]] = {
    "start": (run_rule("start").roles, "/runs/{run}/start", {}),
    "amend": (RUN_COMMAND_ROLES["amend"], "/runs/{run}/amend", {"reason": "r", "withdraw": ["i1"]}),
    "claim": (RUN_COMMAND_ROLES["claim"], "/runs/{run}/claim", {"limit": 1}),
    "request_review": (
        run_rule("request_review").roles,
        "/runs/{run}/request_review",
        {"decision": "d"},
    ),
    "decide": (
        run_rule("decide").roles,
        "/runs/{run}/decide",
        {"input_version": "v", "approve": True, "reason": "r"},
    ),
    "pause": (run_rule("pause").roles, "/runs/{run}/pause", {"reason": "r"}),
    "resume": (run_rule("resume").roles, "/runs/{run}/resume", {"reason": "r"}),
    "cancel": (run_rule("cancel").roles, "/runs/{run}/cancel", {"reason": "r"}),
    "complete": (run_rule("complete").roles, "/runs/{run}/complete", {}),
    "fail": (run_rule("fail").roles, "/runs/{run}/fail", {"reason": "r", "transient": True}),
    "retry": (run_rule("retry").roles, "/runs/{run}/retry", {}),
    "repair": (run_rule("repair").roles, "/runs/{run}/repair", {}),
    "compensate": (run_rule("compensate").roles, "/runs/{run}/compensate", {"reason": "r"}),
    "skip": (item_rule("skip").roles, "/runs/{run}/items/i1/skip", {"reason": "r"}),
    "release": (item_rule("release").roles, "/runs/{run}/items/i1/release", {"reason": "r"}),
    "reject_item": (
        item_rule("reject_item").roles,
        "/runs/{run}/items/i1/reject_item",
        {"rule": "r"},
    ),
    "reconcile": (RUN_COMMAND_ROLES["reconcile"], "/reconcile", {}),
}
LEASE_COMMANDS = {
    "heartbeat": {},
    "accept": {},
    "reject": {"rule": "r"},
    "fail_attempt": {"error": "e"},
}


def _direct_refusal(lg: Ledger, command: str, run_id: str, actor: Actor) -> str:
    """The message the service itself raises for this role."""
    calls: dict[str, Callable[[], Any]] = {
        "start": lambda: lg.start(run_id, actor),
        "amend": lambda: lg.amend(run_id, actor, "r", withdraw=["i1"]),
        "claim": lambda: lg.claim(run_id, actor),
        "request_review": lambda: lg.request_review(run_id, actor, "d"),
        "decide": lambda: lg.decide(run_id, actor, "v", True, "r"),
        "pause": lambda: lg.pause(run_id, actor, "r"),
        "resume": lambda: lg.resume(run_id, actor, reason="back to work"),
        "cancel": lambda: lg.cancel(run_id, actor, "r"),
        "complete": lambda: lg.complete(run_id, actor),
        "fail": lambda: lg.fail(run_id, actor, "r", True),
        "retry": lambda: lg.retry(run_id, actor),
        "repair": lambda: lg.repair(run_id, actor),
        "compensate": lambda: lg.compensate(run_id, actor, "r"),
        "skip": lambda: lg.skip(run_id, "i1", actor, "r"),
        "release": lambda: lg.release(run_id, "i1", actor, "r"),
        "reject_item": lambda: lg.reject_item(run_id, "i1", actor, "r"),
        "reconcile": lambda: lg.reconcile(actor=actor),
    }
    with pytest.raises(NotAuthorized) as refused:
        calls[command]()
    return refused.value.message


def test_every_command_refuses_every_role_it_does_not_allow(api: Api, ledger: Ledger) -> None:
    run_id = api.running()
    before = api.get(f"/runs/{run_id}/history").json()["items"]
    checked = 0
    for command, (allowed, path, body) in RUN_COMMANDS.items():
        for role in sorted(set(ROLES) - allowed):
            r = api.post(path.format(run=run_id), role, json=body)
            refused = error_of(r, 403, "NotAuthorized")
            assert refused["message"] == _direct_refusal(
                ledger, command, run_id, Actor(actor_id(role), role)
            ), command
            checked += 1
    (lease,) = api.claim(run_id)
    for command, extra in LEASE_COMMANDS.items():
        allowed = item_rule(command).roles
        for role in sorted(set(ROLES) - allowed):
            r = api.post(f"/leases/{command}", role, json={**lease, **extra})
            refused = error_of(r, 403, "NotAuthorized")
            assert refused["message"] == (
                f"role {role!r} may not {command}; allowed roles: {', '.join(sorted(allowed))}"
            )
            checked += 1
        # another worker may not act on this worker's lease, even with its token
        error_of(
            api.post(f"/leases/{command}", "worker-2", json={**lease, **extra}),
            403,
            "NotAuthorized",
        )
    assert checked > 40
    after = api.get(f"/runs/{run_id}/history").json()["items"]
    assert (
        after[: len(before)] == before and len(after) == len(before) + 1
    )  # only the claim was written


def test_operator_may_not_record_a_permanent_failure(api: Api) -> None:
    run_id = api.running()
    r = api.post(f"/runs/{run_id}/fail", "operator", json={"reason": "r", "transient": False})
    assert "transient" in error_of(r, 403, "NotAuthorized")["message"]


# --- typed errors -> statuses ----------------------------------------------------------


def test_not_found_maps_to_404(api: Api) -> None:
    missing = str(uuid.uuid4())
    for path in (
        f"/runs/{missing}",
        f"/runs/{missing}/items",
        f"/runs/{missing}/attempts",
        f"/runs/{missing}/history",
        f"/runs/{missing}/lineage",
        "/runs/not-a-uuid",
    ):
        body = error_of(api.get(path), 404, "RunNotFound")
        assert missing in body["message"] or "not-a-uuid" in body["message"]
    error_of(api.post(f"/runs/{missing}/start", "controller"), 404, "RunNotFound")
    run_id = api.running()
    error_of(
        api.post(f"/runs/{run_id}/items/nope/skip", "operator", json={"reason": "r"}),
        404,
        "ItemNotFound",
    )
    error_of(api.get(f"/runs/{run_id}/attempts", params={"item_id": "nope"}), 404, "ItemNotFound")
    (lease,) = api.claim(run_id)
    error_of(
        api.post("/leases/accept", "worker", json={**lease, "item_id": "nope"}), 404, "ItemNotFound"
    )
    error_of(api.get("/no/such/path"), 404, "NotFound")


def test_conflict_maps_to_409_with_current_revision(api: Api) -> None:
    submitted = api.submit()
    r = api.post(
        f"/runs/{submitted['run_id']}/start",
        "controller",
        json={"expected_revision": submitted["revision"] + 5},
    )
    body = error_of(r, 409, "Conflict")
    assert body["current_revision"] == submitted["revision"] and body["current_state"] == "queued"


def test_state_errors_map_to_409(api: Api) -> None:
    run_id = api.running()
    body = error_of(api.post(f"/runs/{run_id}/start", "controller"), 409, "IllegalTransition")
    assert body["state"] == "running" and body["allowed"] == ["queued"]
    body = error_of(api.post(f"/runs/{run_id}/complete", "controller"), 409, "NotComplete")
    assert body["state"] == "running"
    review = api.post(
        f"/runs/{run_id}/request_review", "controller", json={"decision": "ok"}
    ).json()
    stale = api.post(
        f"/runs/{run_id}/decide",
        "reviewer",
        json={"input_version": "sha256:old", "approve": True, "reason": "r"},
    )
    assert error_of(stale, 409, "StaleReview")["expected_version"] == review["input_version"]
    api.post(f"/runs/{run_id}/cancel", "operator", json={"reason": "stop"})
    body = error_of(
        api.post(f"/runs/{run_id}/pause", "operator", json={"reason": "r"}), 409, "AlreadyTerminal"
    )
    assert body["state"] == "canceled"


def test_lease_lost_maps_to_409(api: Api) -> None:
    run_id = api.running()
    (lease,) = api.claim(run_id)
    error_of(
        api.post("/leases/heartbeat", "worker", json={**lease, "token": "f" * 32}), 409, "LeaseLost"
    )
    api.post("/leases/accept", "worker", json=lease)
    error_of(api.post("/leases/accept", "worker", json=lease), 409, "LeaseLost")


def test_invalid_input_maps_to_422(api: Api) -> None:
    body = error_of(
        api.post("/runs", "submitter", json={"source_version": "s", "items": []}),
        422,
        "ManifestInvalid",
    )
    assert "config_version" in body["message"] or "items" in body["message"]
    body = error_of(
        api.post("/runs", "submitter", json={**manifest(1), "colour": "red"}),
        422,
        "ManifestInvalid",
    )
    assert "colour" in body["message"]
    error_of(api.get("/runs", params={"state": "exploded"}), 422, "InvalidInput")
    error_of(api.get("/audit", params={"role": "king"}), 422, "InvalidInput")
    run_id = api.running()
    revision = api.get(f"/runs/{run_id}").json()["revision"]
    error_of(
        api.post(
            f"/runs/{run_id}/fail", "controller", json={"reason": "r", "failure_reason": "gremlins"}
        ),
        422,
        "InvalidInput",
    )
    error_of(
        api.post(
            f"/runs/{run_id}/amend", "submitter", json={"reason": "r", "items": [{"item_id": ""}]}
        ),
        422,
        "ManifestInvalid",
    )
    error_of(
        api.post(f"/runs/{run_id}/pause", "operator", json={"reason": "x" * 5_000}),
        422,
        "InvalidInput",
    )
    assert api.get(f"/runs/{run_id}").json()["revision"] == revision  # nothing written


# --- bad input is never a 500 --------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b"{not json", 400),
        (b"\xff\xfe\x00garbage", 400),
        (b'{"reason": "\xc3\x28"}', 400),  # invalid UTF-8 inside a string
        (b"[" * 30_000 + b"]" * 30_000, 400),  # (fits the route's 64 KiB body limit)
        (b'{"reason": "r", "expected_revision": 1' + b"0" * 5000 + b"}", 400),
        (b'{"reason": "r", "expected_revision": 100000000000000000000000000000}', 422),
        (b'{"reason": "r", "expected_revision": 1e999}', 422),
        (b'{"reason": "r", "expected_revision": -1}', 422),
        (b'{"reason": "r", "expected_revision": 1.5}', 422),
        (b'{"reason": "r", "expected_revision": "3"}', 422),
        (b'{"reason": 12}', 422),
        (b'{"reason": null}', 422),
        (b'{"reason": "r", "extra": 1}', 422),
        (b'"just a string"', 422),
        (b"[]", 422),
        (b"null", 422),
    ],
)
def test_malformed_bodies_are_refused_not_crashed(api: Api, content: bytes, status: int) -> None:
    run_id = api.running()
    r = api.post(f"/runs/{run_id}/skip_nothing", "operator", content=content)
    assert r.status_code == 404  # unknown path first
    r = api.post(
        f"/runs/{run_id}/items/i0/skip",
        "operator",
        content=content,
        headers={"Content-Type": "application/json"},
    )
    error_of(r, status, "InvalidInput")
    assert api.get(f"/runs/{run_id}/items", params={"state": "skipped"}).json()["items"] == []


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe",
        b"[" * 100_000,
        b'{"a": 1' + b"0" * 5000 + b"}",
        b"",
        b"[1, 2]",
        b'"x"',
        json.dumps(manifest(1) | {"scope": "\ud800"}).encode(),
        json.dumps(manifest(1) | {"items": [{"item_id": "a", "payload": "\udfff"}]}).encode(),
    ],
)
def test_malformed_manifests_are_refused_not_crashed(api: Api, content: bytes) -> None:
    r = api.post(
        "/runs", "submitter", content=content, headers={"Content-Type": "application/json"}
    )
    assert r.status_code in (400, 422), r.text
    assert r.json()["error"] in ("InvalidInput", "ManifestInvalid")
    assert api.get("/runs").json() == []


def test_huge_numbers_in_a_payload_round_trip(api: Api) -> None:
    m = manifest(1)
    m["items"][0]["payload"] = {"big": 10**400, "float": 1e308, "neg": -(2**70)}
    run = api.submit(m)
    (item,) = api.get(f"/runs/{run['run_id']}/items").json()["items"]
    assert item["payload"] == m["items"][0]["payload"]


def test_oversized_body_is_413(api: Api) -> None:
    r = api.post(
        "/runs",
        "submitter",
        content=b" " * (17 * 1024 * 1024),
        headers={"Content-Type": "application/json"},
    )
    error_of(r, 413, "PayloadTooLarge")


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/runs", {"limit": "0"}),
        ("/runs", {"limit": "10" * 30}),
        ("/runs", {"limit": "x"}),
        ("/audit", {"after": "-1"}),
        ("/audit", {"after": "9" * 40}),
        ("/audit", {"since": "yesterday"}),
        ("/audit", {"since": "99999-01-01T00:00:00"}),
        ("/audit", {"newest_first": "perhaps"}),
        ("/audit", {"limit": "100000"}),
    ],
)
def test_bad_query_parameters_are_422(api: Api, path: str, params: dict[str, str]) -> None:
    error_of(api.get(path, params=params), 422, "InvalidInput")


@pytest.mark.parametrize(
    "run_id", ["%00", "a%00b", "%FF%FE", "x" * 300, "%E2%80%AE", "..%2F..%2Fetc"]
)
def test_strange_run_ids_are_refused_not_crashed(api: Api, run_id: str) -> None:
    for r in (
        api.get(f"/runs/{run_id}"),
        api.get(f"/runs/{run_id}/history"),
        api.post(f"/runs/{run_id}/start", "controller"),
    ):
        assert r.status_code in (404, 422), (run_id, r.status_code, r.text)
        assert r.json()["error"] in ("RunNotFound", "InvalidInput", "NotFound")


def test_strange_strings_in_bodies_are_refused_or_kept(api: Api) -> None:
    run_id = api.running()
    for reason in ("nul\x00byte", "\ud800", "bell\x07", "é" * 10, "emoji 🙂", "\u202e"):
        for path in (f"/runs/{run_id}/items/i0/skip", f"/runs/{run_id}/pause"):
            r = api.post(
                path,
                "operator",
                content=json.dumps({"reason": reason}).encode(),
                headers={"Content-Type": "application/json"},
            )
            # a lone surrogate escape is not strict JSON text: a malformed body (400)
            allowed = (400,) if reason == "\ud800" else (200, 409, 422)
            assert r.status_code in allowed, (reason, r.text)
    lone = json.dumps({"reason": "\ud800"}).encode()
    error_of(
        api.post(
            f"/runs/{run_id}/resume",
            "operator",
            content=lone,
            headers={"Content-Type": "application/json"},
        ),
        400,
        "InvalidInput",
    )


# --- the OpenAPI document -----------------------------------------------------------------


def test_openapi_document_is_served_and_current(api: Api) -> None:
    served = api.client.get("/openapi.json").json()
    committed = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert served == committed, "docs/openapi.json is stale: run `python scripts/export_openapi.py`"


def test_openapi_covers_every_read_and_command(api: Api) -> None:
    paths = api.client.get("/openapi.json").json()["paths"]
    for read in (
        "/runs",
        "/runs/{run_id}",
        "/runs/{run_id}/items",
        "/runs/{run_id}/attempts",
        "/runs/{run_id}/history",
        "/runs/{run_id}/lineage",
        "/audit",
    ):
        assert "get" in paths[read], read
    posts = {p for p, ops in paths.items() if "post" in ops}
    for command in (
        "start",
        "amend",
        "claim",
        "request_review",
        "decide",
        "pause",
        "resume",
        "cancel",
        "complete",
        "fail",
        "retry",
        "repair",
        "compensate",
    ):
        assert f"/runs/{{run_id}}/{command}" in posts, command
    for command in ("skip", "release", "reject_item"):
        assert f"/runs/{{run_id}}/items/{{item_id}}/{command}" in posts, command
    for command in ("heartbeat", "accept", "reject", "fail_attempt"):
        assert f"/leases/{command}" in posts, command
    assert {"/runs", "/reconcile"} <= posts
    assert (
        "bearer"
        in json.dumps(
            api.client.get("/openapi.json").json()["components"]["securitySchemes"]
        ).lower()
    )


def test_export_script_writes_the_served_document(tmp_path: Path) -> None:
    out = tmp_path / "openapi.json"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "export_openapi.py"), "--output", str(out)],
        check=True,
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert out.read_text() == (ROOT / "docs" / "openapi.json").read_text()


# --- schemathesis: no 500 anywhere in the document ------------------------------------------

schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture
def fuzz_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, dict[str, str], str]]:
    from ledger.http import feed as http_feed

    # an event stream ends after STREAM_MAX_S (5 minutes): here after a moment, so that
    # each fuzzed request to it returns what it streamed instead of waiting minutes
    monkeypatch.setattr(http_feed, "STREAM_MAX_S", 0.2)
    tokens_path = tmp_path / "tokens"
    made = {role: add_token(actor_id(role), role, tokens_path) for role in ROLES}
    with Ledger.open(f"sqlite:///{tmp_path}/fuzz.db") as lg:
        run = lg.submit(manifest(3), Actor("s", "submitter"))
        lg.start(run.run_id, Actor("c", "controller"))
        yield create_app(lg, tokens_path=tokens_path), made, run.run_id


@pytest.fixture
def api_schema(fuzz_app: tuple[Any, dict[str, str], str]) -> Any:
    app, _tokens, _run_id = fuzz_app
    return schemathesis.openapi.from_asgi("/openapi.json", app)


fuzz_schema = schemathesis.pytest.from_fixture("api_schema")


def _role_for(path: str) -> str:
    # a role the command allows, so fuzzing reaches past the role check
    command = path.rstrip("/").rsplit("/", 1)[-1]
    for table in (RUN_COMMANDS, {k: (item_rule(k).roles, "", {}) for k in LEASE_COMMANDS}):
        if command in table:
            return min(table[command][0])
    return "submitter" if path == "/runs" else "operator"


@pytest.mark.slow
@fuzz_schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_finds_no_server_error(
    case: Any, fuzz_app: tuple[Any, dict[str, str], str]
) -> None:
    _app, made, run_id = fuzz_app
    if case.path_parameters and len(str(case.path_parameters.get("run_id", ""))) % 2:
        case.path_parameters["run_id"] = run_id  # about half the cases reach a real run
    headers = {"Authorization": f"Bearer {made[_role_for(case.path)]}"}
    response = case.call(headers=headers)
    assert response.status_code < 500, (
        case.method,
        case.formatted_path,
        response.status_code,
        response.text[:500],
    )
    if response.status_code >= 400:
        body = response.json()
        assert (
            isinstance(body, dict)
            and isinstance(body.get("error"), str)
            and isinstance(body.get("message"), str)
        )


# --- serve(): a real uvicorn process; tokens never reach its log ---------------------------


def test_serve_runs_uvicorn_and_never_logs_tokens(tmp_path: Path) -> None:
    import socket
    import time

    import httpx

    tokens_path = tmp_path / "tokens"
    token = add_token("ops", "operator", tokens_path)
    sub = add_token("sub", "submitter", tokens_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    code = (
        "import sys; from ledger.http.serve import serve; "
        "serve(sys.argv[1], '127.0.0.1', int(sys.argv[2]), sys.argv[3], False)"
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                f"sqlite:///{tmp_path}/serve.db",
                str(port),
                str(tokens_path),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=10) as client:
            for _ in range(200):
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            else:
                pytest.fail("server did not start: " + log.read_text())
            r = client.post("/runs", json=manifest(1), headers={"Authorization": f"Bearer {sub}"})
            assert r.status_code == 201, r.text
            assert (
                client.get("/runs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
            )
            assert (
                client.get("/runs", headers={"Authorization": f"Bearer {token}x"}).status_code
                == 401
            )
            assert client.post("/session", json={"token": token}).status_code == 204
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    text = log.read_text()
    assert "GET /runs" in text  # the access log is on
    for secret in (token, sub, token[len("ledger_") :][:20]):
        assert secret not in text
    assert not re.search(r"Traceback", text), text


def test_an_idempotency_key_header_makes_a_repeat_answer_from_the_record(api: Api) -> None:
    m = json.dumps(manifest(2)).encode()
    key = {"Content-Type": "application/json", "Idempotency-Key": "submit-5d1c"}
    first = api.post("/runs", "submitter", content=m, headers=key)
    again = api.post("/runs", "submitter", content=m, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers["Location"] == first.headers["Location"]
    assert [r["run_id"] for r in api.get("/runs").json()] == [first.json()["run_id"]]
    run_id = first.json()["run_id"]
    # the same key on another command, or with other arguments, is refused and writes nothing
    error_of(
        api.post(f"/runs/{run_id}/start", "controller", headers={"Idempotency-Key": "submit-5d1c"}),
        422,
        "InvalidInput",
    )
    other = json.dumps(manifest(3)).encode()
    error_of(api.post("/runs", "submitter", content=other, headers=key), 422, "InvalidInput")
    assert (
        api.get(f"/runs/{run_id}").json()["state"] == "queued" and len(api.get("/runs").json()) == 1
    )
    # a key that is not an identifier is refused before anything is read
    error_of(
        api.post(f"/runs/{run_id}/start", "controller", headers={"Idempotency-Key": "x" * 201}),
        422,
        "InvalidInput",
    )
    started = api.post(
        f"/runs/{run_id}/start", "controller", headers={"Idempotency-Key": "start-1"}
    )
    repeat = api.post(f"/runs/{run_id}/start", "controller", headers={"Idempotency-Key": "start-1"})
    assert started.status_code == repeat.status_code == 200 and repeat.json() == started.json()
    assert [t["command"] for t in api.get(f"/runs/{run_id}/history").json()["items"]] == [
        "submit",
        "start",
    ]
