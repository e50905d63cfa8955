"""The public surface is pinned: `ledger.__all__` holds exactly the names of API.md.

Renaming or dropping one of these breaks users, examples and acceptance checks, so a
change here must be deliberate (update API.md and this list together).
"""

from __future__ import annotations

import importlib
import inspect

import pytest

import ledger

# Names API.md tells users to import from `ledger`.
API_NAMES = {
    # opening a ledger, actors
    "Ledger",
    "Actor",
    # values the commands and reads return
    "RunStatus",
    "ItemStatus",
    "Lease",
    "Attempt",
    "Transition",
    "CancelOutcome",
    "ReconcileReport",
    "VerifyReport",
    # errors ("all subclass ledger.LedgerError, all importable from ledger")
    "LedgerError",
    "InvalidInput",
    "ManifestInvalid",
    "RunNotFound",
    "ItemNotFound",
    "NotAuthorized",
    "Conflict",
    "IllegalTransition",
    "AlreadyTerminal",
    "NotComplete",
    "LeaseLost",
    "StaleReview",
    "InvariantViolated",
    # worker helper
    "Worker",
    "Accepted",
    "Rejected",
    "Quarantine",
    # the change feed (API.md, third version)
    "Follower",
}
# Extras the package also exports: the manifest models API.md describes ("validated by
# pydantic") and the `links` entry type of RunStatus.
EXTRA_NAMES = {
    "Manifest",
    "Policy",
    "Link",
    "FollowerBusy",
    "FollowerNotFound",
    "WebhookNotFound",
    "RunArchived",
    # what `lg.overview()` and `lg.board()` return (API.md: "-> Overview")
    "Overview",
    "StuckRun",
    "BoardPage",
    "BoardRow",
    # the ledger for asyncio services (docs/how-to/async.md)
    "AsyncLedger",
    "AsyncWorker",
    "AsyncFollower",
}

ERROR_NAMES = {
    "LedgerError",
    "InvalidInput",
    "ManifestInvalid",
    "RunNotFound",
    "ItemNotFound",
    "NotAuthorized",
    "Conflict",
    "IllegalTransition",
    "AlreadyTerminal",
    "NotComplete",
    "LeaseLost",
    "StaleReview",
    "InvariantViolated",
}


def test_all_is_pinned() -> None:
    assert len(ledger.__all__) == len(set(ledger.__all__)), "duplicate names in ledger.__all__"
    assert set(ledger.__all__) == API_NAMES | EXTRA_NAMES


def test_every_api_name_is_exported() -> None:
    missing = API_NAMES - set(ledger.__all__)
    assert not missing, f"API.md names missing from ledger.__all__: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(API_NAMES | EXTRA_NAMES))
def test_name_is_importable_from_ledger(name: str) -> None:
    module = importlib.import_module("ledger")
    obj = getattr(module, name)
    assert obj is not None
    namespace: dict[str, object] = {}
    exec(f"from ledger import {name}", namespace)  # noqa: S102 (the import statement is what is tested)
    assert namespace[name] is obj
    assert inspect.getdoc(obj), f"{name} has no docstring"


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from ledger import *", namespace)  # noqa: S102 (the star import is what is tested)
    exported = {k for k in namespace if not k.startswith("__")}
    assert exported == set(ledger.__all__)


def test_error_hierarchy_matches_api() -> None:
    from ledger import (
        AlreadyTerminal,
        IllegalTransition,
        InvalidInput,
        LedgerError,
        ManifestInvalid,
        NotComplete,
    )

    for name in ERROR_NAMES:
        cls = getattr(ledger, name)
        assert issubclass(cls, LedgerError), name
    assert issubclass(ManifestInvalid, InvalidInput)
    assert issubclass(AlreadyTerminal, IllegalTransition)
    assert issubclass(NotComplete, IllegalTransition)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        ledger.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018


def test_view_fields_match_api() -> None:
    import dataclasses

    def fields(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert {
        "run_id",
        "item_id",
        "token",
        "worker_id",
        "attempt",
        "expires_at",
        "payload",
    } <= fields(ledger.Lease)
    assert {"run_id", "state", "in_flight", "already"} <= fields(ledger.CancelOutcome)
    assert {
        "run_id",
        "state",
        "revision",
        "failure_kind",
        "failure_reason",
        "input_version",
        "counts",
        "summary",
        "not_accepted",
        "waiting_on",
        "links",
        "cancel_requested",
        "created_at",
        "updated_at",
    } <= fields(ledger.RunStatus)
    assert {
        "item_id",
        "state",
        "required",
        "attempts",
        "lease",
        "last_error",
        "revision",
    } <= fields(ledger.ItemStatus)
    assert {
        "run_id",
        "item_id",
        "from_state",
        "to_state",
        "actor_id",
        "role",
        "reason",
        "evidence",
        "at",
        "revision",
        "position",
    } <= fields(ledger.Transition)
    assert {"id", "role"} <= fields(ledger.Actor)
    for cmd in (
        "submit",
        "start",
        "amend",
        "claim",
        "heartbeat",
        "accept",
        "reject",
        "fail_attempt",
        "skip",
        "release",
        "reject_item",
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
        "reconcile",
        "status",
        "runs",
        "items",
        "attempts",
        "history",
        "audit",
        "status_at",
        "lineage",
        "verify",
        "rebuild_projections",
        "open",
        "close",
    ):
        assert callable(getattr(ledger.Ledger, cmd)), cmd


# The parameters API.md names, in its order (extra parameters after them are welcome).
API_SIGNATURES = {
    "submit": ["manifest", "actor"],
    "start": ["run_id", "actor"],
    "amend": ["run_id", "actor", "reason", "items", "withdraw", "policy"],
    "claim": ["run_id", "worker", "limit"],
    "heartbeat": ["lease"],
    "accept": ["lease", "evidence", "stage"],
    "reject": ["lease", "rule", "detail", "stage"],
    "fail_attempt": ["lease", "error", "stage", "retryable"],
    "skip": ["run_id", "item_id", "actor", "reason"],
    "release": ["run_id", "item_id", "actor", "reason"],
    "reject_item": ["run_id", "item_id", "actor", "rule", "detail"],
    "request_review": ["run_id", "actor", "decision"],
    "decide": ["run_id", "actor", "input_version", "approve", "reason"],
    "pause": ["run_id", "actor", "reason"],
    "resume": ["run_id", "actor"],
    "cancel": ["run_id", "actor", "reason"],
    "complete": ["run_id", "actor"],
    "fail": ["run_id", "actor", "reason", "transient", "failure_reason"],
    "retry": ["run_id", "actor"],
    "repair": ["run_id", "actor", "items", "corrections"],
    "compensate": ["run_id", "actor", "reason", "items"],
    "reconcile": ["now"],
    "status": ["run_id"],
    "runs": ["state", "limit"],
    "items": ["run_id", "state"],
    "attempts": ["run_id", "item_id"],
    "history": ["run_id"],
    "audit": [
        "run_id",
        "actor",
        "role",
        "state",
        "since",
        "until",
        "newest_first",
        "after",
        "limit",
    ],
    "status_at": ["run_id", "at"],
    "lineage": ["run_id"],
    "verify": [],
    "rebuild_projections": ["progress"],
}
# Run commands that take the caller's revision (compare-and-set, rule 2 of the rule book).
REVISIONED = [
    "start",
    "amend",
    "claim",
    "skip",
    "release",
    "reject_item",
    "request_review",
    "decide",
    "pause",
    "resume",
    "cancel",
    "complete",
    "fail",
]


@pytest.mark.parametrize("command", sorted(API_SIGNATURES))
def test_command_signature_matches_api(command: str) -> None:
    params = list(inspect.signature(getattr(ledger.Ledger, command)).parameters)
    assert params[0] == "self"
    expected = API_SIGNATURES[command]
    assert params[1 : 1 + len(expected)] == expected


@pytest.mark.parametrize("command", REVISIONED)
def test_commands_accept_expected_revision(command: str) -> None:
    sig = inspect.signature(getattr(ledger.Ledger, command))
    assert "expected_revision" in sig.parameters
    assert sig.parameters["expected_revision"].default is None


def test_open_takes_dsn_and_clock() -> None:
    params = inspect.signature(ledger.Ledger.open).parameters
    assert list(params)[:2] == ["dsn", "clock"]
    assert params["dsn"].default is None
